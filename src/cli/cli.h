// cli.h — the subcommands of the `linmoe` program and what they share: the model
// configuration flags (--preset, --config, --set, and a few shortcuts), threads and
// the backend choice.
#ifndef LM_CLI_H
#define LM_CLI_H
#include "cli/flags.h"
#include "model/config.h"
#include "ops.h"

typedef struct {
    char preset[32];
    char config_file[1024];
    lm_flag_list set;          // key=value overrides of model config fields
    char balance[16], residual[16], gate[16];
    int threads;
    char device[16];
} lm_model_flags;

void lm_model_flags_default(lm_model_flags *f);
// Appends the shared flags to a table; returns the new count.
int lm_model_flags_add(lm_model_flags *f, lm_flag *fl, int n);
// Builds and finalises the config (preset, then file, then shortcuts, then --set).
lm_status lm_model_flags_config(const lm_model_flags *f, lm_config *c);
// Applies --threads and picks the backend for --device.
lm_status lm_model_flags_backend(const lm_model_flags *f, const lm_ops **ops);

int lm_cmd_train(int argc, char **argv);
int lm_cmd_generate(int argc, char **argv);
int lm_cmd_eval(int argc, char **argv);
int lm_cmd_plan(int argc, char **argv);
int lm_cmd_ablate(int argc, char **argv);

#endif
