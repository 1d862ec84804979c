// qk_clip.h — QK-Clip for the MLA heads (MuonClip, Kimi K2): after an optimizer step,
// every head whose largest attention logit in the step exceeded τ has its query and key
// projections rescaled so that the same inputs would give a largest logit of exactly τ.
// For MLA: the per-head nope parts of q and k are scaled by sqrt(γ), the per-head extra
// ("rope") part of q by γ, and the extra key dims (shared by all heads) are left alone;
// γ = τ / max_logit. Every logit of that head is then multiplied by γ.
#ifndef LM_QK_CLIP_H
#define LM_QK_CLIP_H
#include "model/model.h"

// maxlog [n_layers · mla_heads]: running per-head maxima; start from −inf
void lm_qk_reset(const lm_model *m, real *maxlog);
// Max-accumulates the logits of the last forward's MLA layers into maxlog.
void lm_qk_observe(const lm_model *m, real *maxlog);
// Rescales the heads above tau; returns how many heads were clipped.
int lm_qk_clip(lm_model *m, const real *maxlog, real tau);

#endif
