// compare.h — error metrics between a result and its reference. No test framework here:
// the CUDA backend test (tests/cuda/test_cuda_ops.c) links it as well as the cmocka tests.
#ifndef LM_TEST_COMPARE_H
#define LM_TEST_COMPARE_H
#include <math.h>
#include <stddef.h>
#include "core/common.h"

// ‖a − b‖ / ‖b‖ (relative RMS error, fla's metric); 0 when both are zero, ∞ on NaN
double tu_rel_rms(const real *a, const real *b, size_t n);
// max |a − b|, ∞ on NaN
double tu_max_abs_diff(const real *a, const real *b, size_t n);
// the larger of two errors, ∞ if either is NaN (fmax returns the other one, so a NaN result
// folded into a running maximum would pass its check)
static inline double tu_worst(double a, double b) { return (a != a || b != b) ? INFINITY : a > b ? a : b; }
// the smaller of two values, NaN if either is (a lower bound checked on a running minimum fails)
static inline double tu_least(double a, double b) { return (a != a || b != b) ? NAN : a < b ? a : b; }

#endif
