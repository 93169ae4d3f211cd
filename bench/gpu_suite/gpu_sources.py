"""The CUDA and torch sources bench/gpu builds and runs (tests/test_torch_frontend.py builds the stable op too)."""

KERNEL = ('extern "C" __global__ void scale(float* x, float a, int n) '
          "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }")

# a classic extension: the declaration in main.cpp, kernel and definition in cuda.cu (as cpp_extension splits them)
CLASSIC_CPP = "torch::Tensor scale(torch::Tensor x, double a);"
CLASSIC_CU = r'''
__global__ void scale_kernel(const float* x, float* y, float a, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
torch::Tensor scale(torch::Tensor x, double a) {
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), (float)a, n);
  return y;
}
'''

# a stable-ABI op whose kernel is in CUDA sources (as FlashAttention-3, xformers, torchao ship)
STABLE_CPP = r'''
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
using torch::stable::Tensor;
void launch_add_one(const float* x, float* y, int64_t n);
Tensor add_one(Tensor x) {
  Tensor y = torch::stable::empty_like(x);
  launch_add_one(reinterpret_cast<const float*>(x.data_ptr()), reinterpret_cast<float*>(y.data_ptr()), x.numel());
  return y;
}
STABLE_TORCH_LIBRARY(abicache_gpu_stable, m) { m.def("add_one(Tensor x) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(abicache_gpu_stable, CUDA, m) { m.impl("add_one", TORCH_BOX(&add_one)); }
'''
STABLE_CU = r'''
#include <cstdint>
__global__ void add_one_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
void launch_add_one(const float* x, float* y, int64_t n) { add_one_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
'''
