// main.c — the `linmoe` program: dispatch to subcommands.
#include "cli/cli.h"
#include "train/report.h"

static void usage(FILE *f) {
    fprintf(f,
            "linmoe — train, evaluate and run hybrid KDA/MLA Mixture-of-Experts models\n\n"
            "usage: linmoe <command> [flags]   (linmoe <command> --help for its flags)\n\n"
            "commands:\n"
            "  train      train a model (default: the tiny preset on the built-in tasks)\n"
            "  generate   generate text from a checkpoint (prefill + cached decode)\n"
            "  eval       held-out loss, per-task accuracy and loss by position\n"
            "  plan       print a config with parameter counts and memory estimates\n"
            "  report     write report.html / report.md from training logs (metrics.jsonl)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 1; }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return lm_cmd_train(argc, argv);
    if (strcmp(cmd, "generate") == 0) return lm_cmd_generate(argc, argv);
    if (strcmp(cmd, "eval") == 0) return lm_cmd_eval(argc, argv);
    if (strcmp(cmd, "plan") == 0) return lm_cmd_plan(argc, argv);
    if (strcmp(cmd, "report") == 0) return lm_report_main(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) { usage(stdout); return 0; }
    fprintf(stderr, "linmoe: error: unknown command '%s' (commands: train, generate, eval, plan, report)\n", cmd);
    return 1;
}
