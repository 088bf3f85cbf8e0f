// The few CUDA driver API and HIP API entry points the launcher needs, found with dlopen at
// run time (libcuda.so.1 / libamdhip64.so): building the package needs no GPU SDK, and a
// process that never lowers for a GPU never opens either library.
//
// Both APIs are reduced to one table of function pointers over opaque handles; the types and
// enum values below are the APIs' own (CUresult / hipError_t are ints, 0 = success).
#ifndef JAX_MXFP4_FFI_GPU_DRIVER_H_
#define JAX_MXFP4_FFI_GPU_DRIVER_H_

#include <cstdint>
#include <string>

namespace jax_mxfp4::gpu {

enum class Platform : int { kCuda = 0, kRocm = 1 };

inline const char* PlatformName(Platform p) { return p == Platform::kCuda ? "CUDA" : "ROCm"; }

// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES and hipFuncAttributeMaxDynamicSharedMemorySize.
inline constexpr int kAttrMaxDynamicShared = 8;
// CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (CUDA only).
inline constexpr int kCudaAttrSharedOptin = 97;

// One GPU API, as function pointers (handles are opaque void*).
struct Driver {
  Platform platform;
  int (*init)(unsigned int flags);
  int (*device_get)(int* device, int ordinal);
  int (*device_attribute)(int* value, int attribute, int device);
  int (*primary_ctx_retain)(void** ctx, int device);
  int (*ctx_push)(void* ctx);
  int (*ctx_pop)(void** ctx);
  int (*module_load_data)(void** module, const void* image);
  int (*module_get_function)(void** function, void* module, const char* name);
  int (*func_set_attribute)(void* function, int attribute, int value);  // may be null (HIP)
  int (*launch)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shared, void* stream, void** params,
                void** extra);
  // Device-to-device copy on a stream (cuMemcpyDtoDAsync / hipMemcpyDtoDAsync). Device
  // pointers travel as 64-bit integers (CUdeviceptr; hipDeviceptr_t is ABI-identical).
  int (*copy_async)(uint64_t dst, uint64_t src, size_t bytes, void* stream);
  // The driver's text for an error code ("CUDA_ERROR_...: message").
  std::string (*describe)(const Driver& driver, int code);
  int (*get_error_name_cuda)(int code, const char** out);    // CUDA only
  int (*get_error_string_cuda)(int code, const char** out);  // CUDA only
  const char* (*get_error_name_hip)(int code);                // HIP only
  const char* (*get_error_string_hip)(int code);              // HIP only
};

// The driver of `platform`, opened once per process (thread-safe). On failure returns null and
// sets `*error` (the dlopen/dlsym message).
const Driver* LoadDriver(Platform platform, std::string* error);

// "what failed: <driver error name>: <driver message> (code N)".
std::string DriverError(const Driver& driver, const char* what, int code);

// zlib's uncompress(), from libz.so.1 opened at run time: inflates `size` bytes of `src` into
// exactly `expected` bytes of `dst`. Returns an empty string on success, else the reason.
std::string Inflate(const uint8_t* src, uint64_t size, uint8_t* dst, uint64_t expected);

}  // namespace jax_mxfp4::gpu

#endif  // JAX_MXFP4_FFI_GPU_DRIVER_H_
