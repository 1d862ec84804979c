// checkpoint.c — see checkpoint.h.
#include "train/checkpoint.h"
#include "core/json_diff.h"
#include "core/safetensors.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef LM_DOUBLE
#define REAL_DTYPE LM_ST_F64
#else
#define REAL_DTYPE LM_ST_F32
#endif

// ----------------------------------------------------------------------------
// weights

static lm_st_entry entry_of(const lm_tensor_info *t, const char *name, const real *base) {
    lm_st_entry e = {.name = name, .dtype = REAL_DTYPE, .ndim = t->ndim, .data = base + t->offset};
    for (int d = 0; d < t->ndim; d++) e.shape[d] = t->shape[d];
    return e;
}

lm_status lm_save_weights(const lm_model *m, const char *path, long step) {
    size_t n = m->playout.numel;
    real *host = lm_malloc(n * sizeof(real));
    lm_model_get_params(m, host);
    lm_st_entry *e = lm_malloc((size_t)m->playout.n * sizeof *e);
    for (int i = 0; i < m->playout.n; i++) e[i] = entry_of(&m->playout.t[i], m->playout.t[i].name, host);
    char *cfg = lm_config_to_json(&m->cfg);
    char step_s[32];
    snprintf(step_s, sizeof step_s, "%ld", step);
    const char *keys[] = {"format", "linmoe_format", "config", "step"};
    const char *vals[] = {"pt", "1", cfg, step_s};
    lm_status st = lm_st_write(path, e, m->playout.n, keys, vals, 4);
    free(cfg);
    free(e);
    free(host);
    return st;
}

static lm_status config_from_file(const lm_safetensors *st, const char *path, lm_config *c) {
    const char *js = lm_st_meta(st, "config");
    if (!js) { lm_set_error("'%s' has no linmoe config in its metadata", path); return LM_ERR; }
    memset(c, 0, sizeof *c);
    if (lm_config_apply_json(c, js) != LM_OK || lm_config_finalize(c) != LM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lm_last_error());
        lm_set_error("'%s': bad config in metadata: %s", path, msg);
        return LM_ERR;
    }
    return LM_OK;
}

lm_status lm_read_weights_config(const char *path, lm_config *c) {
    lm_safetensors st;
    if (lm_st_open(&st, path) != LM_OK) return LM_ERR;
    lm_status r = config_from_file(&st, path, c);
    lm_st_close(&st);
    return r;
}

// Names the first config field that differs (both configs serialised the same way).
static lm_status configs_match(const lm_config *a, const lm_config *b, const char *path) {
    char *ja = lm_config_to_json(a), *jb = lm_config_to_json(b);
    char key[64], va[96], vb[96];
    int diff = lm_json_first_diff(ja, jb, key, sizeof key, va, vb, sizeof va);
    if (diff) lm_set_error("config mismatch: '%s' has %s = %s, the model has %s", path, key, vb, va);
    free(ja);
    free(jb);
    return diff ? LM_ERR : LM_OK;
}

// Reads tensors named prefix+<param name> for every registered tensor into host[].
static lm_status read_tensors(const lm_safetensors *st, const char *path, const lm_layout *L, const char *prefix,
                              real *host, unsigned skip_flags) {
    for (int i = 0; i < L->n; i++) {
        const lm_tensor_info *t = &L->t[i];
        if (t->flags & skip_flags) continue;
        char name[LM_NAME_MAX + 8];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        const lm_st_tensor *f = lm_st_find(st, name);
        if (!f) { lm_set_error("'%s' lacks tensor '%s'", path, name); return LM_ERR; }
        int same = f->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = f->shape[d] == t->shape[d];
        if (!same) { lm_set_error("'%s': tensor '%s' has the wrong shape", path, name); return LM_ERR; }
        if (lm_st_read_real(st, f, host + t->offset, t->numel) != LM_OK) return LM_ERR;
    }
    return LM_OK;
}

lm_status lm_load_weights(lm_model *m, const char *path) {
    lm_safetensors st;
    if (lm_st_open(&st, path) != LM_OK) return LM_ERR;
    lm_config c;
    lm_status r = config_from_file(&st, path, &c);
    if (r == LM_OK) r = configs_match(&m->cfg, &c, path);
    real *host = NULL;
    if (r == LM_OK) {
        host = lm_malloc(m->playout.numel * sizeof(real));
        r = read_tensors(&st, path, &m->playout, "", host, 0);
    }
    if (r == LM_OK) {
        lm_model_set_params(m, host);
        for (int i = 0; i < m->cfg.n_layers; i++)
            if (lm_layer_is_moe(&m->cfg, i)) lm_balancer_refresh(&m->bal[i], m->ops);
    }
    free(host);
    lm_st_close(&st);
    return r;
}

// ----------------------------------------------------------------------------
// training state

static lm_status save_state(const char *path, const lm_model *m, const lm_optim *o, const lm_train_state *ts) {
    const lm_layout *L = &m->playout;
    size_t n = L->numel;
    real *hm = lm_malloc(n * sizeof(real)), *hv = lm_malloc(n * sizeof(real));
    m->ops->to_host(hm, o->m, n * sizeof(real));
    m->ops->to_host(hv, o->v, n * sizeof(real));
    lm_st_entry *e = lm_malloc((size_t)(2 * L->n + 2) * sizeof *e);
    char (*names)[LM_NAME_MAX + 8] = lm_malloc((size_t)(2 * L->n) * sizeof *names);
    int k = 0;
    for (int i = 0; i < L->n; i++) {
        const lm_tensor_info *t = &L->t[i];
        if (t->flags & LM_T_BUFFER) continue;
        snprintf(names[k], sizeof names[k], "m.%s", t->name);
        e[k] = entry_of(t, names[k], hm);
        k++;
        snprintf(names[k], sizeof names[k], "v.%s", t->name);
        e[k] = entry_of(t, names[k], hv);
        k++;
    }
    e[k++] = (lm_st_entry){.name = "loader", .dtype = LM_ST_I64, .ndim = 1, .shape = {LM_STATE_WORDS}, .data = ts->loader};
    e[k++] = (lm_st_entry){.name = "loader_eval", .dtype = LM_ST_I64, .ndim = 1, .shape = {LM_STATE_WORDS},
                           .data = ts->loader_eval};
    char step[32], skipped[32], optt[32], elapsed[40];
    snprintf(step, sizeof step, "%ld", ts->step);
    snprintf(skipped, sizeof skipped, "%ld", ts->skipped_total);
    snprintf(optt, sizeof optt, "%ld", o->t);
    snprintf(elapsed, sizeof elapsed, "%.17g", ts->elapsed_s);
    const char *keys[] = {"linmoe_state", "step", "skipped_total", "optim_t", "elapsed_s", "train"};
    const char *vals[] = {"1", step, skipped, optt, elapsed, ts->train_json};
    lm_status r = lm_st_write(path, e, k, keys, vals, 6);
    free(names);
    free(e);
    free(hm);
    free(hv);
    return r;
}

static lm_status parse_long(const lm_safetensors *st, const char *path, const char *key, long *out) {
    const char *v = lm_st_meta(st, key);
    char *end;
    if (!v || !*v || (*out = strtol(v, &end, 10), *end) || *out < 0) {
        lm_set_error("'%s': missing or bad '%s' in the training state", path, key);
        return LM_ERR;
    }
    return LM_OK;
}

static lm_status load_state(const char *path, lm_model *m, lm_optim *o, lm_train_state *ts) {
    lm_safetensors st;
    if (lm_st_open(&st, path) != LM_OK) return LM_ERR;
    lm_status r = LM_OK;
    if (!lm_st_meta(&st, "linmoe_state")) { lm_set_error("'%s' is not a linmoe training state", path); r = LM_ERR; }
    size_t n = m->playout.numel;
    real *hm = lm_malloc(n * sizeof(real)), *hv = lm_malloc(n * sizeof(real));
    if (r == LM_OK) r = read_tensors(&st, path, &m->playout, "m.", hm, LM_T_BUFFER);
    if (r == LM_OK) r = read_tensors(&st, path, &m->playout, "v.", hv, LM_T_BUFFER);
    const char *blobs[2] = {"loader", "loader_eval"};
    uint64_t *dst[2] = {ts->loader, ts->loader_eval};
    for (int b = 0; b < 2 && r == LM_OK; b++) {
        const lm_st_tensor *t = lm_st_find(&st, blobs[b]);
        if (!t || t->dtype != LM_ST_I64 || t->numel != LM_STATE_WORDS) {
            lm_set_error("'%s': missing or bad '%s'", path, blobs[b]);
            r = LM_ERR;
        } else memcpy(dst[b], st.data + t->begin, LM_STATE_WORDS * sizeof(uint64_t));
    }
    long optt = 0;
    if (r == LM_OK) r = parse_long(&st, path, "step", &ts->step);
    if (r == LM_OK) r = parse_long(&st, path, "skipped_total", &ts->skipped_total);
    if (r == LM_OK) r = parse_long(&st, path, "optim_t", &optt);
    if (r == LM_OK) {
        const char *el = lm_st_meta(&st, "elapsed_s"), *tj = lm_st_meta(&st, "train");
        ts->elapsed_s = el ? strtod(el, NULL) : 0;
        snprintf(ts->train_json, sizeof ts->train_json, "%s", tj ? tj : "");
        m->ops->to_device(o->m, hm, n * sizeof(real));
        m->ops->to_device(o->v, hv, n * sizeof(real));
        o->t = optt;
    }
    free(hm);
    free(hv);
    lm_st_close(&st);
    return r;
}

// ----------------------------------------------------------------------------
// checkpoint folders

static void remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(path);
}

static int ckpt_step_of(const char *name) {
    int step, n = 0;
    if (sscanf(name, "ckpt_%d%n", &step, &n) == 1 && name[n] == 0) return step;
    return -1;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void prune(const char *out_dir, int keep_last, int protect_step) {
    if (keep_last <= 0) return;
    DIR *d = opendir(out_dir);
    if (!d) return;
    int steps[4096], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        int s = ckpt_step_of(e->d_name);
        if (s >= 0) steps[n++] = s;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof(int), cmp_int);
    char p[4096];
    for (int i = 0; i < n - keep_last; i++) {
        if (steps[i] == protect_step) continue;
        snprintf(p, sizeof p, "%s/ckpt_%06d", out_dir, steps[i]);
        remove_dir(p);
    }
}

lm_status lm_ckpt_save(const char *out_dir, const lm_model *m, const lm_optim *o, const lm_train_state *st,
                       int keep_last, char *saved_path, size_t saved_len) {
    char final[4096], tmp[4200], p[4300];
    if (lm_make_dirs(out_dir) != LM_OK) return LM_ERR;
    snprintf(final, sizeof final, "%s/ckpt_%06ld", out_dir, st->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    remove_dir(tmp);   // a previous save of this step that was interrupted
    if (mkdir(tmp, 0755) != 0) { lm_set_error("cannot create '%s': %s", tmp, strerror(errno)); return LM_ERR; }
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    if (lm_save_weights(m, p, st->step) != LM_OK) return LM_ERR;
    // test hook: die like `kill -9` halfway through this save (see tests/test_cli.c)
    const char *crash = getenv("LINMOE_TEST_CRASH_IN_SAVE");
    if (crash && atol(crash) == st->step) raise(SIGKILL);
    snprintf(p, sizeof p, "%s/state.safetensors", tmp);
    if (save_state(p, m, o, st) != LM_OK) return LM_ERR;
    struct stat sb;
    if (stat(final, &sb) == 0) remove_dir(final);   // re-saving the same step replaces it
    if (rename(tmp, final) != 0) {
        lm_set_error("cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
        return LM_ERR;
    }
    char latest[4100], name[64];
    snprintf(latest, sizeof latest, "%s/latest", out_dir);
    int len = snprintf(name, sizeof name, "ckpt_%06ld\n", st->step);
    if (lm_write_file_atomic(latest, name, (size_t)len) != LM_OK) return LM_ERR;
    prune(out_dir, keep_last, (int)st->step);
    if (saved_path) snprintf(saved_path, saved_len, "%s", final);
    return LM_OK;
}

void lm_ckpt_clear(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return;
    char p[4096];
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "ckpt_", 5) != 0) continue;
        snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
        remove_dir(p);
    }
    closedir(d);
    snprintf(p, sizeof p, "%s/latest", out_dir);
    unlink(p);
}

int lm_ckpt_dir_holds_run(const char *out_dir, char *what, size_t len) {
    char p[4200];
    if (lm_ckpt_latest(out_dir, p, sizeof p) == LM_OK) { snprintf(what, len, "%s", p); return 1; }
    // no valid 'latest': a run without checkpoints, or one whose 'latest' is gone
    DIR *d = opendir(out_dir);
    int found = 0;
    if (d) {
        struct dirent *e;
        while (!found && (e = readdir(d)))
            if (strncmp(e->d_name, "ckpt_", 5) == 0 || strcmp(e->d_name, "metrics.jsonl") == 0 ||
                strcmp(e->d_name, "latest") == 0) {
                snprintf(what, len, "%s/%s", out_dir, e->d_name);
                found = 2;
            }
        closedir(d);
    }
    return found;
}

lm_status lm_ckpt_latest(const char *out_dir, char *path, size_t len) {
    char latest[4100];
    snprintf(latest, sizeof latest, "%s/latest", out_dir);
    size_t n;
    uint8_t *buf = lm_read_file(latest, &n);
    if (!buf) { lm_set_error("no checkpoint in '%s' (no 'latest' file)", out_dir); return LM_ERR; }
    char *s = (char *)buf;
    s[strcspn(s, "\r\n")] = 0;
    if (ckpt_step_of(s) < 0) { free(buf); lm_set_error("'%s' is corrupt", latest); return LM_ERR; }
    snprintf(path, len, "%s/%s", out_dir, s);
    free(buf);
    return LM_OK;
}

lm_status lm_ckpt_load(const char *ckpt_dir, lm_model *m, lm_optim *o, lm_train_state *st) {
    char p[4300];
    snprintf(p, sizeof p, "%s/model.safetensors", ckpt_dir);
    if (lm_load_weights(m, p) != LM_OK) return LM_ERR;
    snprintf(p, sizeof p, "%s/state.safetensors", ckpt_dir);
    return load_state(p, m, o, st);
}
