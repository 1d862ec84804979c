// optimizer.h — AdamW for every parameter, or Muon for the 2-D hidden matrices with
// AdamW for the rest (embeddings, LM head, router, norms, gate scalars, AttnRes
// vectors); global gradient-norm clipping; the WSD learning-rate schedule.
#ifndef LM_OPTIMIZER_H
#define LM_OPTIMIZER_H
#include "model/model.h"

enum { LM_OPT_ADAMW = 0, LM_OPT_MUON = 1 };

typedef struct {
    int kind;                 // LM_OPT_*
    real lr;                  // peak learning rate
    real b1, b2, eps;         // AdamW
    real wd;                  // decoupled weight decay (not on LM_T_NODECAY tensors, not on embeddings
    int wd_embed;             //   unless wd_embed)
    real clip;                // global grad-norm clip (0 = off)
    real muon_mu;             // Muon momentum (Nesterov)
    // schedule: linear warmup, stable, linear decay over the last decay_frac of steps to final_frac·lr
    int warmup, total_steps;
    real decay_frac, final_frac;
} lm_optim_config;

typedef struct {
    lm_optim_config cfg;
    real *m, *v;              // backend memory, the parameter layout (v unused by Muon tensors)
    long t;                   // updates applied so far (AdamW bias correction)
} lm_optim;

void lm_optim_default(lm_optim_config *c);
void lm_optim_init(lm_optim *o, const lm_model *model, const lm_optim_config *c);
void lm_optim_free(lm_optim *o, const lm_model *model);
real lm_optim_lr(const lm_optim_config *c, long step);   // step counts from 0
// Global L2 norm of the gradients; 0 < result < inf when finite.
double lm_grad_norm(const lm_model *model);
// Clips (if configured) and applies one update with learning rate lr. Returns the
// gradient norm before clipping.
double lm_optim_step(lm_optim *o, lm_model *model, real lr);
// The same with the gradient norm already known (lm_grad_norm: the training loop computes
// it once, and a non-finite norm is also its non-finite-gradient test).
void lm_optim_step_norm(lm_optim *o, lm_model *model, real lr, double norm);
int lm_optimizer_from_name(const char *s);   // −1 if unknown

#endif
