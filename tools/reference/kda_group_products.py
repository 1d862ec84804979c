#!/usr/bin/env python3
"""The KDA backward's value products over a group of n chunks from the two states a group keeps.

kda_bwd_vgroup_kernel's pair unit (docs/cuda_kda.md, "Pairs of chunks") takes n = 2: from S_0, the state
entering the group's first chunk, and G = dS'_{n-1}, the state gradient leaving its last, one
step of the recurrence each way gives every chunk's products. This script checks the closed form
for any n in float64 against the per-chunk products of the direct recurrences, so that a kernel
for larger groups (the scans would keep 1/n of the states) starts from verified algebra. (The
opt-in groups of four, KDA_VGROUP=4, do not use it: they run two pair units from the middle state
and state gradient, recomputed by steps of the recurrence.) With
D_m = Diag(gl_m), P_i = D_{i-1}...D_0, R_i = D_{n-1}...D_{i+1}, Q(a, b) = D_{b-1}...D_{a+1} (all
diagonal decays <= 1, empty products 1), X_i = dO_i S_0^T, XV_i = dV'_i S_0^T, Y_i = V'_i G^T,
Z = diag(S_0 G^T), A_jm = dO_j V'_m^T, B_jm = dV'_j V'_m^T, T_jm = A_jm^T Qg_j - B_jm^T W_j:

  dQg_i = X_i P_i + sum_{m<i} A_im Kr_m Q(m, i)
  dW_i  = -(XV_i P_i + sum_{m<i} B_im Kr_m Q(m, i))
  dKr_i = Y_i R_i + sum_{j>i} T_ji Q(i, j)
  dgl_i = P_i R_i Z + sum_{j>i} P_i Q(i, j) colsum(Qg_j * X_j - W_j * XV_j)
                    + sum_{m<i} R_i Q(m, i) colsum(Kr_m * Y_m)
                    + sum_{m<i<j} Q(m, i) Q(i, j) colsum(Kr_m * T_jm)

(the diagonal factors scale columns; dM_i = dO_i V'_i^T and dU_i = dV'_i need no state).
Pure Python, no dependencies: python3 tools/reference/kda_group_products.py [n ...]; exits 1 if
any product differs from the direct one by more than 1e-12."""
import random
import sys


def mat(r, c):
    return [[random.uniform(-1, 1) for _ in range(c)] for _ in range(r)]


def mm(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def tr(a):
    return [list(x) for x in zip(*a)]


def add(a, b, s=1.0):
    return [[x + s * y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def rows(d, a):   # Diag(d) a
    return [[d[i] * x for x in a[i]] for i in range(len(a))]


def cols(a, d):   # a Diag(d)
    return [[x * d[j] for j, x in enumerate(r)] for r in a]


def check(n, C=4, K=3, V=2):
    W = [mat(C, K) for _ in range(n)]
    Qg = [mat(C, K) for _ in range(n)]
    Kr = [mat(C, K) for _ in range(n)]
    U = [mat(C, V) for _ in range(n)]
    dO = [mat(C, V) for _ in range(n)]
    gl = [[random.uniform(0.2, 1) for _ in range(K)] for _ in range(n)]
    M = [[[random.uniform(-1, 1) if j <= i else 0.0 for j in range(C)] for i in range(C)] for _ in range(n)]
    S0, G = mat(K, V), mat(K, V)
    # the direct recurrences: V' = U - W S, S <- D S + Kr^T V'; dV' = M^T dO + Kr dS',
    # dS'_{i-1} = D_i dS'_i + Qg_i^T dO_i - W_i^T dV'_i
    S, Vp = [S0], []
    for i in range(n):
        Vp.append(add(U[i], mm(W[i], S[i]), -1))
        S.append(add(rows(gl[i], S[i]), mm(tr(Kr[i]), Vp[i])))
    dS, dV = [None] * n, [None] * n
    dS[n - 1] = G
    for i in range(n - 1, -1, -1):
        dV[i] = add(mm(tr(M[i]), dO[i]), mm(Kr[i], dS[i]))
        if i > 0:
            dS[i - 1] = add(add(rows(gl[i], dS[i]), mm(tr(Qg[i]), dO[i])), mm(tr(W[i]), dV[i]), -1)
    direct = [(mm(dO[i], tr(S[i])), [[-x for x in r] for r in mm(dV[i], tr(S[i]))], mm(Vp[i], tr(dS[i])),
               [[sum(S[i][k][v] * dS[i][k][v] for v in range(V)) for k in range(K)]]) for i in range(n)]

    def prod(lo, hi):   # the decays of chunks lo .. hi, per channel
        p = [1.0] * K
        for m in range(lo, hi + 1):
            p = [a * b for a, b in zip(p, gl[m])]
        return p

    def colsum(a, b):   # column sums of a ⊙ b over the chunk's tokens
        return [sum(a[t][k] * b[t][k] for t in range(C)) for k in range(K)]

    X = [mm(dO[i], tr(S0)) for i in range(n)]
    XV = [mm(dV[i], tr(S0)) for i in range(n)]
    Y = [mm(Vp[i], tr(G)) for i in range(n)]
    Z = [sum(S0[k][v] * G[k][v] for v in range(V)) for k in range(K)]
    A = {(j, m): mm(dO[j], tr(Vp[m])) for j in range(n) for m in range(j)}
    B = {(j, m): mm(dV[j], tr(Vp[m])) for j in range(n) for m in range(j)}
    Tm = {(j, m): add(mm(tr(A[j, m]), Qg[j]), mm(tr(B[j, m]), W[j]), -1) for j in range(n) for m in range(j)}
    worst = 0.0
    for i in range(n):
        P, R = prod(0, i - 1), prod(i + 1, n - 1)
        dq, dw, dk = cols(X[i], P), cols(XV[i], P), cols(Y[i], R)
        for m in range(i):
            dq = add(dq, cols(mm(A[i, m], Kr[m]), prod(m + 1, i - 1)))
            dw = add(dw, cols(mm(B[i, m], Kr[m]), prod(m + 1, i - 1)))
        for j in range(i + 1, n):
            dk = add(dk, cols(Tm[j, i], prod(i + 1, j - 1)))
        dg = [P[k] * R[k] * Z[k] for k in range(K)]
        for j in range(i + 1, n):
            cs, q = add([colsum(Qg[j], X[j])], [colsum(W[j], XV[j])], -1)[0], prod(i + 1, j - 1)
            dg = [a + P[k] * q[k] * cs[k] for k, a in enumerate(dg)]
        for m in range(i):
            cs, q = colsum(Kr[m], Y[m]), prod(m + 1, i - 1)
            dg = [a + R[k] * q[k] * cs[k] for k, a in enumerate(dg)]
            for j in range(i + 1, n):
                cs, q2 = colsum(Kr[m], Tm[j, m]), prod(i + 1, j - 1)
                dg = [a + q[k] * q2[k] * cs[k] for k, a in enumerate(dg)]
        closed = (dq, [[-x for x in r] for r in dw], dk, [dg])
        for a, b in zip(direct[i], closed):
            worst = max(worst, max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)))
    return worst


if __name__ == "__main__":
    random.seed(1)
    ok = True
    for n in [int(x) for x in sys.argv[1:]] or [1, 2, 3, 4, 8]:
        worst = check(n)
        print("n = %d chunks: max |closed form - direct| = %.2e" % (n, worst))
        ok = ok and worst < 1e-12
    sys.exit(0 if ok else 1)
