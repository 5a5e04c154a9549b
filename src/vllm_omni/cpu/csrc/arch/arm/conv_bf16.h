// The bf16 convolution tile loop on ARM: BFDOT (Armv8.6-A's BF16 extension, or Armv8.2-A with
// +bf16: Neoverse-V1, V2, N2; Apple M2 and later).
//
// Included by vo_decoder.cpp, where the layouts (the comment above its convolution section), the
// tile pair's contract and the plain-C loop are defined; the x86 forms are arch/x86/conv_bf16.h.

#pragma once

#include <arm_neon.h>

namespace {

// Four channels by 16 samples at a time (16 accumulators of four lanes): each pair of input
// channels holds four samples' two values in one 8-lane bf16 register, and BFDOT adds each
// sample's two products to its lane, against the channel's weight pair in every lane. Eight
// groups of channels, two halves of the 32 samples.
inline void conv_tile_pair(const uint16_t* w0, int64_t kb_n, const uint16_t* xp, int64_t row, int64_t cb_n,
                           int64_t k, int64_t d, int64_t t0, float* acc) {
    for (int64_t h = 0; h < 32; h += 16)
        for (int64_t c4 = 0; c4 < 32; c4 += 4) {
            const uint16_t* w = w0 + (c4 / 16) * kb_n * 512 + (c4 % 16) * 32;
            float32x4_t c[4][4];
            for (auto& r : c)
                for (auto& q : r) q = vdupq_n_f32(0.0f);
            for (int64_t j = 0; j < k; ++j) {
                for (int64_t cb = 0; cb < cb_n; ++cb) {
                    const uint16_t* wt = w + (j * cb_n + cb) * 512;
                    const uint16_t* b = xp + (cb * 16 * row + t0 + h + j * d) * 2;
                    for (int kk = 0; kk < 16; ++kk) {
                        const uint16_t* bx = b + kk * row * 2;
                        bfloat16x8_t x[4];
                        for (int q = 0; q < 4; ++q) x[q] = vreinterpretq_bf16_u16(vld1q_u16(bx + 8 * q));
                        for (int r = 0; r < 4; ++r) {
                            uint32_t pair;
                            std::memcpy(&pair, wt + r * 32 + 2 * kk, 4);
                            const bfloat16x8_t wv = vreinterpretq_bf16_u32(vdupq_n_u32(pair));
                            for (int q = 0; q < 4; ++q) c[r][q] = vbfdotq_f32(c[r][q], wv, x[q]);
                        }
                    }
                }
            }
            for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 4; ++q) vst1q_f32(acc + (c4 + r) * 32 + h + 4 * q, c[r][q]);
        }
}

struct TileScope {};

}  // namespace
