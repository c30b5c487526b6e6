// cpu_features.cpp -- run-time CPU feature detection and the diagnostics entry points.
#include "cpu/cpu_features.h"

#include <cpuid.h>
#include <cstdlib>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

#include "aot.h"

namespace bnb_ms {
namespace {

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

// Linux needs an explicit request before a process may use AMX tile data.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
  constexpr int XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return false;
#endif
}

uint32_t detect() {
  uint32_t f = 0;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
  if (!osxsave || !avx) return 0;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_ok = (xcr0 & 0x6) == 0x6;
  const bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
  const bool amx_ok = (xcr0 & (3ull << 17)) == (3ull << 17);
  if (!ymm_ok) return 0;
  if (fma) f |= CPU_FMA;
  if (f16c) f |= CPU_F16C;
  __cpuid_count(7, 0, a, b, c, d);
  if (b & (1u << 5)) f |= CPU_AVX2;
  if (zmm_ok) {
    if (b & (1u << 16)) f |= CPU_AVX512F;
    if (b & (1u << 17)) f |= CPU_AVX512DQ;
    if (b & (1u << 30)) f |= CPU_AVX512BW;
    if (b & (1u << 31)) f |= CPU_AVX512VL;
    if (c & (1u << 11)) f |= CPU_AVX512VNNI;
    if (c & (1u << 1)) f |= CPU_AVX512VBMI;
  }
  const bool amx_int8 = d & (1u << 25), amx_bf16 = d & (1u << 22);
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  if (a1 & (1u << 4)) f |= CPU_AVXVNNI;
  if (zmm_ok && (a1 & (1u << 5))) f |= CPU_AVX512BF16;
  if (amx_ok && (amx_int8 || amx_bf16) && request_amx_permission()) {
    if (amx_int8) f |= CPU_AMX_INT8;
    if (amx_bf16) f |= CPU_AMX_BF16;
  }
  return f;
}

SimdLevel detect_level(uint32_t f) {
  SimdLevel hw = SimdLevel::scalar;
  constexpr uint32_t avx2 = CPU_AVX2 | CPU_FMA | CPU_F16C;
  constexpr uint32_t avx512 = avx2 | CPU_AVX512F | CPU_AVX512BW | CPU_AVX512VL | CPU_AVX512DQ;
  if ((f & avx512) == avx512) hw = SimdLevel::avx512;
  else if ((f & avx2) == avx2) hw = SimdLevel::avx2;
  const char *env = std::getenv("BNB_MS_SIMD");
  if (env) {
    SimdLevel want = hw;
    if (!std::strcmp(env, "scalar")) want = SimdLevel::scalar;
    else if (!std::strcmp(env, "avx2")) want = SimdLevel::avx2;
    else if (!std::strcmp(env, "avx512") || !std::strcmp(env, "avx512-novbmi")) want = SimdLevel::avx512;
    if (want < hw) hw = want;  // only ever lower it
  }
  return hw;
}

}  // namespace

// BNB_MS_SIMD=avx512-novbmi also hides AVX-512 VBMI, so a VBMI machine runs (and the tests check) the AVX-512 paths
// of CPUs without it (Skylake-X, Cascade Lake): gathers instead of in-register byte tables.
uint32_t cpu_features() {
  static const uint32_t f = [] {
    uint32_t x = detect();
    const char *env = std::getenv("BNB_MS_SIMD");
    if (env && !std::strcmp(env, "avx512-novbmi")) x &= ~(uint32_t)CPU_AVX512VBMI;
    return x;
  }();
  return f;
}

bool cpu_is_intel() {
  static const bool intel = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char v[13];
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &c, 4);
    v[12] = 0;
    return std::strcmp(v, "GenuineIntel") == 0;
  }();
  return intel;
}

SimdLevel simd_level() {
  static const SimdLevel l = detect_level(cpu_features());
  return l;
}

}  // namespace bnb_ms

// Plain C helpers for diagnostics (called through ctypes, not MindSpore).
BNB_MS_EXPORT uint32_t bnb_ms_cpu_features() { return bnb_ms::cpu_features(); }
BNB_MS_EXPORT int bnb_ms_simd_level() { return (int)bnb_ms::simd_level(); }
BNB_MS_EXPORT int bnb_ms_abi_version() { return 1; }
