// report_md.c — report.md: the summary table and the per-task accuracy table in
// GitHub-flavoured Markdown, for terminals and READMEs.
#include "train/report_data.h"
#include "train/svg.h"

// a table cell: '|' would end the cell, newlines the row
static void md_text(svg_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '|') svg_puts(b, "\\|");
        else if (*s == '\n' || *s == '\r') svg_puts(b, " ");
        else {
            char c[2] = {*s, 0};
            svg_puts(b, c);
        }
    }
}

static void md_stat(svg_buf *b, const rp_stat *s, int decimals, double scale, int best) {
    char cell[96];
    rp_fmt_stat(cell, sizeof cell, s, decimals, scale);
    svg_printf(b, best ? " **%s** |" : " %s |", cell);
}

char *rp_render_markdown(const rp_report *rep) {
    svg_buf b = {0};
    svg_puts(&b, "# ");
    md_text(&b, rep->title);
    svg_printf(&b, "\n\n%d runs, %d variants. Mean \xC2\xB1 sample standard deviation over seeds; "
               "**bold** = best in the column (" RP_DOWN " lower is better, " RP_UP " higher).\n\n", rep->n_runs, rep->n_variants);
    svg_puts(&b, "## Summary\n\n| variant | seeds |");
    for (int c = 0; c < RP_N_COLS; c++)
        svg_printf(&b, " %s %s |", rp_cols[c].name, rp_cols[c].higher_better ? RP_UP : RP_DOWN);
    svg_puts(&b, "\n|:--|--:|");
    for (int c = 0; c < RP_N_COLS; c++) svg_puts(&b, "--:|");
    svg_puts(&b, "\n");
    for (int i = 0; i < rep->n_variants; i++) {
        const rp_variant *v = &rep->variants[i];
        svg_puts(&b, "| ");
        md_text(&b, v->name);
        svg_printf(&b, " | %d |", v->n_runs);
        for (int c = 0; c < RP_N_COLS; c++)
            md_stat(&b, &v->col[c], rp_cols[c].decimals, rp_cols[c].scale, rep->best[c] == i);
        svg_puts(&b, "\n");
    }
    svg_printf(&b, "\nfinal train loss: mean of the last %.0f%% of logged train steps. held-out loss and "
               "task accuracy: the last eval. final MaxVio: mean over MoE layers on the last logged "
               "step. tok/s: the run's `end` line (median step when the run has none).\n",
               100 * RP_FINAL_FRACTION);
    if (rep->n_tasks) {
        svg_puts(&b, "\n## Held-out accuracy per task at the last eval (%)\n\n| variant |");
        for (int t = 0; t < rep->n_tasks; t++) {
            svg_puts(&b, " ");
            md_text(&b, rep->tasks[t]);
            svg_puts(&b, " |");
        }
        svg_puts(&b, "\n|:--|");
        for (int t = 0; t < rep->n_tasks; t++) svg_puts(&b, "--:|");
        svg_puts(&b, "\n");
        for (int i = 0; i < rep->n_variants; i++) {
            svg_puts(&b, "| ");
            md_text(&b, rep->variants[i].name);
            svg_puts(&b, " |");
            for (int t = 0; t < rep->n_tasks; t++)
                md_stat(&b, &rep->variants[i].task[t], 2, 100, rp_best_task(rep, t) == i);
            svg_puts(&b, "\n");
        }
    }
    if (!b.s) svg_puts(&b, "");
    return b.s;
}
