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
#include "cuda_common.cuh"
#include <cuda_bf16.h>

// ---- memory ----
// The blocks alloc made, with their sizes: free drops the bf16 weight copies of what lived
// in the block it frees, and only those (a new weight may later take that address).
typedef struct {
    void *p;
    size_t bytes;
} cu_block;
static cu_block *g_blocks;
static int g_nblocks, g_capblocks;

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    LM_CHECK(!lm_cuda_recording(), "cuda alloc of %zu bytes while recording a graph", bytes);
    lm_cuda_mem_changed();
    cudaCheck(cudaMalloc(&p, bytes));
    cudaCheck(cudaMemsetAsync(p, 0, bytes, lm_cuda_stream()));
    if (g_nblocks == g_capblocks) {
        g_capblocks = g_capblocks ? 2 * g_capblocks : 64;
        g_blocks = (cu_block *)lm_realloc(g_blocks, (size_t)g_capblocks * sizeof(cu_block));
    }
    g_blocks[g_nblocks].p = p;
    g_blocks[g_nblocks++].bytes = bytes;
    return p;
}
static void cu_free(void *p) {
    if (!p) return;
    LM_CHECK(!lm_cuda_recording(), "cuda free while recording a graph");
    lm_cuda_mem_changed();
    size_t bytes = 0;
    for (int i = 0; i < g_nblocks; i++)
        if (g_blocks[i].p == p) {
            bytes = g_blocks[i].bytes;
            g_blocks[i] = g_blocks[--g_nblocks];
            break;
        }
    if (g_nblocks == 0) {   // every block freed: so is the table (no host memory left behind)
        free(g_blocks);
        g_blocks = NULL;
        g_capblocks = 0;
    }
    cudaCheck(cudaFree(p));
    // not a block of ours (nothing else should reach here): drop every copy to be safe
    if (bytes) lm_cuda_weight_cache_drop(p, bytes);
    else lm_cuda_weight_cache_free();
}
// Host memory is pageable: cudaMemcpyAsync stages it before returning, so the caller may
// reuse it at once. The copies are ordered with the ops on the op stream; to_host waits.
static void cu_to_device(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, lm_cuda_stream()));
    lm_cuda_weights_written(dst, bytes);   // weights arrive this way (init, checkpoints)
}
static void cu_to_host(void *dst, const void *src, size_t bytes) { lm_cuda_read(dst, src, bytes); }
static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lm_cuda_stream()));
}
static void cu_zero(void *p, size_t bytes) {
    if (bytes) cudaCheck(cudaMemsetAsync(p, 0, bytes, lm_cuda_stream()));
}
static void cu_copy2d(real *dst, size_t dst_stride, const real *src, size_t src_stride, size_t rows, size_t cols) {
    if (rows == 0 || cols == 0) return;
    static int max_pitch = 0;
    if (!max_pitch) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, dev));
    }
    const size_t dp = dst_stride * sizeof(real), sp = src_stride * sizeof(real), w = cols * sizeof(real);
    if (dp <= (size_t)max_pitch && sp <= (size_t)max_pitch) {
        cudaCheck(cudaMemcpy2DAsync(dst, dp, src, sp, w, rows, cudaMemcpyDeviceToDevice, lm_cuda_stream()));
        return;
    }
    // pitches past the device limit (a long cache: max_len·R·4 bytes can pass 2 GiB): a copy per row
    for (size_t r = 0; r < rows; r++)
        cudaCheck(cudaMemcpyAsync(dst + r * dst_stride, src + r * src_stride, w, cudaMemcpyDeviceToDevice,
                                  lm_cuda_stream()));
}

// ---- fp32 ↔ bf16 ----
// y (+)= x; four elements a thread (y 16- and x 8-byte aligned: one load and one store each), else one
__global__ void k_from_bf16(float *y, const __nv_bfloat16 *x, size_t n, int accumulate, int vec) {
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        const size_t i = 4 * t;
        if (i + 4 <= n) {
            float4 v = ld4_bf16(x + i);
            if (accumulate) {
                const float4 o = ld4(y + i);
                v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
            }
            *reinterpret_cast<float4 *>(y + i) = v;
        } else {
            for (size_t j = i; j < n; j++) y[j] = accumulate ? y[j] + __bfloat162float(x[j]) : __bfloat162float(x[j]);
        }
        return;
    }
    if (t < n) y[t] = accumulate ? y[t] + __bfloat162float(x[t]) : __bfloat162float(x[t]);
}
__global__ void k_acc(float *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
static unsigned nblk(size_t n) { return (unsigned)((n + 255) / 256); }
static void to_bf16(__nv_bfloat16 *y, const float *x, size_t n) {
    if (x) lm_cuda_to_bf16(y, x, n);
}
static void from_bf16(float *y, const __nv_bfloat16 *x, size_t n, int accumulate) {
    if (!y || !n) return;
    const int vec = (uintptr_t)y % 16 == 0 && (uintptr_t)x % 8 == 0;
    k_from_bf16<<<nblk(vec ? (n + 3) / 4 : n), 256, 0, lm_cuda_stream()>>>(y, x, n, accumulate, vec);
    cudaCheck(cudaGetLastError());
}
static void acc_f32(float *y, const float *x, size_t n) {
    if (!y || !n) return;
    k_acc<<<nblk(n), 256, 0, lm_cuda_stream()>>>(y, x, n);
    cudaCheck(cudaGetLastError());
}

// ---- KDA ----
// Every temporary of a KDA call (bf16 copies of the activations, bf16 outputs and
// gradients, the kernels' workspace) is carved from the backend's one workspace
// (lm_cuda_scratch): no cudaMalloc/cudaFree per call and no device synchronisation, so
// the call only queues work on the op stream like every other op.
typedef struct {
    char *base;
    size_t used;
} carver;
// bytes rounded up to 256; with base == NULL only counts
static void *carve(carver *c, size_t bytes) {
    void *p = c->base ? c->base + c->used : NULL;
    c->used += lm_align256(bytes ? bytes : 1);
    return p;
}

typedef struct {
    kda_params p;
    __nv_bfloat16 *q, *k, *v, *f, *beta;
    size_t nqk, nv, nb;
} kda_call;

// sizes and parameters; the activation pointers are set by kda_call_inputs
static void kda_call_init(kda_call *c, const lm_kda_args *a) {
    LM_CHECK(a->B >= 0 && a->T >= 0 && a->H > 0, "cuda kda: bad shape B=%d T=%d H=%d", a->B, a->T, a->H);
    LM_CHECK((a->K == 64 || a->K == 128) && (a->V == 64 || a->V == 128), "cuda kda: K=%d V=%d not in {64, 128}",
             a->K, a->V);
    LM_CHECK(a->gate_mode == LM_GATE_BOUNDED || a->gate_mode == LM_GATE_UNBOUNDED, "cuda kda: bad gate mode %d",
             a->gate_mode);
    LM_CHECK(a->gate_mode != LM_GATE_BOUNDED || (a->lb >= -5 && a->lb < 0), "cuda kda: lower bound %g outside [-5, 0)",
             (double)a->lb);
    LM_CHECK(a->conv_W >= 0 && a->conv_W <= 8, "cuda kda: conv width %d outside [1, 8] (0: no conv)", a->conv_W);
    for (int j = 0; j < 3 && a->conv_W; j++) {   // the conv's vectorised kernels, refused before any launch
        LM_CHECK(a->qkv_pre[j] && a->conv_w[j], "cuda kda: conv input %d without its tensors", j);
        LM_CHECK(lm_aligned16({a->qkv_pre[j], a->dqkv_pre[j]}), "cuda kda: conv input %d or its gradient not "
                 "16-byte aligned", j);
    }
    memset(c, 0, sizeof *c);
    c->nqk = (size_t)a->B * a->T * a->H * a->K;
    c->nv = (size_t)a->B * a->T * a->H * a->V;
    c->nb = (size_t)a->B * a->T * a->H;
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
    p->A_log = a->A_log;
    p->dt_bias = a->dt_bias;
    p->S0 = a->S0;
    p->stream = lm_cuda_stream();
}
// carve the bf16 input copies (and convert them once the carver has memory; with the op's
// conv, q, k, v come from it in bf16 directly)
static void kda_call_inputs(kda_call *c, carver *cv, const lm_kda_args *a, int convert) {
    c->q = (__nv_bfloat16 *)carve(cv, c->nqk * 2);
    c->k = (__nv_bfloat16 *)carve(cv, c->nqk * 2);
    c->v = (__nv_bfloat16 *)carve(cv, c->nv * 2);
    c->f = (__nv_bfloat16 *)carve(cv, c->nqk * 2);
    c->beta = (__nv_bfloat16 *)carve(cv, c->nb * 2);
    if (!cv->base) return;
    if (convert && a->conv_W) {
        const int B = a->B, T = a->T, HK = a->H * a->K, HV = a->H * a->V, W = a->conv_W;
        lm_cuda_conv_silu_fwd_bf16(c->q, a->qkv_pre[0], a->conv_w[0], B, T, HK, W);
        lm_cuda_conv_silu_fwd_bf16(c->k, a->qkv_pre[1], a->conv_w[1], B, T, HK, W);
        lm_cuda_conv_silu_fwd_bf16(c->v, a->qkv_pre[2], a->conv_w[2], B, T, HV, W);
    } else if (convert) {
        to_bf16(c->q, a->q, c->nqk);
        to_bf16(c->k, a->k, c->nqk);
        to_bf16(c->v, a->v, c->nv);
    }
    if (convert) {
        to_bf16(c->f, a->f, c->nqk);
        to_bf16(c->beta, a->beta_logit, c->nb);
    }
    kda_params *p = &c->p;
    p->q = c->q; p->k = c->k; p->v = c->v; p->f = c->f; p->beta = c->beta;
}

// lm_kda_args.saved holds the forward's bf16 input copies (so the backward of the same
// inputs reads them instead of rounding the fp32 inputs again: 4 of its ~11 passes over
// [B,T,H,K] activations), then the kernels' saved intermediates (kda_saved_size)
static size_t kda_saved_inputs_bytes(const kda_call *c) {
    carver cv = {NULL, 0};
    kda_call t = *c;
    kda_call_inputs(&t, &cv, NULL, 0);
    return cv.used;
}

// bytes of lm_kda_args.saved
static size_t cu_kda_saved_bytes(int B, int T, int H, int K, int V) {
    kda_call c;
    memset(&c, 0, sizeof c);
    kda_params *p = &c.p;
    p->N = B; p->T = T; p->H = H; p->K = K; p->V = V;
    c.nqk = (size_t)B * T * H * K;
    c.nv = (size_t)B * T * H * V;
    c.nb = (size_t)B * T * H;
    return kda_saved_inputs_bytes(&c) + kda_saved_size(p);
}

static void cu_kda_fwd(const lm_kda_args *a) {
    kda_call c;
    kda_call_init(&c, a);
    c.p.S_out = a->S_out;
    carver in = {NULL, 0};
    if (a->saved) {   // inputs and intermediates for the backward go to the caller's buffer
        in.base = (char *)a->saved;
        kda_call_inputs(&c, &in, a, 1);
        c.p.save = 1;
        c.p.ws_fwd = (char *)a->saved + in.used;
    }
    size_t wsb = kda_workspace_size(&c.p, 0);
    carver cv = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {   // pass 0 counts, pass 1 carves
        if (pass) cv = (carver){(char *)lm_cuda_scratch(cv.used), 0};
        if (!a->saved) kda_call_inputs(&c, &cv, a, 1);
        c.p.o = a->o_lo ? (__nv_bfloat16 *)a->o_lo : (__nv_bfloat16 *)carve(&cv, c.nv * 2);
        c.p.ws = carve(&cv, wsb);
    }
    LM_CHECK(lm_aligned16({a->o_lo}), "cuda kda_fwd: o in bf16 (o_lo) not 16-byte aligned");
    cudaCheck(kda_fwd(&c.p));
    if (!a->o_lo) from_bf16(a->o, c.p.o, c.nv, 0);   // (o_lo: the gated norm reads the bf16 o itself)
}

static void cu_kda_bwd(const lm_kda_args *a) {
    kda_call c;
    kda_call_init(&c, a);
    kda_params *p = &c.p;
    int K = a->K, H = a->H;
    size_t ns = (size_t)a->B * H * K * a->V;
    p->dS_out = a->dS_out;
    carver in = {NULL, 0};
    if (a->saved) {   // the forward of the same inputs left their bf16 copies and its intermediates there
        p->saved = 1;
        in.base = (char *)a->saved;
        kda_call_inputs(&c, &in, a, 0);
        p->ws_fwd = (char *)a->saved + in.used;
    }
    size_t wsb = kda_workspace_size(p, 1);
    carver cv = {NULL, 0};
    __nv_bfloat16 *d_o = NULL, *g = NULL;
    float *pg = NULL, *conv_part = NULL;
    const int HK = H * K, HV = H * a->V, W = a->conv_W;
    // the dw partials of the wider and of the narrower conv (narrower C: shorter runs, more of them)
    const size_t nk = W ? lm_cuda_conv_bwd_part_floats(a->B, a->T, HK, W) : 0;
    const size_t nvv = W ? lm_cuda_conv_bwd_part_floats(a->B, a->T, HV, W) : 0;
    const size_t nconv = nk > nvv ? nk : nvv;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) cv = (carver){(char *)lm_cuda_scratch(cv.used), 0};
        if (!a->saved) kda_call_inputs(&c, &cv, a, 1);
        d_o = (__nv_bfloat16 *)carve(&cv, c.nv * 2);
        g = (__nv_bfloat16 *)carve(&cv, (3 * c.nqk + c.nv + c.nb) * 2);
        pg = (float *)carve(&cv, ((size_t)H + (size_t)H * K + ns) * sizeof(float));
        if (W) conv_part = (float *)carve(&cv, nconv * sizeof(float));
        p->ws = carve(&cv, wsb);
    }
    if (a->d_o_lo) {   // the gated norm's backward wrote it in bf16 (its dx_lo)
        p->d_o = (__nv_bfloat16 *)a->d_o_lo;
    } else {
        to_bf16(d_o, a->d_o, c.nv);
        p->d_o = a->d_o ? d_o : NULL;
    }
    p->dq = g; p->dk = g + c.nqk; p->df = g + 2 * c.nqk; p->dv = g + 3 * c.nqk; p->dbeta = g + 3 * c.nqk + c.nv;
    LM_CHECK(!a->df_lo || a->grads_assign, "cuda kda_bwd: df in bf16 (df_lo) is written, not added into");
    if (a->df_lo) p->df = (__nv_bfloat16 *)a->df_lo;   // for the f projection's backward (lm_linears.dout_lo)
    LM_CHECK(lm_aligned16({a->df_lo}), "cuda kda_bwd: df in bf16 (df_lo) not 16-byte aligned");
    p->dA_log = pg; p->ddt_bias = pg + H; p->dS0 = a->dS0 ? pg + H + (size_t)H * K : NULL;
    cudaCheck(kda_bwd(p));
    const int add = !a->grads_assign;
    LM_CHECK(!a->dqkv_pre_lo || (W && a->grads_assign), "cuda kda_bwd: bf16 conv input gradients (dqkv_pre_lo) are "
             "the conv's, written");
    if (W) {   // the conv's backward reads the bf16 gradients of q, k, v (dq, dk, dv untouched)
        const __nv_bfloat16 *dg[3] = {p->dq, p->dk, p->dv};
        const int C[3] = {HK, HK, HV};
        __nv_bfloat16 *lo = (__nv_bfloat16 *)a->dqkv_pre_lo;   // the three column blocks, side by side
        for (int j = 0; j < 3; j++)
            if (a->dqkv_pre[j] || a->dconv_w[j] || lo)
                lm_cuda_conv_silu_bwd_bf16(a->dqkv_pre[j], lo ? lo + (size_t)j * HK : NULL,   // block j at j·HK
                                           a->dqkv_pre_ld, a->dconv_w[j], conv_part, dg[j], a->qkv_pre[j],
                                           a->conv_w[j], a->B, a->T, C[j], W, a->grads_assign);
    } else {
        from_bf16(a->dq, p->dq, c.nqk, add);
        from_bf16(a->dk, p->dk, c.nqk, add);
        from_bf16(a->dv, p->dv, c.nv, add);
    }
    if (!a->df_lo) from_bf16(a->df, p->df, c.nqk, add);
    from_bf16(a->dbeta_logit, p->dbeta, c.nb, add);
    acc_f32(a->dA_log, p->dA_log, H);
    acc_f32(a->ddt_bias, p->ddt_bias, (size_t)H * K);
    if (a->dS0) acc_f32(a->dS0, p->dS0, ns);
}

static void cu_kda_decode(const lm_kda_args *a) {
    LM_CHECK(a->T == 1, "cuda kda_decode: T must be 1 (got %d)", a->T);
    LM_CHECK(!a->conv_W, "cuda kda_decode: the conv is not part of the decode step");
    LM_CHECK(a->state != NULL, "cuda kda_decode: no state pool");
    kda_call c;
    kda_call_init(&c, a);   // (the argument checks)
    cudaCheck(kda_decode_f32(a->B, a->H, a->K, a->V, a->gate_mode, (float)a->lb, (float)a->scale, a->q, a->k, a->v, a->f,
                             a->beta_logit, a->A_log, a->dt_bias, a->state, a->slots, a->o, lm_cuda_stream()));
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
    .linears_fwd = cuda_linears_fwd,
    .linears_bwd = cuda_linears_bwd,
    .linears_lo_bytes = cuda_linears_lo_bytes,
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
    .conv_step = cuda_conv_step,
    .kda_fwd = cu_kda_fwd,
    .kda_bwd = cu_kda_bwd,
    .kda_decode = cu_kda_decode,
    .kda_saved_bytes = cu_kda_saved_bytes,
    .mla_split_fwd = cuda_mla_split_fwd,
    .mla_split_bwd = cuda_mla_split_bwd,
    .attn_fwd = cuda_attn_fwd,
    .attn_bwd = cuda_attn_bwd,
    .attn_lo_bytes = lm_cuda_attn_lo_bytes,
    .mla_split_fwd_lo = cuda_mla_split_fwd_lo,
    .attn_fwd_lo = cuda_attn_fwd_lo,
    .attn_bwd_lo = cuda_attn_bwd_lo,
    .mla_split_bwd_lo = cuda_mla_split_bwd_lo,
    .attn_prefix_fwd = cuda_attn_prefix_fwd,
    .attn_max_logit = cuda_attn_max_logit,
    .head_matmul = cuda_head_matmul,
    .mla_decode = cuda_mla_decode,
    .cache_append = cuda_cache_append,
    .cache_rows = cuda_cache_rows,
    .mla_cache_bf16 = lm_cuda_mla_decode_tc_takes,
    .moe_route_fwd = cuda_moe_route_fwd,
    .moe_route_bwd = cuda_moe_route_bwd,
    .moe_plan = cuda_moe_plan,
    .moe_gather_fwd = cuda_moe_gather_fwd,
    .moe_gather_bwd = cuda_moe_gather_bwd,
    .grouped_matmul_fwd = cuda_grouped_matmul_fwd,
    .grouped_matmul_bwd = cuda_grouped_matmul_bwd,
    .grouped_matmul2_fwd = cuda_grouped_matmul2_fwd,
    .grouped_matmul2_bwd = cuda_grouped_matmul2_bwd,
    .moe_combine_fwd = cuda_moe_combine_fwd,
    .moe_combine_bwd = cuda_moe_combine_bwd,
    .moe_experts_fwd = cuda_moe_experts_fwd,
    .moe_experts_bwd = cuda_moe_experts_bwd,
    .qb_hist_accum = cuda_qb_hist_accum,
    .qb_hist_select = cuda_qb_hist_select,
    .moe_aux_fwd = cuda_moe_aux_fwd,
    .moe_aux_bwd = cuda_moe_aux_bwd,
    .moe_zloss_fwd = cuda_moe_zloss_fwd,
    .moe_zloss_bwd = cuda_moe_zloss_bwd,
    .attnres_fwd = cuda_attnres_fwd,
    .attnres_bwd = cuda_attnres_bwd,
    .attnres_norm_fwd = cuda_attnres_norm_fwd,
    .attnres_norm_bwd = cuda_attnres_norm_bwd,
    .xent_fwd = cuda_xent_fwd,
    .xent_bwd = cuda_xent_bwd,
    .adamw = cuda_adamw,
    .muon = cuda_muon,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_run = cuda_graph_run,
    .graph_free = cuda_graph_free,
    .graph_epoch = cuda_graph_epoch,
    .profile_range = lm_cuda_profiler,
};
