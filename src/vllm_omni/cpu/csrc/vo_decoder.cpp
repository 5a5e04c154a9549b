// Kernels of the 12 Hz speech decoder (code2wav) that PyTorch does poorly at streaming sizes.
//
// SnakeBeta, y = x + inv_b[c] * sin(a[c] * x)^2 per channel c, is about 2.8 million sines per
// 80 ms frame, most of them at 24 kHz over 96 channels; as four separate tensor passes (mul, sin,
// pow, add) it took longer than the convolutions around it. Here it is one pass with a
// range-reduced polynomial sine: sin(u)^2 = sin(r)^2 with r = u - k*pi in [-pi/2, pi/2], a
// degree-11 odd polynomial for sin(r) (absolute error below 1e-7 on that range, about the
// rounding of fp32), and Cody-Waite reduction with pi split in three, so large |u| keep their
// accuracy. Channels are split across threads; the inner loop vectorises.
//
// Built into the same library as vo_kernels.cpp (vllm_omni.cpu.native); the Python side owns
// every buffer.

#include <cmath>
#include <cstdint>

#include <omp.h>

namespace {

inline float sin2_reduced(float u) {
    constexpr float inv_pi = 0.318309886183790672f;
    constexpr float pi_a = 3.140625f, pi_b = 9.67502593994140625e-4f, pi_c = 1.50995799e-7f;
    const float k = std::nearbyint(u * inv_pi);
    float r = u - k * pi_a;
    r -= k * pi_b;
    r -= k * pi_c;
    const float r2 = r * r;
    // sin(r) = r (1 - r^2/3! + r^4/5! - ...), Taylor to r^11 (error < 6e-8 for |r| <= pi/2)
    float p = -2.50521084e-8f;
    p = p * r2 + 2.75573192e-6f;
    p = p * r2 - 1.98412698e-4f;
    p = p * r2 + 8.33333333e-3f;
    p = p * r2 - 1.66666667e-1f;
    p = p * r2 + 1.0f;
    const float s = r * p;
    return s * s;
}

}  // namespace

extern "C" {

// y[c, t] = x[c, t] + inv_b[c] * sin(a[c] * x[c, t])^2 for a [C, T] row-major block (y may be x).
void vo_snake(const float* x, float* y, int64_t C, int64_t T, const float* a, const float* inv_b, int32_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads()) if (C * T >= 16384)
    for (int64_t c = 0; c < C; ++c) {
        const float ac = a[c], bc = inv_b[c];
        const float* xr = x + c * T;
        float* yr = y + c * T;
#pragma omp simd
        for (int64_t t = 0; t < T; ++t) yr[t] = xr[t] + bc * sin2_reduced(ac * xr[t]);
    }
}

}  // extern "C"
