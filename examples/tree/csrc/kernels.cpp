#include <torch/extension.h>
torch::Tensor twice(const torch::Tensor& x) { return x * 2; }
