// The int4 tile loops on x86: AVX-512 VNNI, and AVX2 with FMA and F16C.
//
// Included by vo_kernels.cpp where the int4 tile layout (the comment above its q4 section), Act and
// the plain-C loop, the reference every build agrees with bit for bit, are defined; the ARM form
// of the same loops is arch/arm/q4_tile.h.

#pragma once

#include <immintrin.h>

namespace {

#if defined(VO_AVX512VNNI)
// lo/hi + the scaled sums of group g for rows 0-15/16-31 of a tile; x: the group's 576 bytes.
inline void q4_group32(const uint8_t* x, const Act& a, int64_t g, __m512& lo, __m512& hi) {
    VO_MCA_BEGIN("q4_group");
    const __m512i m4 = _mm512_set1_epi8(0x0f), z = _mm512_setzero_si512();
    const int8_t* q = a.q + g * 32;
    // acc + the dot of line bytes wb with activation word i, the word broadcast inside the
    // instruction: GCC emits a separate broadcast for _mm512_set1_epi32, one more vector
    // operation per line in a loop that the core's vector units already bound
    // (docs/analysis/cpu-kernels/)
    auto dot = [q](__m512i acc, __m512i wb, int i) {
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wb), "m"(*(const int32_t*)(q + 4 * i)));
        return acc;
    };
    // four chains of four dots: low nibbles and whole bytes, even and odd lines; the low sums
    // start from the group's offset and the whole-byte sums from 17 times it, so that
    // (whole - low) / 16 comes out offset once too
    __m512i l0 = _mm512_set1_epi32(a.gcorr[2 * g]), w0 = _mm512_set1_epi32(a.gcorr[2 * g + 1]), l1 = z, w1 = z;
    for (int j = 0; j < 8; j += 2) {
        __m512i b0 = _mm512_loadu_si512(x + 64 + 64 * j), b1 = _mm512_loadu_si512(x + 128 + 64 * j);
        // one load per line: without this the compiler folds each line into its AND and loads
        // it again for the whole-byte dot
        asm("" : "+v"(b0), "+v"(b1));
        l0 = dot(l0, _mm512_and_si512(b0, m4), j);
        w0 = dot(w0, b0, j);
        l1 = dot(l1, _mm512_and_si512(b1, m4), j + 1);
        w1 = dot(w1, b1, j + 1);
    }
    const __m512i sl = _mm512_add_epi32(l0, l1);
    const __m512i sh = _mm512_srai_epi32(_mm512_sub_epi32(_mm512_add_epi32(w0, w1), sl), 4);  // exact
    const __m512 d = _mm512_set1_ps(a.d[g]);
    const __m512 cl = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)x)), d);
    const __m512 ch = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(x + 32))), d);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), cl, lo);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), ch, hi);
    VO_MCA_END();
}

// out[0..32) = the 32 rows of a tile at w . a (cols inputs), group(x, a, g, lo, hi) adding group
// g's scaled sums for rows 0-15 and 16-31 (x: the group's bytes). Even groups sum into one
// accumulator and odd groups into another, in every build, so all builds agree bit for bit.
template <int64_t GROUP_BYTES, class Group>
inline void tile_by_groups(const uint8_t* w, const Act& a, int64_t cols, float* out, Group group) {
    __m512 lo0 = _mm512_setzero_ps(), lo1 = lo0, hi0 = lo0, hi1 = lo0;
    for (int64_t g = 0; g < cols / 32; g += 2) {
        group(w + g * GROUP_BYTES, a, g, lo0, hi0);
        group(w + (g + 1) * GROUP_BYTES, a, g + 1, lo1, hi1);
    }
    _mm512_storeu_ps(out, _mm512_add_ps(lo0, lo1));
    _mm512_storeu_ps(out + 16, _mm512_add_ps(hi0, hi1));
}

inline void q4_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    tile_by_groups<Q4_GROUP_BYTES>(w, a, cols, out, [](auto&&... args) { q4_group32(std::forward<decltype(args)>(args)...); });
}

// N tiles side by side, group by group (N read streams, see for_tile_streams): for each tile the
// same sums, in the same order, as q4_tile. On the development host (Zen 4) four streams made
// the 1-thread int4 pass 3 to 5 % faster than two; six or eight made it a fifth to a half slower
// (their sums alone take 24 or all 32 of the 32 vector registers; docs/analysis/cpu-kernels/).
template <int N>
inline void q4_tiles(const uint8_t* const* w, const Act& a, int64_t cols, float* const* o) {
    __m512 l0[N], l1[N], h0[N], h1[N];
    for (int k = 0; k < N; ++k) l0[k] = l1[k] = h0[k] = h1[k] = _mm512_setzero_ps();
    for (int64_t g = 0; g < cols / 32; g += 2) {
        for (int k = 0; k < N; ++k) q4_group32(w[k] + g * Q4_GROUP_BYTES, a, g, l0[k], h0[k]);
        for (int k = 0; k < N; ++k) q4_group32(w[k] + (g + 1) * Q4_GROUP_BYTES, a, g + 1, l1[k], h1[k]);
    }
    for (int k = 0; k < N; ++k) {
        _mm512_storeu_ps(o[k], _mm512_add_ps(l0[k], l1[k]));
        _mm512_storeu_ps(o[k] + 16, _mm512_add_ps(h0[k], h1[k]));
    }
}

inline void q4_tile2(const uint8_t* wa, const uint8_t* wb, const Act& a, int64_t cols, float* oa, float* ob) {
    const uint8_t* w[2] = {wa, wb};
    float* o[2] = {oa, ob};
    q4_tiles<2>(w, a, cols, o);
}
constexpr int Q4_STREAMS = 4;  // GEMVs walk int4 tiles four side by side (for_tile_streams)

// acc + the dot of line bytes wb with the activation word at q, broadcast inside the instruction
// (as q4_group32's dot).
inline __m512i dot_word(__m512i acc, __m512i wb, const int8_t* q) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wb), "m"(*(const int32_t*)q));
    return acc;
}

// q4_group32 for R activation rows a[0..R) at once: each line of the group loaded and masked once
// for all of them. Every row's integer sums are exact and its float steps are q4_group32's, in
// the same order, so each row's lo/hi come out as q4_group32 gives them, bit for bit.
template <int R>
inline void q4_group32_rows(const uint8_t* x, const Act* a, int64_t g, __m512* lo, __m512* hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), z = _mm512_setzero_si512();
    __m512i l0[R], w0[R], l1[R], w1[R];
    for (int r = 0; r < R; ++r) {
        l0[r] = _mm512_set1_epi32(a[r].gcorr[2 * g]);
        w0[r] = _mm512_set1_epi32(a[r].gcorr[2 * g + 1]);
        l1[r] = w1[r] = z;
    }
    for (int j = 0; j < 8; j += 2) {
        __m512i b0 = _mm512_loadu_si512(x + 64 + 64 * j), b1 = _mm512_loadu_si512(x + 128 + 64 * j);
        asm("" : "+v"(b0), "+v"(b1));
        const __m512i n0 = _mm512_and_si512(b0, m4), n1 = _mm512_and_si512(b1, m4);
        for (int r = 0; r < R; ++r) {
            const int8_t* q = a[r].q + g * 32;
            l0[r] = dot_word(l0[r], n0, q + 4 * j);
            w0[r] = dot_word(w0[r], b0, q + 4 * j);
            l1[r] = dot_word(l1[r], n1, q + 4 * (j + 1));
            w1[r] = dot_word(w1[r], b1, q + 4 * (j + 1));
        }
    }
    const __m512 sl_scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)x));
    const __m512 sh_scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(x + 32)));
    for (int r = 0; r < R; ++r) {
        const __m512i sl = _mm512_add_epi32(l0[r], l1[r]);
        const __m512i sh = _mm512_srai_epi32(_mm512_sub_epi32(_mm512_add_epi32(w0[r], w1[r]), sl), 4);
        const __m512 d = _mm512_set1_ps(a[r].d[g]);
        lo[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), _mm512_mul_ps(sl_scale, d), lo[r]);
        hi[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), _mm512_mul_ps(sh_scale, d), hi[r]);
    }
}

// out[r] = q4_tile(w, a[r]) for r < R, bit for bit, each group of the tile decoded once for all
// R rows (even and odd groups summed apart, as tile_by_groups does). A step of several streams,
// or a prompt's rows, decoded every tile again for each row before (docs/edge/serving.md).
template <int R>
inline void q4_tile_rows(const uint8_t* w, const Act* a, int64_t cols, float (*out)[Q4_TILE]) {
    __m512 lo0[R], lo1[R], hi0[R], hi1[R];
    for (int r = 0; r < R; ++r) lo0[r] = lo1[r] = hi0[r] = hi1[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < cols / 32; g += 2) {
        q4_group32_rows<R>(w + g * Q4_GROUP_BYTES, a, g, lo0, hi0);
        q4_group32_rows<R>(w + (g + 1) * Q4_GROUP_BYTES, a, g + 1, lo1, hi1);
    }
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(out[r], _mm512_add_ps(lo0[r], lo1[r]));
        _mm512_storeu_ps(out[r] + 16, _mm512_add_ps(hi0[r], hi1[r]));
    }
}

constexpr int Q4_ROWS = 4;  // activation rows a tile is decoded for at once (q4_tile_rows)

// q4_tile_rows for n (1 .. Q4_ROWS) rows.
inline void q4_tile_rows_n(const uint8_t* w, const Act* a, int n, int64_t cols, float (*out)[Q4_TILE]) {
    switch (n) {
        case 4: q4_tile_rows<4>(w, a, cols, out); break;
        case 3: q4_tile_rows<3>(w, a, cols, out); break;
        case 2: q4_tile_rows<2>(w, a, cols, out); break;
        default: q4_tile_rows<1>(w, a, cols, out); break;
    }
}
#else  // VO_AVX2
// The AVX2 form: each 64-byte line is two halves of 8 lanes, and each half's low and high
// nibbles are masked apart (maddubs saturates at int16, too narrow for whole bytes). maddubs
// pairs stay in int16 across the 8 lines: each pair is at most 2 * 15 * 127 = 3810 in
// magnitude, 8 of them 30480 < 32767.
// f[2k + h][g & 1] += the scaled sums of group g (bytes x) for rows 8(2k + h) .. 8(2k + h) + 7.
// Each group asks for the group q4_prefetch_groups ahead of it in its tile (q4_prefetch).
inline void q4_group_avx2(const uint8_t* x, const Act& a, int64_t g, __m256 (*f)[2]) {
    q4_prefetch(x);
    VO_MCA_BEGIN("q4_group");
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint16_t* sc = (const uint16_t*)x;
    const int8_t* q = a.q + g * 32;
    const __m256 d = _mm256_set1_ps(a.d[g]);
    const __m256i off = _mm256_set1_epi32(a.gcorr[2 * g]);
    for (int h = 0; h < 2; ++h) {
        __m256i pl = _mm256_setzero_si256(), ph = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const __m256i xv = _mm256_loadu_si256((const __m256i*)(x + 64 + 64 * j + 32 * h));
            const __m256i aw = _mm256_set1_epi32(act_word(q + 4 * j));
            pl = _mm256_add_epi16(pl, _mm256_maddubs_epi16(_mm256_and_si256(xv, m4), aw));
            ph = _mm256_add_epi16(ph, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(xv, 4), m4), aw));
        }
        const __m256i sums[2] = {_mm256_add_epi32(_mm256_madd_epi16(pl, ones), off),
                                 _mm256_add_epi32(_mm256_madd_epi16(ph, ones), off)};
        for (int k = 0; k < 2; ++k) {
            const __m256 scl = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sc + 16 * k + 8 * h))), d);
            __m256& acc = f[2 * k + h][g & 1];
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[k]), scl, acc);
        }
    }
    VO_MCA_END();
}

inline void q4_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    __m256 f[4][2];  // [rows 8i .. 8i + 7][group parity]
    for (auto& fi : f) fi[0] = fi[1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < cols / 32; ++g) q4_group_avx2(w + g * Q4_GROUP_BYTES, a, g, f);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(f[i][0], f[i][1]));
}

// Two tiles side by side, group by group, as the AVX-512 q4_tile2: for each tile the same sums,
// in the same order, as q4_tile. On an AVX2-only development host (first-generation EPYC,
// family 23 model 1) this made the int4 pass about 15 % faster at 1 and 2 threads without the
// prefetches, and 2 to 3 % with them (docs/analysis/cpu-kernels/).
inline void q4_tile2(const uint8_t* wa, const uint8_t* wb, const Act& a, int64_t cols, float* oa, float* ob) {
    __m256 fa[4][2], fb[4][2];
    for (int i = 0; i < 4; ++i) fa[i][0] = fa[i][1] = fb[i][0] = fb[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < cols / 32; ++g) {
        q4_group_avx2(wa + g * Q4_GROUP_BYTES, a, g, fa);
        q4_group_avx2(wb + g * Q4_GROUP_BYTES, a, g, fb);
    }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(oa + 8 * i, _mm256_add_ps(fa[i][0], fa[i][1]));
        _mm256_storeu_ps(ob + 8 * i, _mm256_add_ps(fb[i][0], fb[i][1]));
    }
}
constexpr int Q4_STREAMS = 2;
#endif

}  // namespace
