// The fp32 row dots on ARM: NEON fused multiply-adds, four 128-bit accumulators a row over 16
// inputs at a time, each row summed on its own whatever the rows beside it (as the x86 form,
// arch/x86/f32_dot.h). They agree with the plain C in vo_kernels.cpp within rounding (it neither
// fuses nor sums in this order); tests/test_arm_emulation.py holds them to the x86 tests' fp32
// tolerance.

#pragma once

#include <arm_neon.h>

namespace {

template <int N>
inline void dot_f32_rows(const float* const* w, const float* a, int64_t n, float* out) {
    float32x4_t s[N][4];
    for (auto& sk : s) sk[0] = sk[1] = sk[2] = sk[3] = vdupq_n_f32(0.f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float32x4_t a0 = vld1q_f32(a + i), a1 = vld1q_f32(a + i + 4), a2 = vld1q_f32(a + i + 8),
                          a3 = vld1q_f32(a + i + 12);
        for (int k = 0; k < N; ++k) {
            s[k][0] = vfmaq_f32(s[k][0], vld1q_f32(w[k] + i), a0);
            s[k][1] = vfmaq_f32(s[k][1], vld1q_f32(w[k] + i + 4), a1);
            s[k][2] = vfmaq_f32(s[k][2], vld1q_f32(w[k] + i + 8), a2);
            s[k][3] = vfmaq_f32(s[k][3], vld1q_f32(w[k] + i + 12), a3);
        }
    }
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < N; ++k) s[k][0] = vfmaq_f32(s[k][0], vld1q_f32(w[k] + i), vld1q_f32(a + i));
    for (int k = 0; k < N; ++k) {
        float t = vaddvq_f32(vaddq_f32(vaddq_f32(s[k][0], s[k][1]), vaddq_f32(s[k][2], s[k][3])));
        for (int64_t j = i; j < n; ++j) t += w[k][j] * a[j];
        out[k] = t;
    }
}

}  // namespace
