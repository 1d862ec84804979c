// model.c — the whole model on the op interface.
//
// The residual stream is a plan ("tape") built once from the config:
//   prenorm: h ← h + Attn(h); h ← h + FFN(h)          (mixers are the identity)
//   block  : every sublayer input is the AttnRes mix of [embedding, finished block
//            sums…, current partial sum]; blocks close at layers i % S_b == 0
//            (Kimi K3 semantics, reference/attnres.md §5)
//   full   : every sublayer input is the AttnRes mix of [embedding, every earlier
//            sublayer output]
// and the final hidden state is, for block and full, one more mix before the final norm.
// Forward runs the tape; backward runs it in reverse, each stream tensor owning a
// gradient buffer that its consumers accumulate into.
#include "model/model.h"

// ----------------------------------------------------------------------------
// plan

static int new_stream(lm_model *m) {
    LM_ASSERT(m->n_stream < LM_MAX_STREAM);
    return m->n_stream++;
}

static void push(lm_model *m, lm_tape_op op) {
    LM_ASSERT(m->n_tape < LM_MAX_TAPE);
    m->tape[m->n_tape++] = op;
}

// Mixes `src` (n ids) into a new stream; with one source it is the identity and the
// source id itself is returned (no tensor, no op).
static int mix(lm_model *m, const int *src, int n, int layer, int which) {
    if (n == 1) return src[0];
    LM_ASSERT(m->n_mix < LM_MAX_MIX && n <= LM_MAX_SOURCES);
    lm_mix_plan *p = &m->mix[m->n_mix];
    p->n = n;
    memcpy(p->src, src, n * sizeof(int));
    p->layer = layer;
    p->which = which;
    int out = new_stream(m);
    push(m, (lm_tape_op){.kind = LM_TP_MIX, .layer = layer, .out = out, .mix = m->n_mix++});
    return out;
}

static int sublayer(lm_model *m, int kind, int layer, int in) {
    int out = new_stream(m);
    push(m, (lm_tape_op){.kind = kind, .layer = layer, .out = out, .in = {in, -1}});
    return out;
}

static int add(lm_model *m, int a, int b) {
    int out = new_stream(m);
    push(m, (lm_tape_op){.kind = LM_TP_ADD, .layer = -1, .out = out, .in = {a, b}});
    return out;
}

static void build_tape(lm_model *m) {
    const lm_config *c = &m->cfg;
    m->n_stream = m->n_tape = m->n_mix = 0;
    int e = m->stream_embed = new_stream(m);
    int src[LM_MAX_SOURCES], n = 0;        // committed sources (block) or all sources (full)
    if (c->residual == LM_RES_FULL) {
        src[n++] = e;
        for (int i = 0; i < c->n_layers; i++) {
            int x1 = mix(m, src, n, i, 0);
            src[n++] = sublayer(m, LM_TP_ATTN, i, x1);
            int x2 = mix(m, src, n, i, 1);
            src[n++] = sublayer(m, LM_TP_FFN, i, x2);
        }
        m->stream_final = mix(m, src, n, -1, 0);
        return;
    }
    // block and prenorm: P is the current partial sum (−1 = empty)
    int P = e;
    for (int i = 0; i < c->n_layers; i++) {
        src[n] = P;
        int x1 = mix(m, src, n + 1, i, 0);
        if (c->residual == LM_RES_BLOCK && i % c->block_layers == 0) {
            src[n++] = P;      // commit: the embedding at i = 0, else the finished block
            P = -1;
        }
        int a = sublayer(m, LM_TP_ATTN, i, x1);
        int hm = P < 0 ? a : add(m, P, a);
        src[n] = hm;
        int x2 = mix(m, src, n + 1, i, 1);
        int f = sublayer(m, LM_TP_FFN, i, x2);
        P = add(m, hm, f);
    }
    src[n] = P;
    m->stream_final = mix(m, src, n + 1, -1, 0);
}

// grad_alias (model.h): a stream read once, as the second input of an ADD (a sublayer's
// output added to the partial sum), takes the ADD output's gradient buffer: its gradient
// equals that one, which is complete when the ADD's backward runs (every reader of the
// output comes later in the tape) and is only read afterwards (a sublayer's dout is const).
// uses[s]: how many times the forward reads stream s (the final norm or mixer counting once)
static void stream_uses(const lm_model *m, int *uses) {
    for (int s = 0; s < m->n_stream; s++) uses[s] = 0;
    for (int t = 0; t < m->n_tape; t++) {
        const lm_tape_op *op = &m->tape[t];
        if (op->kind == LM_TP_MIX) {
            const lm_mix_plan *p = &m->mix[op->mix];
            for (int j = 0; j < p->n; j++) uses[p->src[j]]++;
        } else {
            for (int j = 0; j < 2; j++)
                if (op->in[j] >= 0) uses[op->in[j]]++;
        }
    }
    uses[m->stream_final]++;
}

static void plan_grad_aliases(lm_model *m) {
    int uses[LM_MAX_STREAM];
    stream_uses(m, uses);
    for (int s = 0; s < m->n_stream; s++) m->grad_alias[s] = -1;
    for (int t = 0; t < m->n_tape; t++) {
        const lm_tape_op *op = &m->tape[t];
        if (op->kind == LM_TP_ADD && op->in[1] != op->in[0] && uses[op->in[1]] == 1) m->grad_alias[op->in[1]] = op->out;
    }
}

// the gradient buffer of stream s (grad_alias followed)
static int grad_buf(const lm_model *m, int s) {
    while (m->grad_alias[s] >= 0) s = m->grad_alias[s];
    return s;
}

// Which writes of stream gradients can write rather than add: a buffer's first access in the
// backward's order, if it is a write, finds nothing there to add to — so it writes, and the
// buffer is not zeroed first (grad_unzeroed; nor is one nothing accesses). A buffer read before
// any write (a dout nothing has written) stays zeroed, and every write to it adds. Mirrors
// lm_model_backward's order:
// the final norm, the tape from its end (each op reads its output's gradient, then writes its
// inputs'), the embedding.
enum { GB_UNTOUCHED, GB_WRITTEN, GB_READ_FIRST };   // a gradient buffer's first access
static void note_read(const lm_model *m, unsigned char *st, int s) {
    const int b = grad_buf(m, s);
    if (st[b] == GB_UNTOUCHED) st[b] = GB_READ_FIRST;
}
// 1 if this write of stream s's gradient is its buffer's first access (it may write)
static unsigned note_write(const lm_model *m, unsigned char *st, int s) {
    const int b = grad_buf(m, s);
    if (st[b] != GB_UNTOUCHED) return 0;
    st[b] = GB_WRITTEN;
    return 1;
}
static void plan_grad_writes(lm_model *m) {
    unsigned char st[LM_MAX_STREAM] = {0};
    m->final_assign = lm_final_normed(m) ? 0 : (int)note_write(m, st, m->stream_final);
    for (int t = m->n_tape - 1; t >= 0; t--) {
        lm_tape_op *op = &m->tape[t];
        op->assign = 0;
        // a mixer that runs its reader's norm starts from that norm's ∂xn, and that reader
        // writes no gradient of the mixer's output: the buffer stays untouched
        if (!(op->kind == LM_TP_MIX && op->normed)) note_read(m, st, op->out);
        if (op->kind == LM_TP_MIX) {
            const lm_mix_plan *p = &m->mix[op->mix];
            for (int j = 0; j < p->n; j++) op->assign |= note_write(m, st, p->src[j]) << j;
        } else if (op->kind == LM_TP_ADD) {
            for (int j = 0; j < 2; j++)
                if (grad_buf(m, op->in[j]) != grad_buf(m, op->out)) op->assign |= note_write(m, st, op->in[j]) << j;
        } else if (!op->normed) {
            op->assign = note_write(m, st, op->in[0]);
        }
    }
    note_read(m, st, m->stream_embed);
    for (int s = 0; s < m->n_stream; s++) m->grad_unzeroed[s] = st[s] != GB_READ_FIRST;
}

// Which mixers run the RMSNorm that reads their output (attnres_norm_*). Every mixer's output
// has exactly one reader, its RMSNorm: the sublayer right after it on the tape, or the final
// norm. LM_MIX_NORM=0 leaves the norms in the sublayers (for A/B measurements; same maths).
static void plan_mix_norms(lm_model *m) {
    const char *env = getenv("LM_MIX_NORM");
    const int on = !(env && strcmp(env, "0") == 0);
    for (int t = 0; t < m->n_tape; t++) m->tape[t].normed = 0;
    for (int t = 0; t < m->n_tape; t++) {
        lm_tape_op *op = &m->tape[t];
        if (op->kind != LM_TP_MIX || !on) continue;
        if (t + 1 < m->n_tape) {
            lm_tape_op *next = &m->tape[t + 1];
            LM_ASSERT((next->kind == LM_TP_ATTN || next->kind == LM_TP_FFN) && next->in[0] == op->out);
            next->normed = 1;
        } else {
            LM_ASSERT(op->out == m->stream_final);   // the output mixer (lm_final_normed)
        }
        op->normed = 1;
    }
}

// dout_lo (model.h): a sublayer reads its output gradient first of all, in its output
// linear's backward (the layers' lm_linear_bwd_written), so that linear can take it in GEMM
// precision from the op that wrote it last — when that is the mixer whose backward ran just
// before (only ADDs between, which write other buffers), that mixer's kernel stores the copy
// with the fp32 rows (lm_source_grads.lo) and no rounding pass is needed. Walks the backward's
// order (lm_model_backward), tracking each gradient buffer's last writer.
static void plan_dout_lo(lm_model *m) {
    int op_of[LM_MAX_STREAM], j_of[LM_MAX_STREAM];   // last writer of each buffer: MIX op and source, or −1
    for (int b = 0; b < m->n_stream; b++) op_of[b] = j_of[b] = -1;
    for (int t = 0; t < m->n_tape; t++) m->tape[t].dout_lo = m->tape[t].kind == LM_TP_MIX ? -1 : 0;
    int last_mix = -1;
    for (int t = m->n_tape - 1; t >= 0; t--) {
        lm_tape_op *op = &m->tape[t];
        switch (op->kind) {
        case LM_TP_MIX: {
            const lm_mix_plan *p = &m->mix[op->mix];
            for (int j = 0; j < p->n; j++) {   // a buffer listed twice: its last entry writes last
                op_of[grad_buf(m, p->src[j])] = t;
                j_of[grad_buf(m, p->src[j])] = j;
            }
            last_mix = t;
        } break;
        case LM_TP_ATTN:
        case LM_TP_FFN: {
            const int b = grad_buf(m, op->out);
            if (op_of[b] >= 0 && op_of[b] == last_mix) {
                m->tape[op_of[b]].dout_lo = j_of[b];
                op->dout_lo = 1;
                last_mix = -1;   // the buffer is taken until this sublayer has read it
            }
            op_of[grad_buf(m, op->in[0])] = -1;
        } break;
        case LM_TP_ADD:
            for (int j = 0; j < 2; j++)
                if (grad_buf(m, op->in[j]) != grad_buf(m, op->out)) op_of[grad_buf(m, op->in[j])] = -1;
            break;
        }
    }
}

// Which ADDs run inside the sublayer before them (lm_tape_op.fused): those adding a sublayer's
// output, read by nothing else, onto the partial sum (prenorm and block residuals; the full
// one has no ADD). Saves the output's store and the ADD's pass: of three [N, d] tensors' traffic,
// the GEMM epilogue reads one. The backwards are unchanged: neither the ADD's nor the
// sublayer's reads the output. LM_FUSE_ADD=0 keeps them apart (A/B measurements).
static void plan_fused_adds(lm_model *m) {
    const char *env = getenv("LM_FUSE_ADD");
    const int on = !(env && strcmp(env, "0") == 0);
    int uses[LM_MAX_STREAM];
    stream_uses(m, uses);
    for (int t = 0; t < m->n_tape; t++) m->tape[t].fused = 0;
    for (int t = 0; on && t + 1 < m->n_tape; t++) {
        lm_tape_op *op = &m->tape[t], *next = &m->tape[t + 1];
        if ((op->kind == LM_TP_ATTN || op->kind == LM_TP_FFN) && next->kind == LM_TP_ADD && next->in[1] == op->out &&
            next->in[0] != op->out && uses[op->out] == 1)
            op->fused = next->fused = 1;
    }
}

static void build_plan(lm_model *m) {
    build_tape(m);
    plan_mix_norms(m);
    plan_fused_adds(m);
    const char *keep = getenv("LM_KEEP_XN");
    m->keep_xn = keep && strcmp(keep, "1") == 0;
    plan_grad_aliases(m);
    plan_grad_writes(m);
    plan_dout_lo(m);
}

// ----------------------------------------------------------------------------
// memory

lm_model *lm_model_create(const lm_config *c, const lm_ops *ops, uint64_t seed) {
    lm_model *m = lm_malloc(sizeof *m);
    m->cfg = *c;
    m->ops = ops;
    lm_params_layout(&m->cfg, &m->params, &m->playout);
    size_t bytes = m->playout.numel * sizeof(real);
    m->params_mem = ops->alloc(bytes);
    m->grads_mem = ops->alloc(bytes);
    lm_layout_bind(&m->playout, &m->params, m->params_mem);
    lm_layout_bind(&m->playout, &m->grads, m->grads_mem);
    lm_params_tie(&m->cfg, &m->params);
    lm_params_tie(&m->cfg, &m->grads);
    real *host = lm_malloc(bytes);
    lm_params_init(&m->cfg, &m->playout, host, seed);
    ops->to_device(m->params_mem, host, bytes);
    free(host);
    build_plan(m);
    for (int i = 0; i < c->n_layers; i++)
        if (lm_layer_is_moe(c, i))
        {
            lm_balancer_init(&m->bal[i], ops, (lm_balance_kind)c->balance, c->n_experts, c->top_k, c->qb_bins,
                             c->balance_rate);
            lm_balancer_attach_bias(&m->bal[i], ops, m->params.layer[i].route_bias);
        }
    return m;
}

void lm_model_free(lm_model *m) {
    if (!m) return;
    const lm_ops *o = m->ops;
    for (int i = 0; i < m->cfg.n_layers; i++)
        if (lm_layer_is_moe(&m->cfg, i)) lm_balancer_free(&m->bal[i], o);
    o->free(m->params_mem);
    o->free(m->grads_mem);
    if (m->acts_mem) o->free(m->acts_mem);
    if (m->dacts_mem) o->free(m->dacts_mem);
    if (m->kda_saved_mem) o->free(m->kda_saved_mem);
    if (m->lo_mem) o->free(m->lo_mem);
    lm_layout_free(&m->playout);
    lm_layout_free(&m->alayout);
    free(m);
}

static void acts_layout(const lm_model *m, int B, int T, lm_acts *a, lm_layout *L);

// The activations are reserved for the forward; their gradients (same layout) only by the
// first backward at this shape, so evaluation and generation need half the memory.
void lm_model_reserve(lm_model *m, int B, int T) {
    if (m->acts_mem && m->B == B && m->T == T) return;
    const lm_ops *o = m->ops;
    if (m->acts_mem) { o->free(m->acts_mem); lm_layout_free(&m->alayout); }
    if (m->dacts_mem) { o->free(m->dacts_mem); m->dacts_mem = NULL; }
    if (m->kda_saved_mem) { o->free(m->kda_saved_mem); m->kda_saved_mem = NULL; }
    if (m->lo_mem) { o->free(m->lo_mem); m->lo_mem = NULL; }
    lm_layout *L = &m->alayout;
    acts_layout(m, B, T, &m->acts, L);
    m->acts_mem = o->alloc(L->numel * sizeof(real));
    lm_layout_bind(L, &m->acts, m->acts_mem);
    m->B = B;
    m->T = T;
}

// bytes of one KDA layer's saved forward intermediates at B × T (0 if the backend recomputes)
static size_t kda_saved_each(const lm_model *m, int B, int T) {
    const lm_config *c = &m->cfg;
    if (!m->ops || !m->ops->kda_saved_bytes) return 0;   // lm_config_acts_bytes: no backend
    size_t b = m->ops->kda_saved_bytes(B, T, c->kda_heads, c->kda_head_dim, c->kda_head_dim);
    return (b + 255) & ~(size_t)255;   // each layer's home 256-byte aligned
}
static int n_kda_layers(const lm_config *c) {
    int n = 0;
    for (int i = 0; i < c->n_layers; i++) n += !lm_layer_is_mla(c, i);
    return n;
}
// per-layer homes of the KDA forward's intermediates for a training forward (freed with
// the activations when the shape changes); NULL when the backend recomputes them
static void *const *reserve_kda_saved(lm_model *m) {
    const size_t each = kda_saved_each(m, m->B, m->T);
    if (!each || !n_kda_layers(&m->cfg)) return NULL;
    if (!m->kda_saved_mem) {
        const lm_config *c = &m->cfg;
        char *base = m->ops->alloc(each * n_kda_layers(c));
        m->kda_saved_mem = base;
        for (int i = 0, j = 0; i < c->n_layers; i++)
            m->kda_saved[i] = lm_layer_is_mla(c, i) ? NULL : base + each * j++;
    }
    return m->kda_saved;
}

// Bytes of the homes of the linears' inputs (model.h lo) at B × T, each 256-byte aligned; with
// base, the homes are set into it (lo[i][slot], lo_head, lo_dstream). 0 without a backend that
// keeps them.
static size_t lo_layout(const lm_model *m, int B, int T, char *base, void *(*lo)[LM_LO_N], void **lo_head,
                        void **lo_dstream) {
    const lm_ops *o = m->ops;
    if (!o || !o->linears_lo_bytes) return 0;   // lm_config_acts_bytes: no backend
    const lm_config *c = &m->cfg;
    const int N = B * T;
    size_t off = 0;
    for (int i = 0; i <= c->n_layers; i++) {   // i = n_layers: the LM head's input
        int C[LM_LO_N] = {0};
        if (i < c->n_layers) lm_layer_lo_widths(c, i, C);
        else C[0] = C[1] = c->d_model;   // the LM head's input; a sublayer's output gradient
        for (int j = 0; j < LM_LO_N; j++) {
            size_t b = C[j] > 0 ? o->linears_lo_bytes(N, C[j]) : 0;
            // (with the linears' copies only, so that a model's homes follow the GEMM mode as before)
            if (j == LM_LO_ATTN_QKV && i < c->n_layers && lm_layer_is_mla(c, i) && o->attn_lo_bytes &&
                o->mla_split_fwd_lo && o->attn_fwd_lo && o->attn_bwd_lo && o->linears_lo_bytes(N, c->d_model))
                b = o->attn_lo_bytes(B, T, c->mla_heads, lm_mla_qk_dim(c), c->v_head_dim);
            void *home = b && base ? base + off : NULL;
            if (i < c->n_layers && base) lo[i][j] = home;
            else if (j == 0 && base) *lo_head = home;
            else if (j == 1 && base) *lo_dstream = home;
            off += (b + 255) & ~(size_t)255;
        }
    }
    return off;
}
// the homes for a training forward (freed with the activations when the shape changes); NULL
// when the backend keeps no such copies
static void *(*reserve_lo(lm_model *m))[LM_LO_N] {
    if (!m->lo_mem) {
        const size_t bytes = lo_layout(m, m->B, m->T, NULL, NULL, NULL, NULL);
        if (!bytes) return NULL;
        m->lo_mem = m->ops->alloc(bytes);
        lo_layout(m, m->B, m->T, m->lo_mem, m->lo, &m->lo_head, &m->lo_dstream);
    }
    return m->lo;
}

static void reserve_grads(lm_model *m) {
    if (m->dacts_mem) return;
    m->dacts_mem = m->ops->alloc(m->alayout.numel * sizeof(real));
    lm_layout_bind(&m->alayout, &m->dacts, m->dacts_mem);
    for (int s = 0; s < m->n_stream; s++) {   // shared gradient buffers (model.h)
        int t = s;
        while (m->grad_alias[t] >= 0) t = m->grad_alias[t];
        m->dacts.stream[s] = m->dacts.stream[t];
    }
}

size_t lm_model_acts_bytes(const lm_model *m, int B, int T, int with_grads) {
    lm_acts *a = lm_malloc(sizeof *a);   // never bound: the layout only counts
    lm_layout L;
    acts_layout(m, B, T, a, &L);
    size_t bytes = (with_grads ? 2 : 1) * L.numel * sizeof(real);
    if (with_grads) bytes += kda_saved_each(m, B, T) * n_kda_layers(&m->cfg) + lo_layout(m, B, T, NULL, NULL, NULL, NULL);
    lm_layout_free(&L);
    free(a);
    return bytes;
}

size_t lm_config_acts_bytes(const lm_config *c, int B, int T, int with_grads) {
    lm_model *m = lm_malloc(sizeof *m);   // the plan only: no parameters allocated
    m->cfg = *c;
    build_plan(m);
    size_t bytes = lm_model_acts_bytes(m, B, T, with_grads);
    free(m);
    return bytes;
}

// the activation tensors of a B × T batch, registered in L (initialised here) for *a
static void acts_layout(const lm_model *m, int B, int T, lm_acts *a, lm_layout *L) {
    const lm_config *c = &m->cfg;
    lm_layout_init(L, a);
    const int64_t N = (int64_t)B * T, d = c->d_model;
    // a fused sublayer's output (plan_fused_adds) has no slot: it is never stored, and its
    // gradient is the ADD output's (grad_alias)
    unsigned char unstored[LM_MAX_STREAM] = {0};
    for (int t = 0; t < m->n_tape; t++) {
        const lm_tape_op *op = &m->tape[t];
        if (op->fused && op->kind != LM_TP_ADD) {
            LM_ASSERT(m->grad_alias[op->out] >= 0);
            unstored[op->out] = 1;
        }
    }
    for (int s = 0; s < m->n_stream; s++) {   // a stream whose gradient is another's: its own slot is unused
        if (unstored[s]) {
            a->stream[s] = NULL;
            continue;
        }
        lm_layout_add(L, &a->stream[s], m->grad_alias[s] >= 0 || m->grad_unzeroed[s] ? LM_T_NO_GRAD_ZERO : 0, 2,
                      LM_SHAPE(N, d), "stream.%d", s);
    }
    for (int k = 0; k < m->n_mix; k++)
        lm_layout_add(L, &a->alpha[k], 0, 2, LM_SHAPE(N, m->mix[k].n), "mix.%d.alpha", k);
    for (int i = 0; i < c->n_layers; i++) lm_layer_acts_layout(c, i, B, T, &a->layer[i], L);
    lm_layout_add(L, &a->fn, 0, 2, LM_SHAPE(N, d), "final_norm");
    lm_layout_add(L, &a->fn_rstd, 0, 1, LM_SHAPE(N), "final_norm.rstd");
    lm_layout_add(L, &a->logits, 0, 2, LM_SHAPE(N, c->vocab), "logits");
    lm_layout_add(L, &a->losses, 0, 1, LM_SHAPE(N), "losses");
    lm_layout_add(L, &a->lse, 0, 1, LM_SHAPE(N), "lse");
    lm_layout_add(L, &a->tokens, LM_T_INT, 1, LM_SHAPE(N), "tokens");
    lm_layout_add(L, &a->targets, LM_T_INT, 1, LM_SHAPE(N), "targets");
}

// ----------------------------------------------------------------------------
// forward

static void mixer_params(const lm_model *m, const lm_mix_plan *p, const real **w, const real **g) {
    if (p->layer < 0) { *w = m->params.res_out_w; *g = m->params.res_out_g; return; }
    const lm_layer_params *lp = &m->params.layer[p->layer];
    *w = p->which ? lp->res_ffn_w : lp->res_attn_w;
    *g = p->which ? lp->res_ffn_g : lp->res_attn_g;
}

// The RMSNorm that reads the output of the mixer at tape index t when the mixer runs it
// (plan_mix_norms): the input norm of the sublayer after it, or the final norm. Its output xn,
// rstd and lo home (forward), its gain, and the gradients of xn and of the gain (backward).
typedef struct {
    real *xn, *rstd, *dxn, *dgain;
    const real *gain;
    void *lo;
    int lo_read;   // every reader of xn takes lo (lm_norm_out): not the MoE sublayer
} reader_norm;
static reader_norm mix_reader_norm(lm_model *m, int t) {
    const lm_config *c = &m->cfg;
    if (t + 1 == m->n_tape)
        return (reader_norm){m->acts.fn, m->acts.fn_rstd, m->dacts.fn, m->grads.final_norm, m->params.final_norm,
                             m->ctx.lo ? m->lo_head : NULL, 1};
    const lm_tape_op *op = &m->tape[t + 1];
    const int i = op->layer, attn = op->kind == LM_TP_ATTN;
    lm_layer_acts *a = &m->acts.layer[i], *da = &m->dacts.layer[i];
    const real *gain = attn ? m->params.layer[i].attn_norm : m->params.layer[i].ffn_norm;
    real *dgain = attn ? m->grads.layer[i].attn_norm : m->grads.layer[i].ffn_norm;
    void *lo = m->ctx.lo ? m->ctx.lo[i][attn ? LM_LO_ATTN_XN : LM_LO_FFN_XN] : NULL;
    if (attn && lm_layer_is_mla(c, i)) return (reader_norm){a->mla.xn, a->mla.rstd, da->mla.xn, dgain, gain, lo, 1};
    if (attn) return (reader_norm){a->kda.xn, a->kda.rstd, da->kda.xn, dgain, gain, lo, 1};
    if (lm_layer_is_moe(c, i)) return (reader_norm){a->moe.xn, a->moe.rstd, da->moe.xn, dgain, gain, lo, 0};
    return (reader_norm){a->dense.xn, a->dense.rstd, da->dense.xn, dgain, gain, lo, 1};
}

static void run_sublayer_fwd(lm_model *m, const lm_tape_op *op) {
    lm_step_ctx *s = &m->ctx;
    s->layer = op->layer;
    s->in_normed = op->normed;
    const lm_layer_params *p = &m->params.layer[op->layer];
    lm_layer_acts *a = &m->acts.layer[op->layer];
    const real *x = m->acts.stream[op->in[0]];
    real *out = m->acts.stream[op->out];
    const real *res = NULL;
    if (op->fused) {   // the ADD after it: out = partial sum + sublayer (plan_fused_adds)
        out = m->acts.stream[op[1].out];
        res = m->acts.stream[op[1].in[0]];
    }
    if (op->kind == LM_TP_ATTN) {
        if (lm_layer_is_mla(&m->cfg, op->layer)) lm_mla_layer_fwd(s, p, &a->mla, x, out, res);
        else lm_kda_layer_fwd(s, p, &a->kda, x, out, res);
    } else {
        if (lm_layer_is_moe(&m->cfg, op->layer)) lm_moe_layer_fwd(s, p, &m->bal[op->layer], &a->moe, x, out, res);
        else lm_dense_layer_fwd(s, p, &a->dense, x, out, res);
    }
}

// The forward's device work from the uploaded tokens to the logits (m->ctx set): what a
// recorded one-token step replays, so nothing here may depend on a host value that changes
// from step to step (the cache's length reaches the ops through its backend lens).
static void forward_body(lm_model *m) {
    const lm_ops *o = m->ops;
    const lm_config *c = &m->cfg;
    const int N = m->ctx.N, d = c->d_model;
    lm_acts *a = &m->acts;
    o->embed_fwd(a->stream[m->stream_embed], a->tokens, m->params.embed, N, d);
    for (int t = 0; t < m->n_tape; t++) {
        const lm_tape_op *op = &m->tape[t];
        switch (op->kind) {
        case LM_TP_MIX: {
            const lm_mix_plan *p = &m->mix[op->mix];
            lm_sources src = {.n = p->n};
            for (int j = 0; j < p->n; j++) src.p[j] = a->stream[p->src[j]];
            const real *w, *g;
            mixer_params(m, p, &w, &g);
            if (op->normed) {
                const reader_norm rn = mix_reader_norm(m, t);
                real *xn = rn.lo_read ? lm_norm_out(&m->ctx, rn.xn, rn.lo) : rn.xn;
                o->attnres_norm_fwd(xn, rn.rstd, rn.lo, a->alpha[op->mix], a->stream[op->out], src, w, g, rn.gain, N, d,
                                    c->norm_eps);
            } else {
                o->attnres_fwd(a->stream[op->out], a->alpha[op->mix], src, w, g, N, d, c->norm_eps);
            }
        } break;
        case LM_TP_ATTN:
        case LM_TP_FFN: run_sublayer_fwd(m, op); break;
        case LM_TP_ADD:
            if (!op->fused)
                o->add(a->stream[op->out], a->stream[op->in[0]], a->stream[op->in[1]], (size_t)N * d);
            break;
        }
    }
    void *fn_lo = m->ctx.lo ? m->lo_head : NULL;
    if (!lm_final_normed(m))
        o->rmsnorm_fwd(lm_norm_out(&m->ctx, a->fn, fn_lo), a->fn_rstd, a->stream[m->stream_final], m->params.final_norm,
                       N, d, c->norm_eps, fn_lo);
    lm_linear_fwd(o, a->logits, a->fn, m->params.lm_head, N, d, c->vocab, fn_lo, 1);   // fn_lo: by the norm
}

// A one-token step with a cache on a backend that records: the first step at a memory epoch
// runs op by op (the workspace and the weight copies reach their steady state), the next is
// recorded and then replayed for every later step until the backend's memory moves (an
// allocation, a free, a weight copy remade: a new epoch) or another model uses the cache.
static void forward_step_recorded(lm_model *m, lm_cache *kc) {
    const lm_ops *o = m->ops;
    if (kc->graph && (kc->graph_model != m || kc->graph_epoch != o->graph_epoch())) lm_cache_drop_graph(kc);
    if (!kc->graph && kc->graph_model == m && kc->eager_epoch == o->graph_epoch()) {
        o->graph_begin();
        forward_body(m);
        kc->graph = o->graph_end();
        kc->graph_epoch = o->graph_epoch();
    }
    if (kc->graph) {
        o->graph_run(kc->graph);
        kc->graph_runs++;
        return;
    }
    forward_body(m);   // (a recording spoiled: again op by op, recorded next time)
    kc->graph_model = m;
    kc->eager_epoch = o->graph_epoch();
}

double lm_model_forward(lm_model *m, const int *tokens, const int *targets, int B, int T, lm_fwd_opts opts) {
    const lm_ops *o = m->ops;
    const lm_config *c = &m->cfg;
    lm_model_reserve(m, B, T);
    const int N = B * T;
    lm_acts *a = &m->acts;
    m->ctx = (lm_step_ctx){.ops = o, .c = c, .B = B, .T = T, .N = N, .training = opts.training,
                           .capacity = opts.capacity, .aux_dloss = opts.aux_weight, .cache = opts.cache,
                           .kda_saved = opts.training && !opts.cache ? reserve_kda_saved(m) : NULL,
                           .lo = opts.training && !opts.cache ? reserve_lo(m) : NULL};
    // the linears read the norms' copies (lm_linears.lo_filled) in the backend's present GEMM precision
    m->ctx.xn_lo_only = m->ctx.lo && o->linears_lo_bytes && o->linears_lo_bytes(N, c->d_model) > 0 && !m->keep_xn;
    LM_CHECK(!opts.cache || opts.cache->B == B, "cache holds %d sequences, batch has %d", opts.cache ? opts.cache->B : 0, B);
    o->to_device(a->tokens, tokens, (size_t)N * sizeof(int));
    lm_cache *kc = opts.cache;
    if (kc) {
        LM_CHECK(kc->len + T <= kc->max_len, "cache is full (%d + %d tokens > %d)", kc->len, T, kc->max_len);
        lm_cache_set_lens(kc, kc->len + T);   // the cache's length after this chunk, for the MLA layers
    }
    // the recorded path: one-token inference steps after the first token (whose MLA layers
    // attend without the cache's absorbed path)
    if (kc && T == 1 && kc->len > 0 && !opts.training && o->graph_begin && !kc->graph_off) forward_step_recorded(m, kc);
    else forward_body(m);
    if (kc) kc->len += T;
    m->last_count = 0;
    m->last_ce_sum = 0;
    if (!targets) return NAN;
    o->to_device(a->targets, targets, (size_t)N * sizeof(int));
    o->xent_fwd(a->losses, a->lse, a->logits, a->targets, N, c->vocab);
    real *losses = lm_malloc((size_t)N * sizeof(real));
    o->to_host(losses, a->losses, (size_t)N * sizeof(real));
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) { m->last_ce_sum += losses[i]; m->last_count++; }
    free(losses);
    return m->last_count ? m->last_ce_sum / m->last_count : NAN;
}

// ----------------------------------------------------------------------------
// backward

static void run_sublayer_bwd(lm_model *m, const lm_tape_op *op) {
    lm_step_ctx *s = &m->ctx;
    s->layer = op->layer;
    LM_ASSERT(!s->cache);   // inference forwards have no backward
    const lm_layer_params *p = &m->params.layer[op->layer];
    lm_layer_params *g = &m->grads.layer[op->layer];
    const lm_layer_acts *a = &m->acts.layer[op->layer];
    lm_layer_acts *da = &m->dacts.layer[op->layer];
    const real *x = m->acts.stream[op->in[0]];
    const real *dout = m->dacts.stream[op->out];
    real *dx = m->dacts.stream[op->in[0]];
    s->dx_assign = (int)(op->assign & 1);   // the sublayer's last op writes dx (plan_grad_writes)
    s->in_normed = op->normed;
    if (op->kind == LM_TP_ATTN) {
        if (lm_layer_is_mla(&m->cfg, op->layer)) lm_mla_layer_bwd(s, p, g, &a->mla, &da->mla, x, dout, dx);
        else lm_kda_layer_bwd(s, p, g, &a->kda, &da->kda, x, dout, dx);
    } else {
        if (lm_layer_is_moe(&m->cfg, op->layer)) lm_moe_layer_bwd(s, p, g, &a->moe, &da->moe, x, dout, dx);
        else lm_dense_layer_bwd(s, p, g, &a->dense, &da->dense, x, dout, dx);
    }
}

// Zeroes mem's tensors of layout L as few contiguous ranges (each tensor up to the next one's
// start), except those with a flag in `skip` — whose padding after them is zeroed too when
// skip_pad is 0 (the parameter gradients: the norm sums the whole arena).
static void zero_tensors(const lm_ops *o, real *mem, const lm_layout *L, unsigned skip, int skip_pad) {
    size_t lo = 0, hi = 0;   // the open range [lo, hi) in reals
    for (int i = 0; i < L->n; i++) {
        const lm_tensor_info *t = &L->t[i];
        const size_t end = i + 1 < L->n ? L->t[i + 1].offset : L->numel;
        size_t start = t->offset;
        if (t->flags & skip) {
            if (skip_pad) continue;
            start = t->offset + t->numel;
        }
        if (start >= end) continue;
        if (hi > lo && start != hi) {
            o->zero(mem + lo, (hi - lo) * sizeof(real));
            lo = hi = 0;
        }
        if (hi == lo) lo = start;
        hi = end;
    }
    if (hi > lo) o->zero(mem + lo, (hi - lo) * sizeof(real));
}

// Zeroes the activation gradients the backward adds into: every tensor of the layout except
// the index tensors and those flagged LM_T_NO_GRAD_ZERO (gradients their one writer writes,
// or never used).
static void zero_dacts(lm_model *m) { zero_tensors(m->ops, m->dacts_mem, &m->alayout, LM_T_INT | LM_T_NO_GRAD_ZERO, 1); }

void lm_model_backward(lm_model *m, real dloss) {
    const lm_ops *o = m->ops;
    const lm_config *c = &m->cfg;
    const int N = m->ctx.N, d = c->d_model;
    // a forward over a cache (inference) continued earlier tokens: its conv and state inputs get no gradient
    LM_CHECK(!m->ctx.cache, "backward: the forward ran with a cache (inference only)");
    // the forward left norm outputs in the GEMM precision only (xn_lo_only): the backward's
    // weight gradients must read those copies, i.e. run in the same precision
    LM_CHECK(!m->ctx.xn_lo_only || o->linears_lo_bytes(N, d) > 0,
             "backward: the backend's GEMM precision changed since the forward");
    reserve_grads(m);
    lm_acts *a = &m->acts, *da = &m->dacts;
    zero_dacts(m);
    m->ctx.expert_grads_fresh = m->expert_grads_fresh;
    o->xent_bwd(da->logits, a->logits, a->lse, a->targets, dloss, N, c->vocab);
    const lm_linears head = {.n = 1, .OC = {c->vocab}, .W = {m->params.lm_head}, .dout = {da->logits},
                             .dW = {m->grads.lm_head}, .lo = m->ctx.lo ? m->lo_head : NULL};
    o->linears_bwd(&head, da->fn, a->fn, N, d);
    void *dstream_lo = m->ctx.lo ? m->lo_dstream : NULL;   // (NULL where the backend keeps no copies)
    if (!lm_final_normed(m))   // else the output mixer's backward
        o->rmsnorm_bwd(da->stream[m->stream_final], m->grads.final_norm, da->fn, a->stream[m->stream_final],
                       m->params.final_norm, a->fn_rstd, N, d, m->final_assign);
    for (int t = m->n_tape - 1; t >= 0; t--) {
        const lm_tape_op *op = &m->tape[t];
        switch (op->kind) {
        case LM_TP_MIX: {
            const lm_mix_plan *p = &m->mix[op->mix];
            lm_sources src = {.n = p->n};
            lm_source_grads dsrc = {.n = p->n, .assign = op->assign};   // first writes write (plan_grad_writes)
            if (op->dout_lo >= 0 && dstream_lo) {   // the next sublayer's output gradient (plan_dout_lo)
                dsrc.lo = dstream_lo;
                dsrc.lo_j = op->dout_lo;
            }
            for (int j = 0; j < p->n; j++) {
                src.p[j] = a->stream[p->src[j]];
                dsrc.p[j] = da->stream[p->src[j]];
            }
            const real *w, *g;
            mixer_params(m, p, &w, &g);
            real *dw, *dg;
            if (p->layer < 0) { dw = m->grads.res_out_w; dg = m->grads.res_out_g; }
            else {
                lm_layer_params *lg = &m->grads.layer[p->layer];
                dw = p->which ? lg->res_ffn_w : lg->res_attn_w;
                dg = p->which ? lg->res_ffn_g : lg->res_attn_g;
            }
            if (op->normed) {
                const reader_norm rn = mix_reader_norm(m, t);
                o->attnres_norm_bwd(dsrc, dw, dg, rn.dgain, da->stream[op->out], rn.dxn, a->stream[op->out], src,
                                    a->alpha[op->mix], rn.rstd, w, g, rn.gain, N, d, c->norm_eps);
            } else {
                o->attnres_bwd(dsrc, dw, dg, da->stream[op->out], src, a->alpha[op->mix], w, g, N, d, c->norm_eps);
            }
        } break;
        case LM_TP_ATTN:
        case LM_TP_FFN:
            m->ctx.dout_lo = op->dout_lo ? dstream_lo : NULL;
            run_sublayer_bwd(m, op);
            m->ctx.dout_lo = NULL;
            break;
        case LM_TP_ADD:   // an input sharing the output's gradient buffer has it already
            for (int j = 0; j < 2; j++) {
                if (da->stream[op->in[j]] == da->stream[op->out]) continue;
                if (op->assign >> j & 1) o->copy(da->stream[op->in[j]], da->stream[op->out], (size_t)N * d * sizeof(real));
                else o->acc(da->stream[op->in[j]], da->stream[op->out], (size_t)N * d);
            }
            break;
        }
    }
    o->embed_bwd(m->grads.embed, a->tokens, da->stream[m->stream_embed], N, d);
    m->expert_grads_fresh = m->ctx.expert_grads_fresh = 0;   // every MoE layer's backward wrote them
}

// Zeroes every parameter gradient but the routed experts' weights (LM_T_EXPERT), which the
// next backward writes (expert_grads_fresh).
void lm_model_zero_grads(lm_model *m) {
    zero_tensors(m->ops, m->grads_mem, &m->playout, LM_T_EXPERT, 0);
    m->expert_grads_fresh = 1;
}

// Zeroes the experts' weight gradients if no backward has written them since
// lm_model_zero_grads (a reader of the gradients then sees zeros there).
static void settle_expert_grads(lm_model *m) {
    if (!m->expert_grads_fresh) return;
    const lm_layout *L = &m->playout;
    for (int i = 0; i < L->n; i++)
        if (L->t[i].flags & LM_T_EXPERT) m->ops->zero(m->grads_mem + L->t[i].offset, L->t[i].numel * sizeof(real));
    m->expert_grads_fresh = 0;
}

void lm_model_get_params(const lm_model *m, real *host) {
    m->ops->to_host(host, m->params_mem, m->playout.numel * sizeof(real));
}
void lm_model_set_params(lm_model *m, const real *host) {
    m->ops->to_device(m->params_mem, host, m->playout.numel * sizeof(real));
}
void lm_model_get_grads(lm_model *m, real *host) {
    settle_expert_grads(m);
    m->ops->to_host(host, m->grads_mem, m->playout.numel * sizeof(real));
}
