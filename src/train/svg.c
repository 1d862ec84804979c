// svg.c — text buffer, palette, axis ticks, frame, axes and legends shared by the chart
// kinds in svg_charts.c. Layout is computed here in C (no browser-side scripting), so
// text widths are estimated: DejaVu Sans / Arial average about 0.6 em per character,
// which is enough to size margins and legend columns.
#include "train/svg.h"

// ---------------------------------------------------------------------------
// buffer

static void reserve(svg_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1) cap *= 2;
    b->s = lm_realloc(b->s, cap);
    b->cap = cap;
}

void svg_printf(svg_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    LM_ASSERT(n >= 0);
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void svg_puts(svg_buf *b, const char *s) {
    size_t n = strlen(s);
    reserve(b, n);
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

void svg_escape(svg_buf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': svg_puts(b, "&amp;"); break;
        case '<': svg_puts(b, "&lt;"); break;
        case '>': svg_puts(b, "&gt;"); break;
        case '"': svg_puts(b, "&quot;"); break;
        case '\'': svg_puts(b, "&#39;"); break;
        default: {
            char c[2] = {*s, 0};
            svg_puts(b, c);
        }
        }
    }
}

void svg_buf_free(svg_buf *b) {
    free(b->s);
    *b = (svg_buf){0};
}

// ---------------------------------------------------------------------------
// palette: ten hues far apart in hue and lightness, readable on white

static const char *const palette[] = {"#2166ac", "#d6604d", "#1b9e77", "#7570b3", "#e6ab02",
                                      "#66a61e", "#e7298a", "#666666", "#a6761d", "#17becf"};
#define N_PALETTE ((int)(sizeof palette / sizeof palette[0]))

const char *svg_color(int i) { return palette[((i % N_PALETTE) + N_PALETTE) % N_PALETTE]; }

int svg_color_rgb(int i, unsigned char rgb[3]) {
    unsigned r, g, bl;
    if (sscanf(svg_color(i) + 1, "%2x%2x%2x", &r, &g, &bl) != 3) return 0;
    rgb[0] = (unsigned char)r, rgb[1] = (unsigned char)g, rgb[2] = (unsigned char)bl;
    return 1;
}

// ---------------------------------------------------------------------------
// ticks

svg_ticks svg_nice(double lo, double hi, int target, int snap) {
    if (!isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (hi < lo) { double t = lo; lo = hi; hi = t; }
    if (hi - lo < 1e-12 * fmax(1.0, fabs(hi))) {
        // a flat series still needs a visible range around it
        double pad = lo != 0 ? 0.05 * fabs(lo) : 1;
        lo -= pad, hi += pad;
    }
    double raw = (hi - lo) / (target > 1 ? target : 1);
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    if (snap) {
        lo = floor(lo / step + 1e-9) * step;
        hi = ceil(hi / step - 1e-9) * step;
    }
    return (svg_ticks){lo, hi, step};
}

void svg_fmt_tick(char *out, size_t n, double v, double step) {
    if (fabs(v) < step * 1e-9) v = 0;   // no "-0" or 1e-17 at the origin
    double a = fabs(v);
    // k/M only when every tick of the axis is a whole number of them, so one axis never
    // mixes "8000" and "12k"
    if (step >= 1e5 && fmod(step, 1e5) == 0 && a != 0) snprintf(out, n, "%gM", v / 1e6);
    else if (step >= 1e3 && fmod(step, 1e3) == 0 && a != 0) snprintf(out, n, "%gk", v / 1e3);
    else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(out, n, "%.*f", dec, v);
    }
}

void svg_fmt_value(char *out, size_t n, double v) {
    if (fabs(v) >= 100) snprintf(out, n, "%.0f", v);
    else snprintf(out, n, "%.3g", v);
}

double svg_text_width(const char *s, double font_px) {
    // count UTF-8 code points, not bytes
    size_t cp = 0;
    for (; *s; s++) cp += ((unsigned char)*s & 0xC0) != 0x80;
    return 0.6 * font_px * (double)cp;
}

double svg_px(const svg_plot *p, double x) {
    return p->x0 + (x - p->xt.lo) / (p->xt.hi - p->xt.lo) * (p->x1 - p->x0);
}

double svg_py(const svg_plot *p, double y) {
    return p->y1 - (y - p->yt.lo) / (p->yt.hi - p->yt.lo) * (p->y1 - p->y0);
}

// ---------------------------------------------------------------------------
// frame, axes, legend

double svg_open(svg_buf *b, const svg_frame *f, const char *kind, int height) {
    svg_printf(b, "<figure class=\"chart\" id=\"");
    svg_escape(b, f->id);
    svg_printf(b, "\" data-kind=\"%s\">\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"",
               kind, f->width, height, f->width, height);
    svg_escape(b, f->title);
    svg_printf(b, "\">\n<rect class=\"bg\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", f->width, height);
    svg_puts(b, "<text class=\"title\" x=\"10\" y=\"18\">");
    svg_escape(b, f->title);
    svg_puts(b, "</text>\n");
    if (f->subtitle && f->subtitle[0]) {
        svg_puts(b, "<text class=\"sub\" x=\"10\" y=\"33\">");
        svg_escape(b, f->subtitle);
        svg_puts(b, "</text>\n");
        return 46;
    }
    return 32;
}

void svg_close(svg_buf *b) { svg_puts(b, "</svg></figure>\n"); }

void svg_axes(svg_buf *b, const svg_frame *f, const svg_plot *p, int xticks) {
    char lab[64];
    // y grid + labels; the range was snapped to whole steps, so ticks start at lo
    int ny = (int)floor((p->yt.hi - p->yt.lo) / p->yt.step + 1e-6);
    for (int i = 0; i <= ny; i++) {
        double v = p->yt.lo + i * p->yt.step, y = svg_py(p, v);
        svg_fmt_tick(lab, sizeof lab, v, p->yt.step);
        svg_printf(b, "<line class=\"gl\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                   p->x0, y, p->x1, y, p->x0 - 5, y + 3.5, lab);
    }
    if (xticks) {
        double first = ceil(p->xt.lo / p->xt.step - 1e-9) * p->xt.step;
        for (double v = first; v <= p->xt.hi + 1e-9 * p->xt.step; v += p->xt.step) {
            double x = svg_px(p, v);
            svg_fmt_tick(lab, sizeof lab, v, p->xt.step);
            svg_printf(b, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                       "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                       x, p->y1, x, p->y1 + 4, x, p->y1 + 15, lab);
        }
    }
    svg_printf(b, "<path class=\"axis\" d=\"M%.1f,%.1f V%.1f H%.1f\" fill=\"none\"/>\n", p->x0, p->y0,
               p->y1, p->x1);
    svg_printf(b, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
               0.5 * (p->x0 + p->x1), p->y1 + 31);
    svg_escape(b, f->xlabel);
    svg_printf(b, "</text>\n<text class=\"label\" transform=\"translate(13 %.1f) rotate(-90)\" "
               "text-anchor=\"middle\">", 0.5 * (p->y0 + p->y1));
    svg_escape(b, f->ylabel);
    svg_puts(b, "</text>\n");
}

#define LEGEND_FONT 11.0

double svg_legend_width(const char *const *labels, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, svg_text_width(labels[i], LEGEND_FONT));
    return fmin(200, 30 + w);
}

void svg_legend(svg_buf *b, double x, double y, const char *const *labels,
                const char *const *colors, int n, int lines) {
    svg_printf(b, "<g class=\"legend\">\n");
    for (int i = 0; i < n; i++) {
        double yy = y + 16 * i;
        if (lines)
            svg_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                       "stroke-width=\"2.5\"/>", x, yy, x + 18, yy, colors[i]);
        else
            svg_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"11\" height=\"11\" fill=\"%s\"/>",
                       x + 3, yy - 5.5, colors[i]);
        svg_printf(b, "<text class=\"key\" x=\"%.1f\" y=\"%.1f\">", x + 24, yy + 4);
        svg_escape(b, labels[i]);
        svg_puts(b, "</text>\n");
    }
    svg_puts(b, "</g>\n");
}
