// moe_experts.c — expert execution: the dispatch plan (which rows go to which expert,
// optionally capped), gather of token rows into expert order, grouped GEMM over the
// expert segments, and the gate-weighted combine back to token order.
//
// Row order is fixed by construction — experts in index order, tokens in increasing
// index inside an expert — so results never depend on thread timing.
#include "cpu.h"
#include "ops_experts.h"

typedef struct { real s; int tok; } plan_cand;

// highest score first, ties by lower token index (tokens are unique within an expert)
static int cand_by_score(const void *pa, const void *pb) {
    const plan_cand *a = pa, *b = pb;
    if (a->s != b->s) return a->s > b->s ? -1 : 1;
    return (a->tok > b->tok) - (a->tok < b->tok);
}
static int cand_by_token(const void *pa, const void *pb) {
    const plan_cand *a = pa, *b = pb;
    return (a->tok > b->tok) - (a->tok < b->tok);
}

// idx [N,k] chosen experts; s [N,E] raw router scores (used to pick survivors under a
// capacity); counts [E] (before dropping), offsets [E+1], row_token [N·k], slot_row [N·k].
// A counting sort over tokens in increasing order gives the dropless layout directly.
// With a capacity C ≥ 0 an expert over C keeps its C highest-score tokens (ties: lower
// token index), again listed by token; the surviving segments are packed, the unused
// tail of row_token is −1, and the slots of dropped assignments get slot_row = −1.
void cpu_moe_plan(int *counts, int *offsets, int *row_token, int *slot_row, const int *idx,
                  const real *s, int N, int E, int k, int capacity) {
    const size_t NK = (size_t)N * k;
    memset(counts, 0, (size_t)E * sizeof(int));
    for (size_t a = 0; a < NK; a++) {
        LM_CHECK(idx[a] >= 0 && idx[a] < E, "moe_plan: expert index %d out of range [0, %d)", idx[a], E);
        counts[idx[a]]++;
    }
    // dropless layout
    int *cursor = lm_malloc((size_t)E * sizeof(int));
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    for (int e = 0; e < E; e++) cursor[e] = offsets[e];
    for (size_t a = 0; a < NK; a++) row_token[cursor[idx[a]]++] = (int)(a / k);

    int over = 0;
    if (capacity >= 0)
        for (int e = 0; e < E; e++) over |= counts[e] > capacity;
    if (over) {
        // survivors of each expert into its own range of a scratch list, then packed
        plan_cand *cand = lm_malloc((NK ? NK : 1) * sizeof(plan_cand));
        #pragma omp parallel for schedule(static)
        for (int e = 0; e < E; e++) {
            plan_cand *c = cand + offsets[e];
            int n = counts[e];
            for (int t = 0; t < n; t++) {
                c[t].tok = row_token[offsets[e] + t];
                c[t].s = s[(size_t)c[t].tok * E + e];
            }
            if (n > capacity) {
                qsort(c, (size_t)n, sizeof *c, cand_by_score);
                qsort(c, (size_t)capacity, sizeof *c, cand_by_token);
            }
        }
        // new offsets are prefix sums of min(count, C); rewrite the packed rows
        for (int e = 0; e < E; e++) cursor[e] = offsets[e];   // old starts into cand
        for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + lm_min(counts[e], capacity);
        #pragma omp parallel for schedule(static)
        for (int e = 0; e < E; e++)
            for (int r = offsets[e]; r < offsets[e + 1]; r++) row_token[r] = cand[cursor[e] + (r - offsets[e])].tok;
        for (size_t r = (size_t)offsets[E]; r < NK; r++) row_token[r] = -1;
        free(cand);
    }
    free(cursor);

    // inverse map: each used row names the (token, slot) it serves
    for (size_t a = 0; a < NK; a++) slot_row[a] = -1;
    #pragma omp parallel for schedule(static)
    for (int e = 0; e < E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r++) {
            int i = row_token[r];
            for (int t = 0; t < k; t++)
                if (idx[(size_t)i * k + t] == e) slot_row[(size_t)i * k + t] = r;
        }
}

// xp [rows, C] = x [N, C] gathered by row_token; rows = offsets[E]
void cpu_moe_gather_fwd(real *xp, const real *x, const int *row_token, const int *offsets, int E, int C) {
    const int rows = offsets[E];
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        memcpy(xp + (size_t)r * C, x + (size_t)row_token[r] * C, (size_t)C * sizeof(real));
}

// dx [N, C] += scatter of dxp [rows, C]. A token owns up to k rows, so threads split
// the channels (not the rows) and every dx element sums its rows in row order.
#define GATHER_BWD_CB 32
void cpu_moe_gather_bwd(real *dx, const real *dxp, const int *row_token, const int *offsets, int E, int C, int R) {
    if (!dx) return;
    const int rows = offsets[E];
    LM_CHECK(rows <= R, "moe_gather_bwd: %d rows used, %d allocated", rows, R);
    const int nblk = lm_cdiv(C, GATHER_BWD_CB);
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < nblk; b++) {
        int c0 = b * GATHER_BWD_CB, c1 = lm_min(C, c0 + GATHER_BWD_CB);
        for (int r = 0; r < rows; r++) {
            real *d = dx + (size_t)row_token[r] * C;
            const real *g = dxp + (size_t)r * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

// out [R, OC] = per expert segment [offsets[e], offsets[e+1]) of inp [R, C] · W[e]ᵀ,
// W [E, OC, C]. One (multithreaded) BLAS call per non-empty expert, outside any
// OpenMP region. Rows at or past offsets[E] are not touched.
void cpu_grouped_matmul_fwd(real *out, const real *inp, const real *W, const int *offsets, int E, int C, int OC,
                            int R) {
    LM_CHECK(offsets[E] <= R, "grouped_matmul: %d rows used, %d allocated", offsets[E], R);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        cpu_matmul_fwd(out + (size_t)r0 * OC, inp + (size_t)r0 * C, W + (size_t)e * OC * C, NULL, n, C, OC);
    }
}

// dinp [R, C] += dout · W[e], dW [E, OC, C] += doutᵀ · inp, per expert segment
void cpu_grouped_matmul_bwd(real *dinp, real *dW, const real *dout, const real *inp, const real *W,
                            const int *offsets, int E, int C, int OC, int R) {
    LM_CHECK(offsets[E] <= R, "grouped_matmul: %d rows used, %d allocated", offsets[E], R);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        cpu_matmul_bwd(dinp ? dinp + (size_t)r0 * C : NULL, dW ? dW + (size_t)e * OC * C : NULL, NULL,
                       dout + (size_t)r0 * OC, inp + (size_t)r0 * C, W + (size_t)e * OC * C, n, C, OC);
    }
}

// two products of one input: out1 = inp · W1[e]ᵀ, out2 = inp · W2[e]ᵀ (a backend may share
// work between them; here they are simply the two single products)
void cpu_grouped_matmul2_fwd(real *out1, real *out2, const real *inp, const real *W1, const real *W2,
                             const int *offsets, int E, int C, int OC, int R) {
    cpu_grouped_matmul_fwd(out1, inp, W1, offsets, E, C, OC, R);
    cpu_grouped_matmul_fwd(out2, inp, W2, offsets, E, C, OC, R);
}
void cpu_grouped_matmul2_bwd(real *dinp, real *dW1, real *dW2, const real *dout1, const real *dout2,
                             const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C,
                             int OC, int R) {
    cpu_grouped_matmul_bwd(dinp, dW1, dout1, inp, W1, offsets, E, C, OC, R);
    cpu_grouped_matmul_bwd(dinp, dW2, dout2, inp, W2, offsets, E, C, OC, R);
}

// y [N, C] += Σ_slot gate[i, slot] · yp[slot_row[i, slot]]; gate, slot_row [N, k]
void cpu_moe_combine_fwd(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        real *yi = y + (size_t)i * C;
        for (int t = 0; t < k; t++) {
            int r = slot_row[(size_t)i * k + t];
            if (r < 0) continue;   // dropped by capacity: the token keeps only its residual
            real g = gate[(size_t)i * k + t];
            const real *yr = yp + (size_t)r * C;
            for (int c = 0; c < C; c++) yi[c] += g * yr[c];
        }
    }
}

// dyp [rows, C] += gate · dy (each row serves exactly one (token, slot), so per-token
// threads never share a row); dgate [N, k] += <dy[i], yp[row]>
void cpu_moe_combine_bwd(real *dyp, real *dgate, const real *dy, const real *yp, const real *gate,
                         const int *slot_row, int N, int k, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *dyi = dy + (size_t)i * C;
        for (int t = 0; t < k; t++) {
            int r = slot_row[(size_t)i * k + t];
            if (r < 0) continue;
            if (dyp) {
                real g = gate[(size_t)i * k + t];
                real *d = dyp + (size_t)r * C;
                for (int c = 0; c < C; c++) d[c] += g * dyi[c];
            }
            if (dgate) {
                const real *yr = yp + (size_t)r * C;
                real dot = 0;
                for (int c = 0; c < C; c++) dot += dyi[c] * yr[c];
                dgate[(size_t)i * k + t] += dot;
            }
        }
    }
}

// the routed experts as one op (ops.h lm_experts): this table's ops in turn, fp32 throughout
void cpu_moe_experts_fwd(const lm_experts *ex, real *y, const real *x) { lm_experts_fwd_by_ops(&lm_cpu_ops, ex, y, x); }
void cpu_moe_experts_bwd(const lm_experts *ex, const lm_experts_grads *g, real *dx, const real *dy) {
    lm_experts_bwd_by_ops(&lm_cpu_ops, ex, g, dx, dy);
}
