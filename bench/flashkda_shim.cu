// flashkda_shim.cu — a C entry point to MoonshotAI/FlashKDA's forward (csrc/fwd.h), so that
// bench/bench_flashkda.py can time it beside our kernels through ctypes without building its
// PyTorch extension. Nothing of FlashKDA is in this tree: build it against a checkout of
// FlashKDA and of CUTLASS at the commit FlashKDA pins (a git-ignored folder, e.g.
// third_party/flashkda; the built library stays there too):
//
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr --expt-extended-lambda \
//        --use_fast_math -Xcompiler -fPIC -shared -I$FK/csrc -I$FK/cutlass/include \
//        -I$FK/cutlass/tools/util/include bench/flashkda_shim.cu $FK/csrc/smxx/fwd_launch.cu \
//        -o $FK/libflashkda.so
//
// The arguments are those of FlashKDA's `fwd` binding (csrc/flash_kda.cpp) after its checks:
// q, k, v, g, out [T_total, H, 128] bf16; beta_t [H, T_total] bf16 (the binding transposes
// beta, so the caller does, inside its timed region); fp32 states [N, H, 128, 128] (V × K),
// both given or both NULL; cu_seqlens int64 [N + 1] or NULL (then N sequences of T_total / N).
#include "fwd.h"
#include <stdint.h>

extern "C" int64_t flashkda_workspace_size(int64_t T_total, int64_t H, int64_t N) {
    const int64_t chunk = 16, d = 128, tiles = (T_total + chunk - 1) / chunk + N;
    const int64_t per_tile = 3 * chunk * d * 2 + d * 4 + 2 * chunk * chunk * 2;
    return H * tiles * per_tile + ((N + 1) * 4 + 127) / 128 * 128;
}

extern "C" int flashkda_fwd(const void *q, const void *k, const void *v, const void *g, const void *beta_t,
                            float scale, void *out, void *workspace, const float *A_log, const float *dt_bias,
                            float lower_bound, const float *state_in, float *state_out, const int64_t *cu_seqlens,
                            int T_total, int H, int N, cudaStream_t stream) {
    typedef cutlass::bfloat16_t B;
    const int chunk = 16;
    const bool varlen = cu_seqlens != nullptr;
    if (N <= 0 || (!varlen && T_total % N) || (!state_in) != (!state_out)) return (int)cudaErrorInvalidValue;
    const int tiles = varlen ? (T_total + chunk - 1) / chunk + N : N * ((T_total / N + chunk - 1) / chunk);
    const float gate_scale = lower_bound * 1.4426950408889634f;
    // FP32 = HS: FlashKDA instantiates the stateless variant with its flag false only
#define FK_LAUNCH(HS, VL)                                                                                           \
    launch_fwd<128, HS, HS, HS, VL>((const B *)q, (const B *)k, (const B *)v, (const B *)g, (const B *)beta_t,  \
                                      state_in, scale, state_out, (B *)out, workspace, tiles, T_total, H, N,       \
                                      cu_seqlens, A_log, dt_bias, gate_scale, stream)
    if (state_in) {
        if (varlen) FK_LAUNCH(true, true);
        else FK_LAUNCH(true, false);
    } else {
        if (varlen) FK_LAUNCH(false, true);
        else FK_LAUNCH(false, false);
    }
#undef FK_LAUNCH
    return (int)cudaGetLastError();
}
