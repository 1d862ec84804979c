// bench_kda.cu — timings of the CUDA KDA kernels (src/cuda/kda.cuh), bf16, K = V = 128:
// forward, its split into the chunk-parallel prep (intra-chunk) and the serial scan
// (inter-chunk), forward+backward (forward with saved checkpoints, then the backward),
// both gates, and decode at 64 sequences × 32 heads. Medians of CUDA-event timings after
// warm-up. bench/run_bench.sh runs this next to bench/bench_kda_fla.py (fla).
//
//   bench_kda [--quick]     prints a table and "RESULT key value" lines
#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include "cuda/kda.cuh"
#include "cuda/cuda_exit_check.cuh"

typedef __nv_bfloat16 bf16;

// deterministic pseudo-normal values: sum of 4 hashed uniforms, scaled to std sd, plus mean
__device__ inline float hnorm(uint64_t i, uint32_t seed) {
    float s = 0.f;
    for (int r = 0; r < 4; r++) {
        uint64_t x = (i * 4 + r) * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
        x ^= x >> 31; x *= 0x7FB5D329728EA185ull; x ^= x >> 27; x *= 0x81DADEF4BC2DD44Dull; x ^= x >> 33;
        s += (float)(x >> 40) * (1.f / 16777216.f);
    }
    return (s - 2.f) * 1.7320508f;   // var of a sum of 4 U(0,1) = 1/3
}
__global__ void fill_bf16(bf16 *x, size_t n, uint32_t seed, float sd, float mean) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(mean + sd * hnorm(i, seed));
}
// the floor for decode: the same bytes read and written in place, nothing else (16-byte
// accesses, one per thread)
__global__ void scale_in_place(float4 *x, size_t n4, float a) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        x[i] = make_float4(v.x * a, v.y * a, v.z * a, v.w * a);
    }
}
// the out-of-place floor: read one pool, write another (as a ping-pong decode does)
__global__ void scale_copy(const float4 *x, float4 *y, size_t n4, float a) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        y[i] = make_float4(v.x * a, v.y * a, v.z * a, v.w * a);
    }
}
__global__ void fill_f32(float *x, size_t n, uint32_t seed, float sd, float mean) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = mean + sd * hnorm(i, seed);
}
template <typename T> static T *dalloc(size_t n) {
    T *p;
    CU(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    return p;
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
// steady state: events around n back-to-back calls (as a decode loop issues them), median / n
template <typename F> static double time_ms_n(F fn, int warm, int reps, int n) {
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) fn();
    CU(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CU(cudaEventRecord(a));
        for (int j = 0; j < n; j++) fn();
        CU(cudaEventRecord(b));
        CU(cudaEventSynchronize(b));
        float ms;
        CU(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / n);
    }
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return median(t);
}
// one call between two events (and a sync) per sample
template <typename F> static double time_ms(F fn, int warm, int reps) { return time_ms_n(fn, warm, reps, 1); }

struct Shape { int B, T, H; bool bwd; };

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    bool profile = argc > 1 && !strcmp(argv[1], "--profile");   // each kernel once (for ncu)
    bool decode_only = argc > 1 && !strcmp(argv[1], "--decode");
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    {   // copy bandwidth ceiling: device-to-device copy of 4 GiB, bytes read + written
        size_t n = (size_t)4 << 30;
        char *x = dalloc<char>(n), *y = dalloc<char>(n);
        CU(cudaMemset(x, 1, n));
        double ms = time_ms([&] { CU(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice)); }, 2, 10);
        printf("RESULT copy_GBps %.0f\n", 2.0 * n / ms / 1e6);
        CU(cudaFree(x));
        CU(cudaFree(y));
    }

    const int K = 128, V = 128;
    std::vector<Shape> shapes = {{1, 8192, 96, true},  {2, 16384, 16, true}, {4, 2048, 16, true},
                                 {4, 4096, 64, true},  {8, 2048, 32, true},  {1, 65536, 32, true},
                                 {1, 1048576, 32, false}};
    if (quick || profile) shapes = {{1, 8192, 96, true}};
    if ((quick || profile) && getenv("KDA_BENCH_SHAPE")) {   // "B,T,H" or "B,T,H,0" (no backward) instead
        Shape sh = {1, 8192, 96, true};
        int bwd = 1;
        if (sscanf(getenv("KDA_BENCH_SHAPE"), "%d,%d,%d,%d", &sh.B, &sh.T, &sh.H, &bwd) >= 3) {
            sh.bwd = bwd != 0;
            shapes = {sh};
        }
    }
    if (decode_only) shapes.clear();
    bool variants = (quick && !getenv("KDA_BENCH_NOVAR")) || getenv("KDA_BENCH_VARIANTS");
    printf("\n%-18s %-9s %9s %9s %9s %11s %9s\n", "shape", "gate", "fwd ms", "prep ms", "scan ms", "fwd+bwd ms", "bwd ms");
    for (const Shape &s : shapes) {
        size_t Tt = (size_t)s.B * s.T, nqk = Tt * s.H * K, nv = Tt * s.H * V, nb = Tt * s.H, ns = (size_t)s.B * s.H * K * V;
        bf16 *q = dalloc<bf16>(nqk), *k = dalloc<bf16>(nqk), *v = dalloc<bf16>(nv), *f = dalloc<bf16>(nqk), *bl = dalloc<bf16>(nb);
        bf16 *o = dalloc<bf16>(nv);
        float *A = dalloc<float>(s.H), *db = dalloc<float>((size_t)s.H * K), *S0 = dalloc<float>(ns), *S = dalloc<float>(ns);
        fill_bf16<<<4096, 256>>>(q, nqk, 1, 1, 0);
        fill_bf16<<<4096, 256>>>(k, nqk, 2, 1, 0);
        fill_bf16<<<4096, 256>>>(v, nv, 3, 1, 0);
        fill_bf16<<<4096, 256>>>(f, nqk, 4, 1.5f, 0);
        fill_bf16<<<4096, 256>>>(bl, nb, 5, 1, 0);
        fill_f32<<<64, 256>>>(S0, ns, 6, 0.5f, 0);
        bf16 *dO = NULL, *dq = NULL, *dk = NULL, *dv = NULL, *df = NULL, *dbl = NULL;
        float *dSo = NULL, *dA = NULL, *ddb = NULL, *dS0 = NULL;
        if (s.bwd) {
            dO = dalloc<bf16>(nv); dq = dalloc<bf16>(nqk); dk = dalloc<bf16>(nqk); dv = dalloc<bf16>(nv);
            df = dalloc<bf16>(nqk); dbl = dalloc<bf16>(nb);
            dSo = dalloc<float>(ns); dA = dalloc<float>(s.H); ddb = dalloc<float>((size_t)s.H * K); dS0 = dalloc<float>(ns);
            fill_bf16<<<4096, 256>>>(dO, nv, 7, 1, 0);
            fill_f32<<<64, 256>>>(dSo, ns, 8, 0.1f, 0);
        }
        kda_params p;
        memset(&p, 0, sizeof p);
        p.N = s.B; p.T = s.T; p.H = s.H; p.K = K; p.V = V; p.lb = -5.f; p.scale = 1.f / sqrtf((float)K);
        p.q = q; p.k = k; p.v = v; p.f = f; p.beta = bl; p.A_log = A; p.dt_bias = db; p.S0 = S0; p.o = o; p.S_out = S;
        p.d_o = dO; p.dS_out = dSo; p.dq = dq; p.dk = dk; p.dv = dv; p.df = df; p.dbeta = dbl;
        p.dA_log = dA; p.ddt_bias = ddb; p.dS0 = dS0;
        p.save = s.bwd;
        const char *ex = getenv("KDA_BENCH_EXACT");
        p.exact = ex && atoi(ex) ? 1 : 0;   // the bounded rows by tree anchors
        size_t wsb = kda_workspace_size(&p, s.bwd);
        void *ws = dalloc<char>(wsb);
        p.ws = ws;
        int reps = s.T * s.B >= (1 << 20) ? 5 : 20, warm = 3;
        char name[64];
        snprintf(name, sizeof name, "B%d.T%d.H%d", s.B, s.T, s.H);
        if (profile) {
            fill_f32<<<1, 256>>>(A, s.H, 9, 0.29f, 0);
            fill_f32<<<8, 256>>>(db, (size_t)s.H * K, 10, 1, 0);
            p.save = 0;   // the plain forward first (ncu: launch 0 of the prep and scan kernels)
            CU(kda_fwd(&p));
            p.save = 1;
            CU(kda_fwd(&p));
            p.saved = 1;
            CU(kda_bwd(&p));
            p.gate_mode = 1;
            p.saved = 0;
            CU(kda_fwd_prep(&p));
            CU(cudaDeviceSynchronize());
            printf("profile run done\n");
            return 0;
        }
        for (int gate = 0; gate < 2; gate++) {
            p.gate_mode = gate;
            if (gate == 0) {
                fill_f32<<<1, 256>>>(A, s.H, 9, 0.29f, 0);   // ≈ U(−0.5, 0.5) spread
                fill_f32<<<8, 256>>>(db, (size_t)s.H * K, 10, 1, 0);
            } else {
                fill_f32<<<1, 256>>>(A, s.H, 11, 0.3f, 0.2f);
                fill_f32<<<8, 256>>>(db, (size_t)s.H * K, 12, 0.5f, -1);
            }
            p.save = 0;
            double fwd = time_ms([&] { CU(kda_fwd(&p)); }, warm, reps);
            double prep = time_ms([&] { CU(kda_fwd_prep(&p)); }, warm, reps);
            double scan = time_ms([&] { CU(kda_fwd_scan(&p)); }, warm, reps);
            double fb = 0, bwd = 0;
            if (s.bwd) {
                p.save = 1;
                fb = time_ms([&] {
                    p.saved = 0;
                    CU(kda_fwd(&p));
                    p.saved = 1;
                    CU(kda_bwd(&p));
                }, warm, reps);
                bwd = time_ms([&] { p.saved = 1; CU(kda_bwd(&p)); }, warm, reps);
                p.saved = 0;
                p.save = 0;
            }
            if (s.bwd) {   // the backward's stages apart (forward checkpoints saved)
                const char *nm[] = {"rscan", "seg", "chunk", "reduce"};
                p.save = 1;   // the saving forward and its prep (which also keep the backward's part)
                const double sfwd = time_ms([&] { CU(kda_fwd(&p)); }, warm, reps);
                const double sprep = time_ms([&] { CU(kda_fwd_prep(&p)); }, warm, reps);
                CU(kda_fwd(&p));
                p.saved = 1;
                double ms[4];
                for (int st = 0; st < 4; st++) {
                    char v[8];
                    snprintf(v, sizeof v, "%d", 2 << st);
                    setenv("KDA_BWD_STAGES", v, 1);
                    ms[st] = time_ms([&] { CU(kda_bwd(&p)); }, warm, reps);
                }
                printf("  bwd stages %s:", gate ? "unbounded" : "bounded");
                for (int st = 0; st < 4; st++) printf(" %s %.3f", nm[st], ms[st]);
                printf(" | saving fwd %.3f prep %.3f\n", sfwd, sprep);
                printf("RESULT %s.%s.save_fwd %.4f\nRESULT %s.%s.save_prep %.4f\n", name, gate ? "unbounded" : "bounded",
                       sfwd, name, gate ? "unbounded" : "bounded", sprep);
                for (int st = 0; st < 4; st++)
                    printf("RESULT %s.%s.bwd_%s %.4f\n", name, gate ? "unbounded" : "bounded", nm[st], ms[st]);
                unsetenv("KDA_BWD_STAGES");
                p.saved = 0;
                p.save = 0;
            }
            if (variants && gate == 0) {   // scan width (value slices per block × warps per slice)
                const char *ws_[] = {"1", "2", "4", "8"}, *ks_[] = {"1", "2", "4"};
                for (int ki = 0; ki < 3; ki++)
                    for (int wi = 0; wi < 4; wi++) {
                        if (atoi(ws_[wi]) * atoi(ks_[ki]) > 8) continue;
                        setenv("KDA_SCAN_WARPS", ws_[wi], 1);
                        setenv("KDA_SCAN_KS", ks_[ki], 1);
                        // the layout follows the scan's shape (two-level segments): grow the workspace
                        if (kda_workspace_size(&p, s.bwd) > wsb) {
                            CU(cudaFree(ws));
                            wsb = kda_workspace_size(&p, s.bwd);
                            ws = dalloc<char>(wsb);
                            p.ws = ws;
                            p.save = 1;
                            CU(kda_fwd(&p));   // checkpoints in this layout for the saved backward
                            p.save = 0;
                        }
                        double sc = time_ms([&] { CU(kda_fwd_scan(&p)); }, warm, reps);
                        double bw = 0;
                        if (s.bwd && ki == 0) {
                            setenv("KDA_BWD_STAGES", "2", 1);
                            p.saved = 1;
                            bw = time_ms([&] { CU(kda_bwd(&p)); }, warm, reps);
                            p.saved = 0;
                            unsetenv("KDA_BWD_STAGES");
                        }
                        printf("  variant scan_ks=%s scan_warps=%s: scan %.3f ms, rscan %.3f ms\n", ks_[ki], ws_[wi], sc, bw);
                    }
                unsetenv("KDA_SCAN_WARPS");
                unsetenv("KDA_SCAN_KS");
            }
            CU(cudaDeviceSynchronize());
            const char *gn = gate ? "unbounded" : p.exact ? "bounded-exact" : "bounded";
            printf("%-18s %-9s %9.3f %9.3f %9.3f %11.3f %9.3f\n", name, gn, fwd, prep, scan, fb, bwd);
            printf("RESULT %s.%s.fwd %.4f\nRESULT %s.%s.prep %.4f\nRESULT %s.%s.scan %.4f\n", name, gn, fwd, name, gn, prep,
                   name, gn, scan);
            if (s.bwd) printf("RESULT %s.%s.fwdbwd %.4f\nRESULT %s.%s.bwd %.4f\n", name, gn, fb, name, gn, bwd);
            fflush(stdout);
        }
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(f); cudaFree(bl); cudaFree(o); cudaFree(A); cudaFree(db);
        cudaFree(S0); cudaFree(S); cudaFree(ws);
        if (s.bwd) {
            cudaFree(dO); cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(df); cudaFree(dbl);
            cudaFree(dSo); cudaFree(dA); cudaFree(ddb); cudaFree(dS0);
        }
    }

    {   // decode: 64 sequences × 32 heads, 128×128 fp32 states in a pool of 64 slots (reversed order)
        int B = 64, H = 32;
        size_t nst = (size_t)B * H * K * V;
        float *st = dalloc<float>(nst), *st2 = dalloc<float>(nst), *A = dalloc<float>(H), *db = dalloc<float>((size_t)H * K);
        bf16 *q = dalloc<bf16>((size_t)B * H * K), *k = dalloc<bf16>((size_t)B * H * K), *f = dalloc<bf16>((size_t)B * H * K);
        bf16 *v = dalloc<bf16>((size_t)B * H * V), *bl = dalloc<bf16>((size_t)B * H), *o = dalloc<bf16>((size_t)B * H * V);
        int *slots = dalloc<int>(B);
        std::vector<int> hs(B);
        for (int b = 0; b < B; b++) hs[b] = B - 1 - b;
        CU(cudaMemcpy(slots, hs.data(), B * sizeof(int), cudaMemcpyHostToDevice));
        fill_f32<<<1024, 256>>>(st, nst, 20, 0.5f, 0);
        fill_bf16<<<64, 256>>>(q, (size_t)B * H * K, 21, 1, 0);
        fill_bf16<<<64, 256>>>(k, (size_t)B * H * K, 22, 1, 0);
        fill_bf16<<<64, 256>>>(f, (size_t)B * H * K, 23, 1.5f, 0);
        fill_bf16<<<64, 256>>>(v, (size_t)B * H * V, 24, 1, 0);
        fill_bf16<<<8, 256>>>(bl, (size_t)B * H, 25, 1, 0);
        fill_f32<<<1, 256>>>(A, H, 26, 0.29f, 0);
        fill_f32<<<8, 256>>>(db, (size_t)H * K, 27, 1, 0);
        // KDA_BENCH_REPS: fewer timed steps (a profiler run)
        int dreps = getenv("KDA_BENCH_REPS") ? atoi(getenv("KDA_BENCH_REPS")) : 200, dwarm = dreps < 10 ? 1 : 10;
        {
            size_t n4 = nst / 4;
            double ms = time_ms([&] { scale_in_place<<<(unsigned)((n4 + 255) / 256), 256>>>((float4 *)st, n4, 1.0f); },
                                10, 200);
            printf("decode floor: the pool read and written in place %8.1f us  (%.0f GB/s)\n", ms * 1e3,
                   2.0 * nst * sizeof(float) / (ms * 1e6));
            printf("RESULT decode.floor.us %.2f\n", ms * 1e3);
            ms = time_ms([&] { scale_copy<<<(unsigned)((n4 + 255) / 256), 256>>>((const float4 *)st, (float4 *)st2, n4, 1.0f); },
                         10, 200);
            printf("decode floor: one pool read, another written %8.1f us  (%.0f GB/s)\n", ms * 1e3,
                   2.0 * nst * sizeof(float) / (ms * 1e6));
            printf("RESULT decode.floor_copy.us %.2f\n", ms * 1e3);
            ms = time_ms([&] { CU(cudaMemcpyAsync(st2, st, nst * sizeof(float), cudaMemcpyDeviceToDevice, 0)); }, 10, 200);
            printf("decode floor: cudaMemcpyAsync of the pool %8.1f us  (%.0f GB/s)\n", ms * 1e3,
                   2.0 * nst * sizeof(float) / (ms * 1e6));
            printf("RESULT decode.floor_memcpy.us %.2f\n", ms * 1e3);
        }
        const char *split_env = getenv("KDA_DECODE_SPLIT");   // the caller's, for the rows after the sweep
        const std::string split_keep = split_env ? split_env : "";
        const char *kern[] = {"1", "2", "4"};   // KDA_DECODE_SPLIT: blocks per item
        for (int ki = 0; ki < 3; ki++)
            for (int gate = 0; gate < 2; gate++) {
                setenv("KDA_DECODE_SPLIT", kern[ki], 1);
                double ms = time_ms([&] {
                    CU(kda_decode(B, H, K, V, gate, -5.f, 1.f / sqrtf((float)K), q, k, v, f, bl, A, db, st, slots, o, 0));
                }, dwarm, dreps);
                double gbs = 2.0 * nst * sizeof(float) / (ms * 1e6);
                printf("decode 64x32 K=V=128 split %s %-9s %8.1f us  (%.0f GB/s state traffic)\n", kern[ki],
                       gate ? "unbounded" : "bounded", ms * 1e3, gbs);
                printf("RESULT decode.split%s.%s.us %.2f\n", kern[ki], gate ? "unbounded" : "bounded", ms * 1e3);
            }
        if (split_env) setenv("KDA_DECODE_SPLIT", split_keep.c_str(), 1);
        else unsetenv("KDA_DECODE_SPLIT");
        // out of place (kda_decode_to; two pools, alternating each step), the default split
        for (int gate = 0; gate < 2; gate++) {
            int par = 0;
            double ms = time_ms([&] {
                float *src = par ? st2 : st, *dst = par ? st : st2;
                par ^= 1;
                CU(kda_decode_to(B, H, K, V, gate, -5.f, 1.f / sqrtf((float)K), q, k, v, f, bl, A, db, src, slots, dst,
                                 slots, o, 0));
            }, dwarm, dreps);
            printf("decode 64x32 K=V=128 out of place (two pools) %-9s %8.1f us  (%.0f GB/s state traffic)\n",
                   gate ? "unbounded" : "bounded", ms * 1e3, 2.0 * nst * sizeof(float) / (ms * 1e6));
            printf("RESULT decode.pingpong.%s.us %.2f\n", gate ? "unbounded" : "bounded", ms * 1e3);
        }
        {   // steady state: 20 back-to-back steps between two events
            size_t n4 = nst / 4;
            double fl = time_ms_n([&] { scale_in_place<<<(unsigned)((n4 + 255) / 256), 256>>>((float4 *)st, n4, 1.0f); },
                                  10, 50, 20);
            double fc = time_ms_n([&] { scale_copy<<<(unsigned)((n4 + 255) / 256), 256>>>((const float4 *)st, (float4 *)st2, n4, 1.0f); },
                                  10, 50, 20);
            double di = time_ms_n([&] {
                CU(kda_decode(B, H, K, V, 0, -5.f, 1.f / sqrtf((float)K), q, k, v, f, bl, A, db, st, slots, o, 0));
            }, 10, 50, 20);
            int par = 0;
            double dp = time_ms_n([&] {
                float *src = par ? st2 : st, *dst = par ? st : st2;
                par ^= 1;
                CU(kda_decode_to(B, H, K, V, 0, -5.f, 1.f / sqrtf((float)K), q, k, v, f, bl, A, db, src, slots, dst,
                                 slots, o, 0));
            }, 10, 50, 20);
            printf("decode steady state (20 back-to-back steps per event pair): floor in place %.1f us, floor copy %.1f us, "
                   "decode in place %.1f us (%.0f GB/s), ping-pong %.1f us (%.0f GB/s)\n", fl * 1e3, fc * 1e3, di * 1e3,
                   2.0 * nst * sizeof(float) / (di * 1e6), dp * 1e3, 2.0 * nst * sizeof(float) / (dp * 1e6));
            printf("RESULT decode.steady.inplace.us %.2f\nRESULT decode.steady.pingpong.us %.2f\n", di * 1e3, dp * 1e3);
        }
        {   // short-conv decode of q, k, v (C = 3·32·128) for the same 64 sequences
            int C = 3 * H * K, W = 4;
            bf16 *x = dalloc<bf16>((size_t)B * C), *y = dalloc<bf16>((size_t)B * C), *cache = dalloc<bf16>((size_t)B * (W - 1) * C);
            float *w = dalloc<float>((size_t)C * W);
            fill_bf16<<<256, 256>>>(x, (size_t)B * C, 30, 1, 0);
            fill_bf16<<<256, 256>>>(cache, (size_t)B * (W - 1) * C, 31, 1, 0);
            fill_f32<<<64, 256>>>(w, (size_t)C * W, 32, 0.5f, 0);
            double ms = time_ms([&] { CU(kda_conv_decode(B, C, W, x, w, cache, slots, y, 0)); }, 10, 200);
            printf("conv decode 64 x %d W=4 %8.1f us\n", C, ms * 1e3);
            printf("RESULT decode.conv.us %.2f\n", ms * 1e3);
        }
    }
    return 0;
}
