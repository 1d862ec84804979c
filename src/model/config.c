// config.c — presets, validation, JSON round trip and parameter counting.
#include "model/config.h"
#include "model/params.h"
#include "ops.h"
#include <cjson/cJSON.h>
#include <ctype.h>

static const char *BALANCE_NAMES[] = {"qb", "sign", "quartile", "aux", "none"};   // lm_balance_kind order
static const char *RESIDUAL_NAMES[] = {"block", "full", "prenorm"};
static const char *GATE_NAMES[] = {"bounded", "unbounded"};
static const char *ACT_NAMES[] = {"swiglu", "situ"};
static const char *FORM_NAMES[] = {"auto", "naive", "chunk_factored", "chunk_exact"};

static int name_index(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const char *lm_residual_name(int m) { return m >= 0 && m < COUNT(RESIDUAL_NAMES) ? RESIDUAL_NAMES[m] : "?"; }
int lm_residual_from_name(const char *s) { return name_index(RESIDUAL_NAMES, COUNT(RESIDUAL_NAMES), s); }

// ----------------------------------------------------------------------------
// presets

static void defaults(lm_config *c) {
    memset(c, 0, sizeof *c);
    c->norm_eps = 1e-5;
    c->init_std = 0.02;
    c->mla_period = 4;
    c->mla_last = 1;
    c->first_dense = 1;
    c->kda_conv = 4;
    c->gate_mode = LM_GATE_BOUNDED;
    c->gate_lb = -5;
    c->kda_chunk = 64;
    c->kda_form = LM_KDA_AUTO;
    c->mla_gated = 1;
    c->route_scale = 1;
    c->expert_act = LM_ACT_SWIGLU;
    c->balance = 0;               // qb
    c->qb_bins = 1024;
    c->balance_rate = 1e-3;
    c->aux_coef = 1e-2;
    c->residual = LM_RES_BLOCK;
    c->block_layers = 2;
    c->seq_len = 256;
}

lm_status lm_config_preset(lm_config *c, const char *name) {
    defaults(c);
    if (strcmp(name, "tiny") == 0) {
        // CPU default: byte vocabulary (256 bytes + 8 special tokens), KKKM
        c->vocab = 264; c->d_model = 128; c->n_layers = 4;
        c->kda_heads = 2; c->kda_head_dim = 64;
        c->mla_heads = 4; c->kv_lora_rank = 64; c->qk_nope_dim = 32; c->qk_extra_dim = 16; c->v_head_dim = 32;
        c->d_ff_dense = 384;
        c->n_experts = 16; c->top_k = 2; c->n_shared = 1; c->d_ff_expert = 64;
        c->block_layers = 2;
        c->seq_len = 256;
    } else if (strcmp(name, "small") == 0) {
        // one-GPU research size, ~1B total / ~150M active
        c->vocab = 264; c->d_model = 1024; c->n_layers = 16;
        c->kda_heads = 8; c->kda_head_dim = 128;
        c->mla_heads = 8; c->kv_lora_rank = 256; c->qk_nope_dim = 128; c->qk_extra_dim = 64; c->v_head_dim = 128;
        c->d_ff_dense = 4096;
        c->n_experts = 80; c->top_k = 4; c->n_shared = 1; c->d_ff_expert = 256;
        c->block_layers = 4;
        c->seq_len = 4096;
    } else if (strcmp(name, "kimi-linear-48b-a3b") == 0) {
        // the released Kimi Linear config (HF moonshotai/Kimi-Linear-48B-A3B-Instruct)
        c->vocab = 163840; c->d_model = 2304; c->n_layers = 27;
        c->kda_heads = 32; c->kda_head_dim = 128; c->gate_mode = LM_GATE_UNBOUNDED;
        c->mla_heads = 32; c->kv_lora_rank = 512; c->qk_nope_dim = 128; c->qk_extra_dim = 64; c->v_head_dim = 128;
        c->mla_gated = 0;
        c->d_ff_dense = 9216;
        c->n_experts = 256; c->top_k = 8; c->n_shared = 1; c->d_ff_expert = 1024; c->route_scale = 2.446;
        c->residual = LM_RES_PRENORM;
        c->seq_len = 4096;
    } else if (strcmp(name, "k3") == 0) {
        // the seeds' 2.8T model (Kimi K3): for planning only
        c->vocab = 163840; c->d_model = 7168; c->n_layers = 93;
        c->kda_heads = 96; c->kda_head_dim = 128; c->kda_full_rank_gate = 1;
        c->mla_heads = 96; c->q_lora_rank = 1536; c->kv_lora_rank = 512;
        c->qk_nope_dim = 128; c->qk_extra_dim = 64; c->v_head_dim = 128;
        c->d_ff_dense = 33792;
        c->n_experts = 896; c->top_k = 16; c->n_shared = 2; c->d_ff_expert = 3072; c->moe_latent_dim = 3584;
        c->expert_act = LM_ACT_SITU;
        c->block_layers = 12;
        c->seq_len = 8192;
    } else {
        lm_set_error("unknown preset '%s' (known: tiny, small, kimi-linear-48b-a3b, k3)", name);
        return LM_ERR;
    }
    snprintf(c->name, sizeof c->name, "%s", name);
    return LM_OK;
}

// ----------------------------------------------------------------------------
// validation

#define REQUIRE(cond, ...) do { if (!(cond)) { lm_set_error("config: " __VA_ARGS__); return LM_ERR; } } while (0)

// Upper limits on single fields, far above any real model: they keep every tensor
// dimension and per-layer product inside int arithmetic (a bad --set fails here with
// one line instead of overflowing later).
#define CAP(field, hi) REQUIRE(c->field <= (hi), #field " (%d) must be at most %d", c->field, (hi))

lm_status lm_config_finalize(lm_config *c) {
    REQUIRE(c->vocab >= 2, "vocab (%d) must be at least 2", c->vocab);
    REQUIRE(c->d_model >= 1, "d_model (%d) must be positive", c->d_model);
    CAP(vocab, 1 << 22); CAP(d_model, 1 << 16); CAP(kda_heads, 4096); CAP(mla_heads, 4096);
    CAP(kv_lora_rank, 1 << 16); CAP(q_lora_rank, 1 << 16); CAP(qk_nope_dim, 4096); CAP(qk_extra_dim, 4096);
    CAP(v_head_dim, 4096); CAP(d_ff_dense, 1 << 20); CAP(d_ff_expert, 1 << 20); CAP(n_experts, 1 << 16);
    CAP(n_shared, 1024); CAP(moe_latent_dim, 1 << 16); CAP(qb_bins, 1 << 16); CAP(block_layers, LM_MAX_LAYERS);
    CAP(seq_len, 1 << 24);
    REQUIRE(c->n_experts >= 0, "n_experts (%d) must be >= 0 (0 = dense FFN layers)", c->n_experts);
    REQUIRE(isfinite(c->norm_eps) && isfinite(c->init_std) && isfinite(c->route_scale) && isfinite(c->gate_lb) &&
                isfinite(c->balance_rate) && isfinite(c->aux_coef) && isfinite(c->zloss_coef) &&
                isfinite(c->capacity_factor),
            "config values must be finite numbers");
    REQUIRE(c->n_layers >= 1 && c->n_layers <= LM_MAX_LAYERS, "n_layers (%d) must be in [1, %d]", c->n_layers,
            LM_MAX_LAYERS);
    REQUIRE(c->norm_eps > 0, "norm_eps must be positive");
    REQUIRE(c->init_std > 0, "init_std must be positive");
    // layer schedule
    if (c->layer_types[0]) {
        REQUIRE((int)strlen(c->layer_types) == c->n_layers, "layer_types has %d entries but n_layers is %d",
                (int)strlen(c->layer_types), c->n_layers);
        for (int i = 0; i < c->n_layers; i++)
            REQUIRE(c->layer_types[i] == 'K' || c->layer_types[i] == 'M',
                    "layer_types[%d] is '%c' (use K for KDA, M for MLA)", i, c->layer_types[i]);
    } else {
        REQUIRE(c->mla_period >= 0, "mla_period (%d) must be >= 0", c->mla_period);
        for (int i = 0; i < c->n_layers; i++) {
            int mla = (c->mla_period > 0 && (i + 1) % c->mla_period == 0) || (c->mla_last && i == c->n_layers - 1);
            c->layer_types[i] = mla ? 'M' : 'K';
        }
        c->layer_types[c->n_layers] = 0;
    }
    int n_kda = 0, n_mla = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (c->layer_types[i] == 'M') n_mla++;
        else n_kda++;
    }
    if (n_kda) {
        REQUIRE(c->kda_heads >= 1, "kda_heads (%d) must be positive", c->kda_heads);
        if (c->kda_head_dim == 0) {
            REQUIRE(c->d_model % c->kda_heads == 0,
                    "kda_heads (%d) must divide d_model (%d) when kda_head_dim is not set", c->kda_heads, c->d_model);
            c->kda_head_dim = c->d_model / c->kda_heads;
        }
        REQUIRE(c->kda_head_dim >= 1 && c->kda_head_dim <= 256, "kda_head_dim (%d) must be in [1, 256]", c->kda_head_dim);
        REQUIRE(c->kda_conv >= 1 && c->kda_conv <= 8, "kda_conv (%d) must be in [1, 8]", c->kda_conv);
        REQUIRE(c->gate_mode == LM_GATE_BOUNDED || c->gate_mode == LM_GATE_UNBOUNDED, "gate_mode must be bounded or unbounded");
        if (c->gate_mode == LM_GATE_BOUNDED)
            REQUIRE(c->gate_lb >= -5 && c->gate_lb < 0, "gate_lb (%g) must be in [-5, 0)", (double)c->gate_lb);
        REQUIRE(c->kda_chunk == 16 || c->kda_chunk == 32 || c->kda_chunk == 64, "kda_chunk (%d) must be 16, 32 or 64", c->kda_chunk);
        REQUIRE(c->kda_form >= LM_KDA_AUTO && c->kda_form <= LM_KDA_CHUNK_EXACT, "kda_form is not a known form");
        REQUIRE(!(c->gate_mode == LM_GATE_UNBOUNDED && c->kda_form == LM_KDA_CHUNK_FACTORED),
                "kda_form chunk_factored needs the bounded gate (the unbounded gate overflows e^{-G})");
    }
    if (n_mla) {
        REQUIRE(c->mla_heads >= 1, "mla_heads (%d) must be positive", c->mla_heads);
        REQUIRE(c->kv_lora_rank >= 1, "kv_lora_rank (%d) must be positive", c->kv_lora_rank);
        REQUIRE(c->q_lora_rank >= 0, "q_lora_rank (%d) must be >= 0", c->q_lora_rank);
        REQUIRE(c->qk_nope_dim >= 1, "qk_nope_dim (%d) must be positive", c->qk_nope_dim);
        REQUIRE(c->qk_extra_dim >= 0, "qk_extra_dim (%d) must be >= 0", c->qk_extra_dim);
        REQUIRE(c->v_head_dim >= 1, "v_head_dim (%d) must be positive", c->v_head_dim);
    }
    REQUIRE(c->first_dense >= 0, "first_dense (%d) must be >= 0", c->first_dense);
    if (c->first_dense > 0 || c->n_experts == 0) REQUIRE(c->d_ff_dense >= 1, "d_ff_dense (%d) must be positive", c->d_ff_dense);
    if (c->n_experts > 0 && c->first_dense < c->n_layers) {
        REQUIRE(c->top_k >= 1, "top_k (%d) must be positive", c->top_k);
        REQUIRE(c->top_k <= c->n_experts, "top_k (%d) must not exceed n_experts (%d)", c->top_k, c->n_experts);
        REQUIRE(c->d_ff_expert >= 1, "d_ff_expert (%d) must be positive", c->d_ff_expert);
        REQUIRE(c->n_shared >= 0, "n_shared (%d) must be >= 0", c->n_shared);
        REQUIRE(c->moe_latent_dim >= 0, "moe_latent_dim (%d) must be >= 0", c->moe_latent_dim);
        REQUIRE(c->route_scale > 0, "route_scale must be positive");
        REQUIRE(c->expert_act == LM_ACT_SWIGLU || c->expert_act == LM_ACT_SITU, "expert_act must be swiglu or situ");
        REQUIRE(c->balance >= 0 && c->balance < COUNT(BALANCE_NAMES), "balance is not a known strategy");
        REQUIRE(c->qb_bins >= 16, "qb_bins (%d) must be at least 16", c->qb_bins);
        REQUIRE(c->balance_rate >= 0, "balance_rate must be >= 0");
        REQUIRE(c->aux_coef >= 0, "aux_coef must be >= 0");
        REQUIRE(c->zloss_coef >= 0, "zloss_coef must be >= 0");
        REQUIRE(c->capacity_factor >= 0, "capacity_factor must be >= 0 (0 = dropless)");
        REQUIRE(c->capacity_relax_steps >= 0, "capacity_relax_steps must be >= 0");
    }
    REQUIRE(c->residual >= LM_RES_BLOCK && c->residual <= LM_RES_PRENORM, "residual must be block, full or prenorm");
    if (c->residual == LM_RES_BLOCK) REQUIRE(c->block_layers >= 1, "block_layers (%d) must be positive", c->block_layers);
    REQUIRE(c->seq_len >= 1, "seq_len (%d) must be positive", c->seq_len);
    double tot, act;
    lm_config_count_params(c, &tot, &act);
    REQUIRE(tot <= 1e14, "the model would have %.3g parameters (more than 10^14)", tot);
    return LM_OK;
}

// ----------------------------------------------------------------------------
// JSON: one table drives serialisation, parsing and --set overrides

typedef enum { F_INT, F_REAL, F_STR, F_ENUM } field_kind;
typedef struct {
    const char *key;
    field_kind kind;
    size_t off;
    const char *const *names;  // F_ENUM
    int n_names;
    size_t size;               // F_STR buffer size
} field;

#define FI(k) {#k, F_INT, offsetof(lm_config, k), NULL, 0, 0}
#define FR(k) {#k, F_REAL, offsetof(lm_config, k), NULL, 0, 0}
#define FE(k, names) {#k, F_ENUM, offsetof(lm_config, k), names, COUNT(names), 0}
#define FS(k) {#k, F_STR, offsetof(lm_config, k), NULL, 0, sizeof(((lm_config *)0)->k)}

static const field FIELDS[] = {
    FS(name), FI(vocab), FI(d_model), FI(n_layers), FR(norm_eps), FR(init_std), FI(tie_embeddings), FI(seq_len),
    FI(mla_period), FI(mla_last), FS(layer_types), FI(first_dense),
    FI(kda_heads), FI(kda_head_dim), FI(kda_conv), FE(gate_mode, GATE_NAMES), FR(gate_lb), FI(kda_chunk),
    FE(kda_form, FORM_NAMES), FI(kda_full_rank_gate),
    FI(mla_heads), FI(q_lora_rank), FI(kv_lora_rank), FI(qk_nope_dim), FI(qk_extra_dim), FI(v_head_dim), FI(mla_gated),
    FI(d_ff_dense), FI(n_experts), FI(top_k), FI(n_shared), FI(d_ff_expert), FI(moe_latent_dim), FR(route_scale),
    FE(expert_act, ACT_NAMES),
    FE(balance, BALANCE_NAMES), FI(qb_bins), FR(balance_rate), FR(aux_coef), FR(zloss_coef),
    FR(capacity_factor), FI(capacity_relax_steps),
    FE(residual, RESIDUAL_NAMES), FI(block_layers),
};

char *lm_config_to_json(const lm_config *c) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < COUNT(FIELDS); i++) {
        const field *f = &FIELDS[i];
        const char *p = (const char *)c + f->off;
        switch (f->kind) {
        case F_INT: cJSON_AddNumberToObject(o, f->key, *(const int *)p); break;
        case F_REAL: cJSON_AddNumberToObject(o, f->key, (double)*(const real *)p); break;
        case F_STR: cJSON_AddStringToObject(o, f->key, p); break;
        case F_ENUM: {
            int v = *(const int *)p;
            cJSON_AddStringToObject(o, f->key, v >= 0 && v < f->n_names ? f->names[v] : "?");
        } break;
        }
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static const field *find_field(const char *key) {
    for (int i = 0; i < COUNT(FIELDS); i++)
        if (strcmp(FIELDS[i].key, key) == 0) return &FIELDS[i];
    return NULL;
}

static lm_status set_enum(lm_config *c, const field *f, const char *v) {
    int idx = name_index(f->names, f->n_names, v);
    if (idx < 0) {
        char known[256] = "";
        for (int i = 0; i < f->n_names; i++) {
            strncat(known, f->names[i], sizeof known - strlen(known) - 1);
            if (i + 1 < f->n_names) strncat(known, ", ", sizeof known - strlen(known) - 1);
        }
        lm_set_error("config: %s '%s' is not one of: %s", f->key, v, known);
        return LM_ERR;
    }
    *(int *)((char *)c + f->off) = idx;
    return LM_OK;
}

lm_status lm_config_apply_json(lm_config *c, const char *json) {
    cJSON *o = cJSON_Parse(json);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        lm_set_error("config: not a JSON object");
        return LM_ERR;
    }
    lm_status st = LM_OK;
    for (cJSON *it = o->child; it && st == LM_OK; it = it->next) {
        const field *f = find_field(it->string);
        if (!f) { lm_set_error("config: unknown key '%s'", it->string); st = LM_ERR; break; }
        char *p = (char *)c + f->off;
        switch (f->kind) {
        case F_INT:
            if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int)it->valuedouble) {
                lm_set_error("config: %s must be an integer", f->key); st = LM_ERR;
            } else *(int *)p = (int)it->valuedouble;
            break;
        case F_REAL:
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || !isfinite((real)it->valuedouble)) {
                lm_set_error("config: %s must be a finite number", f->key);
                st = LM_ERR;
            }
            else *(real *)p = (real)it->valuedouble;
            break;
        case F_STR:
            if (!cJSON_IsString(it) || strlen(it->valuestring) >= f->size) {
                lm_set_error("config: %s must be a string shorter than %zu", f->key, f->size); st = LM_ERR;
            } else snprintf(p, f->size, "%s", it->valuestring);
            break;
        case F_ENUM:
            if (!cJSON_IsString(it)) { lm_set_error("config: %s must be a string", f->key); st = LM_ERR; }
            else st = set_enum(c, f, it->valuestring);
            break;
        }
    }
    cJSON_Delete(o);
    return st;
}

lm_status lm_config_set(lm_config *c, const char *key, const char *value) {
    const field *f = find_field(key);
    if (!f) { lm_set_error("config: unknown key '%s'", key); return LM_ERR; }
    char *p = (char *)c + f->off, *end;
    switch (f->kind) {
    case F_INT: {
        long v = strtol(value, &end, 10);
        if (!*value || *end || v != (int)v) { lm_set_error("config: %s expects an integer, got '%s'", key, value); return LM_ERR; }
        *(int *)p = (int)v;
    } break;
    case F_REAL: {
        double v = strtod(value, &end);
        if (!*value || *end || !isfinite(v)) { lm_set_error("config: %s expects a number, got '%s'", key, value); return LM_ERR; }
        *(real *)p = (real)v;
    } break;
    case F_STR:
        if (strlen(value) >= f->size) { lm_set_error("config: %s is too long", key); return LM_ERR; }
        snprintf(p, f->size, "%s", value);
        break;
    case F_ENUM: return set_enum(c, f, value);
    }
    return LM_OK;
}

// ----------------------------------------------------------------------------

void lm_config_count_params(const lm_config *c, double *total, double *active) {
    lm_params *p = lm_malloc(sizeof *p);   // never bound: the layout only counts
    lm_layout L;
    lm_params_layout(c, p, &L);
    double tot = 0, act = 0;
    for (int i = 0; i < L.n; i++) {
        const lm_tensor_info *t = &L.t[i];
        if (t->flags & LM_T_BUFFER) continue;
        double n = (double)t->numel;
        tot += n;
        if (t->flags & LM_T_EMBED) act += c->tie_embeddings ? n : 0;   // tied: it is also the LM head
        else if (t->flags & LM_T_EXPERT) act += n * c->top_k / c->n_experts;
        else act += n;
    }
    lm_layout_free(&L);
    free(p);
    *total = tot;
    *active = act;
}

double lm_config_train_flops(const lm_config *c, int T) {
    double tot, act;
    lm_config_count_params(c, &tot, &act);
    const double mm = 2 * act;
    double mla = 0, kda = 0;
    const double K = c->kda_head_dim, V = c->kda_head_dim, C = c->kda_chunk;
    for (int i = 0; i < c->n_layers; i++) {
        if (lm_layer_is_mla(c, i))
            mla += 2.0 * c->mla_heads * (lm_mla_qk_dim(c) + c->v_head_dim) * (T + 1) / 2.0;
        else
            kda += 2.0 * c->kda_heads * (3 * K * V + C * K + C * V / 2);
    }
    return 3 * (mm + mla + kda);
}

void lm_config_print(const lm_config *c, FILE *f) {
    double tot, act;
    lm_config_count_params(c, &tot, &act);
    fprintf(f, "model %s: %d layers [%s], d_model %d, vocab %d\n", c->name[0] ? c->name : "(custom)", c->n_layers,
            c->layer_types, c->d_model, c->vocab);
    fprintf(f, "  KDA %d heads x %d, conv %d, gate %s%s, chunk %d | MLA %d heads, kv_lora %d, qk %d+%d, v %d%s\n",
            c->kda_heads, c->kda_head_dim, c->kda_conv, GATE_NAMES[c->gate_mode],
            c->gate_mode == LM_GATE_BOUNDED ? (c->gate_lb == -5 ? " (lb -5)" : " (lb custom)") : "", c->kda_chunk,
            c->mla_heads, c->kv_lora_rank, c->qk_nope_dim, c->qk_extra_dim, c->v_head_dim, c->mla_gated ? ", gated" : "");
    fprintf(f, "  FFN: %d dense (ff %d), MoE %d experts top-%d + %d shared (ff %d), balance %s, residual %s",
            c->first_dense, c->d_ff_dense, c->n_experts, c->top_k, c->n_shared, c->d_ff_expert,
            BALANCE_NAMES[c->balance], RESIDUAL_NAMES[c->residual]);
    if (c->residual == LM_RES_BLOCK) fprintf(f, " (%d layers/block)", c->block_layers);
    fprintf(f, "\n  parameters: %.4g total, %.4g active per token\n", tot, act);
}
