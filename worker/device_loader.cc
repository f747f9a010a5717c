#include "worker/device_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace dslaunch::worker {
namespace {

struct Library {
  void* handle = nullptr;
  std::string error;  // why handle is null
};

std::string ExecutableDir() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return ".";
  std::string p(path, static_cast<size_t>(n));
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// Opened once per process and never closed.
const Library& Cuda() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("DSL_CUDA_LIBRARY"); env && *env) {
      tried.push_back(env);
    } else {
      const std::string dir = ExecutableDir();
      tried = {dir + "/libdsl_cuda.so", dir + "/../lib/dslaunch/libdsl_cuda.so",
               "libdsl_cuda.so"};
    }
    std::string errors;
    for (const std::string& path : tried) {
      // A path that does not exist is skipped quietly; one that exists
      // but fails to load (a missing libcublas, say) is the reason.
      if (path.find('/') != std::string::npos &&
          access(path.c_str(), F_OK) != 0)
        continue;
      lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle == nullptr) {
        errors += std::string(errors.empty() ? "" : "; ") + dlerror();
        continue;
      }
      // One from another build may lay out DeviceEngineOptions otherwise.
      auto abi = reinterpret_cast<int (*)()>(
          dlsym(lib.handle, "dsl_cuda_abi_version"));
      const int version = abi != nullptr ? abi() : 1;
      if (version == kDeviceEngineAbi) return;
      dlclose(lib.handle);
      lib.handle = nullptr;
      errors += std::string(errors.empty() ? "" : "; ") + path +
                " is from another build of dslaunch (engine interface " +
                std::to_string(version) + ", this dsworker's is " +
                std::to_string(kDeviceEngineAbi) + ")";
    }
    lib.error = errors.empty()
                    ? "this dsworker was built without CUDA (no libdsl_cuda.so "
                      "next to it)"
                    : "cannot open the CUDA engine: " + errors;
  });
  return lib;
}

template <typename F>
F Symbol(const char* name, std::string* why) {
  const Library& lib = Cuda();
  if (lib.handle == nullptr) {
    *why = lib.error;
    return nullptr;
  }
  void* sym = dlsym(lib.handle, name);
  if (sym == nullptr) *why = std::string("libdsl_cuda.so lacks ") + name;
  return reinterpret_cast<F>(sym);
}

}  // namespace

StatusOr<DeviceKind> ParseDeviceKind(const std::string& text) {
  if (text == "auto") return DeviceKind::kAuto;
  if (text == "cpu") return DeviceKind::kCpu;
  if (text == "cuda") return DeviceKind::kCuda;
  return InvalidArgument("--device: \"" + text +
                         "\" is not one of auto, cpu, cuda");
}

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

int CudaDeviceCount(std::string* why) {
  auto count = Symbol<int (*)()>("dsl_cuda_device_count", why);
  if (count == nullptr) return 0;
  const int n = count();
  if (n == 0) *why = "no CUDA GPU is visible (driver or CUDA_VISIBLE_DEVICES)";
  return n;
}

StatusOr<DeviceKind> ResolveDevice(DeviceKind asked, std::string* note) {
  if (asked == DeviceKind::kCpu) return DeviceKind::kCpu;
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (n > 0) return DeviceKind::kCuda;
  if (asked == DeviceKind::kCuda) {
    return Unavailable("--device cuda: " + why);
  }
  *note = "training on the CPU: " + why;
  return DeviceKind::kCpu;
}

int DeviceForLocalRank(int local_rank, int device_count) {
  if (device_count <= 0) return 0;
  return (local_rank < 0 ? 0 : local_rank) % device_count;
}

StatusOr<std::unique_ptr<DeviceEngine>> OpenCudaEngine(
    const DeviceEngineOptions& options) {
  std::string why;
  using Create = DeviceEngine* (*)(const DeviceEngineOptions*, std::string*);
  auto create = Symbol<Create>("dsl_cuda_create_engine", &why);
  if (create == nullptr) return Unavailable(why);
  DeviceEngine* engine = create(&options, &why);
  if (engine == nullptr) {
    return Unavailable("the CUDA engine on GPU " +
                       std::to_string(options.device) + ": " + why);
  }
  return std::unique_ptr<DeviceEngine>(engine);
}

}  // namespace dslaunch::worker
