// test_data.c — the data layer of `linmoe train`: synthetic tasks (every answer
// re-derived here from the prompt text alone), packing and the target mask, train vs
// held-out, bit-exact resume for tasks/text/shards, and every refused input.
#include "harness.h"
#include "core/safetensors.h"   // lm_read_file
#include "train/loader.h"
#include "train/tokens.h"
#include <ctype.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void expect_error(lm_status st, const char *w1, const char *w2) {
    printf("refused with: %s\n", lm_last_error());
    assert_int_equal(st, LM_ERR);
    if (w1 && !strstr(lm_last_error(), w1)) fail_msg("error '%s' does not mention '%s'", lm_last_error(), w1);
    if (w2 && !strstr(lm_last_error(), w2)) fail_msg("error '%s' does not mention '%s'", lm_last_error(), w2);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

// ----------------------------------------------------------------------------
// reading an example back as text

// Splits BOS prompt SEP answer EOS into two C strings. Returns 0 when the structure is
// wrong: no BOS/EOS at the ends, not exactly one SEP, another special token, or a NUL byte.
static int decode(const int *tok, int len, char *prompt, char *answer) {
    if (len < 3 || tok[0] != LM_TOK_BOS || tok[len - 1] != LM_TOK_EOS) return 0;
    int sep = -1;
    for (int i = 1; i < len - 1; i++) {
        if (tok[i] == LM_TOK_SEP) {
            if (sep >= 0) return 0;
            sep = i;
        } else if (tok[i] <= 0 || tok[i] >= 256) {
            return 0;
        }
    }
    if (sep < 0) return 0;
    int np = 0, na = 0;
    for (int i = 1; i < sep; i++) prompt[np++] = (char)tok[i];
    for (int i = sep + 1; i < len - 1; i++) answer[na++] = (char)tok[i];
    prompt[np] = answer[na] = 0;
    return 1;
}

// ----------------------------------------------------------------------------
// independent solvers: the answer each prompt asks for, from its text alone

static int solve_recall(const char *p, char *ans, int *n_pairs) {
    const char *q = strrchr(p, '?');
    if (!q || q == p || q[-1] != ' ' || !islower((unsigned char)q[1]) || !islower((unsigned char)q[2]) || q[3])
        return 0;
    static int seen[26 * 26];
    memset(seen, 0, sizeof seen);
    int found = -1, n = 0;
    for (const char *s = p; s < q - 1; s += 6, n++) {
        // "kk=vv" then a space (the last pair's space is the one before '?')
        if (!islower((unsigned char)s[0]) || !islower((unsigned char)s[1]) || s[2] != '=' ||
            !isdigit((unsigned char)s[3]) || !isdigit((unsigned char)s[4]) || s[5] != ' ')
            return 0;
        int k = (s[0] - 'a') * 26 + (s[1] - 'a');
        if (seen[k]++) return 0;   // a repeated key would make the answer ambiguous
        if (s[0] == q[1] && s[1] == q[2]) found = (int)(s - p);
    }
    if (found < 0) return 0;
    ans[0] = p[found + 3], ans[1] = p[found + 4], ans[2] = 0;
    *n_pairs = n;
    return 1;
}

static int solve_letters(const char *p, const char *prefix, int rev, char *ans) {
    size_t k = strlen(prefix), n = strlen(p);
    if (strncmp(p, prefix, k) != 0 || n == k) return 0;
    for (size_t i = k; i < n; i++) {
        if (!islower((unsigned char)p[i])) return 0;
        ans[i - k] = rev ? p[n - 1 - (i - k)] : p[i];
    }
    ans[n - k] = 0;
    return 1;
}

// schoolbook addition on the digit strings
static int solve_add(const char *p, char *ans, int *da, int *db) {
    const char *plus = strchr(p, '+'), *eq = strchr(p, '=');
    if (!plus || !eq || eq[1] || eq < plus) return 0;
    int la = (int)(plus - p), lb = (int)(eq - plus - 1);
    if (la < 1 || lb < 1 || (la > 1 && p[0] == '0') || (lb > 1 && plus[1] == '0')) return 0;
    for (int i = 0; i < la; i++) if (!isdigit((unsigned char)p[i])) return 0;
    for (int i = 0; i < lb; i++) if (!isdigit((unsigned char)plus[1 + i])) return 0;
    char rev[32];
    int carry = 0, n = 0;
    for (int i = 0; i < la || i < lb || carry; i++) {
        int s = carry + (i < la ? p[la - 1 - i] - '0' : 0) + (i < lb ? plus[lb - i] - '0' : 0);
        rev[n++] = (char)('0' + s % 10);
        carry = s / 10;
    }
    for (int i = 0; i < n; i++) ans[i] = rev[n - 1 - i];
    ans[n] = 0;
    *da = la, *db = lb;
    return 1;
}

static const char *const FILLERS[] = {
    "The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ", "There and back again. ",
};
// true when s[0..n) is a run of whole filler sentences
static int all_filler(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = 0;
        for (int f = 0; f < 5 && !k; f++)
            if (strlen(FILLERS[f]) <= n - i && strncmp(s + i, FILLERS[f], strlen(FILLERS[f])) == 0) k = strlen(FILLERS[f]);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

// depth = filler bytes before the key sentence / all filler bytes; filler = their count
static int solve_passkey(const char *p, char *ans, double *depth, size_t *filler) {
    const char *Q = "What is the pass key?", *N = "The pass key is ", *R = ". Remember it. ";
    size_t n = strlen(p), nq = strlen(Q);
    if (n < nq || strcmp(p + n - nq, Q) != 0) return 0;
    const char *at = strstr(p, N);
    if (!at || strstr(at + 1, N)) return 0;   // exactly one key sentence
    const char *key = at + strlen(N);
    for (int i = 0; i < 5; i++) if (!isdigit((unsigned char)key[i])) return 0;
    if (strncmp(key + 5, R, strlen(R)) != 0) return 0;
    const char *after = key + 5 + strlen(R);
    size_t before_n = (size_t)(at - p), after_n = (size_t)(p + n - nq - after);
    if (!all_filler(p, before_n) || !all_filler(after, after_n)) return 0;
    memcpy(ans, key, 5);
    ans[5] = 0;
    *filler = before_n + after_n;
    *depth = *filler ? (double)before_n / (double)*filler : 0;
    return 1;
}

static const char *unit_code(const char *name) {
    static const char *const M[][2] = {
        {"kilometers", "km"}, {"miles", "mi"}, {"meters", "m"}, {"feet", "ft"}, {"kilograms", "kg"}, {"pounds", "lb"},
        {"grams", "g"}, {"celsius", "c"}, {"fahrenheit", "f"}, {"liters", "l"}, {"gallons", "gal"},
    };
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++)
        if (strcmp(M[i][0], name) == 0) return M[i][1];
    return NULL;
}
static int is_unit_code(const char *c) {
    const char *codes[] = {"km", "mi", "m", "ft", "kg", "lb", "g", "c", "f", "l", "gal"};
    for (int i = 0; i < 11; i++) if (strcmp(codes[i], c) == 0) return 1;
    return 0;
}

// returns the template index + 1 (0: no template matched)
static int solve_tool(const char *p, char *ans, size_t cap) {
    char a[64], b[64];
    int x, y, n = -1;
    if (n = -1, sscanf(p, "weather in %63[a-z]?%n", a, &n) == 1 && n > 0 && !p[n]) {
        snprintf(ans, cap, "<call>weather(\"%s\")</call>", a);
        return 1;
    }
    if (n = -1, sscanf(p, "time in %63[a-z]?%n", a, &n) == 1 && n > 0 && !p[n]) {
        snprintf(ans, cap, "<call>time(\"%s\")</call>", a);
        return 2;
    }
    if (n = -1, isdigit((unsigned char)p[0]) && sscanf(p, "%d %63[a-z] in %63[a-z]?%n", &x, a, b, &n) == 3 && n > 0 &&
                    !p[n] && is_unit_code(a) && unit_code(b) && strcmp(a, unit_code(b)) != 0) {
        snprintf(ans, cap, "<call>convert(%d,\"%s\",\"%s\")</call>", x, a, unit_code(b));
        return 3;
    }
    if (n = -1, sscanf(p, "search for %63[a-z] %63[a-z]%n", a, b, &n) == 2 && n > 0 && !p[n]) {
        snprintf(ans, cap, "<call>search(\"%s %s\")</call>", a, b);
        return 4;
    }
    if (n = -1, sscanf(p, "remind me at %d:%d to %63[a-z ]%n", &x, &y, a, &n) == 3 && n > 0 && !p[n] && x >= 0 &&
                    x < 24 && y >= 0 && y < 60) {
        snprintf(ans, cap, "<call>remind(\"%02d:%02d\",\"%s\")</call>", x, y, a);
        return 5;
    }
    return 0;
}

// per-task observations while checking examples
typedef struct {
    long n, wrong, too_long;
    long pairs_sum, pairs_max;        // recall
    int letters_min, letters_max;     // copy / reverse
    long digits[9];                   // add: operands by digit count
    double depth_min, depth_max;      // passkey
    long slack_max;                   // passkey: budget − length
    int templates_seen;               // tool: bit mask
} task_obs;

// Checks one example against the independent solver; updates obs.
static void check_example(int task, const int *tok, int len, int budget, task_obs *o) {
    static char prompt[1 << 15], answer[1 << 15], want[1 << 15];
    o->n++;
    if (len > budget) o->too_long++;
    if (!decode(tok, len, prompt, answer)) { o->wrong++; return; }
    int ok = 0;
    switch (task) {
    case LM_TASK_RECALL: {
        int np = 0;
        ok = solve_recall(prompt, want, &np);
        o->pairs_sum += np;
        if (np > o->pairs_max) o->pairs_max = np;
        break;
    }
    case LM_TASK_COPY:
    case LM_TASK_REVERSE: {
        ok = solve_letters(prompt, task == LM_TASK_COPY ? "copy:" : "rev:", task == LM_TASK_REVERSE, want);
        int nl = (int)strlen(want);
        if (nl < o->letters_min) o->letters_min = nl;
        if (nl > o->letters_max) o->letters_max = nl;
        break;
    }
    case LM_TASK_ADD: {
        int da = 0, db = 0;
        ok = solve_add(prompt, want, &da, &db) && da <= 8 && db <= 8;
        if (ok) o->digits[da]++, o->digits[db]++;
        break;
    }
    case LM_TASK_PASSKEY: {
        double depth = 0;
        size_t filler = 0;
        ok = solve_passkey(prompt, want, &depth, &filler);
        if (depth < o->depth_min) o->depth_min = depth;
        if (depth > o->depth_max) o->depth_max = depth;
        if (budget - len > o->slack_max) o->slack_max = budget - len;
        break;
    }
    case LM_TASK_TOOL: {
        int t = solve_tool(prompt, want, sizeof want);
        ok = t > 0;
        if (ok) o->templates_seen |= 1 << (t - 1);
        break;
    }
    }
    if (!ok || strcmp(want, answer) != 0) {
        if (o->wrong < 3) printf("  wrong %s example: prompt '%.120s' answer '%s' expected '%s'\n", lm_task_name(task),
                                 prompt, answer, ok ? want : "(prompt does not parse)");
        o->wrong++;
    }
}

static void obs_init(task_obs *o) {
    memset(o, 0, sizeof *o);
    o->letters_min = 1 << 30;
    o->depth_min = 1e9, o->depth_max = -1;
}

// ----------------------------------------------------------------------------

static void test_names_and_mix(void **state) {
    (void)state;
    for (int t = 0; t < LM_TASK_COUNT; t++) assert_int_equal(lm_task_by_name(lm_task_name(t)), t);
    assert_string_equal(lm_task_name(LM_TASK_RECALL), "recall");
    assert_string_equal(lm_task_name(LM_TASK_TOOL), "tool");
    assert_int_equal(lm_task_by_name("palindrome"), -1);
    lm_task_mix m;
    assert_int_equal(lm_task_mix_parse(&m, "recall:2,add,passkey:0.5"), LM_OK);
    tu_check("mix weights parsed", fabs(m.w[LM_TASK_RECALL] - 2) + fabs(m.w[LM_TASK_ADD] - 1) +
             fabs(m.w[LM_TASK_PASSKEY] - 0.5) + m.w[LM_TASK_COPY] + m.w[LM_TASK_REVERSE] + m.w[LM_TASK_TOOL], 0);
    char buf[200];
    lm_task_mix_format(&m, buf, sizeof buf);
    assert_string_equal(buf, "recall:2,add:1,passkey:0.5");
    assert_int_equal(lm_task_mix_parse(&m, "all"), LM_OK);
    for (int t = 0; t < LM_TASK_COUNT; t++) assert_true(m.w[t] == 1);
    expect_error(lm_task_mix_parse(&m, "recall,stack"), "unknown task", "stack");
    expect_error(lm_task_mix_parse(&m, "copy:-1"), "copy", "-1");
    expect_error(lm_task_mix_parse(&m, "copy:x"), "copy", "x");
    expect_error(lm_task_mix_parse(&m, "copy:0"), "zero", NULL);
    for (uint64_t s = 0; s < 1000; s++) assert_true(lm_task_heldout_seed(s) != s);
}

// Every task at many lengths: answers correct, lengths within the limit, and the
// difficulty follows the room it is given.
static void test_task_answers(void **state) {
    (void)state;
    const int budgets[] = {0 /* = min_len */, 1 /* = min_len + 1 */, 40, 65, 100, 257, 1000, 4097};
    int *buf = lm_malloc(8192 * sizeof(int));
    lm_rng r;
    lm_rng_seed(&r, 11);
    for (int task = 0; task < LM_TASK_COUNT; task++) {
        int minl = lm_task_min_len(task);
        lm_task_example ex;
        expect_error(lm_task_generate(task, &r, minl - 1, buf, &ex), lm_task_name(task), "at least");
        task_obs all, big;
        obs_init(&all);
        obs_init(&big);
        for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
            int budget = budgets[bi] <= 1 ? minl + budgets[bi] : budgets[bi];
            if (budget < minl) continue;
            int reps = budget > 1000 ? 40 : budget == 1000 ? 200 : 2000;
            for (int i = 0; i < reps; i++) {
                assert_int_equal(lm_task_generate(task, &r, budget, buf, &ex), LM_OK);
                assert_int_equal(ex.task, task);
                assert_int_equal(ex.answer_len, ex.len - ex.sep - 2);
                assert_int_equal(buf[ex.sep], LM_TOK_SEP);
                check_example(task, buf, ex.len, budget, &all);
                if (budget == 257) check_example(task, buf, ex.len, budget, &big);
            }
        }
        char what[96];
        snprintf(what, sizeof what, "%s: wrong answers of %ld", lm_task_name(task), all.n);
        tu_check(what, (double)all.wrong, 0);
        snprintf(what, sizeof what, "%s: examples over max length", lm_task_name(task));
        tu_check(what, (double)all.too_long, 0);
        switch (task) {
        case LM_TASK_RECALL:
            // pairs uniform in 2..(257−8)/6 = 41 at length 257: mean 21.5; and all 676 keys fit in 4097
            tu_check("recall: |mean pairs − 21.5| at length 257", fabs((double)big.pairs_sum / big.n - 21.5), 1.0);
            assert_int_equal(big.pairs_max, 41);
            assert_true(all.pairs_max > 600);
            break;
        case LM_TASK_COPY:
        case LM_TASK_REVERSE:
            assert_int_equal(big.letters_min, 4);
            assert_int_equal(big.letters_max, 32);
            assert_int_equal(all.letters_min, 1);   // shrunk at the minimum length
            break;
        case LM_TASK_ADD: {
            // operand digit counts uniform over 1..8 when there is room
            double dev = 0;
            for (int d = 1; d <= 8; d++) dev = tu_worst(dev, fabs(big.digits[d] / (2.0 * big.n) - 0.125));
            tu_check("add: max |P(digits = d) − 1/8| at length 257", dev, 0.02);
            break;
        }
        case LM_TASK_PASSKEY:
            // the filler takes the room: at most one sentence (22 bytes) is left over
            tu_check("passkey: most unused room (tokens)", (double)all.slack_max, 21);
            tu_check("passkey: smallest depth", big.depth_min, 0.05);
            tu_check("passkey: 1 − largest depth", 1 - big.depth_max, 0.05);
            break;
        case LM_TASK_TOOL: assert_int_equal(all.templates_seen, 31); break;
        }
    }
    // the length × depth grid entry point puts the key where asked
    for (int di = 0; di <= 4; di++) {
        lm_task_example ex;
        assert_int_equal(lm_task_passkey_at(&r, 2000, di / 4.0, buf, &ex), LM_OK);
        static char prompt[4096], answer[64], want[64];
        assert_true(decode(buf, ex.len, prompt, answer));
        double depth;
        size_t filler;
        assert_true(solve_passkey(prompt, want, &depth, &filler));
        assert_string_equal(want, answer);
        char what[64];
        snprintf(what, sizeof what, "passkey_at: |depth − %.2f|", di / 4.0);
        tu_check(what, fabs(depth - di / 4.0), 0.02);
    }
    lm_task_example ex;
    expect_error(lm_task_passkey_at(&r, 2000, 1.5, buf, &ex), "depth", NULL);
    free(buf);
}

// ----------------------------------------------------------------------------
// packing

// Checks every row of a task batch; returns the number of mismatched target positions.
static long check_packing(const lm_batch *b, int max_len, long *n_examples) {
    long bad = 0;
    int T = b->T;
    int *mask = lm_malloc((size_t)T * sizeof(int));
    static char prompt[1 << 15], answer[1 << 15];
    int e = 0;
    for (int row = 0; row < b->B; row++) {
        const int *tok = b->tokens + (size_t)row * T, *tgt = b->targets + (size_t)row * T;
        // the mask from the tokens alone: slot t+1 is trained iff we are past a SEP and
        // not yet past its EOS after reading token t
        int in_answer = 0;
        for (int t = 0; t < T; t++) {
            if (tok[t] == LM_TOK_SEP) in_answer = 1;
            else if (tok[t] == LM_TOK_EOS || tok[t] == LM_TOK_BOS || tok[t] == LM_TOK_PAD) in_answer = 0;
            mask[t] = in_answer;
        }
        for (int t = 0; t < T; t++) {
            if (mask[t] != (tgt[t] >= 0)) bad++;
            if (tgt[t] >= 0 && t + 1 < T && tgt[t] != tok[t + 1]) bad++;
        }
        // the listed examples tile the row from 0, then PAD to the end
        int pos = 0;
        for (; e < b->n_ex && b->ex[e].row == row; e++) {
            const lm_example *x = &b->ex[e];
            (*n_examples)++;
            if (x->start != pos || x->len > (max_len ? max_len : T + 1) || x->start + x->len > T + 1) bad++;
            if (x->tgt_start + x->n_tgt != x->start + x->len - 1) bad++;
            // the example read back (its EOS may sit in slot T: only a target)
            int *ex = lm_malloc((size_t)x->len * sizeof(int));
            for (int i = 0; i < x->len; i++) {
                int t = x->start + i;
                ex[i] = t < T ? tok[t] : tgt[T - 1];
            }
            if (!decode(ex, x->len, prompt, answer)) bad++;
            else if ((int)strlen(answer) + 1 != x->n_tgt || ex[x->tgt_start - x->start] != LM_TOK_SEP) bad++;
            free(ex);
            pos += x->len;
        }
        for (int t = pos; t < T; t++) if (tok[t] != LM_TOK_PAD || tgt[t] != -1) bad++;
    }
    if (e != b->n_ex) bad++;
    free(mask);
    return bad;
}

static void test_packing(void **state) {
    (void)state;
    lm_task_mix mix;
    lm_task_mix_default(&mix);
    lm_loader l;
    lm_batch b = {0};
    long n_ex = 0, bad = 0, counted = 0, n_tgt = 0, tokens = 0, pads = 0;
    assert_int_equal(lm_loader_init_tasks(&l, 5, &mix, 0, LM_TOK_VOCAB), LM_OK);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(lm_loader_next(&l, 8, 256, &b), LM_OK);
        bad += check_packing(&b, 0, &n_ex);
        for (int k = 0; k < b.B * b.T; k++) counted += b.targets[k] >= 0, pads += b.tokens[k] == LM_TOK_PAD;
        for (int k = 0; k < b.n_ex; k++) n_tgt += b.ex[k].n_tgt;
        tokens += b.B * b.T;
    }
    printf("packed %ld examples, %.1f%% of positions counted, %.2f%% padding\n", n_ex, 100.0 * counted / tokens,
           100.0 * pads / tokens);
    tu_check("packing: target-mask / example-list mismatches", (double)bad, 0);
    tu_check("packing: Σ example targets − counted targets", fabs((double)(n_tgt - counted)), 0);
    tu_check("packing: padding fraction", (double)pads / tokens, 0.05);   // examples fit the room left
    lm_loader_free(&l);

    // a maximum example length is respected, and the mix frequencies follow the weights
    assert_int_equal(lm_task_mix_parse(&mix, "copy:3,add:1"), LM_OK);
    assert_int_equal(lm_loader_init_tasks(&l, 6, &mix, 24, LM_TOK_VOCAB), LM_OK);
    long per[LM_TASK_COUNT] = {0}, n_open = 0, n_copy_all = 0;
    n_ex = bad = 0;
    for (int i = 0; i < 400; i++) {
        assert_int_equal(lm_loader_next(&l, 8, 128, &b), LM_OK);
        bad += check_packing(&b, 24, &n_ex);
        // where the room left is ≥ 24 both tasks fit and the draw follows the weights;
        // nearer the row's end only the shorter task may fit (by design)
        for (int k = 0; k < b.n_ex; k++) if (b.ex[k].start + 24 <= 129) per[b.ex[k].task]++, n_open++;
        for (int k = 0; k < b.n_ex; k++) n_copy_all += b.ex[k].task == LM_TASK_COPY;
    }
    tu_check("packing (max length 24): mismatches", (double)bad, 0);
    printf("P(copy) over all %ld examples %.4f, over the %ld with room for both tasks %.4f\n", n_ex,
           (double)n_copy_all / n_ex, n_open, (double)per[LM_TASK_COPY] / n_open);
    // weights 3:1 → P(copy) = 0.75 (sampling s.d. ≈ 0.003 over these ~19000 examples)
    tu_check("mix: |P(copy) − 0.75| where both fit", fabs((double)per[LM_TASK_COPY] / n_open - 0.75), 0.015);
    assert_int_equal(per[LM_TASK_COPY] + per[LM_TASK_ADD], n_open);
    lm_loader_free(&l);

    // a task that cannot fit a row is refused by name
    lm_task_mix_default(&mix);
    assert_int_equal(lm_loader_init_tasks(&l, 7, &mix, 0, LM_TOK_VOCAB), LM_OK);
    expect_error(lm_loader_next(&l, 2, 32, &b), "passkey", "at least");
    lm_loader_free(&l);
    expect_error(lm_loader_init_tasks(&l, 7, &mix, 0, 259), "vocab", "259");
    expect_error(lm_loader_init_tasks(&l, 7, &mix, -3, LM_TOK_VOCAB), "length", NULL);
    lm_batch_free(&b);
}

// per-task scoring from per-position predictions and losses
static void test_task_scoring(void **state) {
    (void)state;
    lm_task_mix mix;
    lm_task_mix_default(&mix);
    lm_loader l;
    lm_batch b = {0};
    assert_int_equal(lm_loader_init_tasks(&l, 12, &mix, 0, LM_TOK_VOCAB), LM_OK);
    assert_int_equal(lm_loader_next(&l, 4, 256, &b), LM_OK);
    int n = 4 * 256, *pred = lm_malloc(n * sizeof(int));
    real *loss = tu_alloc(n);
    long per_task[LM_TASK_COUNT] = {0}, tgt_per_task[LM_TASK_COUNT] = {0};
    for (int i = 0; i < n; i++) pred[i] = b.targets[i], loss[i] = b.targets[i] >= 0 ? 0.5 : 100;   // uncounted: ignored
    // a wrong prediction on the last counted target (the EOS) of every other example
    for (int k = 0; k < b.n_ex; k++) {
        const lm_example *x = &b.ex[k];
        per_task[x->task]++;
        tgt_per_task[x->task] += x->n_tgt;
        if (k % 2) pred[x->row * 256 + x->tgt_start + x->n_tgt - 1] = LM_TOK_PAD;
    }
    long want_exact[LM_TASK_COUNT] = {0};
    for (int k = 0; k < b.n_ex; k += 2) want_exact[b.ex[k].task]++;
    lm_task_stat st[LM_TASK_COUNT];
    memset(st, 0, sizeof st);
    lm_task_stats_add(st, &b, loss, pred);
    double err = 0;
    for (int t = 0; t < LM_TASK_COUNT; t++) {
        err += labs(st[t].n - per_task[t]) + labs(st[t].exact - want_exact[t]) + labs(st[t].n_tgt - tgt_per_task[t]);
        if (st[t].n_tgt) err += fabs(st[t].loss_sum / st[t].n_tgt - 0.5);
    }
    tu_check("task scoring: count / exact-match / loss errors", err, 1e-12);
    free(pred);
    free(loss);
    lm_loader_free(&l);
    lm_batch_free(&b);
}

// T = 8192: passkey examples are long-context tests, their filler filling the row
static void test_long_passkey(void **state) {
    (void)state;
    lm_task_mix mix;
    assert_int_equal(lm_task_mix_parse(&mix, "passkey"), LM_OK);
    lm_loader l;
    lm_batch b = {0};
    static char prompt[1 << 15], answer[64], want[64];
    int T = 8192, *ex = lm_malloc((T + 1) * sizeof(int));
    assert_int_equal(lm_loader_init_tasks(&l, 9, &mix, 0, LM_TOK_VOCAB), LM_OK);
    assert_int_equal(lm_loader_next(&l, 4, T, &b), LM_OK);
    assert_int_equal(b.n_ex, 4);   // one per row
    double worst = 0;
    for (int k = 0; k < b.n_ex; k++) {
        const lm_example *x = &b.ex[k];
        for (int i = 0; i < x->len; i++) ex[i] = x->start + i < T ? b.tokens[x->row * T + x->start + i] : b.targets[x->row * T + T - 1];
        assert_true(decode(ex, x->len, prompt, answer));
        double depth;
        size_t filler;
        assert_true(solve_passkey(prompt, want, &depth, &filler));
        assert_string_equal(want, answer);
        worst = tu_worst(worst, 1 - (double)filler / T);
    }
    tu_check("passkey at T=8192: 1 − filler / T (worst row)", worst, 0.02);
    lm_loader_free(&l);

    // with the default mix too, a passkey example takes the room left in its row
    lm_task_mix_default(&mix);
    assert_int_equal(lm_loader_init_tasks(&l, 10, &mix, 0, LM_TOK_VOCAB), LM_OK);
    assert_int_equal(lm_loader_next(&l, 4, T, &b), LM_OK);
    long n_pk = 0, bad = 0, n_ex = 0;
    for (int k = 0; k < b.n_ex; k++) {
        const lm_example *x = &b.ex[k];
        if (x->task != LM_TASK_PASSKEY) continue;
        n_pk++;
        if (T + 1 - (x->start + x->len) > 21) bad++;   // less than one filler sentence left
    }
    assert_true(n_pk >= 1);
    tu_check("default mix at T=8192: passkey examples not filling their row", (double)bad, 0);
    tu_check("default mix at T=8192: packing mismatches", (double)check_packing(&b, 0, &n_ex), 0);
    lm_loader_free(&l);
    lm_batch_free(&b);
    free(ex);
}

// ----------------------------------------------------------------------------
// determinism, held-out, resume

typedef struct { int B, T, n_ex; int *tok, *tgt; lm_example *ex; } saved;

static void save(saved *s, const lm_batch *b) {
    size_t n = (size_t)b->B * b->T;
    s->B = b->B, s->T = b->T, s->n_ex = b->n_ex;
    s->tok = lm_malloc(n * sizeof(int));
    s->tgt = lm_malloc(n * sizeof(int));
    s->ex = lm_malloc((size_t)(b->n_ex + 1) * sizeof(lm_example));
    memcpy(s->tok, b->tokens, n * sizeof(int));
    memcpy(s->tgt, b->targets, n * sizeof(int));
    if (b->n_ex) memcpy(s->ex, b->ex, (size_t)b->n_ex * sizeof(lm_example));
}
static int same(const saved *s, const lm_batch *b) {
    size_t n = (size_t)b->B * b->T;
    return s->B == b->B && s->T == b->T && s->n_ex == b->n_ex && !memcmp(s->tok, b->tokens, n * sizeof(int)) &&
           !memcmp(s->tgt, b->targets, n * sizeof(int)) &&
           (!b->n_ex || !memcmp(s->ex, b->ex, (size_t)b->n_ex * sizeof(lm_example)));
}
static void unsave(saved *s) { free(s->tok); free(s->tgt); free(s->ex); }

typedef lm_status (*make_loader)(lm_loader *l, void *ctx);

// batch shapes change along the stream, as they do across context stages
static int shape_B(int i) { return 2 + i % 3; }
static int shape_T(int i) { return i % 4 == 3 ? 160 : 96; }

// Batches 1..20 straight must equal 1..10, state saved, a fresh loader given the state,
// then 11..20. Returns the number of differing batches.
static int resume_mismatches(make_loader make, void *ctx, int heldout) {
    lm_loader a, c, ha, hc;
    lm_batch b = {0};
    saved ref[20];
    assert_int_equal(make(&a, ctx), LM_OK);
    lm_loader *A = &a;
    if (heldout) { assert_int_equal(lm_loader_init_heldout(&ha, &a), LM_OK); A = &ha; }
    for (int i = 0; i < 20; i++) {
        assert_int_equal(lm_loader_next(A, shape_B(i), shape_T(i), &b), LM_OK);
        save(&ref[i], &b);
    }
    uint64_t st[LM_LOADER_STATE_WORDS];
    lm_loader_rewind(A);   // a rewound loader replays the stream from the start
    for (int i = 0; i < 10; i++) {
        assert_int_equal(lm_loader_next(A, shape_B(i), shape_T(i), &b), LM_OK);
        assert_true(same(&ref[i], &b));
    }
    lm_loader_get_state(A, st);
    if (heldout) lm_loader_free(&ha);
    lm_loader_free(&a);
    assert_int_equal(make(&c, ctx), LM_OK);
    lm_loader *C = &c;
    if (heldout) { assert_int_equal(lm_loader_init_heldout(&hc, &c), LM_OK); C = &hc; }
    assert_int_equal(lm_loader_set_state(C, st), LM_OK);
    int diff = 0;
    for (int i = 10; i < 20; i++) {
        assert_int_equal(lm_loader_next(C, shape_B(i), shape_T(i), &b), LM_OK);
        diff += !same(&ref[i], &b);
    }
    // and the state words after the same 20 batches agree
    uint64_t st2[LM_LOADER_STATE_WORDS];
    lm_loader_get_state(C, st2);
    assert_int_equal(st2[0], st[0]);
    if (heldout) lm_loader_free(&hc);
    lm_loader_free(&c);
    for (int i = 0; i < 20; i++) unsave(&ref[i]);
    lm_batch_free(&b);
    return diff;
}

typedef struct { uint64_t seed; } task_ctx;
static lm_status make_tasks(lm_loader *l, void *ctx) {
    lm_task_mix mix;
    lm_task_mix_default(&mix);
    return lm_loader_init_tasks(l, ((task_ctx *)ctx)->seed, &mix, 0, LM_TOK_VOCAB);
}
static lm_status make_text(lm_loader *l, void *ctx) { return lm_loader_init_text(l, ctx, LM_TOK_VOCAB); }
typedef struct { const char *paths[3]; int n; } shard_ctx;
static lm_status make_shards(lm_loader *l, void *ctx) {
    shard_ctx *s = ctx;
    return lm_loader_init_shards(l, s->paths, s->n, LM_TOK_VOCAB);
}

static void test_determinism_and_heldout(void **state) {
    (void)state;
    task_ctx c1 = {1}, c2 = {2};
    lm_loader a, b2, c, h;
    lm_batch ba = {0}, bb = {0};
    assert_int_equal(make_tasks(&a, &c1), LM_OK);
    assert_int_equal(make_tasks(&b2, &c1), LM_OK);
    assert_int_equal(make_tasks(&c, &c2), LM_OK);
    assert_int_equal(lm_loader_init_heldout(&h, &a), LM_OK);
    int same_seed_diff = 0, other_seed_same = 0, heldout_same_rows = 0;
    long dup = 0, n_h = 0;
    saved sa;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(lm_loader_next(&a, 4, 256, &ba), LM_OK);
        save(&sa, &ba);
        assert_int_equal(lm_loader_next(&b2, 4, 256, &bb), LM_OK);
        same_seed_diff += !same(&sa, &bb);
        assert_int_equal(lm_loader_next(&c, 4, 256, &bb), LM_OK);
        other_seed_same += same(&sa, &bb);
        assert_int_equal(lm_loader_next(&h, 4, 256, &bb), LM_OK);
        for (int r = 0; r < 4; r++)
            heldout_same_rows += !memcmp(sa.tok + r * 256, bb.tokens + r * 256, 256 * sizeof(int));
        // held-out examples that also occur verbatim in the train batch (only tiny ones can)
        for (int k = 0; k < bb.n_ex; k++, n_h++) {
            const lm_example *x = &bb.ex[k];
            if (x->start + x->len > 256) continue;
            for (int j = 0; j < sa.n_ex; j++) {
                const lm_example *y = &sa.ex[j];
                if (y->len == x->len && y->start + y->len <= 256 &&
                    !memcmp(sa.tok + y->row * 256 + y->start, bb.tokens + x->row * 256 + x->start, x->len * sizeof(int))) {
                    dup++;
                    break;
                }
            }
        }
        unsave(&sa);
    }
    tu_check("same seed: differing batches", same_seed_diff, 0);
    tu_check("other seed: identical batches", other_seed_same, 0);
    tu_check("held-out vs train: identical rows", heldout_same_rows, 0);
    tu_check("held-out examples also in the train batch (fraction)", (double)dup / n_h, 0.02);
    char d[256];
    lm_loader_describe(&h, d, sizeof d);
    printf("%s\n", d);
    assert_non_null(strstr(d, "held-out"));
    lm_loader_free(&a); lm_loader_free(&b2); lm_loader_free(&c); lm_loader_free(&h);
    lm_batch_free(&ba); lm_batch_free(&bb);
}

static void test_resume_tasks(void **state) {
    (void)state;
    task_ctx c = {42};
    tu_check("tasks: resumed batches differing (train)", resume_mismatches(make_tasks, &c, 0), 0);
    tu_check("tasks: resumed batches differing (held-out)", resume_mismatches(make_tasks, &c, 1), 0);

    // a state is refused when it does not belong to the loader
    lm_loader l;
    uint64_t st[LM_LOADER_STATE_WORDS], bad[LM_LOADER_STATE_WORDS];
    assert_int_equal(make_tasks(&l, &c), LM_OK);
    lm_loader_get_state(&l, st);
    memcpy(bad, st, sizeof st);
    bad[0] += 1;   // version 2
    expect_error(lm_loader_set_state(&l, bad), "version 2", NULL);
    memcpy(bad, st, sizeof st);
    bad[0] ^= 1ULL << 40;
    expect_error(lm_loader_set_state(&l, bad), "not a linmoe", NULL);
    memcpy(bad, st, sizeof st);
    bad[2] = 7;
    expect_error(lm_loader_set_state(&l, bad), "seed 7", "seed 42");
    memcpy(bad, st, sizeof st);
    bad[15] = 1;
    expect_error(lm_loader_set_state(&l, bad), "corrupt", NULL);
    lm_loader h;
    assert_int_equal(lm_loader_init_heldout(&h, &l), LM_OK);
    expect_error(lm_loader_set_state(&h, st), "training task", "held-out task");
    lm_loader_free(&h);
    lm_loader_free(&l);
}

// ----------------------------------------------------------------------------
// text files

static void test_text_windows(void **state) {
    (void)state;
    // 2000 bytes: the training part (first 1900) letters, the held-out part (last 100) digits
    enum { N = 2000, HELD = N / 20, TRAIN = N - HELD };
    char data[N], path[300];
    lm_rng r;
    lm_rng_seed(&r, 3);
    for (int i = 0; i < N; i++) data[i] = (char)(i < TRAIN ? 'a' + lm_rng_below(&r, 26) : '0' + lm_rng_below(&r, 10));
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    write_bytes(path, data, N);
    lm_loader l, h;
    lm_batch b = {0};
    assert_int_equal(lm_loader_init_text(&l, path, LM_TOK_VOCAB), LM_OK);
    assert_int_equal(lm_loader_init_heldout(&h, &l), LM_OK);
    long wrong = 0, uncounted = 0, leaked = 0;
    uint64_t pos = 0;
    for (int i = 0; i < 40; i++) {   // 40 · 4 · 64 tokens: the 1900-byte part wraps 5 times
        int B = 4, T = 64;
        assert_int_equal(lm_loader_next(&l, B, T, &b), LM_OK);
        for (int row = 0; row < B; row++)
            for (int t = 0; t < T; t++) {
                int want = (unsigned char)data[(pos + (uint64_t)row * T + t) % TRAIN];
                int want_next = (unsigned char)data[(pos + (uint64_t)row * T + t + 1) % TRAIN];
                int tok = b.tokens[row * T + t], tgt = b.targets[row * T + t];
                wrong += tok != want || tgt != want_next;
                uncounted += tgt < 0;
                leaked += isdigit(tok) || isdigit(tgt);
            }
        assert_int_equal(b.n_ex, 0);
        pos = (pos + (uint64_t)B * T) % TRAIN;
    }
    tu_check("text: tokens/targets differing from consecutive windows", (double)wrong, 0);
    tu_check("text: uncounted targets", (double)uncounted, 0);
    tu_check("text: held-out bytes seen in training", (double)leaked, 0);
    long not_held = 0;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(lm_loader_next(&h, 2, 32, &b), LM_OK);
        for (int k = 0; k < 64; k++) not_held += !isdigit(b.tokens[k]) || !isdigit(b.targets[k]);
    }
    tu_check("text: held-out rows reading outside the last 5%", (double)not_held, 0);
    // the held-out part (100 bytes) cannot hold a row of 129
    expect_error(lm_loader_next(&h, 1, 128, &b), "held-out", "T+1 = 129");
    lm_loader_free(&h);
    lm_loader_free(&l);

    tu_check("text: resumed batches differing (train)", resume_mismatches(make_text, path, 0), 0);
    lm_batch_free(&b);
}

static void test_text_errors(void **state) {
    (void)state;
    lm_loader l;
    lm_batch b = {0};
    char path[300];
    snprintf(path, sizeof path, "%s/missing.txt", dir);
    expect_error(lm_loader_init_text(&l, path, LM_TOK_VOCAB), "cannot open", "missing.txt");
    snprintf(path, sizeof path, "%s/empty.txt", dir);
    write_bytes(path, "", 0);
    expect_error(lm_loader_init_text(&l, path, LM_TOK_VOCAB), "empty", "empty.txt");
    expect_error(lm_loader_init_text(&l, dir, LM_TOK_VOCAB), "not a regular file", NULL);
    snprintf(path, sizeof path, "%s/short.txt", dir);
    write_bytes(path, "a short file of thirty bytes..", 30);
    expect_error(lm_loader_init_text(&l, path, 100), "vocab", "256");
    assert_int_equal(lm_loader_init_text(&l, path, LM_TOK_VOCAB), LM_OK);
    expect_error(lm_loader_next(&l, 1, 40, &b), "short.txt", "fewer than one row");
    // 30 bytes: the last ⌊30/20⌋ = 1 is held out, 29 train: rows of up to 29 tokens
    assert_int_equal(lm_loader_next(&l, 1, 28, &b), LM_OK);
    expect_error(lm_loader_next(&l, 1, 29, &b), "training part", "T+1 = 30");
    // a state saved for one file is refused by a loader over another of the same size
    lm_loader other;
    char path2[300];
    snprintf(path2, sizeof path2, "%s/short2.txt", dir);
    write_bytes(path2, "a short file of thirty bytes!!", 30);
    assert_int_equal(lm_loader_init_text(&other, path2, LM_TOK_VOCAB), LM_OK);
    uint64_t st[LM_LOADER_STATE_WORDS];
    lm_loader_get_state(&l, st);
    expect_error(lm_loader_set_state(&other, st), "other data", "short2.txt");
    lm_loader_free(&other);
    lm_loader_free(&l);
    lm_batch_free(&b);
}

// ----------------------------------------------------------------------------
// token shards

static void test_shards(void **state) {
    (void)state;
    // three shards of different lengths; the loader reads them as one stream
    const int len[3] = {1000, 37, 2500};
    uint32_t *all = lm_malloc(4000 * sizeof(uint32_t));
    char paths[3][300];
    shard_ctx sc = {.n = 3};
    lm_rng r;
    lm_rng_seed(&r, 4);
    int total = 0;
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < len[s]; i++) all[total + i] = lm_rng_below(&r, 260);
        snprintf(paths[s], sizeof paths[s], "%s/part%d.lmts", dir, s);
        if (s == 1) {   // the streaming writer, in pieces
            lm_shard_writer w;
            assert_int_equal(lm_shard_writer_open(&w, paths[s], 260), LM_OK);
            assert_int_equal(lm_shard_writer_append(&w, all + total, 10), LM_OK);
            assert_int_equal(lm_shard_writer_append(&w, all + total + 10, len[s] - 10), LM_OK);
            assert_int_equal(lm_shard_writer_close(&w), LM_OK);
        } else {
            assert_int_equal(lm_shard_write(paths[s], all + total, len[s], 260), LM_OK);
        }
        sc.paths[s] = paths[s];
        total += len[s];
    }
    // the file layout, byte by byte
    size_t fsz;
    uint8_t *raw = lm_read_file(paths[1], &fsz);
    assert_non_null(raw);
    assert_int_equal(fsz, LM_SHARD_HEADER + 4 * 37);
    assert_memory_equal(raw, "LMTS", 4);
    assert_int_equal(raw[4] | raw[5] << 8, 1);
    assert_int_equal(raw[8] | raw[9] << 8, 260);
    assert_int_equal(raw[12], 37);
    assert_int_equal(raw[20] | raw[21] << 8, all[1000]);
    free(raw);

    lm_token_data *d;
    assert_int_equal(lm_shards_open(&d, sc.paths, 3, LM_TOK_VOCAB), LM_OK);
    assert_int_equal(d->n_tokens, total);
    int *back = lm_malloc((size_t)total * sizeof(int));
    lm_token_copy(d, 0, total, back);
    long diff = 0;
    for (int i = 0; i < total; i++) diff += back[i] != (int)all[i];
    // a range across both shard boundaries
    lm_token_copy(d, 990, 60, back);
    for (int i = 0; i < 60; i++) diff += back[i] != (int)all[990 + i];
    tu_check("shards: tokens read back differing from those written", (double)diff, 0);
    lm_token_data_release(d);

    // train rows never reach the held-out last 5% (the last 176 tokens), held-out rows only it
    lm_loader l, h;
    lm_batch b = {0};
    assert_int_equal(lm_loader_init_shards(&l, sc.paths, 3, LM_TOK_VOCAB), LM_OK);
    assert_int_equal(lm_loader_init_heldout(&h, &l), LM_OK);
    int held = total / 20, train = total - held;
    uint64_t pos = 0;
    long wrong = 0;
    for (int i = 0; i < 30; i++) {
        assert_int_equal(lm_loader_next(&l, 3, 100, &b), LM_OK);
        for (int row = 0; row < 3; row++)
            for (int t = 0; t < 100; t++) {
                uint64_t at = pos + (uint64_t)row * 100 + t;
                wrong += b.tokens[row * 100 + t] != (int)all[at % train] ||
                         b.targets[row * 100 + t] != (int)all[(at + 1) % train];
            }
        pos = (pos + 300) % train;
    }
    tu_check("shards: train rows differing from consecutive windows of the first 95%", (double)wrong, 0);
    wrong = 0;
    assert_int_equal(lm_loader_next(&h, 2, 50, &b), LM_OK);
    for (int row = 0; row < 2; row++)
        for (int t = 0; t < 50; t++)
            wrong += b.tokens[row * 50 + t] != (int)all[train + (row * 50 + t) % held];
    tu_check("shards: held-out rows differing from the last 5%", (double)wrong, 0);
    lm_loader_free(&h);
    lm_loader_free(&l);
    lm_batch_free(&b);

    tu_check("shards: resumed batches differing (train)", resume_mismatches(make_shards, &sc, 0), 0);
    tu_check("shards: resumed batches differing (held-out)", resume_mismatches(make_shards, &sc, 1), 0);
    // a text-file state does not restore into a shard loader
    char tpath[300];
    snprintf(tpath, sizeof tpath, "%s/corpus2.txt", dir);
    write_bytes(tpath, "some text that is long enough", 29);
    lm_loader t;
    uint64_t st[LM_LOADER_STATE_WORDS];
    assert_int_equal(lm_loader_init_text(&t, tpath, LM_TOK_VOCAB), LM_OK);
    lm_loader_get_state(&t, st);
    assert_int_equal(lm_loader_init_shards(&l, sc.paths, 3, LM_TOK_VOCAB), LM_OK);
    expect_error(lm_loader_set_state(&l, st), "text-file", "token-shard");
    lm_loader_free(&t);
    lm_loader_free(&l);
    free(back);
    free(all);
}

// writes a header + tokens verbatim (no checks), to build broken shards
static void raw_shard(const char *path, const char *magic, uint32_t version, uint32_t vocab, uint64_t n_header,
                      const uint32_t *tok, size_t n, size_t cut) {
    uint8_t *buf = lm_malloc(LM_SHARD_HEADER + 4 * n);
    memcpy(buf, magic, 4);
    for (int i = 0; i < 4; i++) buf[4 + i] = (uint8_t)(version >> 8 * i), buf[8 + i] = (uint8_t)(vocab >> 8 * i);
    for (int i = 0; i < 8; i++) buf[12 + i] = (uint8_t)(n_header >> 8 * i);
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < 4; i++) buf[LM_SHARD_HEADER + 4 * k + i] = (uint8_t)(tok[k] >> 8 * i);
    write_bytes(path, buf, LM_SHARD_HEADER + 4 * n - cut);
    free(buf);
}

static void test_shard_errors(void **state) {
    (void)state;
    uint32_t tok[8] = {1, 2, 3, 200, 5, 6, 7, 8};
    char p[300], good[300];
    const char *one[1] = {p};
    lm_loader l;
    snprintf(good, sizeof good, "%s/good.lmts", dir);
    raw_shard(good, "LMTS", 1, 264, 8, tok, 8, 0);
    assert_int_equal(lm_loader_init_shards(&l, (const char *[]){good}, 1, LM_TOK_VOCAB), LM_OK);
    lm_loader_free(&l);
    snprintf(p, sizeof p, "%s/bad.lmts", dir);
    raw_shard(p, "LMTX", 1, 264, 8, tok, 8, 0);
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "bad magic", "bad.lmts");
    raw_shard(p, "LMTS", 2, 264, 8, tok, 8, 0);
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "version 2", NULL);
    raw_shard(p, "LMTS", 1, 264, 8, tok, 8, 3);
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "does not match its header", "truncated");
    raw_shard(p, "LMTS", 1, 264, 7, tok, 8, 0);   // a trailing token the header does not count
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "does not match its header", NULL);
    raw_shard(p, "LMTS", 1, 264, 8, tok, 8, 4 * 8 + 5);   // 15 bytes: not even a header
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "too short", "header");
    raw_shard(p, "LMTS", 1, 100, 8, tok, 8, 0);   // token 200 with vocab 100
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "token 200 at index 3", "out of range");
    raw_shard(p, "LMTS", 1, 200, 8, tok, 8, 0);   // the boundary: id == vocab is out of range too
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "token 200 at index 3", "vocab 200");
    raw_shard(p, "LMTS", 1, 201, 8, tok, 8, 0);
    assert_int_equal(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), LM_OK);
    lm_loader_free(&l);
    raw_shard(p, "LMTS", 1, 50000, 8, tok, 8, 0);
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "vocab 50000", "model's vocab 264");
    raw_shard(p, "LMTS", 1, 264, 0, tok, 0, 0);
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "no tokens", NULL);
    // one bad file in a list is named
    const char *two[2] = {good, p};
    expect_error(lm_loader_init_shards(&l, two, 2, LM_TOK_VOCAB), "bad.lmts", NULL);
    snprintf(p, sizeof p, "%s/nothere.lmts", dir);
    expect_error(lm_loader_init_shards(&l, one, 1, LM_TOK_VOCAB), "cannot open", "nothere.lmts");
    // the writer refuses out-of-range tokens and leaves no file behind
    snprintf(p, sizeof p, "%s/w.lmts", dir);
    expect_error(lm_shard_write(p, tok, 8, 200), "token 200", "out of range");
    struct stat sb;
    assert_int_not_equal(stat(p, &sb), 0);
    char tmp[340];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", p, (int)getpid());
    assert_int_not_equal(stat(tmp, &sb), 0);
    // too few shard tokens for a row
    assert_int_equal(lm_loader_init_shards(&l, (const char *[]){good}, 1, LM_TOK_VOCAB), LM_OK);
    lm_batch b = {0};
    expect_error(lm_loader_next(&l, 1, 8, &b), "good.lmts", "fewer than one row");
    lm_loader_free(&l);
    lm_batch_free(&b);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/linmoe_data_test_%d", (int)getpid());
    return mkdir(dir, 0755);
}
static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_mix),   cmocka_unit_test(test_task_answers),
        cmocka_unit_test(test_packing),         cmocka_unit_test(test_task_scoring),
        cmocka_unit_test(test_long_passkey),
        cmocka_unit_test(test_determinism_and_heldout), cmocka_unit_test(test_resume_tasks),
        cmocka_unit_test(test_text_windows),    cmocka_unit_test(test_text_errors),
        cmocka_unit_test(test_shards),          cmocka_unit_test(test_shard_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
