// report_data.h — what the ablation report reads from each run's metrics.jsonl
// (docs/metrics.md), and the per-variant aggregates it draws. Internal to src/train/report*.
#ifndef LM_REPORT_DATA_H
#define LM_REPORT_DATA_H
#include "train/report.h"

// y(x) sampled at increasing x (the step)
typedef struct {
    int n, cap;
    double *x, *y;
} rp_series;

typedef struct {
    char *name;
    rp_series acc;          // accuracy at each eval that reported the task
    double last_acc;        // at the run's last eval; NaN if the task was not in it
} rp_task;

typedef struct {
    int layer;              // decoder layer index
    rp_series maxvio, entropy;
    int n_loads;            // loads from the last train line that logged this layer
    double *loads;
} rp_moe_layer;

typedef struct {
    char *name;             // e.g. "L1.ffn"
    int n;
    char **sources;
    double *alpha;
} rp_mixer;

typedef struct {
    char *variant, *path;
    int seed;
    rp_series loss, tok_s, step_ms, eval_loss;   // non-finite values are left out
    double last_eval_loss;  // of the last eval line; NaN if none (or not finite)
    int n_tasks;
    rp_task *tasks;
    int n_moe;
    rp_moe_layer *moe;
    double last_maxvio;     // mean over layers on the last train line with `moe`; NaN if none
    int n_mixers;           // AttnRes mixers of the last train line with `attnres`
    rp_mixer *mixers;
    double end_tok_s;       // from the `end` line; NaN if the run has none
    double params_total, params_active;   // from the `run` line; NaN if absent
} rp_run;

// Reads one metrics.jsonl. A malformed line or a field of the wrong type is an error
// naming the file and line. A step that goes back (a resumed run) drops the logged tail
// from that step on, so the latest log of each step wins. Call rp_run_free either way.
lm_status rp_run_load(rp_run *r, const char *path);
void rp_run_free(rp_run *r);
void rp_series_push(rp_series *s, double x, double y);
void rp_series_free(rp_series *s);

// ---------------------------------------------------------------------------
// statistics

// over the finite values only; n = how many there were
typedef struct {
    int n;
    double mean, std, min, max;   // std: sample (n − 1) standard deviation, 0 for n = 1
} rp_stat;
rp_stat rp_stat_of(const double *v, int n);

// the seeds of one variant aggregated on the union of their steps: at each step the mean,
// min and max over the seeds whose logged range covers it (linear interpolation between a
// seed's own points, so seeds logged at different steps still line up)
typedef struct {
    int n;
    double *x, *mean, *lo, *hi;
} rp_band;
rp_band rp_band_of(const rp_series *const *seeds, int n_seeds);
// at most max_points points, by averaging consecutive buckets (for drawing only)
void rp_band_thin(rp_band *b, int max_points);
void rp_band_free(rp_band *b);

// exponential moving average y_t = β y_{t−1} + (1 − β) x_t started at the first value
rp_series rp_ema(const rp_series *s, double beta);

// the summary table's columns
enum { RP_TRAIN_LOSS, RP_EVAL_LOSS, RP_TASK_ACC, RP_MAXVIO, RP_TOK_S, RP_N_COLS };
typedef struct {
    const char *name;       // column header
    int higher_better;
    int decimals;
    double scale;           // printed value = scale · value (accuracy in %)
} rp_col;
extern const rp_col rp_cols[RP_N_COLS];
#define RP_UP "\xE2\x86\x91"     // ↑ higher is better
#define RP_DOWN "\xE2\x86\x93"   // ↓ lower is better
// the value of column c for one run; NaN if the run does not have it
double rp_run_metric(const rp_run *r, int c);
// share of the logged train steps averaged into "final train loss"
#define RP_FINAL_FRACTION 0.10

typedef struct {
    char *name;
    int n_runs;
    const rp_run **runs;
    rp_stat col[RP_N_COLS];
    rp_stat *task;          // last-eval accuracy per report task (rp_report.tasks)
    int has_moe, has_attnres;
} rp_variant;

typedef struct {
    const char *title;
    int n_runs;
    rp_run *runs;
    int n_variants;
    rp_variant *variants;   // in the order variants first appear in the run list
    int n_tasks;
    char **tasks;           // union over runs, first-appearance order
    int n_layers;
    int *layers;            // MoE layer indices, union over runs, ascending
    int best[RP_N_COLS];    // index of the best variant per column; −1 if none
} rp_report;

// groups loaded runs into variants and computes the table statistics
void rp_report_build(rp_report *rep);
void rp_report_free(rp_report *rep);
// the variant with the highest mean last-eval accuracy on task t; −1 unless ≥ 2 have it
int rp_best_task(const rp_report *rep, int t);

// the two outputs
char *rp_render_html(const rp_report *rep);
char *rp_render_markdown(const rp_report *rep);
// "mean ± std" of a statistic with the column's decimals ("—" when n = 0)
void rp_fmt_stat(char *out, size_t n, const rp_stat *s, int decimals, double scale);

#endif
