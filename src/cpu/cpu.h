// cpu.h — the CPU backend: one function per op of ops.h, named cpu_<op>.
// Implementations live one file per op family in this folder; cpu_ops.c builds the table.
#ifndef LM_CPU_H
#define LM_CPU_H
#include "../ops.h"

void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
void cpu_to_device(void *dst, const void *host_src, size_t bytes);
void cpu_to_host(void *host_dst, const void *src, size_t bytes);
void cpu_copy(void *dst, const void *src, size_t bytes);
void cpu_zero(void *p, size_t bytes);
void cpu_copy2d(real *dst, size_t dst_stride, const real *src, size_t src_stride, size_t rows, size_t cols);
void cpu_add(real *out, const real *a, const real *b, size_t n);
void cpu_acc(real *acc, const real *x, size_t n);
void cpu_scale(real *x, real s, size_t n);
double cpu_sumsq(const real *x, size_t n);
int cpu_all_finite(const real *x, size_t n);
void cpu_embed_fwd(real *out, const int *tokens, const real *table, int N, int C);
void cpu_embed_bwd(real *dtable, const int *tokens, const real *dout, int N, int C);
void cpu_matmul_fwd(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC);
void cpu_matmul_bwd(real *dinp, real *dW, real *dbias, const real *dout, const real *inp, const real *W, int N, int C, int OC);
void cpu_linears_fwd(const lm_linears *L, const real *inp, int N, int C);
void cpu_linears_bwd(const lm_linears *L, real *dinp, const real *inp, int N, int C);
void cpu_rmsnorm_fwd(real *out, real *rstd, const real *inp, const real *gain, int N, int C, real eps, void *lo);
void cpu_rmsnorm_bwd(real *dinp, real *dgain, const real *dout, const real *inp, const real *gain, const real *rstd, int N, int C, int assign);
void cpu_gated_rmsnorm_fwd(real *out, real *rstd, const real *x, const real *z, const real *w, int N, int H, int V, real eps, void *lo, const void *x_lo);
void cpu_gated_rmsnorm_bwd(real *dx, real *dz, real *dw, const real *dout, const real *x, const real *z, const real *w, const real *rstd, int N, int H, int V, int assign, void *dx_lo, void *dz_lo, const void *x_lo);
void cpu_sigmoid_gate_fwd(real *out, const real *x, const real *z, size_t n, void *lo);
void cpu_sigmoid_gate_bwd(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n, int assign);
void cpu_glu_fwd(real *h, const real *g, const real *u, size_t n, int act, void *lo);
void cpu_glu_bwd(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act);
void cpu_conv_silu_fwd(real *out, const real *inp, const real *w, const real *cache, int B, int T, int C, int W);
void cpu_conv_silu_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w, const real *cache, int B, int T, int C, int W, int assign);
void cpu_conv_step(real *const *out, const real *const *inp, const real *const *w, real *const *cache, const int *C,
                   int n, int B, int W);
void cpu_conv_cache_update(real *cache, const real *inp, int B, int T, int C, int W);
void cpu_kda_fwd(const lm_kda_args *a);
void cpu_kda_bwd(const lm_kda_args *a);
void cpu_kda_decode(const lm_kda_args *a);
size_t cpu_kda_saved_bytes(int B, int T, int H, int K, int V);
void cpu_mla_split_fwd(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv);
void cpu_mla_split_bwd(real *dkv, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De, int Dv,
                       int assign);
void cpu_attn_fwd(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int H, int Dqk, int Dv, real scale);
void cpu_attn_prefix_fwd(real *o, const real *q, const real *k, const real *v, int B, int T, int P, int H, int Dqk, int Dv, real scale);
void cpu_attn_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k, const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale, int assign);
void cpu_head_matmul(real *out, const real *inp, const real *W, int N, int H, int C, int OC, long w_head_stride, int transpose);
void cpu_cache_append(real *cache, const real *x, const int *lens, int B, int T, int W, int Tmax, int bf16);
void cpu_cache_rows(real *dst, const real *cache, int b, int rows, int W, int Tmax, int bf16);
void cpu_mla_decode(real *o_lat, const real *q_lat, const real *q_pe, const real *c_cache, const real *kpe_cache, const int *lens, int B, int H, int R, int De, int Tmax, real scale, int bf16);
void cpu_moe_route_fwd(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias, int N, int E, int k, real route_scale, int renorm);
void cpu_moe_route_bwd(real *dz, const real *dgate, const real *s, const int *idx, int N, int E, int k, real route_scale, int renorm);
void cpu_moe_plan(int *counts, int *offsets, int *row_token, int *slot_row, const int *idx, const real *s, int N, int E, int k, int capacity);
void cpu_moe_gather_fwd(real *xp, const real *x, const int *row_token, const int *offsets, int E, int C);
void cpu_moe_gather_bwd(real *dx, const real *dxp, const int *row_token, const int *offsets, int E, int C, int R);
void cpu_grouped_matmul_fwd(real *out, const real *inp, const real *W, const int *offsets, int E, int C, int OC, int R);
void cpu_grouped_matmul_bwd(real *dinp, real *dW, const real *dout, const real *inp, const real *W, const int *offsets, int E, int C, int OC, int R);
void cpu_grouped_matmul2_fwd(real *out1, real *out2, const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C, int OC, int R);
void cpu_grouped_matmul2_bwd(real *dinp, real *dW1, real *dW2, const real *dout1, const real *dout2, const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C, int OC, int R);
void cpu_moe_combine_fwd(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C);
void cpu_moe_combine_bwd(real *dyp, real *dgate, const real *dy, const real *yp, const real *gate, const int *slot_row, int N, int k, int C);
void cpu_moe_experts_fwd(const lm_experts *ex, real *y, const real *x);
void cpu_moe_experts_bwd(const lm_experts *ex, const lm_experts_grads *g, real *dx, const real *dy);
void cpu_qb_hist_accum(int *hist, const real *s, const real *alpha, real lo, real width, int N, int E, int nbins);
void cpu_qb_hist_select(int *sel, const int *hist, int E, int nbins, int target);
double cpu_moe_aux_fwd(const real *s, const int *counts, int N, int E, int k, real coef);
void cpu_moe_aux_bwd(real *dz, const real *s, const int *counts, int N, int E, int k, real coef, real dloss);
double cpu_moe_zloss_fwd(const real *z, int N, int E, real coef);
void cpu_moe_zloss_bwd(real *dz, const real *z, int N, int E, real coef, real dloss);
void cpu_attnres_fwd(real *out, real *alpha, lm_sources src, const real *w, const real *gamma, int N, int C, real eps);
void cpu_attnres_bwd(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src, const real *alpha, const real *w, const real *gamma, int N, int C, real eps);
void cpu_attnres_norm_fwd(real *xn, real *rstd, void *lo, real *alpha, real *x, lm_sources src, const real *w, const real *gamma, const real *gain, int N, int C, real eps);
void cpu_attnres_norm_bwd(lm_source_grads dsrc, real *dw, real *dgamma, real *dgain, real *dx, const real *dxn, const real *x, lm_sources src, const real *alpha, const real *rstd, const real *w, const real *gamma, const real *gain, int N, int C, real eps);
void cpu_xent_fwd(real *losses, real *lse, const real *logits, const int *targets, int N, int V);
void cpu_xent_bwd(real *dlogits, const real *logits, const real *lse, const int *targets, real dloss, int N, int V);
void cpu_adamw(real *p, const real *g, real *m, real *v, const lm_adamw_span *spans, int nspans, real lr, real b1,
               real b2, real eps, real bc1, real bc2, real gscale);
void cpu_muon(real *p, const real *g, real *m, int count, int rows, int cols, real lr, real mu, real wd);

void cpu_attn_max_logit(real *out_host, const real *q, const real *k, int B, int T, int H, int Dqk, real scale);

#endif
