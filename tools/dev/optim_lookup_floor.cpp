// optim_lookup_floor.cpp -- what the blockwise 8-bit optimizer step's four table lookups per element cost on this
// CPU without AVX-512 VBMI (issue 33 bar 4: Adam8bit's step <= Adam32bit's).  The 8-bit step decodes two states
// (code[q]: a 256-entry fp32 table) and requantizes two (the 65536-entry byte grid of quant_lut.h) per element;
// without VBMI's in-register tables each lookup is a gather lane or a scalar load.  One thread, tables in L1/L2,
// independent lookups (throughput, not latency):
//   gather256   vpgatherdd ymm from the 256-entry fp32 code (a state decode, 8 lanes)
//   gather64K   vpgatherdd ymm from the 64 KiB grid table (a requantization, 8 lanes)
//   scalar8     8 scalar byte loads from the grid table assembled into one 8-byte word (optim.cpp's lut_codes)
//   sqrtdiv     vsqrtps + vdivps ymm (the step's divider work, which the 32-bit step has too)
// Floor of the AVX2 step = 4 x (lookup ns per lane) per element, per core.  AVX-512 EPYC (Zen 4), 2026-12-06:
// gather256 2.9 ns, gather64K 3.1-3.2 ns, scalar8 3.8 ns per 8 lanes; sqrtdiv 2.4 ns per 8: 4 lookups x ~0.37 ns
// = ~1.5 ns an element on one core, so >= ~15 ms for 20M parameters on its 2 cores before any arithmetic, against
// the 32-bit step's 7-10 ms (memory-bound) -- the AVX2 form (BNB_MS_SIMD=avx2: 24-26 ms) cannot meet the bar on
// this CPU; its VBMI form (in-register lookups) runs 10.6-11.2 ms.
// Build: g++ -O2 -mavx2 -mfma -o /tmp/floor tools/dev/optim_lookup_floor.cpp && /tmp/floor
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

alignas(64) static float code[256];
alignas(64) static uint8_t grid[65536 + 4];

static double secs(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int main() {
  for (int i = 0; i < 256; ++i) code[i] = i * 0.5f;
  for (int i = 0; i < 65540; ++i) grid[i] = (uint8_t)(i * 7);
  const int N = 1 << 20, R = 20;
  uint32_t *i8 = (uint32_t *)aligned_alloc(64, N * 4), *i16 = (uint32_t *)aligned_alloc(64, N * 4);
  for (int i = 0; i < N; ++i) {
    i8[i] = rand() & 255;
    i16[i] = rand() & 65535;
  }
  for (int rep = 0; rep < 2; ++rep) {
    __m256 acc = _mm256_setzero_ps();
    __m256i acci = _mm256_setzero_si256();
    uint64_t accs = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; i += 8)
        acc = _mm256_add_ps(acc, _mm256_i32gather_ps(code, _mm256_load_si256((const __m256i *)(i8 + i)), 4));
    auto t1 = std::chrono::steady_clock::now();
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; i += 8)
        acci = _mm256_add_epi32(
            acci, _mm256_i32gather_epi32((const int *)grid, _mm256_load_si256((const __m256i *)(i16 + i)), 1));
    auto t2 = std::chrono::steady_clock::now();
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; i += 8) {
        uint64_t w = 0;
        for (int j = 0; j < 8; ++j) w |= (uint64_t)grid[i16[i + j]] << (8 * j);
        accs += w;
      }
    auto t3 = std::chrono::steady_clock::now();
    __m256 d[8];
    for (int j = 0; j < 8; ++j) d[j] = _mm256_set1_ps(2.0f + j);
    const __m256 a = _mm256_set1_ps(1.5f);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; i += 64)
        for (int j = 0; j < 8; ++j) d[j] = _mm256_div_ps(a, _mm256_sqrt_ps(_mm256_add_ps(d[j], a)));
    auto t4 = std::chrono::steady_clock::now();
    const double per8 = 1e9 * 8.0 / ((double)R * N);
    float sink = acc[0] + d[0][0] + (float)_mm256_extract_epi32(acci, 0) + (float)(accs & 1);
    printf("gather256 %.2f ns | gather64K %.2f ns | scalar8 %.2f ns | sqrtdiv %.2f ns  (per 8 lanes; %g)\n",
           secs(t0, t1) * per8, secs(t1, t2) * per8, secs(t2, t3) * per8, secs(t3, t4) * per8, sink);
  }
  return 0;
}
