// kda_tree.cuh — the within-chunk decays of the unbounded gate on tensor cores (internal to
// src/cuda/kda_*.cu).
//
// Inside a 16-token chunk the pair (i, j), j < i, decays by e^{G_i − G_j} per channel (G the
// within-chunk cumulative gate, log2 units here). With an unbounded gate no single anchor
// keeps both factors of e^{G_i − c}·e^{c − G_j} in range, so the pairs are sorted by the
// highest bit in which i and j differ. At level s (s = 8, 4, 2, 1) row i has bit s set (an
// "upper" row), row j has it clear (a "lower" row), the bits above agree, and the anchor
//   a = (i & ~s) | (s − 1) = j | (s − 1)   (the last row of the lower half)
// lies between them: e^{G_i − G_j} = e^{G_i − G_a} · e^{G_a − G_j}, both factors ≤ 1 for any
// gate. Nothing overflows; a factor underflows only where the true decay does too. Every
// strict pair has exactly one level (64 + 32 + 16 + 8 = 120); the diagonal (decay 1) is
// taken apart.
//
// A level is one 16×8×K tensor-core product: A = [k̂ ⊙ R ; q̂s ⊙ R] over the 8 upper rows
// (R = e^{G_i − G_a}), B = k̂ ⊙ C over the 8 lower rows (C = e^{G_a − G_j}), giving the
// level's entries of k̂ᵢ·k̂ⱼ and q̂sᵢ·k̂ⱼ decayed (A's rows 0–7 and 8–15); entries whose rows lie in
// different blocks are discarded. Operands are bf16 hi + lo (≈16 bits, three products),
// as in the bounded path.
#ifndef LM_CUDA_KDA_TREE_CUH
#define LM_CUDA_KDA_TREE_CUH
#include "kda_common.cuh"

// one level's operands; rows are compact indices (tree_compact)
template <int K> struct TreeLevel {
    bf16 Ah[16][K + 8], Al[16][K + 8];   // rows 0–7: k̂ ⊙ R of the upper rows; 8–15: q̂s ⊙ R
    bf16 Bh[8][K + 8], Bl[8][K + 8];     // k̂ ⊙ C of the lower rows
};

// row r's index among the 8 upper (or lower) rows of level 2^b, and back
__host__ __device__ constexpr int tree_compact(int r, int b) { return ((r >> (b + 1)) << b) | (r & ((1 << b) - 1)); }
__device__ __forceinline__ int tree_row(int c, int b, int upper) {
    return ((c >> b) << (b + 1)) | (upper << b) | (c & ((1 << b) - 1));
}

__device__ __forceinline__ void st_split(bf16 &hi, bf16 &lo, float x) {
    hi = __float2bfloat16(x);
    lo = __float2bfloat16(x - __bfloat162float(hi));
}

// channel c's operands of level 2^B from its 16 rows held in registers: G (log2 cumulative
// gate), k̂ and q̂s (the query as the product wants it, e.g. scale·q̂). One exp2 per row.
template <int K, int B>
__device__ __forceinline__ void tree_store(TreeLevel<K> &T, int c, const float (&G)[16], const float (&kn)[16],
                                           const float (&qs)[16]) {
    constexpr int s = 1 << B;
#pragma unroll
    for (int r = 0; r < 16; r++) {
        const int cr = tree_compact(r, B);
        if (r & s) {
            float R = ex2f_(G[r] - G[(r & ~s) | (s - 1)]);
            st_split(T.Ah[cr][c], T.Al[cr][c], kn[r] * R);
            st_split(T.Ah[8 + cr][c], T.Al[8 + cr][c], qs[r] * R);
        } else {
            float C = ex2f_(G[r | (s - 1)] - G[r]);
            st_split(T.Bh[cr][c], T.Bl[cr][c], kn[r] * C);
        }
    }
}

// one warp: level 2^b's product; put(i, j, value, is_q) for each pair of the level this lane
// holds (is_q: the q̂s row's product, else the k̂ row's)
template <int K, typename Put>
__device__ __forceinline__ void tree_mma(const TreeLevel<K> &T, int b, int lane, Put put) {
    float acc[4] = {};
#pragma unroll
    for (int j = 0; j < K / 16; j++) {
        uint32_t ah[4], al[4], bh[2], bl[2];
        lda_row(ah, &T.Ah[0][0], K + 8, 16 * j, lane);
        lda_row(al, &T.Al[0][0], K + 8, 16 * j, lane);
        ldb_nk(bh, &T.Bh[0][0], K + 8, 0, 16 * j, lane);
        ldb_nk(bl, &T.Bl[0][0], K + 8, 0, 16 * j, lane);
        mma3(acc, ah, al, bh, bl);
    }
    const int g = lane >> 2, t = lane & 3;   // C rows g (k̂ part) and g + 8 (q̂s part): upper row g
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int v = 2 * t + (e & 1);
        if ((g >> b) == (v >> b)) put(tree_row(g, b, 1), tree_row(v, b, 0), acc[e], e >= 2);
    }
}

#endif
