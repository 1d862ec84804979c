// tma.cu — tensor maps for the TMA copies of tma.cuh (host code)
#include "cuda_common.cuh"
#include "tma.cuh"
#include <cudaTypedefs.h>

// the driver's encoder, through the runtime (no -lcuda)
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fn, 12000, cudaEnableDefault,
                                                   &q));
        LM_CHECK(q == cudaDriverEntryPointSuccess && fn, "cuTensorMapEncodeTiled is not available from the driver");
    }
    return fn;
}

// elem: 2 (bf16) or 4 (fp32) bytes; box0 · elem = 128 (one swizzle row)
static CUtensorMap tma_map(const void *base, int elem, int rank, const long *dims, const long *strides, int box0,
                           int box1) {
    const char *type = elem == 2 ? "bf16" : "fp32";
    LM_CHECK(rank == 2 || rank == 3, "TMA map: rank %d", rank);
    // what the encoder requires (and the 128-byte swizzle row of the boxes)
    LM_CHECK(((uintptr_t)base & 15) == 0 && box0 * elem == 128 && box1 >= 1 && box1 <= 256,
             "TMA map: base %p must be 16-byte aligned, boxes %d x (1..256) %s (got %d x %d)", base, 128 / elem, type,
             box0, box1);
    for (int i = 0; i < rank; i++) LM_CHECK(dims[i] >= 1, "TMA map: dimension %d is %ld", i, dims[i]);
    for (int i = 0; i + 1 < rank; i++)
        LM_CHECK(strides[i] % 16 == 0, "TMA map: stride %d (%ld bytes) is not a multiple of 16", i, strides[i]);
    CUtensorMap m;
    cuuint64_t d[3], st[2];
    cuuint32_t box[3] = {(cuuint32_t)box0, (cuuint32_t)box1, 1}, es[3] = {1, 1, 1};
    for (int i = 0; i < rank; i++) d[i] = (cuuint64_t)dims[i];
    for (int i = 0; i + 1 < rank; i++) st[i] = (cuuint64_t)strides[i];
    CUresult r = tma_encoder()(&m, elem == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                               (cuuint32_t)rank, (void *)base, d, st, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    LM_CHECK(r == CUDA_SUCCESS,
             "cuTensorMapEncodeTiled failed (%d) for a %s tensor at %p, dims %ld x %ld x %ld (innermost first), "
             "strides %ld, %ld bytes, box %d x %d",
             (int)r, type, base, dims[0], dims[1], rank == 3 ? dims[2] : 1L, strides[0], rank == 3 ? strides[1] : 0L,
             box0, box1);
    return m;
}

CUtensorMap lm_tma_map_bf16(const void *base, int rank, const long *dims, const long *strides, int box0, int box1) {
    return tma_map(base, 2, rank, dims, strides, box0, box1);
}
CUtensorMap lm_tma_map_f32(const void *base, int rank, const long *dims, const long *strides, int box0, int box1) {
    return tma_map(base, 4, rank, dims, strides, box0, box1);
}
