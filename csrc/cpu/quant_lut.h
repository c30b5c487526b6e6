// quant_lut.h -- the 65536-bin grid that maps a normalized value in [-1, 1] to the nearest entry of a
// 256-entry code, as upstream bitsandbytes' CPU kernels do (csrc/cpu_ops.cpp, quantize_cpu_impl):
// idx = trunc(fma((clamp(v) + 1) * 0.5, 65535, 0.5)); table[idx] = first code index whose midpoint with
// its successor is >= the bin value -1 + 2*idx/65535 (ties go to the lower index).  Shared by blockwise
// quantization and the 8-bit optimizers' state requantization (same bytes in both).
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "cpu/cpu_features.h"

namespace bnb_ms {

constexpr int kQuantCode = 256;
constexpr int kQuantLut = 65536;

// Padded by 4 bytes so a 32-bit gather at the last index stays inside the allocation.
struct QuantLut {
  float code[kQuantCode];
  alignas(64) uint8_t table[kQuantLut + 4];
};

// The table for `code` (256 floats), built on first use and cached by the code's contents
// (thread-safe; a few slots, since codes are reused call after call).
const QuantLut *get_quant_lut(const float *code);

BNB_MS_INLINE uint32_t quant_grid_index(float v) {
  v = std::min(1.0f, std::max(-1.0f, v));
  // Same operation order as upstream; the multiply-add is fused, as GCC contracts it there.
  return (uint32_t)std::fma((v + 1.0f) * 0.5f, (float)(kQuantLut - 1), 0.5f);
}

BNB_MS_INLINE uint8_t quant_lookup(const QuantLut *lut, float v) { return lut->table[quant_grid_index(v)]; }

// The factors a block's values are multiplied by before the lookup: v = (x * pre) * inv. Normally pre = 1 and
// inv = 1 / absmax, upstream's computation (x * 1 is exact, so these are upstream's bytes). When 1 / absmax
// overflows (absmax < 2^-128: a block of subnormals) upstream multiplies by inf, so 0 becomes NaN and takes
// code 0 (-absmax once dequantized) and every other value +-1. Such a block is scaled by 2^64 first (exact:
// its values are below 2^-126), so it maps as the same block at a normal magnitude does. absmax > 0.
struct QuantScale {
  float pre, inv;
};
BNB_MS_INLINE QuantScale quant_block_scale(float absmax) {
  const float inv = 1.0f / absmax;
  if (inv <= FLT_MAX) return {1.0f, inv};
  return {0x1p64f, 1.0f / (absmax * 0x1p64f)};
}

}  // namespace bnb_ms
