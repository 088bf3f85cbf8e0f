// The generic GPU code-object launcher (see launch.h for the attribute layout and the stages).
// Nothing here throws or aborts: every failure becomes an ffi::Error with the driver's message.
#include "gpu/launch.h"

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "gpu/driver.h"
#include "gpu/emulated.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_mxfp4::gpu {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kMaxParams = 64;
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kStaticSharedLimit = 48 * 1024;
constexpr int64_t kMaxBlockThreads = 1024;              // threads per block, CUDA and HIP
constexpr int64_t kMaxSharedBytes = int64_t{1} << 20;   // a bound on the shared_mem attribute
constexpr int64_t kMaxCodeBytes = int64_t{1} << 30;     // a bound on an inflated code object

enum ParamKind : int32_t { kBuffer = 0, kI32 = 1, kI64 = 2, kF32 = 3, kNullPointer = 4 };

// What instantiate decodes once; execute reads it, never writes it (it may run on several
// threads at once). `functions[d]` is the kernel loaded on device d, set by instantiate or
// initialize before any execute on d.
struct LaunchState {
  static ffi::TypeId id;
  Platform platform = Platform::kCuda;
  std::string code_hash, symbol;
  std::vector<uint8_t> image;
  unsigned grid[3] = {0, 0, 0}, block[3] = {0, 0, 0}, shared = 0;
  int64_t num_args = 0, num_rets = 0;
  std::vector<int32_t> kinds;
  std::vector<int64_t> values;
  std::vector<std::pair<int64_t, int64_t>> aliases;  // (operand, result) sharing a buffer
  std::array<std::atomic<void*>, kMaxDevices> functions{};
};

ffi::TypeId LaunchState::id = XLA_FFI_UNKNOWN_TYPE_ID;

// Every attribute of the custom call (launch.h says what each holds), decoded by name in one
// place (the registration after this namespace) for the instantiate stage and the emulated
// launch alike.
struct LaunchAttrs {
  std::string_view code;
  int64_t code_size;
  std::string_view code_hash;
  std::string_view symbol;
  ffi::Span<const int64_t> grid;
  ffi::Span<const int64_t> block;
  int64_t shared_mem;
  ffi::Span<const int32_t> param_kinds;
  ffi::Span<const int64_t> param_values;
  ffi::Span<const int64_t> aliases;
};

}  // namespace
}  // namespace jax_mxfp4::gpu

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    jax_mxfp4::gpu::LaunchAttrs, xla::ffi::StructMember<std::string_view>("code"),
    xla::ffi::StructMember<int64_t>("code_size"),
    xla::ffi::StructMember<std::string_view>("code_hash"),
    xla::ffi::StructMember<std::string_view>("symbol"),
    xla::ffi::StructMember<xla::ffi::Span<const int64_t>>("grid"),
    xla::ffi::StructMember<xla::ffi::Span<const int64_t>>("block"),
    xla::ffi::StructMember<int64_t>("shared_mem"),
    xla::ffi::StructMember<xla::ffi::Span<const int32_t>>("param_kinds"),
    xla::ffi::StructMember<xla::ffi::Span<const int64_t>>("param_values"),
    xla::ffi::StructMember<xla::ffi::Span<const int64_t>>("aliases"));

namespace jax_mxfp4::gpu {
namespace {

// ---- the per-process module cache ---------------------------------------------------------

struct ModuleCache {
  std::mutex mu;
  std::map<std::tuple<int, int, std::string>, void*> functions;  // (platform, device, key)
  std::map<std::pair<int, int>, void*> contexts;                 // retained primary contexts
  std::atomic<int64_t> loads{0}, with_device{0}, without_device{0};
};

ModuleCache& Cache() {
  static ModuleCache* cache = new ModuleCache();  // never destroyed: handlers may outlive exit
  return *cache;
}

ffi::Error Fail(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInternal, "jax_mxfp4_gpu_launch: " + message);
}

ffi::Error BadAttr(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_mxfp4_gpu_launch: " + message);
}

// Loads the module into `context` (pushed by the caller) and finds the kernel.
ffi::Error LoadInContext(const Driver& d, int device, const LaunchState& s, void** function) {
  void* module = nullptr;
  if (int c = d.module_load_data(&module, s.image.data()); c != 0) {
    return Fail(DriverError(d, "loading the code object", c));
  }
  if (int c = d.module_get_function(function, module, s.symbol.c_str()); c != 0) {
    return Fail(DriverError(d, ("finding kernel '" + s.symbol + "'").c_str(), c));
  }
  if (s.shared > kStaticSharedLimit && d.func_set_attribute != nullptr) {
    int optin = 0;
    if (int c = d.device_attribute(&optin, kCudaAttrSharedOptin, device); c != 0) {
      return Fail(DriverError(d, "reading the shared-memory limit", c));
    }
    if (static_cast<int64_t>(s.shared) > optin) {
      return Fail("kernel '" + s.symbol + "' needs " + std::to_string(s.shared) +
                  " bytes of shared memory; the device allows " + std::to_string(optin));
    }
    const int c = d.func_set_attribute(*function, kAttrMaxDynamicShared, s.shared);
    if (c != 0) return Fail(DriverError(d, "raising the dynamic shared-memory limit", c));
  }
  return ffi::Error::Success();
}

// The kernel of `s` on device `ordinal`, loading its module (once per process) if needed.
// Pushes the device's primary context around the load only.
ffi::Error EnsureLoaded(LaunchState& s, int32_t ordinal) {
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    return Fail("device ordinal " + std::to_string(ordinal) + " is outside [0, " +
                std::to_string(kMaxDevices) + ")");
  }
  if (s.functions[ordinal].load(std::memory_order_acquire) != nullptr) {
    return ffi::Error::Success();
  }
  std::string error;
  const Driver* d = LoadDriver(s.platform, &error);
  if (d == nullptr) return Fail(error);
  ModuleCache& cache = Cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  const auto key = std::make_tuple(static_cast<int>(s.platform), static_cast<int>(ordinal),
                                   s.code_hash + ":" + s.symbol);
  if (auto it = cache.functions.find(key); it != cache.functions.end()) {
    s.functions[ordinal].store(it->second, std::memory_order_release);
    return ffi::Error::Success();
  }
  int device = 0;
  if (int c = d->device_get(&device, ordinal); c != 0) {
    return Fail(DriverError(*d, "getting the device", c));
  }
  void*& context = cache.contexts[{static_cast<int>(s.platform), ordinal}];
  if (context == nullptr) {
    if (int c = d->primary_ctx_retain(&context, device); c != 0) {
      context = nullptr;
      return Fail(DriverError(*d, "retaining the device's primary context", c));
    }
  }
  if (int c = d->ctx_push(context); c != 0) {
    return Fail(DriverError(*d, "making the primary context current", c));
  }
  void* function = nullptr;
  ffi::Error loaded = LoadInContext(*d, device, s, &function);
  void* popped = nullptr;
  const int pop = d->ctx_pop(&popped);
  if (loaded.failure()) return loaded;
  if (pop != 0) return Fail(DriverError(*d, "restoring the current context", pop));
  cache.functions.emplace(key, function);
  cache.loads.fetch_add(1);
  s.functions[ordinal].store(function, std::memory_order_release);
  return ffi::Error::Success();
}

// ---- attribute decoding ----------------------------------------------------------------------

int Base64Value(unsigned char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
  if (ch >= '0' && ch <= '9') return ch - '0' + 52;
  if (ch == '+') return 62;
  if (ch == '/') return 63;
  return -1;
}

bool Base64Decode(std::string_view text, std::vector<uint8_t>* out) {
  if (text.size() % 4 != 0) return false;
  out->clear();
  out->reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const unsigned char ch = static_cast<unsigned char>(text[i + k]);
      if (ch == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = Base64Value(ch)) < 0) return false;
    }
    const uint32_t word = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out->push_back(static_cast<uint8_t>(word >> 16));
    if (pad < 2) out->push_back(static_cast<uint8_t>(word >> 8));
    if (pad < 1) out->push_back(static_cast<uint8_t>(word));
  }
  return true;
}

ffi::Error CheckLaunchShape(ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,
                            int64_t shared, LaunchState& s) {
  if (grid.size() != 3 || block.size() != 3) return BadAttr("grid and block must have 3 entries");
  for (int i = 0; i < 3; ++i) {
    const int64_t limit = i == 0 ? kMaxGridX : kMaxGridYZ;
    if (grid[i] < 0 || grid[i] > limit) {
      return BadAttr("grid[" + std::to_string(i) + "] = " + std::to_string(grid[i]) +
                     " is outside [0, " + std::to_string(limit) + "]");
    }
    if (block[i] < 1 || block[i] > kMaxBlockThreads) {
      return BadAttr("block[" + std::to_string(i) + "] = " + std::to_string(block[i]) +
                     " is outside [1, " + std::to_string(kMaxBlockThreads) + "]");
    }
    s.grid[i] = static_cast<unsigned>(grid[i]);
    s.block[i] = static_cast<unsigned>(block[i]);
  }
  if (block[0] * block[1] * block[2] > kMaxBlockThreads) {
    return BadAttr("more than " + std::to_string(kMaxBlockThreads) + " threads per block");
  }
  if (shared < 0 || shared > kMaxSharedBytes) {
    return BadAttr("shared_mem = " + std::to_string(shared) + " is out of range");
  }
  s.shared = static_cast<unsigned>(shared);
  return ffi::Error::Success();
}

ffi::Error CheckParams(ffi::Span<const int32_t> kinds, ffi::Span<const int64_t> values,
                       LaunchState& s) {
  if (kinds.size() != values.size() || static_cast<int64_t>(kinds.size()) > kMaxParams) {
    return BadAttr("param_kinds and param_values must have the same length, at most " +
                   std::to_string(kMaxParams));
  }
  const int64_t buffers = s.num_args + s.num_rets;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const int32_t kind = kinds[i];
    const int64_t v = values[i];
    if (kind < kBuffer || kind > kNullPointer) {
      return BadAttr("param " + std::to_string(i) + " has unknown kind " + std::to_string(kind));
    }
    if (kind == kBuffer && (v < 0 || v >= buffers)) {
      return BadAttr("param " + std::to_string(i) + " names buffer " + std::to_string(v) +
                     " of " + std::to_string(buffers));
    }
    if (kind == kI32 && (v < INT32_MIN || v > INT32_MAX)) {
      return BadAttr("param " + std::to_string(i) + " does not fit in int32");
    }
    if (kind == kF32 && (v < 0 || v > UINT32_MAX)) {
      return BadAttr("param " + std::to_string(i) + " is not an f32 bit pattern");
    }
  }
  s.kinds.assign(kinds.begin(), kinds.end());
  s.values.assign(values.begin(), values.end());
  return ffi::Error::Success();
}

// `aliases` lists (operand, result) pairs flattened; XLA is asked to give each pair one buffer,
// and execute copies the operand into the result where it did not (a device-to-device copy on
// the stream, which command buffers capture like a launch).
ffi::Error CheckAliases(ffi::Span<const int64_t> aliases, LaunchState& s) {
  if (aliases.size() % 2 != 0) return BadAttr("aliases must hold (operand, result) pairs");
  for (size_t i = 0; i < aliases.size(); i += 2) {
    const int64_t arg = aliases[i], ret = aliases[i + 1];
    if (arg < 0 || arg >= s.num_args || ret < 0 || ret >= s.num_rets) {
      return BadAttr("alias (" + std::to_string(arg) + ", " + std::to_string(ret) +
                     ") names no operand/result");
    }
    s.aliases.emplace_back(arg, ret);
  }
  return ffi::Error::Success();
}

ffi::Error DecodeCode(const LaunchAttrs& a, LaunchState& s) {
  if (a.symbol.empty() || a.code_hash.empty()) return BadAttr("symbol and code_hash are required");
  if (a.code_size <= 0 || a.code_size > kMaxCodeBytes) {
    return BadAttr("code_size = " + std::to_string(a.code_size) + " is out of range");
  }
  std::vector<uint8_t> compressed;
  if (!Base64Decode(a.code, &compressed)) return BadAttr("code is not valid base64");
  s.image.resize(static_cast<size_t>(a.code_size));
  const std::string why =
      Inflate(compressed.data(), compressed.size(), s.image.data(), s.image.size());
  if (!why.empty()) return BadAttr(why);
  s.code_hash.assign(a.code_hash.data(), a.code_hash.size());
  s.symbol.assign(a.symbol.data(), a.symbol.size());
  return ffi::Error::Success();
}

// Decodes and checks every attribute into `s` (its num_args and num_rets already set).
ffi::Error DecodeLaunch(const LaunchAttrs& a, LaunchState& s) {
  if (ffi::Error e = DecodeCode(a, s); e.failure()) return e;
  if (ffi::Error e = CheckLaunchShape(a.grid, a.block, a.shared_mem, s); e.failure()) return e;
  if (ffi::Error e = CheckParams(a.param_kinds, a.param_values, s); e.failure()) return e;
  return CheckAliases(a.aliases, s);
}

// ---- the three stages ------------------------------------------------------------------------

template <Platform P>
ffi::ErrorOr<std::unique_ptr<LaunchState>> Instantiate(int32_t device, ffi::RemainingArgs args,
                                                       ffi::RemainingRets rets,
                                                       LaunchAttrs attrs) {
  auto state = std::make_unique<LaunchState>();
  state->platform = P;
  state->num_args = static_cast<int64_t>(args.size());
  state->num_rets = static_cast<int64_t>(rets.size());
  if (ffi::Error e = DecodeLaunch(attrs, *state); e.failure()) {
    return ffi::Unexpected(std::move(e));
  }
  if (device >= 0) {  // XLA named the device: load now, not on the first run
    Cache().with_device.fetch_add(1);
    if (ffi::Error e = EnsureLoaded(*state, device); e.failure()) {
      return ffi::Unexpected(std::move(e));
    }
  } else {
    Cache().without_device.fetch_add(1);
  }
  return state;
}

ffi::Error Initialize(int32_t device, LaunchState* state) {
  if (state == nullptr) return Fail("no launch state (the instantiate stage did not run)");
  return EnsureLoaded(*state, device);
}

// Where XLA gave an aliased (operand, result) pair two buffers, copies the operand into the
// result first, so that what the kernel does not write still holds the operand's bytes.
ffi::Error CopyUnaliased(const Driver& d, void* stream, const LaunchState& state,
                         ffi::RemainingArgs& args, ffi::RemainingRets& rets) {
  for (const auto& [arg, ret] : state.aliases) {
    auto src = args.get<ffi::AnyBuffer>(arg);
    if (src.has_error()) return src.error();
    auto dst = rets.get<ffi::AnyBuffer>(ret);
    if (dst.has_error()) return dst.error();
    void* from = src->untyped_data();
    void* to = (*dst)->untyped_data();
    if (from == to || src->size_bytes() == 0) continue;
    const int c = d.copy_async(reinterpret_cast<uint64_t>(to), reinterpret_cast<uint64_t>(from),
                               src->size_bytes(), stream);
    if (c != 0) return Fail(DriverError(d, "copying an unaliased operand", c));
  }
  return ffi::Error::Success();
}

// The address of buffer `index` of (operands..., results...).
ffi::ErrorOr<void*> BufferAddress(const LaunchState& state, ffi::RemainingArgs& args,
                                  ffi::RemainingRets& rets, int64_t index) {
  if (index < state.num_args) {
    auto buffer = args.get<ffi::AnyBuffer>(index);
    if (buffer.has_error()) return ffi::Unexpected(buffer.error());
    return buffer->untyped_data();
  }
  auto buffer = rets.get<ffi::AnyBuffer>(index - state.num_args);
  if (buffer.has_error()) return ffi::Unexpected(buffer.error());
  return (*buffer)->untyped_data();
}

// Packs the kernel parameters into `storage` (one 8-byte slot each: a buffer's address, an
// i32 or f32 bit pattern in the low bytes, an i64, or zero for a null pointer) and points
// `params[i]` at slot i, the form both drivers' launch calls take.
ffi::Error PackParams(const LaunchState& state, ffi::RemainingArgs& args,
                      ffi::RemainingRets& rets, uint64_t* storage, void** params) {
  if (static_cast<int64_t>(args.size()) != state.num_args ||
      static_cast<int64_t>(rets.size()) != state.num_rets) {
    return Fail("operand or result count differs from the instantiated call");
  }
  const int64_t n = static_cast<int64_t>(state.kinds.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = state.values[i];
    storage[i] = 0;
    switch (state.kinds[i]) {
      case kBuffer: {
        auto ptr = BufferAddress(state, args, rets, v);
        if (ptr.has_error()) return ptr.error();
        void* address = *ptr;
        std::memcpy(&storage[i], &address, sizeof address);
        break;
      }
      case kI32: {
        const int32_t x = static_cast<int32_t>(v);
        std::memcpy(&storage[i], &x, sizeof x);
        break;
      }
      case kF32: {
        const uint32_t x = static_cast<uint32_t>(v);
        std::memcpy(&storage[i], &x, sizeof x);
        break;
      }
      case kI64:
        std::memcpy(&storage[i], &v, sizeof v);
        break;
      default:  // kNullPointer: storage stays zero
        break;
    }
    params[i] = &storage[i];
  }
  return ffi::Error::Success();
}

// Packs the kernel parameters on the stack and launches: no allocation, no synchronization,
// no host-to-device copy, no change of the current device.
ffi::Error Execute(void* stream, int32_t device, LaunchState* state, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  if (state == nullptr) return Fail("no launch state (the instantiate stage did not run)");
  if (state->grid[0] == 0 || state->grid[1] == 0 || state->grid[2] == 0) {
    return ffi::Error::Success();
  }
  void* function = (device >= 0 && device < kMaxDevices)
                       ? state->functions[device].load(std::memory_order_acquire)
                       : nullptr;
  if (function == nullptr) {
    return Fail("kernel '" + state->symbol + "' is not loaded on device " +
                std::to_string(device) + " (the initialize stage did not run there)");
  }
  void* params[kMaxParams];
  uint64_t storage[kMaxParams];
  if (ffi::Error e = PackParams(*state, args, rets, storage, params); e.failure()) return e;
  std::string error;
  const Driver* d = LoadDriver(state->platform, &error);  // already loaded: no dlopen here
  if (d == nullptr) return Fail(error);
  if (ffi::Error e = CopyUnaliased(*d, stream, *state, args, rets); e.failure()) return e;
  const int c = d->launch(function, state->grid[0], state->grid[1], state->grid[2],
                          state->block[0], state->block[1], state->block[2], state->shared,
                          stream, params, nullptr);
  if (c != 0) {
    return Fail(DriverError(*d, ("launching kernel '" + state->symbol + "'").c_str(), c));
  }
  return ffi::Error::Success();
}

// The CPU form of the launcher (the emulated ROCm backends): the same attributes, decoded and
// checked by the same code, the same parameter packing, then the launch handed to the emulator
// (emulated.h) over the host buffers XLA gave the call. Where XLA gave an aliased pair two
// buffers, the operand is copied into the result first, as on the GPU.
ffi::Error ExecuteEmulated(ffi::RemainingArgs args, ffi::RemainingRets rets, LaunchAttrs attrs) {
  LaunchState state;
  state.platform = Platform::kRocm;
  state.num_args = static_cast<int64_t>(args.size());
  state.num_rets = static_cast<int64_t>(rets.size());
  if (ffi::Error e = DecodeLaunch(attrs, state); e.failure()) return e;
  for (const auto& [arg, ret] : state.aliases) {
    auto src = args.get<ffi::AnyBuffer>(arg);
    if (src.has_error()) return src.error();
    auto dst = rets.get<ffi::AnyBuffer>(ret);
    if (dst.has_error()) return dst.error();
    if (src->untyped_data() != (*dst)->untyped_data()) {
      std::memcpy((*dst)->untyped_data(), src->untyped_data(), src->size_bytes());
    }
  }
  if (state.grid[0] == 0 || state.grid[1] == 0 || state.grid[2] == 0) {
    return ffi::Error::Success();
  }
  void* params[kMaxParams];
  uint64_t storage[kMaxParams];
  if (ffi::Error e = PackParams(state, args, rets, storage, params); e.failure()) return e;
  EmulatedLaunch launch;
  launch.image = &state.image;
  launch.symbol = state.symbol;
  launch.grid = {state.grid[0], state.grid[1], state.grid[2]};
  launch.block = {state.block[0], state.block[1], state.block[2]};
  launch.shared = state.shared;
  launch.kinds = state.kinds;
  launch.slots.assign(storage, storage + state.kinds.size());
  for (int64_t i = 0; i < state.num_args + state.num_rets; ++i) {
    auto ptr = BufferAddress(state, args, rets, i);
    if (ptr.has_error()) return ptr.error();
    const bool result = i >= state.num_args;
    size_t bytes = 0;
    if (result) {
      bytes = (*rets.get<ffi::AnyBuffer>(i - state.num_args))->size_bytes();
    } else {
      bytes = args.get<ffi::AnyBuffer>(i)->size_bytes();
    }
    launch.buffers.push_back({reinterpret_cast<uint64_t>(*ptr), bytes, result});
  }
  const std::string why = RunEmulator(launch);
  if (!why.empty()) return Fail("emulated launch of '" + state.symbol + "': " + why);
  return ffi::Error::Success();
}

// The state type is registered with the XLA that calls us (the platform plugin's), once per
// API instance, before the first instantiate uses it.
XLA_FFI_Error* RegisterStateType(const XLA_FFI_Api* api) {
  static std::mutex mu;
  static std::set<const XLA_FFI_Api*>* done = new std::set<const XLA_FFI_Api*>();
  if (api == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (done->count(api)) return nullptr;
  static const XLA_FFI_TypeInfo info = ffi::MakeTypeInfo<LaunchState>();
  XLA_FFI_Error* error =
      ffi::Ffi::RegisterTypeId(api, "jax_mxfp4_gpu_launch_state", &LaunchState::id, &info);
  if (error == nullptr) done->insert(api);
  return error;
}

}  // namespace

CacheStats GetCacheStats() {
  ModuleCache& c = Cache();
  return {c.loads.load(), c.with_device.load(), c.without_device.load()};
}

}  // namespace jax_mxfp4::gpu

namespace jg = jax_mxfp4::gpu;

#define JAX_MXFP4_INSTANTIATE_BINDING                          \
  xla::ffi::Ffi::BindInstantiate()                             \
      .Ctx<xla::ffi::DeviceOrdinal>()                          \
      .RemainingArgs()                                         \
      .RemainingRets()                                         \
      .Attrs<jg::LaunchAttrs>()

#define JAX_MXFP4_INITIALIZE_BINDING                           \
  xla::ffi::Ffi::BindInitialize()                              \
      .Ctx<xla::ffi::DeviceOrdinal>()                          \
      .Ctx<xla::ffi::State<jg::LaunchState>>()

#define JAX_MXFP4_EXECUTE_BINDING                              \
  xla::ffi::Ffi::Bind()                                        \
      .Ctx<xla::ffi::PlatformStream<void*>>()                  \
      .Ctx<xla::ffi::DeviceOrdinal>()                          \
      .Ctx<xla::ffi::State<jg::LaunchState>>()                 \
      .RemainingArgs()                                         \
      .RemainingRets()

XLA_FFI_DEFINE_HANDLER(CudaInstantiateTyped, jg::Instantiate<jg::Platform::kCuda>,
                       JAX_MXFP4_INSTANTIATE_BINDING);
XLA_FFI_DEFINE_HANDLER(RocmInstantiateTyped, jg::Instantiate<jg::Platform::kRocm>,
                       JAX_MXFP4_INSTANTIATE_BINDING);
XLA_FFI_DEFINE_HANDLER(InitializeTyped, jg::Initialize, JAX_MXFP4_INITIALIZE_BINDING);
XLA_FFI_DEFINE_HANDLER(ExecuteTyped, jg::Execute, JAX_MXFP4_EXECUTE_BINDING,
                       {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(EmulatedTyped, jg::ExecuteEmulated,
                       xla::ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attrs<jg::LaunchAttrs>());

extern "C" {

XLA_FFI_Error* JaxMxfp4CudaLaunchInstantiate(XLA_FFI_CallFrame* frame) {
  if (XLA_FFI_Error* e = jg::RegisterStateType(frame->api)) return e;
  return CudaInstantiateTyped(frame);
}
XLA_FFI_Error* JaxMxfp4RocmLaunchInstantiate(XLA_FFI_CallFrame* frame) {
  if (XLA_FFI_Error* e = jg::RegisterStateType(frame->api)) return e;
  return RocmInstantiateTyped(frame);
}
XLA_FFI_Error* JaxMxfp4CudaLaunchInitialize(XLA_FFI_CallFrame* frame) {
  return InitializeTyped(frame);
}
XLA_FFI_Error* JaxMxfp4RocmLaunchInitialize(XLA_FFI_CallFrame* frame) {
  return InitializeTyped(frame);
}
XLA_FFI_Error* JaxMxfp4CudaLaunchExecute(XLA_FFI_CallFrame* frame) { return ExecuteTyped(frame); }
XLA_FFI_Error* JaxMxfp4RocmLaunchExecute(XLA_FFI_CallFrame* frame) { return ExecuteTyped(frame); }
XLA_FFI_Error* JaxMxfp4EmulatedLaunch(XLA_FFI_CallFrame* frame) { return EmulatedTyped(frame); }

}  // extern "C"
