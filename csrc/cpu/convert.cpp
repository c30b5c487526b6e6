// convert.cpp -- fp32/fp16/bf16 array conversion for the Python host-call path (bitsandbytes_ms/_hostcall.py
// `convert`): a layer whose compute dtype differs from its activations (Linear4bit compute_dtype bf16/fp16 on
// fp32 inputs) rounds x to the compute dtype and widens the result back; numpy's casts to bf16 run ~2 ns per
// element, these the SIMD loads/stores of simd_convert.h (round to nearest even, the library's NaN rule).
#include <cstdint>

#include "aot.h"
#include "cpu/simd_convert.h"

namespace {
template <class S>
int convert_from(const S *src, void *dst, int dst_code, int64_t n) {
  using namespace bnb_ms;
  switch (dst_code) {
    case 0: convert_span<S, float>(src, (float *)dst, n); return 0;
    case 1: convert_span<S, fp16_t>(src, (fp16_t *)dst, n); return 0;
    case 2: convert_span<S, bf16_t>(src, (bf16_t *)dst, n); return 0;
    default: return 1;
  }
}
}  // namespace

// dst[i] = src[i] converted, i < n; codes: 0 fp32, 1 fp16, 2 bf16.  Returns 0, or 1 for an unknown code / n < 0.
BNB_MS_EXPORT int bnb_ms_convert(const void *src, int src_code, void *dst, int dst_code, int64_t n) {
  if (n < 0 || (n > 0 && (!src || !dst))) return 1;
  switch (src_code) {
    case 0: return convert_from((const float *)src, dst, dst_code, n);
    case 1: return convert_from((const bnb_ms::fp16_t *)src, dst, dst_code, n);
    case 2: return convert_from((const bnb_ms::bf16_t *)src, dst, dst_code, n);
    default: return 1;
  }
}
