// optimizer.c — see optimizer.h.
#include "train/optimizer.h"

void lm_optim_default(lm_optim_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = LM_OPT_ADAMW;
    c->lr = 3e-3;
    c->b1 = 0.9; c->b2 = 0.95; c->eps = 1e-8;
    c->wd = 0.1;
    c->clip = 1.0;
    c->muon_mu = 0.95;
    c->warmup = 20;
    c->total_steps = 1000;
    c->decay_frac = 0.2;
    c->final_frac = 0.1;
}

int lm_optimizer_from_name(const char *s) {
    if (strcmp(s, "adamw") == 0) return LM_OPT_ADAMW;
    if (strcmp(s, "muon") == 0) return LM_OPT_MUON;
    return -1;
}

void lm_optim_init(lm_optim *o, const lm_model *model, const lm_optim_config *c) {
    memset(o, 0, sizeof *o);
    o->cfg = *c;
    size_t bytes = model->playout.numel * sizeof(real);
    o->m = model->ops->alloc(bytes);
    o->v = model->ops->alloc(bytes);
}

void lm_optim_free(lm_optim *o, const lm_model *model) {
    model->ops->free(o->m);
    model->ops->free(o->v);
    o->m = o->v = NULL;
}

real lm_optim_lr(const lm_optim_config *c, long step) {
    if (c->warmup > 0 && step < c->warmup) return c->lr * (real)(step + 1) / (real)c->warmup;
    long decay_steps = (long)(c->decay_frac * c->total_steps);
    long decay_start = c->total_steps - decay_steps;
    if (decay_steps <= 0 || step < decay_start) return c->lr;
    real f = (real)(step - decay_start + 1) / (real)decay_steps;
    if (f > 1) f = 1;
    return c->lr * (1 - f * (1 - c->final_frac));
}

double lm_grad_norm(const lm_model *model) {
    // padding between tensors and the never-trained buffers hold zero gradients
    return sqrt(model->ops->sumsq(model->grads_mem, model->playout.numel));
}

// Muon treats a tensor as `count` stacked matrices: [E, rows, cols] for routed experts.
static int muon_shape(const lm_tensor_info *t, int *count, int *rows, int *cols) {
    if (!(t->flags & LM_T_MATRIX)) return 0;
    if (t->ndim == 2) { *count = 1; *rows = (int)t->shape[0]; *cols = (int)t->shape[1]; return 1; }
    if (t->ndim == 3) { *count = (int)t->shape[0]; *rows = (int)t->shape[1]; *cols = (int)t->shape[2]; return 1; }
    return 0;
}

double lm_optim_step(lm_optim *o, lm_model *model, real lr) {
    double norm = lm_grad_norm(model);
    lm_optim_step_norm(o, model, lr, norm);
    return norm;
}

void lm_optim_step_norm(lm_optim *o, lm_model *model, real lr, double norm) {
    const lm_ops *ops = model->ops;
    const lm_optim_config *c = &o->cfg;
    // clipping: AdamW takes the factor with the gradient (no pass over the gradients);
    // Muon's op does not, so with Muon the gradients are scaled first
    real gscale = c->clip > 0 && norm > c->clip ? (real)(c->clip / norm) : 1;
    if (gscale != 1 && c->kind == LM_OPT_MUON) {
        ops->scale(model->grads_mem, gscale, model->playout.numel);
        gscale = 1;
    }
    o->t++;
    real bc1 = 1 - pow(c->b1, (real)o->t), bc2 = 1 - pow(c->b2, (real)o->t);
    // the AdamW tensors go to the backend as one list (Muon's matrices are updated one by one)
    lm_adamw_span *spans = lm_malloc((size_t)(model->playout.n > 0 ? model->playout.n : 1) * sizeof *spans);
    int nspans = 0;
    for (int i = 0; i < model->playout.n; i++) {
        const lm_tensor_info *t = &model->playout.t[i];
        if (t->flags & LM_T_BUFFER) continue;
        int nodecay = (t->flags & LM_T_NODECAY) || ((t->flags & LM_T_EMBED) && !c->wd_embed);
        real wd = nodecay ? 0 : c->wd;
        int count, rows, cols;
        if (c->kind == LM_OPT_MUON && muon_shape(t, &count, &rows, &cols))
            ops->muon(model->params_mem + t->offset, model->grads_mem + t->offset, o->m + t->offset, count, rows, cols,
                      lr, c->muon_mu, wd);
        else
            spans[nspans++] = (lm_adamw_span){t->offset, t->numel, wd};
    }
    if (nspans)
        ops->adamw(model->params_mem, model->grads_mem, o->m, o->v, spans, nspans, lr, c->b1, c->b2, c->eps, bc1, bc2,
                   gscale);
    free(spans);
}
