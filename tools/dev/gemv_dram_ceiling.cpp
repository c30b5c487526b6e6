// gemv_dram_ceiling.cpp -- how fast can a one-row (decode) GEMV stream its weights from memory on this CPU, per loop
// body?  40 distinct 4096 x 11008 weight matrices (NF4: 0.9 GB, int8: 1.8 GB; more than any L3 seen here) read
// once per round, split by rows over 1..T threads, best of 4 rounds, GB/s of weight bytes.  Bodies (synthetic data,
// values meaningless; what is timed is the instruction mix against the memory stream):
//   nf4-kernel   fourbit.cpp's one-row bf16 loop (vpmovzxbw, vpermw decode, vdpbf16ps, per-64 scale fma, the same
//                2 KiB software prefetch)
//   nf4-decode   the same decode stored to an L1 buffer, no products: what any kernel that decodes NF4 to bf16
//                with vpermw must at least do (an AMX TDPBF16PS kernel would add its tile loads to this)
//   nf4-raw      a decode without vpmovzxbw: the packed bytes read as words, each word a vpermw index as it is and
//                shifted by 4, 8 and 12 (7 ops per 128 weights instead of 8, none cross-lane widening; lanes 0-7 /
//                8-15 scaled by their own block).  AVX-512 EPYC (Zen 4) 2026-12-06: 1 thread 12.1 -> 13.5-13.8
//                GB/s, 2 threads 20.9-21.6 -> 20.7-24.7; but as the library's kernel (tried: fourbit.cpp's one-row
//                bf16 GEMV with this decode, its twins changed to match) one 11008 x 4096 layer from memory on 2
//                threads and a SmolLM2 / 7B decode measured the same as today's within the machine's noise, so
//                it was not kept
//   int8-vnni    int8 weights as vpdpbusd reads them (b ^ 0x80, two accumulators), no scales
//   read         a plain read (vpaddd of each 64-byte line): the loop's own ceiling
// Build: g++ -O2 -pthread -o /tmp/ceil tools/dev/gemv_dram_ceiling.cpp && /tmp/ceil 2
#include <immintrin.h>
// GCC 12's _mm512_reduce_add_* trip a false -Wuninitialized inside its own header.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define TGT __attribute__((noinline, target("avx512f,avx512bw,avx512bf16,avx512vl,avx512vnni")))
constexpr int64_t kPF = 2048;
enum Body { NF4_KERNEL, NF4_DECODE, INT8_VNNI, READ, NF4_RAW };

TGT float nf4_rows(const uint8_t *q, const uint16_t *xs, int64_t K, int64_t rows, const float *am, bool decode_only,
                   uint16_t *buf) {
  alignas(64) uint16_t tab[32];
  for (int i = 0; i < 32; ++i) tab[i] = (uint16_t)(0x3f80 + i);
  const __m512i t = _mm512_load_si512(tab);
  __m512 tot = _mm512_setzero_ps();
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t *qr = q + n * K / 2;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t u = 0; u < K; u += 128, qr += 64) {
      _mm_prefetch((const char *)(qr + kPF), _MM_HINT_T0);
      const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qr));
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qr + 32)));
      const uint16_t *xu = xs + u;
      __m512 s, s2;
      if (decode_only) {
        uint16_t *bp = buf + (u & 1023);
        _mm512_store_si512(bp, _mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4), t));
        _mm512_store_si512(bp + 32, _mm512_permutexvar_epi16(a, t));
        _mm512_store_si512(bp + 64, _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), t));
        _mm512_store_si512(bp + 96, _mm512_permutexvar_epi16(b, t));
        s = s2 = _mm512_loadu_ps(xu);
      } else {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xu), x1 = (__m512bh)_mm512_loadu_si512(xu + 32);
        const __m512bh x2 = (__m512bh)_mm512_loadu_si512(xu + 64), x3 = (__m512bh)_mm512_loadu_si512(xu + 96);
        s = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4), t), x0);
        s2 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), t), x2);
        s = _mm512_dpbf16_ps(s, (__m512bh)_mm512_permutexvar_epi16(a, t), x1);
        s2 = _mm512_dpbf16_ps(s2, (__m512bh)_mm512_permutexvar_epi16(b, t), x3);
      }
      acc0 = _mm512_fmadd_ps(s, _mm512_set1_ps(am[(n * K + u) >> 6]), acc0);
      acc1 = _mm512_fmadd_ps(s2, _mm512_set1_ps(am[(n * K + u + 64) >> 6]), acc1);
    }
    tot = _mm512_add_ps(tot, _mm512_add_ps(acc0, acc1));
  }
  return _mm512_reduce_add_ps(tot);
}

__attribute__((always_inline, target("avx512f,avx512bw,avx512bf16"))) inline __m512 raw_unit(__m512i a,
                                                                                       const uint16_t *xu, __m512i t) {
  __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(a, t),
                              (__m512bh)_mm512_loadu_si512(xu));
  for (int f = 1; f < 4; ++f)
    s = _mm512_dpbf16_ps(s, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4 * f), t),
                         (__m512bh)_mm512_loadu_si512(xu + 32 * f));
  return s;
}

TGT float nf4_raw_rows(const uint8_t *q, const uint16_t *xs, int64_t K, int64_t rows, const float *am) {
  alignas(64) uint16_t tab[32];
  for (int i = 0; i < 32; ++i) tab[i] = (uint16_t)(0x3f80 + i);
  const __m512i t = _mm512_load_si512(tab);
  __m512 tot = _mm512_setzero_ps();
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t *qr = q + n * K / 2;
    const float *ar = am + n * K / 64;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t u = 0; u + 256 <= K; u += 256, qr += 128, ar += 4) {
      _mm_prefetch((const char *)(qr + kPF), _MM_HINT_T0);
      _mm_prefetch((const char *)(qr + kPF + 64), _MM_HINT_T0);
      const __m512 s = raw_unit(_mm512_loadu_si512(qr), xs + u, t);
      const __m512 s2 = raw_unit(_mm512_loadu_si512(qr + 64), xs + u + 128, t);
      acc0 = _mm512_fmadd_ps(s, _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(ar[0]), _mm512_set1_ps(ar[1])), acc0);
      acc1 = _mm512_fmadd_ps(s2, _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(ar[2]), _mm512_set1_ps(ar[3])), acc1);
    }
    tot = _mm512_add_ps(tot, _mm512_add_ps(acc0, acc1));
  }
  return _mm512_reduce_add_ps(tot);
}

// acc += u8 x s8 quads: inline asm, as int8_gemm.cpp's dpbusd_reg (with the intrinsic GCC 12 copied the
// accumulators through extra registers every step, which cost this loop ~12% of its rate here)
__attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni"))) inline __m512i dpbusd_reg(
    __m512i acc, __m512i u8, __m512i s8) {
  __asm__("vpdpbusd %[s], %[u], %[a]" : [a] "+v"(acc) : [u] "v"(u8), [s] "v"(s8));
  return acc;
}

TGT float int8_rows(const uint8_t *w, const int8_t *x, int64_t K, int64_t rows) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512i tot = _mm512_setzero_si512();
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t *wr = w + n * K;
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 128) {
      a0 = dpbusd_reg(a0, _mm512_xor_si512(_mm512_loadu_si512(wr + k), flip), _mm512_loadu_si512(x + k));
      a1 = dpbusd_reg(a1, _mm512_xor_si512(_mm512_loadu_si512(wr + k + 64), flip), _mm512_loadu_si512(x + k + 64));
    }
    tot = _mm512_add_epi32(tot, _mm512_add_epi32(a0, a1));
  }
  return (float)_mm512_reduce_add_epi32(tot);
}

TGT float read_bytes(const uint8_t *w, int64_t bytes) {
  __m512i tot = _mm512_setzero_si512();
  for (int64_t i = 0; i < bytes; i += 64) tot = _mm512_add_epi32(tot, _mm512_loadu_si512(w + i));
  return (float)_mm512_reduce_add_epi32(tot);
}

int main(int argc, char **argv) {
  const int64_t K = 11008, N = 4096, NM = 40;
  const int T = argc > 1 ? atoi(argv[1]) : 2;
  std::vector<uint8_t *> mats;
  for (int i = 0; i < NM; ++i) {  // int8-sized buffers; the NF4 bodies read the first half of each
    uint8_t *m = (uint8_t *)aligned_alloc(64, N * K);
    for (int64_t j = 0; j < N * K; ++j) m[j] = (uint8_t)(j * 37 + i);
    mats.push_back(m);
  }
  std::vector<float> am(N * K / 64, 0.5f);
  std::vector<uint16_t> xs(K, 0x3f00);
  std::vector<int8_t> x8(K, 3);
  const char *names[] = {"nf4-kernel", "nf4-decode", "int8-vnni", "read", "nf4-raw"};
  for (int thr = 1; thr <= T; ++thr)
    for (int body : {NF4_KERNEL, NF4_RAW, NF4_DECODE, INT8_VNNI, READ}) {
      const int64_t bpw2 = body == NF4_KERNEL || body == NF4_DECODE || body == NF4_RAW ? 1 : 2;  // bytes per weight x 2
      double best = 1e9;
      for (int r = 0; r < 4; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> th;
        for (int ti = 0; ti < thr; ++ti)
          th.emplace_back([&, ti] {
            alignas(64) static thread_local uint16_t buf[2048];
            volatile float sink = 0;
            const int64_t r0 = N * ti / thr, r1 = N * (ti + 1) / thr;
            for (int i = 0; i < NM; ++i) {
              if (body == INT8_VNNI) sink = sink + int8_rows(mats[i] + r0 * K, x8.data(), K, r1 - r0);
              else if (body == READ) sink = sink + read_bytes(mats[i] + r0 * K, (r1 - r0) * K);
              else if (body == NF4_RAW) sink = sink + nf4_raw_rows(mats[i] + r0 * K / 2, xs.data(), K, r1 - r0, am.data());
              else sink = sink + nf4_rows(mats[i] + r0 * K / 2, xs.data(), K, r1 - r0, am.data(), body == NF4_DECODE, buf);
            }
          });
        for (auto &x : th) x.join();
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (dt < best) best = dt;
      }
      printf("threads %d  %-10s  %5.1f GB/s\n", thr, names[body], NM * N * K * bpw2 / 2 / best / 1e9);
    }
}
