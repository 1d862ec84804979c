// cache.h — inference state for B sequences decoded in lockstep: per KDA layer the fp32
// recurrent state and the short-conv caches (the last W−1 pre-conv inputs of q, k, v);
// per MLA layer the latent cache — only c (kv_lora_rank values) and the De extra key
// dims per token, never per-head keys and values (SPEC §1.2). AttnRes and MoE keep
// nothing between tokens.
#ifndef LM_CACHE_H
#define LM_CACHE_H
#include "core/arena.h"
#include "model/config.h"
#include "ops.h"

typedef struct lm_cache {
    int B, max_len;
    int len;                               // tokens already in the cache (same for every sequence)
    real *kda_state[LM_MAX_LAYERS];        // [B,H,K,V]
    real *conv[LM_MAX_LAYERS][3];          // [B,W−1,H·K] for q, k, v
    real *mla_c[LM_MAX_LAYERS];            // [B,max_len,R]   (bf16 values where mla_bf16)
    real *mla_kpe[LM_MAX_LAYERS];          // [B,max_len,De]  (likewise)
    int mla_bf16;                          // the backend keeps the MLA caches in bf16 (ops mla_cache_bf16)
    int *lens;                             // [B] backend copy of the decode op's lengths
    int lens_value;                        // the value every entry of lens holds now; −1 unknown
    lm_layout layout;
    real *mem;
    const lm_ops *ops;
    // chunked prefill: per-head keys and values of the whole cache for one MLA layer at a
    // time (grown on demand, lm_cache_scratch)
    real *scratch;
    size_t scratch_bytes;
    // one-token steps recorded and replayed on a backend with graph ops (lm_model_forward):
    // the recording, the model and backend memory epoch it belongs to; the epoch at which a
    // step last ran op by op (the next step is recorded if nothing moved since); steps
    // replayed so far. graph_off (LINMOE_DECODE_GRAPH=0 at creation) runs every step op by op.
    void *graph;
    const void *graph_model;
    unsigned long graph_epoch, eager_epoch;
    long graph_runs;
    int graph_off;
} lm_cache;

lm_cache *lm_cache_create(const lm_config *c, const lm_ops *ops, int B, int max_len);
void lm_cache_reset(lm_cache *k);          // empties every sequence
void lm_cache_free(lm_cache *k);
size_t lm_cache_bytes(const lm_cache *k);
// backend memory of at least `bytes`, owned by the cache (contents not kept when it grows)
real *lm_cache_scratch(lm_cache *k, size_t bytes);
// every entry of the backend's lens ← value (uploaded only when it changes)
void lm_cache_set_lens(lm_cache *k, int value);
// drops the recorded decode step (the next steps run op by op, then record again)
void lm_cache_drop_graph(lm_cache *k);

#endif
