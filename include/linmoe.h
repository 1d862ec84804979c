// linmoe.h — the public API of liblinmoe (build/f32/liblinmoe.a; link with
// -lopenblas -lcjson -lm -fopenmp).
//
//   lm_config c;  lm_config_preset(&c, "tiny");  lm_config_finalize(&c);
//   lm_model *m = lm_model_create(&c, &lm_cpu_ops, seed);          // or lm_load_weights()
//   double loss = lm_model_forward(m, tokens, targets, B, T, opts); // logits in m->acts.logits
//   lm_model_backward(m, 1.0 / m->last_count);                      // gradients in m->grads
//   lm_train_run(&train_opts, &c, &lm_cpu_ops);                     // the whole training loop
//   lm_generate(m, prompt, n, out, &gen_opts, &sampler);            // cached prefill + decode
//
// Everything is plain C11 structs and functions; every tensor function states its shapes in
// its header. The CPU backend is lm_cpu_ops; the CUDA backend (when built) is lm_cuda_ops.
#ifndef LINMOE_H
#define LINMOE_H

#define LINMOE_VERSION "0.1.0"

#include "ops.h"                  // the op interface and both backends
#include "core/safetensors.h"     // safetensors read/write
#include "model/config.h"         // configs, presets, parameter counts
#include "model/model.h"          // the model: create, forward, backward, caches
#include "train/checkpoint.h"     // weights and training-state files
#include "train/eval.h"           // held-out evaluation
#include "train/loader.h"         // built-in tasks, text and token shards
#include "train/optimizer.h"      // AdamW / Muon, WSD
#include "train/train.h"          // the training loop
#include "infer/generate.h"       // sampling and generation

#endif
