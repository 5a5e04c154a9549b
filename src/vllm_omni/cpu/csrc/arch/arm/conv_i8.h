// The int8 convolution tap loops on ARM: NEON with the dot product (Armv8.2-A +dotprod: the
// Raspberry Pi 5's Cortex-A76, the Jetson Orin's A78AE, Neoverse, Apple's cores), and with the
// int8 matrix multiply where the core has it (i8mm, Armv8.6-A: Neoverse-V1 and V2, Apple M2 and
// later).
//
// Included by vo_decoder.cpp, where the layouts (its int8 section), the tap's contract and the
// plain-C loop are defined: conv_i8_tap fills acc[32][32] (32 output channels by 32 samples) with
// one tap's integer sums. SDOT and SMMLA multiply signed bytes by signed bytes: the input is
// stored as q. The sums are integers, so both loops give the plain C's exactly.

#pragma once

#include <arm_neon.h>

namespace {

constexpr int32_t I8_OFFSET = 0;

#if defined(__ARM_FEATURE_MATMUL_INT8)
// Eight channels by eight samples at a time (16 accumulators, each two channels by two samples):
// SMMLA multiplies a 2 x 8 block of weights (two channels' rows, 8 inputs) by a 2 x 8 block of
// inputs (two samples, the same 8 inputs: two quads of channels, zipped from their two rows of
// the packed input) into the four sums of a 2 x 2 block, 32 multiply-adds an instruction where
// SDOT makes 16.
inline void conv_i8_tap(const int8_t* w0, int64_t kb_n, const uint8_t* xp, int64_t row, int64_t cb_n, int64_t j,
                        int64_t d, int64_t t0, int32_t* acc) {
    for (int64_t c8 = 0; c8 < 32; c8 += 8) {
        const int8_t* w = w0 + (c8 / 16) * kb_n * I8_TILE + (c8 % 16) * 32;
        for (int64_t s8 = 0; s8 < 32; s8 += 8) {
            int32x4_t s[4][4];  // [channel pair][sample pair]
            for (auto& r : s)
                for (auto& v : r) v = vdupq_n_s32(0);
            for (int64_t cb = 0; cb < cb_n; ++cb) {
                const int8_t* wt = w + (j * cb_n + cb) * I8_TILE;
                const int8_t* b = (const int8_t*)xp + (cb * 8 * row + t0 + j * d + s8) * 4;
                for (int g = 0; g < 4; ++g) {  // inputs 8g .. 8g + 7 of the block: quads 2g and 2g + 1
                    VO_MCA_BEGIN("i8_conv_i8mm");  // 8 inputs for 8 channels by 8 samples: 512 multiply-adds
                    int8x16_t a[4], x[4];
                    for (int p = 0; p < 4; ++p)
                        a[p] = vcombine_s8(vld1_s8(wt + (2 * p) * 32 + 8 * g), vld1_s8(wt + (2 * p + 1) * 32 + 8 * g));
                    const int8_t* q0 = b + (2 * g) * row * 4;
                    const int8_t* q1 = q0 + row * 4;
                    for (int h = 0; h < 2; ++h) {  // samples 4h .. 4h + 3: pairs (0, 1) and (2, 3) of the two quads
                        const int32x4_t lo = vreinterpretq_s32_s8(vld1q_s8(q0 + 16 * h));
                        const int32x4_t hi = vreinterpretq_s32_s8(vld1q_s8(q1 + 16 * h));
                        x[2 * h] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
                        x[2 * h + 1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
                    }
                    for (int p = 0; p < 4; ++p)
                        for (int q = 0; q < 4; ++q) s[p][q] = vmmlaq_s32(s[p][q], a[p], x[q]);
                    VO_MCA_END();
                }
            }
            for (int p = 0; p < 4; ++p)  // lanes: (c, t), (c, t + 1), (c + 1, t), (c + 1, t + 1)
                for (int q = 0; q < 4; ++q) {
                    int32_t* out = acc + (c8 + 2 * p) * 32 + s8 + 2 * q;
                    vst1_s32(out, vget_low_s32(s[p][q]));
                    vst1_s32(out + 32, vget_high_s32(s[p][q]));
                }
        }
    }
}
#else
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

#endif

}  // namespace
