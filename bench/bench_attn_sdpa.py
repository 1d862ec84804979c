"""bench_attn_sdpa.py — PyTorch scaled_dot_product_attention (causal, bf16) timed at the
attention shapes of `test_cuda_ops --bench` (B=1, T ∈ {4096, 8192, 16384}, H ∈ {8, 16}), as a
reference for src/cuda/attn_flash.cu. Reference only: nothing in linmoe uses PyTorch.

Head dims: Dqk=192 / Dv=128 (the MLA shape; FlashAttention needs Dqk = Dv, so another
backend serves it; each backend is tried explicitly and the default's pick is printed next
to them) and Dqk = Dv = 128 (FlashAttention's home shape).
fwd: forward under no_grad; fwd+bwd: forward + backward of o with a random dO.
Medians of CUDA-event timings (3 warm-up calls, 10 timed). TFLOP/s on causal FLOPs:
fwd 2·B·H·T²/2·(Dqk+Dv), bwd 2.5× that (fwd+bwd 3.5×).

    python3 bench/bench_attn_sdpa.py
"""
import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cuda_timing import median_ms   # bench/cuda_timing.py (the script's folder is on sys.path)

SHAPES = [(4096, 8), (8192, 8), (8192, 16), (16384, 8), (16384, 16)]
DIMS = [(192, 128), (128, 128)]
BACKENDS = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def time_ms(fn, warm=3, reps=10):
    return median_ms(fn, warm, reps)


def run(T, H, Dqk, Dv, name, backend):
    torch.manual_seed(0)
    q = torch.randn(1, H, T, Dqk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, H, T, Dqk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, H, T, Dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(1, H, T, Dv, device="cuda", dtype=torch.bfloat16)

    def attn():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd():
        with torch.no_grad():
            attn()

    def fwdbwd():
        q.grad = k.grad = v.grad = None
        attn().backward(do)

    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
    with ctx:
        try:
            return time_ms(fwd), time_ms(fwdbwd)
        except RuntimeError as e:   # the backend does not take these dims
            return str(e).splitlines()[0][:60], None


def main():
    warnings.filterwarnings("ignore", category=UserWarning)   # the "kernel not used because" notes
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'shape':<26} {'backend':<10} {'fwd ms':>9} {'TFLOP/s':>8} {'fwd+bwd ms':>11} {'TFLOP/s':>8} {'bwd≈ ms':>8} {'TFLOP/s':>8}")
    for Dqk, Dv in DIMS:
        for T, H in SHAPES:
            fl = H * T * T * (Dqk + Dv)   # causal forward FLOPs (B = 1)
            for name, backend in BACKENDS:
                f, fb = run(T, H, Dqk, Dv, name, backend)
                label = f"T={T} H={H} {Dqk}/{Dv}"
                if fb is None:
                    print(f"{label:<26} {name:<10} unsupported: {f}")
                    continue
                b = fb - f
                print(f"{label:<26} {name:<10} {f:9.3f} {fl / f / 1e9:8.1f} {fb:11.3f} {3.5 * fl / fb / 1e9:8.1f} "
                      f"{b:8.3f} {2.5 * fl / b / 1e9:8.1f}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
