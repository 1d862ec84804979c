// report_load.c — reads one run's metrics.jsonl (docs/metrics.md) into an rp_run.
//
// Strict about what is there, lenient about what is not: every line must be a JSON object
// with a string "type", and a field that is present must have the documented type, but
// optional fields (moe, attnres, tasks, tok_s, …) may be missing — a dense or PreNorm
// variant has no moe/attnres. Unknown line types are skipped so newer writers stay
// readable. `null` numbers (how cJSON writes NaN/inf) count as "not finite".
#include "train/report_data.h"
#include <errno.h>
#include <cjson/cJSON.h>

void rp_series_push(rp_series *s, double x, double y) {
    // a step at or before the last one means the run was resumed from a checkpoint:
    // the re-logged steps replace the old tail
    while (s->n > 0 && s->x[s->n - 1] >= x) s->n--;
    if (!isfinite(y)) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->x = lm_realloc(s->x, sizeof(double) * (size_t)s->cap);
        s->y = lm_realloc(s->y, sizeof(double) * (size_t)s->cap);
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
}

void rp_series_free(rp_series *s) {
    free(s->x);
    free(s->y);
    *s = (rp_series){0};
}

// parsing context: where we are, for error messages
typedef struct {
    const char *path;
    long line;
} ctx;

#define FAIL(c, ...)                                                                  \
    do {                                                                              \
        char msg_[256];                                                               \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                     \
        lm_set_error("%s:%ld: %s", (c)->path, (c)->line, msg_);                       \
        return LM_ERR;                                                                \
    } while (0)

// a number field: absent → NaN unless required; null → NaN; anything else is an error
static lm_status num_field(const ctx *c, const cJSON *obj, const char *key, int required, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NAN;
    if (!v) {
        if (required) FAIL(c, "missing field \"%s\"", key);
        return LM_OK;
    }
    if (cJSON_IsNull(v)) return LM_OK;
    if (!cJSON_IsNumber(v)) FAIL(c, "field \"%s\" is not a number", key);
    *out = v->valuedouble;
    return LM_OK;
}

// an array field; absent → NULL
static lm_status array_field(const ctx *c, const cJSON *obj, const char *key, const cJSON **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return LM_OK;
    if (!cJSON_IsArray(v)) FAIL(c, "field \"%s\" is not an array", key);
    *out = v;
    return LM_OK;
}

static lm_status step_field(const ctx *c, const cJSON *obj, double *step) {
    if (num_field(c, obj, "step", 1, step)) return LM_ERR;
    if (!isfinite(*step) || *step < 0) FAIL(c, "field \"step\" is not a step number");
    return LM_OK;
}

static rp_moe_layer *moe_layer(rp_run *r, int layer) {
    for (int i = 0; i < r->n_moe; i++)
        if (r->moe[i].layer == layer) return &r->moe[i];
    r->moe = lm_realloc(r->moe, sizeof(rp_moe_layer) * (size_t)(r->n_moe + 1));
    r->moe[r->n_moe] = (rp_moe_layer){.layer = layer};
    return &r->moe[r->n_moe++];
}

static lm_status parse_moe(const ctx *c, rp_run *r, double step, const cJSON *arr) {
    double sum = 0;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsObject(e)) FAIL(c, "\"moe\" entry is not an object");
        double layer, maxvio, entropy;
        const cJSON *loads;
        if (num_field(c, e, "layer", 1, &layer) || num_field(c, e, "maxvio", 0, &maxvio) ||
            num_field(c, e, "entropy", 0, &entropy) || array_field(c, e, "loads", &loads))
            return LM_ERR;
        if (!isfinite(layer) || layer < 0 || layer >= LM_MAX_LAYERS || layer != floor(layer))
            FAIL(c, "\"moe\" entry has a bad layer index");
        rp_moe_layer *m = moe_layer(r, (int)layer);
        rp_series_push(&m->maxvio, step, maxvio);
        rp_series_push(&m->entropy, step, entropy);
        if (isfinite(maxvio)) sum += maxvio, n++;
        if (loads) {
            int k = cJSON_GetArraySize(loads), i = 0;
            m->loads = lm_realloc(m->loads, sizeof(double) * (size_t)(k ? k : 1));
            const cJSON *l;
            cJSON_ArrayForEach(l, loads) {
                if (!cJSON_IsNumber(l)) FAIL(c, "\"moe\" layer %d: \"loads\" holds a non-number", (int)layer);
                m->loads[i++] = l->valuedouble;
            }
            m->n_loads = k;
        }
    }
    r->last_maxvio = n ? sum / n : NAN;
    return LM_OK;
}

static void free_mixers(rp_run *r) {
    for (int i = 0; i < r->n_mixers; i++) {
        for (int j = 0; j < r->mixers[i].n; j++) free(r->mixers[i].sources[j]);
        free(r->mixers[i].sources);
        free(r->mixers[i].alpha);
        free(r->mixers[i].name);
    }
    free(r->mixers);
    r->mixers = NULL;
    r->n_mixers = 0;
}

// the latest attnres entry replaces the previous one: the report shows the last step's
static lm_status parse_attnres(const ctx *c, rp_run *r, const cJSON *arr) {
    free_mixers(r);
    int n = cJSON_GetArraySize(arr);
    r->mixers = lm_malloc(sizeof(rp_mixer) * (size_t)(n ? n : 1));
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "mixer"), *src, *alpha;
        if (!cJSON_IsObject(e) || !cJSON_IsString(name)) FAIL(c, "\"attnres\" entry without a \"mixer\" name");
        if (array_field(c, e, "sources", &src) || array_field(c, e, "alpha", &alpha)) return LM_ERR;
        if (!src || !alpha || cJSON_GetArraySize(src) != cJSON_GetArraySize(alpha))
            FAIL(c, "\"attnres\" mixer \"%s\": \"sources\" and \"alpha\" missing or of different lengths",
                 name->valuestring);
        rp_mixer *m = &r->mixers[r->n_mixers++];
        m->name = lm_strdup(name->valuestring);
        int k = cJSON_GetArraySize(src);
        m->sources = lm_malloc(sizeof(char *) * (size_t)(k ? k : 1));
        m->alpha = lm_malloc(sizeof(double) * (size_t)(k ? k : 1));
        for (int j = 0; j < k; j++) {
            const cJSON *s = cJSON_GetArrayItem(src, j), *a = cJSON_GetArrayItem(alpha, j);
            if (!cJSON_IsString(s) || !(cJSON_IsNumber(a) || cJSON_IsNull(a)))
                FAIL(c, "\"attnres\" mixer \"%s\": source %d is not a label with a number", m->name, j);
            m->sources[m->n] = lm_strdup(s->valuestring);
            m->alpha[m->n++] = cJSON_IsNumber(a) ? a->valuedouble : NAN;
        }
    }
    return LM_OK;
}

static lm_status parse_train(const ctx *c, rp_run *r, const cJSON *o) {
    double step, loss, tok_s, step_ms;
    const cJSON *moe, *attnres;
    if (step_field(c, o, &step) || num_field(c, o, "loss", 1, &loss) || num_field(c, o, "tok_s", 0, &tok_s) ||
        num_field(c, o, "step_ms", 0, &step_ms) || array_field(c, o, "moe", &moe) ||
        array_field(c, o, "attnres", &attnres))
        return LM_ERR;
    rp_series_push(&r->loss, step, loss);
    rp_series_push(&r->tok_s, step, tok_s);
    rp_series_push(&r->step_ms, step, step_ms);
    if (moe && parse_moe(c, r, step, moe)) return LM_ERR;
    if (attnres && parse_attnres(c, r, attnres)) return LM_ERR;
    return LM_OK;
}

static rp_task *task(rp_run *r, const char *name) {
    for (int i = 0; i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i].name, name)) return &r->tasks[i];
    r->tasks = lm_realloc(r->tasks, sizeof(rp_task) * (size_t)(r->n_tasks + 1));
    r->tasks[r->n_tasks] = (rp_task){.name = lm_strdup(name), .last_acc = NAN};
    return &r->tasks[r->n_tasks++];
}

static lm_status parse_eval(const ctx *c, rp_run *r, const cJSON *o) {
    double step, loss;
    if (step_field(c, o, &step) || num_field(c, o, "loss", 1, &loss)) return LM_ERR;
    const cJSON *tasks = cJSON_GetObjectItemCaseSensitive(o, "tasks");
    if (tasks && !cJSON_IsNull(tasks) && !cJSON_IsObject(tasks)) FAIL(c, "field \"tasks\" is not an object");
    rp_series_push(&r->eval_loss, step, loss);
    r->last_eval_loss = loss;
    // "at the last eval": a task missing from this eval has no last accuracy
    for (int i = 0; i < r->n_tasks; i++) r->tasks[i].last_acc = NAN;
    const cJSON *t;
    cJSON_ArrayForEach(t, tasks) {
        if (!cJSON_IsObject(t)) FAIL(c, "task \"%s\" is not an object", t->string);
        double acc;
        if (num_field(c, t, "acc", 0, &acc)) return LM_ERR;
        rp_task *k = task(r, t->string);
        rp_series_push(&k->acc, step, acc);
        k->last_acc = acc;
    }
    return LM_OK;
}

static lm_status parse_line(const ctx *c, rp_run *r, const char *text, size_t len) {
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!o) FAIL(c, "not valid JSON");
    // one object per line: anything after it (two objects glued together) is an error
    while (end && (size_t)(end - text) < len && (*end == ' ' || *end == '\t')) end++;
    if (end && (size_t)(end - text) < len) {
        cJSON_Delete(o);
        FAIL(c, "not valid JSON (text after the object)");
    }
    lm_status st = LM_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (!cJSON_IsObject(o)) {
        lm_set_error("%s:%ld: not a JSON object", c->path, c->line);
        st = LM_ERR;
    } else if (!cJSON_IsString(type)) {
        lm_set_error("%s:%ld: missing string field \"type\"", c->path, c->line);
        st = LM_ERR;
    } else if (!strcmp(type->valuestring, "train")) {
        st = parse_train(c, r, o);
    } else if (!strcmp(type->valuestring, "eval")) {
        st = parse_eval(c, r, o);
    } else if (!strcmp(type->valuestring, "end")) {
        // the median step of the run (written since session 3), else the older EMA figure
        st = num_field(c, o, "median_tok_s", 0, &r->end_tok_s);
        if (!st && !isfinite(r->end_tok_s)) st = num_field(c, o, "tok_s", 0, &r->end_tok_s);
    } else if (!strcmp(type->valuestring, "run")) {
        st = num_field(c, o, "params_total", 0, &r->params_total);
        if (!st) st = num_field(c, o, "params_active", 0, &r->params_active);
    }
    cJSON_Delete(o);
    return st;
}

lm_status rp_run_load(rp_run *r, const char *path) {
    *r = (rp_run){.last_eval_loss = NAN, .last_maxvio = NAN, .end_tok_s = NAN, .params_total = NAN,
                  .params_active = NAN, .path = lm_strdup(path)};
    FILE *f = fopen(path, "r");
    if (!f) {
        lm_set_error("cannot open metrics '%s': %s", path, strerror(errno));
        return LM_ERR;
    }
    ctx c = {path, 0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    lm_status st = LM_OK;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        c.line++;
        size_t n = (size_t)len;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (n == 0) continue;   // blank lines carry nothing
        if (memchr(line, 0, n)) {
            lm_set_error("%s:%ld: contains a NUL byte", path, c.line);
            st = LM_ERR;
            break;
        }
        st = parse_line(&c, r, line, n);
    }
    if (!st && ferror(f)) {
        lm_set_error("cannot read metrics '%s': %s", path, strerror(errno));
        st = LM_ERR;
    }
    free(line);
    fclose(f);
    if (!st && r->loss.n == 0) {
        lm_set_error("%s: no \"train\" line with a finite loss", path);
        st = LM_ERR;
    }
    // layers in ascending order, whatever order the log listed them in
    for (int i = 1; i < r->n_moe; i++)
        for (int j = i; j > 0 && r->moe[j - 1].layer > r->moe[j].layer; j--) {
            rp_moe_layer t = r->moe[j];
            r->moe[j] = r->moe[j - 1];
            r->moe[j - 1] = t;
        }
    return st;
}

void rp_run_free(rp_run *r) {
    rp_series_free(&r->loss);
    rp_series_free(&r->tok_s);
    rp_series_free(&r->step_ms);
    rp_series_free(&r->eval_loss);
    for (int i = 0; i < r->n_tasks; i++) {
        free(r->tasks[i].name);
        rp_series_free(&r->tasks[i].acc);
    }
    free(r->tasks);
    for (int i = 0; i < r->n_moe; i++) {
        rp_series_free(&r->moe[i].maxvio);
        rp_series_free(&r->moe[i].entropy);
        free(r->moe[i].loads);
    }
    free(r->moe);
    free_mixers(r);
    free(r->path);
    free(r->variant);
    *r = (rp_run){0};
}
