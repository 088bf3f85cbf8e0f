// The generic GPU code-object launcher: one XLA FFI handler (three stages) that launches a
// precompiled kernel (cubin on CUDA, HSACO on ROCm) described entirely by its attributes.
//
// Attributes of the custom call (all required; jax_mxfp4/_src/gpu/launch.py writes them):
//   code          string  base64 of the zlib-compressed code object
//   code_size     i64     bytes of the inflated code object
//   code_hash     string  content hash of the code object (the module cache key, with symbol)
//   symbol        string  the kernel's entry point
//   grid, block   i64[3]  launch dimensions (a zero grid dimension launches nothing)
//   shared_mem    i64     dynamic shared memory bytes
//   param_kinds   i32[N]  one per kernel parameter: 0 buffer, 1 i32, 2 i64, 3 f32, 4 null pointer
//   param_values  i64[N]  buffer: index into (operands..., results...); i32/i64: the value;
//                         f32: its bit pattern; null pointer: ignored
//
// Stages: instantiate decodes and checks the attributes, inflates the code object into the
// handler state and, when XLA names the device, loads the module there; initialize (which XLA
// runs before every execution, outside any command-buffer capture) makes sure the module is
// loaded on the executing device; execute only packs the parameters and calls the driver's
// launch on XLA's stream. Modules live in a per-process cache keyed by (platform, device,
// code hash, symbol), loaded once into the device's primary context.
#ifndef JAX_MXFP4_FFI_GPU_LAUNCH_H_
#define JAX_MXFP4_FFI_GPU_LAUNCH_H_

#include <cstdint>

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaxMxfp4CudaLaunchInstantiate(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxMxfp4CudaLaunchInitialize(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxMxfp4CudaLaunchExecute(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxMxfp4RocmLaunchInstantiate(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxMxfp4RocmLaunchInitialize(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxMxfp4RocmLaunchExecute(XLA_FFI_CallFrame* frame);
// The CPU form (one execute stage): the same attributes, launched in the CDNA emulator
// (emulated.h) instead of on a device; what the emulated ROCm backends register for "cpu".
XLA_FFI_Error* JaxMxfp4EmulatedLaunch(XLA_FFI_CallFrame* frame);
}

namespace jax_mxfp4::gpu {

// Counters of the module cache, for tests: modules loaded, instantiations that named their
// device, and instantiations that left loading to the initialize stage.
struct CacheStats {
  int64_t modules_loaded;
  int64_t instantiated_with_device;
  int64_t instantiated_without_device;
};
CacheStats GetCacheStats();

}  // namespace jax_mxfp4::gpu

#endif  // JAX_MXFP4_FFI_GPU_LAUNCH_H_
