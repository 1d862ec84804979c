// bench_generate.c — generation speed of the `small` preset on the CUDA backend: the
// hybrid model (KKKM: 12 KDA + 4 MLA layers) against an all-MLA variant of the same
// width (16 MLA layers; d_model, heads, experts unchanged), both randomly initialised.
//
//   prefill tokens/s: B×L tokens from an empty cache — one forward (the flash-attention
//     path) where its activations fit on the GPU, else chunks through the cache (KDA
//     states carried, MLA attention of each chunk over the up-projected cache);
//   decode tokens/s:  the cache filled synthetically to length L (random latents, KDA
//     states and conv caches: the cost of a step does not depend on the values), then
//     `steps` one-token steps per sequence, median step time → B / step time;
//   the MLA decode op alone on one layer's cache: GB/s of cache read.
//
// Usage: bench_generate [--steps N] [--max-ctx L] [--op-only] [--all-prefill]   (needs a CUDA GPU)
//   --op-only: only the MLA decode op on synthetic one-layer caches (no model)
//   --all-prefill: also the prefills with > 20 PFLOP of attention (all-MLA at 1M: minutes)
//   --prefill-only, --min-ctx L, --variant hybrid|all-mla: a subset (prefills of ≥ L tokens,
//     one model), e.g. the all-MLA 1M prefill alone
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include "model/cache.h"
#include "model/model.h"

#define GB 1e9
static const lm_ops *OPS = &lm_cuda_ops;

static void sync_dev(void) { lm_cuda_sync(); }
static size_t free_bytes(void) { return lm_cuda_free_bytes(); }

// the backend keeps this model's MLA latent cache in bf16 (ops mla_cache_bf16)
static int mla_bf16(const lm_config *c) {
    return c->mla_heads > 0 && OPS->mla_cache_bf16 && OPS->mla_cache_bf16(c->mla_heads, c->kv_lora_rank, c->qk_extra_dim);
}

// cache bytes of B sequences of max_len tokens: KDA states + conv caches, MLA latents
static void cache_bytes(const lm_config *c, long B, long L, double *kda, double *mla) {
    *kda = *mla = 0;
    const double latent = mla_bf16(c) ? 2.0 : (double)sizeof(real);
    for (int i = 0; i < c->n_layers; i++) {
        if (lm_layer_is_mla(c, i)) *mla += (double)B * L * (c->kv_lora_rank + c->qk_extra_dim) * latent;
        else {
            const double HK = (double)c->kda_heads * c->kda_head_dim;
            *kda += (double)B * (HK * c->kda_head_dim + 3.0 * (c->kda_conv - 1) * HK) * sizeof(real);
        }
    }
}

// Fills a device tensor of n reals by tiling a random block (values of a unit-RMS latent).
static void fill_dev(real *dst, size_t n, const real *block, size_t nblock) {
    for (size_t i = 0; i < n; i += nblock) OPS->copy(dst + i, block, (n - i < nblock ? n - i : nblock) * sizeof(real));
}

// Fills an MLA cache [B, L, W] (max_len L) in the backend's format: reals tiled from the
// block, or (bf16) rows appended through cache_append from a chunk of them
static void fill_cache(real *cache, int bf16, int B, int L, int W, const real *block, size_t nblock) {
    if (!bf16) {
        fill_dev(cache, (size_t)B * L * W, block, nblock);
        return;
    }
    const int T = L < 4096 ? L : 4096;
    real *x = OPS->alloc((size_t)B * T * W * sizeof(real));
    fill_dev(x, (size_t)B * T * W, block, nblock);
    int *hl = lm_malloc((size_t)B * sizeof(int)), *lens = OPS->alloc((size_t)B * sizeof(int));
    for (int t0 = 0; t0 < L; t0 += T) {
        const int n = L - t0 < T ? L - t0 : T;
        for (int b = 0; b < B; b++) hl[b] = t0 + n;
        OPS->to_device(lens, hl, (size_t)B * sizeof(int));
        OPS->cache_append(cache, x, lens, B, n, W, L, 1);
    }
    OPS->free(x);
    OPS->free(lens);
    free(hl);
}

static void random_tokens(int *tok, int n, int vocab, lm_rng *r) {
    for (int i = 0; i < n; i++) tok[i] = (int)lm_rng_below(r, (uint32_t)vocab);
}

typedef struct { double ms, tok_s, kda_gb, mla_gb, used_gb; int ok; } decode_res;

// ---------------------------------------------------------------------------

// device bytes of the chunked prefill's per-head keys and values of the whole cache (one MLA
// layer at a time: the fp32 up-projection of one sequence, k and v of all, their bf16 copies
// in the flash kernel's workspace), with the cache scratch's 25% headroom
static double prefix_bytes(const lm_config *c, long B, long L) {
    const double H = c->mla_heads, Dqk = lm_mla_qk_dim(c), Dv = c->v_head_dim, Dn = c->qk_nope_dim;
    return 1.25 * 4.0 * ((double)L * H * (Dn + Dv) + (double)B * L * H * (Dqk + Dv)) + 2.0 * B * L * H * (Dqk + Dv);
}

// Prefill of B × L tokens: one forward when its activations fit, else chunks of Tc tokens
// per sequence (the largest power of two that fits) through the cache — KDA layers carry
// their state, MLA layers attend over the up-projected cache (prefill_over_cache). One timed
// run after a warm-up run, or a single run when it would take minutes (L ≥ 1M).
static void bench_prefill(lm_model *m, int B, int L, lm_rng *r, int allow_slow) {
    const lm_config *c = &m->cfg;
    double kda, mla;
    cache_bytes(c, B, L, &kda, &mla);
    const double fr = (double)free_bytes();
    int Tc = L;
    double acts, need;
    for (;;) {   // the largest power-of-two chunk whose activations fit beside the cache
        acts = (double)lm_model_acts_bytes(m, B, Tc, 0);
        need = acts + kda + mla + (Tc < L ? prefix_bytes(c, B, L) : 0) + 6 * GB;   // + workspace
        if (need <= fr || Tc <= 256) break;
        Tc /= 2;
    }
    int n_mla = 0;
    for (int i = 0; i < c->n_layers; i++) n_mla += lm_layer_is_mla(c, i);
    // causal attention over L positions: ~L²/2 · H · (Dqk + Dv) · 2 FLOP per MLA layer
    const double attn_flop = (double)n_mla * B * L * (double)L * c->mla_heads * (lm_mla_qk_dim(c) + c->v_head_dim);
    if (need > fr || (attn_flop > 2e16 && !allow_slow)) {
        if (need > fr)
            printf("  prefill B=%-3d L=%-8d skipped: needs ~%.0f GB (activations %.0f GB for chunks of %d; cache %.1f GB), "
                   "%.0f GB free\n", B, L, need / GB, acts / GB, Tc, (kda + mla) / GB, fr / GB);
        else
            printf("  prefill B=%-3d L=%-8d skipped: %.1f PFLOP of attention (%d MLA layers; --all-prefill runs it)\n",
                   B, L, attn_flop / 1e15, n_mla);
        return;
    }
    lm_cache *kc = lm_cache_create(c, OPS, B, L);
    int *tok = lm_malloc((size_t)B * L * sizeof(int)), *ct = lm_malloc((size_t)B * Tc * sizeof(int));
    random_tokens(tok, B * L, c->vocab, r);
    lm_fwd_opts fo = {.training = 0, .capacity = -1, .cache = kc};
    double best = 1e30;
    const int reps = L >= 1048576 ? 1 : 2;   // the first of two allocates the activations, warms cuBLAS
    for (int rep = 0; rep < reps; rep++) {
        lm_cache_reset(kc);
        sync_dev();
        double t0 = lm_time_sec();
        for (int p0 = 0; p0 < L; p0 += Tc) {
            const int n = L - p0 < Tc ? L - p0 : Tc;
            for (int b = 0; b < B; b++) memcpy(ct + (size_t)b * n, tok + (size_t)b * L + p0, (size_t)n * sizeof(int));
            lm_model_forward(m, ct, NULL, B, n, fo);
        }
        sync_dev();
        double dt = lm_time_sec() - t0;
        if ((rep > 0 || reps == 1) && dt < best) best = dt;
    }
    const double used = (double)fr - (double)free_bytes();
    char how[48] = "";
    if (Tc < L) snprintf(how, sizeof how, ", %d chunks of %d", (L + Tc - 1) / Tc, Tc);
    printf("  prefill B=%-3d L=%-8d %10.1f ms  %10.0f tok/s   GPU memory used %.1f GB (activations %.1f GB, "
           "cache %.2f GB%s)%s\n", B, L, best * 1e3, (double)B * L / best, used / GB, acts / GB, (kda + mla) / GB, how,
           reps == 1 ? " [one run]" : "");
    fflush(stdout);
    lm_cache_free(kc);
    lm_model_reserve(m, 1, 1);   // give the activations back
    free(tok);
    free(ct);
}

// Times the MLA decode op alone over one layer's cache c [B,L,R], kpe [B,L,De] (bf16 values where bf16) whose
// device lens hold L: GB/s of cache read (every row of c and kpe read once per call).
static void time_decode_op(const lm_config *c, const real *cc, const real *kpe, int bf16, const int *lens, int B,
                           int L, const real *block, size_t nblock) {
    const int H = c->mla_heads, R = c->kv_lora_rank, De = c->qk_extra_dim;
    real *ql = OPS->alloc((size_t)B * H * R * sizeof(real)), *qp = OPS->alloc((size_t)B * H * (De ? De : 1) * sizeof(real));
    real *o = OPS->alloc((size_t)B * H * R * sizeof(real));
    fill_dev(ql, (size_t)B * H * R, block, nblock);
    if (De) fill_dev(qp, (size_t)B * H * De, block, nblock);
    const real scale = 1 / sqrtf((float)lm_mla_qk_dim(c));
    enum { REPS = 20 };
    double t[REPS];
    for (int k = 0; k < REPS + 2; k++) {
        sync_dev();
        double t0 = lm_time_sec();
        OPS->mla_decode(o, ql, qp, cc, kpe, lens, B, H, R, De, L, scale, bf16);
        sync_dev();
        if (k >= 2) t[k - 2] = lm_time_sec() - t0;
    }
    double tm = lm_median(t, REPS), bytes = (double)B * L * (R + De) * (bf16 ? 2 : sizeof(real));
    printf("          mla_decode op alone (one layer, B=%d, len %d): %.3f ms, %.0f GB/s of cache read\n", B, L,
           tm * 1e3, bytes / tm / GB);
    OPS->free(ql); OPS->free(qp); OPS->free(o);
}

// --op-only: the decode op on a synthetic one-layer cache, no model
static void bench_op_only(const lm_config *c, long max_ctx, const real *block, size_t nblock) {
    const int ctx[3] = {4096, 65536, 1048576}, bs[2] = {1, 64};
    const int R = c->kv_lora_rank, De = c->qk_extra_dim, bf = mla_bf16(c);
    const size_t es = bf ? 2 : sizeof(real);
    printf("   (the cache in %s)\n", bf ? "bf16, decoded on tensor cores" : "fp32");
    for (int li = 0; li < 3; li++)
        for (int bi = 0; bi < 2; bi++) {
            const int L = ctx[li], B = bs[bi];
            const double bytes = (double)B * L * (R + De) * es;
            if (L > max_ctx || bytes > 100 * GB) continue;
            real *cc = OPS->alloc((size_t)B * L * R * es), *kpe = OPS->alloc((size_t)B * L * De * es);
            fill_cache(cc, bf, B, L, R, block, nblock);
            if (De) fill_cache(kpe, bf, B, L, De, block, nblock);
            int *hl = lm_malloc((size_t)B * sizeof(int));
            for (int b = 0; b < B; b++) hl[b] = L;
            int *lens = OPS->alloc((size_t)B * sizeof(int));
            OPS->to_device(lens, hl, (size_t)B * sizeof(int));
            time_decode_op(c, cc, kpe, bf, lens, B, L, block, nblock);
            OPS->free(cc); OPS->free(kpe); OPS->free(lens);
            free(hl);
        }
}

static decode_res bench_decode(lm_model *m, int B, int L, int steps, const real *block, size_t nblock, lm_rng *r) {
    const lm_config *c = &m->cfg;
    decode_res res = {0};
    double kda, mla;
    cache_bytes(c, B, L, &kda, &mla);
    res.kda_gb = kda / GB;
    res.mla_gb = mla / GB;
    const double fr = (double)free_bytes();
    if (kda + mla > 120 * GB || kda + mla + 4 * GB > fr) {
        printf("  decode  B=%-3d L=%-8d skipped: cache %.0f GB (KDA %.2f + MLA %.1f) exceeds the ~120 GB budget\n",
               B, L, (kda + mla) / GB, kda / GB, mla / GB);
        return res;
    }
    lm_cache *kc = lm_cache_create(c, OPS, B, L);
    for (int i = 0; i < c->n_layers; i++) {
        if (lm_layer_is_mla(c, i)) {
            fill_cache(kc->mla_c[i], kc->mla_bf16, B, L, c->kv_lora_rank, block, nblock);
            if (c->qk_extra_dim) fill_cache(kc->mla_kpe[i], kc->mla_bf16, B, L, c->qk_extra_dim, block, nblock);
        } else {
            const size_t HK = (size_t)c->kda_heads * c->kda_head_dim;
            // states scaled down: a KDA state is a decayed sum of k vᵀ, not unit-RMS noise
            fill_dev(kc->kda_state[i], (size_t)B * HK * c->kda_head_dim, block, nblock);
            OPS->scale(kc->kda_state[i], 0.05f, (size_t)B * HK * c->kda_head_dim);
            if (c->kda_conv > 1)
                for (int j = 0; j < 3; j++) fill_dev(kc->conv[i][j], (size_t)B * (c->kda_conv - 1) * HK, block, nblock);
        }
    }
    const int warm = 2;
    kc->len = L - steps - warm;   // the last timed step attends over all L positions
    int *tok = lm_malloc((size_t)B * sizeof(int));
    lm_fwd_opts fo = {.training = 0, .capacity = -1, .cache = kc};
    double *ms = lm_malloc((size_t)steps * sizeof(double)), *enq = lm_malloc((size_t)steps * sizeof(double));
    // BENCH_GEN_PROFILE=B: at batch B, the last timed step alone between cudaProfilerStart/Stop
    // (for `ncu --profile-from-start off`: the kernels of one step)
    const int prof = getenv("BENCH_GEN_PROFILE") && atoi(getenv("BENCH_GEN_PROFILE")) == B;
    for (int s = 0; s < warm + steps; s++) {
        random_tokens(tok, B, c->vocab, r);
        sync_dev();
        if (prof && s == warm + steps - 1) lm_cuda_profiler(1);
        double t0 = lm_time_sec();
        lm_model_forward(m, tok, NULL, B, 1, fo);
        double t1 = lm_time_sec();
        sync_dev();
        if (prof && s == warm + steps - 1) lm_cuda_profiler(0);
        if (s >= warm) ms[s - warm] = (lm_time_sec() - t0) * 1e3, enq[s - warm] = (t1 - t0) * 1e3;
    }
    double ms_min = ms[0], ms_max = ms[0];
    for (int s = 1; s < steps; s++) ms_min = fmin(ms_min, ms[s]), ms_max = fmax(ms_max, ms[s]);
    res.ms = lm_median(ms, steps);
    res.tok_s = B / (res.ms * 1e-3);
    res.used_gb = (fr - (double)free_bytes()) / GB;
    res.ok = 1;
    // host: until lm_model_forward returns (the work queued, the host's own waits included);
    // the rest of the step is the device finishing what was queued
    printf("  decode  B=%-3d L=%-8d %8.3f ms/step (min %.3f, max %.3f; host %.3f)  %9.0f tok/s   cache %.2f GB "
           "(KDA state+conv %.3f, MLA latents %.2f), GPU memory used %.2f GB; %ld of %d steps replayed%s\n",
           B, L, res.ms, ms_min, ms_max, lm_median(enq, steps), res.tok_s, (kda + mla) / GB, kda / GB, mla / GB,
           res.used_gb, kc->graph_runs, warm + steps, kc->graph_off ? " (LINMOE_DECODE_GRAPH=0)" : "");
    free(enq);
    // the MLA decode op alone on the last MLA layer's cache (lens = L from the last step)
    for (int i = c->n_layers - 1; i >= 0; i--)
        if (lm_layer_is_mla(c, i)) {
            time_decode_op(c, kc->mla_c[i], kc->mla_kpe[i], kc->mla_bf16, kc->lens, B, L, block, nblock);
            break;
        }
    fflush(stdout);
    free(ms);
    free(tok);
    lm_cache_free(kc);
    return res;
}

int main(int argc, char **argv) {
    int steps = 20, op_only = 0, all_prefill = 0, prefill_only = 0, only_v = -1;
    long max_ctx = 1048576, min_ctx = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-ctx") == 0 && i + 1 < argc) max_ctx = atol(argv[++i]);
        else if (strcmp(argv[i], "--op-only") == 0) op_only = 1;
        else if (strcmp(argv[i], "--all-prefill") == 0) all_prefill = 1;
        else if (strcmp(argv[i], "--prefill-only") == 0) prefill_only = 1;
        else if (strcmp(argv[i], "--min-ctx") == 0 && i + 1 < argc) min_ctx = atol(argv[++i]);
        else if (strcmp(argv[i], "--variant") == 0 && i + 1 < argc && !strcmp(argv[i + 1], "hybrid")) only_v = 0, i++;
        else if (strcmp(argv[i], "--variant") == 0 && i + 1 < argc && !strcmp(argv[i + 1], "all-mla")) only_v = 1, i++;
        else {
            fprintf(stderr, "usage: bench_generate [--steps N] [--max-ctx L] [--min-ctx L] [--op-only] [--all-prefill] "
                            "[--prefill-only] [--variant hybrid|all-mla]\n");
            return 2;
        }
    }
    LM_CHECK(steps >= 1 && steps <= 1000, "--steps must be in [1, 1000]");
    double dev_bytes = 0;
    const char *dev_name = lm_cuda_device_name(&dev_bytes);
    printf("== bench_generate: %s, %.0f GB, GEMMs %s; decode caches filled synthetically (random latents, states "
           "and conv caches: a step's cost does not depend on the values)\n",
           dev_name, dev_bytes / GB, lm_cuda_gemm_name(lm_cuda_gemm_mode()));
    lm_config cfg[2];
    const char *label[2] = {"hybrid (KKKM)", "all-MLA"};
    for (int v = 0; v < 2; v++) {
        LM_CHECK(lm_config_preset(&cfg[v], "small") == LM_OK, "%s", lm_last_error());
        if (v == 1) {   // every layer MLA, every width unchanged
            memset(cfg[v].layer_types, 'M', (size_t)cfg[v].n_layers);
            cfg[v].layer_types[cfg[v].n_layers] = 0;
            snprintf(cfg[v].name, sizeof cfg[v].name, "small-all-mla");
        }
        LM_CHECK(lm_config_finalize(&cfg[v]) == LM_OK, "%s", lm_last_error());
        lm_config_print(&cfg[v], stdout);
    }
    // a random block tiled over the caches
    const size_t nblock = (size_t)1 << 22;
    lm_rng r;
    lm_rng_seed(&r, 7);
    real *hblock = lm_malloc(nblock * sizeof(real));
    for (size_t i = 0; i < nblock; i++) hblock[i] = (real)lm_rng_normal(&r);
    real *block = OPS->alloc(nblock * sizeof(real));
    OPS->to_device(block, hblock, nblock * sizeof(real));
    free(hblock);
    if (op_only) {
        printf("== MLA decode op alone, `small` shapes (H %d, R %d, De %d), synthetic caches\n", cfg[0].mla_heads,
               cfg[0].kv_lora_rank, cfg[0].qk_extra_dim);
        bench_op_only(&cfg[0], max_ctx, block, nblock);
        OPS->free(block);
        lm_cuda_backend_shutdown();
        return 0;
    }

    const int ctx[3] = {4096, 65536, 1048576}, bs[2] = {1, 64};
    decode_res dec[2][3][2];
    memset(dec, 0, sizeof dec);
    for (int v = 0; v < 2; v++) {
        if (only_v >= 0 && v != only_v) continue;
        double t0 = lm_time_sec();
        lm_model *m = lm_model_create(&cfg[v], OPS, 1234);
        sync_dev();
        printf("== %s: model created in %.1f s; GPU free %.1f GB\n", label[v], lm_time_sec() - t0, free_bytes() / GB);
        fflush(stdout);
        const int pre[][2] = {{1, 4096}, {1, 16384}, {1, 32768}, {1, 65536}, {4, 4096}, {64, 4096}, {1, 1048576}};
        for (size_t k = 0; k < sizeof pre / sizeof *pre; k++)
            if (pre[k][1] <= max_ctx && pre[k][1] >= min_ctx) bench_prefill(m, pre[k][0], pre[k][1], &r, all_prefill);
        for (int li = 0; li < 3 && !prefill_only; li++)
            for (int bi = 0; bi < 2; bi++)
                if (ctx[li] <= max_ctx) dec[v][li][bi] = bench_decode(m, bs[bi], ctx[li], steps, block, nblock, &r);
        lm_model_free(m);
    }
    if (prefill_only || only_v >= 0) {
        OPS->free(block);
        lm_cuda_backend_shutdown();
        return 0;
    }
    printf("== decode summary (median ms per one-token step; tokens/s = B / step time)\n");
    printf("  %-8s %-4s | %10s %10s %8s | %10s %10s %8s | %s\n", "context", "B", "hybrid ms", "tok/s", "cache GB",
           "all-MLA ms", "tok/s", "cache GB", "speedup");
    for (int li = 0; li < 3; li++)
        for (int bi = 0; bi < 2; bi++) {
            const decode_res *h = &dec[0][li][bi], *a = &dec[1][li][bi];
            if (ctx[li] > max_ctx) continue;
            char hs[64] = "skipped", as[64] = "skipped", sp[32] = "-";
            if (h->ok) snprintf(hs, sizeof hs, "%10.3f %10.0f", h->ms, h->tok_s);
            if (a->ok) snprintf(as, sizeof as, "%10.3f %10.0f", a->ms, a->tok_s);
            if (h->ok && a->ok) snprintf(sp, sizeof sp, "%.2fx", a->ms / h->ms);
            printf("  %-8d %-4d | %21s %8.2f | %21s %8.2f | %s\n", ctx[li], bs[bi], hs, h->kda_gb + h->mla_gb, as,
                   a->kda_gb + a->mla_gb, sp);
        }
    OPS->free(block);
    lm_cuda_backend_shutdown();
    return 0;
}
