// The int8 tile loop on ARM, as arch/arm/q4_tile.h is the int4 one (the same guarantee: the
// plain-C q8_tile's results, bit for bit). int8 bytes are q + 128 (q8_tile's comment in
// vo_kernels.cpp), turned back to q by flipping the top bit, so that SDOT multiplies q by the
// signed activations directly.

#pragma once

#include "common.h"

namespace {

// f[i][g & 1] += the scaled sums of int8 group g (bytes x) for rows 4i .. 4i + 3 (i < 8), without
// the row scales.
inline void q8_group_neon(const uint8_t* x, const Act& a, int64_t g, float32x4_t (*f)[2]) {
    VO_MCA_BEGIN("q8_group");
    const int8_t* q = a.q + g * 32;
    const uint8x16_t flip = vdupq_n_u8(0x80);
    int32x4_t s[8];  // rows 4i .. 4i + 3: quarter i % 4 of line 2j (i < 4) or 2j + 1 (rows 16 ..)
    for (auto& si : s) si = vdupq_n_s32(0);
    for (int j = 0; j < 8; ++j) {
        const int8x16_t aw = act_lanes(q, j);
        for (int i = 0; i < 8; ++i) {
            const uint8x16_t b = vld1q_u8(x + 128 * j + 16 * i);
            s[i] = vdotq_s32(s[i], vreinterpretq_s8_u8(veorq_u8(b, flip)), aw);
        }
    }
    for (int i = 0; i < 8; ++i) f[i][g & 1] = vfmaq_n_f32(f[i][g & 1], vcvtq_f32_s32(s[i]), a.d[g]);
    VO_MCA_END();
}

inline void q8_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    float32x4_t f[8][2];
    for (auto& fi : f) fi[0] = fi[1] = vdupq_n_f32(0.f);
    for (int64_t g = 0; g < cols / 32; ++g) q8_group_neon(w + g * Q8_GROUP_BYTES, a, g, f);
    for (int i = 0; i < 8; ++i) vst1q_f32(out + 4 * i, vaddq_f32(f[i][0], f[i][1]));
}

}  // namespace
