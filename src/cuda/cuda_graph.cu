// cuda_graph.cu — recording the ops' work on the op stream as a CUDA graph and replaying it
// (ops.h graph_begin / graph_end / graph_run / graph_free / graph_epoch).
//
// Why: a one-token decode step of the `small` model is ~750 kernels of 2–10 µs each; launched
// one by one, the host's ~7 µs per launch is the step (bench_generate, session 22: 5.2 ms of
// host time for a step whose kernels take ~3.8 ms under ncu). A graph is launched once.
//
// A recorded graph holds every pointer and launch parameter the ops used while recording, so
// it is valid only while those stay put: the backend bumps an epoch at every allocation and
// free of its memory (ops alloc/free, the workspace growing, a bf16 weight copy made, remade
// or dropped) and the caller replays a graph only at the epoch it was recorded in. A
// recording during which an op would have needed one of those (so that the recorded work
// would not be the eager step's) is spoiled: graph_end returns NULL and the caller runs the
// step op by op instead. Blocks freed during a recording (the workspace it outgrew) are
// freed when it ends, after the recorded work is discarded.
#include "cuda_common.cuh"

static int g_recording, g_spoiled;
static unsigned long g_epoch = 1;
static void **g_later;
static int g_nlater, g_caplater;

int lm_cuda_recording(void) { return g_recording; }
void lm_cuda_spoil_recording(void) { g_spoiled = 1; }
void lm_cuda_mem_changed(void) { g_epoch++; }

void lm_cuda_free_later(void *p) {
    if (!p) return;
    if (g_nlater == g_caplater) {
        g_caplater = g_caplater ? 2 * g_caplater : 8;
        g_later = (void **)lm_realloc(g_later, (size_t)g_caplater * sizeof(void *));
    }
    g_later[g_nlater++] = p;
}

extern "C" unsigned long cuda_graph_epoch(void) { return g_epoch; }

// Relaxed mode: the allocation sites may still cudaMalloc while recording (they mark the
// recording spoiled); anything that would wait on the stream fails the recording instead.
extern "C" void cuda_graph_begin(void) {
    LM_CHECK(!g_recording, "cuda graph_begin: already recording");
    cudaCheck(cudaStreamBeginCapture(lm_cuda_stream(), cudaStreamCaptureModeRelaxed));
    g_recording = 1;
    g_spoiled = 0;
}

extern "C" void *cuda_graph_end(void) {
    LM_CHECK(g_recording, "cuda graph_end: not recording");
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(lm_cuda_stream(), &g);
    g_recording = 0;
    for (int i = 0; i < g_nlater; i++) cudaCheck(cudaFree(g_later[i]));
    g_nlater = 0;
    cudaGraphExec_t x = NULL;
    if (e == cudaSuccess && g && !g_spoiled) e = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaCheck(cudaGraphDestroy(g));
    if (e != cudaSuccess || g_spoiled) {
        (void)cudaGetLastError();   // a failed recording leaves its error behind
        if (x) cudaCheck(cudaGraphExecDestroy(x));
        return NULL;
    }
    return (void *)x;
}

extern "C" void cuda_graph_run(void *x) { cudaCheck(cudaGraphLaunch((cudaGraphExec_t)x, lm_cuda_stream())); }

extern "C" void cuda_graph_free(void *x) {
    if (x) cudaCheck(cudaGraphExecDestroy((cudaGraphExec_t)x));
}
