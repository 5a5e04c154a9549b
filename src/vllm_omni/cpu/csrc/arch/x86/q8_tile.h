// The int8 tile loops on x86: AVX-512 VNNI, and AVX2 with FMA and F16C.
//
// Included by vo_kernels.cpp where the int8 tile layout (the comment above its q8 section), Act and
// the plain-C loop are defined, after arch/x86/q4_tile.h (the AVX-512 loop shares its
// tile_by_groups); the ARM form is arch/arm/q8_tile.h.

#pragma once

#include <immintrin.h>

namespace {

#if defined(VO_AVX512VNNI)
// lo/hi + the scaled integer sums of group g for rows 0-15/16-31; x: the group's 1024 bytes.
inline void q8_group32(const uint8_t* x, const Act& a, int64_t g, __m512& lo, __m512& hi) {
    VO_MCA_BEGIN("q8_group");
    const int8_t* q = a.q + g * 32;
    auto dot = [q](__m512i acc, const uint8_t* line, int i) {
        asm("vpdpbusd %2%{1to16%}, %1, %0"
            : "+v"(acc)
            : "v"(_mm512_loadu_si512(line)), "m"(*(const int32_t*)(q + 4 * i)));
        return acc;
    };
    // the sums start from -128 times the group's activation sum, the offset of the stored bytes
    const __m512i off = _mm512_set1_epi32(16 * a.gcorr[2 * g]), z = _mm512_setzero_si512();
    __m512i l0 = off, l1 = z, h0 = off, h1 = z;
    for (int j = 0; j < 8; j += 2) {
        l0 = dot(l0, x + 128 * j, j);
        h0 = dot(h0, x + 128 * j + 64, j);
        l1 = dot(l1, x + 128 * j + 128, j + 1);
        h1 = dot(h1, x + 128 * j + 192, j + 1);
    }
    const __m512 d = _mm512_set1_ps(a.d[g]);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(l0, l1)), d, lo);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(h0, h1)), d, hi);
    VO_MCA_END();
}

// out[0..32) = the 32 rows of the tile at w . a, without their row scales.
inline void q8_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    tile_by_groups<Q8_GROUP_BYTES>(w, a, cols, out, [](auto&&... args) { q8_group32(std::forward<decltype(args)>(args)...); });
}
#else  // VO_AVX2
// The AVX2 form: each 64-byte line is two halves of 8 lanes. maddubs saturates at int16, too
// narrow for q + 128, so the bytes go back to q and the sign moves onto the activation word,
// which is broadcast once per line pair and serves the four 8-row parts.
// f[k][g & 1] += the scaled sums of group g (bytes x) for rows 8k .. 8k + 7.
inline void q8_group_avx2(const uint8_t* x, const Act& a, int64_t g, __m256 (*f)[2]) {
    VO_MCA_BEGIN("q8_group");
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const int8_t* q = a.q + g * 32;
    __m256i s[4];  // rows 8k .. 8k + 7: 32-byte part k of each line pair (k / 2: the row half)
    for (auto& sk : s) sk = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
        const __m256i aw = _mm256_set1_epi32(act_word(q + 4 * j));
        for (int k = 0; k < 4; ++k) {
            const __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(x + 128 * j + 32 * k)), flip);
            s[k] = _mm256_add_epi32(s[k], _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(aw, v)), ones));
        }
    }
    const __m256 d = _mm256_set1_ps(a.d[g]);
    for (int k = 0; k < 4; ++k) f[k][g & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[k]), d, f[k][g & 1]);
    VO_MCA_END();
}

inline void q8_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    __m256 f[4][2];  // [rows 8k .. 8k + 7][group parity]
    for (auto& fk : f) fk[0] = fk[1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < cols / 32; ++g) q8_group_avx2(w + g * Q8_GROUP_BYTES, a, g, f);
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + 8 * k, _mm256_add_ps(f[k][0], f[k][1]));
}

// Two tiles side by side, group by group, as q4_tile2: for each tile the same sums, in the same
// order, as q8_tile. On an AVX2-only development host (first-generation EPYC, family 23 model 1)
// this made the int8 pass about 14 % faster at 1 and 2 threads (docs/analysis/cpu-kernels/).
// The AVX2 q4 and q8 tile loops are written out apart: one template taking the group function,
// with bit-for-bit the same results, made the int4 pass 4 to 10 % slower on that host (the
// compiler unrolled and inlined less).
inline void q8_tile2(const uint8_t* wa, const uint8_t* wb, const Act& a, int64_t cols, float* oa, float* ob) {
    __m256 fa[4][2], fb[4][2];
    for (int k = 0; k < 4; ++k) fa[k][0] = fa[k][1] = fb[k][0] = fb[k][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < cols / 32; ++g) {
        q8_group_avx2(wa + g * Q8_GROUP_BYTES, a, g, fa);
        q8_group_avx2(wb + g * Q8_GROUP_BYTES, a, g, fb);
    }
    for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(oa + 8 * k, _mm256_add_ps(fa[k][0], fa[k][1]));
        _mm256_storeu_ps(ob + 8 * k, _mm256_add_ps(fb[k][0], fb[k][1]));
    }
}
#endif

}  // namespace
