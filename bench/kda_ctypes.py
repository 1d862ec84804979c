"""kda_ctypes.py — call the CUDA KDA kernels (src/cuda/kda.cuh, built as
build/cuda/libkda_cuda.so by `make bench-cuda`) on torch tensors, for the comparisons and
benchmarks against fla. Mirrors `kda_params` field by field."""
import ctypes
import os

import torch

_vp, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class KdaParams(ctypes.Structure):
    _fields_ = [
        ("N", _i), ("T", _i), ("cu_seqlens", _vp), ("H", _i), ("K", _i), ("V", _i),
        ("gate_mode", _i), ("exact", _i), ("lb", _f), ("scale", _f),
        ("q", _vp), ("k", _vp), ("v", _vp), ("f", _vp), ("beta", _vp),
        ("A_log", _vp), ("dt_bias", _vp), ("S0", _vp), ("o", _vp), ("S_out", _vp),
        ("d_o", _vp), ("dS_out", _vp),
        ("dq", _vp), ("dk", _vp), ("dv", _vp), ("df", _vp), ("dbeta", _vp),
        ("dA_log", _vp), ("ddt_bias", _vp), ("dS0", _vp),
        ("ws", _vp), ("save", _i), ("saved", _i), ("ws_fwd", _vp), ("scan_warps", _i), ("stream", _vp),
    ]


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.environ.get("KDA_LIB", ""), os.path.join(here, "..", "build", "cuda", "libkda_cuda.so"),
              os.path.join(here, "libkda_cuda.so")):
        if p and os.path.exists(p):
            lib = ctypes.CDLL(p)
            lib.kda_workspace_size.restype = ctypes.c_size_t
            lib.kda_workspace_size.argtypes = [ctypes.POINTER(KdaParams), _i]
            for fn in ("kda_fwd", "kda_bwd", "kda_fwd_prep", "kda_fwd_scan"):
                getattr(lib, fn).restype = _i
                getattr(lib, fn).argtypes = [ctypes.POINTER(KdaParams)]
            return lib
    raise FileNotFoundError("libkda_cuda.so not found (make bench-cuda, or set KDA_LIB)")


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def _ptr(t):
    if t is None:
        return None
    assert t.is_cuda and t.is_contiguous(), "tensors must be contiguous CUDA tensors"
    return ctypes.c_void_p(t.data_ptr())


class Kda:
    """One problem: q, k, f [B,T,H,K] bf16, v [B,T,H,V] bf16, beta (logits) [B,T,H] bf16,
    A_log [H] fp32, dt_bias [H*K] fp32, h0 [B,H,K,V] fp32 (or None); cu_seqlens int32 (B=1)."""

    def __init__(self, q, k, v, f, beta, A_log, dt_bias, h0=None, gate="bounded", lb=-5.0, scale=None,
                 cu_seqlens=None, backward=True, save=True):
        B, T, H, K = q.shape
        V = v.shape[-1]
        self.t = dict(q=q, k=k, v=v, f=f, beta=beta, A_log=A_log, dt_bias=dt_bias, h0=h0, cu=cu_seqlens)
        p = KdaParams()
        if cu_seqlens is not None:
            p.N, p.T = cu_seqlens.numel() - 1, B * T
        else:
            p.N, p.T = B, T
        p.cu_seqlens = _ptr(cu_seqlens)
        p.H, p.K, p.V = H, K, V
        p.gate_mode = 0 if gate == "bounded" else 1
        p.lb = lb
        p.scale = scale if scale is not None else K ** -0.5
        p.q, p.k, p.v, p.f, p.beta = _ptr(q), _ptr(k), _ptr(v), _ptr(f), _ptr(beta)
        p.A_log, p.dt_bias, p.S0 = _ptr(A_log), _ptr(dt_bias), _ptr(h0)
        dev = q.device
        self.o = torch.empty_like(v)
        self.ht = torch.empty(p.N, H, K, V, dtype=torch.float32, device=dev)
        p.o, p.S_out = _ptr(self.o), _ptr(self.ht)
        if backward:
            self.dq, self.dk, self.df = torch.empty_like(q), torch.empty_like(k), torch.empty_like(f)
            self.dv, self.dbeta = torch.empty_like(v), torch.empty_like(beta)
            self.dA_log, self.ddt_bias = torch.empty_like(A_log), torch.empty_like(dt_bias)
            self.dh0 = torch.empty_like(self.ht)
            p.dq, p.dk, p.df, p.dv, p.dbeta = map(_ptr, (self.dq, self.dk, self.df, self.dv, self.dbeta))
            p.dA_log, p.ddt_bias, p.dS0 = map(_ptr, (self.dA_log, self.ddt_bias, self.dh0))
        p.save = 1 if (backward and save) else 0
        self.ws = torch.empty(lib().kda_workspace_size(ctypes.byref(p), 1 if backward else 0), dtype=torch.uint8,
                              device=dev)
        p.ws = _ptr(self.ws)
        p.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.p = p

    def _call(self, fn):
        err = getattr(lib(), fn)(ctypes.byref(self.p))
        if err != 0:
            raise RuntimeError(f"{fn} failed: cuda error {err}")

    def forward(self):
        self._call("kda_fwd")
        return self.o, self.ht

    def backward(self, do, dht=None, saved=None):
        self._do, self._dht = do.contiguous(), (dht.contiguous() if dht is not None else None)
        self.p.d_o, self.p.dS_out = _ptr(self._do), _ptr(self._dht)
        self.p.saved = (1 if self.p.save else 0) if saved is None else int(saved)
        self._call("kda_bwd")
        self.p.saved = 0
        return self
