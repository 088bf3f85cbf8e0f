// dlopen-based loading of the CUDA driver API and the HIP API (see driver.h), and of zlib.
#include "gpu/driver.h"

#include <dlfcn.h>

#include <mutex>

namespace jax_mxfp4::gpu {
namespace {

// dlsym of the first name that exists; null if none.
void* Symbol(void* lib, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* s = dlsym(lib, name)) return s;
  }
  return nullptr;
}

template <typename F>
bool Bind(void* lib, F*& slot, std::initializer_list<const char*> names, std::string* missing) {
  slot = reinterpret_cast<F*>(Symbol(lib, names));
  if (slot == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + *names.begin();
  return slot != nullptr;
}

std::string DescribeCuda(const Driver& d, int code) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.get_error_name_cuda == nullptr || d.get_error_name_cuda(code, &name) != 0) name = nullptr;
  if (d.get_error_string_cuda == nullptr || d.get_error_string_cuda(code, &text) != 0) {
    text = nullptr;
  }
  return std::string(name ? name : "CUDA error") + ": " + (text ? text : "(no message)");
}

std::string DescribeHip(const Driver& d, int code) {
  const char* name = d.get_error_name_hip ? d.get_error_name_hip(code) : nullptr;
  const char* text = d.get_error_string_hip ? d.get_error_string_hip(code) : nullptr;
  return std::string(name ? name : "HIP error") + ": " + (text ? text : "(no message)");
}

// cuFuncSetAttribute has an enum first parameter in the CUDA headers; an int is ABI-identical.
bool LoadCuda(Driver& d, std::string* error) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    *error = std::string("cannot open libcuda.so.1: ") + (why ? why : "unknown reason");
    return false;
  }
  std::string missing;
  Bind(lib, d.init, {"cuInit"}, &missing);
  Bind(lib, d.device_get, {"cuDeviceGet"}, &missing);
  Bind(lib, d.device_attribute, {"cuDeviceGetAttribute"}, &missing);
  Bind(lib, d.primary_ctx_retain, {"cuDevicePrimaryCtxRetain"}, &missing);
  Bind(lib, d.ctx_push, {"cuCtxPushCurrent_v2", "cuCtxPushCurrent"}, &missing);
  Bind(lib, d.ctx_pop, {"cuCtxPopCurrent_v2", "cuCtxPopCurrent"}, &missing);
  Bind(lib, d.module_load_data, {"cuModuleLoadData"}, &missing);
  Bind(lib, d.module_get_function, {"cuModuleGetFunction"}, &missing);
  Bind(lib, d.func_set_attribute, {"cuFuncSetAttribute"}, &missing);
  Bind(lib, d.launch, {"cuLaunchKernel"}, &missing);
  Bind(lib, d.copy_async, {"cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync"}, &missing);
  Bind(lib, d.get_error_name_cuda, {"cuGetErrorName"}, &missing);
  Bind(lib, d.get_error_string_cuda, {"cuGetErrorString"}, &missing);
  d.describe = DescribeCuda;
  if (!missing.empty()) *error = "libcuda.so.1 lacks " + missing;
  return missing.empty();
}

bool LoadHip(Driver& d, std::string* error) {
  void* lib = dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libamdhip64.so.7", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libamdhip64.so.6", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    *error = std::string("cannot open libamdhip64.so: ") + (why ? why : "unknown reason");
    return false;
  }
  std::string missing;
  Bind(lib, d.init, {"hipInit"}, &missing);
  Bind(lib, d.device_get, {"hipDeviceGet"}, &missing);
  Bind(lib, d.device_attribute, {"hipDeviceGetAttribute"}, &missing);
  Bind(lib, d.primary_ctx_retain, {"hipDevicePrimaryCtxRetain"}, &missing);
  Bind(lib, d.ctx_push, {"hipCtxPushCurrent"}, &missing);
  Bind(lib, d.ctx_pop, {"hipCtxPopCurrent"}, &missing);
  Bind(lib, d.module_load_data, {"hipModuleLoadData"}, &missing);
  Bind(lib, d.module_get_function, {"hipModuleGetFunction"}, &missing);
  Bind(lib, d.launch, {"hipModuleLaunchKernel"}, &missing);
  Bind(lib, d.copy_async, {"hipMemcpyDtoDAsync"}, &missing);
  Bind(lib, d.get_error_name_hip, {"hipGetErrorName"}, &missing);
  Bind(lib, d.get_error_string_hip, {"hipGetErrorString"}, &missing);
  d.func_set_attribute = nullptr;  // LDS needs no opt-in on AMD GPUs
  d.describe = DescribeHip;
  if (!missing.empty()) *error = "libamdhip64.so lacks " + missing;
  return missing.empty();
}

struct Loaded {
  std::once_flag once;
  Driver driver{};
  bool ok = false;
  std::string error;
};

Loaded& Slot(Platform p) {
  static Loaded cuda, rocm;
  return p == Platform::kCuda ? cuda : rocm;
}

}  // namespace

const Driver* LoadDriver(Platform platform, std::string* error) {
  Loaded& slot = Slot(platform);
  std::call_once(slot.once, [&slot, platform] {
    slot.driver.platform = platform;
    slot.ok = platform == Platform::kCuda ? LoadCuda(slot.driver, &slot.error)
                                          : LoadHip(slot.driver, &slot.error);
    if (slot.ok) {
      const int code = slot.driver.init(0);
      if (code != 0) {
        slot.error = DriverError(slot.driver, "initializing the GPU driver", code);
        slot.ok = false;
      }
    }
  });
  if (!slot.ok) {
    *error = slot.error;
    return nullptr;
  }
  return &slot.driver;
}

std::string DriverError(const Driver& driver, const char* what, int code) {
  return std::string(what) + " failed: " + driver.describe(driver, code) + " (" +
         PlatformName(driver.platform) + " code " + std::to_string(code) + ")";
}

std::string Inflate(const uint8_t* src, uint64_t size, uint8_t* dst, uint64_t expected) {
  using Uncompress = int (*)(unsigned char*, unsigned long*, const unsigned char*,
                             unsigned long);
  static Uncompress uncompress = [] {
    void* lib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    return lib ? reinterpret_cast<Uncompress>(dlsym(lib, "uncompress")) : nullptr;
  }();
  if (uncompress == nullptr) return "cannot open zlib (libz.so.1) to inflate the code object";
  unsigned long out_size = expected;
  const int code = uncompress(dst, &out_size, src, size);
  if (code != 0) return "zlib uncompress failed with code " + std::to_string(code);
  if (out_size != expected) {
    return "the code object inflates to " + std::to_string(out_size) + " bytes, not " +
           std::to_string(expected);
  }
  return "";
}

}  // namespace jax_mxfp4::gpu
