// kda.cuh — the kernel-level CUDA API of the fused KDA op (SPEC §1.1, docs/cuda_kda.md):
// bf16 activations, fp32 gate parameters, fp32 recurrent state, device pointers, a
// caller-owned workspace, variable-length batches through cu_seqlens. The lm_ops
// wrapper (cuda_ops.cu) and the benchmarks call these functions.
//
// Math (per sequence and head, state S [K,V] fp32):
//   q̂ = q/‖q‖, k̂ = k/‖k‖ (‖x‖ = sqrt(Σx² + 1e-6)), β = σ(beta_logit),
//   bounded gate   g = lb·σ(exp(A_log[h])·(f + dt_bias[h,:]))   (lb ∈ [−5, 0))
//   unbounded gate g = −exp(A_log[h])·softplus(f + dt_bias[h,:])
//   S ← Diag(e^g) S;  S ← S + β k̂ (v − Sᵀk̂)ᵀ;  o = scale·Sᵀq̂
//
// Layouts: q, k, f [Ttot,H,K]; v, o [Ttot,H,V]; beta [Ttot,H]; A_log [H]; dt_bias [H,K];
// states S0, S_out, dS_out, dS0 [N,H,K,V] (K-first, like the CPU backend). q, k, v, f, S0,
// dS_out, dq, dk and df 16-byte aligned (the kernels load or store them as vectors;
// cudaErrorMisalignedAddress).
// Fixed length: cu_seqlens = NULL, N sequences of T tokens (Ttot = N·T, row = n·T + t).
// Packed: cu_seqlens [N+1] int32 on the device (B = 1), T = total tokens.
#ifndef LM_CUDA_KDA_CUH
#define LM_CUDA_KDA_CUH
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int N, T;                       // sequences; tokens per sequence (fixed) or in total (packed)
    const int *cu_seqlens;          // [N+1] device int32, or NULL
    int H, K, V;                    // K, V ∈ {64, 128}
    int gate_mode;                  // 0 bounded (LM_GATE_BOUNDED), 1 unbounded
    int exact;                      // 1: per-position diagonal blocks even for the bounded gate
    float lb, scale;
    // inputs
    const __nv_bfloat16 *q, *k, *v, *f, *beta;
    const float *A_log, *dt_bias;
    const float *S0;                // NULL = zeros
    // forward outputs
    __nv_bfloat16 *o;               // may be NULL (state only)
    float *S_out;                   // NULL = not wanted; may equal S0
    // backward: upstream gradients (NULL = zero) and input gradients (overwritten;
    // NULL = not wanted, except that dq..dbeta, dA_log, ddt_bias are all written or none)
    const __nv_bfloat16 *d_o;
    const float *dS_out;
    __nv_bfloat16 *dq, *dk, *dv, *df, *dbeta;
    float *dA_log, *ddt_bias, *dS0;
    // workspace (device, ≥ kda_workspace_size bytes); the backward may reuse what a
    // forward with save = 1 left in the same workspace (saved = 1)
    void *ws;
    int save;                       // forward: also keep state checkpoints for the backward
    int saved;                      // backward: ws holds a save = 1 forward of the same inputs
    // optional separate home (kda_saved_size bytes) of what a save = 1 forward keeps for
    // the backward: the forward writes it there, a saved = 1 backward reads it from there,
    // and ws holds only the rest (kda_workspace_size then counts only the rest). Lets a
    // caller keep the forward's intermediates per layer while ws stays shared scratch.
    void *ws_fwd;
    int scan_warps;                 // warps per scan block (0 = automatic)
    cudaStream_t stream;
} kda_params;

size_t kda_workspace_size(const kda_params *p, int backward);
size_t kda_saved_size(const kda_params *p);   // bytes a save = 1 forward keeps (ws_fwd)
// all return cudaSuccess or the first error (launch or argument: cudaErrorInvalidValue)
cudaError_t kda_fwd(const kda_params *p);
cudaError_t kda_bwd(const kda_params *p);
// the two forward stages separately (benchmarks: intra-chunk vs inter-chunk time)
cudaError_t kda_fwd_prep(const kda_params *p);
cudaError_t kda_fwd_scan(const kda_params *p);

// One decode step for B sequences on a state pool [n_slots,H,K,V] fp32, updated in place:
// sequence b uses slot slots[b] (b when slots is NULL; slots distinct). q, k, f [B,H,K];
// v, o [B,H,V]; beta [B,H] (one token each).
cudaError_t kda_decode(int B, int H, int K, int V, int gate_mode, float lb, float scale,
                       const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                       const __nv_bfloat16 *f, const __nv_bfloat16 *beta, const float *A_log,
                       const float *dt_bias, float *state, const int *slots, __nv_bfloat16 *o,
                       cudaStream_t stream);
// The same step out of place: reads slot slots_in[b] of state_in, writes slot slots_out[b] of
// state_out (either slots array NULL: b). state_out may equal state_in with equal slots (the
// in-place kda_decode); otherwise the read and written states must not overlap.
cudaError_t kda_decode_to(int B, int H, int K, int V, int gate_mode, float lb, float scale,
                          const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                          const __nv_bfloat16 *f, const __nv_bfloat16 *beta, const float *A_log,
                          const float *dt_bias, const float *state_in, const int *slots_in, float *state_out,
                          const int *slots_out, __nv_bfloat16 *o, cudaStream_t stream);
// kda_decode on fp32 q, k, v, f, beta and o (the backend's op: its activations are fp32, and
// rounding them to bf16 first took five launches of their own per step)
cudaError_t kda_decode_f32(int B, int H, int K, int V, int gate_mode, float lb, float scale, const float *q,
                           const float *k, const float *v, const float *f, const float *beta, const float *A_log,
                           const float *dt_bias, float *state, const int *slots, float *o, cudaStream_t stream);
// Short-conv decode step (width W ≤ 8, no bias, SiLU) for B sequences of C channels:
// x [B,C] pre-conv input, w [C,W] fp32 (w[c][W-1] multiplies x), cache [n_slots,W-1,C]
// holding the W-1 previous inputs of slot slots[b] (b when NULL), rolled in place;
// y [B,C] = SiLU(Σ_j w[c][j]·[cache ++ x][j][c]).
cudaError_t kda_conv_decode(int B, int C, int W, const __nv_bfloat16 *x, const float *w,
                            __nv_bfloat16 *cache, const int *slots, __nv_bfloat16 *y, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
