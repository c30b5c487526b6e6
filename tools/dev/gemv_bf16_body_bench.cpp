// gemv_bf16_body_bench.cpp -- the one-row bf16 NF4 kernel's loop body (fourbit.cpp gemv_bf16_rows_avx512bf16) on
// synthetic data at three working-set sizes, and the same body with vfmadd in place of vdpbf16ps (a timing ablation:
// its values are meaningless).  Build: g++ -O2 -o /tmp/k tools/dev/gemv_bf16_body_bench.cpp && /tmp/k
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <chrono>
__attribute__((noinline, target("avx512f,avx512bw,avx512bf16,avx512vl"))) float run(const uint8_t *q, const uint16_t *xs, int64_t K, int64_t rows, const float *am, int mode) {
  alignas(64) uint16_t tab[32];
  for (int i = 0; i < 32; ++i) tab[i] = 0x3f80 + i;
  const __m512i t = _mm512_load_si512(tab);
  __m512 tot = _mm512_setzero_ps();
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t *qr = q + n * K / 2;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t u = 0; u < K; u += 128, qr += 64) {
      const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qr));
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qr + 32)));
      const uint16_t *xu = xs + u;
      __m512bh x0 = (__m512bh)_mm512_loadu_si512(xu), x1 = (__m512bh)_mm512_loadu_si512(xu + 32), x2 = (__m512bh)_mm512_loadu_si512(xu + 64), x3 = (__m512bh)_mm512_loadu_si512(xu + 96);
      __m512 s, s2;
      if (mode == 0) {
        s = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4), t), x0);
        s2 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), t), x2);
        s = _mm512_dpbf16_ps(s, (__m512bh)_mm512_permutexvar_epi16(a, t), x1);
        s2 = _mm512_dpbf16_ps(s2, (__m512bh)_mm512_permutexvar_epi16(b, t), x3);
      } else {  // fp32 fma instead of dpbf16 (same shape: 4 ops)
        s = _mm512_fmadd_ps((__m512)_mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4), t), (__m512)x0, _mm512_setzero_ps());
        s2 = _mm512_fmadd_ps((__m512)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), t), (__m512)x2, _mm512_setzero_ps());
        s = _mm512_fmadd_ps((__m512)_mm512_permutexvar_epi16(a, t), (__m512)x1, s);
        s2 = _mm512_fmadd_ps((__m512)_mm512_permutexvar_epi16(b, t), (__m512)x3, s2);
      }
      acc0 = _mm512_fmadd_ps(s, _mm512_set1_ps(am[(n * K + u) >> 6]), acc0);
      acc1 = _mm512_fmadd_ps(s2, _mm512_set1_ps(am[(n * K + u + 64) >> 6]), acc1);
    }
    tot = _mm512_add_ps(tot, _mm512_add_ps(acc0, acc1));
  }
  return _mm512_reduce_add_ps(tot);
}
int main(int argc, char **argv) {
  const int64_t K = 4096;
  for (int64_t rows : {8, 64, 8192}) {  // 16 KB (L1), 128 KB (L2), 16 MB
    std::vector<uint8_t> q(rows * K / 2);
    for (size_t i = 0; i < q.size(); ++i) q[i] = (uint8_t)(i * 37 + 11);
    std::vector<uint16_t> xs(K, 0x3f00);
    std::vector<float> am(rows * K / 64, 0.5f);
    for (int mode = 0; mode < 2; ++mode) {
      double best = 1e9; float sink = 0;
      const int reps = (int)(200000000 / (rows * K));
      for (int r = 0; r < 5; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) { asm volatile("" ::: "memory"); sink += run(q.data(), xs.data(), K, rows, am.data(), mode); }
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (dt < best) best = dt;
      }
      printf("rows %5ld mode %s: %.1f G weights/s (one thread) %g\n", rows, mode ? "fma " : "dpbf", rows * K * (double)reps / best / 1e9, sink);
    }
  }
}
