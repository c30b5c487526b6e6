// cpu_features.h -- CPUID-based feature detection, done once at library load.
#pragma once
#include <cstdint>

namespace bnb_ms {

enum CpuFeature : uint32_t {
  CPU_AVX2 = 1u << 0,
  CPU_FMA = 1u << 1,
  CPU_F16C = 1u << 2,
  CPU_AVX512F = 1u << 3,
  CPU_AVX512BW = 1u << 4,
  CPU_AVX512VL = 1u << 5,
  CPU_AVX512DQ = 1u << 6,
  CPU_AVX512VNNI = 1u << 7,
  CPU_AVXVNNI = 1u << 8,
  CPU_AVX512BF16 = 1u << 9,
  CPU_AMX_INT8 = 1u << 10,   // hardware bit AND the OS granted the AMX tile state
  CPU_AMX_BF16 = 1u << 11,
  CPU_AVX512VBMI = 1u << 12,  // vpermb / vpermi2b (byte-table lookups)
};

uint32_t cpu_features();

// SIMD level the kernels dispatch on; BNB_MS_SIMD=scalar|avx2|avx512 in the environment can lower it
// (for testing the portable paths on a machine that has more).
enum class SimdLevel : int { scalar = 0, avx2 = 1, avx512 = 2 };
SimdLevel simd_level();
inline bool has_avx512() { return simd_level() >= SimdLevel::avx512; }
inline bool has_avx2() { return simd_level() >= SimdLevel::avx2; }
inline bool has_avx512vbmi() { return has_avx512() && (cpu_features() & CPU_AVX512VBMI); }
// The CPU's maker is Intel (cpuid vendor "GenuineIntel"): for the few kernel choices measured to go opposite ways on
// Intel and AMD CPUs of the same SIMD level (each such place says what was measured where).
bool cpu_is_intel();

}  // namespace bnb_ms

// GCC/Clang target attributes for the SIMD variants of each kernel.
#define BNB_MS_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BNB_MS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define BNB_MS_TARGET_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c")))
#define BNB_MS_INLINE inline __attribute__((always_inline))
