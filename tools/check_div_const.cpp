// check_div_const.cpp -- the 8-bit optimizers' division by a per-call constant (csrc/cpu/optim_simd.inc, vdiv_by)
// against the divider: for each divisor d given (or a built-in set: Adam's sqrt(1 - beta2^t) and AdEMAMix's
// 1 - beta1^t for common betas and steps, edge divisors of [2^-20, 2^20]), every float x with |x| in [2^-80, 2^100]
// (both signs), or every STRIDE-th one, computed as
//   y = 1/d; q0 = x y; q1 = fma(fnma(q0, d, x), y, q0); q = fma(fnma(q1, d, x), y, q1)
// must equal x / d bit for bit.  Exit status 0 when every one does; prints the first mismatches otherwise.
//   g++ -O2 -mavx2 -mfma -o check_div_const tools/check_div_const.cpp && ./check_div_const [STRIDE] [d ...]
// STRIDE 1 (all 2 x 1.51e9 values per divisor) takes ~1-3 s per divisor on one AVX2 core.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

static long check(float d, uint32_t stride) {
  const __m256 vd = _mm256_set1_ps(d), vy = _mm256_set1_ps(1.0f / d);
  const uint32_t lo = 0x17800000u, hi = 0x71800000u;  // 2^-80, 2^100
  long bad = 0;
  alignas(32) uint32_t lane[8];
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint64_t u0 = lo; u0 <= hi; u0 += 8ull * stride) {
      for (int j = 0; j < 8; ++j) lane[j] = (uint32_t)std::min<uint64_t>(u0 + (uint64_t)j * stride, hi) | sign;
      const __m256 x = _mm256_castsi256_ps(_mm256_load_si256((const __m256i *)lane));
      __m256 q = _mm256_mul_ps(x, vy);
      q = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, vd, x), vy, q);
      q = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, vd, x), vy, q);
      const __m256 ref = _mm256_div_ps(x, vd);
      const int m = _mm256_movemask_ps(_mm256_castsi256_ps(
          _mm256_cmpeq_epi32(_mm256_castps_si256(q), _mm256_castps_si256(ref))));
      if (m != 0xff) {
        alignas(32) float got[8];
        _mm256_store_ps(got, q);
        for (int j = 0; j < 8; ++j)
          if (!(m >> j & 1) && bad++ < 5)
            std::printf("MISMATCH d=%a x=%a: fma %a, divider %a\n", d, from_bits(lane[j]), got[j], from_bits(lane[j]) / d);
      }
    }
  }
  return bad;
}

int main(int argc, char **argv) {
  const uint32_t stride = argc > 1 ? (uint32_t)std::strtoul(argv[1], nullptr, 10) : 1;
  std::vector<float> ds;
  for (int i = 2; i < argc; ++i) ds.push_back(std::strtof(argv[i], nullptr));
  if (ds.empty()) {
    for (double b2 : {0.999, 0.99, 0.95, 0.9999})
      for (int t : {1, 2, 3, 10, 100, 1000})
        ds.push_back((float)std::sqrt(1.0 - std::pow(b2, (double)t)));
    for (double b1 : {0.9, 0.8})
      for (int t : {1, 2, 5, 50}) ds.push_back((float)(1.0 - std::pow(b1, (double)t)));
    for (float d : {0x1p-20f, 0x1p20f, 1.0f, 0x1.fffffep-1f, 0x1.000002p+0f, 0x1.fffffep-21f * 2, 0x1.555556p-2f,
                    0x1.8p+3f, 0x1.6a09e6p-1f, 0x1.000002p-20f, 0x1.fffffep+19f})
      ds.push_back(d);
  }
  long total = 0;
  for (float d : ds) {
    const long bad = check(d, stride);
    std::printf("d=%a (%.9g): %s\n", d, d, bad ? "MISMATCH" : "ok");
    total += bad;
  }
  std::printf("%zu divisors, stride %u: %ld mismatches\n", ds.size(), stride, total);
  return total ? 1 : 0;
}
