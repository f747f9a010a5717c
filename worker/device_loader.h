// Opens the CUDA engine (libdsl_cuda.so, worker/device_engine.h) at run
// time, so that dsworker runs on machines without CUDA and loads the GPU
// libraries only for a run that uses them. Where it looks, in order:
// $DSL_CUDA_LIBRARY, the directory of the running executable, its
// ../lib/dslaunch, then the dynamic linker's own search (LD_LIBRARY_PATH).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "worker/device_engine.h"

namespace dslaunch::worker {

enum class DeviceKind { kAuto, kCpu, kCuda };

// "auto", "cpu", "cuda"; anything else is InvalidArgument naming the value.
StatusOr<DeviceKind> ParseDeviceKind(const std::string& text);
const char* DeviceKindName(DeviceKind kind);

// The CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies);
// 0 with the reason in *why when the engine is not built, cannot be opened
// (no CUDA libraries) or sees no GPU.
int CudaDeviceCount(std::string* why);

// kAuto: kCuda when a GPU is visible, else kCpu (*note says why, for a line
// on rank 0). kCuda without a GPU: Unavailable with the reason.
StatusOr<DeviceKind> ResolveDevice(DeviceKind asked, std::string* note);

// The GPU a rank uses: LOCAL_RANK among the visible devices, wrapping when
// ranks outnumber them (they then share one).
int DeviceForLocalRank(int local_rank, int device_count);

StatusOr<std::unique_ptr<DeviceEngine>> OpenCudaEngine(
    const DeviceEngineOptions& options);

}  // namespace dslaunch::worker
