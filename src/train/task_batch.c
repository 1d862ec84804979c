// task_batch.c — the task mix, the seeded task stream, and packing examples into rows.
#include "train/tasks.h"
#include "train/tokens.h"
#include <errno.h>

// ----------------------------------------------------------------------------
// mix

void lm_task_mix_default(lm_task_mix *m) {
    for (int i = 0; i < LM_TASK_COUNT; i++) m->w[i] = 1;
}

static lm_status mix_check(const lm_task_mix *m) {
    double total = 0;
    for (int i = 0; i < LM_TASK_COUNT; i++) {
        if (!(m->w[i] >= 0 && isfinite(m->w[i]))) {
            lm_set_error("task mix: weight of '%s' must be a finite number >= 0, got %g", lm_task_name(i), m->w[i]);
            return LM_ERR;
        }
        total += m->w[i];
    }
    if (!(total > 0)) { lm_set_error("task mix: all weights are zero"); return LM_ERR; }
    return LM_OK;
}

lm_status lm_task_mix_parse(lm_task_mix *m, const char *spec) {
    if (strcmp(spec, "all") == 0) { lm_task_mix_default(m); return LM_OK; }
    lm_task_mix mix = {{0}};
    char *buf = lm_strdup(spec), *save = NULL;
    lm_status st = LM_OK;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        if (colon) *colon = 0;
        int t = lm_task_by_name(item);
        if (t < 0) {
            lm_set_error("task mix: unknown task '%s' (known: recall, copy, reverse, add, passkey, tool)", item);
            st = LM_ERR;
            break;
        }
        double w = 1;
        if (colon) {
            char *end;
            errno = 0;
            w = strtod(colon + 1, &end);
            if (end == colon + 1 || *end || errno || !(w >= 0 && isfinite(w))) {
                lm_set_error("task mix: weight of '%s' must be a number >= 0, got '%s'", item, colon + 1);
                st = LM_ERR;
                break;
            }
        }
        mix.w[t] = w;
    }
    free(buf);
    if (st == LM_OK) st = mix_check(&mix);
    if (st == LM_OK) *m = mix;
    return st;
}

void lm_task_mix_format(const lm_task_mix *m, char *buf, size_t n) {
    size_t used = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < LM_TASK_COUNT; i++) {
        if (m->w[i] <= 0) continue;
        int k = snprintf(buf + used, n > used ? n - used : 0, "%s%s:%g", used ? "," : "", lm_task_name(i), m->w[i]);
        if (k < 0 || used + (size_t)k >= n) return;   // truncated, still terminated
        used += (size_t)k;
    }
}

// ----------------------------------------------------------------------------
// stream

uint64_t lm_task_heldout_seed(uint64_t seed) {
    // xor with a fixed odd constant: never equal to the seed, and a different
    // splitmix64 expansion, so the two xoshiro streams are unrelated
    return seed ^ 0xd1b54a32d192ed03ULL;
}

lm_status lm_task_gen_init(lm_task_gen *g, uint64_t seed, const lm_task_mix *mix, int max_len) {
    memset(g, 0, sizeof *g);
    if (mix_check(mix) != LM_OK) return LM_ERR;
    if (max_len < 0) { lm_set_error("maximum example length must be >= 0 (0: a whole row), got %d", max_len); return LM_ERR; }
    g->seed = seed;
    g->mix = *mix;
    g->max_len = max_len;
    lm_task_gen_rewind(g);
    return LM_OK;
}

void lm_task_gen_rewind(lm_task_gen *g) {
    // salted, so a run that uses one --seed for weights and data does not draw the
    // same random numbers for both
    lm_rng_seed(&g->rng, g->seed ^ 0x7461736b73ULL);   // "tasks"
    g->n_examples = g->n_batches = 0;
}

void lm_task_gen_free(lm_task_gen *g) {
    free(g->row);
    g->row = NULL;
    g->row_cap = 0;
}

// A task drawn by weight among those whose examples fit `room` tokens; −1 if none fits.
// No random draw is spent when nothing fits, so the stream only depends on the rows.
static int pick_task(const lm_task_gen *g, lm_rng *r, const int *min_len, int room) {
    double total = 0;
    for (int i = 0; i < LM_TASK_COUNT; i++)
        if (g->mix.w[i] > 0 && min_len[i] <= room) total += g->mix.w[i];
    if (total <= 0) return -1;
    double u = lm_rng_uniform(r) * total;
    int last = -1;
    for (int i = 0; i < LM_TASK_COUNT; i++) {
        if (!(g->mix.w[i] > 0 && min_len[i] <= room)) continue;
        last = i;
        if (u < g->mix.w[i]) return i;
        u -= g->mix.w[i];
    }
    return last;   // u landed on the total through rounding
}

lm_status lm_task_batch(lm_task_gen *g, int B, int T, lm_batch *out) {
    if (B <= 0 || T <= 0) { lm_set_error("batch shape must be positive, got B=%d T=%d", B, T); return LM_ERR; }
    int slots = T + 1;   // row positions 0..T: T inputs, and slot T is the last input's target
    int longest = g->max_len > 0 ? lm_min(g->max_len, slots) : slots;
    int min_len[LM_TASK_COUNT];
    for (int i = 0; i < LM_TASK_COUNT; i++) {
        min_len[i] = lm_task_min_len(i);
        if (g->mix.w[i] > 0 && min_len[i] > longest) {
            lm_set_error("task '%s' needs examples of at least %d tokens, but examples may have at most %d "
                         "(rows of T+1 = %d, max example length %d: %s)",
                         lm_task_name(i), min_len[i], longest, slots, g->max_len,
                         longest == slots ? "use a longer --seq" : "raise --max-example, 0 = a whole row");
            return LM_ERR;
        }
    }
    if (g->row_cap < slots) {
        free(g->row);
        g->row = lm_malloc((size_t)slots * sizeof(int));
        g->row_cap = slots;
    }
    lm_batch_reserve(out, B, T);
    for (int b = 0; b < B; b++) {
        int *row = g->row, pos = 0, first_ex = out->n_ex;
        for (;;) {
            int room = lm_min(longest, slots - pos);
            int task = pick_task(g, &g->rng, min_len, room);
            if (task < 0) break;
            lm_task_example ex;
            if (lm_task_generate(task, &g->rng, room, row + pos, &ex) != LM_OK) return LM_ERR;
            lm_batch_add_example(out, (lm_example){.row = b, .start = pos, .len = ex.len, .tgt_start = pos + ex.sep,
                                                    .n_tgt = ex.answer_len + 1, .task = task});
            pos += ex.len;
            g->n_examples++;
        }
        for (int t = pos; t < slots; t++) row[t] = LM_TOK_PAD;
        int *tok = out->tokens + (size_t)b * T, *tgt = out->targets + (size_t)b * T;
        for (int t = 0; t < T; t++) tok[t] = row[t], tgt[t] = -1;
        // counted: positions whose next slot is an answer byte or the EOS
        for (int e = first_ex; e < out->n_ex; e++) {
            const lm_example *x = &out->ex[e];
            for (int t = x->tgt_start; t < x->tgt_start + x->n_tgt; t++) tgt[t] = row[t + 1];
        }
    }
    g->n_batches++;
    return LM_OK;
}
