// amx_tiles.h -- the AMX tile state as the library's AMX kernels use it (int8_gemm_amx.cpp, fourbit.cpp's bf16
// GEMM): 8 tiles of 16 rows x 64 bytes, configured per thread (ldtilecfg) and released after.  Only where
// cpu_features() reports the AMX bit (the OS granted the tile state: cpu_features.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define BNB_MS_TARGET_AMX_TILE __attribute__((target("amx-tile")))

namespace bnb_ms {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "tile configuration is 64 bytes");

BNB_MS_TARGET_AMX_TILE inline void amx_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // ldtilecfg's intrinsic names only the first bytes of cfg as its memory operand: make sure every
  // byte written above is in memory before it runs.
  __asm__ volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

BNB_MS_TARGET_AMX_TILE inline void amx_release() { _tile_release(); }

}  // namespace bnb_ms
