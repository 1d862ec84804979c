#!/bin/sh
# run_bench.sh — our CUDA KDA kernels (build/cuda/bench_kda) and fla's chunk_kda
# (bench/bench_kda_fla.py) on the same shapes, then the side-by-side table.
# Needs the fla package on PYTHONPATH (e.g. git archive of fla-org/flash-linear-attention).
#   bench/run_bench.sh [OUTDIR]      (make bench-cuda builds first)
set -e
cd "$(dirname "$0")/.."
out=${1:-build/cuda}
mkdir -p "$out"
${BENCH_KDA:-build/cuda/bench_kda} | tee "$out/bench_ours.txt"
PYTHONUNBUFFERED=1 python3 bench/bench_kda_fla.py --ours "$out/bench_ours.txt" ${BENCH_FLA_ARGS:---ctypes} | tee "$out/bench_fla.txt"
