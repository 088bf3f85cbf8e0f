// The Python extension module jax_mxfp4._ffi_gpu: `registrations()` gives, per platform
// ("CUDA", "ROCM"), a dict from FFI stage name to a PyCapsule of the launcher's handler for
// that stage, which jax_mxfp4/_src/gpu/launch.py passes to jax.ffi.register_ffi_target.
// `cache_stats()` reports the module cache's counters (launch.h). `emulated_handler()` is the
// launcher's CPU form (a capsule for platform "cpu") and `set_emulator(callable)` installs the
// Python CDNA emulator it hands launches to (emulated.h). Importing this module opens no GPU
// library: the driver is found with dlopen when a kernel is first instantiated.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gpu/emulated.h"
#include "gpu/launch.h"

namespace jax_mxfp4::gpu {
void SetEmulator(PyObject* callable);
}  // namespace jax_mxfp4::gpu

namespace {

using Handler = XLA_FFI_Error* (*)(XLA_FFI_CallFrame*);

PyObject* Stages(Handler instantiate, Handler initialize, Handler execute) {
  PyObject* stages = PyDict_New();
  if (stages == nullptr) return nullptr;
  const struct {
    const char* name;
    Handler fn;
  } entries[] = {{"instantiate", instantiate}, {"initialize", initialize}, {"execute", execute}};
  for (const auto& entry : entries) {
    PyObject* capsule = PyCapsule_New(reinterpret_cast<void*>(entry.fn), nullptr, nullptr);
    if (capsule == nullptr || PyDict_SetItemString(stages, entry.name, capsule) != 0) {
      Py_XDECREF(capsule);
      Py_DECREF(stages);
      return nullptr;
    }
    Py_DECREF(capsule);
  }
  return stages;
}

PyObject* Registrations(PyObject*, PyObject*) {
  PyObject* table = PyDict_New();
  if (table == nullptr) return nullptr;
  PyObject* cuda = Stages(JaxMxfp4CudaLaunchInstantiate, JaxMxfp4CudaLaunchInitialize,
                          JaxMxfp4CudaLaunchExecute);
  PyObject* rocm = Stages(JaxMxfp4RocmLaunchInstantiate, JaxMxfp4RocmLaunchInitialize,
                          JaxMxfp4RocmLaunchExecute);
  if (cuda == nullptr || rocm == nullptr || PyDict_SetItemString(table, "CUDA", cuda) != 0 ||
      PyDict_SetItemString(table, "ROCM", rocm) != 0) {
    Py_XDECREF(cuda);
    Py_XDECREF(rocm);
    Py_DECREF(table);
    return nullptr;
  }
  Py_DECREF(cuda);
  Py_DECREF(rocm);
  return table;
}

PyObject* CacheStats(PyObject*, PyObject*) {
  const jax_mxfp4::gpu::CacheStats s = jax_mxfp4::gpu::GetCacheStats();
  return Py_BuildValue("{s:L,s:L,s:L}", "modules_loaded", static_cast<long long>(s.modules_loaded),
                       "instantiated_with_device",
                       static_cast<long long>(s.instantiated_with_device),
                       "instantiated_without_device",
                       static_cast<long long>(s.instantiated_without_device));
}

PyObject* EmulatedHandler(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(JaxMxfp4EmulatedLaunch), nullptr, nullptr);
}

PyObject* SetEmulator(PyObject*, PyObject* callable) {
  if (callable != Py_None && !PyCallable_Check(callable)) {
    PyErr_SetString(PyExc_TypeError, "set_emulator takes a callable or None");
    return nullptr;
  }
  jax_mxfp4::gpu::SetEmulator(callable == Py_None ? nullptr : callable);
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"registrations", Registrations, METH_NOARGS,
     "Dict platform -> dict of FFI stage -> PyCapsule of the GPU launcher."},
    {"cache_stats", CacheStats, METH_NOARGS, "Counters of the launcher's module cache."},
    {"emulated_handler", EmulatedHandler, METH_NOARGS,
     "PyCapsule of the launcher's CPU form, which runs launches in the installed emulator."},
    {"set_emulator", SetEmulator, METH_O,
     "Install the callable that emulates launches (None removes it)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_ffi_gpu", "jax_mxfp4 generic GPU code-object launcher", -1,
    kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__ffi_gpu(void) { return PyModule_Create(&kModule); }
