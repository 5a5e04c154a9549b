// Fused CPU kernels for the Qwen3-TTS code predictor and talker.
//
// One call runs a whole predictor frame (15 passes, sampling included) or one talker step
// inside a single OpenMP parallel region: matrix-vector products are split by output rows
// across threads, every thread norms and quantises each GEMV's input into its own copy
// (norm_prep, prep_act), and sampling runs on one thread between barriers. Weights are fp32,
// int8 (one fp32 scale per output row, packed in tiles of 32 rows, see q8_tile) or int4
// (groups of 32 along the input, one fp16 scale per group, packed in tiles of 32 rows with the
// scales inside the stream, see q4_tile). For int8/int4 the activation vector is quantised to
// int8 in blocks of 32 with one fp32 scale per block and the products use integer dot
// instructions (AVX-512 VNNI, AVX2 maddubs, NEON SDOT, or plain C).
//
// The tile loops of each instruction set sit beside each other, one file per operation and
// architecture (arch/x86/q4_tile.h, arch/arm/q4_tile.h, ...); the plain C loops here are the
// reference they all give bit for bit.
//
// All memory (weights, caches, workspace, outputs) is owned by the caller; this file only
// reads and writes through the pointers it is given. Built with -O3 -fopenmp and -march=native
// (variant "native"), -mavx2 -mfma -mf16c ("avx2") or -march=x86-64 ("generic"), or on ARM
// -mcpu=native, -march=armv8.2-a+dotprod ("dotprod") or -march=armv8-a ("generic"); see
// vllm_omni.cpu.native.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <limits>
#include <type_traits>
#include <utility>

#include <omp.h>
#include <sys/mman.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define VO_AVX512VNNI 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VO_AVX2 1
#endif
#if defined(VO_AVX2) && !defined(VO_AVX512VNNI)
#define VO_AVX2_ONLY 1  // the AVX2 build, on a host without AVX-512 VNNI (or asked for, variant "avx2")
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#define VO_NEON_DOT 1  // ARM with the dot product: the int4 and int8 tile loops of arch/arm/
#endif

#include "mca.h"  // VO_MCA_BEGIN / VO_MCA_END: the loop bodies llvm-mca analyses

namespace {

enum Fmt : int32_t { FMT_F32 = 0, FMT_I8 = 1, FMT_I4 = 2 };

// Tokens one stack call takes: the predictor's first pass is a 2-token prefill, and a talker
// prompt is prefilled up to this many positions a call, every weight tile read once for all of them.
constexpr int MAX_TOKENS = 16;

}  // namespace

extern "C" {

// A weight matrix in nn.Linear layout [rows, cols].
//   fp32: w = float[rows*cols], s = NULL
//   int8: w = uint8[rows*cols], s = float[rows]            (w_ij = s_i * q_ij, q_ij + 128 stored
//         in tiles of 32 rows, see q8_tile; rows a multiple of 32)
//   int4: w = uint8[rows*cols*9/16], s = NULL             (w = d_g * (nibble - 8); tiles of 32
//         rows, scales inside, see q4_tile; rows a multiple of 32)
struct VoMat {
    const void* w;
    const void* s;
    int64_t rows;
    int64_t cols;
};

struct VoLayer {
    const float* input_norm;
    const float* post_norm;
    const float* q_norm;
    const float* k_norm;
    VoMat qkv;      // [q_dim + 2*kv_dim, H]: q rows, then k rows, then v rows
    VoMat o;        // [H, q_dim]
    VoMat gate_up;  // [2*I, H]: gate rows, then up rows
    VoMat down;     // [H, I]
    void* k_cache;  // [kv_heads, max_pos, head_dim], fp32, or fp16 where VoStack.kv_f16 is set
    void* v_cache;
};

struct VoStack {
    int32_t fmt;
    int32_t n_layers;
    int32_t hidden;
    int32_t inter;
    int32_t heads;
    int32_t kv_heads;
    int32_t head_dim;
    int32_t max_pos;
    int32_t threads;
    float eps;
    int32_t kv_f16;         // 1: the layers' KV caches hold fp16 (half the bytes the attention reads)
    const VoLayer* layers;
    const float* final_norm;
    const float* rope_cos;  // [max_pos, head_dim/2]
    const float* rope_sin;
    void* ws;               // workspace, vo_workspace_bytes(stack, extra_len) bytes, 64-byte aligned; its
    int64_t ws_bytes;       // size depends on the thread count (each thread's activations)
};

}  // extern "C"

namespace {

// ---------------------------------------------------------------------------------------------
// fp16 -> fp32 (scales of int4 groups)

inline float half_to_float(uint16_t h) {
#if defined(VO_AVX2) || defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal
            float f = std::ldexp((float)man, -24);
            std::memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
#endif
}

// fp32 -> fp16, rounding to nearest even (the F16C conversion, and its plain-C equivalent).
inline uint16_t float_to_half(float f) {
#if defined(VO_AVX2) || defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));  // inf, NaN
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // 65520 and up round to inf
    if (ax < 0x38800000u) {  // below the smallest normal half: a multiple of 2^-24
        float a;
        std::memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)std::nearbyint(a * 16777216.f));
    }
    const uint32_t mant = ax & 0x7fffff;
    uint32_t h = ((((ax >> 23) - 112) << 10) | (mant >> 13));
    const uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right too
    return (uint16_t)(sign | h);
#endif
}

// ---------------------------------------------------------------------------------------------
// KV cache rows, fp32 or fp16. In fp16 the attention reads half the bytes: the talker reads
// its whole cache every step, about 60 MB beside 250 MB of int4 weights at 256 positions.

inline void kv_store(void* cache, int64_t off, const float* v, int hd, bool f16) {
    if (!f16) {
        std::memcpy((float*)cache + off, v, sizeof(float) * hd);
        return;
    }
    uint16_t* h = (uint16_t*)cache + off;
    int i = 0;
#if defined(VO_AVX2)
    for (; i + 8 <= hd; i += 8)
        _mm_storeu_si128((__m128i*)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < hd; ++i) h[i] = float_to_half(v[i]);
}

// o += p * row off of the cache (the row-by-row attention of attend_kv_head; the vector builds
// take attend_heads wherever the head size allows)
inline void kv_axpy(float* o, float p, const void* cache, int64_t off, int hd, bool f16) {
    if (!f16) {
        const float* vr = (const float*)cache + off;
        for (int64_t d = 0; d < hd; ++d) o[d] += p * vr[d];
        return;
    }
    const uint16_t* h = (const uint16_t*)cache + off;
    for (int d = 0; d < hd; ++d) o[d] = std::fma(p, half_to_float(h[d]), o[d]);
}

// ---------------------------------------------------------------------------------------------
// Quantised activation: int8 values in blocks of 32, one scale per block. gcorr holds two words
// per block: -8 times the block's sum (the offset of unsigned int4 nibbles, per group), and 17
// times that (where a dot of whole int4 bytes starts, see q4_tile); the AVX-512 build's int8
// tiles start from 16 times the first (-128 times the sum: their bytes are q + 128, see
// q8_tile), while the AVX2 and plain-C int8 tiles turn the bytes back into q and do not use it.

struct Act {
    const float* f;      // fp32 values (fp32 path)
    int8_t* q;
    float* d;            // one scale per block of 32
    int32_t* gcorr;      // two per block of 32
};

// The scale of one block from its largest |x|: amax / 127, except that a block holding a NaN
// gets a NaN scale (the dot then comes out NaN, as in a float matmul) and a block whose scale
// would be subnormal is flushed to zero (its reciprocal would overflow and flip signs; values
// below ~1e-36 contribute nothing measurable next to any normal row).
inline float block_scale(float amax, bool nan) {
    if (nan) return std::numeric_limits<float>::quiet_NaN();
    const float d = amax / 127.f;
    return d >= std::numeric_limits<float>::min() ? d : 0.f;
}

// Quantise x[n] into a, with the per-group offsets of the packed integer formats.
void quantize_act(const float* x, int64_t n, Act& a) {
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* xb = x + b * 32;
        int8_t* qb = a.q + b * 32;
#if defined(VO_AVX512VNNI)
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const bool nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
        const float d = block_scale(amax, nan);
        const __m512 id = _mm512_set1_ps(d > 0.f ? 1.f / d : 0.f);
        // round to nearest even, as nearbyint; |x/d| <= 127 up to rounding of d
        __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), _mm512_set1_epi32(-127)),
                                      _mm512_set1_epi32(127));
        __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)), _mm512_set1_epi32(-127)),
                                      _mm512_set1_epi32(127));
        __m256i q8 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)), _mm512_cvtepi32_epi8(q1), 1);
        _mm256_storeu_si256((__m256i*)qb, q8);
        a.d[b] = d;
        a.gcorr[2 * b] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        a.gcorr[2 * b + 1] = 17 * a.gcorr[2 * b];
#else
        float amax = 0.f;
        bool nan = false;
        for (int i = 0; i < 32; ++i) {
            amax = std::max(amax, std::fabs(xb[i]));
            nan |= std::isnan(xb[i]);
        }
        float d = block_scale(amax, nan);
        float id = d > 0.f ? 1.f / d : 0.f;
        for (int i = 0; i < 32; ++i) {
            int v = (int)std::nearbyint(xb[i] * id);
            qb[i] = (int8_t)std::min(127, std::max(-127, v));
        }
        a.d[b] = d;
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += qb[i];
        a.gcorr[2 * b] = -8 * sum;
        a.gcorr[2 * b + 1] = 17 * a.gcorr[2 * b];
#endif
    }
}

// ---------------------------------------------------------------------------------------------
// Row dot products.

#if defined(VO_AVX2)
inline float hsum256(__m256 t) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif

// fp32 row dots of N rows w[k] against one activation, 256-bit even where AVX-512 exists: on the
// development host (Zen 4, which splits 512-bit operations in two) a 512-bit loop read fp32
// weights about 20 % slower at 1 and 2 threads than this one
// (results/cpu-path/predictor-fused-fp32-t1-2-avx2.json). The rows are read side by side, 128
// bytes of each in turn, each summed exactly as a row on its own (N = 1, dot_f32), so that a
// row's result does not depend on the rows beside it.
#if defined(VO_AVX2)
}  // namespace
#include "arch/x86/f32_dot.h"
namespace {
#elif defined(VO_NEON_DOT)
}  // namespace
#include "arch/arm/f32_dot.h"
namespace {
#else
template <int N>
inline void dot_f32_rows(const float* const* w, const float* a, int64_t n, float* out) {
    for (int k = 0; k < N; ++k) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) s[j] += w[k][i + j] * a[i + j];
        float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        for (; i < n; ++i) t += w[k][i] * a[i];
        out[k] = t;
    }
}
#endif

inline float dot_f32(const float* w, const float* a, int64_t n) {
    float t;
    dot_f32_rows<1>(&w, a, n, &t);
    return t;
}

// q . row off of a KV cache (see kv_store; the row-by-row path, as kv_axpy)
inline float kv_dot(const float* q, const void* cache, int64_t off, int hd, bool f16) {
    if (!f16) return dot_f32(q, (const float*)cache + off, hd);
    const uint16_t* h = (const uint16_t*)cache + off;
    float t = 0.f;
    for (int i = 0; i < hd; ++i) t = std::fma(half_to_float(h[i]), q[i], t);
    return t;
}


// int4 rows come in tiles of 32. For each group (32 inputs) a tile holds 576 bytes: the 32 fp16
// scales of rows 0-31, then eight 64-byte lines j whose 4-byte lane r (0-15) holds inputs
// 4j .. 4j + 3 of the group, byte b input 4j + b, with row r's nibble in its low half and row
// 16 + r's in its high half (vllm_omni.cpu.quant). Both nibbles of a byte meet the same input,
// so a line needs one mask, not two: an integer dot of its low nibbles against the broadcast
// word of inputs 4j .. 4j + 3 sums rows 0-15 times 4 inputs, and a dot of its whole bytes sums
// those plus 16 times rows 16-31, which one subtraction and shift per group separate again. A
// group's 16 sums per half are scaled as one vector and no horizontal sums are needed. A tile is
// one run of bytes, scales included: on the development host (Zen 4) a separate stream of
// scales, one line for every 8 of nibbles, cut one core's reads while it computed by about a
// third, and software prefetches made it worse, so the AVX-512 build has none (see q4_prefetch).
constexpr int Q4_TILE = 32;
constexpr int64_t Q4_GROUP_BYTES = 576;

// Bytes of one int4 tile of a matrix with `cols` inputs, and the tile holding row r0 of m.
inline int64_t q4_tile_bytes(int64_t cols) { return cols / 32 * Q4_GROUP_BYTES; }
inline const uint8_t* q4_tile_at(const VoMat& m, int64_t r0) {
    return (const uint8_t*)m.w + r0 / Q4_TILE * q4_tile_bytes(m.cols);
}

// The 4 activation bytes at p as one little-endian word (the operand every lane shares).
inline int32_t act_word(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// A software prefetch of the group q4_prefetch_groups ahead of group x in its tile (its 9
// lines), in the AVX2 build only, where it is set per host (vo_set_q4_prefetch; 0: none). The
// development hosts disagree: on the AVX-512 one (Zen 4) every software prefetch tried made the
// int4 pass slower, the hardware prefetcher losing its streams, and this one, in the AVX2 build
// run there, made the 1-thread int4 pass an eighth to two fifths slower; on an AVX2-only one
// (first-generation EPYC, family 23 model 1), where one core decoded int4 tiles from memory at
// less than half its rate from its L2 cache, 8 groups ahead made the pass about a third faster
// at 1 and 2 threads (docs/analysis/cpu-kernels/). The int4 plain reads (tiles_read) make the
// same requests, so that they stay the GEMVs' reads.
#if defined(VO_AVX2_ONLY)
int64_t q4_prefetch_groups = 8;  // set only between calls (vo_set_q4_prefetch)
inline void q4_prefetch(const uint8_t* x) {
    const int64_t ahead = q4_prefetch_groups * Q4_GROUP_BYTES;
    if (ahead == 0) return;
    for (int l = 0; l < 9; ++l) _mm_prefetch((const char*)x + ahead + 64 * l, _MM_HINT_T0);
}
#else
inline void q4_prefetch(const uint8_t*) {}
#endif

#if defined(VO_AVX512VNNI) || defined(VO_AVX2)
}  // namespace
#include "arch/x86/q4_tile.h"
namespace {
#elif defined(VO_NEON_DOT)
}  // namespace
#include "arch/arm/q4_tile.h"
namespace {
#else
inline void q4_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    for (int r = 0; r < Q4_TILE; ++r) {
        const int lane = r % 16, shift = r < 16 ? 0 : 4;
        float acc[2] = {0.f, 0.f};
        for (int64_t g = 0; g < cols / 32; ++g) {
            const uint8_t* x = w + g * Q4_GROUP_BYTES;
            uint16_t sc;
            std::memcpy(&sc, x + 2 * r, 2);
            VO_MCA_BEGIN("q4_row");
            const int8_t* q = a.q + g * 32;
            int32_t t = a.gcorr[2 * g];
            for (int j = 0; j < 8; ++j)
                for (int b = 0; b < 4; ++b)
                    t += (int32_t)((x[64 + 64 * j + 4 * lane + b] >> shift) & 0x0f) * q[4 * j + b];
            acc[g & 1] = std::fma((float)t, half_to_float(sc) * a.d[g], acc[g & 1]);
            VO_MCA_END();
        }
        out[r] = acc[0] + acc[1];
    }
}
#endif

#if !defined(VO_AVX512VNNI) && !defined(VO_AVX2)
// The plain-C build takes the two tiles one after the other, and its GEMVs walk their tiles in
// order.
inline void q4_tile2(const uint8_t* wa, const uint8_t* wb, const Act& a, int64_t cols, float* oa, float* ob) {
    q4_tile(wa, a, cols, oa);
    q4_tile(wb, a, cols, ob);
}
constexpr int Q4_STREAMS = 1;
#endif

// int8 rows come in tiles of 32 as well, with the row scales in their own array (one float per
// row, read once per tile). For each group (32 inputs) a tile holds 1024 bytes: sixteen 64-byte
// lines, 2j for rows 0-15 and 2j + 1 for rows 16-31, whose 4-byte lane r holds inputs
// 4j .. 4j + 3 of the group for row r (or 16 + r), each weight stored as q + 128 (1..255), so
// that the bytes are the unsigned operand of an integer dot and the broadcast activation word
// the signed one, as in the int4 tiles (vllm_omni.cpu.quant). A group's integer sums for 16
// rows thus take eight dots with no unpacking, are exact in int32, and are scaled by the
// activation block's scale as one vector: one conversion and one multiply-add per 16 rows and
// 32 inputs. Walking rows one at a time, the dots of a row needed the activation block scales
// lane by lane, one conversion and one multiply-add per 64 bytes, and decoded less than half as
// fast from L2 on the development host. The two halves' lines alternate so that a group is read
// front to back: one after the other, the GEMVs fell well behind their reads from memory
// (docs/analysis/cpu-kernels/).
constexpr int Q8_TILE = 32;
constexpr int64_t Q8_GROUP_BYTES = 1024;

inline const uint8_t* q8_tile_at(const VoMat& m, int64_t r0) { return (const uint8_t*)m.w + r0 * m.cols; }

#if defined(VO_AVX512VNNI) || defined(VO_AVX2)
}  // namespace
#include "arch/x86/q8_tile.h"
namespace {
#elif defined(VO_NEON_DOT)
}  // namespace
#include "arch/arm/q8_tile.h"
namespace {
#else
inline void q8_tile(const uint8_t* w, const Act& a, int64_t cols, float* out) {
    for (int r = 0; r < Q8_TILE; ++r) {
        const int64_t lane = 64 * (r / 16) + 4 * (r % 16);
        float acc[2] = {0.f, 0.f};
        for (int64_t g = 0; g < cols / 32; ++g) {
            const uint8_t* x = w + g * Q8_GROUP_BYTES + lane;
            VO_MCA_BEGIN("q8_row");
            const int8_t* q = a.q + g * 32;
            int32_t t = 0;
            for (int j = 0; j < 8; ++j)
                for (int b = 0; b < 4; ++b) t += ((int32_t)x[128 * j + b] - 128) * q[4 * j + b];
            acc[g & 1] = std::fma((float)t, a.d[g], acc[g & 1]);
            VO_MCA_END();
        }
        out[r] = acc[0] + acc[1];
    }
}
#endif

#if defined(VO_AVX512VNNI) || !defined(VO_AVX2)
// The AVX-512 and plain-C builds take the two int8 tiles one after the other: on the AVX-512
// development host (Zen 4) int8 tiles read fastest one stream per core.
inline void q8_tile2(const uint8_t* wa, const uint8_t* wb, const Act& a, int64_t cols, float* oa, float* ob) {
    q8_tile(wa, a, cols, oa);
    q8_tile(wb, a, cols, ob);
}
#endif

// One output element of an fp32 matrix: row r of m times activation a.
inline float row_dot(const VoMat& m, int64_t r, const Act& a) {
    return dot_f32((const float*)m.w + r * m.cols, a.f, m.cols);
}

// Rows walked per step of a GEMV: int8 and int4 a tile of 32, fp32 one.
constexpr int ROW_TILE = Q4_TILE;
static_assert(Q8_TILE == ROW_TILE, "int8 and int4 tiles walk the same rows");
template <int FMT>
constexpr int TILE_ROWS = FMT == FMT_F32 ? 1 : ROW_TILE;

// How many tiles (int8, int4) or rows (fp32) the GEMVs in format FMT read side by side, one read
// stream each (for_tile_streams, tiles_dot): Q4_STREAMS int4 tiles (four in the AVX-512 build,
// two in the AVX2 one, one in plain C); in the AVX2-only build two int8 tiles; F32_STREAMS fp32
// rows; one elsewhere. On an AVX2-only development host
// (first-generation EPYC, family 23 model 1), one core read a buffer about a third faster as
// three or four streams than as one; pairs made the int8 pass about 14 % and the fp32 pass
// about 20 % faster at 1 thread, and four fp32 rows a few percent more; on the AVX-512 one
// (Zen 4) int8 tiles read fastest one stream per core, and fp32 rows did with an earlier layout
// (docs/analysis/cpu-kernels/).
// F32_STREAMS is VO_F32_STREAMS where the build defines it (1, 2 or 4: vllm_omni.cpu.native
// chooses it per host, as it does the int4 prefetch), else four in the AVX2-only build and one
// elsewhere.
#if defined(VO_F32_STREAMS)
constexpr int F32_STREAMS = VO_F32_STREAMS;
#elif defined(VO_AVX2_ONLY)
constexpr int F32_STREAMS = 4;
#else
constexpr int F32_STREAMS = 1;
#endif
static_assert(F32_STREAMS == 1 || F32_STREAMS == 2 || F32_STREAMS == 4, "fp32 rows are read 1, 2 or 4 at a time");
template <int FMT>
constexpr int STREAMS = FMT == FMT_I4 ? Q4_STREAMS : FMT == FMT_F32 ? F32_STREAMS :
#if defined(VO_AVX2_ONLY)
                                                                  2;
#else
                                                                  1;
#endif

// out[i] = row r0 + i of m . a, for i < nr <= ROW_TILE (int8/int4: r0 is a tile's first row and
// nr the whole tile), m in format FMT. A row's result does not depend on the tile it falls in,
// so not on the thread count either.
template <int FMT>
inline void tile_dot(const VoMat& m, int64_t r0, int nr, const Act& a, float* out) {
    if constexpr (FMT == FMT_I4) {
        q4_tile(q4_tile_at(m, r0), a, m.cols, out);
    } else if constexpr (FMT == FMT_I8) {
        q8_tile(q8_tile_at(m, r0), a, m.cols, out);
        const float* s = (const float*)m.s + r0;
        for (int i = 0; i < nr; ++i) out[i] *= s[i];
    } else {
        for (int i = 0; i < nr; ++i) out[i] = row_dot(m, r0 + i, a);
    }
}

// tile_dot for the N tiles (int8: N <= 2; int4: N <= 2 or Q4_STREAMS) or rows (fp32) at r[0..N)
// into v[0..N), read side by side (q4_tile2, q4_tiles, q8_tile2, dot_f32_rows) where the build
// reads the format in several streams, one after the other elsewhere; every row's result is
// tile_dot's.
template <int FMT, int N>
inline void tiles_dot(const VoMat& m, const int64_t* r, const Act& a, float (*v)[TILE_ROWS<FMT>]) {
    static_assert(FMT == FMT_F32 || N <= 2 || (FMT == FMT_I4 && N == Q4_STREAMS),
                  "int8 tiles are read one or two at a time, int4 tiles also Q4_STREAMS at a time");
    if constexpr (N == 1) {
        tile_dot<FMT>(m, r[0], TILE_ROWS<FMT>, a, v[0]);
    } else if constexpr (FMT == FMT_I4 && N == 2) {
        q4_tile2(q4_tile_at(m, r[0]), q4_tile_at(m, r[1]), a, m.cols, v[0], v[1]);
    } else if constexpr (FMT == FMT_I4) {
#if defined(VO_AVX512VNNI)
        const uint8_t* w[N];
        float* o[N];
        for (int k = 0; k < N; ++k) w[k] = q4_tile_at(m, r[k]), o[k] = v[k];
        q4_tiles<N>(w, a, m.cols, o);
#endif
    } else if constexpr (FMT == FMT_I8) {
        q8_tile2(q8_tile_at(m, r[0]), q8_tile_at(m, r[1]), a, m.cols, v[0], v[1]);
        const float* s = (const float*)m.s;
        for (int k = 0; k < N; ++k)
            for (int i = 0; i < ROW_TILE; ++i) v[k][i] *= s[r[k] + i];
    } else if constexpr (STREAMS<FMT> > 1) {
        const float* w[N];
        float out[N];
        for (int k = 0; k < N; ++k) w[k] = (const float*)m.w + r[k] * m.cols;
        dot_f32_rows<N>(w, a.f, m.cols, out);
        for (int k = 0; k < N; ++k) v[k][0] = out[k];
    } else {
        for (int k = 0; k < N; ++k) v[k][0] = row_dot(m, r[k], a);
    }
}

// f<FMT>() for the format code fmt: each format's GEMV loop is compiled on its own. With the
// three formats' tile dots as branches of one loop, the int8 pass of the development host took
// 12 to 16 % longer once the int4 branch had become a call (docs/analysis/cpu-kernels/).
template <class F>
inline void with_fmt(int fmt, F&& f) {
    if (fmt == FMT_I4)
        f(std::integral_constant<int, FMT_I4>());
    else if (fmt == FMT_I8)
        f(std::integral_constant<int, FMT_I8>());
    else
        f(std::integral_constant<int, FMT_F32>());
}

// ---------------------------------------------------------------------------------------------
// Workspace layout (all sizes in floats/bytes derived from the stack dims).

struct Work {
    float* x;       // [T, H] residual stream
    float* xn;      // [T, maxin] attention output; a frame's staged projection input (fp32)
    float* qkv;     // [T, q_dim + 2 kv_dim]
    float* h;       // [T, maxin] swiglu output
    float* scores;  // [heads, max_pos]
    Act* act;       // [team][MAX_TOKENS] each thread's copy of the next GEMV's input (own_act)
    float* normed;  // [team][MAX_TOKENS, maxin] each thread's normed rows (own_normed)
    int64_t maxin;
    int64_t xn_stride;
    int64_t qkv_stride;
    float* extra;   // [extra_len] caller scratch (a predictor frame: logits [V], sampling [2V])
    int64_t extra_len;
};

inline int64_t align64(int64_t v) { return (v + 63) & ~int64_t(63); }

int run_threads(const VoStack& st) { return st.threads > 0 ? st.threads : omp_get_max_threads(); }

// The workspace's bytes for st (the return value) and, with w, its buffers in st.ws. With w it
// also writes the table of each thread's activations into st.ws: callers go through
// lay_out_work, which checks the size first (the thread count sets it).
int64_t layout(const VoStack& st, int64_t extra_len, Work* w) {
    const int64_t H = st.hidden, I = st.inter, qd = (int64_t)st.heads * st.head_dim,
                  kvd = (int64_t)st.kv_heads * st.head_dim;
    int64_t maxin = std::max({H, I, qd, extra_len});
    maxin = (maxin + 63) / 64 * 64;
    int64_t off = 0;
    char* base = (char*)st.ws;
    auto take = [&](int64_t bytes) -> char* {
        char* p = base ? base + off : nullptr;
        off += align64(bytes);
        return p;
    };
    Work tmp;
    Work& W = w ? *w : tmp;
    W.maxin = maxin;
    W.xn_stride = maxin;
    W.qkv_stride = qd + 2 * kvd;
    W.x = (float*)take(sizeof(float) * MAX_TOKENS * H);
    W.xn = (float*)take(sizeof(float) * MAX_TOKENS * maxin);
    W.qkv = (float*)take(sizeof(float) * MAX_TOKENS * W.qkv_stride);
    W.h = (float*)take(sizeof(float) * MAX_TOKENS * maxin);
    W.scores = (float*)take(sizeof(float) * st.heads * (int64_t)st.max_pos);
    const int team = run_threads(st);  // each thread its own activations (own_act)
    W.normed = (float*)take(sizeof(float) * team * MAX_TOKENS * maxin);
    W.act = (Act*)take(sizeof(Act) * team * MAX_TOKENS);
    for (int i = 0; i < team * MAX_TOKENS; ++i) {
        Act a;
        a.f = nullptr;
        a.q = (int8_t*)take(maxin);
        a.d = (float*)take(sizeof(float) * maxin / 32);
        a.gcorr = (int32_t*)take(sizeof(int32_t) * maxin / 16);
        if (base) W.act[i] = a;
    }
    W.extra = (float*)take(sizeof(float) * std::max<int64_t>(extra_len, 1));
    W.extra_len = extra_len;
    return off;
}

// Bytes of workspace st needs (vo_workspace_bytes): its layout, computed without touching st.ws.
int64_t workspace_bytes(const VoStack& st, int64_t extra_len) {
    VoStack s = st;
    s.ws = nullptr;
    return layout(s, extra_len, nullptr) + 64;
}

// W laid out in st.ws, or false, with nothing written, where st.ws_bytes is too small for st's
// thread count (the entry points then return -4).
bool lay_out_work(const VoStack& st, int64_t extra_len, Work& W) {
    if (workspace_bytes(st, extra_len) > st.ws_bytes) return false;
    layout(st, extra_len, &W);
    return true;
}

// ---------------------------------------------------------------------------------------------
// Building blocks, called from inside the parallel region.

// The sum of squares is kept in double (8 lanes under AVX2): every thread norms the whole row
// (norm_prep) on the path between two GEMVs, so it is vectorised, but it stays as exact as the
// reference's.
inline void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
    double ss = 0.0;
    int64_t i = 0;
#if defined(VO_AVX2)
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    alignas(32) double part[4];
    _mm256_store_pd(part, _mm256_add_pd(a0, a1));
    ss = (part[0] + part[1]) + (part[2] + part[3]);
#endif
    for (; i < n; ++i) ss += (double)x[i] * x[i];
    float r = 1.f / std::sqrt((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// out[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n. Under AVX2 (and so
// in the AVX-512 build too), whole vectors of 8 take exp from the coefficients of Cephes'
// single-precision polynomial after range reduction (within about 2 ulp of exp, see NOTICE);
// the rest, and the plain-C build, take std::exp. One std::exp call per value cost the int4
// gate/up GEMV about 8 % at 2 threads and the 1-thread int4 pass about 6 %
// (docs/analysis/cpu-kernels/). The exponent is clamped to where 2^k stays a normal float:
// exp(-g) then saturates where silu(g) is g or 0 to well below float precision, and a NaN g
// still gives NaN through the division.
inline void swiglu(const float* g, const float* u, float* out, int n) {
    int i = 0;
#if defined(VO_AVX2)
    const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f), one = _mm256_set1_ps(1.f);
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv), lo), hi);
        const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 r = _mm256_fnmadd_ps(k, ln2_lo, _mm256_fnmadd_ps(k, ln2_hi, x));
        __m256 p = _mm256_set1_ps(1.9875691500e-4f);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
        p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, one));
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        const __m256 ex = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, ex)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; ++i) out[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

// Each thread's own copy of a GEMV's input, quantised (int8/int4) or pointed at (fp32), and its
// own buffer of normed rows. Every thread prepares the whole input itself, from rows that the
// team has finished writing, instead of one thread preparing it while the others wait at a
// barrier and then read it from that thread's cache: the barrier goes, and each core's row dots
// read activations from its own cache. Every copy holds the same values, so results do not
// change. With the two threads in two core complexes of the Zen 4 development host, this made
// the 2-thread int4 pass about 9 % faster and its predictor frame about 8 %; with both on one
// L3 it changed nothing clear of the noise (docs/analysis/cpu-kernels/).
inline Act* own_act(Work& W) { return W.act + (int64_t)omp_get_thread_num() * MAX_TOKENS; }
inline float* own_normed(Work& W) { return W.normed + (int64_t)omp_get_thread_num() * MAX_TOKENS * W.xn_stride; }

// This thread's activations of T tokens (rows of src with stride) for the next GEMV; called by
// every thread of the team.
inline void prep_act(int fmt, Work& W, const float* src, int64_t stride, int64_t n, int T) {
    Act* act = own_act(W);
    for (int t = 0; t < T; ++t) {
        act[t].f = src + t * stride;
        if (fmt != FMT_F32) quantize_act(src + t * stride, n, act[t]);
    }
}

// rmsnorm of T rows of x (stride n) with weight w into this thread's normed rows, prepared for
// the next GEMV; called by every thread of the team.
inline void norm_prep(int fmt, Work& W, const float* x, const float* w, int64_t n, int T, float eps) {
    float* y = own_normed(W);
    for (int t = 0; t < T; ++t) rmsnorm(x + t * n, w, y + t * W.xn_stride, n, eps);
    prep_act(fmt, W, y, W.xn_stride, n, T);
}

enum OutMode { OUT_STORE = 0, OUT_ADD = 1 };

// f(r0, nr) over [0, rows) in tiles of TILE rows (the last one may be short): each thread takes
// a contiguous share of the tiles, as a static schedule would, and walks it in order; a barrier
// ends the loop, as `omp for`. TILE is a compile-time constant so that the one-row case
// compiles to a plain row loop. Rows walked one at a time, int8 rows gained 10-15 % on one core
// from walking two far-apart parts of a share at once; in tiles of 32 rows, one run of bytes
// each, int8 reads fastest in order on the AVX-512 development host, but not on the AVX2-only
// one (STREAMS, docs/analysis/cpu-kernels/).
template <int TILE, class F>
inline void for_tiles(int64_t rows, F&& f) {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t tiles = (rows + TILE - 1) / TILE;
    for (int64_t t = tiles * id / nt, hi = tiles * (id + 1) / nt; t < hi; ++t)
        f(t * TILE, TILE == 1 ? 1 : (int)std::min<int64_t>(TILE, rows - t * TILE));
#pragma omp barrier
}

// f(r0, nr) over the rows of a GEMV in format FMT: int8 and int4 by tiles of 32 rows, fp32 by row.
template <int FMT, class F>
inline void for_gemv_rows(int64_t rows, F&& f) {
    for_tiles<TILE_ROWS<FMT>>(rows, f);
}

// fn(r) over groups of N tiles of TILE rows, r[0..N) their first rows, and f1(r0) over tiles left
// over, for rows a multiple of TILE: each thread takes a contiguous share of the tiles, as
// for_tiles does, cuts it into N parts of ceil(n / N) tiles (the last ones shorter or empty)
// and walks them side by side, the first tile of each part, then the second of each, ...; a
// barrier ends the loop. With the tiles of a group read a little of each in turn (q4_tile2), a
// core reads N streams at once, as the read probe may: on the development host (Zen 4) two made
// the int4 pass about 3 % faster at 1 thread and up to 5 % at 2, where pairs of adjacent tiles
// made it a fifth slower, and four (q4_tiles) 3 to 5 % faster again at 1 thread
// (docs/analysis/cpu-kernels/).
template <int TILE, int N, class FN, class F1>
inline void for_tile_streams(int64_t rows, FN&& fn, F1&& f1) {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t tiles = rows / TILE, lo = tiles * id / nt, n = tiles * (id + 1) / nt - lo, len = (n + N - 1) / N;
    for (int64_t i = 0; i < len; ++i) {
        int64_t r[N];
        int k = 0;
        for (; k < N && k * len + i < n; ++k) r[k] = (lo + k * len + i) * TILE;
        if (k == N)
            fn(r);
        else
            for (int j = 0; j < k; ++j) f1(r[j]);
    }
#pragma omp barrier
}

// The walk of a GEMV's rows in format FMT, split across the team; ends in a barrier. Where
// STREAMS<FMT> > 1, in groups of that many tiles (int8, int4) or rows (fp32), group(r) with r
// their first rows, and tile(r0, nr) for one left over (for_tile_streams); otherwise
// tile(r0, nr) by tiles or rows, each thread's share in order (for_gemv_rows). The GEMVs and
// their plain reads (read_rows) both walk this way.
template <int FMT, class Group, class Tile>
inline void walk_rows(int64_t rows, Group&& group, Tile&& tile) {
    if constexpr (STREAMS<FMT> > 1)
        for_tile_streams<TILE_ROWS<FMT>, STREAMS<FMT>>(rows, group, [&](int64_t r0) { tile(r0, TILE_ROWS<FMT>); });
    else
        for_gemv_rows<FMT>(rows, tile);
}

// emit(t, r0, nr, v) with v = rows r0 .. r0 + nr of m . act[t], for every row of m and t < T, in
// walk_rows; ends in a barrier. A row's result depends on neither the walk nor the thread count.
template <class Emit>
inline void gemv_rows(int fmt, const VoMat& m, const Act* act, int T, Emit&& emit) {
#if defined(VO_AVX512VNNI)
    if (fmt == FMT_I4 && T >= 2) {  // several rows: each tile decoded once for up to Q4_ROWS of them
        for_gemv_rows<FMT_I4>(m.rows, [&](int64_t r0, int nr) {
            float v[Q4_ROWS][ROW_TILE];
            const uint8_t* w = q4_tile_at(m, r0);
            for (int t = 0; t < T; t += Q4_ROWS) {
                const int n = std::min(Q4_ROWS, T - t);
                q4_tile_rows_n(w, act + t, n, m.cols, v);
                for (int k = 0; k < n; ++k) emit(t + k, r0, nr, v[k]);
            }
        });
        return;
    }
#endif
    with_fmt(fmt, [&](auto F) {
        constexpr int FMT = decltype(F)::value;
        walk_rows<FMT>(
            m.rows,
            [&](const int64_t* r) {
                constexpr int N = STREAMS<FMT>, NR = TILE_ROWS<FMT>;
                float v[N][NR];
                for (int t = 0; t < T; ++t) {
                    tiles_dot<FMT, N>(m, r, act[t], v);
                    for (int k = 0; k < N; ++k) emit(t, r[k], NR, v[k]);
                }
            },
            [&](int64_t r0, int nr) {
                float v[ROW_TILE];
                for (int t = 0; t < T; ++t) {
                    tile_dot<FMT>(m, r0, nr, act[t], v);
                    emit(t, r0, nr, v);
                }
            });
    });
}

// out[t, r] (=|+=) m[r] . act[t] for r in [0, rows), rows split across the team.
inline void gemv(int fmt, const VoMat& m, Work& W, int T, float* out, int64_t out_stride, OutMode mode) {
    gemv_rows(fmt, m, own_act(W), T, [&](int t, int64_t r0, int nr, const float* v) {
        float* o = out + t * out_stride + r0;
        for (int i = 0; i < nr; ++i) o[i] = mode == OUT_ADD ? o[i] + v[i] : v[i];
    });
}

// h[t, r] = silu(gate_r . a_t) * (up_r . a_t) for r in [0, I). A gate tile (or fp32 row) and
// its up tile are read side by side where the build reads the format in several streams
// (tiles_dot): two streams (the AVX2-only build reads other fp32 matrices four rows at a time).
// Where int4 is read as four streams, each thread's gate tiles are walked in two parts side by
// side (for_tile_streams), and a gate tile of each part is read with its up tile: four streams,
// a tile left over at the end of a share as a pair.
inline void gemv_swiglu(int fmt, const VoMat& m, int64_t I, Work& W, int T, float* out, int64_t out_stride) {
    const Act* act = own_act(W);
    with_fmt(fmt, [&](auto F) {
        constexpr int FMT = decltype(F)::value;
        auto pair = [&](int64_t r0, int nr) {
            for (int t = 0; t < T; ++t) {
                const int64_t r[2] = {r0, r0 + I};
                float gu[2][TILE_ROWS<FMT>];
                tiles_dot<FMT, 2>(m, r, act[t], gu);
                swiglu(gu[0], gu[1], out + t * out_stride + r0, nr);
            }
        };
        if constexpr (FMT == FMT_I4 && STREAMS<FMT> == 4) {
#if defined(VO_AVX512VNNI)
            if (T >= 2) {  // several rows: each gate and up tile decoded once for up to Q4_ROWS of them
                for_gemv_rows<FMT>(I, [&](int64_t r0, int nr) {
                    float g[Q4_ROWS][ROW_TILE], u[Q4_ROWS][ROW_TILE];
                    for (int t = 0; t < T; t += Q4_ROWS) {
                        const int n = std::min(Q4_ROWS, T - t);
                        q4_tile_rows_n(q4_tile_at(m, r0), act + t, n, m.cols, g);
                        q4_tile_rows_n(q4_tile_at(m, r0 + I), act + t, n, m.cols, u);
                        for (int k = 0; k < n; ++k) swiglu(g[k], u[k], out + (t + k) * out_stride + r0, nr);
                    }
                });
                return;
            }
#endif
            for_tile_streams<ROW_TILE, 2>(
                I,
                [&](const int64_t* g) {
                    for (int t = 0; t < T; ++t) {
                        const int64_t r[4] = {g[0], g[1], g[0] + I, g[1] + I};
                        float gu[4][ROW_TILE];
                        tiles_dot<FMT, 4>(m, r, act[t], gu);
                        for (int k = 0; k < 2; ++k) swiglu(gu[k], gu[k + 2], out + t * out_stride + g[k], ROW_TILE);
                    }
                },
                [&](int64_t r0) { pair(r0, ROW_TILE); });
        } else {
            for_gemv_rows<FMT>(I, pair);
        }
    });
}

inline void head_norm_rope(float* v, const float* nw, const float* cs, const float* sn, int hd, float eps) {
    float tmp[512];
    rmsnorm(v, nw, tmp, hd, eps);
    const int h2 = hd / 2;
    for (int j = 0; j < h2; ++j) {
        float a = tmp[j], b = tmp[j + h2];
        v[j] = a * cs[j] - b * sn[j];
        v[j + h2] = b * cs[j] + a * sn[j];
    }
}

// s[0..n) = softmax(s[0..n)), in place: the attention weights of one query head.
inline void softmax(float* s, int n) {
    float mx = -std::numeric_limits<float>::infinity(), sum = 0.f;
    for (int i = 0; i < n; ++i) mx = std::max(mx, s[i]);
    for (int i = 0; i < n; ++i) {
        s[i] = std::exp(s[i] - mx);
        sum += s[i];
    }
    const float inv = 1.f / sum;
    for (int i = 0; i < n; ++i) s[i] *= inv;
}

// Attention of R query heads that share one KV head, for one token at position n - 1: head r's
// scores against cache rows 0 .. n - 1 (from element kv0) into sc[r], softmax, and the weighted
// sum of the value rows into o[r]. Each cache row is read once for all R heads, four rows at a
// time, in order. With the query heads taken one at a time (a dot product per K row and an
// axpy on the output per V row, attend_kv_head's plain path), the attention took about a fifth
// of the talker's int4 step at 256 positions on an AVX2-only development host (first-generation
// EPYC, family 23 model 1), where converting an fp16 row costs about as much as the
// multiply-adds of two heads that use it (docs/analysis/cpu-kernels/).
#if defined(VO_AVX2)
template <bool F16>
inline __m256 kv_load8(const void* cache, int64_t off) {
    if constexpr (F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)cache + off)));
    else
        return _mm256_loadu_ps((const float*)cache + off);
}

// A software prefetch of `bytes` from p, in the AVX2-only build: on the AVX2-only development
// host, requesting the rows some positions ahead made the talker step about 14 % faster (as for
// the int4 tiles, see q4_prefetch); the AVX-512 build has none, as it was not tried there.
constexpr int KV_PREFETCH_ROWS = 16;
inline void kv_prefetch(const void* p, int64_t bytes) {
#if defined(VO_AVX2_ONLY)
    for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch((const char*)p + l, _MM_HINT_T0);
#else
    (void)p, (void)bytes;
#endif
}

// sc[r][j + p] = scale * q[r] . K row j + p for p < P: one accumulator per row and head.
template <int P, int R, bool F16>
inline void score_rows(const float* const* q, const void* kc, int64_t kv0, int j, int hd, float scale, float* const* sc) {
    __m256 acc[P][R];
    for (auto& ap : acc)
        for (auto& a : ap) a = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        __m256 qv[R];
        for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q[r] + i);
        for (int p = 0; p < P; ++p) {
            const __m256 k = kv_load8<F16>(kc, kv0 + (int64_t)(j + p) * hd + i);
            for (int r = 0; r < R; ++r) acc[p][r] = _mm256_fmadd_ps(qv[r], k, acc[p][r]);
        }
    }
    for (int p = 0; p < P; ++p)
        for (int r = 0; r < R; ++r) sc[r][j + p] = hsum256(acc[p][r]) * scale;
}

// o[r] += sc[r][j + p] * V row j + p for p < P, in one sweep of the outputs.
template <int P, int R, bool F16>
inline void add_value_rows(const void* vc, int64_t kv0, int j, int hd, const float* const* sc, float* const* o) {
    const int64_t off = kv0 + (int64_t)j * hd;
    __m256 pr[P][R];
    for (int p = 0; p < P; ++p)
        for (int r = 0; r < R; ++r) pr[p][r] = _mm256_set1_ps(sc[r][j + p]);
    for (int i = 0; i < hd; i += 8) {
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_loadu_ps(o[r] + i);
        for (int p = 0; p < P; ++p) {
            const __m256 v = kv_load8<F16>(vc, off + (int64_t)p * hd + i);
            for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(pr[p][r], v, acc[r]);
        }
        for (int r = 0; r < R; ++r) _mm256_storeu_ps(o[r] + i, acc[r]);
    }
}

// Requires hd % 8 == 0.
template <int R, bool F16>
inline void attend_heads(const float* const* q, const void* kc, const void* vc, int64_t kv0, int n, int hd, float scale,
                         float* const* sc, float* const* o) {
    const int64_t row = hd * (F16 ? 2 : 4);  // bytes
    auto ahead = [&](const void* cache, int j) {
        kv_prefetch((const char*)cache + (kv0 + (int64_t)(j + KV_PREFETCH_ROWS) * hd) * (F16 ? 2 : 4), 4 * row);
    };
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        ahead(kc, j);
        score_rows<4, R, F16>(q, kc, kv0, j, hd, scale, sc);
    }
    for (; j < n; ++j) score_rows<1, R, F16>(q, kc, kv0, j, hd, scale, sc);
    for (int r = 0; r < R; ++r) {
        softmax(sc[r], n);
        for (int i = 0; i < hd; ++i) o[r][i] = 0.f;
    }
    // values: four rows per sweep of the outputs (which stay in L1)
    for (j = 0; j + 4 <= n; j += 4) {
        ahead(vc, j);
        add_value_rows<4, R, F16>(vc, kv0, j, hd, sc, o);
    }
    for (; j < n; ++j) add_value_rows<1, R, F16>(vc, kv0, j, hd, sc, o);
}
#endif

// Attention of the `rep` query heads of one KV head for one token at position n - 1: q, sc and o
// are the first head's query, score row and output, the others following at hd, mp and hd
// elements. The vector path takes the heads in pairs (attend_heads); the plain-C path, and a
// head_dim that is not a multiple of 8, one at a time, a row dot per score and an axpy per value
// row.
inline void attend_kv_head(const float* q, float* sc, float* o, int rep, int64_t mp, const void* kc, const void* vc,
                           int64_t kv0, int n, int hd, bool f16, float scale) {
    int r = 0;
#if defined(VO_AVX2)
    if (hd % 8 == 0) {
        for (; r + 2 <= rep; r += 2) {
            const float* qs[2] = {q + r * hd, q + (r + 1) * hd};
            float* scs[2] = {sc + r * mp, sc + (r + 1) * mp};
            float* os[2] = {o + r * hd, o + (r + 1) * hd};
            (f16 ? attend_heads<2, true> : attend_heads<2, false>)(qs, kc, vc, kv0, n, hd, scale, scs, os);
        }
        if (r < rep) {
            const float* q1 = q + r * hd;
            float *s1 = sc + r * mp, *o1 = o + r * hd;
            (f16 ? attend_heads<1, true> : attend_heads<1, false>)(&q1, kc, vc, kv0, n, hd, scale, &s1, &o1);
        }
        return;
    }
#endif
    for (; r < rep; ++r) {
        const float* qr = q + r * hd;
        float *s = sc + r * mp, *out = o + r * hd;
        for (int j = 0; j < n; ++j) s[j] = kv_dot(qr, kc, kv0 + (int64_t)j * hd, hd, f16) * scale;
        softmax(s, n);
        for (int d = 0; d < hd; ++d) out[d] = 0.f;
        for (int j = 0; j < n; ++j) kv_axpy(out, s[j], vc, kv0 + (int64_t)j * hd, hd, f16);
    }
}

// Where a call's rows sit. By default (pos == nullptr) row t is at position pos0 + t of the
// layers' own caches; for a batch of streams (vo_stack_forward_rows), row t is at pos[t] of its
// own caches, kv[(t * n_layers + l) * 2] (keys) and kv[(t * n_layers + l) * 2 + 1] (values) in
// layer l. Rows that share a cache come in order of their positions.
struct Rows {
    int pos0 = 0;
    const int32_t* pos = nullptr;
    void* const* kv = nullptr;
    int n_layers = 0;
    int at(int t) const { return pos ? pos[t] : pos0 + t; }
    void* k(const VoLayer& L, int l, int t) const { return kv ? kv[((int64_t)t * n_layers + l) * 2] : L.k_cache; }
    void* v(const VoLayer& L, int l, int t) const { return kv ? kv[((int64_t)t * n_layers + l) * 2 + 1] : L.v_cache; }
};

inline Rows rows_from(int pos0) {
    Rows r;
    r.pos0 = pos0;
    return r;
}

// One decoder layer (index l) on T tokens placed as R says (inside the parallel region).
void layer_forward(const VoStack& st, const VoLayer& L, int l, Work& W, int T, const Rows& R) {
    const int fmt = st.fmt;
    const int64_t H = st.hidden, I = st.inter, hd = st.head_dim;
    const int64_t qd = (int64_t)st.heads * hd, kvd = (int64_t)st.kv_heads * hd;
    const int h2 = (int)hd / 2;
    const int rep = st.heads / st.kv_heads;
    const int64_t mp = st.max_pos;
    const bool f16 = st.kv_f16 != 0;

    norm_prep(fmt, W, W.x, L.input_norm, H, T, st.eps);
    gemv(fmt, L.qkv, W, T, W.qkv, W.qkv_stride, OUT_STORE);
    // Attention, one KV head (and its `rep` query heads) per iteration: k norm + rope, k and v
    // into the cache, then each query head's norm + rope and causal softmax over the cache,
    // output into xn. A KV head's query heads need only its own cache rows, so one loop (one
    // barrier) does it all.
    const float scale = 1.f / std::sqrt((float)hd);
#pragma omp for schedule(static)
    for (int64_t kh = 0; kh < st.kv_heads; ++kh) {
        for (int t = 0; t < T; ++t) {
            const int pos = R.at(t);
            float* k = W.qkv + t * W.qkv_stride + qd + kh * hd;
            const float* v = W.qkv + t * W.qkv_stride + qd + kvd + kh * hd;
            head_norm_rope(k, L.k_norm, st.rope_cos + (int64_t)pos * h2, st.rope_sin + (int64_t)pos * h2, (int)hd, st.eps);
            kv_store(R.k(L, l, t), (kh * mp + pos) * hd, k, (int)hd, f16);
            kv_store(R.v(L, l, t), (kh * mp + pos) * hd, v, (int)hd, f16);
        }
        const int64_t kv0 = kh * mp * hd;  // this KV head's rows
        for (int t = 0; t < T; ++t) {
            const int pos = R.at(t), n = pos + 1;
            for (int64_t h = kh * rep; h < (kh + 1) * rep; ++h)
                head_norm_rope(W.qkv + t * W.qkv_stride + h * hd, L.q_norm, st.rope_cos + (int64_t)pos * h2,
                               st.rope_sin + (int64_t)pos * h2, (int)hd, st.eps);
            const int64_t h = kh * rep;
            attend_kv_head(W.qkv + t * W.qkv_stride + h * hd, W.scores + h * mp, W.xn + t * W.xn_stride + h * hd, rep, mp,
                           R.k(L, l, t), R.v(L, l, t), kv0, n, (int)hd, f16, scale);
        }
    }
    prep_act(fmt, W, W.xn, W.xn_stride, qd, T);
    gemv(fmt, L.o, W, T, W.x, H, OUT_ADD);
    norm_prep(fmt, W, W.x, L.post_norm, H, T, st.eps);
    gemv_swiglu(fmt, L.gate_up, I, W, T, W.h, W.xn_stride);
    prep_act(fmt, W, W.h, W.xn_stride, I, T);
    gemv(fmt, L.down, W, T, W.x, H, OUT_ADD);
}

// ---------------------------------------------------------------------------------------------
// Sampling of one residual code from logits[n]: greedy argmax, or temperature -> top-k ->
// argmax(scaled + gumbel) over the kept entries, gumbel = -log(-log(u)) computed for the kept
// entries only. u comes from `uniforms` (indexed by id) or, when `uniforms` is NULL, from the
// counter-based generator at index noise_base + id (the same bits as sampler.counter_uniforms).

inline float counter_uniform(uint64_t key, uint64_t index) {
    uint64_t z = key + (index + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (float)((double)((z >> 41) * 2 + 1) / 16777216.0);
}

int64_t sample(const float* logits, int64_t n, int greedy, float temperature, int top_k, const float* uniforms,
               uint64_t noise_key, uint64_t noise_base, float* scratch) {
    if (greedy) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; ++i)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int64_t i = 0; i < n; ++i) scratch[i] = logits[i] / temperature;
    float thresh = -std::numeric_limits<float>::infinity();
    if (top_k > 0 && top_k < n) {
        float* tmp = scratch + n;
        std::memcpy(tmp, scratch, sizeof(float) * n);
        std::nth_element(tmp, tmp + (top_k - 1), tmp + n, [](float a, float b) { return a > b; });
        thresh = tmp[top_k - 1];
    }
    int64_t best = -1;
    float bv = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
        if (scratch[i] < thresh) continue;
        const float u = uniforms ? uniforms[i] : counter_uniform(noise_key, noise_base + (uint64_t)i);
        const float v = scratch[i] + -std::log(-std::log(u));
        if (best < 0 || v > bv) {
            bv = v;
            best = i;
        }
    }
    return best < 0 ? 0 : best;
}

// Whether a matrix of `rows` rows can be packed in `fmt` (int8 and int4 come in tiles of 32 rows).
inline bool rows_ok(int fmt, int64_t rows) { return rows >= 1 && (fmt == FMT_F32 || rows % ROW_TILE == 0); }

bool stack_ok(const VoStack& st) {
    const int64_t H = st.hidden, I = st.inter;
    const int64_t qd = (int64_t)st.heads * st.head_dim, kvd = (int64_t)st.kv_heads * st.head_dim;
    if (H % 64 || I % 64 || qd % 64) return false;
    if (st.head_dim > 512 || st.head_dim % 2) return false;
    return rows_ok(st.fmt, qd + 2 * kvd);
}

}  // namespace

extern "C" {

int32_t vo_version() { return 17; }

int32_t vo_max_tokens() { return MAX_TOKENS; }

// The counter-based uniforms of key at indices index0 .. index0 + n - 1 (for tests).
void vo_counter_uniforms(uint64_t key, uint64_t index0, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = counter_uniform(key, index0 + (uint64_t)i);
}

// How many int4 groups ahead the AVX2 build's int4 tiles prefetch (q4_prefetch), 0 for none:
// the setting now in force, or -1 where the build has no such prefetch (the AVX-512 and plain C
// builds) or `groups` is outside 0..64. Called between kernel calls, never during one.
int32_t vo_set_q4_prefetch(int32_t groups) {
#if defined(VO_AVX2_ONLY)
    if (groups < 0 || groups > 64) return -1;
    q4_prefetch_groups = groups;
    return groups;
#else
    (void)groups;
    return -1;
#endif
}

// How many fp32 rows the GEMVs read side by side (F32_STREAMS): what a benchmark records.
int32_t vo_f32_streams() { return F32_STREAMS; }

int32_t vo_isa() {
#if defined(VO_AVX512VNNI)
    return 2;
#elif defined(VO_AVX2)
    return 1;
#elif defined(VO_NEON_DOT)
    return 3;
#else
    return 0;
#endif
}

// Bytes of workspace needed for this stack at its thread count, with extra_len floats of caller
// scratch: 0 for vo_stack_forward and vo_talker_step, max(3 V, Ht) for vo_predictor_frame (logits
// [V], then sampling scratch [2V]). With fewer bytes the entry points return -4.
int64_t vo_workspace_bytes(const VoStack* st, int64_t extra_len) { return workspace_bytes(*st, extra_len); }

// Run the stack on T tokens x[T, H] at positions pos0.., leaving the final-normed hidden
// states in out[T, H]; with a head, also logits[head.rows] of the last token. One predictor
// pass is this call with T = 1 and one lm_head (used for timing single passes and in tests).
int32_t vo_stack_forward(const VoStack* stp, const float* x, int32_t T, int32_t pos0, float* out, const VoMat* head,
                         float* logits) {
    const VoStack& st = *stp;
    if (!stack_ok(st) || T < 1 || T > MAX_TOKENS || pos0 < 0 || pos0 + T > st.max_pos) return -1;
    if (head && (head->cols != st.hidden || !rows_ok(st.fmt, head->rows))) return -2;
    Work W;
    if (!lay_out_work(st, 0, W)) return -4;
    const int64_t H = st.hidden;
    std::memcpy(W.x, x, sizeof(float) * T * H);
#pragma omp parallel num_threads(run_threads(st))
    {
        for (int l = 0; l < st.n_layers; ++l) layer_forward(st, st.layers[l], l, W, T, rows_from(pos0));
        if (head) norm_prep(st.fmt, W, W.x + (T - 1) * H, st.final_norm, H, 1, st.eps);
#pragma omp single nowait
        for (int t = 0; t < T; ++t) rmsnorm(W.x + t * H, st.final_norm, out + t * H, H, st.eps);
        if (head) gemv(st.fmt, *head, W, 1, logits, head->rows, OUT_STORE);
    }
    return 0;
}

// The stack on T rows of several streams at once: row t at position pos[t] of its own KV caches
// (kv, laid out as Rows says), each weight tile read once for all T rows. out[T, H] gets the
// final-normed hidden states; with a head, logits[L, head.rows] get the logits of the last L =
// head_rows rows (every row where head_rows is 0 or more than T), so that a caller who puts the
// rows it needs logits of last does not pay the head for the others. A stream that is prefilling
// brings several rows, in order of position; a stream that steps brings one.
int32_t vo_stack_forward_rows(const VoStack* stp, const float* x, int32_t T, const int32_t* pos, void* const* kv,
                              float* out, const VoMat* head, float* logits, int32_t head_rows) {
    const VoStack& st = *stp;
    if (!stack_ok(st) || T < 1 || T > MAX_TOKENS || !pos || !kv) return -1;
    for (int t = 0; t < T; ++t)
        if (pos[t] < 0 || pos[t] >= st.max_pos) return -1;
    if (head && (head->cols != st.hidden || !rows_ok(st.fmt, head->rows))) return -2;
    Work W;
    if (!lay_out_work(st, 0, W)) return -4;
    const int64_t H = st.hidden;
    std::memcpy(W.x, x, sizeof(float) * T * H);
    Rows R;
    R.pos = pos;
    R.kv = kv;
    R.n_layers = st.n_layers;
    const int L = (head_rows <= 0 || head_rows > T) ? T : head_rows;
#pragma omp parallel num_threads(run_threads(st))
    {
        for (int l = 0; l < st.n_layers; ++l) layer_forward(st, st.layers[l], l, W, T, R);
        if (head) norm_prep(st.fmt, W, W.x + (int64_t)(T - L) * H, st.final_norm, H, L, st.eps);
#pragma omp single nowait
        for (int t = 0; t < T; ++t) rmsnorm(W.x + t * H, st.final_norm, out + t * H, H, st.eps);
        if (head) gemv(st.fmt, *head, W, L, logits, head->rows, OUT_STORE);
    }
    return 0;
}

}  // extern "C"

namespace {

// Quantised activations of M rows of x (K inputs each) for the row dots, with their own storage.
struct ActBuffers {
    std::vector<Act> act;
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> gcorr;

    ActBuffers(int fmt, const float* x, int64_t M, int64_t K) : act((size_t)M) {
        if (fmt != FMT_F32) {
            q.resize((size_t)(M * K));
            d.resize((size_t)(M * K / 32));
            gcorr.resize((size_t)(M * K / 16));
        }
        for (int64_t t = 0; t < M; ++t) {
            act[t].f = x + t * K;
            if (fmt == FMT_F32) continue;
            act[t].q = q.data() + t * K;
            act[t].d = d.data() + t * K / 32;
            act[t].gcorr = gcorr.data() + t * K / 16;
            quantize_act(x + t * K, K, act[t]);
        }
    }
};

bool inputs_ok(int32_t fmt, int64_t K) {
    return K >= 64 && K % 64 == 0 && (fmt == FMT_F32 || fmt == FMT_I8 || fmt == FMT_I4);
}

bool linear_ok(int32_t fmt, int64_t K, int64_t N) { return inputs_ok(fmt, K) && rows_ok(fmt, N); }

}  // namespace

extern "C" {

// A plain linear layer: y[t, r] = x[t] . m[r] for t < M, r < m.rows (no norm, no bias), with the
// same row dots as the stacks (int8/int4 activations quantised per row in blocks of 32). Each
// weight row is read once for all M rows of x. m.cols must be a multiple of 64 (int8/int4:
// m.rows a multiple of 32). threads <= 0 uses OpenMP's default. Returns 0, or -1 for a bad shape/format.
int32_t vo_linear(int32_t fmt, const VoMat* mp, const float* x, int32_t M, float* y, int32_t threads) {
    const VoMat& m = *mp;
    const int64_t K = m.cols, N = m.rows;
    if (M < 1 || !linear_ok(fmt, K, N)) return -1;
    const ActBuffers ab(fmt, x, M, K);
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    gemv_rows(fmt, m, ab.act.data(), M, [&](int t, int64_t r0, int nr, const float* v) {
        std::memcpy(y + t * N + r0, v, sizeof(float) * nr);
    });
    return 0;
}

// The SwiGLU of the stacks' gate/up GEMV on its own: out[i] = silu(g[i]) * u[i] for i < n, the
// way that GEMV computes it for a tile of n rows (swiglu). For testing its exponential.
void vo_swiglu(const float* g, const float* u, float* out, int32_t n) { swiglu(g, u, out, n); }

}  // extern "C"

namespace {

// `sweeps` runs of sweep() (which must end in a barrier) inside one parallel region of `threads`
// threads; seconds[i] is the wall time of run i, from the barrier before it to its last barrier.
template <class F>
void timed_sweeps(int32_t threads, int32_t sweeps, double* seconds, F&& sweep) {
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (int32_t r = 0; r < sweeps; ++r) {
#pragma omp barrier
        const double t0 = omp_get_wtime();
        sweep();
#pragma omp master
        seconds[r] = omp_get_wtime() - t0;
    }
}

// Each matrix's shape, for the GEMV sweeps: inputs no wider than K, rows the format can tile.
bool sweep_mats_ok(int32_t fmt, const VoMat* mats, int32_t n, int64_t K) {
    if (n < 1 || !inputs_ok(fmt, K)) return false;
    for (int32_t j = 0; j < n; ++j)
        if (mats[j].cols > K || !linear_ok(fmt, mats[j].cols, mats[j].rows)) return false;
    return true;
}

}  // namespace

extern "C" {

// The GEMVs of n matrices, one after another as a pass walks its weights, `sweeps` times over,
// inside one parallel region (as vo_read_bandwidth sweeps its buffer): seconds[i] is the wall
// time of sweep i, from a barrier to the barrier that ends its last GEMV. Matrix j takes the
// first mats[j].cols of the K inputs x (quantised blocks of a prefix are the prefix's own); y
// (at least the largest rows) holds the last matrix's output. For telling how fast the row
// dots decode packed weights wherever those sit (L2, L3, memory), apart from the rest of a
// pass: the activations are quantised once, before the timing. Returns 0, or -1 for a bad
// shape/format.
int32_t vo_gemv_sweeps(int32_t fmt, const VoMat* mats, int32_t n, const float* x, int64_t K, float* y, int32_t sweeps,
                       int32_t threads, double* seconds) {
    if (sweeps < 1 || !sweep_mats_ok(fmt, mats, n, K)) return -1;
    const ActBuffers ab(fmt, x, 1, K);
    timed_sweeps(threads, sweeps, seconds, [&] {
        for (int32_t j = 0; j < n; ++j)
            gemv_rows(fmt, mats[j], ab.act.data(), 1, [&](int, int64_t r0, int nr, const float* v) {  // ends in a barrier
                std::memcpy(y + r0, v, sizeof(float) * nr);
            });
    });
    return 0;
}

// Codebook 0 of a talker step in one pass over the vocabulary (vllm_omni.cpu.sampler.FastSampler):
// repetition penalty on the ids in seen[n_seen] (x / penalty if x > 0, else x * penalty), ids
// [codebook_size, V) suppressed except eos_id, eos_id too when mask_eos, then the top_k of
// logits / temperature, the nucleus filter when top_p < 1, and Gumbel-max with the counter-based
// noise of noise_key at index noise_base + id. scratch holds 2 V floats. Returns the id, or -1.
int64_t vo_talker_sample(const float* logits, int64_t V, const int64_t* seen, int64_t n_seen, float penalty,
                         int64_t codebook_size, int64_t eos_id, int32_t mask_eos, float temperature, int32_t top_k,
                         float top_p, uint64_t noise_key, uint64_t noise_base, float* scratch) {
    if (V < 1 || top_k < 1 || temperature <= 0.f) return -1;
    const float ninf = -std::numeric_limits<float>::infinity();
    float* s = scratch;
    std::memcpy(s, logits, sizeof(float) * V);
    for (int64_t j = 0; j < n_seen; ++j) {
        const int64_t id = seen[j];
        if (id < 0 || id >= V) return -1;
        s[id] = s[id] > 0.f ? s[id] / penalty : s[id] * penalty;
    }
    for (int64_t i = codebook_size; i < V; ++i)
        if (i != eos_id) s[i] = ninf;
    if (mask_eos && eos_id >= 0 && eos_id < V) s[eos_id] = ninf;
    // the top_k ids, in descending order of their values (ties: lower id first)
    const int64_t k = std::min<int64_t>(top_k, V);
    int64_t* idx = (int64_t*)(scratch + V);  // V floats of room for k int64 ids (k <= V / 2 here)
    if (2 * k > V) return -1;
    std::vector<int64_t> order;
    order.reserve((size_t)V);
    for (int64_t i = 0; i < V; ++i)
        if (s[i] > ninf) order.push_back(i);
    if (order.empty()) return -1;
    const int64_t kk = std::min<int64_t>(k, (int64_t)order.size());
    auto desc = [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
    std::partial_sort(order.begin(), order.begin() + kk, order.end(), desc);
    for (int64_t j = 0; j < kk; ++j) idx[j] = order[(size_t)j];
    int64_t keep = kk;
    if (top_p < 1.f) {  // smallest prefix whose mass reaches top_p (mass strictly above each rank < top_p)
        const float m = s[idx[0]] / temperature;
        double z = 0.0;
        for (int64_t j = 0; j < kk; ++j) z += std::exp((double)(s[idx[j]] / temperature - m));
        double above = 0.0;
        keep = 0;
        for (int64_t j = 0; j < kk; ++j) {
            if (above >= (double)top_p) break;
            above += std::exp((double)(s[idx[j]] / temperature - m)) / z;
            ++keep;
        }
    }
    int64_t best = idx[0];
    float bv = ninf;
    for (int64_t j = 0; j < keep; ++j) {
        const int64_t id = idx[j];
        const float u = counter_uniform(noise_key, noise_base + (uint64_t)id);
        const float v = s[id] / temperature + -std::log(-std::log(u));
        if (v > bv) {
            bv = v;
            best = id;
        }
    }
    return best;
}

// One talker step: x[H] at position pos -> hidden[H] (after the final norm) and
// logits[head.rows] = head . hidden.
int32_t vo_talker_step(const VoStack* stp, const VoMat* head, const float* x, int32_t pos, float* logits,
                       float* hidden) {
    const VoStack& st = *stp;
    if (!stack_ok(st) || pos < 0 || pos >= st.max_pos || head->cols != st.hidden || !rows_ok(st.fmt, head->rows))
        return -1;
    Work W;
    if (!lay_out_work(st, 0, W)) return -4;
    const int64_t H = st.hidden;
    std::memcpy(W.x, x, sizeof(float) * H);
#pragma omp parallel num_threads(run_threads(st))
    {
        for (int l = 0; l < st.n_layers; ++l) layer_forward(st, st.layers[l], l, W, 1, rows_from(pos));
        norm_prep(st.fmt, W, W.x, st.final_norm, H, 1, st.eps);
#pragma omp single nowait
        rmsnorm(W.x, st.final_norm, hidden, H, st.eps);
        gemv(st.fmt, *head, W, 1, logits, head->rows, OUT_STORE);
    }
    return 0;
}

}  // extern "C"

namespace {

// Streams one predictor call may carry: its first pass takes two rows a stream.
constexpr int MAX_STREAMS = MAX_TOKENS / 2;

// The predictor frames of B streams in lockstep (B <= MAX_STREAMS): pass k of every stream in
// one layer walk, each weight tile read once for all of them, each stream in its own 16-slot
// cache (kv: per stream and layer, keys then values, as Rows lays them out by row). The first
// pass holds every stream's past hidden state (rows 0 .. B-1, position 0), then every stream's
// c0 embedding (rows B .. 2B-1, position 1); pass k > 1 holds every stream's last code's
// embedding at position k. Arguments as vo_predictor_frame's, one of each per stream (keys[b],
// rows of past_hidden, c0_embed, codes_out, embed_sum_out; uniforms and logits_out [B, G, V]);
// buf holds 3 B V floats (the logits, then the sampler's scratch); nullptr: the workspace's extra.
// The workspace is laid out with extra_len = max(3 V, Ht) (FusedPredictor's), so that a row in
// table space fits in xn.
int32_t predictor_frames(const VoStack& st, const VoMat* heads, int32_t G, const float* emb, int64_t Ht,
                         const VoMat* proj, const float* proj_bias, int32_t B, void* const* kv,
                         const float* past_hidden, const float* c0_embed, int32_t greedy, float temperature,
                         int32_t top_k, const float* uniforms, const uint64_t* keys, int64_t* codes_out,
                         float* embed_sum_out, float* logits_out, float* buf) {
    const int64_t H = st.hidden;
    const int64_t V = heads[0].rows;
    const bool has_proj = proj && proj->w;
    if (!stack_ok(st) || G + 1 > st.max_pos || !rows_ok(st.fmt, V) || B < 1 || B > MAX_STREAMS) return -1;
    if (!has_proj && Ht != H) return -2;
    if (has_proj && (proj->rows != H || proj->cols != Ht || Ht % 64)) return -2;
    Work W;
    if (!lay_out_work(st, std::max<int64_t>(3 * V, Ht), W)) return -4;
    if (!buf && W.extra_len < 3 * B * V) return -4;
    float* logits_buf = buf ? buf : W.extra;  // [B, V]
    float* scratch = logits_buf + (int64_t)B * V;  // [B, 2V]
    // row r of a call belongs to stream r % B
    const int n_layers = st.n_layers;
    std::vector<void*> row_kv((size_t)2 * B * n_layers * 2);
    for (int r = 0; r < 2 * B; ++r)
        for (int l = 0; l < n_layers * 2; ++l) row_kv[(size_t)r * n_layers * 2 + l] = kv[(size_t)(r % B) * n_layers * 2 + l];
    std::vector<int32_t> pos((size_t)2 * B);
    std::vector<int64_t> code((size_t)B, 0);
    Rows R;
    R.pos = pos.data();
    R.kv = row_kv.data();
    R.n_layers = n_layers;
    for (int b = 0; b < B; ++b)
        for (int64_t i = 0; i < Ht; ++i) embed_sum_out[b * Ht + i] = c0_embed[b * Ht + i];

#pragma omp parallel num_threads(run_threads(st))
    {
        for (int k = 1; k <= G; ++k) {
            const int T = (k == 1) ? 2 * B : B;
            // input rows, in table space (Ht wide), into xn (to be projected) or straight into x
            float* dst = has_proj ? W.xn : W.x;
            const int64_t stride = has_proj ? W.xn_stride : H;
#pragma omp single
            for (int r = 0; r < T; ++r) {
                pos[r] = (k == 1) ? r / B : k;
                const float* src = (k == 1) ? (r < B ? past_hidden + r * Ht : c0_embed + (r - B) * Ht)
                                            : emb + ((int64_t)(k - 2) * V + code[r]) * Ht;
                std::memcpy(dst + r * stride, src, sizeof(float) * Ht);
            }
            if (has_proj) {
                prep_act(st.fmt, W, W.xn, W.xn_stride, Ht, T);
                gemv(st.fmt, *proj, W, T, W.x, H, OUT_STORE);
#pragma omp single
                for (int t = 0; t < T; ++t)
                    for (int64_t i = 0; i < H; ++i) W.x[t * H + i] += proj_bias[i];
            }
            for (int l = 0; l < n_layers; ++l) layer_forward(st, st.layers[l], l, W, T, R);
            // final norm of each stream's last row, head k-1, sampling
            norm_prep(st.fmt, W, W.x + (T - B) * H, st.final_norm, H, B, st.eps);
            gemv(st.fmt, heads[k - 1], W, B, logits_buf, V, OUT_STORE);
#pragma omp for schedule(static)
            for (int b = 0; b < B; ++b) {
                const float* lg = logits_buf + b * V;
                const int64_t c = sample(lg, V, greedy, temperature, top_k,
                                         uniforms ? uniforms + ((int64_t)b * G + (k - 1)) * V : nullptr, keys[b],
                                         (uint64_t)(k - 1) * (uint64_t)V, scratch + 2 * b * V);
                code[b] = c;
                codes_out[b * G + k - 1] = c;
                if (logits_out) std::memcpy(logits_out + ((int64_t)b * G + (k - 1)) * V, lg, sizeof(float) * V);
                const float* e = emb + ((int64_t)(k - 1) * V + c) * Ht;
                float* sum = embed_sum_out + b * Ht;
                for (int64_t i = 0; i < Ht; ++i) sum[i] += e[i];
            }
        }
    }
    return 0;
}

}  // namespace

extern "C" {

// A whole predictor frame in one call, in the stack's own cache.
//   heads[G]          lm_head per residual codebook, [V, H] each (G = 15)
//   emb               fp32 [G, V, Ht] codec embedding tables
//   proj, proj_bias   optional [H, Ht] projection (proj->w == NULL for identity, Ht == H)
//   past_hidden, c0_embed  [Ht]
//   uniforms          [G, V] uniforms (sampled mode), or NULL to use the counter-based noise of
//                     noise_key at index (k - 1) * V + id; ignored when greedy
//   codes_out         int64 [G]; embed_sum_out [Ht]; logits_out [G, V] (all logits, or NULL)
int32_t vo_predictor_frame(const VoStack* stp, const VoMat* heads, int32_t G, const float* emb, int64_t Ht,
                           const VoMat* proj, const float* proj_bias, const float* past_hidden,
                           const float* c0_embed, int32_t greedy, float temperature, int32_t top_k,
                           const float* uniforms, uint64_t noise_key, int64_t* codes_out, float* embed_sum_out,
                           float* logits_out) {
    const VoStack& st = *stp;
    std::vector<void*> kv((size_t)st.n_layers * 2);
    for (int l = 0; l < st.n_layers; ++l) {
        kv[2 * l] = st.layers[l].k_cache;
        kv[2 * l + 1] = st.layers[l].v_cache;
    }
    return predictor_frames(st, heads, G, emb, Ht, proj, proj_bias, 1, kv.data(), past_hidden, c0_embed, greedy,
                            temperature, top_k, uniforms, &noise_key, codes_out, embed_sum_out, logits_out, nullptr);
}

// The predictor frames of B streams in one call (predictor_frames), each in its own cache:
// kv[(b * n_layers + l) * 2] keys and [... + 1] values of stream b in layer l, each laid out as
// the stack's own ([kv_heads, max_pos, head_dim]). keys[b] is stream b's noise key; scratch
// holds 3 B V floats. Returns 0, -1 for a bad shape or B outside 1 .. vo_max_streams(), -2 for
// a bad projection, -4 for a workspace too small.
int32_t vo_predictor_frames(const VoStack* stp, const VoMat* heads, int32_t G, const float* emb, int64_t Ht,
                            const VoMat* proj, const float* proj_bias, int32_t B, void* const* kv,
                            const float* past_hidden, const float* c0_embed, int32_t greedy, float temperature,
                            int32_t top_k, const float* uniforms, const uint64_t* keys, int64_t* codes_out,
                            float* embed_sum_out, float* logits_out, float* scratch) {
    if (!kv || !keys || !scratch) return -1;
    return predictor_frames(*stp, heads, G, emb, Ht, proj, proj_bias, B, kv, past_hidden, c0_embed, greedy,
                            temperature, top_k, uniforms, keys, codes_out, embed_sum_out, logits_out, scratch);
}

int32_t vo_max_streams() { return MAX_STREAMS; }

// ---------------------------------------------------------------------------------------------
// Read-bandwidth probe: every thread streams its own slice of a buffer with wide loads,
// reading `streams` (1..4) equal parts of the slice at once (one core keeps more misses in
// flight with two concurrent streams than with one: a floor must allow for it).
// Returns the best GB/s (1e9 bytes/s) over `reps` sweeps, or a negative value on failure.

}  // extern "C"

namespace {

#if defined(__AVX512F__)
using vline = __m512i;
inline vline vzero() { return _mm512_setzero_si512(); }
inline vline vadd(vline a, const char* p) {
    return _mm512_add_epi64(a, _mm512_load_si512((const void*)p));
}
inline int64_t vsum(vline a) { return _mm512_reduce_add_epi64(a); }
#elif defined(__AVX2__)
using vline = __m256i;
inline vline vzero() { return _mm256_setzero_si256(); }
inline vline vadd(vline a, const char* p) {
    return _mm256_add_epi64(_mm256_add_epi64(a, _mm256_load_si256((const __m256i*)p)),
                            _mm256_load_si256((const __m256i*)(p + 32)));
}
inline int64_t vsum(vline a) {
    return _mm256_extract_epi64(a, 0) + _mm256_extract_epi64(a, 1) + _mm256_extract_epi64(a, 2) +
           _mm256_extract_epi64(a, 3);
}
#else
using vline = int64_t;
inline vline vzero() { return 0; }
inline vline vadd(vline a, const char* p) {
    const int64_t* q = (const int64_t*)p;
    return a + q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
}
inline int64_t vsum(vline a) { return a; }
#endif

// Sum of the 64-byte lines [lo, hi) of buf, read as S concurrent streams.
template <int S>
int64_t read_lines(const char* buf, int64_t lo, int64_t hi) {
    const int64_t len = (hi - lo) / S;
    vline a[S], b[S];
    for (int s = 0; s < S; ++s) a[s] = b[s] = vzero();
    int64_t j = 0;
    for (; j + 2 <= len; j += 2)
        for (int s = 0; s < S; ++s) {
            const char* p = buf + (lo + s * len + j) * 64;
            a[s] = vadd(a[s], p);
            b[s] = vadd(b[s], p + 64);
        }
    for (; j < len; ++j)
        for (int s = 0; s < S; ++s) a[s] = vadd(a[s], buf + (lo + s * len + j) * 64);
    for (int64_t i = lo + S * len; i < hi; ++i) a[0] = vadd(a[0], buf + i * 64);
    int64_t total = 0;
    for (int s = 0; s < S; ++s) total += vsum(a[s]) + vsum(b[s]);
    return total;
}

// The n bytes at p (a multiple of 64), in order, each 64-byte line added into a or b as 64-bit
// words, pairs of lines alternating between the two.
inline void read_span(const char* p, int64_t n, vline& a, vline& b) {
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a = vadd(a, p + i);
        b = vadd(b, p + i + 64);
    }
    for (; i < n; i += 64) a = vadd(a, p + i);
}

// The bytes tile_dot reads from m's weights for rows r0 .. r0 + nr (int8: with the row scales),
// in the same order (read_span): the GEMV's reads with none of its unpacking, dots or scale
// multiplies.
inline void tile_read(int fmt, const VoMat& m, int64_t r0, int nr, vline& a, vline& b, int64_t& scalars) {
    const int64_t row = m.cols * (fmt == FMT_F32 ? 4 : 1);
    const char* p = fmt == FMT_I4 ? (const char*)q4_tile_at(m, r0) : (const char*)m.w + r0 * row;
    read_span(p, fmt == FMT_I4 ? q4_tile_bytes(m.cols) : row * nr, a, b);  // int8: nr rows are one tile
    if (fmt == FMT_I8)
        for (int k = 0; k < nr; ++k) scalars += ((const int32_t*)m.s)[r0 + k];
}

// tile_read over n tiles (int8, int4) or rows (fp32) at r[0..n) as tiles_dot reads them where the
// build reads the format in several streams: a group of each tile in turn (1024 or 576 bytes,
// int4 with the same prefetches), 128 bytes of each row in turn.
inline void tiles_read(int fmt, const VoMat& m, const int64_t* r, int n, vline& a, vline& b, int64_t& scalars) {
    const bool i4 = fmt == FMT_I4;
    const int64_t row = m.cols * 4, step = fmt == FMT_F32 ? 128 : i4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES;
    const int64_t bytes = fmt == FMT_F32 ? row : i4 ? q4_tile_bytes(m.cols) : m.cols * ROW_TILE;
    auto at = [&](int64_t r0) {
        return fmt == FMT_F32 ? (const char*)m.w + r0 * row
               : i4           ? (const char*)q4_tile_at(m, r0)
                              : (const char*)q8_tile_at(m, r0);
    };
    for (int64_t i = 0; i < bytes; i += step)
        for (int k = 0; k < n; ++k) {
            const char* p = at(r[k]) + i;
            if (i4) q4_prefetch((const uint8_t*)p);
            read_span(p, std::min(step, bytes - i), a, b);
        }
    if (fmt == FMT_I8)
        for (int k = 0; k < n; ++k)
            for (int j = 0; j < ROW_TILE; ++j) scalars += ((const int32_t*)m.s)[r[k] + j];
}

// The reads of gemv_rows over m for one token, in its walk (walk_rows; ends in a barrier).
inline void read_rows(int fmt, const VoMat& m, vline& a, vline& b, int64_t& scalars) {
    with_fmt(fmt, [&](auto F) {
        walk_rows<decltype(F)::value>(
            m.rows, [&](const int64_t* r) { tiles_read(fmt, m, r, STREAMS<decltype(F)::value>, a, b, scalars); },
            [&](int64_t r0, int nr) { tile_read(fmt, m, r0, nr, a, b, scalars); });
    });
}

}  // namespace

extern "C" {

// The best GB/s of `reps` timed sweeps (after one untimed) reading `bytes` of one buffer with
// `threads` threads, each reading its slice as `streams` concurrent streams. gbs_out, if not null,
// gets every timed sweep's GB/s in order: the spread of a host's reads, beside their best.
double vo_read_bandwidth(int64_t bytes, int32_t threads, int32_t reps, int32_t streams, double* gbs_out) {
    if (threads < 1) threads = omp_get_max_threads();
    if (streams < 1 || streams > 4) return -3.0;
    const int64_t huge = 2 << 20;  // 2 MiB: transparent huge pages, as the packed weights get
    bytes = bytes / huge * huge;
    if (bytes <= 0) return -1.0;
    // A fresh private mapping, never memory the allocator hands back already touched (madvise
    // does not turn pages that already exist into huge ones), 2 MiB-aligned inside it.
    const size_t mapped = (size_t)(bytes + huge);
    void* map = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return -2.0;
    char* buf = (char*)(((uintptr_t)map + (uintptr_t)huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(buf, (size_t)bytes, MADV_HUGEPAGE);  // best effort, before the first touch
    const int64_t n = bytes / 64;  // 64-byte lines
    double best = 0.0;
    volatile int64_t sink = 0;
#pragma omp parallel num_threads(threads)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t lo = n * id / nt, hi = n * (id + 1) / nt;
        std::memset(buf + lo * 64, id + 1, (size_t)((hi - lo) * 64));  // first touch by the reader
        for (int r = 0; r < reps + 1; ++r) {
#pragma omp barrier
            double t0 = omp_get_wtime();
            const int64_t s = streams == 1   ? read_lines<1>(buf, lo, hi)
                              : streams == 2 ? read_lines<2>(buf, lo, hi)
                              : streams == 3 ? read_lines<3>(buf, lo, hi)
                                             : read_lines<4>(buf, lo, hi);
#pragma omp barrier
            double t1 = omp_get_wtime();
#pragma omp atomic
            sink += s;
#pragma omp single
            {
                if (r > 0) {  // the first sweep warms the TLB and page tables
                    double gbs = (double)bytes / (t1 - t0) / 1e9;
                    if (gbs > best) best = gbs;
                    if (gbs_out) gbs_out[r - 1] = gbs;
                }
            }
        }
    }
    munmap(map, mapped);
    (void)sink;
    return best;
}

// The reads of vo_gemv_sweeps alone: the same matrices, rows, thread shares, walk, read streams
// and barriers, but each row's bytes only loaded and summed (read_rows), with no dots. Against the
// GEMV sweeps it tells how much of their time the arithmetic adds to the reads they must make.
// Matrices must start on 64-byte boundaries (the packed arenas do). *checksum gets the sum, over
// all sweeps and mod 2^64, of the bytes read as 64-bit words (int8 row scales as 32-bit ones), so
// a test can tell that every byte a GEMV reads was read once per sweep. Returns 0, or -1 for a
// bad shape/format or alignment.
int32_t vo_read_sweeps(int32_t fmt, const VoMat* mats, int32_t n, int32_t sweeps, int32_t threads, double* seconds,
                       int64_t* checksum) {
    int64_t widest = 0;
    for (int32_t j = 0; j < n; ++j) {
        if ((uintptr_t)mats[j].w % 64) return -1;
        widest = std::max(widest, mats[j].cols);
    }
    if (sweeps < 1 || !sweep_mats_ok(fmt, mats, n, widest)) return -1;
    uint64_t total = 0;
    timed_sweeps(threads, sweeps, seconds, [&] {
        vline a = vzero(), b = vzero();
        int64_t scalars = 0;
        for (int32_t j = 0; j < n; ++j) read_rows(fmt, mats[j], a, b, scalars);
        const uint64_t mine = (uint64_t)vsum(a) + (uint64_t)vsum(b) + (uint64_t)scalars;
#pragma omp atomic
        total += mine;
    });
    *checksum = (int64_t)total;
    return 0;
}

}  // extern "C"

extern "C" {

// The clock of the calling thread's core, in GHz, from a chain of `adds` dependent integer adds
// of one register to another (one per cycle on every x86 core this project has met), or 0 where
// the build has no such chain (not x86-64) or `adds` is below 1000. On a shared VM the same core
// ran at 1.9 GHz in one period and 2.5 GHz in another (development measurement), so a benchmark
// artifact records this at its start and end (vllm_omni.cpu.clock). The added value sits in a
// register: a chain of adds of an immediate ran at about four per cycle on the Xeon of family 6,
// model 167 (a 16 GHz reading, against about 4 GHz from this chain and from a chain of
// multiplies; development measurement), its core folding such adds together before they run.
double vo_clock_ghz(int64_t adds) {
#if defined(__x86_64__)
    if (adds < 1000) return 0.0;
    uint64_t x = 0;
    const uint64_t one = 1;
    const int64_t n = adds / 4;
    const double t0 = omp_get_wtime();
    for (int64_t i = 0; i < n; ++i)
        asm volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(one));
    const double dt = omp_get_wtime() - t0;
    return dt > 0.0 ? 4.0 * (double)n / dt / 1e9 : 0.0;
#else
    (void)adds;
    return 0.0;
#endif
}

// The round trip of one cache line between the two threads of a team of two, in ns: thread 0
// writes an odd count, thread 1 answers with the next even one, `trips` times. Where the two
// threads' cores share an L3 the line moves inside it; between core complexes it crosses the
// fabric, several times slower. On the project's Zen 4 host the two vCPUs moved between such
// placements after seconds to a minute or more, and the 2-thread read bandwidth moved with them
// (vllm_omni.cpu.placement). 0 where the team has one thread or `trips` is below 1; -1 where
// the trips take more than a second beyond 1 us each (the two threads sharing one CPU).
double vo_core_round_trip_ns(int64_t trips) {
    if (trips < 1) return 0.0;
    alignas(64) std::atomic<int64_t> flag{0};
    std::atomic<bool> stop{false};
    double result = 0.0;
    const double deadline = omp_get_wtime() + 1.0 + 1e-6 * (double)trips;
    // spin until the flag reads `want`; false once either thread has passed the deadline
    auto wait_for = [&](int64_t want) {
        for (uint32_t spins = 1;; ++spins) {
            if (flag.load(std::memory_order_acquire) == want) return true;
            if ((spins & 0xfff) == 0 && (stop.load(std::memory_order_relaxed) || omp_get_wtime() > deadline)) {
                stop.store(true, std::memory_order_relaxed);
                return false;
            }
        }
    };
#pragma omp parallel num_threads(2)
    {
        if (omp_get_num_threads() == 2) {
#pragma omp barrier
            if (omp_get_thread_num() == 0) {
                const double t0 = omp_get_wtime();
                bool ok = true;
                for (int64_t i = 0; i < trips && ok; ++i) {
                    flag.store(2 * i + 1, std::memory_order_release);
                    ok = wait_for(2 * i + 2);
                }
                result = ok ? (omp_get_wtime() - t0) / (double)trips * 1e9 : -1.0;
            } else {
                for (int64_t i = 0; i < trips && wait_for(2 * i + 1); ++i) flag.store(2 * i + 2, std::memory_order_release);
            }
        }
    }
    return result;
}

}  // extern "C"
