// cmd_plan.c — `linmoe plan`: a config with its parameter counts and the memory a
// training step and an inference cache need (on paper; nothing is allocated).
#include "cli/cli.h"
#include "model/model.h"
#include "model/params.h"

int lm_cmd_plan(int argc, char **argv) {
    lm_model_flags mf;
    lm_model_flags_default(&mf);
    int T = 0, B = 1;
    long ctx = 0;
    lm_flag fl[32];
    int n = lm_model_flags_add(&mf, fl, 0);
    fl[n++] = (lm_flag){"seq", 'T', FL_INT, &T, 0, "training sequence length (0 = the preset's)"};
    fl[n++] = (lm_flag){"batch", 'b', FL_INT, &B, 0, "sequences per micro-batch"};
    fl[n++] = (lm_flag){"context", 0, FL_U64, &ctx, 0, "inference context for the cache estimate (0 = seq)"};
    int rc = lm_flags_run("plan", "usage: linmoe plan [--preset NAME] [flags]\n", fl, n, argc, argv);
    if (rc >= 0) return rc;
    lm_config c;
    if (lm_model_flags_config(&mf, &c) != LM_OK) { fprintf(stderr, "linmoe plan: error: %s\n", lm_last_error()); return 1; }
    if (T < 0 || T > (1 << 24) || B < 1 || (long)B * (T ? T : c.seq_len) > (1L << 26)) {
        fprintf(stderr, "linmoe plan: error: need --seq in [0, 2^24], --batch >= 1 and at most 2^26 tokens\n");
        return 1;
    }
    if (T == 0) T = c.seq_len;
    if (ctx == 0) ctx = T;
    lm_config_print(&c, stdout);
    double tot, act;
    lm_config_count_params(&c, &tot, &act);
    // weights + grads + 2 moments, fp32 master copy (bf16 weights on GPU would add 2 bytes/param)
    printf("  training state (fp32 weights, grads, AdamW moments): %.3g GB\n", tot * 16 / 1e9);
    printf("  activations at batch %d x %d tokens: %.3g GB for a forward, %.3g GB with their gradients\n", B, T,
           lm_config_acts_bytes(&c, B, T, 0) / 1e9, lm_config_acts_bytes(&c, B, T, 1) / 1e9);
    printf("  forward FLOPs per token (2 x active params, no attention): %.3g GFLOP\n", 2 * act / 1e9);
    double kda = 0, mla = 0;
    for (int i = 0; i < c.n_layers; i++) {
        if (lm_layer_is_mla(&c, i)) mla += (double)ctx * (c.kv_lora_rank + c.qk_extra_dim) * 2;   // in bf16
        else kda += (double)c.kda_heads * c.kda_head_dim * c.kda_head_dim * 4 +
                    3.0 * (c.kda_conv - 1) * c.kda_heads * c.kda_head_dim * 2;   // fp32 state + bf16 conv caches
    }
    // the CUDA backend keeps the latents in bf16 where its tensor-core decode takes the shape
    // (≤ 8 MLA heads: the tiny and small presets), in fp32 elsewhere and on the CPU
    printf("  inference cache per sequence at %ld tokens: KDA %.3g MB (constant) + MLA latent %.3g MB in bf16 "
           "(%.3g MB in fp32)\n", ctx, kda / 1e6, mla / 1e6, 2 * mla / 1e6);
    return 0;
}
