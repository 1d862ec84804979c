// embed.cu — token embedding lookup and its deterministic scatter-add backward; the
// scatter-add helper (stable radix sort by destination row) is shared with moe_gather_bwd.
#include "cuda_common.cuh"
#include <cub/device/device_radix_sort.cuh>

__global__ static void embed_fwd_k(float *out, const int *tokens, const float *table, int N, int C) {
    size_t n = (size_t)N * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / C, c = e % C;
        out[e] = table[(size_t)tokens[i] * C + c];
    }
}

void cuda_embed_fwd(real *out, const int *tokens, const real *table, int N, int C) {
    if (N <= 0 || C <= 0) return;
    embed_fwd_k<<<lm_cuda_blocks((size_t)N * C, 256), 256, 0, lm_cuda_stream()>>>(out, tokens, table, N, C);
    cudaLaunchCheck();
}

__global__ static void iota_k(int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = i;
}

// one block per sorted position p; only the first position of each run of equal keys works
__global__ static void scatter_runs_k(float *dst, const int *skey, const int *sval, const float *src, int n, int C) {
    int p = blockIdx.x;
    int key = skey[p];
    if (key < 0 || (p > 0 && skey[p - 1] == key)) return;   // negative keys: rows to skip
    int end = p + 1;
    while (end < n && skey[end] == key) end++;
    float *d = dst + (size_t)key * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = d[c];
        for (int q = p; q < end; q++) acc += src[(size_t)sval[q] * C + c];
        d[c] = acc;
    }
}

void lm_cuda_scatter_add_rows(float *dst, const int *keys, const float *src, int n, int C, int key_bits) {
    if (!dst || n <= 0 || C <= 0) return;
    if (key_bits < 1) key_bits = 1;
    if (key_bits > 32) key_bits = 32;
    size_t tmp = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int *)NULL, (int *)NULL, (const int *)NULL,
                                              (int *)NULL, n, 0, key_bits, lm_cuda_stream()));
    size_t vbytes = lm_align256((size_t)n * sizeof(int));
    char *ws = (char *)lm_cuda_scratch(3 * vbytes + lm_align256(tmp));
    int *vin = (int *)ws, *skey = (int *)(ws + vbytes), *sval = (int *)(ws + 2 * vbytes);
    void *tws = ws + 3 * vbytes;
    iota_k<<<(n + 255) / 256, 256, 0, lm_cuda_stream()>>>(vin, n);
    cudaLaunchCheck();
    cudaCheck(cub::DeviceRadixSort::SortPairs(tws, tmp, keys, skey, vin, sval, n, 0, key_bits, lm_cuda_stream()));
    scatter_runs_k<<<n, C < 256 ? ((C + 31) / 32) * 32 : 256, 0, lm_cuda_stream()>>>(dst, skey, sval, src, n, C);
    cudaLaunchCheck();
}

// dtable [Vocab,C] += scatter of dout [N,C]: repeated tokens add up in token order, as on
// the CPU (deterministic; no float atomics). The vocabulary size is not an argument, so
// the sort uses all 31 key bits of the (non-negative) token ids.
void cuda_embed_bwd(real *dtable, const int *tokens, const real *dout, int N, int C) {
    lm_cuda_scatter_add_rows(dtable, tokens, dout, N, C, 31);
}
