// model_flags.c — the model/backend flags every subcommand shares.
#include "cli/cli.h"
#include "core/safetensors.h"
#include <omp.h>

void lm_model_flags_default(lm_model_flags *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->preset, sizeof f->preset, "tiny");
    snprintf(f->device, sizeof f->device, "cpu");
}

int lm_model_flags_add(lm_model_flags *f, lm_flag *fl, int n) {
    fl[n++] = (lm_flag){"preset", 'p', FL_STR, f->preset, sizeof f->preset,
                        "model preset: tiny, small, kimi-linear-48b-a3b, k3"};
    fl[n++] = (lm_flag){"config", 'c', FL_STR, f->config_file, sizeof f->config_file,
                        "JSON file of model config fields (applied over the preset)"};
    fl[n++] = (lm_flag){"set", 0, FL_LIST, &f->set, 0, "override one config field, key=value (repeatable)"};
    fl[n++] = (lm_flag){"balance", 0, FL_STR, f->balance, sizeof f->balance,
                        "MoE balancing: qb, sign, quartile, aux, none (default: the preset's)"};
    fl[n++] = (lm_flag){"residual", 0, FL_STR, f->residual, sizeof f->residual,
                        "residual stream: block, full, prenorm (default: the preset's)"};
    fl[n++] = (lm_flag){"gate", 0, FL_STR, f->gate, sizeof f->gate,
                        "KDA decay gate: bounded, unbounded (default: the preset's)"};
    fl[n++] = (lm_flag){"threads", 't', FL_INT, &f->threads, 0, "CPU threads (0 = all cores)"};
    fl[n++] = (lm_flag){"device", 'd', FL_STR, f->device, sizeof f->device, "backend: cpu or cuda"};
    return n;
}

lm_status lm_model_flags_config(const lm_model_flags *f, lm_config *c) {
    if (lm_config_preset(c, f->preset) != LM_OK) return LM_ERR;
    if (f->config_file[0]) {
        size_t n;
        uint8_t *js = lm_read_file(f->config_file, &n);
        if (!js) return LM_ERR;
        lm_status st = lm_config_apply_json(c, (const char *)js);
        free(js);
        if (st != LM_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", lm_last_error());
            lm_set_error("%s: %s", f->config_file, msg);
            return LM_ERR;
        }
    }
    if (f->balance[0] && lm_config_set(c, "balance", f->balance) != LM_OK) return LM_ERR;
    if (f->residual[0] && lm_config_set(c, "residual", f->residual) != LM_OK) return LM_ERR;
    if (f->gate[0] && lm_config_set(c, "gate_mode", f->gate) != LM_OK) return LM_ERR;
    for (int i = 0; i < f->set.n; i++) {
        const char *kv = f->set.item[i], *eq = strchr(kv, '=');
        if (!eq) { lm_set_error("--set expects key=value, got '%s'", kv); return LM_ERR; }
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        if (lm_config_set(c, key, eq + 1) != LM_OK) return LM_ERR;
    }
    return lm_config_finalize(c);
}

lm_status lm_model_flags_backend(const lm_model_flags *f, const lm_ops **ops) {
    // a thread's stack is reserved up front: 100000 threads overflow inside the OpenMP runtime
    if (f->threads < 0 || f->threads > 1024) { lm_set_error("--threads must be in [0, 1024], got %d", f->threads); return LM_ERR; }
    if (f->threads > 0) omp_set_num_threads(f->threads);
    if (strcmp(f->device, "cpu") == 0) { *ops = &lm_cpu_ops; return LM_OK; }
    if (strcmp(f->device, "cuda") == 0) {
#ifdef LM_CUDA
        *ops = &lm_cuda_ops;
        return LM_OK;
#else
        lm_set_error("--device cuda: this build has no CUDA backend (build/cuda/linmoe has it: `make cuda-cli`, needs nvcc, not a GPU)");
        return LM_ERR;
#endif
    }
    lm_set_error("--device '%s' is not cpu or cuda", f->device);
    return LM_ERR;
}
