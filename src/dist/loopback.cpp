#include "dist/loopback.h"

#include <cstring>
#include <thread>

#include "core/error.h"

namespace rt {

namespace {
const char* op_name(int op) {
  static const char* const names[] = {
      "none", "reduce_scatter_sum", "all_gather(fp32)", "all_gather(16-bit)", "all_reduce_sum", "barrier"};
  return op >= 0 && op <= 5 ? names[op] : "unknown";
}
}  // namespace

class LoopbackRank final : public Collective {
 public:
  LoopbackRank(LoopbackWorld& w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return w_.world_; }

  void reduce_scatter_sum(const float* in, float* out, int64_t count) override {
    publish(1, count, in, out);
    const int64_t off = rank_ * count;
    for (int64_t i = 0; i < count; ++i) out[i] = 0.0f;
    for (int r = 0; r < w_.world_; ++r) {  // rank order: the contract
      const float* src = static_cast<const float*>(w_.slots_[r].in) + off;
      for (int64_t i = 0; i < count; ++i) out[i] += src[i];
    }
    w_.arrive(rank_);  // nobody reuses its input before every rank has read it
  }
  void all_gather(const float* in, float* out, int64_t count) override { gather(2, in, out, count, sizeof(float)); }
  void all_gather(const uint16_t* in, uint16_t* out, int64_t count) override {
    gather(3, in, out, count, sizeof(uint16_t));
  }
  void all_reduce_sum(double* data, int64_t count) override {
    std::vector<double> mine(data, data + count);  // data is overwritten below while others still read
    publish(4, count, mine.data(), data);
    for (int64_t i = 0; i < count; ++i) {
      double s = 0;
      for (int r = 0; r < w_.world_; ++r) s += static_cast<const double*>(w_.slots_[r].in)[i];
      data[i] = s;
    }
    w_.arrive(rank_);
  }
  void barrier() override {
    publish(5, 0, nullptr, nullptr);
    w_.arrive(rank_);  // the slots stay put until every rank has checked them
  }
  std::unique_ptr<Collective> split() override {
    fail("[dp] LoopbackWorld has one order of operations per world: no split communicators");
  }

 private:
  void gather(int op, const void* in, void* out, int64_t count, size_t elem) {
    publish(op, count, in, out);
    for (int r = 0; r < w_.world_; ++r)
      std::memcpy(static_cast<char*>(out) + r * count * elem, w_.slots_[r].in, static_cast<size_t>(count) * elem);
    w_.arrive(rank_);
  }
  // Publishes this rank's call and waits until every rank has made the same one.
  void publish(int op, int64_t count, const void* in, void* out) {
    w_.slots_[rank_] = {op, count, in, out};
    w_.arrive(rank_);
    for (int r = 0; r < w_.world_; ++r)
      if (w_.slots_[r].op != op || w_.slots_[r].count != count)
        fail("[dist] collective mismatch: rank ", rank_, " called ", op_name(op), " with ", count, " elements, rank ",
             r, " ", op_name(w_.slots_[r].op), " with ", w_.slots_[r].count, " (every rank must make the same calls)");
  }
  LoopbackWorld& w_;
  int rank_;
};

LoopbackWorld::LoopbackWorld(int world) : world_(world) {
  RT_CHECK(world >= 1, "[dist] a loopback world needs at least one rank, got ", world);
  slots_.resize(static_cast<size_t>(world));
}

void LoopbackWorld::arrive(int) {
  std::unique_lock<std::mutex> lk(mu_);
  if (aborted_) fail("[dist] another rank failed; this rank stops too");
  const uint64_t gen = generation_;
  if (++waiting_ == world_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) fail("[dist] another rank failed; this rank stops too");
}

void LoopbackWorld::abort() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void LoopbackWorld::run(const std::function<void(Collective&)>& fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = false;
    waiting_ = 0;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_; ++r)
    threads.emplace_back([&, r] {
      LoopbackRank c(*this, r);
      try {
        fn(c);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        abort();
      }
    });
  for (auto& t : threads) t.join();
  // The first error that is not the echo of another rank's failure.
  std::exception_ptr first;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      if (std::string(x.what()).find("another rank failed") == std::string::npos) {
        first = e;
        break;
      }
      if (!first) first = e;
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace rt
