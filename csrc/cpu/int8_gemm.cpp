// int8_gemm.cpp -- the LLM.int8() int8 x int8 -> int32 GEMM on x86 (the kernel of cigemmlt_32 and of the fused
// int8 linear; their entry points are in int8.cpp): scalar, AVX2 and AVX-512 tiles on int16-widened A, AVX-VNNI
// and AVX-512 VNNI tiles (vpdpbusd), the packed-panel drivers for many rows, and the run-time path choice.
// Apart from int8.cpp (quantizer, dequant, entry points) as one GEMM family with its own tiling and tuning; the
// AMX-INT8 kernel is apart again in int8_gemm_amx.cpp (as llama.cpp keeps AMX apart), int8_gemm.h joins them.
//
// Numerics: out[m, n] = sum_k A[m, k] * B[n, k] exactly in int32 on every path (see int8.cpp's header).
//
// Kernel paths (chosen at run time from CPUID; BNB_MS_SIMD=scalar|avx2|avx512 lowers the level):
//  * GEMM: scalar, AVX2 (vpmaddwd on int16-widened A; from 12 rows on against B widened into packed
//    16-column panels), AVX-512 (same as the former), AVX-VNNI and AVX-512 VNNI
//    (vpdpbusd: u8 x s8 with B fed as b + 128 and 128 * sum_k A[m, k] subtracted per output; the
//    non-saturating instruction wraps mod 2^32 and the true result fits int32, so it is exact), and
//    AMX-INT8 (tdpbssd, s8 x s8, for M >= 8).  BNB_MS_INT8_GEMM=scalar|avx2|avx512|avxvnni|avx512vnni|amx
//    forces one path when the CPU has it (for every M); bnb_ms_int8_gemm_path() names the path in use.
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_epi32 trips a false -Wuninitialized inside its own header.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/int8_gemm.h"
#include "cpu/parallel.h"

namespace bnb_ms {
namespace {

// ------------------------------------------------------------------------------------------------
// int8 GEMM: C[M, N] = A[M, K] . B[N, K]^T, int32 accumulation (exact: |sum| <= K * 2^14 < 2^31 for
// K < 131072, which the entry points in int8.cpp enforce).
//
// Paths (see the header): scalar / AVX2 / AVX-512 widen A to int16 once per call and multiply with
// vpmaddwd; AVX-VNNI / AVX-512 VNNI take B as u8 (b ^ 0x80 = b + 128, in registers) and A as s8 in
// vpdpbusd, then subtract 128 * sum_k A[m, k] (per row of A and K block, computed once per call);
// AMX-INT8 runs tdpbssd on 16 x 16 tiles (see int8_gemm_amx).
//
// Layout of the non-AMX paths: B stays int8 and is read in place. Work is split over N (B rows) in
// chunks handed out dynamically to the threads (a thread that is descheduled on a busy machine does
// not hold up the others); each chunk walks K in blocks of kKC (1-2 rows of A: all of K at once) and inside a block runs an MR x NR
// register tile of int32 accumulators over all M.
// ------------------------------------------------------------------------------------------------
#define BNB_MS_TARGET_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define BNB_MS_TARGET_AVXVNNI __attribute__((target("avxvnni,avx2,fma,f16c")))

constexpr int64_t kKC = 2048;  // K block (A tile 4 x 2048 x 2 bytes = 16 KiB stays in L1)
constexpr int64_t kNB = 96;    // most B rows per chunk (96 x 2048 = 192 KiB in L2)
// The automatic choice uses AMX from this many rows of A on (measured on a 16-core Sapphire Rapids,
// K = 4096, N = 4096/11008: AVX-512 VNNI is faster at M = 1, level at M = 4, AMX 1.1-1.4x at M = 8,
// 1.4-2.2x at M = 16 and 3-4x from M = 64 on).
constexpr int64_t kAmxMinRows = 8;

// ---- scalar / AVX2 / AVX-512: int16 A x int8 B ---------------------------------------------------
// portable tile: any mr <= 4, nr <= 3
void int8_gemm_tile_portable(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc, int64_t k0,
                             int64_t k1, int64_t m0, int64_t mr, int64_t n0, int64_t nr, bool first) {
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      const int16_t *a = A16 + (m0 + i) * K;
      const int8_t *b = B + (n0 + j) * K;
      int32_t s = 0;
      for (int64_t k = k0; k < k1; ++k) s += (int32_t)a[k] * (int32_t)b[k];
      int32_t *c = C + (m0 + i) * ldc + n0 + j;
      *c = first ? s : *c + s;
    }
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// AVX2 MR x NR tile: per 16 k, NR sign-extending loads of B (vpmovsxbw), MR*NR vpmaddwd against int16 A.
template <int MR, int NR>
BNB_MS_TARGET_AVX2 void int8_gemm_tile_avx2(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc,
                                            int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  const int16_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A16 + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    __m256i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b[j] + k)));
    for (int i = 0; i < MR; ++i) {
      const __m256i va = _mm256_loadu_si256((const __m256i *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(va, vb[j]));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      int32_t s = hsum256(acc[i][j]);
      for (int64_t kk = k; kk < k1; ++kk) s += (int32_t)a[i][kk] * (int32_t)b[j][kk];
      int32_t *c = C + (m0 + i) * ldc + n0 + j;
      *c = first ? s : *c + s;
    }
}

// AVX-512 (no VNNI) tile, same structure with 32 k per step. (Its target has no avx512vnni, so the
// compiler cannot fuse vpmaddwd + vpaddd into a VNNI instruction on CPUs without it.)
template <int MR, int NR>
BNB_MS_TARGET_AVX512 void int8_gemm_tile_avx512(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc,
                                                int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  const int16_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A16 + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) {
    __m512i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b[j] + k)));
    for (int i = 0; i < MR; ++i) {
      const __m512i va = _mm512_loadu_si512((const void *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(va, vb[j]));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      int32_t s = _mm512_reduce_add_epi32(acc[i][j]);
      for (int64_t kk = k; kk < k1; ++kk) s += (int32_t)a[i][kk] * (int32_t)b[j][kk];
      int32_t *c = C + (m0 + i) * ldc + n0 + j;
      *c = first ? s : *c + s;
    }
}

// ---- VNNI: u8 (b + 128) x s8 A, minus 128 * sum_k A ------------------------------------------------
// vpdpbusd multiplies unsigned by signed bytes. B is fed as u8 b ^ 0x80 = b + 128 (one vpxor per B
// vector, in registers: the weight is read once, in place) and A as s8, so each lane accumulates
// sum_k (b + 128) * a = sum_k a * b + 128 * sum_k a; the row sums of A (M per K block, computed once per
// call) are subtracted at the end.
// sum_k a[k] for k in [0, n) (AVX2: sum of the bytes a ^ 0x80 = a + 128 with vpsadbw, minus 128 n).
BNB_MS_TARGET_AVX2 int32_t row_sum_i8(const int8_t *a, int64_t n) {
  const __m256i flip = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
  __m256i acc = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32)
    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a + k)), flip), zero));
  const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  int64_t s = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 128 * k;
  for (; k < n; ++k) s += a[k];
  return (int32_t)s;
}

// Adds (first: stores) the exact block result: `raw` = sum_k (b[k] + 128) * a[k] mod 2^32 over the
// block, `asum` = sum_k a[k] over the same k. Unsigned arithmetic wraps mod 2^32 (so does vpdpbusd,
// the non-saturating form), and the true value fits int32, so the conversion back is exact.
BNB_MS_INLINE void vnni_store(int32_t *c, uint32_t raw, int32_t asum, bool first) {
  const uint32_t s = raw - 128u * (uint32_t)asum;
  *c = first ? (int32_t)s : (int32_t)((uint32_t)*c + s);
}

// acc += u8 x s8 quads (vpdpbusd).  As inline asm: with the intrinsic GCC copied every accumulator through the
// stack on each step of the register tiles (the 8 x 48 panel tile: 370 -> 940 GOP/s single-threaded).
BNB_MS_TARGET_AVX512VNNI BNB_MS_INLINE __m512i dpbusd_reg(__m512i acc, __m512i u8, __m512i s8) {
  __asm__("vpdpbusd %[s], %[u], %[a]" : [a] "+v"(acc) : [u] "v"(u8), [s] "v"(s8));
  return acc;
}

// One or two rows of A (a decode step) with short weight rows: each B row of the tile is K <= kPrefetchMaxK bytes,
// too short for the hardware prefetchers to ramp up on, so the tile prefetches the next tile's rows (NR * K bytes
// ahead, same column): SmolLM2 int8 decode 18.9 -> 16.4 ms/token on the 2-core Xeon (AMX) measured.  Longer rows
// gained nothing measurable there (the prefetchers follow them), so they are left alone.
constexpr int64_t kPrefetchMaxK = 2048;

// asum: sums of A over this K block, indexed by the row of A.
template <int MR, int NR>
BNB_MS_TARGET_AVX512VNNI void int8_gemm_tile_avx512vnni(const int8_t *A, const int8_t *B, const int32_t *asum,
                                                        int32_t *C, int64_t K, int64_t ldc, int64_t k0, int64_t k1,
                                                        int64_t m0, int64_t n0, bool first) {
  const int64_t pf = MR <= 2 && K <= kPrefetchMaxK ? NR * K : 0;  // see kPrefetchMaxK
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  const int8_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 64 <= k1; k += 64) {
    __m512i vb[NR];
    if (pf)
      for (int j = 0; j < NR; ++j) _mm_prefetch((const char *)(b[j] + k + pf), _MM_HINT_T0);
    for (int j = 0; j < NR; ++j) vb[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(b[j] + k)), flip);
    for (int i = 0; i < MR; ++i) {
      const __m512i va = _mm512_loadu_si512((const void *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = dpbusd_reg(acc[i][j], vb[j], va);
    }
  }
  if (k < k1) {  // 1..63 bytes left: masked loads (no fault past the end); A's masked lanes are 0
    const __mmask64 mk = (__mmask64)((1ull << (k1 - k)) - 1);
    __m512i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, b[j] + k), flip);
    for (int i = 0; i < MR; ++i) {
      const __m512i va = _mm512_maskz_loadu_epi8(mk, a[i] + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = dpbusd_reg(acc[i][j], vb[j], va);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      vnni_store(C + (m0 + i) * ldc + n0 + j, (uint32_t)_mm512_reduce_add_epi32(acc[i][j]), asum[m0 + i], first);
}

template <int MR, int NR>
BNB_MS_TARGET_AVXVNNI void int8_gemm_tile_avxvnni(const int8_t *A, const int8_t *B, const int32_t *asum, int32_t *C,
                                                  int64_t K, int64_t ldc, int64_t k0, int64_t k1, int64_t m0,
                                                  int64_t n0, bool first) {
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  const int8_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) {
    __m256i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b[j] + k)), flip);
    for (int i = 0; i < MR; ++i) {
      const __m256i va = _mm256_loadu_si256((const __m256i *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_dpbusd_avx_epi32(acc[i][j], vb[j], va);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      uint32_t raw = (uint32_t)hsum256(acc[i][j]);
      for (int64_t kk = k; kk < k1; ++kk) raw += (uint32_t)((int32_t)(uint8_t)(b[j][kk] ^ 0x80) * (int32_t)a[i][kk]);
      vnni_store(C + (m0 + i) * ldc + n0 + j, raw, asum[m0 + i], first);
    }
}

// ---- path choice -----------------------------------------------------------------------------------

// What the hardware (and OS) allows, independent of BNB_MS_SIMD.
bool gemm_path_supported(GemmPath p) {
  const uint32_t f = cpu_features();
  constexpr uint32_t avx2 = CPU_AVX2 | CPU_FMA | CPU_F16C;
  constexpr uint32_t avx512 = avx2 | CPU_AVX512F | CPU_AVX512BW | CPU_AVX512VL | CPU_AVX512DQ;
  switch (p) {
    case GemmPath::scalar: return true;
    case GemmPath::avx2: return (f & avx2) == avx2;
    case GemmPath::avx512: return (f & avx512) == avx512;
    case GemmPath::avxvnni: return (f & avx2) == avx2 && (f & CPU_AVXVNNI);
    case GemmPath::avx512vnni: return (f & avx512) == avx512 && (f & CPU_AVX512VNNI);
    case GemmPath::amx: return (f & avx512) == avx512 && (f & CPU_AMX_INT8);
    default: return false;
  }
}

// Automatic order amx > avx512vnni > avx512 > avxvnni > avx2 > scalar, within the SIMD level
// (BNB_MS_SIMD lowers it: avx2 keeps the 256-bit paths, scalar the portable one).
GemmPath auto_gemm_path(bool allow_amx) {
  const SimdLevel l = simd_level();
  if (l >= SimdLevel::avx512) {
    if (allow_amx && gemm_path_supported(GemmPath::amx)) return GemmPath::amx;
    if (gemm_path_supported(GemmPath::avx512vnni)) return GemmPath::avx512vnni;
    return GemmPath::avx512;
  }
  if (l >= SimdLevel::avx2) return gemm_path_supported(GemmPath::avxvnni) ? GemmPath::avxvnni : GemmPath::avx2;
  return GemmPath::scalar;
}

}  // namespace

GemmChoice gemm_choice() {
  static const GemmChoice choice = [] {
    const char *env = std::getenv("BNB_MS_INT8_GEMM");
    if (env)
      for (int i = 0; i < (int)GemmPath::count; ++i)
        if (!std::strcmp(env, kGemmPathNames[i]) && gemm_path_supported((GemmPath)i)) return GemmChoice{(GemmPath)i, true};
    return GemmChoice{auto_gemm_path(true), false};
  }();
  return choice;
}

GemmPath gemm_path_for_rows(int64_t M) {
  const GemmChoice c = gemm_choice();
  if (!c.forced && c.path == GemmPath::amx && M < kAmxMinRows) return auto_gemm_path(false);
  return c.path;
}

namespace {

// ---- driver of the non-AMX paths --------------------------------------------------------------------
// Ap: int16 A (scalar/AVX2/AVX-512) or the int8 A itself (VNNI); sums: the VNNI paths' row sums of A
// for this K block (indexed by row), unused otherwise.
template <int MR, int NR>
void run_tile(GemmPath p, const void *Ap, const int8_t *B, const int32_t *sums, int32_t *C, int64_t K, int64_t ldc,
              int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
  switch (p) {
    case GemmPath::avx512vnni:
      int8_gemm_tile_avx512vnni<MR, NR>((const int8_t *)Ap, B, sums, C, K, ldc, k0, k1, m0, n0, first);
      break;
    case GemmPath::avxvnni:
      int8_gemm_tile_avxvnni<MR, NR>((const int8_t *)Ap, B, sums, C, K, ldc, k0, k1, m0, n0, first);
      break;
    case GemmPath::avx512:
      int8_gemm_tile_avx512<MR, NR>((const int16_t *)Ap, B, C, K, ldc, k0, k1, m0, n0, first);
      break;
    case GemmPath::avx2: int8_gemm_tile_avx2<MR, NR>((const int16_t *)Ap, B, C, K, ldc, k0, k1, m0, n0, first); break;
    default: int8_gemm_tile_portable((const int16_t *)Ap, B, C, K, ldc, k0, k1, m0, MR, n0, NR, first); break;
  }
}

// All rows of C against NR rows of B starting at n0 (B stays in L1 while A is walked).
template <int NR>
void run_col_tile(GemmPath p, const void *Ap, const int8_t *B, const int32_t *sums, int32_t *C, int64_t M, int64_t K,
                  int64_t ldc, int64_t k0, int64_t k1, int64_t n0, bool first) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run_tile<4, NR>(p, Ap, B, sums, C, K, ldc, k0, k1, m, n0, first);
  for (; m < M; ++m) run_tile<1, NR>(p, Ap, B, sums, C, K, ldc, k0, k1, m, n0, first);
}

// Rows m0..m0+MR-1 of C against B rows [n0, n1) (A stays in L1 while B is walked).
template <int MR>
void run_row_tile(GemmPath p, const void *Ap, const int8_t *B, const int32_t *sums, int32_t *C, int64_t K,
                  int64_t ldc, int64_t k0, int64_t k1, int64_t m0, int64_t n0, int64_t n1, bool first) {
  int64_t n = n0;
  for (; n + 3 <= n1; n += 3) run_tile<MR, 3>(p, Ap, B, sums, C, K, ldc, k0, k1, m0, n, first);
  if (n1 - n == 2) run_tile<MR, 2>(p, Ap, B, sums, C, K, ldc, k0, k1, m0, n, first);
  else if (n1 - n == 1) run_tile<MR, 1>(p, Ap, B, sums, C, K, ldc, k0, k1, m0, n, first);
}

// ---- AVX2, many rows: packed 16-column panels of B, 6 x 16 register tile ---------------------------
// B (int8, [N, K]) is widened per call into panels of 16 columns: pair p of a panel holds, for column
// j, (B[n0 + j][2p], B[n0 + j][2p + 1]) as two int16, columns 0-7 in one ymm and 8-15 in the next.
// vpmaddwd of such a ymm with a broadcast pair of A (int16) adds two products per column, so the
// 6 x 16 tile is 12 named accumulators + 2 panel registers + 1 broadcast (no horizontal sums; the
// 4 x 3 dot-product tile above keeps 12 accumulators + 3 widened B + 1 A and GCC spills it).
// int32 sums are exact, so any tiling gives the bytes of every other path.
constexpr int kI8Panel = 16;
constexpr int kI8MR = 6;
constexpr int64_t kI8KC = 512;   // k per block (even): a packed panel is 16 KiB, a 6-row A tile 6 KiB
constexpr int64_t kI8NC = 96;    // columns packed at a time per thread (6 panels, 96 KiB in L2)
constexpr int64_t kI8PanelMinRows = 12;  // below this the dot-product tiles win (packing B costs more than it saves)

// 8 columns x 8 pairs (16 k from k) of B into the panel's half at d (pair pr at d + 32 pr): each
// column's 16 int8 widened to 8 int32-sized pairs, then an 8 x 8 transpose of those pairs.
BNB_MS_TARGET_AVX2 void pack_i8_8x16_avx2(const int8_t *b, int64_t K, int16_t *d) {
  __m256i r[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + j * K)));
  __m256i t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_epi32(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_epi32(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);
    u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
    u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
    u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
  }
  // u[q] (q < 4) holds pairs q (low lane) and q + 4 (high lane) of columns 0-3, u[q + 4] of columns 4-7
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_si256((__m256i *)(d + q * 32), _mm256_permute2x128_si256(u[q], u[q + 4], 0x20));
    _mm256_storeu_si256((__m256i *)(d + (q + 4) * 32), _mm256_permute2x128_si256(u[q], u[q + 4], 0x31));
  }
}

// Panel of columns [n0, n0 + nc) (nc <= 16), k in [k0, k0 + kc) (kc even; k >= K reads as 0).
void pack_i8_panel(const int8_t *B, int64_t K, int64_t n0, int nc, int64_t k0, int64_t kc, int16_t *P) {
  int64_t pr = 0;
  if (nc == kI8Panel)
    for (; k0 + 2 * pr + 16 <= std::min(K, k0 + kc); pr += 8) {
      pack_i8_8x16_avx2(B + n0 * K + k0 + 2 * pr, K, P + pr * 32);
      pack_i8_8x16_avx2(B + (n0 + 8) * K + k0 + 2 * pr, K, P + pr * 32 + 16);
    }
  for (; pr < kc / 2; ++pr) {
    int16_t *d = P + pr * 2 * kI8Panel;
    const int64_t k = k0 + 2 * pr;
    for (int j = 0; j < kI8Panel; ++j) {
      const int8_t *b = B + (n0 + j) * K;
      const bool col = j < nc;
      d[2 * j] = (int16_t)(col && k < K ? b[k] : 0);
      d[2 * j + 1] = (int16_t)(col && k + 1 < K ? b[k + 1] : 0);
    }
  }
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256i bcast_pair(const int16_t *a) {
  int32_t v;
  std::memcpy(&v, a, sizeof(v));
  return _mm256_set1_epi32(v);
}

// C rows [0, mr) x columns [0, nc) (+)= the 6-row A tile (int16, row stride lda, 6 readable rows of
// 2 * npairs values) times one packed panel.
BNB_MS_TARGET_AVX2 void tile_i8_panel_avx2(const int16_t *A, int64_t lda, int64_t mr, const int16_t *P,
                                           int64_t npairs, int nc, int32_t *C, int64_t ldc, bool first) {
  const int16_t *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda, *a4 = A + 4 * lda, *a5 = A + 5 * lda;
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
          c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t pr = 0; pr < npairs; ++pr) {
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)(P + pr * 32)),
                  b1 = _mm256_loadu_si256((const __m256i *)(P + pr * 32 + 16));
    __m256i a = bcast_pair(a0 + 2 * pr);
    c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(a, b0));
    c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a1 + 2 * pr);
    c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(a, b0));
    c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a2 + 2 * pr);
    c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(a, b0));
    c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a3 + 2 * pr);
    c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(a, b0));
    c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a4 + 2 * pr);
    c40 = _mm256_add_epi32(c40, _mm256_madd_epi16(a, b0));
    c41 = _mm256_add_epi32(c41, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a5 + 2 * pr);
    c50 = _mm256_add_epi32(c50, _mm256_madd_epi16(a, b0));
    c51 = _mm256_add_epi32(c51, _mm256_madd_epi16(a, b1));
  }
  alignas(32) int32_t acc[kI8MR][kI8Panel];
  _mm256_store_si256((__m256i *)acc[0], c00);
  _mm256_store_si256((__m256i *)(acc[0] + 8), c01);
  _mm256_store_si256((__m256i *)acc[1], c10);
  _mm256_store_si256((__m256i *)(acc[1] + 8), c11);
  _mm256_store_si256((__m256i *)acc[2], c20);
  _mm256_store_si256((__m256i *)(acc[2] + 8), c21);
  _mm256_store_si256((__m256i *)acc[3], c30);
  _mm256_store_si256((__m256i *)(acc[3] + 8), c31);
  _mm256_store_si256((__m256i *)acc[4], c40);
  _mm256_store_si256((__m256i *)(acc[4] + 8), c41);
  _mm256_store_si256((__m256i *)acc[5], c50);
  _mm256_store_si256((__m256i *)(acc[5] + 8), c51);
  for (int64_t i = 0; i < mr; ++i) {
    int32_t *c = C + i * ldc;
    if (first) std::memcpy(c, acc[i], sizeof(int32_t) * (size_t)nc);
    else
      for (int j = 0; j < nc; ++j) c[j] += acc[i][j];
  }
}

void int8_gemm_panel_avx2(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  // A widened to int16 with an even row stride and whole 6-row tiles (zero padding).
  const int64_t lda = K + (K & 1), Mp = (M + kI8MR - 1) / kI8MR * kI8MR;
  std::vector<int16_t> a16((size_t)(Mp * lda), 0);
  parallel_for(M, std::max<int64_t>(1, 65536 / lda), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k) a16[(size_t)(r * lda + k)] = A[r * K + k];
  });
  const int64_t nkb = (lda + kI8KC - 1) / kI8KC;
  int64_t chunk = N / (4 * (int64_t)max_threads());  // ~4 chunks per thread, whole panels, <= kI8NC
  chunk = std::min<int64_t>(kI8NC, std::max<int64_t>(kI8Panel, (chunk + kI8Panel - 1) / kI8Panel * kI8Panel));
  parallel_chunks(N, chunk, true, [&](int64_t nc0, int64_t nc1) {
    static thread_local std::vector<int16_t> packed;
    for (int64_t nb = nc0; nb < nc1; nb += kI8NC) {
      const int64_t ne = std::min(nb + kI8NC, nc1), npan = (ne - nb + kI8Panel - 1) / kI8Panel;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kI8KC, kc = std::min(kI8KC, lda - k0), pstride = kc * kI8Panel;
        packed.resize((size_t)(npan * pstride));
        for (int64_t q = 0; q < npan; ++q) {
          const int64_t n0 = nb + q * kI8Panel;
          pack_i8_panel(B, K, n0, (int)std::min<int64_t>(kI8Panel, ne - n0), k0, kc, packed.data() + q * pstride);
        }
        for (int64_t m = 0; m < M; m += kI8MR) {
          const int64_t mr = std::min<int64_t>(kI8MR, M - m);
          for (int64_t q = 0; q < npan; ++q) {
            const int64_t n0 = nb + q * kI8Panel;
            tile_i8_panel_avx2(a16.data() + m * lda + k0, lda, mr, packed.data() + q * pstride, kc / 2,
                               (int)std::min<int64_t>(kI8Panel, ne - n0), C + m * N + n0, N, kb == 0);
          }
        }
      }
    }
  });
}

// ---- AVX-512 VNNI, many rows: packed 16-column panels of u8 quads, 8 x 48 register tile ---------------
// B (int8 [N, K]) is packed per call into panels of 16 columns: quad p of a panel holds, for column j, the 4
// bytes B[n0 + j][4p .. 4p + 3] ^ 0x80 (= b + 128 as u8), one zmm per quad.  vpdpbusd of it with a
// broadcast quad of A (s8) adds 4 products per column: 24 accumulators for 8 rows x 3 panels, 3 panel
// loads and 8 broadcasts per quad, no horizontal sums (the dot-product tiles above reduce every output).
// raw = sum_k (b + 128) a wraps mod 2^32 like vpdpbusd; C = raw - 128 * sum_k a is exact (it fits int32),
// so the bytes are every other path's.  A is copied zero-padded to whole quads and 8-row tiles.
constexpr int kV8MR = 8, kV8NP = 3;
constexpr int64_t kV8KC = 1024;  // k per block (a multiple of 4): a panel is 16 KiB, the 8-row A tile 8 KiB
constexpr int64_t kV8NC = 192;   // columns packed at a time per thread (12 panels, 192 KiB in L2)
constexpr int64_t kV8PanelMinRows = 17;  // up to 16 rows the dot-product tiles win (packing B costs more)

// 16 quads (64 bytes from k) of 16 columns (rows of B, K apart) into quads 0..15 of a panel at P, ^ 0x80:
// a 16 x 16 dword transpose (32-bit and 64-bit unpacks within 128-bit lanes, then two lane shuffles).
BNB_MS_TARGET_AVX512 void pack_u8q_16x16_avx512(const int8_t *b, int64_t K, uint32_t *P) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512i r[16], t[16], u[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(b + j * K)), flip);
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {  // u[j + c] lane L: quad 4L + c of rows j .. j + 3
    u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
    u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
    u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
    u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i lo0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), lo1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i hi0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE), hi1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    _mm512_storeu_si512((void *)(P + (0 + c) * kI8Panel), _mm512_shuffle_i32x4(lo0, lo1, 0x88));
    _mm512_storeu_si512((void *)(P + (4 + c) * kI8Panel), _mm512_shuffle_i32x4(lo0, lo1, 0xDD));
    _mm512_storeu_si512((void *)(P + (8 + c) * kI8Panel), _mm512_shuffle_i32x4(hi0, hi1, 0x88));
    _mm512_storeu_si512((void *)(P + (12 + c) * kI8Panel), _mm512_shuffle_i32x4(hi0, hi1, 0xDD));
  }
}

// Panel of columns [n0, n0 + nc) (nc <= 16), quads [k0 / 4, (k0 + kc) / 4) (k >= K reads as b = 0).
void pack_u8q_panel(const int8_t *B, int64_t K, int64_t n0, int nc, int64_t k0, int64_t kc, uint32_t *P) {
  int64_t p0 = 0;
  if (nc == kI8Panel)  // whole 64-byte runs inside every row: the SIMD transpose
    for (; k0 + 4 * p0 + 64 <= std::min(K, k0 + kc); p0 += 16)
      pack_u8q_16x16_avx512(B + n0 * K + k0 + 4 * p0, K, P + p0 * kI8Panel);
  const int64_t nq = kc / 4;
  for (int j = 0; j < kI8Panel; ++j) {
    const int8_t *b = B + (n0 + j) * K;
    for (int64_t p = p0; p < nq; ++p) {
      const int64_t k = k0 + 4 * p;
      uint32_t v = 0x80808080u;  // b = 0
      if (j < nc) {
        if (k + 4 <= K) {
          std::memcpy(&v, b + k, 4);
          v ^= 0x80808080u;
        } else {
          uint8_t t[4] = {0x80, 0x80, 0x80, 0x80};
          for (int64_t e = 0; e < 4 && k + e < K; ++e) t[e] = (uint8_t)(b[k + e] ^ 0x80);
          std::memcpy(&v, t, 4);
        }
      }
      P[p * kI8Panel + j] = v;
    }
  }
}

// C rows [0, mr) x columns of NP panels (the last one ncl wide) (+)= the 8-row A tile (s8, row stride lda,
// nq quads) times the panels; corr[i] = -128 * sum_k A[i][k] over all K, added with the first block.
template <int NP>
BNB_MS_TARGET_AVX512VNNI void tile_u8q_avx512vnni(const int8_t *A, int64_t lda, int64_t mr, const uint32_t *P,
                                                  int64_t pstride, int64_t nq, int ncl, int32_t *C, int64_t ldc,
                                                  const int32_t *corr, bool first) {
  __m512i acc[kV8MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < kV8MR; ++i)
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_si512();
  for (int64_t p = 0; p < nq; ++p) {
    __m512i b[NP];
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) b[q] = _mm512_loadu_si512((const void *)(P + q * pstride + p * kI8Panel));
#pragma GCC unroll 8
    for (int i = 0; i < kV8MR; ++i) {
      int32_t v;
      std::memcpy(&v, A + i * lda + 4 * p, 4);
      const __m512i a = _mm512_set1_epi32(v);
#pragma GCC unroll 3
      for (int q = 0; q < NP; ++q) acc[i][q] = dpbusd_reg(acc[i][q], b[q], a);
    }
  }
  alignas(64) uint32_t row[kI8Panel];
  for (int64_t i = 0; i < mr; ++i)
    for (int q = 0; q < NP; ++q) {
      _mm512_store_si512(row, acc[i][q]);
      int32_t *c = C + i * ldc + q * kI8Panel;
      const int nc = q == NP - 1 ? ncl : kI8Panel;
      if (first)
        for (int j = 0; j < nc; ++j) c[j] = (int32_t)(row[j] + (uint32_t)corr[i]);
      else
        for (int j = 0; j < nc; ++j) c[j] = (int32_t)((uint32_t)c[j] + row[j]);
    }
}

void int8_gemm_panel_avx512vnni(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const int64_t lda = (K + 3) / 4 * 4, Mp = (M + kV8MR - 1) / kV8MR * kV8MR;
  std::vector<int8_t> a8((size_t)(Mp * lda), 0);
  std::vector<int32_t> corr((size_t)Mp, 0);
  parallel_for(M, std::max<int64_t>(1, 65536 / lda), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(a8.data() + r * lda, A + r * K, (size_t)K);
      corr[(size_t)r] = (int32_t)(0u - 128u * (uint32_t)row_sum_i8(A + r * K, K));
    }
  });
  const int64_t nkb = (lda + kV8KC - 1) / kV8KC;
  int64_t chunk = N / (4 * (int64_t)max_threads());  // ~4 chunks per thread, whole panels, <= kV8NC
  chunk = std::min<int64_t>(kV8NC, std::max<int64_t>(kI8Panel, (chunk + kI8Panel - 1) / kI8Panel * kI8Panel));
  const int8_t *ap = a8.data();
  const int32_t *cp = corr.data();
  parallel_chunks(N, chunk, true, [&](int64_t nc0, int64_t nc1) {
    static thread_local std::vector<uint32_t> packed;
    for (int64_t nb = nc0; nb < nc1; nb += kV8NC) {
      const int64_t ne = std::min(nb + kV8NC, nc1), npan = (ne - nb + kI8Panel - 1) / kI8Panel;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kV8KC, kc = std::min(kV8KC, lda - k0), nq = kc / 4, pstride = nq * kI8Panel;
        packed.resize((size_t)(npan * pstride));
        for (int64_t q = 0; q < npan; ++q) {
          const int64_t n0 = nb + q * kI8Panel;
          pack_u8q_panel(B, K, n0, (int)std::min<int64_t>(kI8Panel, ne - n0), k0, kc, packed.data() + q * pstride);
        }
        for (int64_t m = 0; m < M; m += kV8MR) {
          const int64_t mr = std::min<int64_t>(kV8MR, M - m);
          for (int64_t q = 0; q < npan; q += kV8NP) {
            const int np = (int)std::min<int64_t>(kV8NP, npan - q);
            const int64_t n0 = nb + q * kI8Panel;
            const int ncl = (int)std::min<int64_t>(kI8Panel, ne - (n0 + (np - 1) * kI8Panel));
            const int8_t *a = ap + m * lda + k0;
            const uint32_t *pp = packed.data() + q * pstride;
            int32_t *c = C + m * N + n0;
            if (np == 3) tile_u8q_avx512vnni<3>(a, lda, mr, pp, pstride, nq, ncl, c, N, cp + m, kb == 0);
            else if (np == 2) tile_u8q_avx512vnni<2>(a, lda, mr, pp, pstride, nq, ncl, c, N, cp + m, kb == 0);
            else tile_u8q_avx512vnni<1>(a, lda, mr, pp, pstride, nq, ncl, c, N, cp + m, kb == 0);
          }
        }
      }
    }
  });
}

void int8_gemm_simd(GemmPath p, const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  if (p == GemmPath::avx2 && M >= kI8PanelMinRows) return int8_gemm_panel_avx2(A, B, C, M, N, K);
  if (p == GemmPath::avx512vnni && M >= kV8PanelMinRows) return int8_gemm_panel_avx512vnni(A, B, C, M, N, K);
  const bool vnni = p == GemmPath::avx512vnni || p == GemmPath::avxvnni;
  // K block: kKC keeps an A tile in L1 for many rows; one or two rows of A fit in L1 whole, so each B row is then
  // read as one stream (K-blocking it cut every row into short streams that the prefetchers restart on)
  const int64_t kc = M <= 2 ? K : kKC;
  const int64_t nkb = (K + kc - 1) / kc;
  std::vector<int16_t> a16;
  std::vector<int32_t> asum;
  const int64_t arows = std::max<int64_t>(1, 65536 / K);
  if (vnni) {  // A is used as is; its row sums per K block
    asum.resize((size_t)(nkb * M));
    parallel_for(M, arows, [&](int64_t r0, int64_t r1) {
      for (int64_t kb = 0; kb < nkb; ++kb)
        for (int64_t r = r0; r < r1; ++r)
          asum[(size_t)(kb * M + r)] = row_sum_i8(A + r * K + kb * kc, std::min(kc, K - kb * kc));
    });
  } else {
    a16.resize((size_t)(M * K));
    parallel_for(M, arows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * K; i < r1 * K; ++i) a16[(size_t)i] = A[i];
    });
  }
  const void *Ap = vnni ? (const void *)A : (const void *)a16.data();
  // Loop order: few rows of A -> for each 3-row tile of B, all of A (the B tile is read from memory
  // once per K block); many rows -> for each 4-row tile of A, the chunk's B rows (L2).
  const bool n_outer = M <= 16;
  // chunks of B rows: about 8 per thread, a multiple of the 3-row tile, at most kNB rows
  int64_t chunk = N / (8 * (int64_t)max_threads());
  chunk = std::min<int64_t>(kNB, std::max<int64_t>(3, (chunk + 2) / 3 * 3));
  const bool par = (double)M * (double)N * (double)K >= (double)(1 << 20);  // (~35 us on one AVX2 core)
  parallel_chunks(N, chunk, par, [&](int64_t nc0, int64_t nc1) {
    for (int64_t nb = nc0; nb < nc1; nb += kNB) {
      const int64_t ne = std::min(nb + kNB, nc1);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kc, k1 = std::min(k0 + kc, K);
        const bool first = kb == 0;
        const int32_t *sums = vnni ? asum.data() + kb * M : nullptr;
        if (n_outer) {
          int64_t n = nb;
          // more weight rows per tile where the tile's registers allow: more memory streams in flight (M = 1,
          // 4096 x 11008: 1.86 -> 1.28 ms single-threaded)
          if (M <= 2)
            for (; n + 12 <= ne; n += 12) run_col_tile<12>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          else
            for (; n + 6 <= ne; n += 6) run_col_tile<6>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          for (; n + 3 <= ne; n += 3) run_col_tile<3>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          if (ne - n == 2) run_col_tile<2>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          else if (ne - n == 1) run_col_tile<1>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
        } else {
          int64_t m = 0;
          for (; m + 4 <= M; m += 4) run_row_tile<4>(p, Ap, B, sums, C, K, N, k0, k1, m, nb, ne, first);
          for (; m < M; ++m) run_row_tile<1>(p, Ap, B, sums, C, K, N, k0, k1, m, nb, ne, first);
        }
      }
    }
  });
}

}  // namespace

void int8_gemm(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const GemmPath p = gemm_path_for_rows(M);
  if (p == GemmPath::amx) int8_gemm_amx(A, B, C, M, N, K);
  else int8_gemm_simd(p, A, B, C, M, N, K);
}

}  // namespace bnb_ms
