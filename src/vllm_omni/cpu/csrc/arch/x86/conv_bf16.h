// The bf16 convolution tile loops on x86: AMX (Sapphire Rapids and later) and AVX-512 BF16
// (Cooper Lake, Zen 4 and later).
//
// Included by vo_decoder.cpp, where the layouts (the comment above its convolution section), the
// tile pair's contract and the plain-C loop are defined: each loop fills acc[32][32] (32 output
// channels by 32 samples, fp32) with the sums over every tap and input channel.

#pragma once

#include <immintrin.h>

namespace {

// out[2i] = bf16(a[i]), out[2i + 1] = bf16(b[i]): two channels' samples interleaved, 16 at a time
// (vcvtneps2bf16 rounds to nearest even, as to_bf16, and reads denormals as zero).
inline void interleave_bf16(const float* a, const float* b, int64_t n, uint16_t* out) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + i));
        const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(b + i));
        const __m512i both = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
        _mm512_storeu_si512(out + 2 * i, _mm512_permutexvar_epi16(order, both));
    }
    for (; i < n; ++i) {
        out[2 * i] = to_bf16(a[i]);
        out[2 * i + 1] = to_bf16(b[i]);
    }
}

#if defined(VO_AMX_BF16)
// Tiles 0-3 accumulate (channels 0-15 | 16-31) x (samples 0-15 | 16-31); 4-5 hold the two weight
// tiles (A: 16 channels x 32 inputs), 6-7 the two input tiles (B: 16 input pairs x 16 samples).
inline void conv_tile_pair(const uint16_t* w0, int64_t kb_n, const uint16_t* xp, int64_t row, int64_t cb_n,
                           int64_t k, int64_t d, int64_t t0, float* acc) {
    const uint16_t* w1 = w0 + kb_n * 512;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t j = 0; j < k; ++j) {
        for (int64_t cb = 0; cb < cb_n; ++cb) {
            const int64_t kb = j * cb_n + cb;
            const uint16_t* b = xp + (cb * 16 * row + t0 + j * d) * 2;
            _tile_loadd(4, w0 + kb * 512, 64);
            _tile_loadd(6, b, row * 4);
            _tile_loadd(5, w1 + kb * 512, 64);
            _tile_loadd(7, b + 32, row * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 512, 128);
    _tile_stored(3, acc + 528, 128);
}

// The same sums for samples t0 .. t0 + 15 only (acc columns 16-31 left as they are): the calls of
// a few samples, where the weights' bytes are the cost and the second input tile would be padding.
inline void conv_tile_half(const uint16_t* w0, int64_t kb_n, const uint16_t* xp, int64_t row, int64_t cb_n,
                           int64_t k, int64_t d, int64_t t0, float* acc) {
    const uint16_t* w1 = w0 + kb_n * 512;
    _tile_zero(0);
    _tile_zero(2);
    for (int64_t j = 0; j < k; ++j) {
        for (int64_t cb = 0; cb < cb_n; ++cb) {
            const int64_t kb = j * cb_n + cb;
            _tile_loadd(6, xp + (cb * 16 * row + t0 + j * d) * 2, row * 4);
            _tile_loadd(4, w0 + kb * 512, 64);
            _tile_loadd(5, w1 + kb * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
        }
    }
    _tile_stored(0, acc, 128);
    _tile_stored(2, acc + 512, 128);
}

struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Each thread sets its tiles up once per call (every tile 16 rows of 64 bytes) and releases them after.
struct TileScope {
    TileScope() {
        TileConfig cfg;
        for (int i = 0; i < 8; ++i) {
            cfg.colsb[i] = 64;
            cfg.rows[i] = 16;
        }
        _tile_loadconfig(&cfg);
    }
    ~TileScope() { _tile_release(); }
};

#elif defined(VO_AVX512_BF16)
// Eight channels by 32 samples at a time (16 accumulators): each input pair's two 16-sample
// vectors against each channel's weight pair broadcast, four times for the 32 channels.
inline void conv_tile_pair(const uint16_t* w0, int64_t kb_n, const uint16_t* xp, int64_t row, int64_t cb_n,
                           int64_t k, int64_t d, int64_t t0, float* acc) {
    for (int64_t c8 = 0; c8 < 32; c8 += 8) {
        const uint16_t* w = w0 + (c8 / 16) * kb_n * 512 + (c8 % 16) * 32;
        __m512 c[8][2];
        for (auto& r : c) r[0] = r[1] = _mm512_setzero_ps();
        for (int64_t j = 0; j < k; ++j) {
            for (int64_t cb = 0; cb < cb_n; ++cb) {
                const uint16_t* wt = w + (j * cb_n + cb) * 512;
                const uint16_t* b = xp + (cb * 16 * row + t0 + j * d) * 2;
                for (int kk = 0; kk < 16; ++kk) {
                    const __m512bh x0 = (__m512bh)_mm512_loadu_si512(b + kk * row * 2);
                    const __m512bh x1 = (__m512bh)_mm512_loadu_si512(b + kk * row * 2 + 32);
                    for (int r = 0; r < 8; ++r) {
                        int32_t pair;
                        std::memcpy(&pair, wt + r * 32 + 2 * kk, 4);
                        const __m512bh wv = (__m512bh)_mm512_set1_epi32(pair);
                        c[r][0] = _mm512_dpbf16_ps(c[r][0], wv, x0);
                        c[r][1] = _mm512_dpbf16_ps(c[r][1], wv, x1);
                    }
                }
            }
        }
        for (int r = 0; r < 8; ++r) {
            _mm512_storeu_ps(acc + (c8 + r) * 32, c[r][0]);
            _mm512_storeu_ps(acc + (c8 + r) * 32 + 16, c[r][1]);
        }
    }
}

struct TileScope {};
#endif

}  // namespace
