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

// The rows of one key are added in sorted order, cut at the edges of SCATTER_WIN-position
// windows: each run of equal keys is a first piece (from its start to the next window edge)
// and then whole windows' pieces; every piece is summed in order, then the pieces in order.
// One block per run (a frequent key — the space of a byte vocabulary, ~2,500 of a 16K-token
// batch — was one block reading every row of its run: 0.85 ms a `small` B4 step) now reads
// at most SCATTER_WIN − 1 rows and one partial per window.
#define SCATTER_WIN 64

// part [windows, C]: the piece starting at window w's first position (the positions from
// w·WIN on whose key is that position's, inside the window), summed in order
__global__ static void scatter_pieces_k(float *part, const int *skey, const int *sval, const float *src, int n, int C) {
    const int p0 = blockIdx.x * SCATTER_WIN, p1 = min(n, p0 + SCATTER_WIN), key = skey[p0];
    int end = p0 + 1;
    while (end < p1 && skey[end] == key) end++;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int q = p0; q < end; q++) acc += src[(size_t)sval[q] * C + c];
        part[(size_t)blockIdx.x * C + c] = acc;
    }
}

// one block per sorted position p; only the first position of each run of equal keys works:
// dst[key] += its first piece (from part when the run starts a window, else summed here),
// then the piece of every window the run continues into
__global__ static void scatter_runs_k(float *dst, const int *skey, const int *sval, const float *src,
                                      const float *part, int n, int C) {
    const int p = blockIdx.x, key = skey[p];
    if (key < 0 || (p > 0 && skey[p - 1] == key)) return;   // negative keys: rows to skip
    const int w1 = p / SCATTER_WIN + 1;   // the first window after p's
    int end = p + 1;                      // the end of the first piece (when it is summed here)
    if (p % SCATTER_WIN)
        while (end < n && end < w1 * SCATTER_WIN && skey[end] == key) end++;
    float *d = dst + (size_t)key * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float first = 0.0f;
        if (p % SCATTER_WIN == 0) first = part[(size_t)(w1 - 1) * C + c];
        else
            for (int q = p; q < end; q++) first += src[(size_t)sval[q] * C + c];
        float acc = d[c] + first;
        for (int w = w1; w * SCATTER_WIN < n && skey[w * SCATTER_WIN] == key; w++) acc += part[(size_t)w * C + c];
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
    const int nwin = (n + SCATTER_WIN - 1) / SCATTER_WIN;
    const size_t vbytes = lm_align256((size_t)n * sizeof(int)), pbytes = lm_align256((size_t)nwin * C * sizeof(float));
    char *ws = (char *)lm_cuda_scratch(3 * vbytes + pbytes + lm_align256(tmp));
    int *vin = (int *)ws, *skey = (int *)(ws + vbytes), *sval = (int *)(ws + 2 * vbytes);
    float *part = (float *)(ws + 3 * vbytes);
    void *tws = ws + 3 * vbytes + pbytes;
    iota_k<<<(n + 255) / 256, 256, 0, lm_cuda_stream()>>>(vin, n);
    cudaLaunchCheck();
    cudaCheck(cub::DeviceRadixSort::SortPairs(tws, tmp, keys, skey, vin, sval, n, 0, key_bits, lm_cuda_stream()));
    const int th = C < 256 ? ((C + 31) / 32) * 32 : 256;
    scatter_pieces_k<<<nwin, th, 0, lm_cuda_stream()>>>(part, skey, sval, src, n, C);
    cudaLaunchCheck();
    scatter_runs_k<<<n, th, 0, lm_cuda_stream()>>>(dst, skey, sval, src, part, n, C);
    cudaLaunchCheck();
}

// dtable [Vocab,C] += scatter of dout [N,C]: repeated tokens add up in token order, in
// pieces of at most SCATTER_WIN rows (deterministic; no float atomics). The vocabulary size is not an argument, so
// the sort uses all 31 key bits of the (non-negative) token ids.
void cuda_embed_bwd(real *dtable, const int *tokens, const real *dout, int N, int C) {
    lm_cuda_scatter_add_rows(dtable, tokens, dout, N, C, 31);
}
