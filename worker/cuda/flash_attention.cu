// Which shapes and GPUs the fused attention takes, and its workspace
// (flash_attention.cuh has the design; flash_forward.cu and
// flash_backward.cu the kernels).
#include "worker/cuda/flash_attention.cuh"

namespace dslaunch::worker::cuda {

using flash::DdFloats;
using flash::MostSmem;

bool FlashAttentionShape(int B, int C, int NH) {
  if (B < 1 || NH < 1 || C % NH != 0 || B * NH > 65535) return false;
  const int hs = C / NH;
  return hs == 16 || hs == 32 || hs == 64 || hs == 128;
}

bool FlashAttentionSupported(int B, int C, int NH) {
  if (!FlashAttentionShape(B, C, NH)) return false;
  const size_t smem = flash::ByHeadSize(C / NH, size_t{0}, [](auto hs) {
    return MostSmem<decltype(hs)::value>();
  });
  if (smem == 0) return false;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return smem <= static_cast<size_t>(optin);
}

size_t FlashAttentionWorkspaceFloats(int B, int T, int C, int NH, bool qkv16) {
  // D, then dout and qkv (unless it comes rounded) at 2 bytes an element.
  const size_t btc = static_cast<size_t>(B) * T * C;
  return DdFloats(B, T, NH) + (qkv16 ? btc / 2 : 2 * btc);
}

}  // namespace dslaunch::worker::cuda
