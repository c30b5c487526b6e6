// powf_square_check.cpp -- simd_math.h's square_powf(x) against glibc's powf(x, 2) for every positive float
// (RMSNorm squares as MindSpore's Pow does: glibc powf, which rounds ~0.07% of the squares, those within
// 0.0017 ulp of a tie, the other way than x * x).  Prints the mismatches of the rule (0 expected) and how far
// from a tie powf and x * x part, per binade.  ~1 minute:
//   g++ -O2 -ffp-contract=off -std=c++17 -Icsrc tools/dev/powf_square_check.cpp csrc/cpu/cpu_features.cpp -o /tmp/pc && /tmp/pc
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cpu/simd_math.h"

int main() {
  float (*volatile pw)(float, float) = powf;
  int64_t rule_bad = 0, differ = 0;
  double min_frac = 1.0;
  for (uint32_t b = 1; b < 0x7f800000u; ++b) {
    float x;
    std::memcpy(&x, &b, 4);
    const float q = pw(x, 2.0f);
    if (bnb_ms::simd_math::square_powf(x) != q && !(q != q)) ++rule_bad;
    const float p = x * x;
    if (p == q || !(p >= 0x1p-100f) || !(p <= FLT_MAX)) continue;
    ++differ;
    uint32_t pb;
    std::memcpy(&pb, &p, 4);
    const uint32_t ub = (pb & 0x7f800000u) - (23u << 23);
    float ulp;
    std::memcpy(&ulp, &ub, 4);
    const double f = std::fabs((double)std::fma(x, x, -p) / ulp);
    if (f < min_frac) min_frac = f;
  }
  std::printf("powf(x, 2) != x * x for %lld normal squares, all within %.6f ulp of a tie; square_powf != powf: %lld\n",
              (long long)differ, 0.5 - min_frac, (long long)rule_bad);
  return rule_bad != 0;
}
