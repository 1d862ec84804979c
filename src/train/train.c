// train.c — see train.h.
#include "train/train.h"
#include "core/json_diff.h"
#include "core/safetensors.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/loader.h"
#include "train/qk_clip.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/stat.h>

void lm_train_opts_default(lm_train_opts *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->out_dir, sizeof o->out_dir, "runs/tiny");
    o->seed = 1;
    snprintf(o->data, sizeof o->data, "tasks");
    // the default run: the tasks `tiny` learns in a few CPU minutes (measured: recall 90%,
    // copy 74%, reverse 53% after 400 steps); passkey and tool need longer examples
    snprintf(o->tasks, sizeof o->tasks, "recall:3,copy:2,reverse,add");
    o->max_example = 48;
    o->steps = 400;
    o->batch = 16;
    o->seq_len = 256;
    lm_optim_default(&o->opt);
    o->eval_every = 100;
    o->eval_batches = 4;
    o->log_every = 10;
    o->save_every = 200;
    o->keep = 2;
    o->log_attnres_every = 10;
    o->max_skips = 5;
    o->qk_clip = 100;
}

// ----------------------------------------------------------------------------
// stages

typedef struct { int seq, steps; } stage;

static lm_status parse_stages(const lm_train_opts *o, stage *st, int *n) {
    *n = 0;
    if (!o->stages[0]) {
        if (o->seq_len < 2 || o->seq_len > LM_MAX_SEQ) {
            lm_set_error("--seq must be in [2, %d], got %d", LM_MAX_SEQ, o->seq_len);
            return LM_ERR;
        }
        if (o->steps < 1) { lm_set_error("--steps must be at least 1, got %d", o->steps); return LM_ERR; }
        st[0] = (stage){o->seq_len, o->steps};
        *n = 1;
        return LM_OK;
    }
    const char *p = o->stages;
    while (*p) {
        int seq, steps, used = 0;
        if (*n == LM_MAX_STAGES || sscanf(p, "%d:%d%n", &seq, &steps, &used) != 2 || seq < 2 || seq > LM_MAX_SEQ ||
            steps < 1) {
            lm_set_error("--stages '%s': expected a list like 256:300,2048:100 (at most %d stages, lengths in "
                         "[2, %d], steps >= 1)", o->stages, LM_MAX_STAGES, LM_MAX_SEQ);
            return LM_ERR;
        }
        st[(*n)++] = (stage){seq, steps};
        p += used;
        if (*p == ',') p++;
        else if (*p) { lm_set_error("--stages '%s': unexpected '%c'", o->stages, *p); return LM_ERR; }
    }
    return LM_OK;
}

// LINMOE_STEP_PHASES: waits for the device (a 4-byte read of the parameters), returns the ms
// since *t and sets *t to now
static double phase_mark(lm_model *m, double *t) {
    real x;
    m->ops->to_host(&x, m->params_mem, sizeof x);
    const double now = lm_time_sec(), ms = (now - *t) * 1e3;
    *t = now;
    return ms;
}

// sequences per forward/backward in a step of B sequences
static int micro_of(const lm_train_opts *o, int B) { return o->micro_batch > 0 && o->micro_batch < B ? o->micro_batch : B; }

static const stage *stage_at(const stage *st, int n, long step) {
    long end = 0;
    for (int i = 0; i < n; i++) {
        end += st[i].steps;
        if (step < end) return &st[i];
    }
    return &st[n - 1];
}

// ----------------------------------------------------------------------------
// data

static lm_status open_loader(lm_loader *l, const lm_train_opts *o, int vocab) {
    lm_task_mix mix;
    if (strcmp(o->data, "tasks") == 0 && lm_task_mix_parse(&mix, o->tasks) != LM_OK) return LM_ERR;
    return lm_loader_init_spec(l, o->data, o->seed, &mix, o->max_example, vocab);
}

// One row of every stage's length from the training and the held-out loader, then both
// loaders put back where they were: the inputs that only fail on a first batch (a task
// longer than the row, data shorter than T+1) fail here, before an earlier run in the
// folder is cleared or a metrics file is written.
static lm_status check_data(lm_loader *ld, lm_loader *ev, const stage *st, int nst) {
    uint64_t s_ld[LM_LOADER_STATE_WORDS], s_ev[LM_LOADER_STATE_WORDS];
    lm_loader_get_state(ld, s_ld);
    lm_loader_get_state(ev, s_ev);
    lm_batch b = {0};
    lm_status r = LM_OK;
    for (int i = 0; i < nst && r == LM_OK; i++) {
        r = lm_loader_next(ld, 1, st[i].seq, &b);
        if (r == LM_OK) r = lm_loader_next(ev, 1, st[i].seq, &b);
    }
    lm_batch_free(&b);
    if (lm_loader_set_state(ld, s_ld) != LM_OK || lm_loader_set_state(ev, s_ev) != LM_OK)
        LM_CHECK(0, "a loader did not take back its own state");
    return r;
}

static int parse_step_list(const char *s, long step) {
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return 0;
        if (v == step) return 1;
        p = *end == ',' ? end + 1 : end;
        if (!*end) break;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// logging helpers

static void fmt_time(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%02ld:%02ld", t / 60, t % 60);
}

// Full-mode source label: "emb", or a<i> / f<i> for layer i's attention / FFN output.
static void full_source_label(const lm_model *m, int stream, char *buf, size_t n) {
    snprintf(buf, n, "emb");
    for (int t = 0; t < m->n_tape; t++)
        if (m->tape[t].out == stream && stream != m->stream_embed)
            snprintf(buf, n, "%c%d", m->tape[t].kind == LM_TP_ATTN ? 'a' : 'f', m->tape[t].layer);
}

// Mean AttnRes weight of every source of every mixer over the last micro-batch.
static cJSON *attnres_json(const lm_model *m) {
    cJSON *arr = cJSON_CreateArray();
    const int N = m->ctx.N;
    for (int k = 0; k < m->n_mix; k++) {
        const lm_mix_plan *p = &m->mix[k];
        real *al = lm_malloc((size_t)N * p->n * sizeof(real));
        m->ops->to_host(al, m->acts.alpha[k], (size_t)N * p->n * sizeof(real));
        cJSON *o = cJSON_CreateObject();
        char name[32];
        if (p->layer < 0) snprintf(name, sizeof name, "out");
        else snprintf(name, sizeof name, "L%d.%s", p->layer, p->which ? "ffn" : "attn");
        cJSON_AddStringToObject(o, "mixer", name);
        cJSON_AddNumberToObject(o, "layer", p->layer);
        cJSON_AddStringToObject(o, "which", p->layer < 0 ? "out" : p->which ? "ffn" : "attn");
        cJSON *srcs = cJSON_AddArrayToObject(o, "sources"), *alpha = cJSON_AddArrayToObject(o, "alpha");
        for (int j = 0; j < p->n; j++) {
            char lab[32];
            if (m->cfg.residual == LM_RES_BLOCK) {
                // committed blocks first (emb, b1, b2, …), the current partial sum last
                if (j == 0) snprintf(lab, sizeof lab, "emb");
                else if (j == p->n - 1) snprintf(lab, sizeof lab, "partial");
                else snprintf(lab, sizeof lab, "b%d", j);
            } else {
                full_source_label(m, p->src[j], lab, sizeof lab);
            }
            cJSON_AddItemToArray(srcs, cJSON_CreateString(lab));
            double s = 0;
            for (int i = 0; i < N; i++) s += al[(size_t)i * p->n + j];
            cJSON_AddItemToArray(alpha, cJSON_CreateNumber(s / N));
        }
        cJSON_AddItemToArray(arr, o);
        free(al);
    }
    return arr;
}

static void write_line(FILE *f, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    fprintf(f, "%s\n", s);
    fflush(f);
    free(s);
}

// On resume: keep the metrics lines up to the checkpoint's step, drop the rest (they
// belong to the interrupted run and will be produced again). Written whole to a temporary
// file and renamed, so an interruption leaves the old file or the new one.
static lm_status truncate_metrics(const char *path, long step) {
    size_t n;
    uint8_t *buf = lm_read_file(path, &n);
    if (!buf) return LM_OK;   // no metrics yet: nothing to keep
    char *out = lm_malloc(n + 1);
    size_t used = 0;
    for (char *line = strtok((char *)buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cJSON *s = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
        cJSON *t = o ? cJSON_GetObjectItemCaseSensitive(o, "type") : NULL;
        int keep = o && (!s || (cJSON_IsNumber(s) && s->valuedouble <= step));
        if (keep && t && cJSON_IsString(t) && strcmp(t->valuestring, "end") == 0) keep = 0;
        if (keep) {
            size_t len = strlen(line);
            memcpy(out + used, line, len);
            out[used + len] = '\n';
            used += len + 1;
        }
        cJSON_Delete(o);
    }
    lm_status st = lm_write_file_atomic(path, out, used);
    free(out);
    free(buf);
    return st;
}

static char *train_json(const lm_train_opts *o) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddStringToObject(j, "tasks", o->tasks);
    cJSON_AddNumberToObject(j, "max_example", o->max_example);
    cJSON_AddNumberToObject(j, "steps", o->steps);
    cJSON_AddNumberToObject(j, "batch", o->batch);
    cJSON_AddNumberToObject(j, "micro_batch", o->micro_batch);
    cJSON_AddNumberToObject(j, "seq_len", o->seq_len);
    cJSON_AddStringToObject(j, "stages", o->stages);
    cJSON_AddStringToObject(j, "optimizer", o->opt.kind == LM_OPT_MUON ? "muon" : "adamw");
    cJSON_AddNumberToObject(j, "lr", o->opt.lr);
    cJSON_AddNumberToObject(j, "wd", o->opt.wd);
    cJSON_AddNumberToObject(j, "clip", o->opt.clip);
    cJSON_AddNumberToObject(j, "warmup", o->opt.warmup);
    cJSON_AddNumberToObject(j, "decay_frac", o->opt.decay_frac);
    cJSON_AddNumberToObject(j, "qk_clip", o->opt.kind == LM_OPT_MUON ? o->qk_clip : 0);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

// ----------------------------------------------------------------------------

#define FAIL(...) do { fprintf(stderr, "linmoe: error: " __VA_ARGS__); fputc('\n', stderr); rc = 1; goto done; } while (0)

int lm_train_run(const lm_train_opts *o, const lm_config *cfg, const lm_ops *ops) {
    int rc = 0;
    stage st[LM_MAX_STAGES];
    int nst = 0;
    lm_model *m = NULL;
    lm_optim opt = {0};
    lm_bal_xfer bal_xfer = {0};   // the balancers' one download per step
    lm_loader ld = {0}, ev = {0};
    lm_batch *mb = NULL;
    FILE *log = NULL;
    real *maxlog = NULL;
    double *step_s = NULL;   // this run's step times (the end line's median)
    int n_step_s = 0;
    int n_micro_cap = 0, have_loader = 0, have_eval = 0;
    lm_train_state ts;
    memset(&ts, 0, sizeof ts);
    char *tj = train_json(o);
    snprintf(ts.train_json, sizeof ts.train_json, "%s", tj);
    free(tj);

    if (!o->out_dir[0]) FAIL("--out must name a folder");
    if (parse_stages(o, st, &nst) != LM_OK) FAIL("%s", lm_last_error());
    long total_steps = 0;
    for (int i = 0; i < nst; i++) total_steps += st[i].steps;
    if (total_steps > 1000000000L) FAIL("%ld steps in all: at most 10^9", total_steps);
    if (o->batch < 1) FAIL("--batch must be at least 1");
    const long tokens_per_step = (long)o->batch * st[0].seq;
    if (tokens_per_step > LM_MAX_TOKENS_PER_STEP)
        FAIL("%ld tokens per step (batch %d x length %d) is more than the %ld this build handles", tokens_per_step,
             o->batch, st[0].seq, (long)LM_MAX_TOKENS_PER_STEP);
    for (int i = 0; i < nst; i++)
        if (tokens_per_step / st[i].seq < 1)
            FAIL("stage %d: sequence length %d exceeds the %ld tokens per step (batch x first length)", i, st[i].seq,
                 tokens_per_step);
    if (!(o->opt.lr > 0)) FAIL("--lr must be positive");
    if (o->opt.clip < 0 || o->opt.wd < 0) FAIL("--clip and --wd must be >= 0");
    if (!(o->opt.b1 >= 0 && o->opt.b1 < 1 && o->opt.b2 >= 0 && o->opt.b2 < 1)) FAIL("--beta1/--beta2 must be in [0, 1)");
    if (o->opt.decay_frac < 0 || o->opt.decay_frac > 1 || o->opt.final_frac < 0 || o->opt.final_frac > 1)
        FAIL("--decay-frac and --final-lr-frac must be in [0, 1]");
    if (o->opt.warmup < 0 || o->micro_batch < 0 || o->eval_every < 0 || o->save_every < 0 || o->keep < 0)
        FAIL("--warmup, --micro-batch, --eval-every, --save-every and --keep must be >= 0");
    if (o->eval_batches < 1 || o->log_every < 1) FAIL("--eval-batches and --log-every must be positive");
    if (o->max_skips < 0) FAIL("--max-skips must be >= 0 (0 = never stop)");
    if (o->max_example < 0 || o->log_attnres_every < 0 || o->qk_clip < 0)
        FAIL("--max-example, --log-attnres and --qk-clip must be >= 0");
    if (!(o->opt.muon_mu >= 0 && o->opt.muon_mu < 1)) FAIL("--muon-momentum must be in [0, 1)");
    if (lm_make_dirs(o->out_dir) != LM_OK) FAIL("%s", lm_last_error());
    // never replace an earlier run's checkpoints and metrics by accident; --overwrite clears
    // them only once the model, weights and data have loaded (a run that fails on its
    // inputs leaves the folder as it was)
    char prev[4200];
    const int held = o->resume ? 0 : lm_ckpt_dir_holds_run(o->out_dir, prev, sizeof prev), clear_prev = held > 0;
    if (held == 1 && !o->overwrite)
        FAIL("'%s' already holds a training run (%s): continue it with --resume, start over with "
             "--overwrite, or choose another --out", o->out_dir, prev);
    if (held == 2 && !o->overwrite)
        FAIL("'%s' already holds a training run without a checkpoint to resume (%s): start over with --overwrite, "
             "or choose another --out", o->out_dir, prev);

    // model
    double ptot, pact;
    lm_config_count_params(cfg, &ptot, &pact);
    if (strcmp(ops->name, "cpu") == 0) {   // weights, gradients, two moments; activations and their gradients
        int T0 = 0, B0 = 0;
        for (int i = 0; i < nst; i++) {
            const int Ti = st[i].seq, mi = micro_of(o, (int)(tokens_per_step / Ti));
            if ((long)mi * Ti > (long)B0 * T0) B0 = mi, T0 = Ti;
        }
        if (lm_check_host_memory(ptot * 4 * sizeof(real) + (double)lm_config_acts_bytes(cfg, B0, T0, 1), "training") != LM_OK)
            FAIL("%s", lm_last_error());
    }
    m = lm_model_create(cfg, ops, o->seed);
    if (o->init[0] && lm_load_weights(m, o->init) != LM_OK) FAIL("%s", lm_last_error());
    lm_optim_config oc = o->opt;
    oc.total_steps = (int)total_steps;
    lm_optim_init(&opt, m, &oc);
    if (open_loader(&ld, o, cfg->vocab) != LM_OK) FAIL("%s", lm_last_error());
    have_loader = 1;
    if (lm_loader_init_heldout(&ev, &ld) != LM_OK) FAIL("%s", lm_last_error());
    have_eval = 1;
    if (check_data(&ld, &ev, st, nst) != LM_OK) FAIL("data: %s", lm_last_error());

    char path[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
    if (o->resume) {
        char ck[2048];
        if (lm_ckpt_latest(o->out_dir, ck, sizeof ck) != LM_OK) FAIL("--resume: %s", lm_last_error());
        lm_train_state saved;
        if (lm_ckpt_load(ck, m, &opt, &saved) != LM_OK) FAIL("--resume: %s", lm_last_error());
        char key[64], now[96], was[96];
        if (!saved.train_json[0]) FAIL("--resume: '%s' has no training options in its state", ck);
        if (lm_json_first_diff(ts.train_json, saved.train_json, key, sizeof key, now, was, sizeof now))
            FAIL("--resume: the training options differ from the checkpoint's: %s is %s, the checkpoint has %s", key,
                 now, was);
        uint64_t blob[LM_LOADER_STATE_WORDS];
        memcpy(blob, saved.loader, sizeof blob);
        if (lm_loader_set_state(&ld, blob) != LM_OK) FAIL("--resume: %s", lm_last_error());
        memcpy(blob, saved.loader_eval, sizeof blob);
        if (lm_loader_set_state(&ev, blob) != LM_OK) FAIL("--resume: %s", lm_last_error());
        if (saved.step >= total_steps)
            FAIL("--resume: the run in '%s' already finished (step %ld of %ld); nothing to resume", o->out_dir,
                 saved.step, total_steps);
        ts.step = saved.step;
        ts.skipped_total = saved.skipped_total;
        ts.elapsed_s = saved.elapsed_s;
        if (truncate_metrics(path, ts.step) != LM_OK) FAIL("--resume: %s", lm_last_error());
        if (!o->quiet) printf("resumed from %s at step %ld\n", ck, ts.step);
    }
    if (clear_prev) lm_ckpt_clear(o->out_dir);
    log = fopen(path, o->resume ? "ab" : "wb");
    if (!log) FAIL("cannot write '%s': %s", path, strerror(errno));

    if (!o->resume) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "type", "run");
        cJSON_AddStringToObject(r, "name", cfg->name);
        cJSON_AddNumberToObject(r, "seed", (double)o->seed);
        cJSON_AddStringToObject(r, "device", ops->name);
        cJSON_AddNumberToObject(r, "threads", lm_num_threads());
        char *cj = lm_config_to_json(cfg);
        cJSON_AddItemToObject(r, "config", cJSON_Parse(cj));
        free(cj);
        cJSON_AddItemToObject(r, "train", cJSON_Parse(ts.train_json));
        cJSON_AddNumberToObject(r, "params_total", ptot);
        cJSON_AddNumberToObject(r, "params_active", pact);
        cJSON_AddNumberToObject(r, "tokens_per_step", (double)tokens_per_step);
        write_line(log, r);
        cJSON_Delete(r);
    }
    if (!o->quiet) {
        lm_config_print(cfg, stdout);
        char desc[256];
        lm_loader_describe(&ld, desc, sizeof desc);
        printf("training %ld steps, %ld tokens/step, %s, %s lr %g, %d threads -> %s\n", total_steps, tokens_per_step,
               desc, o->opt.kind == LM_OPT_MUON ? "muon" : "adamw", (double)o->opt.lr, lm_num_threads(), o->out_dir);
    }

    // LINMOE_STEP_PHASES=1: wait for the device after each phase of a step and print the
    // phases' wall times (a diagnostic: the waits expose launch latency the pipelined step hides)
    const char *phases_env = getenv("LINMOE_STEP_PHASES");
    const int show_phases = phases_env && phases_env[0] == '1';
    // LINMOE_PROFILE_STEP=n: step n (1-based, as printed) inside the backend's profiling region,
    // so that a profiler started with collection off records exactly one step's kernels
    const char *prof_env = getenv("LINMOE_PROFILE_STEP");
    const long prof_step = prof_env && ops->profile_range ? atol(prof_env) : 0;
    double ph[6] = {0};
    int consecutive_skips = 0;
    const int use_qk_clip = o->opt.kind == LM_OPT_MUON && o->qk_clip > 0;
    maxlog = lm_malloc((size_t)cfg->n_layers * (cfg->mla_heads > 0 ? cfg->mla_heads : 1) * sizeof(real));
    double t_run0 = lm_time_sec() - ts.elapsed_s;
    double ema_tok_s = 0;
    step_s = lm_malloc((size_t)(total_steps > 0 ? total_steps : 1) * sizeof(double));
    while (ts.step < total_steps) {
        double t0 = lm_time_sec();
        const stage *sg = stage_at(st, nst, ts.step);
        const int T = sg->seq, B = (int)(tokens_per_step / T);
        const int micro = micro_of(o, B);
        const int n_micro = (B + micro - 1) / micro;
        if (n_micro > n_micro_cap) {
            mb = lm_realloc(mb, (size_t)n_micro * sizeof *mb);
            memset(mb + n_micro_cap, 0, (size_t)(n_micro - n_micro_cap) * sizeof *mb);
            n_micro_cap = n_micro;
        }
        // all micro-batches first: the loss is the mean over the step's counted targets
        long count = 0;
        for (int u = 0; u < n_micro; u++) {
            int bu = u == n_micro - 1 ? B - micro * (n_micro - 1) : micro;
            if (lm_loader_next(&ld, bu, T, &mb[u]) != LM_OK) FAIL("data: %s", lm_last_error());
            for (int i = 0; i < bu * T; i++) count += mb[u].targets[i] >= 0;
        }
        if (count == 0) FAIL("step %ld: the batch has no target tokens", ts.step);
        const int capacity = lm_moe_capacity(cfg->capacity_factor, cfg->capacity_relax_steps, (int)ts.step,
                                             micro * T, cfg->n_experts, cfg->top_k);
        double tp = 0;   // the phases' clock, started once the device is idle
        if (prof_step == ts.step + 1) ops->profile_range(1);
        if (show_phases) phase_mark(m, &tp);
        lm_model_zero_grads(m);
        if (show_phases) ph[0] += phase_mark(m, &tp);
        if (use_qk_clip) lm_qk_reset(m, maxlog);
        double ce = 0, aux = 0;
        for (int u = 0; u < n_micro; u++) {
            lm_fwd_opts fo = {.training = 1, .capacity = capacity, .aux_weight = (real)mb[u].B / B};
            lm_model_forward(m, mb[u].tokens, mb[u].targets, mb[u].B, T, fo);
            if (show_phases) ph[1] += phase_mark(m, &tp);
            ce += m->last_ce_sum;
            aux += m->ctx.aux_loss;
            if (use_qk_clip) lm_qk_observe(m, maxlog);
            lm_model_backward(m, (real)(1.0 / count));
            if (show_phases) ph[2] += phase_mark(m, &tp);
        }
        double loss = ce / count;
        if (o->nan_steps[0] && parse_step_list(o->nan_steps, ts.step)) {
            real nan = NAN;
            ops->to_device(m->grads_mem, &nan, sizeof nan);
        }
        const real lr = lm_optim_lr(&opt.cfg, ts.step);
        // one pass over the gradients: their norm, non-finite iff some gradient is (squares
        // of finite floats summed in double cannot overflow; in the fp64 test build a
        // gradient above ~1e154 would also count as non-finite and skip the step)
        double gnorm = lm_grad_norm(m);
        if (show_phases) ph[3] += phase_mark(m, &tp);
        int skipped = !isfinite(loss) || !isfinite(gnorm);
        int n_clipped = 0;
        lm_moe_metrics met[LM_MAX_LAYERS];
        if (!skipped) {
            lm_optim_step_norm(&opt, m, lr, gnorm);
            if (use_qk_clip) n_clipped = lm_qk_clip(m, maxlog, o->qk_clip);
            if (show_phases) ph[4] += phase_mark(m, &tp);
            lm_balancer *bals[LM_MAX_LAYERS];
            for (int i = 0; i < cfg->n_layers; i++) bals[i] = lm_layer_is_moe(cfg, i) ? &m->bal[i] : NULL;
            lm_balancers_update(bals, cfg->n_layers, ops, met, &bal_xfer);
            if (show_phases) ph[5] += phase_mark(m, &tp);
            consecutive_skips = 0;
        } else {
            gnorm = NAN;
            for (int i = 0; i < cfg->n_layers; i++)
                if (lm_layer_is_moe(cfg, i)) lm_balancer_discard(&m->bal[i], ops);
            ts.skipped_total++;
            consecutive_skips++;
            fprintf(stderr, "linmoe: warning: step %ld skipped: non-finite %s (%d in a row)\n", ts.step,
                    isfinite(loss) ? "gradients" : "loss", consecutive_skips);
        }
        if (prof_step == ts.step + 1) ops->profile_range(0);
        ts.step++;
        double dt = lm_time_sec() - t0;
        if (show_phases) {
            printf("phases ms: zero grads %.2f | forward %.2f | backward %.2f | grad norm %.2f | optimizer %.2f | "
                   "balancer %.2f | step %.2f\n", ph[0], ph[1], ph[2], ph[3], ph[4], ph[5], dt * 1e3);
            memset(ph, 0, sizeof ph);
        }
        if (n_step_s < total_steps) step_s[n_step_s++] = dt;
        double tok_s = (double)B * T / dt;
        ema_tok_s = ema_tok_s == 0 ? tok_s : 0.9 * ema_tok_s + 0.1 * tok_s;
        ts.elapsed_s = lm_time_sec() - t_run0;

        // metrics line
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "type", "train");
        cJSON_AddNumberToObject(j, "step", (double)ts.step);
        cJSON_AddNumberToObject(j, "loss", isfinite(loss) ? loss : -1);
        cJSON_AddNumberToObject(j, "aux_loss", aux);
        cJSON_AddNumberToObject(j, "lr", lr);
        cJSON_AddNumberToObject(j, "grad_norm", isfinite(gnorm) ? gnorm : -1);
        cJSON_AddNumberToObject(j, "tok_s", tok_s);
        cJSON_AddNumberToObject(j, "step_ms", dt * 1e3);
        cJSON_AddNumberToObject(j, "elapsed_s", ts.elapsed_s);
        cJSON_AddNumberToObject(j, "seq_len", T);
        cJSON_AddNumberToObject(j, "skipped", skipped);
        cJSON_AddNumberToObject(j, "skipped_total", (double)ts.skipped_total);
        if (use_qk_clip) cJSON_AddNumberToObject(j, "qk_clipped_heads", n_clipped);
        double maxvio_mean = 0;
        int n_moe = 0;
        if (!skipped && cfg->n_experts > 0) {
            cJSON *arr = cJSON_AddArrayToObject(j, "moe");
            for (int i = 0; i < cfg->n_layers; i++) {
                if (!lm_layer_is_moe(cfg, i)) continue;
                const lm_moe_metrics *mm = &met[i];
                cJSON *e = cJSON_CreateObject();
                cJSON_AddNumberToObject(e, "layer", i);
                cJSON_AddNumberToObject(e, "maxvio", mm->maxvio);
                cJSON_AddNumberToObject(e, "entropy", mm->entropy);
                cJSON_AddNumberToObject(e, "dead", mm->dead);
                cJSON_AddNumberToObject(e, "dropped", (double)mm->dropped);
                cJSON_AddNumberToObject(e, "bias_min", mm->bias_min);
                cJSON_AddNumberToObject(e, "bias_max", mm->bias_max);
                cJSON_AddNumberToObject(e, "bias_std", mm->bias_std);
                const lm_moe_acts *ma = &m->acts.layer[i].moe;
                size_t nz = (size_t)m->ctx.N * cfg->n_experts;
                cJSON_AddNumberToObject(e, "logit_rms", sqrt(ops->sumsq(ma->z, nz) / (double)nz));
                cJSON *loads = cJSON_AddArrayToObject(e, "loads");
                for (int k = 0; k < cfg->n_experts; k++) cJSON_AddItemToArray(loads, cJSON_CreateNumber((double)mm->loads[k]));
                cJSON_AddItemToArray(arr, e);
                maxvio_mean += mm->maxvio;
                n_moe++;
            }
        }
        if (cfg->residual != LM_RES_PRENORM && o->log_attnres_every > 0 &&
            (ts.step % o->log_attnres_every == 0 || ts.step == total_steps))
            cJSON_AddItemToObject(j, "attnres", attnres_json(m));
        write_line(log, j);
        cJSON_Delete(j);

        if (!o->quiet && (ts.step % o->log_every == 0 || ts.step == 1 || ts.step == total_steps)) {
            char el[32], eta[32];
            fmt_time(ts.elapsed_s, el, sizeof el);
            fmt_time(ts.elapsed_s / ts.step * (total_steps - ts.step), eta, sizeof eta);
            printf("step %5ld/%ld | loss %.4f | lr %.2e | gnorm %6.3f | %7.0f tok/s | maxvio %.3f | seq %d | %s, ETA %s%s\n",
                   ts.step, total_steps, loss, (double)lr, gnorm, ema_tok_s, n_moe ? maxvio_mean / n_moe : 0.0, T, el,
                   eta, skipped ? " | SKIPPED" : "");
            fflush(stdout);
        }
        if (consecutive_skips >= o->max_skips && o->max_skips > 0) {
            lm_loader_get_state(&ld, ts.loader);
            lm_loader_get_state(&ev, ts.loader_eval);
            char saved[2048] = "";
            lm_ckpt_save(o->out_dir, m, &opt, &ts, o->keep, saved, sizeof saved);
            FAIL("stopping: %d non-finite steps in a row (last good weights saved in %s)", consecutive_skips, saved);
        }
        int stop = o->stop_at > 0 && ts.step == o->stop_at;
        int last = ts.step == total_steps;
        if (o->eval_every > 0 && (ts.step % o->eval_every == 0 || last)) {
            lm_eval_result er;
            lm_loader_rewind(&ev);
            // eval_batches batches of min(B, 16) sequences, run in forwards no larger than the
            // training micro-batch (the memory that fits: a B8 run in micro-batches of 2 ran
            // out of GPU memory in its first evaluation). The forward size divides the batch,
            // so the sequences evaluated do not depend on the micro-batch.
            const int full_b = B > 16 ? 16 : B;
            int eval_b = micro < full_b ? micro : full_b;
            while (full_b % eval_b) eval_b--;
            const int n_eval = o->eval_batches * (full_b / eval_b);
            if (lm_eval_run(m, &ev, eval_b, T, n_eval, &er) != LM_OK) FAIL("eval: %s", lm_last_error());
            cJSON *e = lm_eval_json(&er);
            cJSON_AddNumberToObject(e, "step", (double)ts.step);
            write_line(log, e);
            cJSON_Delete(e);
            if (!o->quiet) lm_eval_print(&er, stdout);
        }
        char saved[2048] = "";
        if (!o->no_checkpoints && ((o->save_every > 0 && ts.step % o->save_every == 0) || last || stop)) {
            lm_loader_get_state(&ld, ts.loader);
            lm_loader_get_state(&ev, ts.loader_eval);
            if (lm_ckpt_save(o->out_dir, m, &opt, &ts, o->keep, saved, sizeof saved) != LM_OK)
                FAIL("checkpoint: %s", lm_last_error());
            if (!o->quiet) printf("saved %s\n", saved);
        }
        if (last) {
            // steady-state speed: the median step of this run after its first two (warm-up)
            int skip = n_step_s > 4 ? 2 : 0;
            double med = lm_median(step_s + skip, n_step_s - skip);
            double flops = lm_config_train_flops(cfg, T);
            double med_tok_s = med > 0 ? (double)B * T / med : 0;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "type", "end");
            cJSON_AddNumberToObject(e, "step", (double)ts.step);
            cJSON_AddNumberToObject(e, "elapsed_s", ts.elapsed_s);
            cJSON_AddNumberToObject(e, "tok_s", ema_tok_s);
            cJSON_AddNumberToObject(e, "median_step_s", med);
            cJSON_AddNumberToObject(e, "median_tok_s", med_tok_s);
            cJSON_AddNumberToObject(e, "model_flops_per_token", flops);
            if (!o->quiet)
                printf("throughput: median step %.1f ms (steps %d-%d of this run) = %.0f tok/s; %.3g GFLOP/token "
                       "(model FLOPs, fwd+bwd) = %.3g TFLOP/s\n",
                       1e3 * med, skip + 1, n_step_s, med_tok_s, flops * 1e-9, flops * med_tok_s * 1e-12);
            if (saved[0]) cJSON_AddStringToObject(e, "checkpoint", saved);
            write_line(log, e);
            cJSON_Delete(e);
        }
        if (stop && !last) {
            if (!o->quiet) printf("stopping at step %ld as asked (--debug-stop-at); continue with --resume\n", ts.step);
            break;
        }
    }
done:
    if (bal_xfer.cap) lm_bal_xfer_free(&bal_xfer, ops);
    free(maxlog);
    free(step_s);
    if (log) fclose(log);
    for (int u = 0; u < n_micro_cap; u++) lm_batch_free(&mb[u]);
    free(mb);
    if (have_eval) lm_loader_free(&ev);
    if (have_loader) lm_loader_free(&ld);
    if (m) {
        if (opt.m) lm_optim_free(&opt, m);
        lm_model_free(m);
    }
    return rc;
}
