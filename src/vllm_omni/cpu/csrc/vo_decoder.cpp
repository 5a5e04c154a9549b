// Kernels of the 12 Hz speech decoder (code2wav) that PyTorch does poorly at streaming sizes.
//
// SnakeBeta, y = x + inv_b[c] * sin(a[c] * x)^2 per channel c, is about 2.8 million sines per
// 80 ms frame, most of them at 24 kHz over 96 channels; as four separate tensor passes (mul, sin,
// pow, add) it took longer than the convolutions around it. Here it is one pass with a
// range-reduced polynomial sine: sin(u)^2 = sin(r)^2 with r = u - k*pi in [-pi/2, pi/2], a
// degree-11 odd polynomial for sin(r) (absolute error below 1e-7 on that range, about the
// rounding of fp32), and Cody-Waite reduction with pi split in three, so large |u| keep their
// accuracy. Channels are split across threads; the inner loop vectorises.
//
// The long convolutions (the input conv, each block's transposed conv and its ResidualUnits'
// dilated k=7 and 1x1 convs, about 96 % of the decoder's multiply-adds) run in bf16 with fp32
// sums through one call each (vo_conv_bf16): the SnakeBeta before a conv, its causal history, the
// bias and a ResidualUnit's residual are folded into that call, so a conv is one fork-join and
// no im2col. The tile loops are per instruction set in arch/x86/conv_bf16.h (AMX, AVX-512 BF16)
// and arch/arm/conv_bf16.h (BFDOT); the plain-C loop here is their reference.
//
// Built into the same library as vo_kernels.cpp (vllm_omni.cpu.native); the Python side owns
// every buffer it passes (the conv's packed input is a per-thread scratch of this file).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "mca.h"  // VO_MCA_BEGIN / VO_MCA_END: the loop bodies llvm-mca analyses

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define VO_AMX_BF16 1
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define VO_AVX512_BF16 1
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define VO_NEON_BF16 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define VO_AVX512_I8 1
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#define VO_NEON_I8 1
#endif

namespace {

inline float sin2_reduced(float u) {
    constexpr float inv_pi = 0.318309886183790672f;
    constexpr float pi_a = 3.140625f, pi_b = 9.67502593994140625e-4f, pi_c = 1.50995799e-7f;
    const float k = std::nearbyint(u * inv_pi);
    float r = u - k * pi_a;
    r -= k * pi_b;
    r -= k * pi_c;
    const float r2 = r * r;
    // sin(r) = r (1 - r^2/3! + r^4/5! - ...), Taylor to r^11 (error < 6e-8 for |r| <= pi/2)
    float p = -2.50521084e-8f;
    p = p * r2 + 2.75573192e-6f;
    p = p * r2 - 1.98412698e-4f;
    p = p * r2 + 8.33333333e-3f;
    p = p * r2 - 1.66666667e-1f;
    p = p * r2 + 1.0f;
    const float s = r * p;
    return s * s;
}

// --- bf16 causal convolutions --------------------------------------------------------------
//
// y[co, t] = bias[co] + sum over taps j and inputs ci of W[co, ci, j] * in[ci, t + j * d]
//            (+ residual[co, t]),
// in = [hist | snake(x)]: the conv's last (k - 1) * d inputs from the previous call, then this
// call's T samples, through SnakeBeta where the conv has one before it. Both W and in are rounded
// to bf16 (to nearest, ties to even, as torch's .bfloat16()); products are summed in fp32.
//
// Layouts (the AMX tile shapes, which the other loops read the same way):
// - weights, packed once: [C_out / 16][k * C_in / 32][16][32] bf16, 16 output channels by 32
//   inputs a tile, the input index running over (tap, channel), taps outer;
// - input, packed each call: [C_in / 2][row][2] bf16, each pair of channels interleaved sample
//   by sample (a row holds each stream's part side by side: its history, then its samples
//   rounded up to 32, zeros after the last), so the 16 pairs of a 32-channel block at samples
//   t .. t + 15 are one tile of 16 rows, and a tap is an offset.
// C_in and C_out must be multiples of 32.

constexpr int64_t T_PAIR = 32;   // samples of a tile pair
constexpr int64_t T_ITEM = 128;  // samples of a thread's work item

inline uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

inline float from_bf16(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

#if !defined(VO_AMX_BF16) && !defined(VO_AVX512_BF16)
inline void interleave_bf16(const float* a, const float* b, int64_t n, uint16_t* out) {
    for (int64_t i = 0; i < n; ++i) {
        out[2 * i] = to_bf16(a[i]);
        out[2 * i + 1] = to_bf16(b[i]);
    }
}
#endif

#if !defined(VO_AMX_BF16) && !defined(VO_AVX512_BF16) && !defined(VO_NEON_BF16)
// The plain-C tile pair: acc[32][32] (channels by samples) from the packed weights (w0: the first
// 16 channels' tiles; the next 16 follow kb_n tiles later) and the packed input at sample t0.
inline void conv_tile_pair(const uint16_t* w0, int64_t kb_n, const uint16_t* xp, int64_t row, int64_t cb_n,
                           int64_t k, int64_t d, int64_t t0, float* acc) {
    for (int64_t c = 0; c < 32; ++c) {
        const uint16_t* w = w0 + (c / 16) * kb_n * 512 + (c % 16) * 32;
        for (int64_t t = 0; t < 32; ++t) {
            float sum = 0.0f;
            for (int64_t j = 0; j < k; ++j)
                for (int64_t cb = 0; cb < cb_n; ++cb)
                    for (int64_t e = 0; e < 32; ++e) {
                        const uint16_t* b = xp + ((cb * 16 + e / 2) * row + t0 + j * d + t) * 2 + e % 2;
                        sum += from_bf16(w[(j * cb_n + cb) * 512 + e]) * from_bf16(*b);
                    }
            acc[c * 32 + t] = sum;
        }
    }
}

struct TileScope {};
#endif

}  // namespace

#if defined(VO_AMX_BF16) || defined(VO_AVX512_BF16)
#include "arch/x86/conv_bf16.h"
#elif defined(VO_NEON_BF16)
#include "arch/arm/conv_bf16.h"
#endif

namespace {

// acc[32][32] for output samples t0 .. t0 + n - 1 (n <= 32): the tile pair, or its first half
// where the samples are few and the loop has one.
inline void conv_tiles(const uint16_t* w0, int64_t kb_n, const uint16_t* xp, int64_t row, int64_t cb_n, int64_t k,
                       int64_t d, int64_t t0, int64_t n, float* acc) {
#if defined(VO_AMX_BF16)
    if (n <= 16) return conv_tile_half(w0, kb_n, xp, row, cb_n, k, d, t0, acc);
#endif
    (void)n;
    conv_tile_pair(w0, kb_n, xp, row, cb_n, k, d, t0, acc);
}

// Linux hands AMX's tile state to a process only when asked (arch_prctl ARCH_REQ_XCOMP_PERM).
bool conv_ready() {
#if defined(VO_AMX_BF16)
    static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ok;
#else
    return true;
#endif
}

// Samples [s0, s0 + n) of row c of in = [hist | snake(x)] (hist: tail samples a row, null: zeros;
// x: rows of x_stride floats) into out; with new_hist, the row's last tail samples (where s0 + n
// is the end of in). What the bf16 and int8 convs pack their inputs from.
void input_row(int64_t c, const float* hist, const float* x, int64_t x_stride, int64_t tail, int64_t s0, int64_t n,
               const float* snake_a, const float* snake_inv_b, float* new_hist, float* out) {
    int64_t i = 0;
    for (; i < n && s0 + i < tail; ++i) out[i] = hist != nullptr ? hist[c * tail + s0 + i] : 0.0f;
    const float* xr = x + c * x_stride + (s0 + i - tail);
    float* s = out + i;
    const int64_t m = n - i;
    if (snake_a != nullptr) {
        const float ac = snake_a[c], bc = snake_inv_b[c];
#pragma omp simd
        for (int64_t t = 0; t < m; ++t) s[t] = xr[t] + bc * sin2_reduced(ac * xr[t]);
    } else if (m > 0) {
        std::memcpy(s, xr, m * sizeof(float));
    }
    if (new_hist != nullptr)
        for (int64_t j = 0; j < tail; ++j) new_hist[c * tail + j] = out[n - tail + j];
}

// input_row's samples of rows [2 cp, 2 cp + 1] into one pair of the packed input at out (fill
// samples, zeros after n).
void pack_pair(int64_t cp, const float* hist, const float* x, int64_t x_stride, int64_t tail, int64_t s0, int64_t n,
               int64_t fill, const float* snake_a, const float* snake_inv_b, float* new_hist, uint16_t* out,
               float* buf) {
    for (int p = 0; p < 2; ++p)
        input_row(2 * cp + p, hist, x, x_stride, tail, s0, n, snake_a, snake_inv_b, new_hist, buf + p * n);
    interleave_bf16(buf, buf + n, n, out);
    std::memset(out + 2 * n, 0, (fill - n) * 2 * sizeof(uint16_t));
}

inline int64_t round_pairs(int64_t T) { return (T + T_PAIR - 1) / T_PAIR * T_PAIR; }

}  // namespace

extern "C" {

// One stream's part of a native decoder call: several streams' parts go through one call, so
// that each weight is read once for all of them (each part keeps its own state).
struct VoSeg {
    const float* x;         // input [C_in, T], rows x_stride floats apart (0: T)
    int64_t x_stride;
    int64_t T;
    const float* hist;      // a conv's history [C_in, tail] or a transposed conv's carry (null: zeros)
    const float* residual;  // added to y, laid out as y (null: none)
    float* y;               // output rows y_stride floats apart (0: T, or T * stride for a transposed conv)
    int64_t y_stride;
    float* new_hist;        // the next history or carry (null: not kept)
};

}  // extern "C"

namespace {

// One bf16 conv over several streams' parts: its weights, its shape, and where each part sits in
// the packed input (one row of all parts side by side, each its history then its samples
// rounded up to tile pairs) and in the work items (T_ITEM samples of one part each).
struct ConvPlan {
    const uint16_t* wp;
    const float* bias;
    int64_t cout, cin, k, d;
    const float* snake_a;
    const float* snake_inv_b;
    std::vector<VoSeg> seg;
    std::vector<int64_t> off;
    int64_t row = 0, widest = 0;
    struct Chunk {
        int64_t s, t0, t1;
    };
    std::vector<Chunk> chunks;

    ConvPlan(const uint16_t* wp_, const float* bias_, int64_t cout_, int64_t cin_, int64_t k_, int64_t d_,
             const float* a, const float* ib, const VoSeg* segs, int64_t n)
        : wp(wp_), bias(bias_), cout(cout_), cin(cin_), k(k_), d(d_), snake_a(a), snake_inv_b(ib), seg(segs, segs + n) {
        const int64_t tail = (k - 1) * d;
        for (auto& s : seg) {
            if (s.x_stride == 0) s.x_stride = s.T;
            if (s.y_stride == 0) s.y_stride = s.T;
            off.push_back(row);
            row += tail + round_pairs(s.T);
            widest = std::max(widest, tail + s.T);
            for (int64_t t0 = 0; t0 < s.T; t0 += T_ITEM)
                chunks.push_back({int64_t(off.size()) - 1, t0, std::min(s.T, t0 + T_ITEM)});
        }
    }
    int64_t tail() const { return (k - 1) * d; }
    int64_t samples() const {
        int64_t n = 0;
        for (const auto& s : seg) n += s.T;
        return n;
    }
    int32_t check() const {
        if (cout % 32 != 0 || cin % 32 != 0 || k < 1 || d < 1) return -1;
        for (const auto& s : seg)
            if (s.T < 0 || s.x == nullptr || s.y == nullptr) return -1;
        if (samples() > 0 && !conv_ready()) return -2;
        return 0;
    }
    // Whether the call is worth a fork-join: many weights or many inputs.
    bool parallel() const { return cout * cin * k >= 65536 || cin * samples() >= 16384; }
};

// The packed input: a per-thread buffer of the calling thread, grown as needed.
uint16_t* conv_packed(int64_t elems) {
    static thread_local std::vector<uint16_t> packed;
    if (int64_t(packed.size()) < elems) packed.resize(elems);
    return packed.data();
}

// f(co0, chunk, part) for each work item of c (32 output channels from co0, by one chunk of one
// part), the items split across the team (a worksharing loop: call it in a parallel region).
template <class F>
void for_items(const ConvPlan& c, F&& f) {
    const int64_t n_chunks = c.chunks.size(), items = c.cout / 32 * n_chunks;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
        const ConvPlan::Chunk& ch = c.chunks[item % n_chunks];
        f(item / n_chunks * 32, ch, c.seg[ch.s]);
    }
}

// One thread's share of a bf16 conv, inside a parallel region of every thread: its pairs of
// input rows packed (every part), then (after the barrier that ends that loop) its work items of
// 32 output channels by one chunk of one part, each tile pair's sums finished with bias and
// residual.
void conv_share(const ConvPlan& c, uint16_t* xp) {
    const int64_t tail = c.tail(), row = c.row, cb_n = c.cin / 32, kb_n = c.k * cb_n;
    std::vector<float> buf(2 * c.widest);
#pragma omp for schedule(static)
    for (int64_t cp = 0; cp < c.cin / 2; ++cp)
        for (size_t i = 0; i < c.seg.size(); ++i) {
            const VoSeg& s = c.seg[i];
            pack_pair(cp, s.hist, s.x, s.x_stride, tail, 0, tail + s.T, tail + round_pairs(s.T), c.snake_a,
                      c.snake_inv_b, s.new_hist, xp + (cp * row + c.off[i]) * 2, buf.data());
        }
    const TileScope tiles;  // AMX: this thread's tile configuration, released at the end
    (void)tiles;
    alignas(64) float acc[32 * 32];
    for_items(c, [&](int64_t co0, const ConvPlan::Chunk& ch, const VoSeg& s) {
        for (int64_t t0 = ch.t0; t0 < ch.t1; t0 += T_PAIR) {
            const int64_t n = std::min<int64_t>(T_PAIR, ch.t1 - t0);
            conv_tiles(c.wp + co0 / 16 * kb_n * 512, kb_n, xp + c.off[ch.s] * 2, row, cb_n, c.k, c.d, t0, n, acc);
            for (int64_t r = 0; r < 32; ++r) {
                const int64_t co = co0 + r;
                const float b = c.bias != nullptr ? c.bias[co] : 0.0f;
                float* yr = s.y + co * s.y_stride + t0;
                const float* ar = acc + r * 32;
                if (s.residual != nullptr) {
                    const float* rr = s.residual + co * s.y_stride + t0;
                    for (int64_t t = 0; t < n; ++t) yr[t] = ar[t] + b + rr[t];
                } else {
                    for (int64_t t = 0; t < n; ++t) yr[t] = ar[t] + b;
                }
            }
        }
    });
}

// --- int8 causal convolutions ------------------------------------------------------------
//
// The same convolution as above with int8 products: W rounded per output channel (scale
// sw[co] = max |W[co]| / 127), the input per sample (scale sx[s] = max over channels of
// |in[:, s]| / 127, in = [hist | snake(x)] as above), and each tap's products summed exactly in
// int32 before they are scaled:
//   y[co, t] = bias[co] + sw[co] * sum over taps j of sx[t + j d] * (sum over ci of Wq * inq)
//              (+ residual[co, t]).
// The input's scale is per sample, so a chunking of the stream changes no result: frame by frame
// equals a whole decode bit for bit. The tap sums are integers, so every loop gives the same ones,
// and the scaling (here, in plain C, in one order) gives every build the same bits.
//
// Layouts (the bf16 ones with bytes for halves and quads for pairs):
// - weights, packed once: [C_out / 16][k * C_in / 32][16][32] int8, as the bf16 tiles;
// - input, packed each call: [C_in / 4][row][4] bytes, four channels interleaved sample by
//   sample, plus sx[row]; a loop that multiplies unsigned by signed bytes (AVX-512 VNNI) stores
//   each as q + I8_OFFSET, and the tap sums lose I8_OFFSET times the tap's weight sum (wsum).

constexpr int64_t I8_TILE = 512;  // bytes of a weight tile: 16 channels by 32 inputs

#if !defined(VO_AVX512_I8) && !defined(VO_NEON_I8)
constexpr int32_t I8_OFFSET = 0;

// The plain-C tap: acc[32][32] (channels by samples) = the int32 sums of tap j, for the 32
// channels whose tiles start at w0 (the next 16 channels' kb_n tiles later), samples t0 .. t0 + 31.
inline void conv_i8_tap(const int8_t* w0, int64_t kb_n, const uint8_t* xp, int64_t row, int64_t cb_n, int64_t j,
                        int64_t d, int64_t t0, int32_t* acc) {
    for (int64_t c = 0; c < 32; ++c) {
        const int8_t* w = w0 + (c / 16) * kb_n * I8_TILE + (c % 16) * 32;
        for (int64_t t = 0; t < 32; ++t) {
            int32_t sum = 0;
            for (int64_t cb = 0; cb < cb_n; ++cb)
                for (int64_t e = 0; e < 32; ++e)
                    sum += int32_t(w[(j * cb_n + cb) * I8_TILE + e]) *
                           int32_t(int8_t(xp[((cb * 8 + e / 4) * row + t0 + j * d + t) * 4 + e % 4]));
            acc[c * 32 + t] = sum;
        }
    }
}
#endif

}  // namespace

#if defined(VO_AVX512_I8)
#include "arch/x86/conv_i8.h"
#elif defined(VO_NEON_I8)
#include "arch/arm/conv_i8.h"
#endif

namespace {

// One thread's share of an int8 conv, inside a parallel region of every thread: the input through
// SnakeBeta into f [C_in][row] (its quads of channels), then its samples' scales and bytes (by
// blocks of samples), then its work items as conv_share's, each tap's sums scaled into y.
void conv_i8_share(const ConvPlan& c, const int8_t* wq, const float* sw, const int32_t* wsum, float* f, uint8_t* xp,
                   float* sx) {
    const int64_t tail = c.tail(), row = c.row, cb_n = c.cin / 32, kb_n = c.k * cb_n;
#pragma omp for schedule(static)
    for (int64_t cq = 0; cq < c.cin / 4; ++cq)
        for (size_t i = 0; i < c.seg.size(); ++i) {
            const VoSeg& s = c.seg[i];
            for (int64_t ci = 4 * cq; ci < 4 * cq + 4; ++ci) {  // the whole row, then zeros to its tile pairs
                float* in = f + ci * row + c.off[i];
                input_row(ci, s.hist, s.x, s.x_stride, tail, 0, tail + s.T, c.snake_a, c.snake_inv_b, s.new_hist, in);
                std::fill(in + tail + s.T, in + tail + round_pairs(s.T), 0.0f);
            }
        }
    constexpr int64_t BLOCK = 64;
#pragma omp for schedule(static)
    for (int64_t b0 = 0; b0 < row; b0 += BLOCK) {
        const int64_t n = std::min(BLOCK, row - b0);
        float m[BLOCK] = {};
        for (int64_t ci = 0; ci < c.cin; ++ci) {
            const float* fr = f + ci * row + b0;
            for (int64_t t = 0; t < n; ++t) m[t] = std::max(m[t], std::fabs(fr[t]));
        }
        float inv[BLOCK];
        for (int64_t t = 0; t < n; ++t) {
            sx[b0 + t] = m[t] / 127.0f;
            inv[t] = m[t] > 0.0f ? 127.0f / m[t] : 0.0f;
        }
        for (int64_t cq = 0; cq < c.cin / 4; ++cq)
            for (int64_t t = 0; t < n; ++t)
                for (int p = 0; p < 4; ++p) {
                    const float v = std::nearbyint(f[(4 * cq + p) * row + b0 + t] * inv[t]);
                    xp[(cq * row + b0 + t) * 4 + p] = uint8_t(int32_t(std::min(127.0f, std::max(-127.0f, v))) + I8_OFFSET);
                }
    }
    alignas(64) int32_t acc[32 * 32];
    alignas(64) float sum[32 * 32];
    for_items(c, [&](int64_t co0, const ConvPlan::Chunk& ch, const VoSeg& s) {
        const uint8_t* xs = xp + c.off[ch.s] * 4;
        const float* ss = sx + c.off[ch.s];
        for (int64_t t0 = ch.t0; t0 < ch.t1; t0 += T_PAIR) {
            const int64_t n = std::min<int64_t>(T_PAIR, ch.t1 - t0);
            std::fill(sum, sum + 32 * 32, 0.0f);
            for (int64_t j = 0; j < c.k; ++j) {
                conv_i8_tap(wq + co0 / 16 * kb_n * I8_TILE, kb_n, xs, row, cb_n, j, c.d, t0, acc);
                const float* sj = ss + t0 + j * c.d;
                for (int64_t r = 0; r < 32; ++r) {
                    const int32_t off = I8_OFFSET * wsum[(co0 + r) * c.k + j];
                    for (int64_t t = 0; t < n; ++t) sum[r * 32 + t] += float(acc[r * 32 + t] - off) * sj[t];
                }
            }
            for (int64_t r = 0; r < 32; ++r) {
                const int64_t co = co0 + r;
                const float b = c.bias != nullptr ? c.bias[co] : 0.0f, scale = sw[co];
                float* yr = s.y + co * s.y_stride + t0;
                const float* rr = s.residual != nullptr ? s.residual + co * s.y_stride + t0 : nullptr;
                for (int64_t t = 0; t < n; ++t) yr[t] = b + scale * sum[r * 32 + t] + (rr ? rr[t] : 0.0f);
            }
        }
    });
}

// How a conv's products are made, for run_conv and run_tconv: prepare (the calling thread's
// buffers, before the threads fork) and share (each thread's part, in the parallel region).
struct Bf16Product {
    const uint16_t* wp;
    uint16_t* xp = nullptr;
    const uint16_t* plan_weights() const { return wp; }
    void prepare(const ConvPlan& c) { xp = conv_packed(c.cin * c.row); }
    void share(const ConvPlan& c) const { conv_share(c, xp); }
};

struct I8Product {
    const int8_t* wq;
    const float* scale;
    const int32_t* wsum;
    float* f = nullptr;
    uint8_t* xp = nullptr;
    float* sx = nullptr;
    const uint16_t* plan_weights() const { return nullptr; }
    void prepare(const ConvPlan& c) {
        static thread_local std::vector<float> fbuf, sbuf;
        static thread_local std::vector<uint8_t> xbuf;
        fbuf.resize(std::max<size_t>(fbuf.size(), c.cin * c.row));
        xbuf.resize(std::max<size_t>(xbuf.size(), c.cin * c.row));
        sbuf.resize(std::max<size_t>(sbuf.size(), c.row));
        f = fbuf.data();
        xp = xbuf.data();
        sx = sbuf.data();
    }
    void share(const ConvPlan& c) const { conv_i8_share(c, wq, scale, wsum, f, xp, sx); }
};

// One conv (vo_conv_bf16, vo_conv_i8): checked, then one fork-join of the product's shares.
template <class Product>
int32_t run_conv(Product p, const ConvPlan& c, int32_t threads) {
    const int32_t rc = c.check();
    if (rc != 0 || c.samples() == 0) return rc;
    p.prepare(c);
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) if (c.parallel())
    p.share(c);
    return 0;
}

// One causal transposed conv (kernel k = 2 * stride or stride, the last k - stride outputs
// dropped) on n parts: each y [cout, T * stride] from its x [cin, T] through SnakeBeta where
// snake_a is given, plus bias, with its hist [cout, k - stride] (null: zeros) the earlier input's
// overlap; new_hist gets this call's. The product's weights are [cin, cout, k] as the 1x1 conv
// [(tap, out), in] (packed as [k * cout, cin, 1]). The product and the overlap-add are one region.
template <class Product>
int32_t run_tconv(Product p, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t stride,
                  const float* snake_a, const float* snake_inv_b, const VoSeg* segs, int64_t n, int32_t threads) {
    if (stride < 1 || (k != stride && k != 2 * stride)) return -1;
    std::vector<VoSeg> taps(segs, segs + n);
    std::vector<int64_t> zoff;
    int64_t total = 0;
    for (auto& s : taps) {
        zoff.push_back(total);
        total += k * cout * s.T;
    }
    static thread_local std::vector<float> zbuf;
    if (int64_t(zbuf.size()) < total) zbuf.resize(total);
    float* z = zbuf.data();
    for (int64_t i = 0; i < n; ++i) taps[i] = VoSeg{segs[i].x, segs[i].x_stride, segs[i].T, nullptr, nullptr,
                                                    z + zoff[i], segs[i].T, nullptr};
    const ConvPlan c(p.plan_weights(), nullptr, k * cout, cin, 1, 1, snake_a, snake_inv_b, taps.data(), n);
    const int32_t rc = c.check();
    if (rc != 0 || c.samples() == 0) return rc;
    const int64_t over = k - stride;
    p.prepare(c);
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) if (c.parallel())
    {
        p.share(c);
#pragma omp for schedule(static) collapse(2)
        for (int64_t i = 0; i < n; ++i)
            for (int64_t co = 0; co < cout; ++co) {
                const VoSeg& s = segs[i];
                const int64_t T = s.T;
                const float b = bias != nullptr ? bias[co] : 0.0f;
                float* yr = s.y + co * (s.y_stride ? s.y_stride : T * stride);
                for (int64_t p = 0; p < stride; ++p) {
                    const float* now = z + zoff[i] + (p * cout + co) * T;  // input t's tap p lands at t * stride + p
                    const float* before = z + zoff[i] + ((p + stride) * cout + co) * T;  // input t - 1's tap stride + p
                    for (int64_t t = 0; t < T; ++t) {
                        float v = now[t] + b;
                        if (over) v += t > 0 ? before[t - 1] : (s.hist != nullptr ? s.hist[co * over + p] : 0.0f);
                        yr[t * stride + p] = v;
                    }
                    if (over && s.new_hist != nullptr && T > 0) s.new_hist[co * over + p] = before[T - 1];
                }
            }
    }
    return 0;
}

// One part: x [cin, T] (x_stride), y (y_stride), nothing else.
inline VoSeg part(const float* x, int64_t x_stride, int64_t T, float* y, int64_t y_stride,
                  const float* residual = nullptr) {
    return VoSeg{x, x_stride, T, nullptr, residual, y, y_stride, nullptr};
}

// out[:, t] = w * x[:, t] / sqrt(mean(x[:, t]^2) + eps) for each sample t of x [C, T] (the
// threads split the samples).
void rms_columns(const float* x, const float* w, float* out, int64_t C, int64_t T, float eps) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        float ss = 0.0f;
        for (int64_t c = 0; c < C; ++c) ss += x[c * T + t] * x[c * T + t];
        const float r = 1.0f / std::sqrt(ss / float(C) + eps);
        for (int64_t c = 0; c < C; ++c) out[c * T + t] = w[c] * (x[c * T + t] * r);
    }
}

// Rotate-half RoPE of one head's vector v [hd] at a sample with tables cos, sin [hd].
void rope_head(float* v, const float* cos, const float* sin, int64_t hd) {
    const int64_t h = hd / 2;
    for (int64_t d = 0; d < h; ++d) {
        const float a = v[d], b = v[d + h];
        v[d] = a * cos[d] - b * sin[d];
        v[d + h] = b * cos[d + h] + a * sin[d + h];
    }
}

}  // namespace

extern "C" {

// y[c, t] = x[c, t] + inv_b[c] * sin(a[c] * x[c, t])^2 for a [C, T] row-major block (y may be x).
void vo_snake(const float* x, float* y, int64_t C, int64_t T, const float* a, const float* inv_b, int32_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads()) if (C * T >= 16384)
    for (int64_t c = 0; c < C; ++c) {
        const float ac = a[c], bc = inv_b[c];
        const float* xr = x + c * T;
        float* yr = y + c * T;
#pragma omp simd
        for (int64_t t = 0; t < T; ++t) yr[t] = xr[t] + bc * sin2_reduced(ac * xr[t]);
    }
}

// Which loop the bf16 convolutions run: 2 AMX, 1 AVX-512 BF16, 3 NEON BF16 (BFDOT), 0 plain C (a
// reference, slow).
int32_t vo_conv_bf16_path() {
#if defined(VO_AMX_BF16)
    return 2;
#elif defined(VO_AVX512_BF16)
    return 1;
#elif defined(VO_NEON_BF16)
    return 3;
#else
    return 0;
#endif
}

// Pack conv weights w [cout, cin, k] (fp32) into out (cout * cin * k bf16), the layout above.
int32_t vo_conv_pack_bf16(const float* w, int64_t cout, int64_t cin, int64_t k, uint16_t* out) {
    if (cout % 32 != 0 || cin % 32 != 0 || k < 1) return -1;
    const int64_t cb_n = cin / 32, kb_n = k * cb_n;
    for (int64_t co = 0; co < cout; ++co)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t ci = 0; ci < cin; ++ci)
                out[(((co / 16) * kb_n + j * cb_n + ci / 32) * 16 + co % 16) * 32 + ci % 32] =
                    to_bf16(w[(co * cin + ci) * k + j]);
    return 0;
}

// One causal conv (see the layouts above) on n parts, each y [cout, T] from its x [cin, T] and
// hist [cin, (k-1)*d] (null: zeros), with SnakeBeta on x first where snake_a is given, bias (null:
// none) and its residual [cout, T] (null: none) added; new_hist (null: not kept) gets the last
// (k-1)*d inputs for the next call. Returns 0, or -1 on shapes it does not take, -2 where the CPU
// refused AMX.
int32_t vo_conv_bf16(const uint16_t* wp, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t d,
                     const float* snake_a, const float* snake_inv_b, const VoSeg* segs, int64_t n, int32_t threads) {
    return run_conv(Bf16Product{wp}, ConvPlan(wp, bias, cout, cin, k, d, snake_a, snake_inv_b, segs, n), threads);
}

// Which loop the int8 convolutions run: 1 AVX-512 VNNI, 4 NEON dot product, 5 NEON int8 matrix
// multiply (i8mm), 0 plain C (a reference, slow).
int32_t vo_conv_i8_path() {
#if defined(VO_AVX512_I8)
    return 1;
#elif defined(VO_NEON_I8) && defined(__ARM_FEATURE_MATMUL_INT8)
    return 5;
#elif defined(VO_NEON_I8)
    return 4;
#else
    return 0;
#endif
}

// Round conv weights w [cout, cin, k] (fp32) to int8 per output channel: out (cout * cin * k
// bytes, the layout of the int8 section), scale[cout] and wsum[cout * k] (each tap's sum of one
// channel's int8 weights).
int32_t vo_conv_pack_i8(const float* w, int64_t cout, int64_t cin, int64_t k, int8_t* out, float* scale,
                        int32_t* wsum) {
    if (cout % 32 != 0 || cin % 32 != 0 || k < 1) return -1;
    const int64_t cb_n = cin / 32, kb_n = k * cb_n;
    for (int64_t co = 0; co < cout; ++co) {
        float m = 0.0f;
        for (int64_t i = 0; i < cin * k; ++i) m = std::max(m, std::fabs(w[co * cin * k + i]));
        scale[co] = m / 127.0f;
        const float inv = m > 0.0f ? 127.0f / m : 0.0f;
        for (int64_t j = 0; j < k; ++j) {
            int32_t sum = 0;
            for (int64_t ci = 0; ci < cin; ++ci) {
                const int32_t q = int32_t(std::min(127.0f, std::max(-127.0f, std::nearbyint(w[(co * cin + ci) * k + j] * inv))));
                out[(((co / 16) * kb_n + j * cb_n + ci / 32) * 16 + co % 16) * 32 + ci % 32] = int8_t(q);
                sum += q;
            }
            wsum[co * k + j] = sum;
        }
    }
    return 0;
}

// vo_conv_bf16 with int8 products (the int8 section above): weights from vo_conv_pack_i8.
int32_t vo_conv_i8(const int8_t* wq, const float* scale, const int32_t* wsum, const float* bias, int64_t cout,
                   int64_t cin, int64_t k, int64_t d, const float* snake_a, const float* snake_inv_b, const VoSeg* segs,
                   int64_t n, int32_t threads) {
    return run_conv(I8Product{wq, scale, wsum}, ConvPlan(nullptr, bias, cout, cin, k, d, snake_a, snake_inv_b, segs, n),
                    threads);
}

// One causal transposed conv in bf16 (run_tconv): wp, the weights [cin, cout, k] as the 1x1 conv
// [(tap, out), in] packed by vo_conv_pack_bf16 as [k * cout, cin, 1].
int32_t vo_tconv_bf16(const uint16_t* wp, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t stride,
                      const float* snake_a, const float* snake_inv_b, const VoSeg* segs, int64_t n, int32_t threads) {
    return run_tconv(Bf16Product{wp}, bias, cout, cin, k, stride, snake_a, snake_inv_b, segs, n, threads);
}

// vo_tconv_bf16 with int8 products: wq, scale and wsum from vo_conv_pack_i8 of the same [k * cout, cin, 1].
int32_t vo_tconv_i8(const int8_t* wq, const float* scale, const int32_t* wsum, const float* bias, int64_t cout,
                    int64_t cin, int64_t k, int64_t stride, const float* snake_a, const float* snake_inv_b,
                    const VoSeg* segs, int64_t n, int32_t threads) {
    return run_tconv(I8Product{wq, scale, wsum}, bias, cout, cin, k, stride, snake_a, snake_inv_b, segs, n, threads);
}

// The decoder's last conv (few output channels: 96 -> 1), in fp32: y [cout, T] from x [cin, T]
// through SnakeBeta where snake_a is given, and hist [cin, (k-1)*d] (null: zeros); new_hist
// (null: not kept) gets the last (k-1)*d inputs. Time is split across threads, each input row
// made once per thread for its span; the sums run over channels, then taps, in that order.
int32_t vo_conv_f32_narrow(const float* w, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t d,
                           const float* hist, const float* x, int64_t T, const float* snake_a,
                           const float* snake_inv_b, float* y, float* new_hist, int32_t threads) {
    if (cout < 1 || cout > 8 || cin < 1 || k < 1 || d < 1 || T < 0) return -1;
    const int64_t tail = (k - 1) * d;
    // in[c, tail + t] for t in [t0, t0 + n), t0 >= -tail, into out: the history, then x through SnakeBeta
    auto input = [&](int64_t c, int64_t t0, int64_t n, float* out) {
        int64_t i = 0;
        for (; i < n && t0 + i < 0; ++i) out[i] = hist != nullptr ? hist[c * tail + tail + t0 + i] : 0.0f;
        const float* xr = x + c * T + t0;
        if (snake_a != nullptr) {
            const float ac = snake_a[c], bc = snake_inv_b[c];
#pragma omp simd
            for (int64_t j = i; j < n; ++j) out[j] = xr[j] + bc * sin2_reduced(ac * xr[j]);
        } else {
            for (int64_t j = i; j < n; ++j) out[j] = xr[j];
        }
    };
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    constexpr int64_t SPAN = 512;
#pragma omp parallel num_threads(nt) if (cin * T >= 16384)
    {
        std::vector<float> in(SPAN + tail), acc(cout * SPAN);
#pragma omp for schedule(static)
        for (int64_t t0 = 0; t0 < T; t0 += SPAN) {
            const int64_t n = std::min(SPAN, T - t0);
            for (int64_t o = 0; o < cout; ++o)
                for (int64_t t = 0; t < n; ++t) acc[o * SPAN + t] = bias != nullptr ? bias[o] : 0.0f;
            for (int64_t c = 0; c < cin; ++c) {
                input(c, t0 - tail, n + tail, in.data());
                for (int64_t o = 0; o < cout; ++o) {
                    const float* wr = w + (o * cin + c) * k;
                    float* ar = acc.data() + o * SPAN;
                    for (int64_t j = 0; j < k; ++j) {
                        const float wj = wr[j];
                        const float* ir = in.data() + j * d;
#pragma omp simd
                        for (int64_t t = 0; t < n; ++t) ar[t] += wj * ir[t];
                    }
                }
            }
            for (int64_t o = 0; o < cout; ++o) std::memcpy(y + o * T + t0, acc.data() + o * SPAN, n * sizeof(float));
        }
    }
    if (new_hist != nullptr)
        for (int64_t c = 0; c < cin; ++c) input(c, T - tail, tail, new_hist + c * tail);
    return 0;
}

// One ResidualUnit on n parts, y = x + conv2(snake2(conv1(snake1(x)))), conv1 causal with k taps
// dilated by d (each part's history hist [C, (k-1)*d], null: zeros; new_hist gets the next one),
// conv2 1x1, both C -> C in bf16 (w1, w2 packed by vo_conv_pack_bf16), with their biases. Time is
// cut into tiles that each thread takes whole, every stage of a tile (packing, both products,
// the snakes, the residual) done while it is in the core's cache: where the channels are few and
// the samples many (the last blocks), separate convs spent their time moving [C, T] tensors
// through memory. Same arithmetic as the two vo_conv_bf16 calls.
int32_t vo_res_unit_bf16(const uint16_t* w1, const float* b1, const uint16_t* w2, const float* b2, int64_t C,
                         int64_t k, int64_t d, const float* a1, const float* ib1, const float* a2, const float* ib2,
                         const VoSeg* segs, int64_t n, int32_t threads) {
    if (C % 32 != 0 || k < 1 || d < 1) return -1;
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (segs[i].T < 0) return -1;
        total += segs[i].T;
    }
    if (total == 0) return 0;
    if (!conv_ready()) return -2;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    const int64_t tail = (k - 1) * d, cb_n = C / 32, kb1 = k * cb_n;
    // tiles of 32 to 256 samples, at least two per thread where the call has that many
    const int64_t tile = std::min<int64_t>(256, std::max<int64_t>(T_PAIR, round_pairs(total / (2 * nt))));
    struct Tile {
        int64_t s, t0;
    };
    std::vector<Tile> tiles;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t t0 = 0; t0 < segs[i].T; t0 += tile) tiles.push_back({i, t0});
    const int64_t row1 = tail + tile, n_tiles = tiles.size();
#pragma omp parallel num_threads(nt) if (C * total >= 16384)
    {
        std::vector<uint16_t> xp1(C * row1), xp2(C * tile);
        std::vector<float> h(C * tile), buf(2 * (tail + tile));
        alignas(64) float acc[32 * 32];
        const TileScope tiles_in_use;
        (void)tiles_in_use;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_tiles; ++i) {
            const VoSeg& s = segs[tiles[i].s];
            const int64_t T = s.T, xs = s.x_stride ? s.x_stride : T, ys = s.y_stride ? s.y_stride : T;
            const int64_t t0 = tiles[i].t0, m = std::min(tile, T - t0), m_pad = round_pairs(m);
            for (int64_t cp = 0; cp < C / 2; ++cp)
                pack_pair(cp, s.hist, s.x, xs, tail, t0, tail + m, row1, a1, ib1, nullptr, xp1.data() + cp * row1 * 2,
                          buf.data());
            for (int64_t co0 = 0; co0 < C; co0 += 32)
                for (int64_t tt = 0; tt < m_pad; tt += T_PAIR) {
                    conv_tiles(w1 + co0 / 16 * kb1 * 512, kb1, xp1.data(), row1, cb_n, k, d, tt,
                               std::min<int64_t>(T_PAIR, m - tt), acc);
                    for (int64_t r = 0; r < 32; ++r) {
                        const float b = b1 != nullptr ? b1[co0 + r] : 0.0f;
                        float* hr = h.data() + (co0 + r) * tile + tt;
                        for (int64_t j = 0; j < T_PAIR; ++j) hr[j] = acc[r * 32 + j] + b;
                    }
                }
            for (int64_t cp = 0; cp < C / 2; ++cp)
                pack_pair(cp, nullptr, h.data(), tile, 0, 0, m, tile, a2, ib2, nullptr, xp2.data() + cp * tile * 2,
                          buf.data());
            for (int64_t co0 = 0; co0 < C; co0 += 32)
                for (int64_t tt = 0; tt < m_pad; tt += T_PAIR) {
                    const int64_t q = std::min<int64_t>(T_PAIR, m - tt);
                    conv_tiles(w2 + co0 / 16 * cb_n * 512, cb_n, xp2.data(), tile, cb_n, 1, 1, tt, q, acc);
                    for (int64_t r = 0; r < 32; ++r) {
                        const int64_t co = co0 + r;
                        const float b = b2 != nullptr ? b2[co] : 0.0f;
                        const float* xr = s.x + co * xs + t0 + tt;
                        float* yr = s.y + co * ys + t0 + tt;
                        for (int64_t j = 0; j < q; ++j) yr[j] = acc[r * 32 + j] + b + xr[j];
                    }
                }
        }
        if (tail > 0) {
#pragma omp for schedule(static) collapse(2)
            for (int64_t i = 0; i < n; ++i)
                for (int64_t cp = 0; cp < C / 2; ++cp) {  // the last tail samples of [hist | snake1(x)]
                    const VoSeg& s = segs[i];
                    if (s.new_hist == nullptr) continue;
                    pack_pair(cp, s.hist, s.x, s.x_stride ? s.x_stride : s.T, tail, s.T, tail, tail, a1, ib1,
                              s.new_hist, xp1.data(), buf.data());
                }
        }
    }
    return 0;
}

// One ConvNeXt block of the upsampler on n parts, y = x + fc2(gelu(fc1(layernorm(dwconv(x))))),
// in one parallel region: the depthwise causal conv (k taps a channel, weights dw_w [C, k], each
// part's history hist [C, k - 1], null: zeros; new_hist gets the next) and the LayerNorm over
// channels in fp32, fc1 (C -> I) and fc2 (I -> C, the block's gamma folded in by the caller) as
// bf16 1x1 convs over every part's samples at once, the exact GELU between them.
int32_t vo_convnext_bf16(const float* dw_w, const float* dw_b, int64_t C, int64_t k, const float* ln_w,
                         const float* ln_b, float eps, const uint16_t* fc1, const float* fc1_b, int64_t I,
                         const uint16_t* fc2, const float* fc2_b, const VoSeg* segs, int64_t n, int32_t threads) {
    if (C % 32 != 0 || I % 32 != 0 || k < 1) return -1;
    std::vector<int64_t> off;
    int64_t S = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (segs[i].T < 0) return -1;
        off.push_back(S);
        S += segs[i].T;
    }
    if (S == 0) return 0;
    if (!conv_ready()) return -2;
    const int64_t tail = k - 1;
    std::vector<float> h(C * S), mid(I * S);  // every part's samples side by side: [C, S], [I, S]
    const VoSeg all_h = part(h.data(), S, S, mid.data(), S);
    const ConvPlan p1(fc1, fc1_b, I, C, 1, 1, nullptr, nullptr, &all_h, 1);
    std::vector<VoSeg> outs;
    for (int64_t i = 0; i < n; ++i)
        outs.push_back(part(mid.data() + off[i], S, segs[i].T, segs[i].y, segs[i].y_stride, segs[i].x));
    const ConvPlan p2(fc2, fc2_b, C, I, 1, 1, nullptr, nullptr, outs.data(), n);
    uint16_t* xp = conv_packed(std::max(C * p1.row, I * p2.row));
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
#pragma omp for schedule(static) collapse(2)
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < C; ++c) {  // in[c] = [hist[c] | x[c]]; output t reads in[t .. t + tail]
                const VoSeg& s = segs[i];
                const int64_t T = s.T, xs = s.x_stride ? s.x_stride : T;
                auto in = [&](int64_t j) {
                    return j < tail ? (s.hist != nullptr ? s.hist[c * tail + j] : 0.0f) : s.x[c * xs + j - tail];
                };
                for (int64_t t = 0; t < T; ++t) {
                    float sum = dw_b != nullptr ? dw_b[c] : 0.0f;
                    for (int64_t j = 0; j < k; ++j) sum += dw_w[c * k + j] * in(t + j);
                    h[c * S + off[i] + t] = sum;
                }
                if (s.new_hist != nullptr)
                    for (int64_t j = 0; j < tail; ++j) s.new_hist[c * tail + j] = in(T + j);
            }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < S; ++t) {
            float mean = 0.0f, var = 0.0f;
            for (int64_t c = 0; c < C; ++c) mean += h[c * S + t];
            mean /= float(C);
            for (int64_t c = 0; c < C; ++c) var += (h[c * S + t] - mean) * (h[c * S + t] - mean);
            const float r = 1.0f / std::sqrt(var / float(C) + eps);
            for (int64_t c = 0; c < C; ++c) h[c * S + t] = (h[c * S + t] - mean) * r * ln_w[c] + ln_b[c];
        }
        conv_share(p1, xp);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < I * S; ++i) mid[i] = 0.5f * mid[i] * (1.0f + std::erf(mid[i] * 0.70710678118654752f));
        conv_share(p2, xp);
    }
    return 0;
}

// --- The decoder's transformer in bf16 ----------------------------------------------------
//
// In, 8 pre-norm layers of sliding-window attention and SwiGLU, out, on every part's samples in
// one parallel region: every linear layer is the bf16 conv loop above as a 1x1 conv over all the
// parts' samples side by side (activations stay channels by samples, [C, S], as the convs around
// it), LayerScale folded into o and down by the caller; norms, RoPE, attention (each part over
// its own keys) and SwiGLU in fp32 between them.

struct VoDecLayer {
    const uint16_t* qkv;      // [3 * heads * head_dim, hidden], packed as a 1x1 conv
    const uint16_t* o;        // [hidden, heads * head_dim], LayerScale folded in
    const uint16_t* gate_up;  // [2 * inter, hidden]
    const uint16_t* down;     // [hidden, inter], LayerScale folded in
    const float* input_norm;
    const float* post_norm;
};

struct VoDecTransformer {
    int32_t n_layers, latent, hidden, inter, heads, head_dim, window;
    float eps;
    const uint16_t* in_proj;  // [hidden, latent]
    const float* in_bias;
    const uint16_t* out_proj;  // [latent, hidden]
    const float* out_bias;
    const float* final_norm;
    const VoDecLayer* layers;
};

// One stream's part of a transformer call: y [latent, T] from x [latent, T], its samples at
// absolute positions pos0 .. pos0 + T - 1 with RoPE tables rope_cos, rope_sin [T, head_dim].
// Layer l attends over the part's past keys and values past_k[l], past_v[l] ([heads, P,
// head_dim], the P < window positions before pos0) and its own new ones; new_k[l], new_v[l]
// ([heads, min(P + T, window - 1), head_dim]) get the last ones for the next call.
struct VoDecPart {
    const float* x;
    float* y;
    int64_t T;
    const float* rope_cos;
    const float* rope_sin;
    int64_t P;
    const float* const* past_k;
    const float* const* past_v;
    float* const* new_k;
    float* const* new_v;
};

// The transformer on n parts. Returns 0, -1 on shapes it does not take, -2 where the CPU refused AMX.
int32_t vo_dec_transformer(const VoDecTransformer* mp, const VoDecPart* parts, int64_t n, int32_t threads) {
    const VoDecTransformer& m = *mp;
    const int64_t L = m.latent, H = m.hidden, I = m.inter, hd = m.head_dim, nh = m.heads, D = nh * hd;
    const int64_t keep = m.window - 1;
    if (L % 32 || H % 32 || I % 32 || D % 32 || hd % 2 || hd > 512 || m.n_layers < 1 || n < 1) return -1;
    std::vector<int64_t> off;
    int64_t S = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (parts[i].T < 1 || parts[i].P < 0 || parts[i].P > keep) return -1;
        off.push_back(S);
        S += parts[i].T;
    }
    if (!conv_ready()) return -2;
    std::vector<float> h(H * S), xn(H * S), qkv(3 * D * S), att(D * S), gu(2 * I * S), mid(I * S);
    std::vector<VoSeg> ins, outs;
    for (int64_t i = 0; i < n; ++i) {
        ins.push_back(part(parts[i].x, parts[i].T, parts[i].T, h.data() + off[i], S));
        outs.push_back(part(xn.data() + off[i], S, parts[i].T, parts[i].y, parts[i].T));
    }
    const VoSeg normed = part(xn.data(), S, S, qkv.data(), S), attended = part(att.data(), S, S, h.data(), S, h.data());
    const VoSeg for_mlp = part(xn.data(), S, S, gu.data(), S), gated = part(mid.data(), S, S, h.data(), S, h.data());
    const ConvPlan p_in(m.in_proj, m.in_bias, H, L, 1, 1, nullptr, nullptr, ins.data(), n);
    const ConvPlan p_out(m.out_proj, m.out_bias, L, H, 1, 1, nullptr, nullptr, outs.data(), n);
    std::vector<ConvPlan> p_qkv, p_o, p_gu, p_down;
    for (int l = 0; l < m.n_layers; ++l) {
        const VoDecLayer& ly = m.layers[l];
        p_qkv.emplace_back(ly.qkv, nullptr, 3 * D, H, 1, 1, nullptr, nullptr, &normed, 1);
        p_o.emplace_back(ly.o, nullptr, H, D, 1, 1, nullptr, nullptr, &attended, 1);
        p_gu.emplace_back(ly.gate_up, nullptr, 2 * I, H, 1, 1, nullptr, nullptr, &for_mlp, 1);
        p_down.emplace_back(ly.down, nullptr, H, I, 1, 1, nullptr, nullptr, &gated, 1);
    }
    int64_t packed = std::max(L * p_in.row, H * p_out.row);
    for (int l = 0; l < m.n_layers; ++l)
        packed = std::max({packed, H * p_qkv[l].row, D * p_o[l].row, H * p_gu[l].row, I * p_down[l].row});
    uint16_t* xp = conv_packed(packed);
    const float scale = 1.0f / std::sqrt(float(hd));
    int64_t longest = 0, most_past = 0;
    for (int64_t i = 0; i < n; ++i) {
        longest = std::max(longest, parts[i].T);
        most_past = std::max(most_past, parts[i].P);
    }
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
        std::vector<float> q(longest * hd), k(longest * hd), v(longest * hd), scores(most_past + longest);
        conv_share(p_in, xp);
        for (int l = 0; l < m.n_layers; ++l) {
            const VoDecLayer& ly = m.layers[l];
            rms_columns(h.data(), ly.input_norm, xn.data(), H, S, m.eps);
            conv_share(p_qkv[l], xp);
#pragma omp for schedule(static) collapse(2)
            for (int64_t i = 0; i < n; ++i)
                for (int64_t a = 0; a < nh; ++a) {
                    const VoDecPart& pt = parts[i];
                    const int64_t T = pt.T, P = pt.P, P2 = std::min(P + T, keep), o = off[i];
                    for (int64_t t = 0; t < T; ++t) {  // this head's q, k, v of each sample, q and k rotated
                        for (int64_t dd = 0; dd < hd; ++dd) {
                            q[t * hd + dd] = qkv[(a * hd + dd) * S + o + t];
                            k[t * hd + dd] = qkv[(D + a * hd + dd) * S + o + t];
                            v[t * hd + dd] = qkv[(2 * D + a * hd + dd) * S + o + t];
                        }
                        rope_head(q.data() + t * hd, pt.rope_cos + t * hd, pt.rope_sin + t * hd, hd);
                        rope_head(k.data() + t * hd, pt.rope_cos + t * hd, pt.rope_sin + t * hd, hd);
                    }
                    const float* pk = pt.past_k[l] + a * P * hd;
                    const float* pv = pt.past_v[l] + a * P * hd;
                    for (int64_t t = 0; t < T; ++t) {
                        // keys at pos0 + t - keep .. pos0 + t: past entries from P + t - keep, this call's from t - keep
                        const int64_t p0 = std::max<int64_t>(0, P + t - keep), c0 = std::max<int64_t>(0, t - keep);
                        const float* qt = q.data() + t * hd;
                        float top = -INFINITY;
                        int64_t cnt = 0;
                        auto score = [&](const float* kr) {
                            float sdot = 0.0f;
                            for (int64_t dd = 0; dd < hd; ++dd) sdot += qt[dd] * kr[dd];
                            scores[cnt] = sdot * scale;
                            top = std::max(top, scores[cnt++]);
                        };
                        for (int64_t j = p0; j < P; ++j) score(pk + j * hd);
                        for (int64_t j = c0; j <= t; ++j) score(k.data() + j * hd);
                        float sum = 0.0f;
                        for (int64_t j = 0; j < cnt; ++j) sum += scores[j] = std::exp(scores[j] - top);
                        float out[512] = {};
                        cnt = 0;
                        for (int64_t j = p0; j < P; ++j, ++cnt)
                            for (int64_t dd = 0; dd < hd; ++dd) out[dd] += scores[cnt] * pv[j * hd + dd];
                        for (int64_t j = c0; j <= t; ++j, ++cnt)
                            for (int64_t dd = 0; dd < hd; ++dd) out[dd] += scores[cnt] * v[j * hd + dd];
                        for (int64_t dd = 0; dd < hd; ++dd) att[(a * hd + dd) * S + o + t] = out[dd] / sum;
                    }
                    for (int64_t j = 0; j < P2; ++j) {  // the last P2 keys and values, for the next call
                        const int64_t src = P + T - P2 + j;
                        const float* ks = src < P ? pk + src * hd : k.data() + (src - P) * hd;
                        const float* vs = src < P ? pv + src * hd : v.data() + (src - P) * hd;
                        std::memcpy(pt.new_k[l] + (a * P2 + j) * hd, ks, hd * sizeof(float));
                        std::memcpy(pt.new_v[l] + (a * P2 + j) * hd, vs, hd * sizeof(float));
                    }
                }
            conv_share(p_o[l], xp);
            rms_columns(h.data(), ly.post_norm, xn.data(), H, S, m.eps);
            conv_share(p_gu[l], xp);
#pragma omp for schedule(static)
            for (int64_t j = 0; j < I * S; ++j) {
                const float g = gu[j];
                mid[j] = g / (1.0f + std::exp(-g)) * gu[I * S + j];
            }
            conv_share(p_down[l], xp);
        }
        rms_columns(h.data(), m.final_norm, xn.data(), H, S, m.eps);
        conv_share(p_out, xp);
    }
    return 0;
}

}  // extern "C"
