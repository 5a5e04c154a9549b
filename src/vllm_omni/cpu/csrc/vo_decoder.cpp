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
// no im2col. The tile loops are per instruction set in arch/x86/conv_bf16.h (AMX, AVX-512 BF16);
// the plain-C loop here is their reference.
//
// Built into the same library as vo_kernels.cpp (vllm_omni.cpu.native); the Python side owns
// every buffer it passes (the conv's packed input is a per-thread scratch of this file).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define VO_AMX_BF16 1
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define VO_AVX512_BF16 1
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
//   by sample (row = tail + T rounded up to 32, zeros after the last sample), so the 16 pairs of
//   a 32-channel block at samples t .. t + 15 are one tile of 16 rows, and a tap is an offset.
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

inline void interleave_bf16(const float* a, const float* b, int64_t n, uint16_t* out) {
    for (int64_t i = 0; i < n; ++i) {
        out[2 * i] = to_bf16(a[i]);
        out[2 * i + 1] = to_bf16(b[i]);
    }
}
#endif

}  // namespace

#if defined(VO_AMX_BF16) || defined(VO_AVX512_BF16)
#include "arch/x86/conv_bf16.h"
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

// Whether a conv's parallel region is worth its fork-join: many weights or many inputs.
inline bool conv_parallel(int64_t cout, int64_t cin, int64_t k, int64_t T) {
    return cout * cin * k >= 65536 || cin * T >= 16384;
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

// Samples [s0, s0 + n) of rows [2 cp, 2 cp + 1] of in = [hist | snake(x)] (hist: tail samples a
// row; x: rows of x_stride floats) into one pair of the packed input (row samples, zeros after
// n); with new_hist, the last tail samples of those rows (where s0 + n is the end of in).
void pack_pair(int64_t cp, const float* hist, const float* x, int64_t x_stride, int64_t tail, int64_t s0, int64_t n,
               int64_t row, const float* snake_a, const float* snake_inv_b, float* new_hist, uint16_t* xp,
               float* buf) {
    for (int p = 0; p < 2; ++p) {
        const int64_t c = 2 * cp + p;
        float* in = buf + p * n;
        int64_t i = 0;
        for (; i < n && s0 + i < tail; ++i) in[i] = hist[c * tail + s0 + i];
        const float* xr = x + c * x_stride + (s0 + i - tail);
        float* s = in + i;
        const int64_t m = n - i;
        if (snake_a != nullptr) {
            const float ac = snake_a[c], bc = snake_inv_b[c];
#pragma omp simd
            for (int64_t t = 0; t < m; ++t) s[t] = xr[t] + bc * sin2_reduced(ac * xr[t]);
        } else {
            std::memcpy(s, xr, m * sizeof(float));
        }
        if (new_hist != nullptr)
            for (int64_t j = 0; j < tail; ++j) new_hist[c * tail + j] = in[n - tail + j];
    }
    uint16_t* out = xp + cp * row * 2;
    interleave_bf16(buf, buf + n, n, out);
    std::memset(out + 2 * n, 0, (row - n) * 2 * sizeof(uint16_t));
}

// One bf16 conv's arguments (vo_conv_bf16).
struct ConvCall {
    const uint16_t* wp;
    const float* bias;
    int64_t cout, cin, k, d;
    const float* hist;
    const float* x;
    int64_t T;
    const float* snake_a;
    const float* snake_inv_b;
    const float* residual;
    float* y;
    float* new_hist;
};

int32_t conv_check(const ConvCall& c) {
    if (c.cout % 32 != 0 || c.cin % 32 != 0 || c.k < 1 || c.d < 1 || c.T < 0) return -1;
    if (c.T > 0 && !conv_ready()) return -2;
    return 0;
}

// Samples a packed input row holds: the history, then the call's samples rounded up to tile pairs.
inline int64_t conv_row(const ConvCall& c) { return (c.k - 1) * c.d + (c.T + T_PAIR - 1) / T_PAIR * T_PAIR; }

// The packed input: a per-thread buffer of the calling thread, grown as needed.
uint16_t* conv_packed(int64_t elems) {
    static thread_local std::vector<uint16_t> packed;
    if (int64_t(packed.size()) < elems) packed.resize(elems);
    return packed.data();
}

// c with a zero history where it has none and needs one (zeros: its storage).
ConvCall with_history(ConvCall c, std::vector<float>& zeros) {
    const int64_t tail = (c.k - 1) * c.d;
    if (c.hist == nullptr && tail > 0) {
        zeros.assign(c.cin * tail, 0.0f);
        c.hist = zeros.data();
    }
    return c;
}

// One thread's share of a bf16 conv, inside a parallel region of every thread: its pairs of
// input rows packed, then (after the barrier that ends that loop) its work items of 32 output
// channels by T_ITEM samples, each tile pair's sums finished with bias and residual.
void conv_share(const ConvCall& c, uint16_t* xp) {
    const int64_t T = c.T, tail = (c.k - 1) * c.d, row = conv_row(c);
    const int64_t t_pad = row - tail, cb_n = c.cin / 32, kb_n = c.k * cb_n;
    std::vector<float> buf(2 * (tail + T));
#pragma omp for schedule(static)
    for (int64_t cp = 0; cp < c.cin / 2; ++cp)
        pack_pair(cp, c.hist, c.x, T, tail, 0, tail + T, row, c.snake_a, c.snake_inv_b, c.new_hist, xp, buf.data());
    const TileScope tiles;  // AMX: this thread's tile configuration, released at the end
    (void)tiles;
    alignas(64) float acc[32 * 32];
    const int64_t t_items = (t_pad + T_ITEM - 1) / T_ITEM, items = c.cout / 32 * t_items;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
        const int64_t co0 = item / t_items * 32;
        const int64_t t_end = std::min(t_pad, (item % t_items + 1) * T_ITEM);
        for (int64_t t0 = item % t_items * T_ITEM; t0 < t_end; t0 += T_PAIR) {
            const int64_t n = std::min<int64_t>(T_PAIR, T - t0);
            conv_tiles(c.wp + co0 / 16 * kb_n * 512, kb_n, xp, row, cb_n, c.k, c.d, t0, n, acc);
            for (int64_t r = 0; r < 32; ++r) {
                const int64_t co = co0 + r;
                const float b = c.bias != nullptr ? c.bias[co] : 0.0f;
                float* yr = c.y + co * T + t0;
                const float* ar = acc + r * 32;
                if (c.residual != nullptr) {
                    const float* rr = c.residual + co * T + t0;
                    for (int64_t t = 0; t < n; ++t) yr[t] = ar[t] + b + rr[t];
                } else {
                    for (int64_t t = 0; t < n; ++t) yr[t] = ar[t] + b;
                }
            }
        }
    }
}


// Every thread's share of y = W x + bias (+ residual; y may be the residual) for a linear layer
// as a 1x1 conv: x [cin, T], channels by samples, as the convolutions'.
void linear_share(const uint16_t* wp, const float* bias, int64_t cout, int64_t cin, const float* x, int64_t T,
                  const float* residual, float* y, uint16_t* xp) {
    conv_share({wp, bias, cout, cin, 1, 1, nullptr, x, T, nullptr, nullptr, residual, y, nullptr}, xp);
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

// Which loop the bf16 convolutions run: 2 AMX, 1 AVX-512 BF16, 0 plain C (a reference, slow).
int32_t vo_conv_bf16_path() {
#if defined(VO_AMX_BF16)
    return 2;
#elif defined(VO_AVX512_BF16)
    return 1;
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

// One causal conv (see the layouts above): y [cout, T] from x [cin, T] and hist [cin, (k-1)*d]
// (null: zeros), with SnakeBeta on x first where snake_a is given, bias (null: none) and
// residual [cout, T] (null: none) added; new_hist (null: not kept) gets the last (k-1)*d inputs
// for the next call. Returns 0, or -1 on shapes it does not take, -2 where the CPU refused AMX.
int32_t vo_conv_bf16(const uint16_t* wp, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t d,
                     const float* hist, const float* x, int64_t T, const float* snake_a, const float* snake_inv_b,
                     const float* residual, float* y, float* new_hist, int32_t threads) {
    std::vector<float> zeros;
    const ConvCall c = with_history({wp, bias, cout, cin, k, d, hist, x, T, snake_a, snake_inv_b, residual, y,
                                     new_hist}, zeros);
    const int32_t rc = conv_check(c);
    if (rc != 0 || T == 0) return rc;
    uint16_t* xp = conv_packed(cin * conv_row(c));
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) if (conv_parallel(cout, cin, k, T))
    conv_share(c, xp);
    return 0;
}

// One causal transposed conv (kernel k = 2 * stride or stride, the last k - stride outputs
// dropped): y [cout, T * stride] from x [cin, T] through SnakeBeta where snake_a is given, plus
// bias, with carry [cout, k - stride] (null: zeros) the earlier input's overlap; new_carry gets
// this call's. wp: the weights [cin, cout, k] as the 1x1 conv [(tap, out), in] (packed by
// vo_conv_pack_bf16 as [k * cout, cin, 1]). The product and the overlap-add are one region.
int32_t vo_tconv_bf16(const uint16_t* wp, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t stride,
                      const float* x, int64_t T, const float* snake_a, const float* snake_inv_b, const float* carry,
                      float* y, float* new_carry, int32_t threads) {
    if (stride < 1 || (k != stride && k != 2 * stride)) return -1;
    static thread_local std::vector<float> taps;
    if (int64_t(taps.size()) < k * cout * T) taps.resize(k * cout * T);
    float* z = taps.data();
    const ConvCall c{wp, nullptr, k * cout, cin, 1, 1, nullptr, x, T, snake_a, snake_inv_b, nullptr, z, nullptr};
    const int32_t rc = conv_check(c);
    if (rc != 0 || T == 0) return rc;
    const int64_t over = k - stride;
    uint16_t* xp = conv_packed(cin * conv_row(c));
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) if (conv_parallel(k * cout, cin, 1, T))
    {
        conv_share(c, xp);
#pragma omp for schedule(static)
        for (int64_t co = 0; co < cout; ++co) {
            const float b = bias != nullptr ? bias[co] : 0.0f;
            float* yr = y + co * T * stride;
            for (int64_t p = 0; p < stride; ++p) {
                const float* now = z + (p * cout + co) * T;  // input t's tap p lands at t * stride + p
                const float* before = z + ((p + stride) * cout + co) * T;  // input t - 1's tap stride + p
                for (int64_t t = 0; t < T; ++t) {
                    float v = now[t] + b;
                    if (over) v += t > 0 ? before[t - 1] : (carry != nullptr ? carry[co * over + p] : 0.0f);
                    yr[t * stride + p] = v;
                }
                if (over && new_carry != nullptr) new_carry[co * over + p] = before[T - 1];
            }
        }
    }
    return 0;
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

// One ResidualUnit, y = x + conv2(snake2(conv1(snake1(x)))), conv1 causal with k taps dilated
// by d (history hist [C, (k-1)*d], null: zeros; new_hist gets the next one), conv2 1x1, both
// C -> C in bf16 (w1, w2 packed by vo_conv_pack_bf16), with their biases. Time is cut into tiles
// that each thread takes whole, every stage of a tile (packing, both products, the snakes, the
// residual) done while it is in the core's cache: where the channels are few and the samples
// many (the last blocks), the separate convs spent their time moving [C, T] tensors through
// memory. Same arithmetic as the two vo_conv_bf16 calls.
int32_t vo_res_unit_bf16(const uint16_t* w1, const float* b1, const uint16_t* w2, const float* b2, int64_t C,
                         int64_t k, int64_t d, const float* hist, const float* x, int64_t T, const float* a1,
                         const float* ib1, const float* a2, const float* ib2, float* y, float* new_hist,
                         int32_t threads) {
    if (C % 32 != 0 || k < 1 || d < 1 || T < 0) return -1;
    if (T == 0) return 0;
    if (!conv_ready()) return -2;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    const int64_t tail = (k - 1) * d, cb_n = C / 32, kb1 = k * cb_n;
    // tiles of 32 to 256 samples, at least two per thread where the call has that many
    const int64_t tile = std::min<int64_t>(256, std::max<int64_t>(T_PAIR, (T / (2 * nt) + T_PAIR - 1) / T_PAIR * T_PAIR));
    const int64_t tiles = (T + tile - 1) / tile, row1 = tail + tile;
    std::vector<float> zeros;
    if (hist == nullptr && tail > 0) {
        zeros.assign(C * tail, 0.0f);
        hist = zeros.data();
    }
#pragma omp parallel num_threads(nt) if (C * T >= 16384)
    {
        std::vector<uint16_t> xp1(C * row1), xp2(C * tile);
        std::vector<float> h(C * tile), buf(2 * (tail + tile));
        alignas(64) float acc[32 * 32];
        const TileScope tiles_in_use;
        (void)tiles_in_use;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < tiles; ++i) {
            const int64_t t0 = i * tile, n = std::min(tile, T - t0), n_pad = (n + T_PAIR - 1) / T_PAIR * T_PAIR;
            for (int64_t cp = 0; cp < C / 2; ++cp)
                pack_pair(cp, hist, x, T, tail, t0, tail + n, row1, a1, ib1, nullptr, xp1.data(), buf.data());
            for (int64_t co0 = 0; co0 < C; co0 += 32)
                for (int64_t tt = 0; tt < n_pad; tt += T_PAIR) {
                    conv_tile_pair(w1 + co0 / 16 * kb1 * 512, kb1, xp1.data(), row1, cb_n, k, d, tt, acc);
                    for (int64_t r = 0; r < 32; ++r) {
                        const float b = b1 != nullptr ? b1[co0 + r] : 0.0f;
                        float* hr = h.data() + (co0 + r) * tile + tt;
                        for (int64_t j = 0; j < T_PAIR; ++j) hr[j] = acc[r * 32 + j] + b;
                    }
                }
            for (int64_t cp = 0; cp < C / 2; ++cp)
                pack_pair(cp, nullptr, h.data(), tile, 0, 0, n, tile, a2, ib2, nullptr, xp2.data(), buf.data());
            for (int64_t co0 = 0; co0 < C; co0 += 32)
                for (int64_t tt = 0; tt < n_pad; tt += T_PAIR) {
                    conv_tile_pair(w2 + co0 / 16 * cb_n * 512, cb_n, xp2.data(), tile, cb_n, 1, 1, tt, acc);
                    const int64_t m = std::min<int64_t>(T_PAIR, n - tt);
                    for (int64_t r = 0; r < 32; ++r) {
                        const int64_t co = co0 + r;
                        const float b = b2 != nullptr ? b2[co] : 0.0f;
                        const float* xr = x + co * T + t0 + tt;
                        float* yr = y + co * T + t0 + tt;
                        for (int64_t j = 0; j < m; ++j) yr[j] = acc[r * 32 + j] + b + xr[j];
                    }
                }
        }
        if (new_hist != nullptr && tail > 0) {
#pragma omp for schedule(static)
            for (int64_t cp = 0; cp < C / 2; ++cp) {  // the last tail samples of [hist | snake1(x)]
                const int64_t s0 = T, n = tail;  // in-coordinates T .. T + tail
                pack_pair(cp, hist, x, T, tail, s0, n, row1, a1, ib1, new_hist, xp1.data(), buf.data());
            }
        }
    }
    return 0;
}

// One ConvNeXt block of the upsampler, y = x + fc2(gelu(fc1(layernorm(dwconv(x))))), in one
// parallel region: the depthwise causal conv (k taps a channel, weights dw_w [C, k], history
// hist [C, k - 1], null: zeros; new_hist gets the next) and the LayerNorm over channels in fp32,
// fc1 (C -> I) and fc2 (I -> C, the block's gamma folded in by the caller) as bf16 1x1 convs,
// the exact GELU between them. x, y: [C, T].
int32_t vo_convnext_bf16(const float* dw_w, const float* dw_b, int64_t C, int64_t k, const float* hist,
                         const float* x, int64_t T, const float* ln_w, const float* ln_b, float eps,
                         const uint16_t* fc1, const float* fc1_b, int64_t I, const uint16_t* fc2, const float* fc2_b,
                         float* y, float* new_hist, int32_t threads) {
    if (C % 32 != 0 || I % 32 != 0 || k < 1 || T < 0) return -1;
    if (T == 0) return 0;
    if (!conv_ready()) return -2;
    const int64_t tail = k - 1, t_pad = (T + T_PAIR - 1) / T_PAIR * T_PAIR;
    std::vector<float> h(C * T), mid(I * T);
    uint16_t* xp = conv_packed(std::max(C, I) * t_pad);
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < C; ++c) {  // in[c] = [hist[c] | x[c]]; output t reads in[t .. t + tail]
            auto in = [&](int64_t i) { return i < tail ? (hist != nullptr ? hist[c * tail + i] : 0.0f) : x[c * T + i - tail]; };
            for (int64_t t = 0; t < T; ++t) {
                float sum = dw_b != nullptr ? dw_b[c] : 0.0f;
                for (int64_t j = 0; j < k; ++j) sum += dw_w[c * k + j] * in(t + j);
                h[c * T + t] = sum;
            }
            if (new_hist != nullptr)
                for (int64_t j = 0; j < tail; ++j) new_hist[c * tail + j] = in(T + j);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
            float mean = 0.0f, var = 0.0f;
            for (int64_t c = 0; c < C; ++c) mean += h[c * T + t];
            mean /= float(C);
            for (int64_t c = 0; c < C; ++c) var += (h[c * T + t] - mean) * (h[c * T + t] - mean);
            const float r = 1.0f / std::sqrt(var / float(C) + eps);
            for (int64_t c = 0; c < C; ++c) h[c * T + t] = (h[c * T + t] - mean) * r * ln_w[c] + ln_b[c];
        }
        linear_share(fc1, fc1_b, I, C, h.data(), T, nullptr, mid.data(), xp);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < I * T; ++i) mid[i] = 0.5f * mid[i] * (1.0f + std::erf(mid[i] * 0.70710678118654752f));
        linear_share(fc2, fc2_b, C, I, mid.data(), T, x, y, xp);
    }
    return 0;
}

// --- The decoder's transformer in bf16 ----------------------------------------------------
//
// In, 8 pre-norm layers of sliding-window attention and SwiGLU, out, on T samples in one
// parallel region: every linear layer is the bf16 conv loop above as a 1x1 conv (activations
// stay channels by samples, [C, T], as the convs around it), LayerScale folded into o and down
// by the caller; norms, RoPE, attention and SwiGLU in fp32 between them.

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

// y [latent, T] from x [latent, T]. Sample t is at absolute position pos0 + t; rope_cos and
// rope_sin [T, head_dim] are its tables. Layer l attends over its past keys and values
// past_k[l], past_v[l] ([heads, P, head_dim], the P < window positions before pos0) and this
// call's; new_k[l], new_v[l] ([heads, min(P + T, window - 1), head_dim]) get the last ones for the
// next call. Returns 0, -1 on shapes it does not take, -2 where the CPU refused AMX.
int32_t vo_dec_transformer(const VoDecTransformer* mp, const float* x, int64_t T, const float* rope_cos,
                           const float* rope_sin, const float* const* past_k, const float* const* past_v, int64_t P,
                           float* const* new_k, float* const* new_v, float* y, int32_t threads) {
    const VoDecTransformer& m = *mp;
    const int64_t L = m.latent, H = m.hidden, I = m.inter, hd = m.head_dim, nh = m.heads, D = nh * hd;
    const int64_t keep = m.window - 1;
    if (T < 1 || L % 32 || H % 32 || I % 32 || D % 32 || hd % 2 || hd > 512 || P < 0 || P > keep || m.n_layers < 1)
        return -1;
    if (!conv_ready()) return -2;
    const int64_t P2 = std::min(P + T, keep), t_pad = (T + T_PAIR - 1) / T_PAIR * T_PAIR;
    std::vector<float> h(H * T), xn(H * T), qkv(3 * D * T), att(D * T), gu(2 * I * T), mid(I * T);
    uint16_t* xp = conv_packed(std::max({L, H, D, I}) * t_pad);
    const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
        std::vector<float> q(T * hd), k(T * hd), v(T * hd), scores(P + T);
        linear_share(m.in_proj, m.in_bias, H, L, x, T, nullptr, h.data(), xp);
        for (int l = 0; l < m.n_layers; ++l) {
            const VoDecLayer& ly = m.layers[l];
            rms_columns(h.data(), ly.input_norm, xn.data(), H, T, m.eps);
            linear_share(ly.qkv, nullptr, 3 * D, H, xn.data(), T, nullptr, qkv.data(), xp);
#pragma omp for schedule(static)
            for (int64_t a = 0; a < nh; ++a) {
                for (int64_t t = 0; t < T; ++t) {  // this head's q, k, v of each sample, q and k rotated
                    for (int64_t d = 0; d < hd; ++d) {
                        q[t * hd + d] = qkv[(a * hd + d) * T + t];
                        k[t * hd + d] = qkv[(D + a * hd + d) * T + t];
                        v[t * hd + d] = qkv[(2 * D + a * hd + d) * T + t];
                    }
                    rope_head(q.data() + t * hd, rope_cos + t * hd, rope_sin + t * hd, hd);
                    rope_head(k.data() + t * hd, rope_cos + t * hd, rope_sin + t * hd, hd);
                }
                const float* pk = past_k[l] + a * P * hd;
                const float* pv = past_v[l] + a * P * hd;
                for (int64_t t = 0; t < T; ++t) {
                    // keys at pos0 + t - keep .. pos0 + t: past entries from P + t - keep, this call's from t - keep
                    const int64_t p0 = std::max<int64_t>(0, P + t - keep), c0 = std::max<int64_t>(0, t - keep);
                    const float* qt = q.data() + t * hd;
                    float top = -INFINITY;
                    int64_t n = 0;
                    auto score = [&](const float* kr) {
                        float sdot = 0.0f;
                        for (int64_t d = 0; d < hd; ++d) sdot += qt[d] * kr[d];
                        scores[n] = sdot * scale;
                        top = std::max(top, scores[n++]);
                    };
                    for (int64_t i = p0; i < P; ++i) score(pk + i * hd);
                    for (int64_t j = c0; j <= t; ++j) score(k.data() + j * hd);
                    float sum = 0.0f;
                    for (int64_t i = 0; i < n; ++i) sum += scores[i] = std::exp(scores[i] - top);
                    float out[512] = {};
                    n = 0;
                    for (int64_t i = p0; i < P; ++i, ++n)
                        for (int64_t d = 0; d < hd; ++d) out[d] += scores[n] * pv[i * hd + d];
                    for (int64_t j = c0; j <= t; ++j, ++n)
                        for (int64_t d = 0; d < hd; ++d) out[d] += scores[n] * v[j * hd + d];
                    for (int64_t d = 0; d < hd; ++d) att[(a * hd + d) * T + t] = out[d] / sum;
                }
                for (int64_t i = 0; i < P2; ++i) {  // the last P2 keys and values, for the next call
                    const int64_t src = P + T - P2 + i;
                    const float* ks = src < P ? pk + src * hd : k.data() + (src - P) * hd;
                    const float* vs = src < P ? pv + src * hd : v.data() + (src - P) * hd;
                    std::memcpy(new_k[l] + (a * P2 + i) * hd, ks, hd * sizeof(float));
                    std::memcpy(new_v[l] + (a * P2 + i) * hd, vs, hd * sizeof(float));
                }
            }
            linear_share(ly.o, nullptr, H, D, att.data(), T, h.data(), h.data(), xp);
            rms_columns(h.data(), ly.post_norm, xn.data(), H, T, m.eps);
            linear_share(ly.gate_up, nullptr, 2 * I, H, xn.data(), T, nullptr, gu.data(), xp);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < I * T; ++i) {
                const float g = gu[i];
                mid[i] = g / (1.0f + std::exp(-g)) * gu[I * T + i];
            }
            linear_share(ly.down, nullptr, H, I, mid.data(), T, h.data(), h.data(), xp);
        }
        rms_columns(h.data(), m.final_norm, xn.data(), H, T, m.eps);
        linear_share(m.out_proj, m.out_bias, L, H, xn.data(), T, nullptr, y, xp);
    }
    return 0;
}

}  // extern "C"
