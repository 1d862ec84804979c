// common.c — error reporting, checked allocation, clock.
#include "common.h"
#include <stdarg.h>
#include <time.h>
#include <omp.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static _Thread_local char g_last_error[512];

void lm_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
}

const char *lm_last_error(void) { return g_last_error[0] ? g_last_error : "unknown error"; }

void lm_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("linmoe: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void *lm_malloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) lm_die("out of memory allocating %zu bytes", bytes);
    return p;
}

void *lm_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) lm_die("out of memory reallocating %zu bytes", bytes);
    return q;
}

char *lm_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = lm_malloc(n);
    memcpy(d, s, n);
    return d;
}

lm_status lm_make_dirs(const char *dir) {
    if (!dir[0]) { lm_set_error("the folder name is empty"); return LM_ERR; }
    char *p = lm_strdup(dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char keep = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            lm_set_error("cannot create folder '%s': %s", p, strerror(errno));
            free(p);
            return LM_ERR;
        }
        *s = keep;
        if (!keep) break;
    }
    struct stat st;
    int ok = stat(p, &st) == 0 && S_ISDIR(st.st_mode);
    if (!ok) lm_set_error("'%s' is not a folder", p);
    free(p);
    return ok ? LM_OK : LM_ERR;
}

lm_status lm_check_host_memory(double need_bytes, const char *what) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return LM_OK;   // unknown: let the allocation decide
    double have = (double)pages * (double)page;
    if (need_bytes <= have) return LM_OK;
    lm_set_error("%s needs about %.3g GB of memory, this machine has %.3g GB", what, need_bytes / 1e9, have / 1e9);
    return LM_ERR;
}

double lm_time_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double_asc(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}
double lm_median(const double *x, int n) {
    if (n <= 0) return NAN;
    double *v = lm_malloc(sizeof(double) * (size_t)n);
    memcpy(v, x, sizeof(double) * (size_t)n);
    qsort(v, (size_t)n, sizeof(double), cmp_double_asc);
    double m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return m;
}

int lm_num_threads(void) { return omp_get_max_threads(); }
