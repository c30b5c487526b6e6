// aot.h -- MindSpore AOT calling convention shared by the CPU and the CUDA library.
//
// Every entry point has MindSpore's Custom-op AOT signature
//   extern "C" int f(int nparam, void **params, int *ndims, int64_t **shapes,
//                    const char **dtypes, void *stream, void *extra);
// `params` holds the inputs, then the outputs (in the order of the op table in
// bitsandbytes_ms/_native_table.py).  Python scalars arrive as 0-d tensors ("int64", "float32", "bool");
// None arrives as a null pointer with dtype "none".  Sizes are always read from `shapes`.
//
// Status: 0 on success.  A malformed call (wrong arity, dtype, shape, scalar value) returns one of
// the BNB_MS_E* codes below *before* touching memory, and MindSpore raises a RuntimeError.
// Kernels that can fail on well-formed input (e.g. a cuBLASLt status) also write the status into a
// trailing int32 `has_error` output, which Python reads only where a result must be trusted.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#define BNB_MS_AOT_ARGS int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra
#define BNB_MS_EXPORT extern "C" __attribute__((visibility("default")))
// The one way the libraries export an entry point: `name` with the AOT signature, forwarding every argument to
// `impl` (a function or template instance of the same signature), e.g.
//   BNB_MS_ENTRY(cquantize_blockwise_fp32, bnb_ms::quantize_entry<float>)
#define BNB_MS_ENTRY(name, ...) \
  BNB_MS_EXPORT int name(BNB_MS_AOT_ARGS) { return __VA_ARGS__(nparam, params, ndims, shapes, dtypes, stream, extra); }

namespace bnb_ms {

enum Status : int {
  OK = 0,
  E_NPARAM = 1,     // wrong number of params
  E_DTYPE = 2,      // a param has the wrong dtype
  E_SHAPE = 3,      // a param has the wrong shape / element count
  E_VALUE = 4,      // a scalar param has a value that is not allowed
  E_NULL = 5,       // a required param is null
  E_UNSUPPORTED = 6,// not available on this CPU/GPU
  E_DEVICE = 7,     // device runtime error (CUDA)
  E_NOMEM = 8,      // out of host memory (a kernel's scratch could not be allocated)
  E_NOT_IMPLEMENTED = 100,
};

enum class DType { f32, f16, bf16, f64, i8, u8, i16, i32, i64, boolean, none, unknown };

inline DType parse_dtype(const char *s) {
  if (!s) return DType::unknown;
  if (!std::strcmp(s, "float32")) return DType::f32;
  if (!std::strcmp(s, "float16")) return DType::f16;
  if (!std::strcmp(s, "bfloat16")) return DType::bf16;
  if (!std::strcmp(s, "float64")) return DType::f64;
  if (!std::strcmp(s, "int8")) return DType::i8;
  if (!std::strcmp(s, "uint8")) return DType::u8;
  if (!std::strcmp(s, "int16")) return DType::i16;
  if (!std::strcmp(s, "int32")) return DType::i32;
  if (!std::strcmp(s, "int64")) return DType::i64;
  if (!std::strcmp(s, "bool")) return DType::boolean;
  if (!std::strcmp(s, "none")) return DType::none;
  return DType::unknown;
}

// ---- has_error outputs ------------------------------------------------------------------------------
// A kernel that can fail on well-formed input (the int8 GEMM: cuBLASLt on GPU, scratch allocation; the
// optimizers) writes a status into its trailing int32[1] `has_error` output: 0, or the E_* code of the failure,
// and then returns OK, so that nothing waits for the device to learn it; Python reads it only where a result must
// be trusted or in a checking mode (cextension).  A test can force a failure: bnb_ms_force_error(family, code)
// (exported by each library) makes every call of the kernel family `family` ("igemm", "optim") report `code`
// without running, until it is called again with code 0.
struct ForcedError {
  std::atomic<int> code{0};
  char family[32] = {0};
  std::mutex mu;
};
inline ForcedError &forced_error_state() {
  static ForcedError s;
  return s;
}
// The code forced on `family`, or 0 (one relaxed atomic load when nothing is forced).
inline int forced_error(const char *family) {
  ForcedError &s = forced_error_state();
  if (s.code.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard<std::mutex> lock(s.mu);
  return std::strcmp(s.family, family) == 0 ? s.code.load() : 0;
}
inline int set_forced_error(const char *family, int code) {
  ForcedError &s = forced_error_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!family || std::strlen(family) >= sizeof(s.family)) return E_VALUE;
  std::strcpy(s.family, family);
  s.code.store(code);
  return OK;
}
#define BNB_MS_EXPORT_FORCE_ERROR \
  BNB_MS_EXPORT int bnb_ms_force_error(const char *family, int code) { return bnb_ms::set_forced_error(family, code); }

// Reads a scalar that the caller placed in host memory.  The CUDA library provides its own
// reader (cuda/aot_cuda.cuh) that also accepts device-resident 0-d tensors.
struct HostScalarReader {
  static bool read(const void *p, DType dt, double *out) {
    if (!p) return false;
    switch (dt) {
      case DType::i64: *out = (double)*static_cast<const int64_t *>(p); return true;
      case DType::i32: *out = (double)*static_cast<const int32_t *>(p); return true;
      case DType::f32: *out = (double)*static_cast<const float *>(p); return true;
      case DType::f64: *out = *static_cast<const double *>(p); return true;
      case DType::boolean: *out = *static_cast<const bool *>(p) ? 1.0 : 0.0; return true;
      default: return false;
    }
  }
};

// A view of one AOT call with checked accessors.
template <class ScalarReader = HostScalarReader>
struct Call {
  int nparam; void **params; int *ndims; int64_t **shapes; const char **dtypes; void *stream;
  Call(int n, void **p, int *nd, int64_t **sh, const char **dt, void *st)
      : nparam(n), params(p), ndims(nd), shapes(sh), dtypes(dt), stream(st) {}

  DType dtype(int i) const { return parse_dtype(dtypes[i]); }
  bool is_none(int i) const { return params[i] == nullptr || dtype(i) == DType::none; }
  int64_t numel(int i) const {
    int64_t n = 1;
    for (int d = 0; d < ndims[i]; ++d) n *= shapes[i][d];
    return n;
  }
  int rank(int i) const { return ndims[i]; }
  int64_t dim(int i, int d) const { return d < 0 ? shapes[i][ndims[i] + d] : shapes[i][d]; }
  // Product of all dimensions but the last (rows of a row-major 2-D view).
  int64_t rows(int i) const { return ndims[i] == 0 ? 1 : numel(i) / (shapes[i][ndims[i] - 1] ? shapes[i][ndims[i] - 1] : 1); }
  int64_t cols(int i) const { return ndims[i] == 0 ? 1 : shapes[i][ndims[i] - 1]; }
  template <class T> T *ptr(int i) const { return static_cast<T *>(params[i]); }

  bool scalar(int i, double *out) const {
    if (ndims[i] != 0) return false;
    return ScalarReader::read(params[i], dtype(i), out);
  }
  bool scalar_i64(int i, int64_t *out) const {
    double v;
    if (!scalar(i, &v)) return false;
    *out = (int64_t)v;
    return (double)*out == v;
  }
  bool scalar_f32(int i, float *out) const {
    double v;
    if (!scalar(i, &v)) return false;
    *out = (float)v;
    return true;
  }
};

// ---- numeric helpers shared by all CPU kernels ------------------------------------------------
struct bf16_t { uint16_t v; };
struct fp16_t { uint16_t v; };

inline float bf16_to_f32(uint16_t h) {
  uint32_t b = (uint32_t)h << 16; float f; std::memcpy(&f, &b, 4); return f;
}
// Round to nearest even (as upstream's CPU kernels and torch do).  NaN keeps its sign and the top 7 bits of its
// payload and is made quiet ((bits >> 16) | 0x40), as f32_to_fp16.
inline uint16_t f32_to_bf16(float f) {
  uint32_t b; std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}
inline float fp16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) bits = sign;
    else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
  else bits = sign | ((exp + 112u) << 23) | (man << 13);
  float f; std::memcpy(&f, &bits, 4); return f;
}
// IEEE round-to-nearest-even float -> half.  NaN keeps its sign and the top 10 bits of its payload and is made
// quiet (sign | 0x7e00 | payload >> 13), as x86's vcvtps2ph, upstream's CPU kernels (_Float16 casts) and torch's
// vectorised casts do; the same NaN rule as f32_to_bf16 (the library's one rule for NaN -> 16 bits).
inline uint16_t f32_to_fp16(float f) {
  uint32_t x; std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {  // result is subnormal or zero
    if (ax < 0x33000000u) return (uint16_t)sign;
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... = bits to drop
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent (127 -> 15)
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return (uint16_t)(sign | (r >> 13));
}

template <class T> inline float to_f32(T v);
template <> inline float to_f32<float>(float v) { return v; }
template <> inline float to_f32<fp16_t>(fp16_t v) { return fp16_to_f32(v.v); }
template <> inline float to_f32<bf16_t>(bf16_t v) { return bf16_to_f32(v.v); }
template <class T> inline T from_f32(float v);
template <> inline float from_f32<float>(float v) { return v; }
template <> inline fp16_t from_f32<fp16_t>(float v) { return fp16_t{f32_to_fp16(v)}; }
template <> inline bf16_t from_f32<bf16_t>(float v) { return bf16_t{f32_to_bf16(v)}; }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<fp16_t>() { return DType::f16; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::bf16; }

}  // namespace bnb_ms
