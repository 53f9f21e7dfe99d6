#include "cuda/trace.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/fs.h"
#include "cuda/check.h"

namespace rt::cuda {

Tracer::Tracer(std::string path) : path_(std::move(path)) {
  if (!enabled()) return;
  CUDA_CHECK(cudaEventCreate(&base_));
  CUDA_CHECK(cudaEventRecord(base_, 0));
  CUDA_CHECK(cudaEventSynchronize(base_));
  base_host_ = std::chrono::steady_clock::now();
}

Tracer::~Tracer() {
  if (!enabled()) return;
  try {
    cudaDeviceSynchronize();
    write();
  } catch (...) {
  }
  for (auto& r : recs_) {
    if (r.b) cudaEventDestroy(r.b);
    if (r.e) cudaEventDestroy(r.e);
  }
  for (auto e : pool_) cudaEventDestroy(e);
  cudaEventDestroy(base_);
}

double Tracer::host_now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - base_host_).count();
}

cudaEvent_t Tracer::get_event() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

Tracer::Span Tracer::gpu_begin(Lane lane, const char* name, int layer, cudaStream_t s) {
  if (!enabled()) return {};
  std::lock_guard<std::mutex> lk(mu_);
  Rec r{lane, name, layer, step_ + 1};
  r.b = get_event();
  r.e = get_event();
  CUDA_CHECK(cudaEventRecord(r.b, s));
  recs_.push_back(r);
  return Span{static_cast<int>(recs_.size() - 1)};
}

void Tracer::gpu_end(Span sp, cudaStream_t s) {
  if (!enabled() || sp.idx < 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  CUDA_CHECK(cudaEventRecord(recs_[sp.idx].e, s));
}

Tracer::Span Tracer::host_begin(const char* name, int layer) {
  if (!enabled()) return {};
  std::lock_guard<std::mutex> lk(mu_);
  Rec r{Lane::optimizer, name, layer, step_};
  r.t0 = host_now_us();
  recs_.push_back(r);
  return Span{static_cast<int>(recs_.size() - 1)};
}

void Tracer::host_end(Span sp) {
  if (!enabled() || sp.idx < 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  recs_[sp.idx].t1 = host_now_us();
  recs_[sp.idx].done = true;
}

void Tracer::flush_step(int64_t step) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  step_ = step;
  for (size_t i = resolved_upto_; i < recs_.size(); ++i) {
    Rec& r = recs_[i];
    if (r.done || !r.b) continue;
    if (cudaEventQuery(r.e) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    float a = 0, b = 0;
    CUDA_CHECK(cudaEventElapsedTime(&a, base_, r.b));
    CUDA_CHECK(cudaEventElapsedTime(&b, base_, r.e));
    r.t0 = a * 1000.0;
    r.t1 = b * 1000.0;
    r.done = true;
    pool_.push_back(r.b);
    pool_.push_back(r.e);
    r.b = r.e = nullptr;
  }
  while (resolved_upto_ < recs_.size() && recs_[resolved_upto_].done) ++resolved_upto_;
}

double Tracer::lane_busy_seconds(Lane lane, int64_t step) {
  if (!enabled()) return -1;
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<double, double>> iv;
  for (auto& r : recs_)
    if (r.done && r.lane == lane && r.step == step && r.t1 >= r.t0) iv.push_back({r.t0, r.t1});
  std::sort(iv.begin(), iv.end());
  double busy = 0, cur_b = -1, cur_e = -1;
  for (auto& [b, e] : iv) {
    if (b > cur_e) {
      if (cur_e > cur_b) busy += cur_e - cur_b;
      cur_b = b;
      cur_e = e;
    } else if (e > cur_e) {
      cur_e = e;
    }
  }
  if (cur_e > cur_b) busy += cur_e - cur_b;
  return busy * 1e-6;
}

void Tracer::write() {
  flush_step(step_);
  std::lock_guard<std::mutex> lk(mu_);
  std::ostringstream o;
  o << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  const char* lanes[] = {"", "h2d stream", "compute stream", "d2h stream", "CPU optimizer"};
  for (int l = 1; l <= 4; ++l)
    o << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << l << ",\"args\":{\"name\":\"" << lanes[l]
      << "\"}},\n";
  bool first = true;
  for (auto& r : recs_) {
    if (!r.done || r.t1 < r.t0) continue;
    if (!first) o << ",\n";
    first = false;
    o << "{\"name\":\"" << r.name;
    if (r.layer >= 0) o << " " << r.layer;
    o << "\",\"ph\":\"X\",\"pid\":1,\"tid\":" << static_cast<int>(r.lane) << ",\"ts\":" << r.t0
      << ",\"dur\":" << (r.t1 - r.t0) << ",\"args\":{\"step\":" << r.step << "}}";
  }
  o << "\n]}\n";
  write_file_atomic(path_, o.str());
}

}  // namespace rt::cuda
