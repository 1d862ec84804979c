// loader.c — see loader.h.
#include "train/loader.h"
#include "train/tokens.h"

#define STATE_MAGIC 0x4c4d4453ULL   // "LMDS"

static const char *kind_name(int kind) {
    switch (kind) {
    case LM_LOADER_TASKS: return "task";
    case LM_LOADER_TEXT: return "text-file";
    case LM_LOADER_SHARDS: return "token-shard";
    default: return "unknown";
    }
}

lm_status lm_loader_init_tasks(lm_loader *l, uint64_t seed, const lm_task_mix *mix, int max_len, int model_vocab) {
    memset(l, 0, sizeof *l);
    if (model_vocab < LM_TOK_MIN_VOCAB_TASKS) {
        lm_set_error("task data uses token ids up to %d (PAD), which needs a model vocab of at least %d (model has %d)",
                     LM_TOK_PAD, LM_TOK_MIN_VOCAB_TASKS, model_vocab);
        return LM_ERR;
    }
    if (lm_task_gen_init(&l->tasks, seed, mix, max_len) != LM_OK) return LM_ERR;
    l->kind = LM_LOADER_TASKS;
    return LM_OK;
}

static lm_status init_stream(lm_loader *l, lm_loader_kind kind, lm_token_data *d) {
    lm_token_reader_init(&l->reader, d, 0);
    lm_token_data_release(d);   // the reader holds it now
    l->kind = kind;
    return LM_OK;
}

lm_status lm_loader_init_text(lm_loader *l, const char *path, int model_vocab) {
    memset(l, 0, sizeof *l);
    lm_token_data *d;
    if (lm_text_open(&d, path, model_vocab) != LM_OK) return LM_ERR;
    return init_stream(l, LM_LOADER_TEXT, d);
}

lm_status lm_loader_init_shards(lm_loader *l, const char *const *paths, int n, int model_vocab) {
    memset(l, 0, sizeof *l);
    lm_token_data *d;
    if (lm_shards_open(&d, paths, n, model_vocab) != LM_OK) return LM_ERR;
    return init_stream(l, LM_LOADER_SHARDS, d);
}

lm_status lm_loader_init_spec(lm_loader *l, const char *data, uint64_t seed, const lm_task_mix *mix, int max_len,
                              int model_vocab) {
    if (strcmp(data, "tasks") == 0) return lm_loader_init_tasks(l, seed, mix, max_len, model_vocab);
    if (strncmp(data, "shards:", 7) == 0) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", data + 7);
        const char *paths[256];
        int n = 0;
        for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
            if (n == 256) { lm_set_error("--data shards: at most 256 files"); return LM_ERR; }
            paths[n++] = s;
        }
        if (n == 0) { lm_set_error("--data shards: needs at least one file"); return LM_ERR; }
        return lm_loader_init_shards(l, paths, n, model_vocab);
    }
    return lm_loader_init_text(l, data, model_vocab);
}

lm_status lm_loader_init_heldout(lm_loader *eval, const lm_loader *train) {
    memset(eval, 0, sizeof *eval);
    if (train->heldout) { lm_set_error("the held-out loader is made from a training loader"); return LM_ERR; }
    if (train->kind == LM_LOADER_TASKS) {
        const lm_task_gen *g = &train->tasks;
        if (lm_task_gen_init(&eval->tasks, lm_task_heldout_seed(g->seed), &g->mix, g->max_len) != LM_OK) return LM_ERR;
    } else {
        lm_token_reader_init(&eval->reader, train->reader.data, 1);
    }
    eval->kind = train->kind;
    eval->heldout = 1;
    return LM_OK;
}

void lm_loader_free(lm_loader *l) {
    if (l->kind == LM_LOADER_TASKS) lm_task_gen_free(&l->tasks);
    else if (l->kind) lm_token_reader_free(&l->reader);
    memset(l, 0, sizeof *l);
}

lm_status lm_loader_next(lm_loader *l, int B, int T, lm_batch *out) {
    switch (l->kind) {
    case LM_LOADER_TASKS: return lm_task_batch(&l->tasks, B, T, out);
    case LM_LOADER_TEXT:
    case LM_LOADER_SHARDS: return lm_token_batch(&l->reader, B, T, out);
    default: lm_set_error("data loader is not initialised"); return LM_ERR;
    }
}

// ----------------------------------------------------------------------------
// state

// Everything but the position: what a state must agree with to be restored here.
static void identity(const lm_loader *l, uint64_t s[LM_LOADER_STATE_WORDS]) {
    memset(s, 0, LM_LOADER_STATE_WORDS * sizeof(uint64_t));
    s[0] = STATE_MAGIC << 32 | LM_LOADER_STATE_VERSION;
    s[1] = (uint64_t)l->kind | (uint64_t)l->heldout << 8;
    if (l->kind == LM_LOADER_TASKS) {
        s[2] = l->tasks.seed;
    } else {
        const lm_token_reader *r = &l->reader;
        s[2] = r->data->n_tokens;
        s[3] = r->data->crc;
        s[4] = r->lo;
        s[5] = r->hi;
    }
}

void lm_loader_get_state(const lm_loader *l, uint64_t state[LM_LOADER_STATE_WORDS]) {
    identity(l, state);
    if (l->kind == LM_LOADER_TASKS) {
        for (int i = 0; i < 4; i++) state[3 + i] = l->tasks.rng.s[i];
        state[7] = l->tasks.n_examples;
        state[8] = l->tasks.n_batches;
    } else {
        state[6] = l->reader.pos;
        state[7] = l->reader.n_batches;
    }
}

lm_status lm_loader_set_state(lm_loader *l, const uint64_t state[LM_LOADER_STATE_WORDS]) {
    uint64_t id[LM_LOADER_STATE_WORDS];
    identity(l, id);
    if (state[0] >> 32 != STATE_MAGIC) { lm_set_error("data state: not a linmoe data-loader state"); return LM_ERR; }
    if ((uint32_t)state[0] != LM_LOADER_STATE_VERSION) {
        lm_set_error("data state: version %u is not supported (this build reads version %d)", (uint32_t)state[0],
                     LM_LOADER_STATE_VERSION);
        return LM_ERR;
    }
    if (state[1] != id[1]) {
        lm_set_error("data state was saved by a %s %s loader, but this is a %s %s loader",
                     (state[1] >> 8) ? "held-out" : "training", kind_name((int)(state[1] & 0xff)),
                     l->heldout ? "held-out" : "training", kind_name(l->kind));
        return LM_ERR;
    }
    if (l->kind == LM_LOADER_TASKS) {
        if (state[2] != id[2]) {
            lm_set_error("data state was saved for task seed %llu, but this loader uses seed %llu",
                         (unsigned long long)state[2], (unsigned long long)id[2]);
            return LM_ERR;
        }
        if (!(state[3] | state[4] | state[5] | state[6])) { lm_set_error("data state: corrupt generator state (all zero)"); return LM_ERR; }
        for (int i = 9; i < LM_LOADER_STATE_WORDS; i++)
            if (state[i]) { lm_set_error("data state: corrupt (reserved word %d is not zero)", i); return LM_ERR; }
        for (int i = 0; i < 4; i++) l->tasks.rng.s[i] = state[3 + i];
        l->tasks.n_examples = state[7];
        l->tasks.n_batches = state[8];
        return LM_OK;
    }
    if (state[2] != id[2] || state[3] != id[3] || state[4] != id[4] || state[5] != id[5]) {
        lm_set_error("data state was saved for other data (%llu tokens, crc %08llx, region %llu..%llu) than %s "
                     "(%llu tokens, crc %08llx, region %llu..%llu)",
                     (unsigned long long)state[2], (unsigned long long)state[3], (unsigned long long)state[4],
                     (unsigned long long)state[5], l->reader.data->name, (unsigned long long)id[2],
                     (unsigned long long)id[3], (unsigned long long)id[4], (unsigned long long)id[5]);
        return LM_ERR;
    }
    if (state[6] >= l->reader.hi - l->reader.lo && !(state[6] == 0 && l->reader.hi == l->reader.lo)) {
        lm_set_error("data state: position %llu is outside the data region (%llu tokens)",
                     (unsigned long long)state[6], (unsigned long long)(l->reader.hi - l->reader.lo));
        return LM_ERR;
    }
    for (int i = 8; i < LM_LOADER_STATE_WORDS; i++)
        if (state[i]) { lm_set_error("data state: corrupt (reserved word %d is not zero)", i); return LM_ERR; }
    l->reader.pos = state[6];
    l->reader.n_batches = state[7];
    return LM_OK;
}

void lm_loader_rewind(lm_loader *l) {
    if (l->kind == LM_LOADER_TASKS) {
        lm_task_gen_rewind(&l->tasks);
    } else if (l->kind) {
        l->reader.pos = 0;
        l->reader.n_batches = 0;
    }
}

void lm_loader_describe(const lm_loader *l, char *buf, size_t n) {
    const char *which = l->heldout ? "held-out" : "train";
    if (l->kind == LM_LOADER_TASKS) {
        char mix[160];
        lm_task_mix_format(&l->tasks.mix, mix, sizeof mix);
        snprintf(buf, n, "tasks seed %llu mix %s max example length %d (%s)", (unsigned long long)l->tasks.seed, mix,
                 l->tasks.max_len, which);
    } else if (l->kind) {
        const lm_token_reader *r = &l->reader;
        snprintf(buf, n, "%s, tokens %llu..%llu of %llu (%s)", r->data->name, (unsigned long long)r->lo,
                 (unsigned long long)r->hi, (unsigned long long)r->data->n_tokens, which);
    } else {
        snprintf(buf, n, "no data");
    }
}
