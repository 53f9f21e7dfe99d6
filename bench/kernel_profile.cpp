// Where the GPU's time goes, by kernel: a CUPTI activity recorder loaded into
// any ramtrain command with LD_PRELOAD (a benchmark tool, not a test).
//
//   LD_PRELOAD=build/bench/libramtrain_kernel_profile.so RAMTRAIN_KPROF_SKIP_S=20
//     RAMTRAIN_KPROF_OUT=prof.txt ramtrain_bench ...   (one command line)
//
// Every kernel's device start/end and every copy are recorded; at exit it
// prints (to stderr, or appends to RAMTRAIN_KPROF_OUT) the kernel time by
// class (GEMMs, attention, FP8 quantizers, norms, RoPE, SwiGLU, MoE routing,
// loss head, embedding, optimizer, casts and elementwise, other), each class's
// share of all kernel time, the busy time of the device (the union of kernel
// intervals over the window) against the window's wall time, copies by
// direction, and the top kernels by time. RAMTRAIN_KPROF_SKIP_S drops the
// kernels that start in the first S seconds after the first one (start-up,
// warm-up steps); RAMTRAIN_KPROF_TOP sets how many kernels are listed (20).
//
// The classes are matched on the demangled kernel name; the rules are the
// `classify` function below and the output names the rule's class only, so a
// kernel a rule misfiles shows up in the top list under its own name.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Kernel {
  uint64_t start, end;
  uint32_t name_id;
};

struct Copy {
  uint64_t start, end, bytes;
  uint8_t kind;
};

struct Recorder {
  std::mutex mu;
  std::vector<Kernel> kernels;
  std::vector<Copy> copies;
  std::map<std::string, uint32_t> name_ids;
  std::vector<std::string> names;
  bool ok = false;

  uint32_t intern(const char* raw) {
    std::string n = raw ? raw : "?";
    auto it = name_ids.find(n);
    if (it != name_ids.end()) return it->second;
    uint32_t id = static_cast<uint32_t>(names.size());
    name_ids.emplace(n, id);
    names.push_back(n);
    return id;
  }
};

Recorder& rec() {
  static Recorder* r = new Recorder;  // leaked on purpose: used from CUPTI's thread during exit
  return *r;
}

constexpr size_t kBufferBytes = 16u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      r.kernels.push_back({k->start, k->end, r.intern(k->name)});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      r.copies.push_back({c->start, c->end, c->bytes, c->copyKind});
    }
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "[kernel_profile] CUPTI dropped %zu records\n", dropped);
  std::free(buffer);
}

std::string demangle(const std::string& n) {
  int status = 0;
  char* d = abi::__cxa_demangle(n.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !d) return n;
  std::string s(d);
  std::free(d);
  return s;
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The class of a kernel by its demangled name; order matters (first match).
const char* classify(const std::string& n) {
  if (has(n, "quantize") || has(n, "tensor_amax") || has(n, "tensor_codes")) return "fp8 quantize";
  if (has(n, "gemm") || has(n, "Gemm") || has(n, "xmma") || has(n, "cutlass") || has(n, "nvjet") ||
      has(n, "sm90_") || has(n, "sm80_") || has(n, "cublas"))
    return "GEMM (cuBLAS/cuBLASLt)";
  if (has(n, "attention") || has(n, "flash") || has(n, "attn") || has(n, "sink_grad") || has(n, "cuda::sm90::") ||
      has(n, "masked_forward") || has(n, "masked_dq") || has(n, "masked_dkdv"))
    return "attention";  // cuda::sm90:: is the wgmma attention's namespace (attention_sm90.cu)
  if (has(n, "rms_norm") || has(n, "layer_norm")) return "norms";
  if (has(n, "rope")) return "RoPE";
  if (has(n, "swiglu") || has(n, "geglu") || has(n, "gelu") || has(n, "silu")) return "SwiGLU/GeGLU";
  if (has(n, "topk") || has(n, "permute") || has(n, "gather") || has(n, "combine") || has(n, "router") ||
      has(n, "count_kernel") || has(n, "scan_kernel") || has(n, "softmax_rows") || has(n, "prob_sum") ||
      has(n, "shared_gate") || has(n, "weight_grad_kernel"))
    return "MoE routing";
  if (has(n, "cross_entropy") || has(n, "lm_head") || has(n, "logit")) return "loss head";
  if (has(n, "embedding")) return "embedding";
  if (has(n, "adam") || has(n, "muon") || has(n, "newton") || has(n, "optim")) return "optimizer";
  if (has(n, "cast") || has(n, "convert") || has(n, "bf16") || has(n, "to_f32") || has(n, "add") ||
      has(n, "scale") || has(n, "sum") || has(n, "copy") || has(n, "fill") || has(n, "iota") || has(n, "bias"))
    return "casts, adds, reductions";
  return "other";
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "host->device";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "device->host";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "device->device";
    default: return "other copies";
  }
}

// Total length of the union of [start, end) intervals (sorted by start).
uint64_t union_ns(std::vector<std::pair<uint64_t, uint64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  uint64_t total = 0, cur_s = 0, cur_e = 0;
  bool open = false;
  for (auto [s, e] : iv) {
    if (!open || s > cur_e) {
      if (open) total += cur_e - cur_s;
      cur_s = s, cur_e = e, open = true;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (open) total += cur_e - cur_s;
  return total;
}

void report() {
  Recorder& r = rec();
  if (!r.ok) return;
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.kernels.empty()) return;  // a process that ran no kernel (a launcher) writes nothing
  FILE* out = stderr;
  const char* path = std::getenv("RAMTRAIN_KPROF_OUT");
  if (path && *path) {
    out = std::fopen(path, "a");
    if (!out) {
      std::fprintf(stderr, "[kernel_profile] cannot open RAMTRAIN_KPROF_OUT=%s; printing here\n", path);
      out = stderr;
    }
  }

  uint64_t first = UINT64_MAX;
  for (const Kernel& k : r.kernels) first = std::min(first, k.start);
  const char* skip_env = std::getenv("RAMTRAIN_KPROF_SKIP_S");
  const double skip_s = skip_env ? std::atof(skip_env) : 0.0;
  const uint64_t from = first + static_cast<uint64_t>(skip_s * 1e9);
  const char* top_env = std::getenv("RAMTRAIN_KPROF_TOP");
  const size_t top = top_env ? static_cast<size_t>(std::atoi(top_env)) : 20;

  std::vector<double> by_name(r.names.size(), 0.0);
  std::vector<uint64_t> calls(r.names.size(), 0);
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  uint64_t last = from;
  double total = 0;
  for (const Kernel& k : r.kernels) {
    if (k.start < from) continue;
    by_name[k.name_id] += static_cast<double>(k.end - k.start);
    calls[k.name_id]++;
    total += static_cast<double>(k.end - k.start);
    iv.emplace_back(k.start, k.end);
    last = std::max(last, k.end);
  }
  if (iv.empty()) {
    std::fprintf(out, "[kernel_profile] no kernels after the first %.1f s (RAMTRAIN_KPROF_SKIP_S)\n", skip_s);
    if (out != stderr) std::fclose(out);
    return;
  }
  const double wall = static_cast<double>(last - from);
  const double busy = static_cast<double>(union_ns(iv));
  std::map<std::string, double> by_class;
  std::vector<std::string> dem(r.names.size());
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (!calls[i]) continue;
    dem[i] = demangle(r.names[i]);
    by_class[classify(dem[i])] += by_name[i];
  }
  std::fprintf(out, "[kernel_profile] window %.3f s (first %.1f s skipped), device busy %.3f s (%.1f%%), kernel time %.3f s\n",
               wall * 1e-9, skip_s, busy * 1e-9, 100.0 * busy / wall, total * 1e-9);
  std::vector<std::pair<double, std::string>> cls;
  for (auto& [c, t] : by_class) cls.emplace_back(t, c);
  std::sort(cls.rbegin(), cls.rend());
  double gemm_attn = 0;
  for (auto& [t, c] : cls) {
    std::fprintf(out, "[kernel_profile] class %-26s %9.3f s %6.2f%%\n", c.c_str(), t * 1e-9, 100.0 * t / total);
    if (c == "GEMM (cuBLAS/cuBLASLt)" || c == "attention") gemm_attn += t;
  }
  std::fprintf(out, "[kernel_profile] outside GEMMs and attention: %.3f s = %.2f%% of kernel time\n",
               (total - gemm_attn) * 1e-9, 100.0 * (total - gemm_attn) / total);
  std::map<std::string, std::pair<double, uint64_t>> cp;
  for (const Copy& c : r.copies) {
    if (c.start < from) continue;
    auto& e = cp[copy_kind(c.kind)];
    e.first += static_cast<double>(c.end - c.start);
    e.second += c.bytes;
  }
  for (auto& [k, e] : cp)
    std::fprintf(out, "[kernel_profile] copies %-15s %9.3f s %10.2f GB %7.2f GB/s while copying\n", k.c_str(),
                 e.first * 1e-9, e.second * 1e-9, e.first > 0 ? e.second / e.first : 0.0);
  std::vector<size_t> order;
  for (size_t i = 0; i < r.names.size(); ++i)
    if (calls[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return by_name[a] > by_name[b]; });
  for (size_t j = 0; j < std::min(top, order.size()); ++j) {
    size_t i = order[j];
    std::string n = dem[i].size() > 110 ? dem[i].substr(0, 107) + "..." : dem[i];
    std::fprintf(out, "[kernel_profile] top %2zu %6.2f%% %9.3f s %8llu calls  %-22s %s\n", j + 1,
                 100.0 * by_name[i] / total, by_name[i] * 1e-9, static_cast<unsigned long long>(calls[i]),
                 classify(dem[i]), n.c_str());
  }
  if (out != stderr) std::fclose(out);
}

// The records are flushed when a context is about to go (the process may tear
// CUDA down before the exit handler runs) and again at exit.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    cuptiActivityFlushAll(1);
}

__attribute__((constructor)) void start() {
  Recorder& r = rec();
  CUpti_SubscriberHandle sub;
  if (cuptiSubscribe(&sub, on_resource, nullptr) == CUPTI_SUCCESS)
    cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "[kernel_profile] cuptiActivityRegisterCallbacks failed: no profile\n");
    return;
  }
  bool ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) == CUPTI_SUCCESS;
  ok = ok && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) == CUPTI_SUCCESS;
  if (!ok) {
    std::fprintf(stderr, "[kernel_profile] cuptiActivityEnable failed: no profile\n");
    return;
  }
  r.ok = true;
  std::atexit(report);
}

}  // namespace
