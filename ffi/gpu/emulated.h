// The hand-off from the launcher's CPU form to the CDNA emulator, a Python callable that
// jax_mxfp4's emulated backends install (`_ffi_gpu.set_emulator`). The launcher decodes and
// checks its attributes and packs the parameters exactly as for a GPU launch; what a HIP
// runtime would do next (placing each parameter at its offset in the kernarg segment, from the
// code object's metadata) and the execution are the emulator's.
#ifndef JAX_MXFP4_FFI_GPU_EMULATED_H_
#define JAX_MXFP4_FFI_GPU_EMULATED_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace jax_mxfp4::gpu {

struct EmulatedBuffer {
  uint64_t address;  // host address of the buffer XLA gave the call
  uint64_t bytes;
  bool result;  // a result (written by the kernel); operands are read-only
};

struct EmulatedLaunch {
  const std::vector<uint8_t>* image;  // the inflated code object
  std::string symbol;
  std::array<unsigned, 3> grid, block;
  unsigned shared;                // dynamic LDS bytes
  std::vector<int32_t> kinds;     // the launcher's parameter kinds (launch.h)
  std::vector<uint64_t> slots;    // each parameter packed into 8 bytes, as the GPU launch has it
  std::vector<EmulatedBuffer> buffers;  // operands, then results
};

// Runs `launch` in the installed emulator; an empty string on success, else the reason (no
// emulator installed, or the emulator's fault report).
std::string RunEmulator(const EmulatedLaunch& launch);

}  // namespace jax_mxfp4::gpu

#endif  // JAX_MXFP4_FFI_GPU_EMULATED_H_
