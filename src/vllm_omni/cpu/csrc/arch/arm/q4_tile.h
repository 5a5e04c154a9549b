// The int4 tile loop on ARM: NEON with the dot product (Armv8.2-A +dotprod: Cortex-A76 in a
// Raspberry Pi 5, A78AE in a Jetson Orin, Neoverse-N1, and every later core).
//
// Included by vo_kernels.cpp where the int4 tile layout (q4_tile's comment), Act and the plain-C
// loop are defined; the x86 forms are arch/x86/q4_tile.h. It computes exactly
// what the plain-C q4_tile computes, in the same order of floating-point operations: a group's
// integer sums are exact in int32 however they are added, and each is then turned to float,
// scaled and fused-multiply-added into the accumulator of its group's parity as the plain C does
// (std::fma), so the results are the same bits (tests/test_arm_emulation.py checks them under
// qemu against the x86 plain-C build).
//
// A 16-byte quarter of a tile line holds rows 4i .. 4i + 3 (four bytes each, the inputs 4j ..
// 4j + 3), row r in the low nibbles and row 16 + r in the high ones: one SDOT of a quarter's
// nibbles against the activation word in all four lanes adds those rows' sums for four inputs.

#pragma once

#include "common.h"

namespace {

// f[i][g & 1] += the scaled sums of int4 group g (bytes x) for rows 4i .. 4i + 3 (i < 8).
inline void q4_group_neon(const uint8_t* x, const Act& a, int64_t g, float32x4_t (*f)[2]) {
    VO_MCA_BEGIN("q4_group");
    const int8_t* q = a.q + g * 32;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    int32x4_t s[8];  // rows 4i .. 4i + 3; i >= 4: the high nibbles, rows 16 + 4(i - 4) ..
    for (auto& si : s) si = vdupq_n_s32(a.gcorr[2 * g]);  // the nibbles' offset of 8, once per row
    for (int j = 0; j < 8; ++j) {
        const int8x16_t aw = act_lanes(q, j);
        for (int i = 0; i < 4; ++i) {
            const uint8x16_t b = vld1q_u8(x + 64 + 64 * j + 16 * i);
            s[i] = vdotq_s32(s[i], vreinterpretq_s8_u8(vandq_u8(b, m4)), aw);
            s[4 + i] = vdotq_s32(s[4 + i], vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), aw);
        }
    }
    const float d = a.d[g];
    for (int i = 0; i < 8; ++i) {  // the row scales are the group's first 64 bytes, 32 halves in row order
        const float32x4_t scale = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)x + 4 * i))), d);
        f[i][g & 1] = vfmaq_f32(f[i][g & 1], vcvtq_f32_s32(s[i]), scale);
    }
    VO_MCA_END();
}

inline void q4_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    float32x4_t f[8][2];
    for (auto& fi : f) fi[0] = fi[1] = vdupq_n_f32(0.f);
    for (int64_t g = 0; g < cols / 32; ++g) q4_group_neon(w + g * Q4_GROUP_BYTES, a, g, f);
    for (int i = 0; i < 8; ++i) vst1q_f32(out + 4 * i, vaddq_f32(f[i][0], f[i][1]));
}

}  // namespace
