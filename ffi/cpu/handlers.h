// The registry of the CPU FFI handlers this extension exports, which module.cc turns into the
// `registrations()` dict (target name -> PyCapsule of the handler).
//
// Each handler's file names its target once, beside the handler:
//   JAX_MXFP4_CPU_TARGET("jax_mxfp4_write_cache", JaxMxfp4WriteCache);
// The name is `jax_` + the name of the operation's primitive (`mxfp4_write_cache`): the Python
// side derives it from the operation (jax_mxfp4/_src/ffi_targets.py `cpu_target`) and reads
// the names registered here, so nothing else lists them.
#ifndef JAX_MXFP4_FFI_CPU_HANDLERS_H_
#define JAX_MXFP4_FFI_CPU_HANDLERS_H_

#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jax_mxfp4 {

struct HandlerEntry {
  const char* name;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};

// Every handler registered by JAX_MXFP4_CPU_TARGET, in no particular order (module.cc).
std::vector<HandlerEntry>& Handlers();

struct RegisterHandler {
  RegisterHandler(const char* name, XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*)) {
    Handlers().push_back({name, handler});
  }
};

}  // namespace jax_mxfp4

#define JAX_MXFP4_CPU_TARGET(name, symbol)                                   \
  namespace {                                                                \
  const ::jax_mxfp4::RegisterHandler kRegister##symbol{name, symbol};        \
  }                                                                          \
  static_assert(true, "a semicolon follows")

#endif  // JAX_MXFP4_FFI_CPU_HANDLERS_H_
