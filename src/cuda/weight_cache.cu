// weight_cache.cu — bf16 copies of fp32 weights for the tensor-core GEMMs (the grouped
// expert GEMMs and the dense linear layer; declared in cuda_common.cuh).
//
// Training keeps fp32 master weights; the tensor-core GEMMs read bf16. Rounding the
// weights inside every call moves 1.5× their fp32 bytes per call (read fp32, write bf16,
// read bf16) — at Kimi-Linear's MoE shapes that is as long as the multiply itself — while
// the weights only change at an optimizer step. So each weight gets one bf16 copy (the
// forward reads it K-major, the input gradient MN-major), remade at the first use after its
// fp32 master may have changed. The ops that can write parameters say what they wrote:
// to_device, muon and scale call lm_cuda_weights_written(range), which marks the copies of
// weights overlapping that range stale (the batch's tokens and targets, uploaded between the
// forward and the backward, leave them alone); AdamW rewrites the copy of the weight it
// updates in the same pass (lm_cuda_weight_bf16_claim); the backend's free drops the copies
// of the weights inside the block it frees (lm_cuda_weight_cache_drop: memory, not just
// validity, since those weights are gone and a new one may take the address), so allocating
// and freeing activations — a ragged last micro-batch, an evaluation at another shape —
// leaves the other copies alone. lm_cuda_weights_changed() (bump an epoch: every copy stale)
// remains for code that writes weights by other means. The copies live outside the
// workspace, one cudaMalloc each.
#include "cuda_common.cuh"

typedef struct {
    const float *w;
    size_t n;
    unsigned long epoch;
    __nv_bfloat16 *buf;
    size_t cap;
} wc_entry;

#define WC_MAX 1024
static wc_entry g_wc[WC_MAX];
static int g_wc_n, g_wc_next;
static unsigned long g_epoch = 1, g_made;

unsigned long lm_cuda_weight_copies_made(void) { return g_made; }

// (a recorded graph reads the copies as they were: lm_cuda_mem_changed retires it)
void lm_cuda_weights_changed(void) {
    g_epoch++;
    lm_cuda_mem_changed();
}
void lm_cuda_weights_written(const void *p, size_t bytes) {
    const char *lo = (const char *)p, *hi = lo + bytes;
    for (int i = 0; i < g_wc_n; i++) {
        const char *wlo = (const char *)g_wc[i].w, *whi = wlo + g_wc[i].n * sizeof(float);
        if (wlo < hi && lo < whi) {
            g_wc[i].epoch = 0;
            lm_cuda_mem_changed();   // (not for the uploads of tokens and targets)
        }
    }
}

const __nv_bfloat16 *lm_cuda_weight_bf16(const float *W, size_t n) {
    wc_entry *en = NULL;
    for (int i = 0; i < g_wc_n && !en; i++)
        if (g_wc[i].w == W) en = &g_wc[i];
    if (!en) {   // a new slot; when the table is full, the oldest slot is reused
        if (g_wc_n < WC_MAX) en = &g_wc[g_wc_n++];
        else { en = &g_wc[g_wc_next]; g_wc_next = (g_wc_next + 1) % WC_MAX; }
        en->w = W;
        en->epoch = 0;
    }
    if (en->epoch == g_epoch && en->n == n) return en->buf;
    // a copy needed while recording: the recording is spoiled (nothing recorded runs) and the
    // entry left stale, so that the op-by-op rerun of the step makes the copy; the recorded
    // ops still get a buffer of the right size (cuBLAS refuses a NULL operand)
    if (lm_cuda_recording()) {
        lm_cuda_spoil_recording();
        if (n > en->cap) {
            lm_cuda_free_later(en->buf);
            cudaCheck(cudaMalloc(&en->buf, n * sizeof(__nv_bfloat16)));
            en->cap = n;
            lm_cuda_mem_changed();
        }
        return en->buf;
    }
    if (n > en->cap) {
        if (en->buf) cudaCheck(cudaFree(en->buf));
        cudaCheck(cudaMalloc(&en->buf, n * sizeof(__nv_bfloat16)));
        en->cap = n;
    }
    lm_cuda_mem_changed();
    lm_cuda_to_bf16(en->buf, W, n);
    g_made++;
    en->n = n;
    en->epoch = g_epoch;
    return en->buf;
}

__nv_bfloat16 *lm_cuda_weight_bf16_claim(const float *W, size_t n) {
    for (int i = 0; i < g_wc_n; i++)
        if (g_wc[i].w == W && g_wc[i].n == n && g_wc[i].buf) {
            g_wc[i].epoch = g_epoch;
            return g_wc[i].buf;
        }
    return NULL;
}

void lm_cuda_weight_cache_drop(const void *p, size_t bytes) {
    LM_CHECK(!lm_cuda_recording(), "cuda: bf16 weight copies dropped while recording a graph");
    lm_cuda_mem_changed();
    const char *lo = (const char *)p, *hi = lo + bytes;
    for (int i = 0; i < g_wc_n;) {
        const char *w = (const char *)g_wc[i].w;
        if (w >= lo && w < hi) {   // the last entry takes its place
            if (g_wc[i].buf) cudaCheck(cudaFree(g_wc[i].buf));
            g_wc[i] = g_wc[--g_wc_n];
            memset(&g_wc[g_wc_n], 0, sizeof g_wc[0]);
        } else {
            i++;
        }
    }
    if (g_wc_next >= g_wc_n) g_wc_next = 0;
}

void lm_cuda_weight_cache_free(void) {
    LM_CHECK(!lm_cuda_recording(), "cuda: bf16 weight copies freed while recording a graph");
    lm_cuda_mem_changed();
    for (int i = 0; i < g_wc_n; i++)
        if (g_wc[i].buf) cudaCheck(cudaFree(g_wc[i].buf));
    memset(g_wc, 0, sizeof g_wc);
    g_wc_n = g_wc_next = 0;
}
