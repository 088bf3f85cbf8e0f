// The launcher's CPU form hands its launch to the Python emulator (see emulated.h).
#define PY_SSIZE_T_CLEAN
#include "gpu/emulated.h"

#include <Python.h>

#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace jax_mxfp4::gpu {
namespace {

std::mutex hook_mu;
PyObject* hook = nullptr;  // a new reference, kept for the life of the process

// The message of the pending Python exception (which is cleared).
std::string TakeError() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string text = "unknown error";
  if (value != nullptr) {
    PyObject* str = PyObject_Str(value);
    const char* utf8 = str ? PyUnicode_AsUTF8(str) : nullptr;
    const char* name = type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "Exception";
    if (utf8 != nullptr) text = std::string(name) + ": " + utf8;
    Py_XDECREF(str);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  PyErr_Clear();
  return text;
}

PyObject* Triple(const std::array<unsigned, 3>& v) {
  return Py_BuildValue("(III)", v[0], v[1], v[2]);
}

// (image, symbol, grid, block, shared, [(kind, slot)...], [(address, bytes, result)...]).
PyObject* Arguments(const EmulatedLaunch& l) {
  PyObject* params = PyList_New(static_cast<Py_ssize_t>(l.kinds.size()));
  PyObject* buffers = PyList_New(static_cast<Py_ssize_t>(l.buffers.size()));
  if (params == nullptr || buffers == nullptr) {
    Py_XDECREF(params);
    Py_XDECREF(buffers);
    return nullptr;
  }
  for (size_t i = 0; i < l.kinds.size(); ++i) {
    PyList_SET_ITEM(params, i, Py_BuildValue("(iK)", l.kinds[i],
                                             static_cast<unsigned long long>(l.slots[i])));
  }
  for (size_t i = 0; i < l.buffers.size(); ++i) {
    const EmulatedBuffer& b = l.buffers[i];
    PyList_SET_ITEM(buffers, i, Py_BuildValue("(KKO)", static_cast<unsigned long long>(b.address),
                                              static_cast<unsigned long long>(b.bytes),
                                              b.result ? Py_True : Py_False));
  }
  PyObject* image = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(l.image->data()),
                                              static_cast<Py_ssize_t>(l.image->size()));
  PyObject* out = Py_BuildValue("(NsNNINN)", image, l.symbol.c_str(), Triple(l.grid),
                                Triple(l.block), l.shared, params, buffers);
  return out;
}

// IEEE denormals for the emulator while it runs: XLA's CPU threads flush denormal results
// and inputs to zero (x86 MXCSR FTZ and DAZ; aarch64 FPCR.FZ), and the emulator computes the
// GPU's fp32 arithmetic with the host's, which must keep them (the kernels run with
// denormals on). Restores the thread's mode when it goes. (Mutation check: without it the
// gfx942 scorer with q_round="none" loses its small products: tests/test_index_scores.py
// test_scores_ragged_prefill and test_scores_decode [emulated-gfx942-bf16-none-*] fail, 6.)
class IeeeDenormals {
 public:
  IeeeDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero));
#elif defined(__aarch64__)
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    uint64_t ieee = saved_ & ~kFpcrFlushToZero;
    asm volatile("msr fpcr, %0" : : "r"(ieee));
#endif
  }
  ~IeeeDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#elif defined(__aarch64__)
    asm volatile("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  IeeeDenormals(const IeeeDenormals&) = delete;
  IeeeDenormals& operator=(const IeeeDenormals&) = delete;

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  unsigned saved_ = 0;
#elif defined(__aarch64__)
  static constexpr uint64_t kFpcrFlushToZero = uint64_t{1} << 24;
  uint64_t saved_ = 0;
#endif
};

}  // namespace

std::string RunEmulator(const EmulatedLaunch& launch) {
  PyObject* callable = nullptr;
  {
    std::lock_guard<std::mutex> lock(hook_mu);
    callable = hook;
  }
  if (callable == nullptr) {
    return "no CDNA emulator is installed (select an emulated backend in jax_mxfp4)";
  }
  IeeeDenormals ieee;
  PyGILState_STATE gil = PyGILState_Ensure();
  std::string why;
  PyObject* args = Arguments(launch);
  PyObject* result = args ? PyObject_CallObject(callable, args) : nullptr;
  if (result == nullptr) why = TakeError();
  Py_XDECREF(result);
  Py_XDECREF(args);
  PyGILState_Release(gil);
  return why;
}

void SetEmulator(PyObject* callable) {
  std::lock_guard<std::mutex> lock(hook_mu);
  Py_XINCREF(callable);
  PyObject* old = hook;
  hook = callable;
  Py_XDECREF(old);
}

}  // namespace jax_mxfp4::gpu
