/* Uses the CUDA runtime through the stub: links libabicache_cudart_stub, not libcudart.so.12.
   (Declared here as <cuda_runtime_api.h> declares it, so this example needs no CUDA headers.) */
typedef int cudaError_t; /* an enum there; 0 is cudaSuccess */
extern cudaError_t cudaGetDeviceCount(int* count);

int gpu_count(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == 0 ? n : -1; /* -1: no runtime or no driver, never a crash */
}
