// The fp32 row dots on x86 (AVX2 with FMA; the AVX-512 build runs them too, see dot_f32_rows'
// comment in vo_kernels.cpp). The ARM form is arch/arm/f32_dot.h; the plain C in vo_kernels.cpp
// sums in another order, so the builds agree within rounding, not bit for bit.

#pragma once

#include <immintrin.h>

namespace {

template <int N>
inline void dot_f32_rows(const float* const* w, const float* a, int64_t n, float* out) {
    __m256 s[N][4];
    for (auto& sk : s) sk[0] = sk[1] = sk[2] = sk[3] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8), a2 = _mm256_loadu_ps(a + i + 16),
                     a3 = _mm256_loadu_ps(a + i + 24);
        for (int k = 0; k < N; ++k) {
            s[k][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w[k] + i), a0, s[k][0]);
            s[k][1] = _mm256_fmadd_ps(_mm256_loadu_ps(w[k] + i + 8), a1, s[k][1]);
            s[k][2] = _mm256_fmadd_ps(_mm256_loadu_ps(w[k] + i + 16), a2, s[k][2]);
            s[k][3] = _mm256_fmadd_ps(_mm256_loadu_ps(w[k] + i + 24), a3, s[k][3]);
        }
    }
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < N; ++k) s[k][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w[k] + i), _mm256_loadu_ps(a + i), s[k][0]);
    for (int k = 0; k < N; ++k) {
        float t = hsum256(_mm256_add_ps(_mm256_add_ps(s[k][0], s[k][1]), _mm256_add_ps(s[k][2], s[k][3])));
        for (int64_t j = i; j < n; ++j) t += w[k][j] * a[j];
        out[k] = t;
    }
}

}  // namespace
