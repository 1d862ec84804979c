// tasks.c — the six synthetic task generators (one example each). Packing into rows
// and the task mix live in task_batch.c.
//
// Each generator first decides how big the example may be from max_len (pairs,
// letters, digits, filler sentences), so an example always fits and never has to be
// cut, then writes BOS prompt SEP answer EOS. Answers are computed from the same
// values that were printed into the prompt, so they are derivable from it.
#include "train/tasks.h"
#include "train/tokens.h"
#include <stdarg.h>

static const char *const TASK_NAMES[LM_TASK_COUNT] = {"recall", "copy", "reverse", "add", "passkey", "tool"};

const char *lm_task_name(int task) { return task >= 0 && task < LM_TASK_COUNT ? TASK_NAMES[task] : "?"; }

int lm_task_by_name(const char *name) {
    for (int i = 0; i < LM_TASK_COUNT; i++)
        if (strcmp(name, TASK_NAMES[i]) == 0) return i;
    return -1;
}

// ----------------------------------------------------------------------------
// writing an example: a bounded token buffer

typedef struct { int *out; int n, cap; } emitter;

static void put_tok(emitter *e, int t) {
    LM_ASSERT(e->n < e->cap);   // generators size their examples first; overflow is a bug
    e->out[e->n++] = t;
}
static void put_str(emitter *e, const char *s) {
    while (*s) put_tok(e, (unsigned char)*s++);
}
static void put_fmt(emitter *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_fmt(emitter *e, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    LM_ASSERT(n >= 0 && n < (int)sizeof buf);
    put_str(e, buf);
}
static void put_sep(emitter *e, lm_task_example *ex) {
    ex->sep = e->n;
    put_tok(e, LM_TOK_SEP);
}
static void finish(emitter *e, lm_task_example *ex) {
    put_tok(e, LM_TOK_EOS);
    ex->len = e->n;
    ex->answer_len = ex->len - ex->sep - 2;
}

// uniform integer in [lo, hi]
static int uniform_int(lm_rng *r, int lo, int hi) {
    LM_ASSERT(lo <= hi);
    return lo + (int)lm_rng_below(r, (uint32_t)(hi - lo + 1));
}

// ----------------------------------------------------------------------------
// recall: n distinct two-letter keys with two-digit values, then one queried key.
// An example with n pairs is BOS + "kk=vv" joined by spaces (6n−1) + " ?kk" + SEP +
// "vv" + EOS = 6n + 8 tokens, so n grows with the allowed length up to all 676 keys.

#define RECALL_KEYS 676
#define RECALL_LEN(n) (6 * (n) + 8)

static void gen_recall(lm_rng *r, int max_len, emitter *e, lm_task_example *ex) {
    int n_max = lm_min(RECALL_KEYS, (max_len - 8) / 6);
    int n = uniform_int(r, lm_min(2, n_max), n_max);
    // distinct keys: the first n slots of a partial Fisher–Yates shuffle of all keys
    int keys[RECALL_KEYS], vals[RECALL_KEYS];
    for (int i = 0; i < RECALL_KEYS; i++) keys[i] = i;
    for (int i = 0; i < n; i++) {
        int j = uniform_int(r, i, RECALL_KEYS - 1);
        int t = keys[i]; keys[i] = keys[j]; keys[j] = t;
        vals[i] = (int)lm_rng_below(r, 100);
    }
    int q = (int)lm_rng_below(r, (uint32_t)n);
    put_tok(e, LM_TOK_BOS);
    for (int i = 0; i < n; i++)
        put_fmt(e, "%s%c%c=%02d", i ? " " : "", 'a' + keys[i] / 26, 'a' + keys[i] % 26, vals[i]);
    put_fmt(e, " ?%c%c", 'a' + keys[q] / 26, 'a' + keys[q] % 26);
    put_sep(e, ex);
    put_fmt(e, "%02d", vals[q]);
    finish(e, ex);
}

// ----------------------------------------------------------------------------
// copy / reverse: a prefix, n random lowercase letters → the same letters, forwards
// or backwards. Length = 1 + prefix + n + 1 + n + 1.

#define LETTERS_MIN 4
#define LETTERS_MAX 32

static void gen_letters(lm_rng *r, int max_len, emitter *e, lm_task_example *ex, const char *prefix, int rev) {
    int fixed = (int)strlen(prefix) + 3;
    int n_max = lm_min(LETTERS_MAX, (max_len - fixed) / 2);
    int n = uniform_int(r, lm_min(LETTERS_MIN, n_max), n_max);
    char s[LETTERS_MAX];
    for (int i = 0; i < n; i++) s[i] = (char)('a' + lm_rng_below(r, 26));
    put_tok(e, LM_TOK_BOS);
    put_str(e, prefix);
    for (int i = 0; i < n; i++) put_tok(e, (unsigned char)s[i]);
    put_sep(e, ex);
    for (int i = 0; i < n; i++) put_tok(e, (unsigned char)s[rev ? n - 1 - i : i]);
    finish(e, ex);
}

// ----------------------------------------------------------------------------
// add: "a+b=" → a + b, each operand with a digit count uniform in 1..d_max (≤ 8) and
// uniform over the numbers of that many digits. Length = da + db + digits(sum) + 5
// ≤ 3·d + 6 when both operands have at most d digits.

#define ADD_DIGITS_MAX 8

static uint64_t random_with_digits(lm_rng *r, int d) {
    if (d == 1) return lm_rng_below(r, 10);
    uint64_t x = 1 + lm_rng_below(r, 9);   // no leading zero
    for (int i = 1; i < d; i++) x = 10 * x + lm_rng_below(r, 10);
    return x;
}

static void gen_add(lm_rng *r, int max_len, emitter *e, lm_task_example *ex) {
    int d_max = lm_min(ADD_DIGITS_MAX, (max_len - 6) / 3);
    uint64_t a = random_with_digits(r, uniform_int(r, 1, d_max));
    uint64_t b = random_with_digits(r, uniform_int(r, 1, d_max));
    put_tok(e, LM_TOK_BOS);
    put_fmt(e, "%llu+%llu=", (unsigned long long)a, (unsigned long long)b);
    put_sep(e, ex);
    put_fmt(e, "%llu", (unsigned long long)(a + b));
    finish(e, ex);
}

// ----------------------------------------------------------------------------
// passkey: filler sentences (cycled from a random one) with the key sentence inserted
// between two of them, then the question. The filler takes all the room there is, so
// the example is as long as allowed: a long-context test once rows get long.

static const char *const FILLER[] = {
    "The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ", "There and back again. ",
};
#define N_FILLER ((int)(sizeof FILLER / sizeof FILLER[0]))
#define PASSKEY_NEEDLE "The pass key is %05u. Remember it. "
#define PASSKEY_NEEDLE_LEN 36   // with the 5-digit key
#define PASSKEY_QUESTION "What is the pass key?"
#define PASSKEY_FIXED (1 + PASSKEY_NEEDLE_LEN + (int)sizeof PASSKEY_QUESTION - 1 + 1 + 5 + 1)

// depth < 0: random sentence boundary; else the boundary nearest depth·(sentences)
static void gen_passkey(lm_rng *r, int max_len, double depth, emitter *e, lm_task_example *ex) {
    unsigned key = 10000 + lm_rng_below(r, 90000);
    int first = (int)lm_rng_below(r, N_FILLER);
    int room = max_len - PASSKEY_FIXED, n_sent = 0;
    for (int used = 0;; n_sent++) {
        int l = (int)strlen(FILLER[(first + n_sent) % N_FILLER]);
        if (used + l > room) break;
        used += l;
    }
    int at = depth < 0 ? uniform_int(r, 0, n_sent) : (int)lround(depth * n_sent);
    put_tok(e, LM_TOK_BOS);
    for (int i = 0; i <= n_sent; i++) {
        if (i == at) put_fmt(e, PASSKEY_NEEDLE, key);
        if (i < n_sent) put_str(e, FILLER[(first + i) % N_FILLER]);
    }
    put_str(e, PASSKEY_QUESTION);
    put_sep(e, ex);
    put_fmt(e, "%05u", key);
    finish(e, ex);
}

// ----------------------------------------------------------------------------
// tool: a request in words → the one tool call that serves it. The mapping from a unit
// name to its code and the zero-padding of the hour are fixed conventions of the task,
// the same in every example, so the answer follows from the prompt.

static const char *const CITIES[] = {
    "paris", "tokyo", "london", "berlin", "madrid", "rome", "cairo", "lima", "oslo", "delhi",
    "seoul", "sydney", "toronto", "nairobi", "dubai", "moscow", "boston", "austin", "denver", "lagos",
};
static const char *const WORDS[] = {
    "cheap", "flights", "pasta", "recipes", "running", "shoes", "jazz", "concerts", "used", "bikes",
    "python", "books", "garden", "tools", "hiking", "trails", "vegan", "bakery", "chess", "openings",
};
static const char *const CHORES[] = {
    "call mom", "buy milk", "pay rent", "water plants", "walk the dog", "take pills", "check mail", "stretch",
};
typedef struct { const char *code, *name; int group; } unit;
static const unit UNITS[] = {   // groups: length, mass, temperature, volume
    {"km", "kilometers", 0}, {"mi", "miles", 0}, {"m", "meters", 0}, {"ft", "feet", 0},
    {"kg", "kilograms", 1}, {"lb", "pounds", 1}, {"g", "grams", 1},
    {"c", "celsius", 2}, {"f", "fahrenheit", 2},
    {"l", "liters", 3}, {"gal", "gallons", 3},
};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum { TOOL_WEATHER, TOOL_TIME, TOOL_CONVERT, TOOL_SEARCH, TOOL_REMIND, TOOL_TEMPLATES };
typedef struct { int tmpl; const char *s1, *s2, *s3; int n1, n2; } tool_call;

// prompt and answer text of a call; returns the example length in tokens
static int tool_text(const tool_call *c, char *prompt, char *answer, size_t cap) {
    int p = 0, a = 0;
    switch (c->tmpl) {
    case TOOL_WEATHER:
        p = snprintf(prompt, cap, "weather in %s?", c->s1);
        a = snprintf(answer, cap, "<call>weather(\"%s\")</call>", c->s1);
        break;
    case TOOL_TIME:
        p = snprintf(prompt, cap, "time in %s?", c->s1);
        a = snprintf(answer, cap, "<call>time(\"%s\")</call>", c->s1);
        break;
    case TOOL_CONVERT:   // s1 = source code, s2 = target name, s3 = target code
        p = snprintf(prompt, cap, "%d %s in %s?", c->n1, c->s1, c->s2);
        a = snprintf(answer, cap, "<call>convert(%d,\"%s\",\"%s\")</call>", c->n1, c->s1, c->s3);
        break;
    case TOOL_SEARCH:
        p = snprintf(prompt, cap, "search for %s %s", c->s1, c->s2);
        a = snprintf(answer, cap, "<call>search(\"%s %s\")</call>", c->s1, c->s2);
        break;
    case TOOL_REMIND:
        p = snprintf(prompt, cap, "remind me at %d:%02d to %s", c->n1, c->n2, c->s1);
        a = snprintf(answer, cap, "<call>remind(\"%02d:%02d\",\"%s\")</call>", c->n1, c->n2, c->s1);
        break;
    default: LM_ASSERT(0);
    }
    LM_ASSERT(p > 0 && a > 0 && (size_t)p < cap && (size_t)a < cap);
    return p + a + 3;
}

static const char *longest(const char *const *list, int n) {
    const char *best = list[0];
    for (int i = 1; i < n; i++)
        if (strlen(list[i]) > strlen(best)) best = list[i];
    return best;
}

// An upper bound on any tool example's length: each template filled with the longest
// entry of every list it draws from (chosen independently) and the widest numbers.
static int tool_max_len(void) {
    const char *unit_codes[COUNT(UNITS)], *unit_names[COUNT(UNITS)];
    for (int i = 0; i < COUNT(UNITS); i++) unit_codes[i] = UNITS[i].code, unit_names[i] = UNITS[i].name;
    const char *city = longest(CITIES, COUNT(CITIES)), *word = longest(WORDS, COUNT(WORDS));
    const char *code = longest(unit_codes, COUNT(UNITS)), *name = longest(unit_names, COUNT(UNITS));
    const tool_call worst[TOOL_TEMPLATES] = {
        {TOOL_WEATHER, city, 0, 0, 0, 0}, {TOOL_TIME, city, 0, 0, 0, 0},
        {TOOL_CONVERT, code, name, code, 999, 0}, {TOOL_SEARCH, word, word, 0, 0, 0},
        {TOOL_REMIND, longest(CHORES, COUNT(CHORES)), 0, 0, 23, 59},
    };
    char p[256], a[256];
    int m = 0;
    for (int t = 0; t < TOOL_TEMPLATES; t++) m = lm_max(m, tool_text(&worst[t], p, a, sizeof p));
    return m;
}

static void gen_tool(lm_rng *r, emitter *e, lm_task_example *ex) {
    tool_call c = {.tmpl = (int)lm_rng_below(r, TOOL_TEMPLATES)};
    switch (c.tmpl) {
    case TOOL_WEATHER:
    case TOOL_TIME: c.s1 = CITIES[lm_rng_below(r, COUNT(CITIES))]; break;
    case TOOL_CONVERT: {
        int src = (int)lm_rng_below(r, COUNT(UNITS)), n_other = 0, other[COUNT(UNITS)];
        for (int i = 0; i < COUNT(UNITS); i++)
            if (i != src && UNITS[i].group == UNITS[src].group) other[n_other++] = i;
        const unit *dst = &UNITS[other[lm_rng_below(r, (uint32_t)n_other)]];
        c.n1 = uniform_int(r, 1, 999);
        c.s1 = UNITS[src].code, c.s2 = dst->name, c.s3 = dst->code;
        break;
    }
    case TOOL_SEARCH:
        c.s1 = WORDS[lm_rng_below(r, COUNT(WORDS))];
        c.s2 = WORDS[lm_rng_below(r, COUNT(WORDS))];
        break;
    case TOOL_REMIND:
        c.n1 = uniform_int(r, 0, 23), c.n2 = uniform_int(r, 0, 59);
        c.s1 = CHORES[lm_rng_below(r, COUNT(CHORES))];
        break;
    }
    char p[256], a[256];
    tool_text(&c, p, a, sizeof p);
    put_tok(e, LM_TOK_BOS);
    put_str(e, p);
    put_sep(e, ex);
    put_str(e, a);
    finish(e, ex);
}

// ----------------------------------------------------------------------------

int lm_task_min_len(int task) {
    switch (task) {
    case LM_TASK_RECALL: return RECALL_LEN(1);
    case LM_TASK_COPY: return (int)strlen("copy:") + 5;     // one letter
    case LM_TASK_REVERSE: return (int)strlen("rev:") + 5;
    case LM_TASK_ADD: return 3 * 1 + 6;                     // "9+9=" → "18"
    case LM_TASK_PASSKEY: return PASSKEY_FIXED;             // no filler
    case LM_TASK_TOOL: return tool_max_len();   // a few snprintf calls; callers cache it
    default: return -1;
    }
}

static lm_status check_room(int task, int max_len) {
    if (task < 0 || task >= LM_TASK_COUNT) { lm_set_error("unknown task id %d", task); return LM_ERR; }
    if (max_len < lm_task_min_len(task)) {
        lm_set_error("task '%s' needs at least %d tokens per example, got %d", lm_task_name(task),
                     lm_task_min_len(task), max_len);
        return LM_ERR;
    }
    return LM_OK;
}

lm_status lm_task_generate(int task, lm_rng *r, int max_len, int *out, lm_task_example *ex) {
    if (check_room(task, max_len) != LM_OK) return LM_ERR;
    emitter e = {out, 0, max_len};
    memset(ex, 0, sizeof *ex);
    ex->task = task;
    switch (task) {
    case LM_TASK_RECALL: gen_recall(r, max_len, &e, ex); break;
    case LM_TASK_COPY: gen_letters(r, max_len, &e, ex, "copy:", 0); break;
    case LM_TASK_REVERSE: gen_letters(r, max_len, &e, ex, "rev:", 1); break;
    case LM_TASK_ADD: gen_add(r, max_len, &e, ex); break;
    case LM_TASK_PASSKEY: gen_passkey(r, max_len, -1, &e, ex); break;
    case LM_TASK_TOOL: gen_tool(r, &e, ex); break;
    }
    return LM_OK;
}

lm_status lm_task_passkey_at(lm_rng *r, int max_len, double depth, int *out, lm_task_example *ex) {
    if (check_room(LM_TASK_PASSKEY, max_len) != LM_OK) return LM_ERR;
    if (!(depth >= 0 && depth <= 1)) { lm_set_error("passkey depth %g is not in [0, 1]", depth); return LM_ERR; }
    emitter e = {out, 0, max_len};
    memset(ex, 0, sizeof *ex);
    ex->task = LM_TASK_PASSKEY;
    gen_passkey(r, max_len, depth, &e, ex);
    return LM_OK;
}
