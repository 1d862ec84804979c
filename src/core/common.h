// common.h — the scalar type, error handling and small helpers every file uses.
//
// The CPU reference is compiled twice from the same sources: as the fp32 product
// (real = float, the source of truth for numbers) and as a float64 build used only
// by the finite-difference gradient tests (-DLM_DOUBLE), where central differences
// are accurate to ~1e-9 and a missing term in a backward shows up instead of hiding
// in fp32 rounding noise.
#ifndef LM_COMMON_H
#define LM_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>   // exp/log/sqrt follow the type of `real`

#ifdef LM_DOUBLE
typedef double real;
#define LM_REAL_NAME "f64"
#else
typedef float real;
#define LM_REAL_NAME "f32"
#endif

#define LM_MAX_LAYERS 128
#define LM_NAME_MAX 96

// ----------------------------------------------------------------------------
// errors: one clear line, non-zero exit. Library code that can fail on user input
// returns an lm_status and fills lm_last_error(); lm_die is for "cannot happen"
// conditions and for the CLI.

typedef enum { LM_OK = 0, LM_ERR = 1 } lm_status;

void lm_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *lm_last_error(void);
_Noreturn void lm_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define LM_CHECK(cond, ...)                                                   \
    do { if (!(cond)) lm_die(__VA_ARGS__); } while (0)
// internal invariant: prints file:line, never user-facing
#define LM_ASSERT(cond)                                                       \
    do { if (!(cond)) lm_die("internal error: %s at %s:%d", #cond, __FILE__, __LINE__); } while (0)

void *lm_malloc(size_t bytes);   // zeroed, dies on failure
void *lm_realloc(void *p, size_t bytes);
char *lm_strdup(const char *s);
// mkdir -p: creates dir and every missing parent; fails (with lm_last_error) if dir is not a folder
lm_status lm_make_dirs(const char *dir);
// LM_ERR ("<what> needs about X GB of memory, this machine has Y GB") when need_bytes is
// more than the machine's physical memory: a clear line instead of the kernel's OOM kill
lm_status lm_check_host_memory(double need_bytes, const char *what);

static inline real lm_sigmoid(real x) { return (real)1 / ((real)1 + exp(-x)); }
// log(1 + e^x) without overflow for large x
static inline real lm_softplus(real x) { return x > 20 ? x : log1p(exp(x)); }
static inline real lm_silu(real x) { return x * lm_sigmoid(x); }
static inline int lm_min(int a, int b) { return a < b ? a : b; }
static inline int lm_max(int a, int b) { return a > b ? a : b; }
static inline int lm_cdiv(int a, int b) { return (a + b - 1) / b; }

double lm_time_sec(void);        // monotonic wall clock
// median of x [n] (x unchanged; the mean of the middle two when n is even); NaN when n ≤ 0
double lm_median(const double *x, int n);
int lm_num_threads(void);        // OpenMP threads in use

#endif
