// cuda_table_tmp.cu — TEMPORARY lm_cuda_ops table, for testing this branch's ops on
// their own. At the merge these functions move into the real table of cuda_ops.cu
// (which owns the memory ops and the CUDA KDA kernels) and this file is deleted.
//
// TEMPORARY BRIDGE: kda_fwd / kda_bwd / kda_decode copy their tensors to the host, run
// the CPU reference (cpu_kda_*) and copy the results back. Correct but slow; it exists
// only so that whole-model tests run before the CUDA KDA kernels are merged.
#include "cuda_common.cuh"
extern "C" {
#include "../cpu/cpu.h"
}

static void *tmp_alloc(size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? bytes : 16;
    cudaCheck(cudaMalloc(&p, n));
    cudaCheck(cudaMemset(p, 0, n));   // alloc is zero-filled (ops.h)
    return p;
}
static void tmp_free(void *p) { if (p) cudaCheck(cudaFree(p)); }
static void tmp_to_device(void *dst, const void *src, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void tmp_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void tmp_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
static void tmp_zero(void *p, size_t bytes) {
    if (bytes) cudaCheck(cudaMemset(p, 0, bytes));
}

// ---- the KDA bridge (host round trip) ----
typedef struct { const void *dev; real *host; size_t n; } bridge_buf;
typedef struct { bridge_buf b[24]; int n; } bridge;

// host copy of a device tensor of n reals (NULL stays NULL); the same device pointer maps
// to the same host buffer, so aliases (S_out == S0) keep their meaning
static real *bridge_in(bridge *br, const real *dev, size_t n, int load) {
    if (!dev) return NULL;
    for (int i = 0; i < br->n; i++)
        if (br->b[i].dev == dev) return br->b[i].host;
    LM_ASSERT(br->n < 24);
    real *h = (real *)lm_malloc((n ? n : 1) * sizeof(real));
    if (load) tmp_to_host(h, dev, n * sizeof(real));
    br->b[br->n++] = (bridge_buf){dev, h, n};
    return h;
}
static void bridge_out(bridge *br, const real *dev) {
    if (!dev) return;
    for (int i = 0; i < br->n; i++)
        if (br->b[i].dev == dev) tmp_to_device((void *)dev, br->b[i].host, br->b[i].n * sizeof(real));
}
static void bridge_free(bridge *br) {
    for (int i = 0; i < br->n; i++) free(br->b[i].host);
    br->n = 0;
}

static lm_kda_args bridge_args(bridge *br, const lm_kda_args *a, int grads, size_t n_state_entries) {
    lm_kda_args h = *a;
    const size_t BT = (size_t)a->B * a->T, H = a->H, K = a->K, V = a->V;
    const size_t S = (size_t)a->B * H * K * V;
    h.q = bridge_in(br, a->q, BT * H * K, 1);
    h.k = bridge_in(br, a->k, BT * H * K, 1);
    h.v = bridge_in(br, a->v, BT * H * V, 1);
    h.f = bridge_in(br, a->f, BT * H * K, 1);
    h.beta_logit = bridge_in(br, a->beta_logit, BT * H, 1);
    h.A_log = bridge_in(br, a->A_log, H, 1);
    h.dt_bias = bridge_in(br, a->dt_bias, H * K, 1);
    h.S0 = bridge_in(br, a->S0, S, 1);
    h.o = bridge_in(br, a->o, BT * H * V, 1);
    h.S_out = bridge_in(br, a->S_out, S, 1);
    if (grads) {
        h.d_o = bridge_in(br, a->d_o, BT * H * V, 1);
        h.dS_out = bridge_in(br, a->dS_out, S, 1);
        h.dq = bridge_in(br, a->dq, BT * H * K, 1);   // loaded: backward accumulates
        h.dk = bridge_in(br, a->dk, BT * H * K, 1);
        h.dv = bridge_in(br, a->dv, BT * H * V, 1);
        h.df = bridge_in(br, a->df, BT * H * K, 1);
        h.dbeta_logit = bridge_in(br, a->dbeta_logit, BT * H, 1);
        h.dA_log = bridge_in(br, a->dA_log, H, 1);
        h.ddt_bias = bridge_in(br, a->ddt_bias, H * K, 1);
        h.dS0 = bridge_in(br, a->dS0, S, 1);
    }
    if (n_state_entries) h.state = bridge_in(br, a->state, n_state_entries * H * K * V, 1);
    return h;
}

static void bridge_kda_fwd(const lm_kda_args *a) {
    bridge br = {};
    lm_kda_args h = bridge_args(&br, a, 0, 0);
    cpu_kda_fwd(&h);
    bridge_out(&br, a->o);
    bridge_out(&br, a->S_out);
    bridge_free(&br);
}
static void bridge_kda_bwd(const lm_kda_args *a) {
    bridge br = {};
    lm_kda_args h = bridge_args(&br, a, 1, 0);
    cpu_kda_bwd(&h);
    const real *outs[] = {a->dq, a->dk, a->dv, a->df, a->dbeta_logit, a->dA_log, a->ddt_bias, a->dS0};
    for (int i = 0; i < 8; i++) bridge_out(&br, outs[i]);
    bridge_free(&br);
}
static void bridge_kda_decode(const lm_kda_args *a) {
    bridge br = {};
    int *slots = NULL;
    size_t n_entries = a->B;
    if (a->slots) {
        slots = (int *)lm_malloc((size_t)a->B * sizeof(int));
        tmp_to_host(slots, a->slots, (size_t)a->B * sizeof(int));
        for (int b = 0; b < a->B; b++) if ((size_t)slots[b] + 1 > n_entries) n_entries = (size_t)slots[b] + 1;
    }
    lm_kda_args h = bridge_args(&br, a, 0, n_entries);
    h.slots = slots;
    cpu_kda_decode(&h);
    bridge_out(&br, a->o);
    bridge_out(&br, a->state);
    bridge_free(&br);
    free(slots);
}

const lm_ops lm_cuda_ops = {
    .name = "cuda",
    .alloc = tmp_alloc,
    .free = tmp_free,
    .to_device = tmp_to_device,
    .to_host = tmp_to_host,
    .copy = tmp_copy,
    .zero = tmp_zero,
    .copy2d = cuda_copy2d,
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
    .kda_fwd = bridge_kda_fwd,         // TEMPORARY host bridge
    .kda_bwd = bridge_kda_bwd,         // TEMPORARY host bridge
    .kda_decode = bridge_kda_decode,   // TEMPORARY host bridge
    .mla_split_fwd = cuda_mla_split_fwd,
    .mla_split_bwd = cuda_mla_split_bwd,
    .attn_fwd = cuda_attn_fwd,
    .attn_bwd = cuda_attn_bwd,
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
