// Resident blocks of the MX dual CUDA kernels (csrc/kernels/quant_dual_mx.cu) on the current GPU:
// a (no cluster) from cudaOccupancyMaxActiveBlocksPerMultiprocessor x SMs, the cluster variant
// f (2 x 4 tiles) from cudaOccupancyMaxActiveClusters x cluster size (H200, call 9.4: a 396, f
// 360; the removed h / i, 2 x 2 / 1 x 4: 368). The real kernels (the .cu is included), e4m3
// instances. Build and run from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -DPRIMUS_TURBO_WITH_GPU \
//     -Icsrc/include scripts/mx_cluster_occupancy.cu -o /tmp/mx_occ && /tmp/mx_occ
#include <cstdio>

#include "../csrc/kernels/quant_dual_mx.cu"

namespace {

template <int CM, int CN>
void report(const char* name, int a_blocks) {
  auto* kern = primus_turbo::quant_mx_cluster_kernel<false, CM, CN>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(2048, 1, 1);  // 8192 x 4096: 64 x 32 tiles
  cfg.blockDim = dim3(256, 1, 1);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM * CN;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg);
  if (e != cudaSuccess) {
    std::printf("%s (%d x %d tiles): %s\n", name, CM, CN, cudaGetErrorString(e));
    return;
  }
  std::printf("%s (%d x %d tiles, clusters of %d): %d clusters = %d resident blocks (a: %d)\n",
              name, CM, CN, CM * CN, clusters, clusters * CM * CN, a_blocks);
}

}  // namespace

int main() {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, primus_turbo::quant_mx_tile_kernel<false, 8, 3>, 256, 0);
  std::printf("a (no cluster): %d blocks/SM x %d SMs = %d resident blocks\n", per_sm, sms,
              per_sm * sms);
  report<2, 4>("f", per_sm * sms);
  return 0;
}
