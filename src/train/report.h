// report.h — the ablation report: reads the metrics.jsonl of several runs (variants ×
// seeds, format in docs/metrics.md) and writes one self-contained report.html (inline SVG
// charts and CSS, no network) plus report.md (the summary tables, for terminals/READMEs).
// What every chart shows and how the numbers are computed: docs/report.md.
#ifndef LM_REPORT_H
#define LM_REPORT_H
#include "core/common.h"

typedef struct {
    const char *variant;      // e.g. "block-attnres"; runs with the same name are seeds
    int seed;
    const char *jsonl_path;
} lm_report_run;

// Writes out_dir/report.html and out_dir/report.md (out_dir is created if missing).
// Errors (unreadable or malformed metrics, a variant:seed given twice, a run without
// train lines, unwritable output) return LM_ERR with lm_last_error() naming the file
// and line; nothing is half-written (files are replaced atomically).
lm_status lm_report_write(const char *out_dir, const char *title, const lm_report_run *runs, int n_runs);

// `linmoe report --out DIR [--title TEXT] VARIANT:SEED:PATH ...`; argv[0] is the
// subcommand name. Returns the process exit status (0 ok, 1 error, 2 usage).
int lm_report_main(int argc, char **argv);

#endif
