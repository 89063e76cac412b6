// Pure-CUDA workloads for bench/gpu/run when the GPU machine has no PyTorch: two kernels, one
// compute-bound and one memory-bound, sized by the workload name. Progress lines as
// torch_workloads.py writes them. Build: nvcc -O2 -o busy busy.cu
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/time.h>

__global__ void fma_loop(float *x, int iters) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float a = x[i];
  for (int k = 0; k < iters; k++) a = a * 1.0000001f + 0.5f;
  x[i] = a;
}

__global__ void stream_copy(const float *a, float *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    b[i] = a[i] * 2.0f;
}

static double now() { struct timeval t; gettimeofday(&t, 0); return t.tv_sec + t.tv_usec / 1e6; }

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: busy compute|memory|mixed\n"); return 2; }
  const char *name = argv[1];
  int compute = strcmp(name, "memory") != 0, memory = strcmp(name, "compute") != 0;
  size_t n = (size_t)64 << 20;  // 256 MiB per buffer
  float *a, *b;
  if (cudaMalloc(&a, n * sizeof(float)) != cudaSuccess || cudaMalloc(&b, n * sizeof(float)) != cudaSuccess) {
    fprintf(stderr, "busy: cudaMalloc failed\n"); return 1;
  }
  cudaMemset(a, 0, n * sizeof(float));
  const char *s = getenv("KACE_BENCH_SECONDS"), *p = getenv("KACE_PROGRESS_FILE");
  double seconds = s ? atof(s) : 10.0, start = now();
  FILE *progress = p ? fopen(p, "a") : NULL;
  for (long step = 1; now() - start < seconds; step++) {
    if (compute) fma_loop<<<4096, 256>>>(a, 20000);
    if (memory) stream_copy<<<2048, 256>>>(a, b, n);
    if (cudaDeviceSynchronize() != cudaSuccess) { fprintf(stderr, "busy: kernel failed\n"); return 1; }
    if (progress) { fprintf(progress, "%.6f %ld\n", now(), step); fflush(progress); }
  }
  return 0;
}
