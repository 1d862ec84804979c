// cuda_backend.h — the CUDA backend's ops (every op of ops.h except the memory ops
// alloc/free/to_device/to_host/copy/zero/copy2d and the KDA ops, which live in cuda_ops.cu and
// kda*.cu), one function per op named cuda_<op>, with the signatures of the cpu_<op>
// functions in src/cpu/cpu.h. All tensor pointers are DEVICE pointers; `real` is float.
// Every function runs on lm_cuda_stream() (see cuda_common.cuh); the ones that return a
// host value (sumsq, all_finite, moe_aux_fwd, moe_zloss_fwd) wait for their result.
//
// Includable from C and from CUDA C++ (C linkage either way).
#ifndef LM_CUDA_BACKEND_H
#define LM_CUDA_BACKEND_H

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif
#ifdef __cplusplus
#include <tgmath.h>   // before the extern "C" block: in C++ it pulls in <cmath>/<complex> templates
#ifndef _Noreturn     // core/common.h is C11; C++ spells it as an attribute
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#endif

#include "../ops.h"

// the stream every op runs on, and the cuBLAS handle bound to it (created on first use)
#ifdef __CUDACC__
cudaStream_t lm_cuda_stream(void);
#endif
// frees the backend's workspace, cuBLAS handle and bf16 weight copies (optional, e.g. at exit)
void lm_cuda_backend_shutdown(void);
// The backend keeps bf16 copies of weights for its tensor-core GEMMs (weight_cache.cu) and
// remakes them after their fp32 masters are written. The ops that write parameters report it:
// to_device, adamw, muon and scale the range they wrote (lm_cuda_weights_written); free drops
// the copies of the weights inside the block it frees (lm_cuda_weight_cache_drop), so that a
// later allocation at the same address starts without any. Code that changes weights in
// device memory any other way (a kernel of its own, ops->copy into a weight) must call
// lm_cuda_weights_written or lm_cuda_weights_changed (every copy stale) too.
void lm_cuda_weights_changed(void);
void lm_cuda_weights_written(const void *p, size_t bytes);
void lm_cuda_weight_cache_drop(const void *p, size_t bytes);
void lm_cuda_weight_cache_free(void);
// bf16 weight copies made (or remade) since the process started (tests: a copy that should
// have been kept was not)
unsigned long lm_cuda_weight_copies_made(void);
// host-side device queries for C callers (benchmarks, the CLI), so that no C file needs the
// CUDA headers: wait for the device; free bytes on the device; the device's name and memory
void lm_cuda_sync(void);
// cudaProfilerStart (on) / cudaProfilerStop: brackets a region for `ncu --profile-from-start off`
void lm_cuda_profiler(int on);
size_t lm_cuda_free_bytes(void);
const char *lm_cuda_device_name(double *total_bytes);   // the current device

// Precision of the dense and grouped GEMMs. fp32: SGEMM, matches the CPU reference to
// ~1e-6 (the tests' tight checks). tf32: TF32 tensor cores. bf16 (the default): operands
// rounded to bf16 (fp32 master weights stay fp32), fp32 accumulation and output.
// Read once from LM_CUDA_GEMM (fp32 | tf32 | bf16) unless set here first.
enum { LM_GEMM_FP32 = 0, LM_GEMM_TF32 = 1, LM_GEMM_BF16 = 2 };
int lm_cuda_gemm_mode(void);
void lm_cuda_set_gemm_mode(int mode);
// how many linears' residuals (lm_linears.res) cuBLASLt's epilogue has added so far (tests)
long lm_cuda_linears_res_fused(void);
const char *lm_cuda_gemm_name(int mode);
int lm_cuda_gemm_from_name(const char *s);   // -1 when unknown
// Kernel of the bf16 grouped expert GEMM: 0 auto (5 for the forward, 3 for the gradients),
// 1 wgmma on bf16 operands, 128 × 256 tiles, 2 wgmma 128 × 128 tiles, 3 wgmma 128 × 128
// tiles two CTAs per SM, 4 the mma.sync kernel on fp32 operands, 5 TMA + warp-specialized
// wgmma, 128 × 256 tiles (forward and input gradient; its weight gradient runs 3). Read once
// from LM_MOE_GEMM (auto | wg256 | wg128 | wg128x2 | mma | tma) unless set here first.
int lm_cuda_moe_gemm(void);
void lm_cuda_set_moe_gemm(int mode);
const char *lm_cuda_moe_gemm_name(int mode);
// Whether the TMA kernel's 128 × 256 tiles leave by bulk tensor stores (1) or from registers
// (0; the same values, bit for bit). Read once from LM_MOE_TMA_STORE (0 = off) unless set here first.
int lm_cuda_moe_tma_stores(void);
void lm_cuda_set_moe_tma_stores(int on);

void cuda_add(real *out, const real *a, const real *b, size_t n);
void cuda_acc(real *acc, const real *x, size_t n);
void cuda_scale(real *x, real s, size_t n);
double cuda_sumsq(const real *x, size_t n);
int cuda_all_finite(const real *x, size_t n);
void cuda_embed_fwd(real *out, const int *tokens, const real *table, int N, int C);
void cuda_embed_bwd(real *dtable, const int *tokens, const real *dout, int N, int C);
void cuda_matmul_fwd(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC);
void cuda_matmul_bwd(real *dinp, real *dW, real *dbias, const real *dout, const real *inp, const real *W, int N, int C, int OC);
void cuda_linears_fwd(const lm_linears *L, const real *inp, int N, int C);
void cuda_linears_bwd(const lm_linears *L, real *dinp, const real *inp, int N, int C);
size_t cuda_linears_lo_bytes(int N, int C);
void cuda_rmsnorm_fwd(real *out, real *rstd, const real *inp, const real *gain, int N, int C, real eps, void *lo);
void cuda_rmsnorm_bwd(real *dinp, real *dgain, const real *dout, const real *inp, const real *gain, const real *rstd, int N, int C, int assign);
void cuda_gated_rmsnorm_fwd(real *out, real *rstd, const real *x, const real *z, const real *w, int N, int H, int V, real eps, void *lo, const void *x_lo);
void cuda_gated_rmsnorm_bwd(real *dx, real *dz, real *dw, const real *dout, const real *x, const real *z, const real *w, const real *rstd, int N, int H, int V, int assign, void *dx_lo, void *dz_lo, const void *x_lo);
void cuda_sigmoid_gate_fwd(real *out, const real *x, const real *z, size_t n, void *lo);
void cuda_sigmoid_gate_bwd(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n, int assign);
void cuda_glu_fwd(real *h, const real *g, const real *u, size_t n, int act, void *lo);
void cuda_glu_bwd(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act);
void cuda_conv_silu_fwd(real *out, const real *inp, const real *w, const real *cache, int B, int T, int C, int W);
void cuda_conv_silu_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w, const real *cache, int B, int T, int C, int W, int assign);
void cuda_conv_step(real *const *out, const real *const *inp, const real *const *w, real *const *cache, const int *C,
                    int n, int B, int W);
void cuda_conv_cache_update(real *cache, const real *inp, int B, int T, int C, int W);
void cuda_mla_split_fwd(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv);
void cuda_mla_split_bwd(real *dkv, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De, int Dv,
                        int assign);
// the MLA core over an attention lo (ops.h attn_lo_bytes …; attn_flash.cu holds its layout)
size_t lm_cuda_attn_lo_bytes(int B, int T, int H, int Dqk, int Dv);
void lm_cuda_attn_lo_parts(void *lo, int B, int T, int H, int Dqk, int Dv, void **q, void **k, void **v);
void cuda_mla_split_fwd_lo(real *k, real *v, void *lo, const real *kv, const real *kpe, int B, int T, int H, int Dn,
                           int De, int Dv);
void cuda_mla_split_bwd_lo(void *dkv_lo, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De,
                           int Dv);
void cuda_attn_fwd_lo(real *o, real *lse, const real *q, void *lo, int B, int T, int H, int Dqk, int Dv, real scale);
void cuda_attn_bwd_lo(real *dq, real *dk, real *dv, const real *d_o, const void *lo, const real *o, const real *lse,
                      int B, int T, int H, int Dqk, int Dv, real scale, int assign);
int cuda_attn_flash_fwd_lo(real *o, real *lse, const real *q, void *lo, int B, int T, int H, int Dqk, int Dv,
                           real scale);
int cuda_attn_flash_bwd_lo(real *dq, real *dk, real *dv, const real *d_o, const void *lo, const real *o,
                           const real *lse, int B, int T, int H, int Dqk, int Dv, real scale, int assign);
void cuda_attn_max_logit(real *out_host, const real *q, const real *k, int B, int T, int H, int Dqk, real scale);
void cuda_attn_fwd(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int H, int Dqk, int Dv, real scale);
void cuda_attn_prefix_fwd(real *o, const real *q, const real *k, const real *v, int B, int T, int P, int H, int Dqk, int Dv, real scale);
void cuda_attn_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k, const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale, int assign);
// D [B,H,T] = rowsum(dO∘O) per head (o, d_o [B,T,H,Dv]): the softmax-backward term of both attention kernels
void cuda_attn_D(real *D, const real *d_o, const real *o, int B, int T, int H, int Dv);
// The flash attention's kernels for Dqk/Dv ∈ {192/128, 128/128, 64/64} (wgmma): LM_FA_TMA (the
// default; "tma" in LM_FA_WG) for attn_flash_ws.cu's forward, 128 or 64 for attn_flash_wg.cu's
// with key tiles of that many rows, or 0 for attn_flash.cu's mma.sync kernels (forward and
// backward; the others share attn_flash_wg.cu's backward). Read once from LM_FA_WG unless set
// here first.
#define LM_FA_TMA 1
int lm_cuda_fa_wg(void);
void lm_cuda_set_fa_wg(int mode);
// Benchmarks: the flash forward alone on bf16 q, k, v already on the device (PyTorch's SDPA is
// timed on bf16 tensors; attn_fwd above rounds fp32 inputs first). Returns 0, doing nothing,
// for dims the wgmma kernels do not take. lm_cuda_round_bf16 makes such inputs (n elements).
int lm_cuda_attn_flash_fwd_bf16(float *o, float *lse, const void *q, const void *k, const void *v, int B, int T, int P,
                                int H, int Dqk, int Dv, float scale);
void lm_cuda_round_bf16(void *dst, const float *src, size_t n);
// tensor-core attention (attn_flash.cu): returns 0, doing nothing, for head dims or pointer
// alignments it does not handle (the caller falls back to the fp32 kernels of mla.cu).
int cuda_attn_flash_fwd(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int P, int H, int Dqk, int Dv, real scale);
void lm_cuda_zero_attn_grads(float *dq, float *dk, float *dv, size_t nqk, size_t nv);
int cuda_attn_flash_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k, const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale, int assign);
void cuda_head_matmul(real *out, const real *inp, const real *W, int N, int H, int C, int OC, long w_head_stride, int transpose);
void cuda_cache_append(real *cache, const real *x, const int *lens, int B, int T, int W, int Tmax, int bf16);
void cuda_cache_rows(real *dst, const real *cache, int b, int rows, int W, int Tmax, int bf16);
void cuda_mla_decode(real *o_lat, const real *q_lat, const real *q_pe, const real *c_cache, const real *kpe_cache, const int *lens, int B, int H, int R, int De, int Tmax, real scale, int bf16);
void cuda_moe_route_fwd(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias, int N, int E, int k, real route_scale, int renorm);
void cuda_moe_route_bwd(real *dz, const real *dgate, const real *s, const int *idx, int N, int E, int k, real route_scale, int renorm);
void cuda_moe_plan(int *counts, int *offsets, int *row_token, int *slot_row, const int *idx, const real *s, int N, int E, int k, int capacity);
void cuda_moe_gather_fwd(real *xp, const real *x, const int *row_token, const int *offsets, int E, int C);
void cuda_moe_gather_bwd(real *dx, const real *dxp, const int *row_token, const int *offsets, int E, int C, int R);
void cuda_grouped_matmul_fwd(real *out, const real *inp, const real *W, const int *offsets, int E, int C, int OC, int R);
void cuda_grouped_matmul_bwd(real *dinp, real *dW, const real *dout, const real *inp, const real *W, const int *offsets, int E, int C, int OC, int R);
// 1 when the experts op keeps ea, eb, yp (and its gradients' deh, dxp) in bf16 for widths C, F
// under the current modes (moe_experts.cu): the bf16 values in the first half of each buffer
int lm_cuda_experts_keep_bf16(int C, int F);
// the MLA decode on tensor cores over a bf16 latent cache (mla.cu): on unless LM_MLA_DECODE=fp32
// (or the setter says 0); _takes (the ops' mla_cache_bf16): whether a cache of these dims is
// kept in bf16 and decoded there (H ≤ 8 and the (R, De) instances of mla.cu)
int lm_cuda_mla_decode_tc(void);
void lm_cuda_set_mla_decode_tc(int on);
int lm_cuda_mla_decode_tc_takes(int H, int R, int De);
void cuda_moe_experts_fwd(const lm_experts *ex, real *y, const real *x);
// the experts op's FFN alone (benchmarks): xp (bf16, as the op's gather leaves it) to yp —
// the three GEMMs and the GLU, no gather or combine
void lm_cuda_moe_experts_ffn(const lm_experts *ex);
void cuda_moe_experts_bwd(const lm_experts *ex, const lm_experts_grads *g, real *dx, const real *dy);
void cuda_grouped_matmul2_fwd(real *out1, real *out2, const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C, int OC, int R);
void cuda_grouped_matmul2_bwd(real *dinp, real *dW1, real *dW2, const real *dout1, const real *dout2, const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C, int OC, int R);
void cuda_moe_combine_fwd(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C);
// y (+)= Σ_slot gate · yp[slot_row] (assign: y written); cuda_moe_combine_fwd adds
void lm_cuda_moe_combine(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C,
                         int assign);
void cuda_moe_combine_bwd(real *dyp, real *dgate, const real *dy, const real *yp, const real *gate, const int *slot_row, int N, int k, int C);
void cuda_qb_hist_accum(int *hist, const real *s, const real *alpha, real lo, real width, int N, int E, int nbins);
void cuda_qb_hist_select(int *sel, const int *hist, int E, int nbins, int target);
double cuda_moe_aux_fwd(const real *s, const int *counts, int N, int E, int k, real coef);
void cuda_moe_aux_bwd(real *dz, const real *s, const int *counts, int N, int E, int k, real coef, real dloss);
double cuda_moe_zloss_fwd(const real *z, int N, int E, real coef);
void cuda_moe_zloss_bwd(real *dz, const real *z, int N, int E, real coef, real dloss);
void cuda_attnres_fwd(real *out, real *alpha, lm_sources src, const real *w, const real *gamma, int N, int C, real eps);
void cuda_attnres_bwd(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src, const real *alpha, const real *w, const real *gamma, int N, int C, real eps);
void cuda_attnres_norm_fwd(real *xn, real *rstd, void *lo, real *alpha, real *x, lm_sources src, const real *w, const real *gamma, const real *gain, int N, int C, real eps);
void cuda_attnres_norm_bwd(lm_source_grads dsrc, real *dw, real *dgamma, real *dgain, real *dx, const real *dxn, const real *x, lm_sources src, const real *alpha, const real *rstd, const real *w, const real *gamma, const real *gain, int N, int C, real eps);
void cuda_xent_fwd(real *losses, real *lse, const real *logits, const int *targets, int N, int V);
void cuda_xent_bwd(real *dlogits, const real *logits, const real *lse, const int *targets, real dloss, int N, int V);
void cuda_adamw(real *p, const real *g, real *m, real *v, const lm_adamw_span *spans, int nspans, real lr, real b1,
                real b2, real eps, real bc1, real bc2, real gscale);
void cuda_muon(real *p, const real *g, real *m, int count, int rows, int cols, real lr, real mu, real wd);
// cuda_graph.cu
void cuda_graph_begin(void);
void *cuda_graph_end(void);
void cuda_graph_run(void *graph);
void cuda_graph_free(void *graph);
unsigned long cuda_graph_epoch(void);

#ifdef __cplusplus
}
#endif
#endif
