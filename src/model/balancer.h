// balancer.h — per-MoE-layer load balancing: the selection bias the router reads,
// the statistics gathered over one optimizer step, and the end-of-step update.
//
// Life cycle of one training step (SPEC §1.3, reference/moe.md §4.7):
//   for every micro-batch:  route with b (moe_route_fwd reads bal.bias), plan, then
//                           lm_balancer_observe()   — statistics only, b unchanged
//   after the optimizer:    lm_balancer_update()    — new b for the NEXT step, metrics,
//                                                     accumulators reset
// so a batch is never routed with a bias computed from its own statistics.
// Evaluation and inference route with b and never call observe.
//
// The module is backend-agnostic: backend memory (the bias, the QB histogram) is only
// touched through an lm_ops table; small host copies of E values live here.
#ifndef LM_BALANCER_H
#define LM_BALANCER_H
#include "ops.h"

typedef enum { LM_BAL_QB, LM_BAL_SIGN, LM_BAL_QUARTILE, LM_BAL_AUX, LM_BAL_NONE } lm_balance_kind;

#define LM_QB_NBINS_DEFAULT 1024
#define LM_BAL_RATE_DEFAULT 1e-3   // u of the sign rule, step of the quartile rule
#define LM_BAL_STAGE 16            // micro-batches staged on the backend before a download

// Metrics of one MoE layer for one optimizer step (reference/moe.md §9). Loads count
// routing decisions (top-k assignments, before any capacity dropping), which is what
// the balancing acts on; dropped assignments are reported separately.
typedef struct {
    int E;
    int64_t tokens;             // tokens observed in the step (all micro-batches)
    int64_t assignments;        // Σ loads = tokens · k
    int64_t dropped;            // assignments dropped by a capacity limit
    const int64_t *loads;       // [E] per-expert assignments: the balancer's copy of the
                                // step's counts, valid until its next lm_balancer_update
    double maxvio;              // (max load − mean) / mean, 0 when nothing was observed
    double entropy;             // −Σ p log p / log E, p = load / Σ load (1 when E = 1)
    int dead;                   // experts with load 0 in the step
    double bias_min, bias_max, bias_std;   // of the bias USED in the step (before the update)
} lm_moe_metrics;

typedef struct {
    lm_balance_kind kind;
    int E, k, nbins;
    real rate;                  // sign: u; quartile: step; unused otherwise
    real *bias;                 // backend [E]: what moe_route_fwd reads
    int own_bias;               // 0 when attached to memory owned elsewhere (the model's buffer)
    real *bias_host;            // host [E]: always equal to `bias`
    int *hist;                  // backend [E, nbins] int32 QB margin counts (qb only, else NULL)
    int *sel, *sel_host;        // backend / host [E, 3]: qb_hist_select's answer (qb only)
    real lo, width;             // histogram range [lo, lo + nbins·width] = [min b − 1, max b + 1]
    int64_t tokens, dropped;    // accumulated over the step's micro-batches
    int64_t *load;              // host [E] accumulated assignments per expert
    int64_t *last_load;         // host [E] the finished step's loads (lm_moe_metrics.loads)
    // Per-micro-batch counts stay in backend memory until the step's update (one download
    // per step, not a device round trip per layer per micro-batch): slot u of `stage`
    // holds counts [E] and offsets[E] of the u-th observed micro-batch.
    int *stage;                 // backend [LM_BAL_STAGE, E+1] int32
    int *stage_host;            // host copy of it
    int nstage;                 // slots in use
    int stage_N[LM_BAL_STAGE];  // tokens of each staged micro-batch
    int stage_rows[LM_BAL_STAGE];   // 1: offsets[E] was staged (capacity plan), 0: dropless
} lm_balancer;

// E experts, top-k; nbins ≤ 0 means LM_QB_NBINS_DEFAULT, rate < 0 means
// LM_BAL_RATE_DEFAULT (rate 0 freezes sign/quartile). The bias starts at 0.
void lm_balancer_init(lm_balancer *b, const lm_ops *ops, lm_balance_kind kind, int E, int k,
                      int nbins, real rate);
void lm_balancer_free(lm_balancer *b, const lm_ops *ops);

// After the router forward (and the plan) of every TRAINING micro-batch of a step.
// s [N,E] and alpha [N] are the router outputs (backend memory; read only by qb, may be
// NULL for the other kinds); counts [E] and offsets [E+1] are moe_plan outputs (backend);
// offsets may be NULL when the plan is dropless. Dropped assignments of the micro-batch
// are N·k − offsets[E]. The bias is not changed. Call it once per micro-batch forward,
// not again for an activation-recompute replay (that would count the tokens twice).
void lm_balancer_observe(lm_balancer *b, const lm_ops *ops, const real *s, const real *alpha,
                         const int *counts, const int *offsets, int N);

// Once at the end of the optimizer step: fills *m (may be NULL) with the step's metrics,
// computes the new bias (used from the next step on), uploads it, and resets the
// accumulators. A step with no observed tokens leaves the bias as it is.
//   qb:       per expert j, b̂_j = lower (k/E)-quantile of the margins α_i − s_ij over the
//             step, read from the histogram (first bin reaching ceil(k·M/E), linear
//             interpolation inside it); b = b̂ − mean(b̂); range ← [min b − 1, max b + 1]
//   sign:     b_j += rate · sign(mean load − load_j)
//   quartile: b_j −= rate where load_j > q75, b_j += rate where load_j < q25
//             (percentiles of the E loads with linear interpolation)
//   aux, none: b unchanged (the aux loss is added by the model via moe_aux_fwd/bwd)
void lm_balancer_update(lm_balancer *b, const lm_ops *ops, lm_moe_metrics *m);

// lm_balancer_update on each of bs[0..n) (NULL entries are skipped; ms[i], if ms is not
// NULL, gets bs[i]'s metrics) with every balancer's staged counts and histogram fetched in
// one download: one wait for the backend per step instead of up to two per layer. x is
// the transfer memory, kept by the caller between steps (zero-initialised at first; freed
// by lm_bal_xfer_free).
typedef struct {
    void *dev, *host;
    size_t cap;
} lm_bal_xfer;
void lm_balancers_update(lm_balancer *const *bs, int n, const lm_ops *ops, lm_moe_metrics *ms, lm_bal_xfer *x);
void lm_bal_xfer_free(lm_bal_xfer *x, const lm_ops *ops);

// Makes the balancer read and update `bias` (backend [E], e.g. the model's
// e_score_correction_bias buffer, which checkpoints save) instead of its own copy, and
// takes its current values. Call lm_balancer_refresh after that memory is overwritten
// (a checkpoint load) so the host copy and the QB histogram range follow.
void lm_balancer_attach_bias(lm_balancer *b, const lm_ops *ops, real *bias);
void lm_balancer_refresh(lm_balancer *b, const lm_ops *ops);

// Drops the statistics gathered since the last update without changing the bias (a
// step skipped for non-finite values).
void lm_balancer_discard(lm_balancer *b, const lm_ops *ops);

// checkpoint save/restore of the bias, host arrays of E values. Setting also resets the
// QB histogram range from the new bias; call it between steps.
void lm_balancer_get_bias(const lm_balancer *b, real *host);
void lm_balancer_set_bias(lm_balancer *b, const lm_ops *ops, const real *host);

// "qb", "sign", "quartile", "aux", "none"; unknown names return LM_ERR with lm_last_error()
lm_status lm_balance_parse(const char *name, lm_balance_kind *kind);
const char *lm_balance_name(lm_balance_kind kind);

// The histogram quantile used by the qb update: the value where the cumulative count of
// one expert's row hist [nbins] first reaches `target` (≥ 1), interpolated linearly inside
// that bin: lo + (h + (target − before)/hist[h])·width. Within one bin width of the
// exact target-th smallest margin when no margin was clamped into an end bin.
double lm_qb_hist_quantile(const int *hist, int nbins, double lo, double width, int64_t target);
// the same value from the search's answer (ops.h qb_hist_select): bin h, the count before
// it and its count
double lm_qb_bin_quantile(int h, int64_t before, int count, int nbins, double lo, double width, int64_t target);

// Capacity per expert for a capacity factor relaxed linearly to "no drops":
//   −1 (dropless) if cf0 ≤ 0 or step ≥ relax_steps; otherwise
//   ceil(cf(t)·N·k/E), cf(t) = cf0 + (E/k − cf0)·step/relax_steps, capped at N
// (cf = E/k gives capacity N, which can never drop). N tokens per micro-batch.
int lm_moe_capacity(double cf0, int relax_steps, int step, int N, int E, int k);

#endif
