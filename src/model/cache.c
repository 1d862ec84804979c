// cache.c — see cache.h.
#include "model/cache.h"

lm_cache *lm_cache_create(const lm_config *c, const lm_ops *ops, int B, int max_len) {
    lm_cache *k = lm_malloc(sizeof *k);
    k->B = B;
    k->max_len = max_len;
    k->ops = ops;
    lm_layout *L = &k->layout;
    lm_layout_init(L, k);
    // a bf16 cache [B, max_len, R] (the backend's instances have R, De even) takes B·max_len·⌈R/2⌉
    // reals of the arena
    k->mla_bf16 = c->mla_heads > 0 && ops->mla_cache_bf16 &&
                  ops->mla_cache_bf16(c->mla_heads, c->kv_lora_rank, c->qk_extra_dim);
    const int64_t wc = k->mla_bf16 ? (c->kv_lora_rank + 1) / 2 : c->kv_lora_rank;
    const int64_t we = k->mla_bf16 ? (c->qk_extra_dim + 1) / 2 : c->qk_extra_dim;
    for (int i = 0; i < c->n_layers; i++) {
        if (!lm_layer_is_mla(c, i)) {
            const int64_t H = c->kda_heads, K = c->kda_head_dim, W = c->kda_conv;
            lm_layout_add(L, &k->kda_state[i], 0, 4, LM_SHAPE(B, H, K, K), "layers.%d.kda_state", i);
            if (W > 1)
                for (int j = 0; j < 3; j++)
                    lm_layout_add(L, &k->conv[i][j], 0, 3, LM_SHAPE(B, W - 1, H * K), "layers.%d.conv%d", i, j);
        } else {
            lm_layout_add(L, &k->mla_c[i], 0, 3, LM_SHAPE(B, max_len, wc), "layers.%d.mla_c", i);
            if (c->qk_extra_dim > 0)
                lm_layout_add(L, &k->mla_kpe[i], 0, 3, LM_SHAPE(B, max_len, we), "layers.%d.mla_kpe", i);
        }
    }
    lm_layout_add(L, &k->lens, LM_T_INT, 1, LM_SHAPE(B), "lens");
    k->mem = ops->alloc(L->numel * sizeof(real));
    lm_layout_bind(L, k, k->mem);
    k->lens_value = -1;   // uninitialised memory
    const char *e = getenv("LINMOE_DECODE_GRAPH");
    k->graph_off = e && strcmp(e, "0") == 0;
    return k;
}

void lm_cache_reset(lm_cache *k) {
    k->ops->zero(k->mem, k->layout.numel * sizeof(real));
    k->len = 0;
    k->lens_value = -1;
}

void lm_cache_free(lm_cache *k) {
    if (!k) return;
    lm_cache_drop_graph(k);
    if (k->scratch) k->ops->free(k->scratch);
    k->ops->free(k->mem);
    lm_layout_free(&k->layout);
    free(k);
}

size_t lm_cache_bytes(const lm_cache *k) { return k->layout.numel * sizeof(real); }

real *lm_cache_scratch(lm_cache *k, size_t bytes) {
    if (bytes > k->scratch_bytes) {
        if (k->scratch) k->ops->free(k->scratch);
        k->scratch_bytes = bytes + bytes / 4;   // room for the next chunks' longer prefix
        k->scratch = k->ops->alloc(k->scratch_bytes);
    }
    return k->scratch;
}

void lm_cache_set_lens(lm_cache *k, int value) {
    if (k->lens_value == value) return;
    int *h = lm_malloc((size_t)k->B * sizeof(int));
    for (int b = 0; b < k->B; b++) h[b] = value;
    k->ops->to_device(k->lens, h, (size_t)k->B * sizeof(int));
    free(h);
    k->lens_value = value;
}

void lm_cache_drop_graph(lm_cache *k) {
    if (k->graph) k->ops->graph_free(k->graph);
    k->graph = NULL;
    k->graph_model = NULL;
    k->eager_epoch = 0;
}
