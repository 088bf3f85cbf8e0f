// The CPU FFI handlers this extension exports, and the table module.cc turns into the
// `registrations()` dict (target name -> PyCapsule of the handler).
#ifndef JAX_MXFP4_FFI_CPU_HANDLERS_H_
#define JAX_MXFP4_FFI_CPU_HANDLERS_H_

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaxMxfp4WriteCache(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxMxfp4IndexScores(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxMxfp4SelectBlocks(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxMxfp4SparseAttention(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxMxfp4SparseAttentionMxfp8(XLA_FFI_CallFrame* call_frame);
}

namespace jax_mxfp4 {

struct HandlerEntry {
  const char* name;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};

// Target names are part of the contract with jax_mxfp4/ffi_targets.py and the primitives.
inline constexpr HandlerEntry kHandlers[] = {
    {"jax_mxfp4_write_cache", JaxMxfp4WriteCache},
    {"jax_mxfp4_index_scores", JaxMxfp4IndexScores},
    {"jax_mxfp4_select_blocks", JaxMxfp4SelectBlocks},
    {"jax_mxfp4_sparse_attention", JaxMxfp4SparseAttention},
    {"jax_mxfp4_sparse_attention_mxfp8", JaxMxfp4SparseAttentionMxfp8},
};

}  // namespace jax_mxfp4

#endif  // JAX_MXFP4_FFI_CPU_HANDLERS_H_
