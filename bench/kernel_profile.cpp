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
//
// RAMTRAIN_KPROF_GAPS=1 also records the runtime API calls and NVTX ranges
// (the engine names its host waits: engine/cuda/host_wait.h; CUPTI sees them
// with NVTX_INJECTION64_PATH=<libcupti.so>) and explains every gap of at
// least RAMTRAIN_KPROF_GAP_US microseconds (5) in which no kernel runs. The
// kernel that ends the gap was either launched after the gap began (the
// launch thread was late: the gap goes to the innermost NVTX range that
// thread was in when the gap began, else the runtime call it was in, else
// "outside CUDA" after its last call), or before it (it waited on another
// stream: the copy that ended last in the gap, else "an event or latency";
// a guess where copies of several streams end there). It
// prints the idle time by cause and the largest gaps.
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
  uint32_t name_id, corr;
};

struct ApiCall {  // a runtime or driver API call (RAMTRAIN_KPROF_GAPS)
  uint64_t start, end;
  uint32_t tid, corr, cbid;
  bool driver;  // cuBLAS launches through the driver API
};

struct Range {  // an NVTX range (RAMTRAIN_KPROF_GAPS)
  uint64_t start = 0, end = 0;
  uint32_t tid = 0;
  std::string name;
};

struct Copy {
  uint64_t start, end, bytes;
  uint8_t kind;
};

struct Recorder {
  std::mutex mu;
  std::vector<Kernel> kernels;
  std::vector<Copy> copies;
  std::vector<ApiCall> api;
  std::map<uint32_t, Range> ranges;  // by NVTX range id
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
      r.kernels.push_back({k->start, k->end, r.intern(k->name), k->correlationId});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_RUNTIME || a->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* c = reinterpret_cast<const CUpti_ActivityAPI*>(a);
      r.api.push_back({c->start, c->end, c->threadId, c->correlationId, static_cast<uint32_t>(c->cbid),
                       a->kind == CUPTI_ACTIVITY_KIND_DRIVER});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MARKER) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMarker2*>(a);
      Range& g = r.ranges[m->id];
      if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
        g.start = m->timestamp;
        g.name = m->name ? m->name : "?";
        if (m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD) g.tid = m->objectId.pt.threadId;
      } else if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
        g.end = m->timestamp;
      }
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

std::string api_name(const ApiCall& a) {
  const char* n = nullptr;
  if (cuptiGetCallbackName(a.driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, a.cbid, &n) !=
          CUPTI_SUCCESS ||
      !n)
    return "cbid " + std::to_string(a.cbid);
  std::string s(n);
  const size_t v = s.find("_v");  // cudaEventSynchronize_v3020 -> cudaEventSynchronize
  return v == std::string::npos ? s : s.substr(0, v);
}

// RAMTRAIN_KPROF_GAPS: the kernel-free gaps of [from, last) by cause (the header).
void report_gaps(FILE* out, Recorder& r, uint64_t from, uint64_t last) {
  const char* us_env = std::getenv("RAMTRAIN_KPROF_GAP_US");
  const uint64_t min_gap = static_cast<uint64_t>((us_env ? std::atof(us_env) : 5.0) * 1e3);
  std::vector<const Kernel*> ks;
  for (const Kernel& k : r.kernels)
    if (k.start >= from) ks.push_back(&k);
  std::sort(ks.begin(), ks.end(), [](const Kernel* a, const Kernel* b) { return a->start < b->start; });
  std::map<uint32_t, const ApiCall*> launch;                  // by correlation id
  std::map<uint32_t, std::vector<const ApiCall*>> by_tid[2];  // runtime, driver (a runtime call may nest driver calls)
  for (const ApiCall& a : r.api) {
    if (!a.driver || !launch.count(a.corr)) launch[a.corr] = &a;
    by_tid[a.driver][a.tid].push_back(&a);
  }
  for (auto& m : by_tid)
    for (auto& [t, v] : m)
      std::sort(v.begin(), v.end(), [](const ApiCall* a, const ApiCall* b) { return a->start < b->start; });
  std::vector<const Copy*> copies;
  for (const Copy& c : r.copies) copies.push_back(&c);
  std::sort(copies.begin(), copies.end(), [](const Copy* a, const Copy* b) { return a->end < b->end; });
  std::map<uint32_t, std::vector<const Range*>> ranges;
  for (auto& [id, g] : r.ranges)
    if (g.end > g.start) ranges[g.tid].push_back(&g);
  struct Gap {
    uint64_t b, e;
    std::string cause;
    uint32_t before, after;
  };
  std::vector<Gap> gaps;
  std::map<std::string, std::pair<double, uint64_t>> by_cause;
  std::map<int, std::pair<double, uint64_t>> hist;  // by decade of microseconds
  uint64_t end = ks.empty() ? from : ks[0]->end;
  uint32_t end_name = ks.empty() ? 0 : ks[0]->name_id;
  double idle = 0;
  for (size_t i = 1; i < ks.size(); ++i) {
    const Kernel& k = *ks[i];
    if (k.start >= end + min_gap) {
      Gap g{end, k.start, "", end_name, k.name_id};
      auto it = launch.find(k.corr);
      if (it == launch.end()) {
        g.cause = "no launch record";
      } else if (it->second->start > g.b) {  // launched after the device went idle
        const ApiCall& l = *it->second;
        const Range* in = nullptr;
        for (const Range* q : ranges[l.tid])
          if (q->start <= g.b && g.b < q->end && (!in || q->start > in->start)) in = q;
        // one thread's calls of one API do not overlap: the last to start before the gap, runtime first
        const ApiCall* call = nullptr;
        const ApiCall* prev = nullptr;
        for (int d = 0; d < 2 && !call; ++d) {
          const auto& calls = by_tid[d][l.tid];
          auto after = std::upper_bound(calls.begin(), calls.end(), g.b,
                                        [](uint64_t t, const ApiCall* a) { return t < a->start; });
          const ApiCall* p = after == calls.begin() ? nullptr : *(after - 1);
          if (p && p->end > g.b) call = p;
          if (p && (!prev || p->end > prev->end)) prev = p;
        }
        if (in)
          g.cause = "late launch, host in NVTX \"" + in->name + "\"";
        else if (call)
          g.cause = "late launch, host in " + api_name(*call);
        else
          g.cause = "late launch, host outside CUDA after " + (prev ? api_name(*prev) : std::string("?"));
      } else {                       // queued before: it waited on another stream's work
        // the copy that ended last in the gap (or within 2 us after it): the one that released the kernel
        const char* copy = nullptr;
        auto c = std::upper_bound(copies.begin(), copies.end(), g.e + 2000,
                                  [](uint64_t t, const Copy* x) { return t < x->end; });
        if (c != copies.begin() && (*(c - 1))->end >= g.b) copy = copy_kind((*(c - 1))->kind);
        g.cause = copy ? std::string("queued, waited for a copy ") + copy : "queued, waited on an event (or latency)";
      }
      const double len = static_cast<double>(g.e - g.b);
      idle += len;
      auto& c = by_cause[g.cause];
      c.first += len, c.second++;
      int dec = 0;
      for (double u = len * 1e-3; u >= 10 && dec < 5; u /= 10) ++dec;
      auto& h = hist[dec];
      h.first += len, h.second++;
      gaps.push_back(std::move(g));
    }
    if (k.end > end) end = k.end, end_name = k.name_id;
  }
  std::fprintf(
      out, "[kernel_profile] gaps >= %.0f us: %zu, %.3f s of the %.3f s window (%zu API records, %zu NVTX ranges%s)\n",
      min_gap * 1e-3, gaps.size(), idle * 1e-9, (last - from) * 1e-9, r.api.size(), r.ranges.size(),
      r.ranges.empty() ? "; none: NVTX_INJECTION64_PATH=<libcupti.so> records them" : "");
  static const char* decade[] = {"< 10 us", "10-100 us", "0.1-1 ms", "1-10 ms", "10-100 ms", ">= 100 ms"};
  for (auto& [d, h] : hist)
    std::fprintf(out, "[kernel_profile] gap size %-10s %8llu gaps %9.3f s\n", decade[d], (unsigned long long)h.second,
                 h.first * 1e-9);
  std::vector<std::pair<double, std::string>> causes;
  for (auto& [c, v] : by_cause) causes.emplace_back(v.first, c);
  std::sort(causes.rbegin(), causes.rend());
  for (auto& [t, c] : causes)
    std::fprintf(out, "[kernel_profile] gap cause %9.3f s %8llu gaps  %s\n", t * 1e-9,
                 (unsigned long long)by_cause[c].second, c.c_str());
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.e - a.b > b.e - b.b; });
  auto short_name = [&](uint32_t id) {
    std::string n = demangle(r.names[id]);
    return n.size() > 60 ? n.substr(0, 57) + "..." : n;
  };
  const char* top_env = std::getenv("RAMTRAIN_KPROF_TOP");
  const size_t top = top_env ? static_cast<size_t>(std::atoi(top_env)) : 20;
  for (size_t j = 0; j < std::min(top, gaps.size()); ++j) {
    const Gap& g = gaps[j];
    std::fprintf(out, "[kernel_profile] gap %2zu %9.3f ms at %8.3f s  %s | after %s | before %s\n", j + 1,
                 (g.e - g.b) * 1e-6, (g.b - from) * 1e-9, g.cause.c_str(), short_name(g.before).c_str(),
                 short_name(g.after).c_str());
  }
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
  if (std::getenv("RAMTRAIN_KPROF_GAPS")) report_gaps(out, r, from, last);
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
  if (ok && std::getenv("RAMTRAIN_KPROF_GAPS")) {
    ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) == CUPTI_SUCCESS &&
         cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) == CUPTI_SUCCESS;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MARKER) != CUPTI_SUCCESS)
      std::fprintf(stderr, "[kernel_profile] NVTX markers not available: gaps without the engine's wait names\n");
  }
  if (!ok) {
    std::fprintf(stderr, "[kernel_profile] cuptiActivityEnable failed: no profile\n");
    return;
  }
  r.ok = true;
  std::atexit(report);
}

}  // namespace
