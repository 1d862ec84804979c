// svg_charts.c — the three chart kinds of svg.h: line chart with bands, grouped bars,
// heatmap. Coordinates are printed with one decimal: sub-pixel precision is invisible and
// keeps a report with thousands of points small.
#include "train/svg.h"

#define MARKER_MAX_POINTS 40   // fewer points than this: draw a dot at each

// the plot box common to line and bar charts: room on the left for y tick labels, on the
// right for the legend column, below for x tick labels and the x axis label
static svg_plot plot_box(const svg_frame *f, double top, double legend_w) {
    svg_plot p = {0};
    p.x0 = 62, p.x1 = f->width - legend_w - 16;
    p.y0 = top + 6, p.y1 = f->height - 40;
    return p;
}

static void clip_open(svg_buf *b, const svg_frame *f, const svg_plot *p) {
    svg_puts(b, "<clipPath id=\"clip-");
    svg_escape(b, f->id);
    svg_printf(b, "\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n<g clip-path=\"url(#clip-",
               p->x0, p->y0 - 1, p->x1 - p->x0, p->y1 - p->y0 + 2);
    svg_escape(b, f->id);
    svg_puts(b, ")\">\n");
}

// ---------------------------------------------------------------------------
// line chart

static int ok2(double a, double b) { return isfinite(a) && isfinite(b); }

static void band_path(svg_buf *b, const svg_plot *p, const svg_line *l) {
    // one closed polygon per run of consecutive finite points: upper edge forward, lower back
    int i = 0;
    svg_printf(b, "<path class=\"d band\" fill=\"%s\" d=\"", l->color);
    while (i < l->n) {
        while (i < l->n && !(ok2(l->x[i], l->lo[i]) && isfinite(l->hi[i]))) i++;
        int s = i;
        while (i < l->n && ok2(l->x[i], l->lo[i]) && isfinite(l->hi[i])) i++;
        if (i - s < 2) continue;
        for (int k = s; k < i; k++)
            svg_printf(b, "%c%.1f,%.1f", k == s ? 'M' : 'L', svg_px(p, l->x[k]), svg_py(p, l->hi[k]));
        for (int k = i - 1; k >= s; k--)
            svg_printf(b, "L%.1f,%.1f", svg_px(p, l->x[k]), svg_py(p, l->lo[k]));
        svg_puts(b, "Z");
    }
    svg_puts(b, "\"/>\n");
}

static void line_path(svg_buf *b, const svg_plot *p, const svg_line *l) {
    int pen = 0, drawn = 0;
    svg_buf d = {0};
    for (int i = 0; i < l->n; i++) {
        if (!ok2(l->x[i], l->y[i])) { pen = 0; continue; }
        svg_printf(&d, "%c%.1f,%.1f", pen ? 'L' : 'M', svg_px(p, l->x[i]), svg_py(p, l->y[i]));
        drawn += pen;
        pen = 1;
    }
    if (drawn) svg_printf(b, "<path class=\"d line\" stroke=\"%s\" d=\"%s\"/>\n", l->color, d.s);
    svg_buf_free(&d);
    int pts = 0;
    for (int i = 0; i < l->n; i++) pts += ok2(l->x[i], l->y[i]);
    if (pts && pts < MARKER_MAX_POINTS)
        for (int i = 0; i < l->n; i++)
            if (ok2(l->x[i], l->y[i]))
                svg_printf(b, "<circle class=\"d pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.8\" fill=\"%s\"/>",
                           svg_px(p, l->x[i]), svg_py(p, l->y[i]), l->color);
    if (pts && pts < MARKER_MAX_POINTS) svg_puts(b, "\n");
}

void svg_line_chart(svg_buf *b, const svg_frame *f, const svg_line *lines, int n_lines, double ymin,
                    double ymax) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int s = 0; s < n_lines; s++)
        for (int i = 0; i < lines[s].n; i++) {
            double x = lines[s].x[i];
            double v[3] = {lines[s].y[i], lines[s].lo ? lines[s].lo[i] : NAN, lines[s].hi ? lines[s].hi[i] : NAN};
            if (!isfinite(x)) continue;
            for (int k = 0; k < 3; k++)
                if (isfinite(v[k])) {
                    xlo = fmin(xlo, x), xhi = fmax(xhi, x);
                    ylo = fmin(ylo, v[k]), yhi = fmax(yhi, v[k]);
                }
        }
    if (isfinite(ymin)) ylo = ymin;
    if (isfinite(ymax)) yhi = ymax;
    const char **labels = lm_malloc(sizeof(char *) * (size_t)(n_lines + 1));
    const char **colors = lm_malloc(sizeof(char *) * (size_t)(n_lines + 1));
    for (int s = 0; s < n_lines; s++) labels[s] = lines[s].label, colors[s] = lines[s].color;

    double top = svg_open(b, f, "line", f->height);
    double lw = svg_legend_width(labels, n_lines);
    svg_plot p = plot_box(f, top, lw);
    p.xt = svg_nice(xlo, xhi, (int)((p.x1 - p.x0) / 80), 0);
    p.yt = svg_nice(ylo, yhi, 5, 1);
    svg_axes(b, f, &p, 1);
    clip_open(b, f, &p);
    for (int s = 0; s < n_lines; s++)
        if (lines[s].lo && lines[s].hi) band_path(b, &p, &lines[s]);
    for (int s = 0; s < n_lines; s++) line_path(b, &p, &lines[s]);
    svg_puts(b, "</g>\n");
    svg_legend(b, p.x1 + 12, p.y0 + 8, labels, colors, n_lines, 1);
    svg_close(b);
    free(labels);
    free(colors);
}

// ---------------------------------------------------------------------------
// grouped bars

// copies s into out, cut with "…" so it takes at most max_px at font_px
static void fit_label(char *out, size_t n, const char *s, double max_px, double font_px) {
    snprintf(out, n, "%s", s);
    if (svg_text_width(out, font_px) <= max_px) return;
    size_t len = strlen(out);
    while (len > 0 && svg_text_width(out, font_px) + 0.6 * font_px > max_px) {
        do len--; while (len > 0 && ((unsigned char)out[len] & 0xC0) == 0x80);
        out[len] = 0;
    }
    if (len + 4 <= n) strcat(out, "\xE2\x80\xA6");
}

void svg_bar_chart(svg_buf *b, const svg_frame *f, const svg_bars *d, double ymax) {
    int G = d->n_groups, K = d->n_keys;
    double hi = 0;
    for (int i = 0; i < G * K; i++) {
        if (isfinite(d->value[i])) hi = fmax(hi, d->value[i]);
        if (d->hi && isfinite(d->hi[i])) hi = fmax(hi, d->hi[i]);
    }
    if (isfinite(ymax)) hi = ymax;
    if (hi <= 0) hi = 1;

    double top = svg_open(b, f, "bar", f->height);
    double lw = svg_legend_width(d->keys, K);
    svg_plot p = plot_box(f, top, lw);
    p.xt = (svg_ticks){0, G, 1};
    p.yt = svg_nice(0, hi, 5, 1);
    svg_axes(b, f, &p, 0);
    double gw = (p.x1 - p.x0) / G, bw = 0.8 * gw / K;
    char lab[128];
    for (int g = 0; g < G; g++) {
        double gx = p.x0 + g * gw;
        fit_label(lab, sizeof lab, d->groups[g], gw - 4, 11);
        svg_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", gx + 0.5 * gw, p.y1 + 15);
        svg_escape(b, lab);
        svg_puts(b, "</text>\n");
        for (int k = 0; k < K; k++) {
            int i = g * K + k;
            double v = d->value[i];
            if (!isfinite(v)) continue;
            double x = gx + 0.1 * gw + k * bw, y = svg_py(&p, fmax(v, 0));
            svg_printf(b, "<rect class=\"d bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                       "<title>", x + 1, y, fmax(bw - 2, 1), fmax(p.y1 - y, 0.5), d->colors[k]);
            svg_escape(b, d->keys[k]);
            svg_printf(b, ": %.4g</title></rect>\n", v);
            double top_y = y;
            if (d->lo && d->hi && isfinite(d->lo[i]) && isfinite(d->hi[i])) {
                double cx = x + 0.5 * bw, y0 = svg_py(&p, d->lo[i]), y1 = svg_py(&p, d->hi[i]);
                svg_printf(b, "<path class=\"whisker\" d=\"M%.1f,%.1f V%.1f M%.1f,%.1f h%.1f M%.1f,%.1f h%.1f\"/>\n",
                           cx, y0, y1, cx - 0.2 * bw, y0, 0.4 * bw, cx - 0.2 * bw, y1, 0.4 * bw);
                top_y = fmin(top_y, y1);
            }
            if (bw >= 30) {
                char num[32];
                svg_fmt_value(num, sizeof num, v);
                svg_printf(b, "<text class=\"val\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                           x + 0.5 * bw, top_y - 4, num);
            }
        }
    }
    svg_legend(b, p.x1 + 12, p.y0 + 8, d->keys, d->colors, K, 0);
    svg_close(b);
}

// ---------------------------------------------------------------------------
// heatmap

static void ramp(const unsigned char (*stops)[3], int n, double t, char out[8]) {
    if (!(t > 0)) t = 0;
    if (t > 1) t = 1;
    double u = t * (n - 1);
    int i = (int)floor(u);
    if (i >= n - 1) i = n - 2;
    double w = u - i;
    int c[3];
    for (int k = 0; k < 3; k++) c[k] = (int)lround((1 - w) * stops[i][k] + w * stops[i + 1][k]);
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

static const unsigned char seq_stops[][3] = {{247, 251, 255}, {158, 202, 225}, {49, 130, 189}, {8, 48, 107}};
static const unsigned char div_stops[][3] = {{33, 102, 172}, {146, 197, 222}, {247, 247, 247}, {244, 165, 130}, {178, 24, 43}};

// position of v on the colour scale, 0..1
static double scale_t(const svg_heat *h, double v) {
    if (h->scale == SVG_DIVERGING) {
        if (v < h->vmid) return 0.5 * (v - h->vmin) / (h->vmid - h->vmin);
        return 0.5 + 0.5 * (v - h->vmid) / (h->vmax - h->vmid);
    }
    return (v - h->vmin) / (h->vmax - h->vmin);
}

static void heat_color(const svg_heat *h, double t, char out[8]) {
    if (h->scale == SVG_DIVERGING) ramp(div_stops, 5, t, out);
    else ramp(seq_stops, 4, t, out);
}

void svg_heatmap(svg_buf *b, const svg_frame *f, const svg_heat *h) {
    const double label_font = 10;
    double rlw = 0, clw = 0;
    for (int r = 0; r < h->rows; r++) rlw = fmax(rlw, svg_text_width(h->row_labels[r], label_font));
    for (int c = 0; c < h->cols; c++) clw = fmax(clw, svg_text_width(h->col_labels[c], label_font));
    rlw = fmin(rlw, 150);
    const double bar_w = 84;   // colour bar column
    double x0 = 28 + rlw + 6, x1 = f->width - bar_w;
    double cw = (x1 - x0) / h->cols;
    double ch = f->height > 0 ? 0 : fmin(24, fmax(7, 300.0 / h->rows));
    int has_sub = f->subtitle && f->subtitle[0];
    double top = has_sub ? 46 : 32;
    int height = f->height > 0 ? f->height : (int)ceil(top + 6 + h->rows * ch + 44);
    if (f->height > 0) ch = (height - top - 6 - 44) / h->rows;

    svg_open(b, f, "heatmap", height);
    svg_plot p = {.x0 = x0, .x1 = x1, .y0 = top + 6, .y1 = top + 6 + h->rows * ch};
    // label every k-th row/column so labels never overlap
    int rstep = (int)ceil(12.0 / ch), cstep = (int)ceil((clw + 6) / cw);
    char lab[128], col[8];
    for (int r = 0; r < h->rows; r += rstep) {
        fit_label(lab, sizeof lab, h->row_labels[r], rlw + 1, label_font);
        svg_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", x0 - 5, p.y0 + (r + 0.5) * ch + 3.5);
        svg_escape(b, lab);
        svg_puts(b, "</text>\n");
    }
    for (int c = 0; c < h->cols; c += cstep) {
        svg_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x0 + (c + 0.5) * cw, p.y1 + 13);
        svg_escape(b, h->col_labels[c]);
        svg_puts(b, "</text>\n");
    }
    for (int r = 0; r < h->rows; r++)
        for (int c = 0; c < h->cols; c++) {
            double v = h->v[(size_t)r * h->cols + c];
            double x = x0 + c * cw, y = p.y0 + r * ch;
            if (!isfinite(v)) {
                svg_printf(b, "<rect class=\"na\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", x, y, cw, ch);
                continue;
            }
            double t = scale_t(h, v);
            heat_color(h, t, col);
            svg_printf(b, "<rect class=\"d cell\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>",
                       x, y, cw, ch, col);
            svg_escape(b, h->row_labels[r]);
            svg_puts(b, " / ");
            svg_escape(b, h->col_labels[c]);
            svg_printf(b, ": %.4g</title></rect>", v);
            if (h->show_values && cw >= 30 && ch >= 14) {
                // dark text on the light half of the scale, white on the dark ends
                double tt = h->scale == SVG_DIVERGING ? fabs(t - 0.5) * 2 : t;
                svg_printf(b, "<text class=\"cellv\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"%s\">%.2f</text>",
                           x + 0.5 * cw, y + 0.5 * ch + 3.5, tt > 0.6 ? "#fff" : "#222", v);
            }
            svg_puts(b, "\n");
        }
    svg_printf(b, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\"/>\n",
               x0, p.y0, x1 - x0, p.y1 - p.y0);
    // axis labels
    svg_printf(b, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", 0.5 * (x0 + x1), p.y1 + 30);
    svg_escape(b, f->xlabel);
    svg_printf(b, "</text>\n<text class=\"label\" transform=\"translate(13 %.1f) rotate(-90)\" text-anchor=\"middle\">",
               0.5 * (p.y0 + p.y1));
    svg_escape(b, f->ylabel);
    svg_puts(b, "</text>\n");
    // colour bar legend: the scale from vmin (bottom) to vmax (top)
    const int steps = 32;
    double bx = x1 + 14, bh = fmax(60, fmin(p.y1 - p.y0, 160)), by = p.y0 + 14;
    svg_puts(b, "<g class=\"legend\"><text class=\"key\" x=\"");
    svg_printf(b, "%.1f\" y=\"%.1f\">", bx - 4, p.y0 + 4);
    svg_escape(b, h->value_name);
    svg_puts(b, "</text>\n");
    for (int i = 0; i < steps; i++) {
        heat_color(h, (i + 0.5) / steps, col);
        svg_printf(b, "<rect x=\"%.1f\" y=\"%.2f\" width=\"12\" height=\"%.2f\" fill=\"%s\"/>", bx,
                   by + bh - (i + 1) * bh / steps, bh / steps + 0.3, col);
    }
    double marks[3] = {h->vmin, h->vmid, h->vmax};
    for (int i = 0; i < 3; i++) {
        if (i == 1 && h->scale != SVG_DIVERGING) continue;
        double y = by + bh * (1 - scale_t(h, marks[i]));
        svg_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">%g%s</text>", bx + 16, y + 3.5, marks[i],
                   i == 2 && h->scale == SVG_DIVERGING ? "+" : "");
    }
    svg_puts(b, "</g>\n");
    svg_close(b);
}
