// bench_cpu.c — CPU figures: the three KDA core forms (naive recurrence, chunked with
// factored (tensor-core-style) diagonal blocks, chunked with exact per-position diagonal
// blocks), forward and backward; and one training step of the `tiny` preset.
// Prints medians of repeated runs; never asserts on time.
//
//   make bench-cpu     (builds build/f32/bench_cpu and runs it)
#include "core/rng.h"
#include "cpu/cpu.h"
#include "model/model.h"
#include "train/optimizer.h"
#include <stdio.h>

static real *randn(size_t n, lm_rng *r, double s) {
    real *x = lm_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(s * lm_rng_normal(r));
    return x;
}

static void bench_kda(int B, int T, int H, int K, int gate, int form, int chunk, int reps) {
    lm_rng r;
    lm_rng_seed(&r, 1);
    size_t nq = (size_t)B * T * H * K;
    lm_kda_args a = {.B = B, .T = T, .H = H, .K = K, .V = K, .gate_mode = gate, .lb = -5, .form = form,
                     .chunk = chunk, .scale = 1 / sqrt((real)K)};
    real *q = randn(nq, &r, 1), *k = randn(nq, &r, 1), *v = randn(nq, &r, 1), *f = randn(nq, &r, 1);
    real *bl = randn((size_t)B * T * H, &r, 1), *Al = lm_malloc(H * sizeof(real)), *db = randn((size_t)H * K, &r, 1);
    real *o = lm_malloc(nq * sizeof(real)), *d_o = randn(nq, &r, 1);
    real *dq = lm_malloc(nq * sizeof(real)), *dk = lm_malloc(nq * sizeof(real)), *dv = lm_malloc(nq * sizeof(real));
    real *df = lm_malloc(nq * sizeof(real)), *dbl = lm_malloc((size_t)B * T * H * sizeof(real));
    real *dA = lm_malloc(H * sizeof(real)), *ddb = lm_malloc((size_t)H * K * sizeof(real));
    a.q = q; a.k = k; a.v = v; a.f = f; a.beta_logit = bl; a.A_log = Al; a.dt_bias = db; a.o = o;
    double tf[64], tb[64];
    for (int i = 0; i < reps; i++) {
        double t0 = lm_time_sec();
        cpu_kda_fwd(&a);
        tf[i] = lm_time_sec() - t0;
        lm_kda_args g = a;
        g.d_o = d_o; g.dq = dq; g.dk = dk; g.dv = dv; g.df = df; g.dbeta_logit = dbl; g.dA_log = dA; g.ddt_bias = ddb;
        t0 = lm_time_sec();
        cpu_kda_bwd(&g);
        tb[i] = lm_time_sec() - t0;
    }
    static const char *forms[] = {"auto", "naive", "chunk-factored", "chunk-exact"};
    printf("| kda %-14s | %-9s | B%d T%d H%d K=V=%d chunk %d | %8.2f ms | %8.2f ms |\n", forms[form],
           gate == LM_GATE_BOUNDED ? "bounded" : "unbounded", B, T, H, K, chunk, 1e3 * lm_median(tf, reps),
           1e3 * lm_median(tb, reps));
    free(q); free(k); free(v); free(f); free(bl); free(Al); free(db); free(o); free(d_o);
    free(dq); free(dk); free(dv); free(df); free(dbl); free(dA); free(ddb);
}

static void bench_train_step(int reps) {
    lm_config c;
    lm_config_preset(&c, "tiny");
    lm_config_finalize(&c);
    lm_model *m = lm_model_create(&c, &lm_cpu_ops, 1);
    lm_optim_config oc;
    lm_optim_default(&oc);
    lm_optim o;
    lm_optim_init(&o, m, &oc);
    const int B = 16, T = 256;
    int *tok = lm_malloc((size_t)B * T * sizeof(int)), *tgt = lm_malloc((size_t)B * T * sizeof(int));
    lm_rng r;
    lm_rng_seed(&r, 2);
    for (int i = 0; i < B * T; i++) { tok[i] = (int)lm_rng_below(&r, 256); tgt[i] = (int)lm_rng_below(&r, 256); }
    double tf[64], tb[64], to[64];
    lm_fwd_opts fo = {.training = 1, .capacity = -1, .aux_weight = 1};
    for (int i = 0; i < reps; i++) {
        lm_model_zero_grads(m);
        double t0 = lm_time_sec();
        lm_model_forward(m, tok, tgt, B, T, fo);
        double t1 = lm_time_sec();
        lm_model_backward(m, (real)(1.0 / m->last_count));
        double t2 = lm_time_sec();
        lm_optim_step(&o, m, 1e-3);
        for (int l = 0; l < c.n_layers; l++)
            if (lm_layer_is_moe(&c, l)) lm_balancer_update(&m->bal[l], m->ops, NULL);
        tf[i] = t1 - t0;
        tb[i] = t2 - t1;
        to[i] = lm_time_sec() - t2;
    }
    double f = lm_median(tf, reps), b = lm_median(tb, reps), op = lm_median(to, reps);
    printf("| tiny train step, B%d T%d (%d tokens) | forward %.1f ms | backward %.1f ms | optimizer %.1f ms | %.0f tok/s |\n",
           B, T, B * T, 1e3 * f, 1e3 * b, 1e3 * op, B * T / (f + b + op));
    lm_optim_free(&o, m);
    lm_model_free(m);
    free(tok);
    free(tgt);
}

int main(void) {
    printf("CPU benchmarks, %d threads (medians)\n\n", lm_num_threads());
    printf("| op | gate | shape | forward | backward |\n|---|---|---|---|---|\n");
    const int shapes[2][4] = {{16, 256, 2, 64}, {1, 4096, 4, 128}};
    for (int s = 0; s < 2; s++) {
        int B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], K = shapes[s][3];
        bench_kda(B, T, H, K, LM_GATE_BOUNDED, LM_KDA_NAIVE, 64, 5);
        bench_kda(B, T, H, K, LM_GATE_BOUNDED, LM_KDA_CHUNK_FACTORED, 64, 5);
        bench_kda(B, T, H, K, LM_GATE_BOUNDED, LM_KDA_CHUNK_FACTORED, 16, 5);
        bench_kda(B, T, H, K, LM_GATE_UNBOUNDED, LM_KDA_CHUNK_EXACT, 64, 5);
        bench_kda(B, T, H, K, LM_GATE_UNBOUNDED, LM_KDA_CHUNK_EXACT, 16, 5);
    }
    printf("\n");
    bench_train_step(7);
    return 0;
}
