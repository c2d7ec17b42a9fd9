// A hand-written copy of Triton's warp-specialize dispatch protocol, for compute-sanitizer racecheck: no Triton,
// no flashcore. 8 warps: warps 0-3 are the "default partition", warps 4-7 one 4-warp "worker".
//   default: [prologue: bar.sync 0, 128]  write state; bar.sync 1 (A); bar.sync 1 (B); body; bar.sync 1 (C);
//            write exit state; bar.sync 1 (D); exit
//   worker:  bar.sync 1 (A); read state; bar.sync 1 (B); body; bar.sync 1 (C); bar.sync 1 (D); read exit state
// Every shared access is separated from the other side's by a CTA-wide named barrier 1 (256 threads); the
// optional `bar.sync 0, 128` is executed by the default warps alone (a barrier for 128 threads on barrier 0, as
// Triton lowers gl.thread_barrier() in a 4-warp partition). Build: nvcc -arch=sm_90a -o rc racecheck_dispatch.cu
// Run: ./rc PROLOGUE IN_DEFAULT [ID] (0/1 each; ID: the partial barrier's id, default 0); exit 0 when the output is
// right. With ID 0 the partial barrier is the one Triton emits; with another id the same protocol tells whether
// racecheck's reports follow barrier 0 used for part of the CTA.
#include <cstdio>
#include <cstdlib>

__global__ void dispatch(int *out, int prologue_barrier, int in_default_barrier, int id) {
  __shared__ unsigned int state[2];
  const int warp = threadIdx.x / 32;
  if (warp < 4) {
    if (prologue_barrier) asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
    state[1] = 0x01010101u;  // every default thread writes the same word (Triton's STS.64 of the default)
    asm volatile("bar.sync 1;" ::: "memory");  // A
    asm volatile("bar.sync 1;" ::: "memory");  // B: partitions start
    if (in_default_barrier) asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
    out[threadIdx.x] = threadIdx.x;
    asm volatile("bar.sync 1;" ::: "memory");  // C: partitions end
    state[1] = 0x03030303u;                    // exit
    asm volatile("bar.sync 1;" ::: "memory");  // D
  } else {
    asm volatile("bar.sync 1;" ::: "memory");  // A
    const unsigned char *s = reinterpret_cast<const unsigned char *>(state);
    int job = s[4 + (warp - 4)];
    asm volatile("bar.sync 1;" ::: "memory");  // B
    out[threadIdx.x] = threadIdx.x + 1000 * job;
    asm volatile("bar.sync 1;" ::: "memory");  // C
    asm volatile("bar.sync 1;" ::: "memory");  // D
    int done = s[4 + (warp - 4)];
    if (done != 3) out[threadIdx.x] = -1;
  }
}

int main(int argc, char **argv) {
  int prologue = argc > 1 ? atoi(argv[1]) : 0, in_default = argc > 2 ? atoi(argv[2]) : 0;
  int id = argc > 3 ? atoi(argv[3]) : 0;
  const int blocks = 132, threads = 256;
  int *d, *h = (int *)malloc(sizeof(int) * blocks * threads);
  if (cudaMalloc(&d, sizeof(int) * threads) != cudaSuccess) return 2;
  for (int rep = 0; rep < blocks; ++rep) dispatch<<<1, threads>>>(d, prologue, in_default, id);
  if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) return 2;
  cudaMemcpy(h, d, sizeof(int) * threads, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int t = 0; t < threads; ++t) bad += h[t] != (t < 128 ? t : t + 1000);
  printf("WORKLOAD racecheck-dispatch prologue=%d in_default=%d id=%d ok=%d\n", prologue, in_default, id, bad == 0);
  return bad ? 1 : 0;
}
