// harness.h — shared helpers for the test programs: random tensors, error metrics,
// finite-difference gradient checks, and one "measured" line per check so every
// run prints the largest error it saw next to the tolerance it enforced.
#ifndef LM_TEST_HARNESS_H
#define LM_TEST_HARNESS_H
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <cmocka.h>
#include "core/common.h"
#include "core/rng.h"
#include "compare.h"

// TOL(f64, f32): the tolerance for the build being tested
#ifdef LM_DOUBLE
#define TOL(t64, t32) (t64)
#else
#define TOL(t64, t32) (t32)
#endif

real *tu_alloc(size_t n);                                        // zeroed
real *tu_randn(size_t n, lm_rng *r, double std);                 // N(0, std²)
real *tu_rand_uniform(size_t n, lm_rng *r, double lo, double hi);
real *tu_copy(const real *x, size_t n);
double tu_dot(const real *a, const real *b, size_t n);

// Prints "measured <test>: <what> = <err> (tol <tol>)" and fails the test if err > tol
// or err is NaN.
void tu_check(const char *what, double err, double tol);

// Finite-difference gradient check of d(loss)/d(x) at up to max_checks random
// elements of x (all of them when n ≤ max_checks), central differences with step h.
// Returns the relative RMS error of the analytic gradient over the checked elements.
typedef double (*tu_loss_fn)(void *ctx);
double tu_gradcheck(real *x, const real *grad, size_t n, tu_loss_fn loss, void *ctx, double h,
                    int max_checks, lm_rng *r);
// the FD step used by the build under test
#define TU_H TOL(1e-6, 1e-2)

#endif
