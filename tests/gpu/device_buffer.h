// Device buffers and host<->device copies for the GPU op tests
// (cuda_ops_test, cuda_moe_test): bf16 values are handled on the host as the
// fp32 numbers they represent. CUDA builds only.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda/check.h"
#include "cuda/ops.h"
#include "testutil.h"

namespace rt::gputest {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 16)); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void poison() { CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_)); }  // NaN in bf16 and fp32
  rt::cuda::Scratch scratch() const { return {ptr_, bytes_}; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

inline std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = rt::bf16_to_f32(rt::f32_to_bf16(x));
  return v;
}
inline std::unique_ptr<DeviceBuffer> upload_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = rt::f32_to_bf16(v[i]);
  auto d = std::make_unique<DeviceBuffer>(h.size() * 2);
  CUDA_CHECK(cudaMemcpy(d->data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::unique_ptr<DeviceBuffer> upload(const std::vector<T>& v) {
  auto d = std::make_unique<DeviceBuffer>(v.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpy(d->data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
inline std::unique_ptr<DeviceBuffer> upload_f32(const std::vector<float>& v) { return upload(v); }
inline std::vector<float> download_bf16(const DeviceBuffer& d, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), d.data(), h.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = rt::bf16_to_f32(h[i]);
  return f;
}
template <class T>
std::vector<T> download(const DeviceBuffer& d, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), d.data(), h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
inline std::vector<float> download_f32(const DeviceBuffer& d, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> f(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(f.data(), d.data(), f.size() * 4, cudaMemcpyDeviceToHost));
  return f;
}

// rel_l2 and scale-relative max error, both bounded; NaN fails both.
inline void expect_close(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                         double rel_tol, double max_tol) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  const double rel = rt::test::rel_l2(got.data(), ref.data(), static_cast<int64_t>(got.size()));
  const double mx = rt::test::max_rel_to_scale(got.data(), ref.data(), static_cast<int64_t>(got.size()));
  EXPECT_TRUE(rel <= rel_tol) << name << ": rel_l2 " << rel << " > " << rel_tol;
  EXPECT_TRUE(mx <= max_tol) << name << ": max |err| / max |ref| " << mx << " > " << max_tol;
}

}  // namespace rt::gputest
