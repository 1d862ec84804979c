// kda_merge.cu — the inputs of the scans' 64-token steps (docs/cuda_kda.md, "64-token steps").
//
// The scans step one 16-token chunk at a time: V'_c = U_c − W_c S_{c−1}, then the state S_c.
// Each step is a short, latency-bound chain. Over a group of four chunks (the 64-token
// checkpoint segment), with D_c = Diag(gl_c), D_(b,c) = D_{b+1}···D_{c−1} and D_<c = D_0···D_{c−1},
//   S_{c−1} = D_<c S + Σ_{b<c} D_(b,c) Kr_bᵀ V'_b
// so the four V' solve one block lower-triangular system from the group's initial state S:
//   V'_c + Σ_{b<c} P_cb V'_b = U_c − W_c D_<c S,   P_cb = W_c D_(b,c) Kr_bᵀ  (16 × 16)
// i.e. V' = U~ − W~ S with [W~ | U~] = (I + P)^{-1} [W D_< | U] (block forward substitution).
// This kernel writes W~ and U~ in W's and U's layout; a scan step then forms all four V' from
// one product with the state and walks the four chunks' outputs and state updates, which no
// longer wait on each other's V' (kda_fwd.cu, kda_bwd.cu).
//
// One 256-thread block per (group, head). Every factor is a product of decays ≤ 1, so no
// exponent can overflow, for either gate. P and the substitution run on tensor cores with
// fp32 operands as bf16 hi + lo (~16-bit), the substitution's values in fp32 registers; W~
// and U~ are rounded to bf16 once, like W and U.
#include "kda_common.cuh"
#include "kda_scan.cuh"

#define MERGE_THREADS 256

struct MergeArgs {
    KSeq sq;
    int H, NC;
    const bf16 *W, *U, *KrT;
    const float *gl;
    bf16 *Wt, *Ut;
};

template <int K, int V>
struct MergeSmem {
    bf16 W[KDA_SEG][16][K + 8];       // W_c, then W~_c in place
    bf16 U[KDA_SEG][16][V + 8];       // U_c, then U~_c in place
    bf16 KrT[KDA_SEG][K][KDA_LD16];
    float gl[KDA_SEG][K];
    bf16 Ph[6][16][KDA_LD16], Pl[6][16][KDA_LD16];   // P_cb (b < c, at c(c−1)/2 + b) as bf16 hi + lo
};

template <int K, int V>
__global__ void __launch_bounds__(MERGE_THREADS) kda_merge_kernel(MergeArgs a) {
    static_assert(KDA_SEG == 4, "the merge is written for four chunks per group");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    MergeSmem<K, V> &S = *reinterpret_cast<MergeSmem<K, V> *>(smem_raw);
    const int h = blockIdx.x % a.H, gs = blockIdx.x / a.H;
    int n, s;
    if (!a.sq.segment(gs, n, s)) return;
    const int nsub = min(KDA_SEG, a.sq.nchunks(n) - KDA_SEG * s);
    if (nsub <= 0) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t hc0 = (size_t)h * a.NC + a.sq.chunk0(n) + KDA_SEG * s;   // the group's first chunk

    // W [16][K] and KrT [K][16] are 2K 16-byte pieces per chunk each; U 2V; gl K/4
    for (int i = tid; i < nsub * 2 * K; i += MERGE_THREADS) {
        const int c = i / (2 * K), j = i % (2 * K), r = j / (K / 8), pc = j % (K / 8);
        cp_async16(&S.W[c][r][pc * 8], a.W + (hc0 + c) * 16 * K + r * K + pc * 8);
        cp_async16(&S.KrT[c][j >> 1][(j & 1) * 8], a.KrT + (hc0 + c) * 16 * K + (j >> 1) * 16 + (j & 1) * 8);
    }
    for (int i = tid; i < nsub * 2 * V; i += MERGE_THREADS) {
        const int c = i / (2 * V), j = i % (2 * V), r = j / (V / 8), pc = j % (V / 8);
        cp_async16(&S.U[c][r][pc * 8], a.U + (hc0 + c) * 16 * V + r * V + pc * 8);
    }
    for (int i = tid; i < nsub * K / 4; i += MERGE_THREADS) {
        const int c = i / (K / 4), j = i % (K / 4);
        cp_async16(&S.gl[c][4 * j], a.gl + (hc0 + c) * K + 4 * j);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // P_cb = W_c · D_(b,c) · Kr_bᵀ: 6 pairs × 2 column tiles over the warps. W is exact bf16;
    // the decayed Kr is fp32, split hi + lo
    for (int job = warp; job < 12; job += MERGE_THREADS / 32) {
        const int pr = job >> 1, nt = job & 1;
        const int c = pr < 1 ? 1 : pr < 3 ? 2 : 3, b = pr - c * (c - 1) / 2;
        if (c >= nsub) continue;
        float acc[4] = {}, acc2[4] = {};
#pragma unroll
        for (int j = 0; j < K / 16; j++) {
            uint32_t aw[4], bh[2], bl[2];
            lda_row(aw, &S.W[c][0][0], K + 8, 16 * j, lane);
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {   // B[k][n] = D_(b,c)[k]·KrT_b[k][n], k = 16j + 2t (+1, +8, +9)
                const int k = 16 * j + 2 * t + (e & 1) + 8 * (e >> 1);
                float d = 1.f;
                for (int m = b + 1; m < c; m++) d *= S.gl[m][k];
                x[e] = d * bf(S.KrT[b][k][8 * nt + g]);
            }
            split_bf16(x[0], x[1], bh[0], bl[0]);
            split_bf16(x[2], x[3], bh[1], bl[1]);
            mma16816(acc, aw, bh);
            mma16816(acc2, aw, bl);
        }
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {   // rows g, g + 8; columns 8nt + 2t, +1
            uint32_t hi, lo;
            split_bf16(acc[2 * h2] + acc2[2 * h2], acc[2 * h2 + 1] + acc2[2 * h2 + 1], hi, lo);
            *reinterpret_cast<uint32_t *>(&S.Ph[pr][g + 8 * h2][8 * nt + 2 * t]) = hi;
            *reinterpret_cast<uint32_t *>(&S.Pl[pr][g + 8 * h2][8 * nt + 2 * t]) = lo;
        }
    }
    __syncthreads();

    // Block forward substitution, transposed so that the solved blocks feed the next products
    // straight from their C fragments: X_cᵀ = Y_cᵀ − Σ_{b<c} X_bᵀ P_cbᵀ, per 16 columns of
    // [W D_< | U] (a warp owns its columns through all four chunks; no synchronisation)
    for (int cb = warp; cb < (K + V) / 16; cb += MERGE_THREADS / 32) {
        const bool isW = cb < K / 16;
        const int col0 = isW ? 16 * cb : 16 * (cb - K / 16);
        uint32_t xa[KDA_SEG - 1][2][4];   // −X_bᵀ (columns × tokens of b) as A fragments, hi and lo
        float dlt[2] = {1.f, 1.f};        // D_<c at this thread's two columns col0 + g (+8)
#pragma unroll
        for (int c = 0; c < KDA_SEG; c++) {
            if (c >= nsub) break;
            float x[2][4];   // Y_cᵀ: element (column col0 + g (+8), token 8nt + 2t (+1))
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = col0 + g + 8 * (e >> 1), tok = 8 * nt + 2 * t + (e & 1);
                    x[nt][e] = isW ? bf(S.W[c][tok][col]) * dlt[e >> 1] : bf(S.U[c][tok][col]);
                }
#pragma unroll
            for (int b = 0; b < c; b++) {
                const int pr = c * (c - 1) / 2 + b;
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {   // B[k][n] = P_cb[n][k]: k = token of b, n = token of c
                    uint32_t bh[2], bl[2];
                    ldb_nk(bh, &S.Ph[pr][0][0], KDA_LD16, 8 * nt, 0, lane);
                    ldb_nk(bl, &S.Pl[pr][0][0], KDA_LD16, 8 * nt, 0, lane);
                    mma3(x[nt], xa[b][0], xa[b][1], bh, bl);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = col0 + g + 8 * (e >> 1), tok = 8 * nt + 2 * t + (e & 1);
                    (isW ? &S.W[c][tok][col] : &S.U[c][tok][col])[0] = __float2bfloat16(x[nt][e]);
                }
            if (c < KDA_SEG - 1) {
                split_bf16(-x[0][0], -x[0][1], xa[c][0][0], xa[c][1][0]);
                split_bf16(-x[0][2], -x[0][3], xa[c][0][1], xa[c][1][1]);
                split_bf16(-x[1][0], -x[1][1], xa[c][0][2], xa[c][1][2]);
                split_bf16(-x[1][2], -x[1][3], xa[c][0][3], xa[c][1][3]);
                if (isW) {
                    dlt[0] *= S.gl[c][col0 + g];
                    dlt[1] *= S.gl[c][col0 + g + 8];
                }
            }
        }
    }
    __syncthreads();

    for (int i = tid; i < nsub * 2 * K; i += MERGE_THREADS) {
        const int c = i / (2 * K), j = i % (2 * K), r = j / (K / 8), pc = j % (K / 8);
        *reinterpret_cast<uint4 *>(a.Wt + (hc0 + c) * 16 * K + r * K + pc * 8) =
            *reinterpret_cast<const uint4 *>(&S.W[c][r][pc * 8]);
    }
    for (int i = tid; i < nsub * 2 * V; i += MERGE_THREADS) {
        const int c = i / (2 * V), j = i % (2 * V), r = j / (V / 8), pc = j % (V / 8);
        *reinterpret_cast<uint4 *>(a.Ut + (hc0 + c) * 16 * V + r * V + pc * 8) =
            *reinterpret_cast<const uint4 *>(&S.U[c][r][pc * 8]);
    }
}

template <int K, int V>
static cudaError_t launch_merge(const kda_params *p, const KWs &w) {
    MergeArgs a;
    a.sq = kda_seq(p, w);
    a.H = p->H; a.NC = w.NC;
    a.W = w.W; a.U = w.U; a.KrT = w.KrT; a.gl = w.gl; a.Wt = w.Wt; a.Ut = w.Ut;
    const size_t smem = sizeof(MergeSmem<K, V>);
    cudaError_t e = cudaFuncSetAttribute(kda_merge_kernel<K, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const long long blocks = (long long)w.NS * p->H;
    if (blocks == 0) return cudaSuccess;
    kda_merge_kernel<K, V><<<(unsigned)blocks, MERGE_THREADS, smem, p->stream>>>(a);
    return cudaGetLastError();
}

cudaError_t kda_launch_merge(const kda_params *p, const KWs &w) {
    if (w.group <= 1) return cudaSuccess;
    if (p->K == 64) return p->V == 64 ? launch_merge<64, 64>(p, w) : launch_merge<64, 128>(p, w);
    return p->V == 64 ? launch_merge<128, 64>(p, w) : launch_merge<128, 128>(p, w);
}
