// matmul.cu — the linear layer and the per-head products of MLA decode through cuBLAS
// (SGEMM, fp32; TF32 only when LM_CUDA_TF32=1, see cuda_common.cu).
//
// Row-major X [m, n] is column-major Xᵀ with leading dimension n, so each row-major
// product below is issued as the column-major product of the transposes.
#include "cuda_common.cuh"

__global__ static void add_bias_k(float *out, const float *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        out[e] += bias[e % OC];
}

// out [N,OC] = inp [N,C] · W [OC,C]ᵀ + bias [OC]
void cuda_matmul_fwd(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (C <= 0) {
        cudaCheck(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(float), lm_cuda_stream()));
    } else {
        // column-major: outᵀ [OC,N] = W (Wᵀ stored [C,OC]) ᵀ · inpᵀ [C,N]
        cublasCheck(cublasSgemm(lm_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, W, C, inp, C, &zero, out, OC));
    }
    if (bias) {
        add_bias_k<<<lm_cuda_blocks((size_t)N * OC, 256), 256, 0, lm_cuda_stream()>>>(out, bias, N, OC);
        cudaLaunchCheck();
    }
}

struct col_of_rows {   // f(i, o) = dout[i, o]
    const float *x;
    int ld;
    __device__ float operator()(int i, int o) const { return x[(size_t)i * ld + o]; }
};

// dinp [N,C] += dout · W ; dW [OC,C] += doutᵀ · inp ; dbias [OC] += Σ_rows dout
void cuda_matmul_bwd(real *dinp, real *dW, real *dbias, const real *dout, const real *inp, const real *W,
                     int N, int C, int OC) {
    if (N <= 0) return;
    const float one = 1.0f;
    if (OC > 0 && C > 0) {
        // dinpᵀ [C,N] += Wᵀ [C,OC] · doutᵀ [OC,N]
        if (dinp) cublasCheck(cublasSgemm(lm_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, W, C, dout, OC, &one, dinp, C));
        // dWᵀ [C,OC] += inpᵀ [C,N] · dout [N,OC]
        if (dW) cublasCheck(cublasSgemm(lm_cublas(), CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dW, C));
    }
    if (dbias && OC > 0) {
        float *ws = (float *)lm_cuda_scratch(colsum_ws_floats(N, OC) * sizeof(float));
        float *sums = colsum(ws, N, OC, col_of_rows{dout, OC});
        lm_cuda_acc_vec(dbias, sums, NULL, OC);
    }
}

// out [N,H,OC] = per head h: inp[:,h,:] [N,C] times W_h = W + h·w_head_stride
//   transpose = 0: W_h [OC,C], out = inp·W_hᵀ;  transpose = 1: W_h [C,OC], out = inp·W_h
// One strided-batched SGEMM over the heads.
void cuda_head_matmul(real *out, const real *inp, const real *W, int N, int H, int C, int OC,
                      long w_head_stride, int transpose) {
    if (N <= 0 || H <= 0 || OC <= 0) return;
    if (C <= 0) {
        cudaCheck(cudaMemsetAsync(out, 0, (size_t)N * H * OC * sizeof(float), lm_cuda_stream()));
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (transpose)   // outᵀ [OC,N] = W_hᵀ-as-stored [OC,C] · inpᵀ [C,N]
        cublasCheck(cublasSgemmStridedBatched(lm_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, &one, W, OC,
                                              (long long)w_head_stride, inp, H * C, C, &zero, out, H * OC, OC, H));
    else             // outᵀ [OC,N] = (W_h stored [C,OC])ᵀ · inpᵀ [C,N]
        cublasCheck(cublasSgemmStridedBatched(lm_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, W, C,
                                              (long long)w_head_stride, inp, H * C, C, &zero, out, H * OC, OC, H));
}
