// cuda_ops.cu — the CUDA backend's op table (ops.h): the memory ops and the fused KDA op
// (forward, backward, decode) are defined here; every other op is cuda_<op> from
// cuda_backend.h (one .cu file per op family).
//
// The KDA entries take the fp32 lm_kda_args of the op interface (device pointers: backend
// memory is device memory), convert activations to bf16, run the kernels of kda.cuh and
// convert back; states stay fp32. Gradients are accumulated (+=) as ops.h requires.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>
#define _Noreturn [[noreturn]]
extern "C" {
#include "ops.h"
}
#undef _Noreturn
#include "kda.cuh"
#include "cuda_backend.h"
#include <cuda_bf16.h>

#define CU(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) lm_die("cuda: %s failed: %s", #call, cudaGetErrorString(e_));      \
    } while (0)

// ---- memory ----
static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    CU(cudaMalloc(&p, bytes));
    CU(cudaMemset(p, 0, bytes));
    return p;
}
static void cu_free(void *p) {
    if (p) CU(cudaFree(p));
}
static void cu_to_device(void *dst, const void *src, size_t bytes) { CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)); }
static void cu_to_host(void *dst, const void *src, size_t bytes) { CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)); }
static void cu_copy(void *dst, const void *src, size_t bytes) { CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); }
static void cu_zero(void *p, size_t bytes) { CU(cudaMemset(p, 0, bytes)); }
static void cu_copy2d(real *dst, size_t dst_stride, const real *src, size_t src_stride, size_t rows, size_t cols) {
    if (rows == 0 || cols == 0) return;
    CU(cudaMemcpy2D(dst, dst_stride * sizeof(real), src, src_stride * sizeof(real), cols * sizeof(real), rows,
                    cudaMemcpyDeviceToDevice));
}

// ---- fp32 ↔ bf16 ----
__global__ void k_to_bf16(__nv_bfloat16 *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}
// y (+)= x
__global__ void k_from_bf16(float *y, const __nv_bfloat16 *x, size_t n, int accumulate) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = accumulate ? y[i] + __bfloat162float(x[i]) : __bfloat162float(x[i]);
}
__global__ void k_acc(float *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
static unsigned nblk(size_t n) { return (unsigned)((n + 255) / 256); }
static __nv_bfloat16 *to_bf16(const float *x, size_t n) {
    if (!x) return NULL;
    __nv_bfloat16 *y = (__nv_bfloat16 *)cu_alloc(n * sizeof(__nv_bfloat16));
    if (n) k_to_bf16<<<nblk(n), 256>>>(y, x, n);
    CU(cudaGetLastError());
    return y;
}
static void from_bf16(float *y, const __nv_bfloat16 *x, size_t n, int accumulate) {
    if (!y || !n) return;
    k_from_bf16<<<nblk(n), 256>>>(y, x, n, accumulate);
    CU(cudaGetLastError());
}
static void acc_f32(float *y, const float *x, size_t n) {
    if (!y || !n) return;
    k_acc<<<nblk(n), 256>>>(y, x, n);
    CU(cudaGetLastError());
}

// ---- KDA ----
typedef struct {
    kda_params p;
    __nv_bfloat16 *q, *k, *v, *f, *beta;
    size_t nqk, nv, nb;
} kda_call;

static void kda_call_init(kda_call *c, const lm_kda_args *a) {
    LM_CHECK(a->B >= 0 && a->T >= 0 && a->H > 0, "cuda kda: bad shape B=%d T=%d H=%d", a->B, a->T, a->H);
    LM_CHECK((a->K == 64 || a->K == 128) && (a->V == 64 || a->V == 128), "cuda kda: K=%d V=%d not in {64, 128}",
             a->K, a->V);
    LM_CHECK(a->gate_mode == LM_GATE_BOUNDED || a->gate_mode == LM_GATE_UNBOUNDED, "cuda kda: bad gate mode %d",
             a->gate_mode);
    LM_CHECK(a->gate_mode != LM_GATE_BOUNDED || (a->lb >= -5 && a->lb < 0), "cuda kda: lower bound %g outside [-5, 0)",
             (double)a->lb);
    memset(c, 0, sizeof *c);
    c->nqk = (size_t)a->B * a->T * a->H * a->K;
    c->nv = (size_t)a->B * a->T * a->H * a->V;
    c->nb = (size_t)a->B * a->T * a->H;
    c->q = to_bf16(a->q, c->nqk);
    c->k = to_bf16(a->k, c->nqk);
    c->v = to_bf16(a->v, c->nv);
    c->f = to_bf16(a->f, c->nqk);
    c->beta = to_bf16(a->beta_logit, c->nb);
    kda_params *p = &c->p;
    p->N = a->B;
    p->T = a->T;
    p->H = a->H;
    p->K = a->K;
    p->V = a->V;
    p->gate_mode = a->gate_mode;
    p->exact = a->form == LM_KDA_CHUNK_EXACT || a->form == LM_KDA_NAIVE;
    p->lb = (float)a->lb;
    p->scale = (float)a->scale;
    p->q = c->q; p->k = c->k; p->v = c->v; p->f = c->f; p->beta = c->beta;
    p->A_log = a->A_log;
    p->dt_bias = a->dt_bias;
    p->S0 = a->S0;
}
static void kda_call_free(kda_call *c) {
    cu_free(c->q); cu_free(c->k); cu_free(c->v); cu_free(c->f); cu_free(c->beta);
    cu_free(c->p.ws);
}

static void cu_kda_fwd(const lm_kda_args *a) {
    kda_call c;
    kda_call_init(&c, a);
    __nv_bfloat16 *o = (__nv_bfloat16 *)cu_alloc(c.nv * sizeof(__nv_bfloat16));
    c.p.o = o;
    c.p.S_out = a->S_out;
    c.p.ws = cu_alloc(kda_workspace_size(&c.p, 0));
    CU(kda_fwd(&c.p));
    from_bf16(a->o, o, c.nv, 0);
    CU(cudaDeviceSynchronize());
    cu_free(o);
    kda_call_free(&c);
}

static void cu_kda_bwd(const lm_kda_args *a) {
    kda_call c;
    kda_call_init(&c, a);
    kda_params *p = &c.p;
    int K = a->K, H = a->H;
    size_t ns = (size_t)a->B * H * K * a->V;
    __nv_bfloat16 *d_o = to_bf16(a->d_o, c.nv);
    __nv_bfloat16 *g = (__nv_bfloat16 *)cu_alloc((3 * c.nqk + c.nv + c.nb) * sizeof(__nv_bfloat16));
    float *pg = (float *)cu_alloc(((size_t)H + (size_t)H * K + ns) * sizeof(float));
    p->d_o = d_o;
    p->dS_out = a->dS_out;
    p->dq = g; p->dk = g + c.nqk; p->df = g + 2 * c.nqk; p->dv = g + 3 * c.nqk; p->dbeta = g + 3 * c.nqk + c.nv;
    p->dA_log = pg; p->ddt_bias = pg + H; p->dS0 = a->dS0 ? pg + H + (size_t)H * K : NULL;
    p->ws = cu_alloc(kda_workspace_size(p, 1));
    CU(kda_bwd(p));
    from_bf16(a->dq, p->dq, c.nqk, 1);
    from_bf16(a->dk, p->dk, c.nqk, 1);
    from_bf16(a->df, p->df, c.nqk, 1);
    from_bf16(a->dv, p->dv, c.nv, 1);
    from_bf16(a->dbeta_logit, p->dbeta, c.nb, 1);
    acc_f32(a->dA_log, p->dA_log, H);
    acc_f32(a->ddt_bias, p->ddt_bias, (size_t)H * K);
    if (a->dS0) acc_f32(a->dS0, p->dS0, ns);
    CU(cudaDeviceSynchronize());
    cu_free(d_o); cu_free(g); cu_free(pg);
    kda_call_free(&c);
}

static void cu_kda_decode(const lm_kda_args *a) {
    LM_CHECK(a->T == 1, "cuda kda_decode: T must be 1 (got %d)", a->T);
    LM_CHECK(a->state != NULL, "cuda kda_decode: no state pool");
    kda_call c;
    kda_call_init(&c, a);
    __nv_bfloat16 *o = (__nv_bfloat16 *)cu_alloc(c.nv * sizeof(__nv_bfloat16));
    CU(kda_decode(a->B, a->H, a->K, a->V, a->gate_mode, (float)a->lb, (float)a->scale, c.q, c.k, c.v, c.f, c.beta,
                  a->A_log, a->dt_bias, a->state, a->slots, o, 0));
    from_bf16(a->o, o, c.nv, 0);
    CU(cudaDeviceSynchronize());
    cu_free(o);
    kda_call_free(&c);
}

// designated initialisers in the field order of lm_ops (C++20 requires that order)
extern "C" const lm_ops lm_cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .copy = cu_copy,
    .zero = cu_zero,
    .copy2d = cu_copy2d,
    .add = cuda_add,
    .acc = cuda_acc,
    .scale = cuda_scale,
    .sumsq = cuda_sumsq,
    .all_finite = cuda_all_finite,
    .embed_fwd = cuda_embed_fwd,
    .embed_bwd = cuda_embed_bwd,
    .matmul_fwd = cuda_matmul_fwd,
    .matmul_bwd = cuda_matmul_bwd,
    .rmsnorm_fwd = cuda_rmsnorm_fwd,
    .rmsnorm_bwd = cuda_rmsnorm_bwd,
    .gated_rmsnorm_fwd = cuda_gated_rmsnorm_fwd,
    .gated_rmsnorm_bwd = cuda_gated_rmsnorm_bwd,
    .sigmoid_gate_fwd = cuda_sigmoid_gate_fwd,
    .sigmoid_gate_bwd = cuda_sigmoid_gate_bwd,
    .glu_fwd = cuda_glu_fwd,
    .glu_bwd = cuda_glu_bwd,
    .conv_silu_fwd = cuda_conv_silu_fwd,
    .conv_silu_bwd = cuda_conv_silu_bwd,
    .conv_cache_update = cuda_conv_cache_update,
    .kda_fwd = cu_kda_fwd,
    .kda_bwd = cu_kda_bwd,
    .kda_decode = cu_kda_decode,
    .mla_split_fwd = cuda_mla_split_fwd,
    .mla_split_bwd = cuda_mla_split_bwd,
    .attn_fwd = cuda_attn_fwd,
    .attn_bwd = cuda_attn_bwd,
    .attn_max_logit = cuda_attn_max_logit,
    .head_matmul = cuda_head_matmul,
    .mla_decode = cuda_mla_decode,
    .moe_route_fwd = cuda_moe_route_fwd,
    .moe_route_bwd = cuda_moe_route_bwd,
    .moe_plan = cuda_moe_plan,
    .moe_gather_fwd = cuda_moe_gather_fwd,
    .moe_gather_bwd = cuda_moe_gather_bwd,
    .grouped_matmul_fwd = cuda_grouped_matmul_fwd,
    .grouped_matmul_bwd = cuda_grouped_matmul_bwd,
    .moe_combine_fwd = cuda_moe_combine_fwd,
    .moe_combine_bwd = cuda_moe_combine_bwd,
    .qb_hist_accum = cuda_qb_hist_accum,
    .moe_aux_fwd = cuda_moe_aux_fwd,
    .moe_aux_bwd = cuda_moe_aux_bwd,
    .moe_zloss_fwd = cuda_moe_zloss_fwd,
    .moe_zloss_bwd = cuda_moe_zloss_bwd,
    .attnres_fwd = cuda_attnres_fwd,
    .attnres_bwd = cuda_attnres_bwd,
    .xent_fwd = cuda_xent_fwd,
    .xent_bwd = cuda_xent_bwd,
    .adamw = cuda_adamw,
    .muon = cuda_muon,
};
