// A command-line driver of the native kernels, for targets where Python is not at hand: the
// kernels cross-compiled for aarch64 and run under qemu-user (vllm_omni.cpu.cross).
//
//   vo_driver CASE_IN OUT     runs the case in CASE_IN and writes its float32 results to OUT
//   vo_driver --serve         holds memory and runs calls for a process on the other side of
//                             stdin and stdout (cross.ArmLibrary: the whole generation loop on
//                             the ARM kernels, with the loop itself in Python)
//
// A case file is little-endian: a 32-bit kind, then that kind's fields (written by cross.py):
//   0 linear    i32 fmt, i64 rows, i64 cols, i32 M, i64 w_bytes, i64 s_bytes, w, s, float x[M*cols]
//               -> y[M*rows] from vo_linear
//   1 swiglu    i32 n, float g[n], float u[n] -> vo_swiglu's out[n]
//   2 uniforms  u64 key, u64 index0, i64 n -> vo_counter_uniforms' out[n]
//   3 snake     i64 C, i64 T, float x[C*T], float a[C], float inv_b[C] -> vo_snake's y[C*T]
//   4 conv      i64 cout, i64 cin, i64 k, i64 d, i64 T, float w[cout*cin*k], float bias[cout],
//               float hist[cin*(k-1)*d], float x[cin*T], float a[cin], float inv_b[cin]
//               -> vo_conv_bf16's y[cout*T] (SnakeBeta first), then its new history[cin*(k-1)*d]
//   5 int8 conv the fields of 4 -> vo_conv_i8's y[cout*T], then its new history
// Every case runs with 2 threads, and prints the loops it was built with ("isa N", "int8_conv N"). Exit status: 0, 2 for a bad case file, 3 when the kernel refused it.
//
// --serve reads requests, each a 32-bit verb then its fields (little-endian), and answers on stdout:
//   0 quit
//   1 alloc     u64 n                    -> u64 address of n zeroed bytes (64-byte aligned)
//   2 write     u64 address, u64 n, bytes
//   3 read      u64 address, u64 n       -> the n bytes there
//   4 call      u32 function, u32 count, u64 args[count] -> i64 its result; functions:
//               0 vo_stack_forward_rows, 1 vo_predictor_frames, 2 vo_isa (arguments in their order,
//               pointers as addresses in this process, an int or a float's bits in the low bits)
// Addresses are trusted: the other side builds every structure it passes (a test driver only).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
struct VoMat {
    const void* w;
    const void* s;
    int64_t rows;
    int64_t cols;
};
int32_t vo_linear(int32_t fmt, const VoMat* m, const float* x, int32_t M, float* y, int32_t threads);
void vo_swiglu(const float* g, const float* u, float* out, int32_t n);
void vo_counter_uniforms(uint64_t key, uint64_t index0, int64_t n, float* out);
void vo_snake(const float* x, float* y, int64_t C, int64_t T, const float* a, const float* inv_b, int32_t threads);
struct VoSeg {
    const float* x;
    int64_t x_stride;
    int64_t T;
    const float* hist;
    const float* residual;
    float* y;
    int64_t y_stride;
    float* new_hist;
};
int32_t vo_conv_pack_bf16(const float* w, int64_t cout, int64_t cin, int64_t k, uint16_t* out);
int32_t vo_conv_bf16(const uint16_t* wp, const float* bias, int64_t cout, int64_t cin, int64_t k, int64_t d,
                     const float* snake_a, const float* snake_inv_b, const VoSeg* segs, int64_t n, int32_t threads);
int32_t vo_conv_pack_i8(const float* w, int64_t cout, int64_t cin, int64_t k, int8_t* out, float* scale,
                        int32_t* wsum);
int32_t vo_conv_i8(const int8_t* wq, const float* scale, const int32_t* wsum, const float* bias, int64_t cout,
                   int64_t cin, int64_t k, int64_t d, const float* snake_a, const float* snake_inv_b, const VoSeg* segs,
                   int64_t n, int32_t threads);
int32_t vo_isa();
int32_t vo_conv_i8_path();
struct VoStack;
int32_t vo_stack_forward_rows(const VoStack* stp, const float* x, int32_t T, const int32_t* pos, void* const* kv,
                              float* out, const VoMat* head, float* logits, int32_t head_rows);
int32_t vo_predictor_frames(const VoStack* stp, const VoMat* heads, int32_t G, const float* emb, int64_t Ht,
                            const VoMat* proj, const float* proj_bias, int32_t B, void* const* kv,
                            const float* past_hidden, const float* c0_embed, int32_t greedy, float temperature,
                            int32_t top_k, const float* uniforms, const uint64_t* keys, int64_t* codes_out,
                            float* embed_sum_out, float* logits_out, float* scratch);
}

namespace {

struct Reader {
    FILE* f;
    bool ok = true;
    template <class T>
    T get() {
        T v{};
        ok = ok && std::fread(&v, sizeof(T), 1, f) == 1;
        return v;
    }
    template <class T>
    std::vector<T> many(int64_t n) {
        std::vector<T> v(n > 0 && ok ? static_cast<size_t>(n) : 0);
        ok = ok && n >= 0 && std::fread(v.data(), sizeof(T), v.size(), f) == v.size();
        return v;
    }
};

constexpr int32_t THREADS = 2;

template <class T>
T* at(uint64_t a) {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(a));
}

float float_bits(uint64_t a) {
    const uint32_t u = static_cast<uint32_t>(a);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

int64_t call(uint32_t fn, const uint64_t* a, uint32_t n) {
    if (fn == 0 && n == 9)
        return vo_stack_forward_rows(at<const VoStack>(a[0]), at<const float>(a[1]), int32_t(a[2]),
                                     at<const int32_t>(a[3]), at<void* const>(a[4]), at<float>(a[5]),
                                     at<const VoMat>(a[6]), at<float>(a[7]), int32_t(a[8]));
    if (fn == 1 && n == 20)
        return vo_predictor_frames(at<const VoStack>(a[0]), at<const VoMat>(a[1]), int32_t(a[2]), at<const float>(a[3]),
                                   int64_t(a[4]), at<const VoMat>(a[5]), at<const float>(a[6]), int32_t(a[7]),
                                   at<void* const>(a[8]), at<const float>(a[9]), at<const float>(a[10]),
                                   int32_t(a[11]), float_bits(a[12]), int32_t(a[13]), at<const float>(a[14]),
                                   at<const uint64_t>(a[15]), at<int64_t>(a[16]), at<float>(a[17]),
                                   at<float>(a[18]), at<float>(a[19]));
    if (fn == 2 && n == 0) return vo_isa();
    std::fprintf(stderr, "vo_driver: no function %u of %u arguments\n", fn, n);
    return INT64_MIN;
}

// The --serve loop (see the top of this file); returns the exit status.
int serve() {
    const auto get = [](void* p, size_t n) { return std::fread(p, 1, n, stdin) == n; };
    const auto put = [](const void* p, size_t n) { return std::fwrite(p, 1, n, stdout) == n; };
    for (;;) {
        uint32_t verb = 0;
        if (!get(&verb, 4) || verb == 0) return 0;
        bool ok = true;
        if (verb == 1) {
            uint64_t n = 0;
            ok = get(&n, 8);
            void* p = ok ? std::aligned_alloc(64, (n + 63) / 64 * 64 + 64) : nullptr;
            if (p) std::memset(p, 0, (n + 63) / 64 * 64 + 64);
            const uint64_t addr = reinterpret_cast<uintptr_t>(p);
            ok = ok && p && put(&addr, 8);
        } else if (verb == 2 || verb == 3) {
            uint64_t a[2] = {};
            ok = get(a, 16) && (verb == 2 ? get(at<void>(a[0]), a[1]) : put(at<void>(a[0]), a[1]));
        } else if (verb == 4) {
            uint32_t head[2] = {};
            uint64_t args[32] = {};
            ok = get(head, 8) && head[1] <= 32 && get(args, 8 * size_t(head[1]));
            const int64_t rc = ok ? call(head[0], args, head[1]) : 0;
            ok = ok && put(&rc, 8);
        } else {
            std::fprintf(stderr, "vo_driver: unknown request %u\n", verb);
            return 2;
        }
        if (!ok || std::fflush(stdout) != 0) {
            std::fprintf(stderr, "vo_driver: request %u cut short\n", verb);
            return 2;
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "--serve") == 0) return serve();
    if (argc != 3) {
        std::fprintf(stderr, "usage: vo_driver CASE_IN OUT | vo_driver --serve\n");
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) {
        std::fprintf(stderr, "vo_driver: cannot read %s\n", argv[1]);
        return 2;
    }
    Reader r{in};
    const int32_t kind = r.get<int32_t>();
    std::vector<float> out;
    int32_t rc = 0;
    if (kind == 0) {
        const int32_t fmt = r.get<int32_t>();
        const int64_t rows = r.get<int64_t>(), cols = r.get<int64_t>();
        const int32_t M = r.get<int32_t>();
        const int64_t wb = r.get<int64_t>(), sb = r.get<int64_t>();
        const auto w = r.many<uint8_t>(wb);
        const auto s = r.many<uint8_t>(sb);
        const auto x = r.many<float>(int64_t(M) * cols);
        if (r.ok) {
            out.resize(size_t(M) * rows);
            const VoMat m{w.data(), sb ? s.data() : nullptr, rows, cols};
            rc = vo_linear(fmt, &m, x.data(), M, out.data(), THREADS);
        }
    } else if (kind == 1) {
        const int32_t n = r.get<int32_t>();
        const auto g = r.many<float>(n), u = r.many<float>(n);
        if (r.ok) {
            out.resize(n);
            vo_swiglu(g.data(), u.data(), out.data(), n);
        }
    } else if (kind == 2) {
        const uint64_t key = r.get<uint64_t>(), index0 = r.get<uint64_t>();
        const int64_t n = r.get<int64_t>();
        if (r.ok && n >= 0) {
            out.resize(n);
            vo_counter_uniforms(key, index0, n, out.data());
        }
    } else if (kind == 3) {
        const int64_t C = r.get<int64_t>(), T = r.get<int64_t>();
        const auto x = r.many<float>(C * T), a = r.many<float>(C), b = r.many<float>(C);
        if (r.ok) {
            out.resize(size_t(C * T));
            vo_snake(x.data(), out.data(), C, T, a.data(), b.data(), THREADS);
        }
    } else if (kind == 4 || kind == 5) {
        const int64_t cout = r.get<int64_t>(), cin = r.get<int64_t>(), k = r.get<int64_t>(), d = r.get<int64_t>();
        const int64_t T = r.get<int64_t>(), tail = (k - 1) * d;
        const auto w = r.many<float>(cout * cin * k), bias = r.many<float>(cout), hist = r.many<float>(cin * tail);
        const auto x = r.many<float>(cin * T), a = r.many<float>(cin), b = r.many<float>(cin);
        if (r.ok) {
            out.resize(size_t(cout * T + cin * tail));
            const VoSeg seg{x.data(), T, T, hist.data(), nullptr, out.data(), T, out.data() + cout * T};
            if (kind == 4) {
                std::vector<uint16_t> packed(size_t(cout * cin * k));
                rc = vo_conv_pack_bf16(w.data(), cout, cin, k, packed.data());
                if (rc == 0)
                    rc = vo_conv_bf16(packed.data(), bias.data(), cout, cin, k, d, a.data(), b.data(), &seg, 1, THREADS);
            } else {
                std::vector<int8_t> packed(size_t(cout * cin * k));
                std::vector<float> scale(cout);
                std::vector<int32_t> wsum(cout * k);
                rc = vo_conv_pack_i8(w.data(), cout, cin, k, packed.data(), scale.data(), wsum.data());
                if (rc == 0)
                    rc = vo_conv_i8(packed.data(), scale.data(), wsum.data(), bias.data(), cout, cin, k, d, a.data(),
                                    b.data(), &seg, 1, THREADS);
            }
        }
    } else {
        r.ok = false;
    }
    std::fclose(in);
    if (!r.ok) {
        std::fprintf(stderr, "vo_driver: %s is not a case file of kind 0-5 (kind %d), or it is cut short\n", argv[1],
                     kind);
        return 2;
    }
    if (rc != 0) {
        std::fprintf(stderr, "vo_driver: the kernel refused the case (%d)\n", rc);
        return 3;
    }
    FILE* o = std::fopen(argv[2], "wb");
    if (!o || std::fwrite(out.data(), sizeof(float), out.size(), o) != out.size()) {
        std::fprintf(stderr, "vo_driver: cannot write %s\n", argv[2]);
        return 2;
    }
    std::fclose(o);
    std::printf("isa %d\nint8_conv %d\n", vo_isa(), vo_conv_i8_path());
    return 0;
}
