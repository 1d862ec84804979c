// svg.h — a growing text buffer and the three chart kinds the ablation report draws
// (line chart with min–max bands, grouped bar chart with whiskers, heatmap), written as
// inline SVG so report.html needs nothing outside itself.
//
// Every chart is emitted as <figure class="chart" id=… data-kind=…><svg …>…</svg></figure>
// with a title, axis labels and a legend (a colour bar for heatmaps). Marks that encode
// data (lines, bands, markers, bars, cells) carry class="d", so the page's self-check and
// the browser test can tell a chart that shows data from an empty frame.
#ifndef LM_SVG_H
#define LM_SVG_H
#include <stdarg.h>
#include "core/common.h"

typedef struct {
    char *s;
    size_t len, cap;
} svg_buf;

void svg_printf(svg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void svg_puts(svg_buf *b, const char *s);
void svg_escape(svg_buf *b, const char *s);   // HTML/XML text and attribute escaping
void svg_buf_free(svg_buf *b);

// categorical colour i (cycles after the palette's length), as "#rrggbb"
const char *svg_color(int i);
int svg_color_rgb(int i, unsigned char rgb[3]);

typedef struct {
    const char *id;            // element id of the <figure>, unique in the page
    const char *title;
    const char *subtitle;      // optional (NULL): e.g. how the data was smoothed
    const char *xlabel, *ylabel;
    int width, height;         // height 0: the heatmap picks it from the row count
} svg_frame;

// One line: y(x) with an optional shaded band [lo, hi] (NULL for none). NaN y breaks the
// line. Series with few points also get point markers so a single eval still shows.
typedef struct {
    const char *label, *color;
    int n;
    const double *x, *y, *lo, *hi;
} svg_line;

// ymin/ymax: a fixed y range, or NaN to fit the data
void svg_line_chart(svg_buf *b, const svg_frame *f, const svg_line *lines, int n_lines, double ymin,
                    double ymax);

// Grouped bars: value[g * n_keys + k] for group g and key (legend entry) k, with a
// whisker from lo to hi (NULL for none); NaN values draw nothing. Bars start at 0.
typedef struct {
    int n_groups, n_keys;
    const char *const *groups;     // x-axis category labels
    const char *const *keys;       // legend labels
    const char *const *colors;     // one per key
    const double *value, *lo, *hi;
} svg_bars;

void svg_bar_chart(svg_buf *b, const svg_frame *f, const svg_bars *d, double ymax);

typedef enum {
    SVG_SEQUENTIAL,   // white → dark blue from vmin to vmax
    SVG_DIVERGING,    // blue (vmin) → white (vmid) → red (vmax)
} svg_scale;

// Heatmap of v[r * cols + c]; NaN cells are drawn as empty (light hatch colour).
typedef struct {
    int rows, cols;
    const char *const *row_labels, *const *col_labels;
    const double *v;
    double vmin, vmid, vmax;       // values outside [vmin, vmax] take the end colours
    svg_scale scale;
    const char *value_name;        // colour-bar caption
    int show_values;               // print values in cells when they are large enough
} svg_heat;

void svg_heatmap(svg_buf *b, const svg_frame *f, const svg_heat *h);

// ---- building blocks shared by the chart kinds (svg.c) ----
typedef struct { double lo, hi, step; } svg_ticks;
// a "nice" axis (steps of 1, 2 or 5 × 10^k, about `target` ticks) covering [lo, hi];
// snap = 1 widens the range to whole steps (y axes), 0 keeps it (x axes)
svg_ticks svg_nice(double lo, double hi, int target, int snap);
void svg_fmt_tick(char *out, size_t n, double v, double step);
void svg_fmt_value(char *out, size_t n, double v);        // a data value: 10300, 81.5, 0.213
double svg_text_width(const char *s, double font_px);   // estimate, for layout

typedef struct {
    double x0, y0, x1, y1;         // plot box in pixels (y0 top)
    svg_ticks xt, yt;              // data ranges and ticks
} svg_plot;
double svg_px(const svg_plot *p, double x);
double svg_py(const svg_plot *p, double y);

// figure + svg element + white background + title/subtitle; returns the y where the
// plot area may start
double svg_open(svg_buf *b, const svg_frame *f, const char *kind, int height);
void svg_close(svg_buf *b);
// grid lines, ticks and tick labels of a numeric y axis, the x axis unless xticks = 0,
// and both axis labels
void svg_axes(svg_buf *b, const svg_frame *f, const svg_plot *p, int xticks);
// legend column at (x, y): a line swatch (lines = 1) or a filled square per entry
void svg_legend(svg_buf *b, double x, double y, const char *const *labels,
                const char *const *colors, int n, int lines);
double svg_legend_width(const char *const *labels, int n);

#endif
