#include "cli/preflight.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"

namespace rt::cli {

namespace {

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", bytes / (1ull << 30));
  return b;
}

// Bytes per token of one micro-batch on the CPU backend, a lower bound
// (model/model.h: the block inputs of every layer, the final hidden state and
// two gradient buffers, one layer's attention and MLP working set). The
// LM head runs in row chunks, so the vocab does not scale with the batch.
double cpu_activation_bytes_per_token(const ModelSpec& s) {
  const double C = static_cast<double>(s.hidden), I = static_cast<double>(s.intermediate);
  return 4.0 * ((static_cast<double>(s.n_layers) + 4) * C + 4 * C + 3 * I);
}

}  // namespace

uint64_t host_memory_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024ull;
}

void preflight(const TrainConfig& c, const ModelSpec& spec, bool cpu_backend) {
  if (c.seq_len > spec.max_sequence())
    fail("[train] --seq-len ", c.seq_len, " exceeds the model's ", spec.max_sequence_why(), "; lower --seq-len");
  // Memory that the options alone decide, checked before anything is allocated.
  const double B = static_cast<double>(c.micro_batch), T = static_cast<double>(c.seq_len),
               K = static_cast<double>(c.grad_accum);
  const double avail = static_cast<double>(host_memory_available());
  if (avail > 0) {
    // The batches of one step: inputs, targets and positions, 4 bytes each per token.
    const double batches = K * B * T * 12.0;
    if (batches > avail / 2)
      fail("[train] --grad-accum ", c.grad_accum, " x --micro-batch ", c.micro_batch, " x --seq-len ", c.seq_len,
           ": the token batches of one step alone need ", gib(batches), " of host memory and ", gib(avail),
           " are available; lower --grad-accum (or --micro-batch)");
    if (cpu_backend) {
      const double acts = B * T * cpu_activation_bytes_per_token(spec);
      if (acts > avail)
        fail("[train] --micro-batch ", c.micro_batch, " x --seq-len ", c.seq_len, " = ", B * T,
             " tokens per micro-batch need at least ", gib(acts), " of activations on the CPU backend and ", gib(avail),
             " of host memory are available; lower --micro-batch (or --seq-len) and raise --grad-accum "
             "to keep the tokens per step");
    }
  }
  if (cpu_backend && !c.gpu_options_given.empty()) {
    std::string list;
    for (auto& o : c.gpu_options_given) list += (list.empty() ? "" : ", ") + o;
    std::printf("warning: %s only shape%s the GPU engine, and this run uses the CPU backend (%s): ignored\n",
                list.c_str(), c.gpu_options_given.size() == 1 ? "s" : "",
                c.device == Device::cpu ? "--device cpu" : "no CUDA device or a CPU-only build");
  }
}

}  // namespace rt::cli
