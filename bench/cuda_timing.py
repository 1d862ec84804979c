"""cuda_timing.py — the one timing helper of the PyTorch side-by-side scripts in bench/."""
import statistics

import torch


def median_ms(fn, warmup=3, reps=10):
    """Median milliseconds of fn() over `reps` runs, each between two CUDA events, after `warmup` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)
