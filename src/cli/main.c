// main.c — the `linmoe` program: dispatch to subcommands.
#include "cli/cli.h"
#include "train/report.h"
#include <cblas.h>
#include <unistd.h>

// Debian's OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to its SSE3
// "Prescott" kernels (about 2x slower here). The core type can only be chosen before the
// library initialises, so when that happens on a CPU with AVX2 the program restarts
// itself once with OPENBLAS_CORETYPE set. Set OPENBLAS_CORETYPE yourself to override.
static void pick_blas_kernels(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *core = openblas_get_corename();
    if (!core || strcmp(core, "Prescott") != 0 || !__builtin_cpu_supports("avx2")) return;
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    execv("/proc/self/exe", argv);   // returns only on failure: then carry on as we are
}

static void usage(FILE *f) {
    fprintf(f,
            "linmoe — train, evaluate and run hybrid KDA/MLA Mixture-of-Experts models\n\n"
            "usage: linmoe <command> [flags]   (linmoe <command> --help for its flags)\n\n"
            "commands:\n"
            "  train      train a model (default: the tiny preset on the built-in tasks)\n"
            "  generate   generate text from a checkpoint (prefill + cached decode)\n"
            "  eval       held-out loss, per-task accuracy and loss by position\n"
            "  plan       print a config with parameter counts and memory estimates\n"
            "  ablate     matched runs per technique (balance, residual, gate, mix) and a report\n"
            "  report     write report.html / report.md from training logs (metrics.jsonl)\n");
}

int main(int argc, char **argv) {
    pick_blas_kernels(argv);
    if (argc < 2) { usage(stderr); return 1; }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return lm_cmd_train(argc, argv);
    if (strcmp(cmd, "generate") == 0) return lm_cmd_generate(argc, argv);
    if (strcmp(cmd, "eval") == 0) return lm_cmd_eval(argc, argv);
    if (strcmp(cmd, "plan") == 0) return lm_cmd_plan(argc, argv);
    if (strcmp(cmd, "ablate") == 0) return lm_cmd_ablate(argc, argv);
    if (strcmp(cmd, "report") == 0) return lm_report_main(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) { usage(stdout); return 0; }
    fprintf(stderr, "linmoe: error: unknown command '%s' (commands: train, generate, eval, plan, ablate, report)\n", cmd);
    return 1;
}
