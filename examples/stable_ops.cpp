// A stable-ABI torch op: one build serves every torch from its target on.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>

using torch::stable::Tensor;

Tensor my_fill(Tensor t, double v) {
  Tensor out = torch::stable::empty_like(t);
  torch::stable::fill_(out, v);
  return out;
}

STABLE_TORCH_LIBRARY(my_ops, m) { m.def("my_fill(Tensor t, float v) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(my_ops, CPU, m) { m.impl("my_fill", TORCH_BOX(&my_fill)); }
