// The int8 convolution tap loop on x86: AVX-512 VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later).
//
// Included by vo_decoder.cpp, where the layouts (its int8 section), the tap's contract and the
// plain-C loop are defined: conv_i8_tap fills acc[32][32] (32 output channels by 32 samples) with
// one tap's integer sums. VPDPBUSD multiplies unsigned bytes by signed ones, so the input is
// stored as q + 128 (I8_OFFSET) and the scaling takes 128 times the tap's weight sum off again.

#pragma once

#include <immintrin.h>

namespace {

constexpr int32_t I8_OFFSET = 128;

// Eight channels by 32 samples at a time (16 accumulators): each input quad's two 16-sample
// vectors against each channel's four weights broadcast, four times for the 32 channels.
inline void conv_i8_tap(const int8_t* w0, int64_t kb_n, const uint8_t* xp, int64_t row, int64_t cb_n, int64_t j,
                        int64_t d, int64_t t0, int32_t* acc) {
    for (int64_t c8 = 0; c8 < 32; c8 += 8) {
        const int8_t* w = w0 + (c8 / 16) * kb_n * I8_TILE + (c8 % 16) * 32;
        __m512i c[8][2];
        for (auto& r : c) r[0] = r[1] = _mm512_setzero_si512();
        for (int64_t cb = 0; cb < cb_n; ++cb) {
            const int8_t* wt = w + (j * cb_n + cb) * I8_TILE;
            const uint8_t* b = xp + (cb * 8 * row + t0 + j * d) * 4;
            for (int kk = 0; kk < 8; ++kk) {
                VO_MCA_BEGIN("i8_conv_vnni");  // 4 inputs for 8 channels by 32 samples: 1024 multiply-adds
                const __m512i x0 = _mm512_loadu_si512(b + kk * row * 4);
                const __m512i x1 = _mm512_loadu_si512(b + kk * row * 4 + 64);
                for (int r = 0; r < 8; ++r) {
                    int32_t quad;
                    std::memcpy(&quad, wt + r * 32 + 4 * kk, 4);
                    const __m512i wv = _mm512_set1_epi32(quad);
                    c[r][0] = _mm512_dpbusd_epi32(c[r][0], x0, wv);
                    c[r][1] = _mm512_dpbusd_epi32(c[r][1], x1, wv);
                }
                VO_MCA_END();
            }
        }
        for (int r = 0; r < 8; ++r) {
            _mm512_storeu_si512(acc + (c8 + r) * 32, c[r][0]);
            _mm512_storeu_si512(acc + (c8 + r) * 32 + 16, c[r][1]);
        }
    }
}

}  // namespace
