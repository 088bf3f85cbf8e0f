// The Python extension module jax_mxfp4._ffi_cpu: it exposes `registrations()`, a dict from
// XLA FFI target name to a PyCapsule holding the handler's address, which the Python side
// passes to jax.ffi.register_ffi_target(..., platform="cpu") (jax_mxfp4/_src/ffi_targets.py).
//
// The handlers themselves live in the other files of this folder; each registers its target
// name beside it (JAX_MXFP4_CPU_TARGET, handlers.h).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cpu/handlers.h"
#include "xla/ffi/api/ffi.h"  // Fails the build early if the FFI headers are missing.

namespace jax_mxfp4 {

std::vector<HandlerEntry>& Handlers() {
  static std::vector<HandlerEntry> handlers;  // filled by the files' static registrations
  return handlers;
}

}  // namespace jax_mxfp4

namespace {

PyObject* Registrations(PyObject* /*self*/, PyObject* /*args*/) {
  PyObject* table = PyDict_New();
  if (table == nullptr) return nullptr;
  for (const jax_mxfp4::HandlerEntry& entry : jax_mxfp4::Handlers()) {
    PyObject* capsule =
        PyCapsule_New(reinterpret_cast<void*>(entry.handler), nullptr, nullptr);
    if (capsule == nullptr || PyDict_SetItemString(table, entry.name, capsule) != 0) {
      Py_XDECREF(capsule);
      Py_DECREF(table);
      return nullptr;
    }
    Py_DECREF(capsule);
  }
  return table;
}

PyMethodDef kMethods[] = {
    {"registrations", Registrations, METH_NOARGS,
     "Dict of XLA FFI target name -> PyCapsule of the CPU handler."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_ffi_cpu", "jax_mxfp4 CPU XLA FFI handlers", -1, kMethods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__ffi_cpu(void) { return PyModule_Create(&kModule); }
