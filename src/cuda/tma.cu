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

CUtensorMap lm_tma_map_bf16(const void *base, int rank, const long *dims, const long *strides, int box0, int box1) {
    LM_CHECK(rank == 2 || rank == 3, "TMA map: rank %d", rank);
    CUtensorMap m;
    cuuint64_t d[3], st[2];
    cuuint32_t box[3] = {(cuuint32_t)box0, (cuuint32_t)box1, 1}, es[3] = {1, 1, 1};
    for (int i = 0; i < rank; i++) d[i] = (cuuint64_t)dims[i];
    for (int i = 0; i + 1 < rank; i++) st[i] = (cuuint64_t)strides[i];
    CUresult r = tma_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)base, d, st, box, es,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    LM_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (%d) for a bf16 tensor of %ld x %ld%s", (int)r,
             dims[rank - 1], rank == 3 ? dims[1] : dims[0], rank == 3 ? " x ..." : "");
    return m;
}
