// xent.cu — softmax cross-entropy over the vocabulary: one block per row.
#include "cuda_common.cuh"

__global__ static void xent_fwd_k(float *losses, float *lse, const float *logits, const int *targets, int V) {
    __shared__ float sh[32];
    const int i = blockIdx.x;
    const float *z = logits + (size_t)i * V;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
    mx = block_max(mx, sh);
    float s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(z[j] - mx);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        float l = mx + logf(s);
        lse[i] = l;
        int t = targets[i];
        losses[i] = t >= 0 ? l - z[t] : 0.0f;
    }
}

void cuda_xent_fwd(real *losses, real *lse, const real *logits, const int *targets, int N, int V) {
    if (N <= 0) return;
    xent_fwd_k<<<N, V >= 256 ? 256 : ((V + 31) / 32) * 32, 0, lm_cuda_stream()>>>(losses, lse, logits, targets, V);
    cudaLaunchCheck();
}

__global__ static void xent_bwd_k(float *dlogits, const float *logits, const float *lse, const int *targets,
                                  float dloss, int V) {
    const int i = blockIdx.x, t = targets[i];
    if (t < 0) return;
    const float *z = logits + (size_t)i * V;
    float *dz = dlogits + (size_t)i * V;
    const float l = lse[i];
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = dz[j] + dloss * expf(z[j] - l);
        dz[j] = j == t ? g - dloss : g;   // the CPU's two steps: += softmax, then −= onehot
    }
}

void cuda_xent_bwd(real *dlogits, const real *logits, const real *lse, const int *targets, real dloss,
                   int N, int V) {
    if (N <= 0) return;
    xent_bwd_k<<<N, V >= 256 ? 256 : ((V + 31) / 32) * 32, 0, lm_cuda_stream()>>>(dlogits, logits, lse, targets,
                                                                                   dloss, V);
    cudaLaunchCheck();
}
