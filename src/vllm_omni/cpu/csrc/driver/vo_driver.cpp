// A command-line driver of the native kernels, for targets where Python is not at hand: the
// kernels cross-compiled for aarch64 and run under qemu-user (vllm_omni.cpu.cross).
//
//   vo_driver CASE_IN OUT     runs the case in CASE_IN and writes its float32 results to OUT
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
// Every case runs with 2 threads. Exit status: 0, 2 for a bad case file, 3 when the kernel refused it.

#include <cstdint>
#include <cstdio>
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
int32_t vo_isa();
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

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: vo_driver CASE_IN OUT\n");
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
    } else if (kind == 4) {
        const int64_t cout = r.get<int64_t>(), cin = r.get<int64_t>(), k = r.get<int64_t>(), d = r.get<int64_t>();
        const int64_t T = r.get<int64_t>(), tail = (k - 1) * d;
        const auto w = r.many<float>(cout * cin * k), bias = r.many<float>(cout), hist = r.many<float>(cin * tail);
        const auto x = r.many<float>(cin * T), a = r.many<float>(cin), b = r.many<float>(cin);
        if (r.ok) {
            std::vector<uint16_t> packed(size_t(cout * cin * k));
            out.resize(size_t(cout * T + cin * tail));
            const VoSeg seg{x.data(), T, T, hist.data(), nullptr, out.data(), T, out.data() + cout * T};
            rc = vo_conv_pack_bf16(w.data(), cout, cin, k, packed.data());
            if (rc == 0) rc = vo_conv_bf16(packed.data(), bias.data(), cout, cin, k, d, a.data(), b.data(), &seg, 1, THREADS);
        }
    } else {
        r.ok = false;
    }
    std::fclose(in);
    if (!r.ok) {
        std::fprintf(stderr, "vo_driver: %s is not a case file of kind 0-4 (kind %d), or it is cut short\n", argv[1],
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
    std::printf("isa %d\n", vo_isa());
    return 0;
}
