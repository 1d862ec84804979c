// cuda_exit_check.cuh — CU(call) for the standalone CUDA programs (the KDA kernel test and
// benchmark), which link the kernels but not the backend's error reporting: on failure it
// prints file:line, the call and CUDA's message, and exits with status 2.
#ifndef LM_CUDA_EXIT_CHECK_CUH
#define LM_CUDA_EXIT_CHECK_CUH
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CU(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                                      \
        }                                                                                                 \
    } while (0)

#endif
