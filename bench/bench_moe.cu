// bench_moe.cu — the MoE layer of src/model/ffn_layer.c on the CUDA backend at Kimi-Linear
// shapes: d 2304, expert FFN 1024 (SwiGLU: w1, w3 [E,1024,2304], w2 [E,2304,1024]), 256
// experts, top-8, 16384 tokens (131072 expert rows), dropless. The backend ops are called in
// the model's order (router GEMM, moe_route, moe_plan, moe_gather, grouped GEMM ×3, glu,
// moe_combine; then the backward counterparts), all tensors fp32, GEMMs in the default
// bf16 mode. Prints medians (CUDA events) of each piece, TFLOP/s of the expert GEMMs, the
// whole layer, a dense cuBLAS bf16 GEMM of the same FLOPs, the old fp32 grouped kernel,
// the bf16 weight copies (once per optimizer step), the mma.sync kernel on fp32 operands,
// and the expert GEMMs under a skewed routing. --small: the `small` preset's MoE instead
// (d 1024, expert FFN 256, 80 experts, top-4, 4096 tokens: ~205 rows per expert).
//
//   bench_moe [--tokens N] [--small] [--quick]   prints a table and "RESULT key value" lines
#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <cuda_bf16.h>
#include "cuda/cuda_common.cuh"
#include "cuda/moe_gemm.cuh"

__device__ inline float hnorm(uint64_t i, uint32_t seed) {   // pseudo-normal: sum of 4 hashed uniforms
    float s = 0.f;
    for (int r = 0; r < 4; r++) {
        uint64_t x = (i * 4 + r) * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
        x ^= x >> 31; x *= 0x7FB5D329728EA185ull; x ^= x >> 27; x *= 0x81DADEF4BC2DD44Dull; x ^= x >> 33;
        s += (float)(x >> 40) * (1.f / 16777216.f);
    }
    return (s - 2.f) * 1.7320508f;
}
// x [n] = sd · normal; plus ramp · (i % E) / E (the skewed-routing logits)
__global__ void fill_k(float *x, size_t n, uint32_t seed, float sd, float ramp, int E) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = sd * hnorm(i, seed) + (ramp != 0.f ? ramp * (float)(i % E) / E : 0.f);
}
__global__ void fill_bf16_k(__nv_bfloat16 *x, size_t n, uint32_t seed, float sd) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(sd * hnorm(i, seed));
}
static float *falloc(size_t n) {
    float *p;
    cudaCheck(cudaMalloc(&p, n * sizeof(float)));
    return p;
}
static int *ialloc(size_t n) {
    int *p;
    cudaCheck(cudaMalloc(&p, n * sizeof(int)));
    return p;
}
static float *frand(size_t n, uint32_t seed, float sd) {
    float *p = falloc(n);
    fill_k<<<4096, 256>>>(p, n, seed, sd, 0.f, 1);
    cudaLaunchCheck();
    return p;
}
static void zero(void *p, size_t bytes) { cudaCheck(cudaMemsetAsync(p, 0, bytes, lm_cuda_stream())); }

template <typename F> static double time_ms(F fn, int warm, int reps) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) fn();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> v;
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaEventRecord(a, lm_cuda_stream()));
        fn();
        cudaCheck(cudaEventRecord(b, lm_cuda_stream()));
        cudaCheck(cudaEventSynchronize(b));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms);
    }
    std::sort(v.begin(), v.end());
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    return v[v.size() / 2];
}
static void row(const char *what, double ms, double flop) {
    if (flop > 0)
        printf("  %-52s %9.3f ms  %7.1f TFLOP/s\n", what, ms, flop / ms * 1e-9);
    else
        printf("  %-52s %9.3f ms\n", what, ms);
}
static void result(const char *key, double v) { printf("RESULT %s %.4f\n", key, v); }

int main(int argc, char **argv) {
    // Kimi-Linear shapes by default; --small: the `small` preset's MoE (d 1024, expert ffn
    // 256, 80 experts, top-4, one 4096-token sequence: ~205 rows per expert)
    int N = 16384, quick = 0, d = 2304, F = 1024, E = 256, k = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) { N = 4096; d = 1024; F = 256; E = 80; k = 4; }
        else if (!strcmp(argv[i], "--quick")) quick = 1;   // one rep each (for compute-sanitizer)
        else { fprintf(stderr, "bench_moe: unknown argument '%s' (--tokens N, --small, --quick)\n", argv[i]); return 2; }
    }
    const int act = LM_ACT_SWIGLU, WARM = quick ? 0 : 2, REPS = quick ? 1 : 10;
    const size_t NK = (size_t)N * k;
    const double gemm1 = 2.0 * NK * d * F;   // one expert GEMM (all rows)
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("== MoE layer, %s: tokens %d, d %d, expert ffn %d, E %d, top-%d (%zu rows), fp32 tensors, GEMMs %s, "
           "grouped kernel %s\n",
           prop.name, N, d, F, E, k, NK, lm_cuda_gemm_name(lm_cuda_gemm_mode()),
           lm_cuda_moe_gemm_name(lm_cuda_moe_gemm()));

    // activations and parameters (std 0.02 weights, unit-variance input)
    float *x = frand((size_t)N * d, 1, 1.0f), *Wr = frand((size_t)E * d, 2, 0.02f), *bias = falloc(E);
    float *w1 = frand((size_t)E * F * d, 3, 0.02f), *w3 = frand((size_t)E * F * d, 4, 0.02f);
    float *w2 = frand((size_t)E * d * F, 5, 0.02f);
    zero(bias, E * sizeof(float));
    float *z = falloc((size_t)N * E), *gate = falloc(NK), *s = falloc((size_t)N * E), *alpha = falloc(N);
    int *idx = ialloc(NK), *counts = ialloc(E), *offsets = ialloc(E + 1), *row_token = ialloc(NK), *slot_row = ialloc(NK);
    float *xp = falloc(NK * d), *ea = falloc(NK * F), *eb = falloc(NK * F), *eh = falloc(NK * F), *yp = falloc(NK * d);
    float *y = falloc((size_t)N * d);
    // gradients
    float *dy = frand((size_t)N * d, 6, 1.0f), *dyp = falloc(NK * d), *dgate = falloc(NK);
    float *deh = falloc(NK * F), *dea = falloc(NK * F), *deb = falloc(NK * F), *dxp = falloc(NK * d);
    float *dxn = falloc((size_t)N * d), *dz = falloc((size_t)N * E), *dWr = falloc((size_t)E * d);
    float *gw1 = falloc((size_t)E * F * d), *gw3 = falloc((size_t)E * F * d), *gw2 = falloc((size_t)E * d * F);
    zero(gw1, (size_t)E * F * d * 4); zero(gw3, (size_t)E * F * d * 4); zero(gw2, (size_t)E * F * d * 4);
    zero(dWr, (size_t)E * d * 4);
    cudaCheck(cudaDeviceSynchronize());

    auto router = [&] {
        cuda_matmul_fwd(z, x, Wr, NULL, N, d, E);
        cuda_moe_route_fwd(idx, gate, s, alpha, z, bias, N, E, k, 1.0f, 1);
    };
    auto plan = [&] { cuda_moe_plan(counts, offsets, row_token, slot_row, idx, s, N, E, k, -1); };
    auto gather = [&] { cuda_moe_gather_fwd(xp, x, row_token, offsets, E, d); };
    auto gemm_fwd = [&] {
        cuda_grouped_matmul2_fwd(ea, eb, xp, w1, w3, offsets, E, d, F, (int)NK);   // gate, up: xp rounded once
        cuda_grouped_matmul_fwd(yp, eh, w2, offsets, E, F, d, (int)NK);
    };
    auto glu = [&] { cuda_glu_fwd(eh, ea, eb, NK * F, act, NULL); };
    auto combine = [&] {
        zero(y, (size_t)N * d * 4);
        cuda_moe_combine_fwd(y, yp, gate, slot_row, N, k, d);
    };
    auto fwd = [&] { router(); plan(); gather(); gemm_fwd(); glu(); combine(); };
    // backward pieces (gradient buffers the ops accumulate into are zeroed, as the model does)
    auto combine_b = [&] {
        zero(dyp, NK * d * 4); zero(dgate, NK * 4);
        cuda_moe_combine_bwd(dyp, dgate, dy, yp, gate, slot_row, N, k, d);
    };
    auto gemm_bwd = [&] {
        zero(deh, NK * F * 4);
        cuda_grouped_matmul_bwd(deh, gw2, dyp, eh, w2, offsets, E, F, d, (int)NK);
        zero(dea, NK * F * 4); zero(deb, NK * F * 4);
        cuda_glu_bwd(dea, deb, deh, ea, eb, NK * F, act);
        zero(dxp, NK * d * 4);
        cuda_grouped_matmul2_bwd(dxp, gw1, gw3, dea, deb, xp, w1, w3, offsets, E, d, F, (int)NK);
    };
    // the three grouped backward GEMMs alone (dinp + dW), without the GLU and memsets
    // (dinp, dW) of the three: both, or one of them (a NULL output is skipped)
    auto gemm_bwd_parts = [&](bool dinp, bool dw) {
        cuda_grouped_matmul_bwd(dinp ? deh : NULL, dw ? gw2 : NULL, dyp, eh, w2, offsets, E, F, d, (int)NK);
        cuda_grouped_matmul2_bwd(dinp ? dxp : NULL, dw ? gw1 : NULL, dw ? gw3 : NULL, dea, deb, xp, w1, w3, offsets, E,
                                 d, F, (int)NK);
    };
    auto gemm_bwd_only = [&] { gemm_bwd_parts(true, true); };
    auto gemm_bwd_dinp = [&] { gemm_bwd_parts(true, false); };
    auto gemm_bwd_dw = [&] { gemm_bwd_parts(false, true); };
    auto glu_b = [&] { cuda_glu_bwd(dea, deb, deh, ea, eb, NK * F, act); };
    auto gather_b = [&] {
        zero(dxn, (size_t)N * d * 4);
        cuda_moe_gather_bwd(dxn, dxp, row_token, offsets, E, d, (int)NK);
    };
    auto router_b = [&] {
        zero(dz, (size_t)N * E * 4);
        cuda_moe_route_bwd(dz, dgate, s, idx, N, E, k, 1.0f, 1);
        cuda_matmul_bwd(dxn, dWr, NULL, dz, x, Wr, N, d, E);
    };
    auto bwd = [&] { combine_b(); gemm_bwd(); gather_b(); router_b(); };

    fwd();
    bwd();
    cudaCheck(cudaDeviceSynchronize());
    {
        std::vector<int> off(E + 1);
        cudaCheck(cudaMemcpy(off.data(), offsets, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost));
        int mn = 1 << 30, mx = 0;
        for (int e = 0; e < E; e++) { mn = std::min(mn, off[e + 1] - off[e]); mx = std::max(mx, off[e + 1] - off[e]); }
        printf("  routing: %d rows, rows per expert min %d max %d (mean %.0f)\n", off[E], mn, mx, (double)off[E] / E);
    }
    printf("-- forward\n");
    double t_router = time_ms(router, WARM, REPS), t_plan = time_ms(plan, WARM, REPS);
    double t_gather = time_ms(gather, WARM, REPS), t_gf = time_ms(gemm_fwd, WARM, REPS);
    double t_glu = time_ms(glu, WARM, REPS), t_comb = time_ms(combine, WARM, REPS);
    double t_fwd = time_ms(fwd, WARM, REPS);
    row("router (router GEMM N x d x E + moe_route_fwd)", t_router, 0);
    row("plan (moe_plan, dropless)", t_plan, 0);
    row("gather (moe_gather_fwd)", t_gather, 0);
    row("expert GEMMs (grouped_matmul_fwd x3)", t_gf, 3 * gemm1);
    row("glu_fwd", t_glu, 0);
    row("combine (memset y + moe_combine_fwd)", t_comb, 0);
    row("layer forward total", t_fwd, 0);
    printf("-- backward\n");
    double t_cb = time_ms(combine_b, WARM, REPS), t_gb = time_ms(gemm_bwd_only, WARM, REPS);
    double t_gbi = time_ms(gemm_bwd_dinp, WARM, REPS), t_gbw = time_ms(gemm_bwd_dw, WARM, REPS);
    double t_glub = time_ms(glu_b, WARM, REPS), t_gab = time_ms(gather_b, WARM, REPS);
    double t_rb = time_ms(router_b, WARM, REPS), t_bwd = time_ms(bwd, WARM, REPS);
    row("combine_bwd (memsets + moe_combine_bwd)", t_cb, 0);
    row("expert GEMMs bwd (dinp + dW, x3)", t_gb, 6 * gemm1);
    row("  of which dinp only (x3)", t_gbi, 3 * gemm1);
    row("  of which dW only (x3)", t_gbw, 3 * gemm1);
    row("glu_bwd", t_glub, 0);
    row("gather_bwd (memset + moe_gather_bwd, host sync)", t_gab, 0);
    row("router bwd (moe_route_bwd + router GEMM bwd)", t_rb, 0);
    row("layer backward total (incl. memsets)", t_bwd, 0);
    result("router_ms", t_router); result("plan_ms", t_plan); result("gather_ms", t_gather);
    result("gemm_fwd_ms", t_gf); result("gemm_fwd_tflops", 3 * gemm1 / t_gf * 1e-9);
    result("combine_ms", t_comb); result("fwd_total_ms", t_fwd);
    result("gemm_bwd_ms", t_gb); result("gemm_bwd_tflops", 6 * gemm1 / t_gb * 1e-9);
    result("gemm_bwd_dinp_tflops", 3 * gemm1 / t_gbi * 1e-9); result("gemm_bwd_dw_tflops", 3 * gemm1 / t_gbw * 1e-9);
    result("combine_bwd_ms", t_cb); result("gather_bwd_ms", t_gab); result("router_bwd_ms", t_rb);
    result("bwd_total_ms", t_bwd);

    {   // the routed experts as one op (moe_experts_fwd/bwd, what the model calls): gather,
        // the GEMMs and the GLU with bf16 operands written by the kernels that make them,
        // combine; its own saved and work buffers (it leaves bf16 in xp, eh, dyp, dea, deb, and
        // on the TMA kernels in ea, eb, yp, deh, dxp)
        float *xp2 = falloc(NK * d), *ea2 = falloc(NK * F), *eb2 = falloc(NK * F), *eh2 = falloc(NK * F);
        float *yp2 = falloc(NK * d), *dyp2 = falloc(NK * d), *dxp2 = falloc(NK * d);
        float *dea2 = falloc(NK * F), *deb2 = falloc(NK * F), *deh2 = falloc(NK * F);
        lm_experts ex = {.N = N, .E = E, .k = k, .C = d, .F = F, .R = (int)NK, .act = act, .offsets = offsets,
                         .row_token = row_token, .slot_row = slot_row, .gate = gate, .W1 = w1, .W3 = w3, .W2 = w2,
                         .xp = xp2, .ea = ea2, .eb = eb2, .eh = eh2, .yp = yp2};
        lm_experts_grads eg = {.dgate = dgate, .dW1 = gw1, .dW3 = gw3, .dW2 = gw2, .dyp = dyp2, .deh = deh2,
                               .dea = dea2, .deb = deb2, .dxp = dxp2};
        auto work_zero = [&] {
            zero(dyp2, NK * d * 4); zero(dxp2, NK * d * 4);
            zero(dea2, NK * F * 4); zero(deb2, NK * F * 4); zero(deh2, NK * F * 4);
        };
        auto op_f = [&] { zero(y, (size_t)N * d * 4); cuda_moe_experts_fwd(&ex, y, x); };
        auto op_b = [&] { cuda_moe_experts_bwd(&ex, &eg, dxn, dy); };
        auto op_bz = [&] { work_zero(); zero(dxn, (size_t)N * d * 4); zero(dgate, NK * 4); op_b(); };
        auto layer_f = [&] { router(); plan(); op_f(); };
        auto layer_b = [&] { op_bz(); router_b(); };
        op_f(); op_bz();
        double tf = time_ms(op_f, WARM, REPS), tz = time_ms(work_zero, WARM, REPS);
        double tb = time_ms(op_bz, WARM, REPS), tlf = time_ms(layer_f, WARM, REPS), tlb = time_ms(layer_b, WARM, REPS);
        // the op's forward again: its first timing above has read 1.4x slower than this one and
        // than the kernel rows below in the same run (session 24, H200), the first thing timed
        // after the fp32 path's buffers
        tf = time_ms(op_f, WARM, REPS);
        printf("-- the experts op (moe_experts_fwd/bwd: bf16 operands made by their producers)\n");
        row("experts fwd (memset y, gather, 3 GEMMs, GLU, combine)", tf, 3 * gemm1);
        row("experts bwd (memsets, combine bwd, 6 GEMMs, GLU bwd, scatter)", tb, 6 * gemm1);
        row("  of which the work buffers' memsets", tz, 0);
        row("layer forward total (router, plan, experts op)", tlf, 0);
        row("layer backward total (experts op, router bwd)", tlb, 0);
        result("experts_fwd_ms", tf); result("experts_fwd_tflops", 3 * gemm1 / tf * 1e-9);
        result("experts_bwd_ms", tb); result("experts_bwd_tflops", 6 * gemm1 / tb * 1e-9);
        result("experts_layer_fwd_ms", tlf); result("experts_layer_bwd_ms", tlb);
        {   // the parts torch's rows time (bench_moe_torch.py): the FFN on the gathered bf16 rows
            // (W1, W3, GLU, W2), and its three GEMMs alone, bf16 in and out where the kernel
            // writes bf16 (the TMA kernel), each on bf16 weight copies made once
            const int kf = lm_moe_bf16_kernel(d, F, 1, LM_MOE_USE_FWD), lo = lm_moe_bf16_out_ok(kf);
            if (kf && NK > 16) {
                const double tffn = time_ms([&] { lm_cuda_moe_experts_ffn(&ex); }, WARM, REPS);
                int *tsF = ialloc(E + 1), *tsC = ialloc(E + 1);
                const size_t nw = (size_t)E * F * d;
                const __nv_bfloat16 *b1 = lm_cuda_weight_bf16(w1, nw), *b3 = lm_cuda_weight_bf16(w3, nw),
                                    *b2 = lm_cuda_weight_bf16(w2, nw);
                const __nv_bfloat16 *xpb = (const __nv_bfloat16 *)xp2, *ehb = (const __nv_bfloat16 *)eh2;
                auto gemms3 = [&] {
                    lm_moe_bf16_schedule(tsF, offsets, E, F, kf);
                    lm_moe_bf16_schedule(tsC, offsets, E, d, kf);
                    lm_moe_bf16_rows(kf, ea2, xpb, b1, offsets, tsF, E, (int)NK, F, d, 0, 0, lo);
                    lm_moe_bf16_rows(kf, eb2, xpb, b3, offsets, tsF, E, (int)NK, F, d, 0, 0, lo);
                    lm_moe_bf16_rows(kf, yp2, ehb, b2, offsets, tsC, E, (int)NK, d, F, 0, 0, lo);
                };
                const double t3 = time_ms(gemms3, WARM, REPS);
                row("  expert FFN alone on the gathered bf16 rows (3 GEMMs + GLU)", tffn, 3 * gemm1);
                row(lo ? "  its 3 GEMMs alone (bf16 in, bf16 out)" : "  its 3 GEMMs alone (bf16 in, fp32 out)", t3,
                    3 * gemm1);
                result("experts_ffn_tflops", 3 * gemm1 / tffn * 1e-9);
                result("experts_gemms3_tflops", 3 * gemm1 / t3 * 1e-9);
                // the backward's GEMMs alone, as the op runs them (torch's "dinp only" and "dW
                // only" rows): deh = dyp · W2 and dxp = dea · W1 + deb · W3 written (bf16 where
                // the kernel writes bf16), then dW2, dW1 and dW3 written in fp32
                const int ki = lm_moe_bf16_kernel(d, F, 1, LM_MOE_USE_DINP_ZEROED), kw = lm_moe_bf16_kernel(d, F, 1, LM_MOE_USE_DW);
                if (ki && kw) {
                    const int lob = lm_moe_bf16_out_ok(ki);
                    const __nv_bfloat16 *dypb = (const __nv_bfloat16 *)dyp2, *deab = (const __nv_bfloat16 *)dea2,
                                        *debb = (const __nv_bfloat16 *)deb2;
                    auto dinp3 = [&] {
                        lm_moe_bf16_schedule(tsF, offsets, E, F, ki);
                        lm_moe_bf16_schedule(tsC, offsets, E, d, ki);
                        lm_moe_bf16_rows(ki, deh2, dypb, b2, offsets, tsF, E, (int)NK, F, d, 1, 1, lob);
                        lm_moe_bf16_rows2(ki, dxp2, deab, b1, debb, b3, offsets, tsC, E, (int)NK, d, F, F, 1, lob);
                    };
                    auto dw3 = [&] {
                        lm_moe_bf16_dw(kw, gw2, dypb, NULL, NULL, ehb, offsets, E, (int)NK, d, F, 1);
                        lm_moe_bf16_dw(kw, gw1, deab, gw3, debb, xpb, offsets, E, (int)NK, F, d, 1);
                    };
                    const double ti3 = time_ms(dinp3, WARM, REPS), tw3 = time_ms(dw3, WARM, REPS);
                    row(lob ? "  its 3 input-gradient GEMMs alone (bf16 in, bf16 out)"
                            : "  its 3 input-gradient GEMMs alone (bf16 in, fp32 out)", ti3, 3 * gemm1);
                    row("  its 3 weight-gradient GEMMs alone (bf16 in, fp32 dW written)", tw3, 3 * gemm1);
                    result("experts_dinp3_tflops", 3 * gemm1 / ti3 * 1e-9);
                    result("experts_dw3_tflops", 3 * gemm1 / tw3 * 1e-9);
                }
                cudaCheck(cudaFree(tsF));
                cudaCheck(cudaFree(tsC));
                op_f();   // ea2, eb2, yp2 as the op leaves them for the backward below
            }
        }
        // its backward's parts: without the weight gradients (combine bwd, dinp products,
        // GLU bwd, scatter), and per kernel (auto, wg128x2, tma)
        lm_experts_grads eg0 = eg;
        eg0.dW1 = eg0.dW3 = eg0.dW2 = NULL;
        auto op_b0 = [&] { work_zero(); zero(dxn, (size_t)N * d * 4); zero(dgate, NK * 4); cuda_moe_experts_bwd(&ex, &eg0, dxn, dy); };
        const double tb0 = time_ms(op_b0, WARM, REPS);
        row("  experts bwd without weight gradients (3 dinp GEMMs)", tb0, 3 * gemm1);
        row("  so the 3 weight-gradient GEMMs take", tb - tb0, 3 * gemm1);
        result("experts_bwd_nodw_ms", tb0); result("experts_bwd_dw_tflops", 3 * gemm1 / (tb - tb0) * 1e-9);
        // the weight gradients written rather than added (dW_assign: training's first backward
        // after the model's zeroing, which then skips these gradients)
        lm_experts_grads ega = eg;
        ega.dW_assign = 1;
        auto op_ba = [&] { work_zero(); zero(dxn, (size_t)N * d * 4); zero(dgate, NK * 4); cuda_moe_experts_bwd(&ex, &ega, dxn, dy); };
        const double tba = time_ms(op_ba, WARM, REPS);
        row("experts bwd, weight gradients written (dW_assign)", tba, 6 * gemm1);
        row("  so the 3 weight-gradient GEMMs take", tba - tb0, 3 * gemm1);
        result("experts_bwd_assign_ms", tba); result("experts_bwd_assign_tflops", 6 * gemm1 / tba * 1e-9);
        result("experts_bwd_assign_dw_tflops", 3 * gemm1 / (tba - tb0) * 1e-9);
        const int keep = lm_cuda_moe_gemm();
        for (int kern : {1, 3, 5}) {
            lm_cuda_set_moe_gemm(kern);
            op_f(); op_bz();
            const double f = time_ms(op_f, WARM, REPS), b = time_ms(op_bz, WARM, REPS), b0 = time_ms(op_b0, WARM, REPS);
            const double ba = time_ms(op_ba, WARM, REPS);
            printf("  experts op, kernel %-8s fwd %.3f ms (%.1f TFLOP/s)  bwd %.3f ms (%.1f), of which dW %.3f ms (%.1f); "
                   "dW written: bwd %.3f ms (%.1f), dW %.3f ms (%.1f)\n",
                   lm_cuda_moe_gemm_name(kern), f, 3 * gemm1 / f * 1e-9, b, 6 * gemm1 / b * 1e-9, b - b0,
                   3 * gemm1 / (b - b0) * 1e-9, ba, 6 * gemm1 / ba * 1e-9, ba - b0, 3 * gemm1 / (ba - b0) * 1e-9);
        }
        lm_cuda_set_moe_gemm(keep);
        for (float *q : {xp2, ea2, eb2, eh2, yp2, dyp2, dxp2, dea2, deb2, deh2}) cudaCheck(cudaFree(q));
    }

    printf("-- references\n");
    {   // dense cuBLAS bf16 GEMM of one expert GEMM's FLOPs: [NK, d] · [d, F], bf16 in, fp32 out
        __nv_bfloat16 *a, *b;
        cudaCheck(cudaMalloc(&a, NK * d * 2));
        cudaCheck(cudaMalloc(&b, (size_t)d * F * 2));
        fill_bf16_k<<<4096, 256>>>(a, NK * d, 7, 1.0f);
        fill_bf16_k<<<4096, 256>>>(b, (size_t)d * F, 8, 0.02f);
        cudaLaunchCheck();
        const float one = 1.0f, zr = 0.0f;
        auto dense = [&] {
            cublasCheck(cublasGemmEx(lm_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, F, (int)NK, d, &one, b, CUDA_R_16BF, d, a,
                                     CUDA_R_16BF, d, &zr, ea, CUDA_R_32F, F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        double t = time_ms(dense, WARM, REPS);
        char what[64];
        snprintf(what, sizeof what, "dense cuBLAS bf16 GEMM %zux%d -> %d (bf16 in)", NK, d, F);
        row(what, t, gemm1);
        result("dense_bf16_tflops", gemm1 / t * 1e-9);
        // the backend's dense linear layer on fp32 tensors (bf16 copies + cuBLAS), same FLOPs
        double t2 = time_ms([&] { cuda_matmul_fwd(ea, xp, w1, NULL, (int)NK, d, F); }, WARM, REPS);
        row("dense cuda_matmul_fwd (fp32 tensors, bf16 mode)", t2, gemm1);
        result("dense_matmul_fwd_tflops", gemm1 / t2 * 1e-9);
        cudaCheck(cudaFree(a));
        cudaCheck(cudaFree(b));
    }
    {   // the bf16 weight copies the wgmma kernels read: made once per optimizer step (the
        // timed loops above reuse them, as the micro-batches of one step do)
        auto convert = [&] {
            lm_cuda_weights_changed();
            const size_t nw = (size_t)E * F * d;
            lm_cuda_weight_bf16(w1, nw); lm_cuda_weight_bf16(w3, nw); lm_cuda_weight_bf16(w2, nw);
        };
        double t = time_ms(convert, WARM, REPS);
        row("bf16 weight copies, once per optimizer step (x3)", t, 0);
        result("weight_bf16_ms", t);
    }
    {   // the activations' bf16 rounding inside the wgmma path's calls: the forward rounds
        // xp twice and eh once (part of the forward figure above)
        __nv_bfloat16 *tmp;
        cudaCheck(cudaMalloc(&tmp, NK * d * 2));
        double t = time_ms([&] { lm_cuda_to_bf16(tmp, xp, NK * d); lm_cuda_to_bf16(tmp, eh, NK * F); }, WARM, REPS);
        row("  activation rounding inside the forward calls", t, 0);
        result("fwd_act_round_ms", t);
        cudaCheck(cudaFree(tmp));
    }
    {   // every kernel, each part alone
        const int keep = lm_cuda_moe_gemm();
        for (int kern = 1; kern <= 5; kern++) {
            lm_cuda_set_moe_gemm(kern);
            double tf = time_ms(gemm_fwd, WARM, REPS), ti = time_ms(gemm_bwd_dinp, WARM, REPS);
            double tw = time_ms(gemm_bwd_dw, WARM, REPS);
            printf("  kernel %-8s fwd %7.1f  dinp %7.1f  dW %7.1f TFLOP/s (x3 each: %.3f / %.3f / %.3f ms)\n",
                   lm_cuda_moe_gemm_name(kern), 3 * gemm1 / tf * 1e-9, 3 * gemm1 / ti * 1e-9, 3 * gemm1 / tw * 1e-9,
                   tf, ti, tw);
        }
        lm_cuda_set_moe_gemm(keep);
    }
    {   // the previous fp32 CUDA-core grouped kernel (LM_GEMM_FP32), one forward GEMM
        lm_cuda_set_gemm_mode(LM_GEMM_FP32);
        double t = time_ms([&] { cuda_grouped_matmul_fwd(ea, xp, w1, offsets, E, d, F, (int)NK); }, 1, 3);
        row("grouped_matmul_fwd w1, fp32 kernel (LM_GEMM_FP32)", t, gemm1);
        result("gemm_fwd_fp32_kernel_tflops", gemm1 / t * 1e-9);
        lm_cuda_set_gemm_mode(LM_GEMM_BF16);
    }
    {   // skewed routing: logits + 4·e/E (high experts favoured)
        fill_k<<<4096, 256>>>(z, (size_t)N * E, 9, 1.0f, 4.0f, E);
        cudaLaunchCheck();
        cuda_moe_route_fwd(idx, gate, s, alpha, z, bias, N, E, k, 1.0f, 1);
        plan();
        gather();
        std::vector<int> off(E + 1);
        cudaCheck(cudaMemcpy(off.data(), offsets, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost));
        int mn = 1 << 30, mx = 0;
        for (int e = 0; e < E; e++) { mn = std::min(mn, off[e + 1] - off[e]); mx = std::max(mx, off[e + 1] - off[e]); }
        printf("-- skewed routing (logits + 4 e/E): rows per expert min %d max %d\n", mn, mx);
        double tf = time_ms(gemm_fwd, WARM, REPS), tb = time_ms(gemm_bwd_only, WARM, REPS);
        row("expert GEMMs fwd (x3), skewed", tf, 3 * gemm1);
        row("expert GEMMs bwd (x3), skewed", tb, 6 * gemm1);
        result("skew_gemm_fwd_tflops", 3 * gemm1 / tf * 1e-9);
        result("skew_gemm_bwd_tflops", 6 * gemm1 / tb * 1e-9);
    }
    lm_cuda_backend_shutdown();
    return 0;
}
