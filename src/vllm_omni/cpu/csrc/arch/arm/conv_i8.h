// The int8 convolution tap loop on ARM: NEON with the dot product (Armv8.2-A +dotprod: the
// Raspberry Pi 5's Cortex-A76, the Jetson Orin's A78AE, Neoverse, Apple's cores).
//
// Included by vo_decoder.cpp, where the layouts (its int8 section), the tap's contract and the
// plain-C loop are defined: conv_i8_tap fills acc[32][32] (32 output channels by 32 samples) with
// one tap's integer sums. SDOT multiplies signed bytes by signed bytes: the input is stored as q.

#pragma once

#include <arm_neon.h>

namespace {

constexpr int32_t I8_OFFSET = 0;

// Four channels by 16 samples at a time (16 accumulators of 4 samples): each input quad's four
// 4-sample vectors against each channel's four weights in all four lanes.
inline void conv_i8_tap(const int8_t* w0, int64_t kb_n, const uint8_t* xp, int64_t row, int64_t cb_n, int64_t j,
                        int64_t d, int64_t t0, int32_t* acc) {
    for (int64_t c4 = 0; c4 < 32; c4 += 4) {
        const int8_t* w = w0 + (c4 / 16) * kb_n * I8_TILE + (c4 % 16) * 32;
        for (int64_t h = 0; h < 32; h += 16) {
            int32x4_t s[4][4];
            for (auto& r : s)
                for (auto& v : r) v = vdupq_n_s32(0);
            for (int64_t cb = 0; cb < cb_n; ++cb) {
                const int8_t* wt = w + (j * cb_n + cb) * I8_TILE;
                const int8_t* b = (const int8_t*)xp + (cb * 8 * row + t0 + j * d + h) * 4;
                for (int kk = 0; kk < 8; ++kk) {
                    VO_MCA_BEGIN("i8_conv_sdot");  // 4 inputs for 4 channels by 16 samples: 256 multiply-adds
                    const int8_t* bk = b + kk * row * 4;
                    const int8x16_t x[4] = {vld1q_s8(bk), vld1q_s8(bk + 16), vld1q_s8(bk + 32), vld1q_s8(bk + 48)};
                    for (int r = 0; r < 4; ++r) {
                        int32_t quad;
                        std::memcpy(&quad, wt + r * 32 + 4 * kk, 4);
                        const int8x16_t wv = vreinterpretq_s8_s32(vdupq_n_s32(quad));
                        for (int q = 0; q < 4; ++q) s[r][q] = vdotq_s32(s[r][q], x[q], wv);
                    }
                    VO_MCA_END();
                }
            }
            for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 4; ++q) vst1q_s32(acc + (c4 + r) * 32 + h + 4 * q, s[r][q]);
        }
    }
}

}  // namespace
