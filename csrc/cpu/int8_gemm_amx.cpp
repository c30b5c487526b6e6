// int8_gemm_amx.cpp -- the AMX-INT8 kernel of the LLM.int8() int8 GEMM (tdpbssd on 16 x 16 int32 tiles, exact):
// int8_gemm (int8_gemm.cpp) runs it when the CPU and OS allow AMX, from 8 rows of A on, or for every M under
// BNB_MS_INT8_GEMM=amx.  Alone in its file, as llama.cpp keeps AMX apart: it is the one kernel that needs the tile
// state (ldtilecfg per thread, released after), its own operand layout, and CPUs few hosts have.
// Numerics: out[m, n] = sum_k A[m, k] * B[n, k] exactly in int32, the bytes of every other path (int8.cpp's header).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/amx_tiles.h"
#include "cpu/int8_gemm.h"
#include "cpu/parallel.h"

#ifndef BNB_MS_TARGET_AMX  // (a test harness may predefine it, to run the AMX driver on emulated tiles)
#define BNB_MS_TARGET_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

namespace bnb_ms {
namespace {

// ---- AMX-INT8 ---------------------------------------------------------------------------------------
// Computes C^T tile by tile: tdpbssd(dst, src1, src2) adds src1[r][k] * src2[k/4][4c + k%4] over the
// 64 k of one step into dst[r][c]. src1 = 16 rows of B straight from memory (row stride K: the weight
// is never repacked), src2 = A packed once per call into that 4-byte-interleaved layout, so
// dst[n][m] = sum_k B[n][k] * A[m][k]; the 16 x 16 int32 result tile is transposed into C on the way out.
// Tails: A is packed zero-padded to whole 16-row, 64-k tiles; the last partial k-step of a full B tile
// comes from a zero-padded 16 x 64 copy (never a read past a row that might be the buffer's end) and
// a last B tile of fewer than 16 rows from a zero-padded 16 x Kpad copy; M/N tails are cut when storing.
// Each thread configures 8 tiles of 16 rows x 64 bytes (amx_tiles.h) and releases them when done.
struct BTileSrc {
  const int8_t *p;     // k-step ks at p + 64 * ks, rows `stride` bytes apart
  int64_t stride;
  const int8_t *tail;  // if set: the last k-step comes from here instead (rows 64 bytes apart)
};

// Tiles: C^T in tmm0 (n-tile 0, m-tile 0), tmm1 (0, 1), tmm2 (1, 0), tmm3 (1, 1); B in tmm4/tmm5;
// packed A in tmm6/tmm7. cs receives the result tiles, 256 int32 each, in that order. (Software
// prefetch of the strided B rows and copying them to a contiguous buffer first were both measured:
// neither was faster on Sapphire Rapids.)
BNB_MS_TARGET_AMX void amx_block(const BTileSrc &b0, const BTileSrc &b1, bool two_n, const int8_t *pa0,
                                 const int8_t *pa1, bool two_m, int64_t Ks, int32_t *cs) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t ks = 0; ks < Ks; ++ks) {
    const bool last = ks + 1 == Ks;
    const int8_t *p0 = (last && b0.tail) ? b0.tail : b0.p + 64 * ks;
    const int64_t s0 = (last && b0.tail) ? 64 : b0.stride;
    _tile_loadd(4, p0, s0);
    _tile_loadd(6, pa0 + 1024 * ks, 64);
    _tile_dpbssd(0, 4, 6);
    if (two_m) {
      _tile_loadd(7, pa1 + 1024 * ks, 64);
      _tile_dpbssd(1, 4, 7);
    }
    if (two_n) {
      const int8_t *p1 = (last && b1.tail) ? b1.tail : b1.p + 64 * ks;
      const int64_t s1 = (last && b1.tail) ? 64 : b1.stride;
      _tile_loadd(5, p1, s1);
      _tile_dpbssd(2, 5, 6);
      if (two_m) _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, cs, 64);
  if (two_m) _tile_stored(1, cs + 256, 64);
  if (two_n) {
    _tile_stored(2, cs + 512, 64);
    if (two_m) _tile_stored(3, cs + 768, 64);
  }
}

}  // namespace

void int8_gemm_amx(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const int64_t Ks = (K + 63) / 64, Kpad = 64 * Ks, Mt = (M + 15) / 16, Nt = (N + 15) / 16;
  const int64_t ktail = K % 64;
  // Packed A: tile (mt, ks) is 1024 bytes at (mt * Ks + ks) * 1024; byte r * 64 + 4 m + q holds
  // A[16 mt + m][64 ks + 4 r + q] (zero outside A).
  std::vector<int8_t> P((size_t)(Mt * Ks * 1024), 0);
  parallel_for(Mt, std::max<int64_t>(1, 4096 / Kpad), [&](int64_t t0, int64_t t1) {
    for (int64_t mt = t0; mt < t1; ++mt)
      for (int64_t m = 0; m < 16 && mt * 16 + m < M; ++m) {
        const int8_t *a = A + (mt * 16 + m) * K;
        int8_t *dst = P.data() + mt * Ks * 1024 + 4 * m;
        for (int64_t k = 0; k < K; ++k) dst[(k >> 6) * 1024 + ((k & 63) >> 2) * 64 + (k & 3)] = a[k];
      }
  });
  const int64_t Ng = (Nt + 1) / 2, Mg = (Mt + 1) / 2;  // groups of two 16-row tiles
  // m-groups per pass: their packed A (2 x Ks KiB each) stays within about 1 MiB of L2
  const int64_t mg_block = std::max<int64_t>(1, 512 / Ks);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(8, Ng / (4 * (int64_t)max_threads())));
  const bool par = (double)M * (double)N * (double)K >= (double)(1 << 20);
  parallel_chunks(Ng, chunk, par, [&](int64_t g0, int64_t g1) {
    const int64_t t_begin = 2 * g0, t_end = std::min(2 * g1, Nt);
    std::vector<BTileSrc> src((size_t)(t_end - t_begin));
    std::vector<int8_t> kt(ktail ? (size_t)(t_end - t_begin) * 1024 : 0, 0), nt;
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int64_t n0 = 16 * t, rows = std::min<int64_t>(16, N - n0);
      BTileSrc &s = src[(size_t)(t - t_begin)];
      if (rows < 16) {  // last tile of B: zero-padded 16 x Kpad copy
        nt.assign((size_t)(16 * Kpad), 0);
        for (int64_t r = 0; r < rows; ++r) std::memcpy(nt.data() + r * Kpad, B + (n0 + r) * K, (size_t)K);
        s = BTileSrc{nt.data(), Kpad, nullptr};
      } else {
        s = BTileSrc{B + n0 * K, K, nullptr};
        if (ktail) {  // last partial k-step: zero-padded 16 x 64 copy
          int8_t *d = kt.data() + (t - t_begin) * 1024;
          for (int64_t r = 0; r < 16; ++r) std::memcpy(d + r * 64, B + (n0 + r) * K + (Ks - 1) * 64, (size_t)ktail);
          s.tail = d;
        }
      }
    }
    alignas(64) int32_t cs[4 * 256];
    amx_configure();
    for (int64_t mb = 0; mb < Mg; mb += mg_block) {
      const int64_t me = std::min(Mg, mb + mg_block);
      for (int64_t t = t_begin; t < t_end; t += 2) {
        const bool two_n = t + 1 < t_end;
        const BTileSrc &b0 = src[(size_t)(t - t_begin)];
        const BTileSrc &b1 = two_n ? src[(size_t)(t + 1 - t_begin)] : b0;
        for (int64_t mg = mb; mg < me; ++mg) {
          const int64_t u = 2 * mg;
          const bool two_m = u + 1 < Mt;
          const int8_t *pa0 = P.data() + u * Ks * 1024;
          amx_block(b0, b1, two_n, pa0, two_m ? pa0 + Ks * 1024 : pa0, two_m, Ks, cs);
          for (int ni = 0; ni < (two_n ? 2 : 1); ++ni)
            for (int mi = 0; mi < (two_m ? 2 : 1); ++mi) {
              const int32_t *ct = cs + (2 * ni + mi) * 256;
              const int64_t nbase = 16 * (t + ni), mbase = 16 * (u + mi);
              const int64_t nn = std::min<int64_t>(16, N - nbase), mm = std::min<int64_t>(16, M - mbase);
              for (int64_t m = 0; m < mm; ++m) {
                int32_t *crow = C + (mbase + m) * N + nbase;
                for (int64_t n = 0; n < nn; ++n) crow[n] = ct[n * 16 + m];
              }
            }
        }
      }
    }
    amx_release();
  });
}

}  // namespace bnb_ms
