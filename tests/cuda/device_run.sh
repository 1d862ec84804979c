#!/bin/bash
# device_run.sh — one batch on a GPU machine: the CUDA op/model test, a determinism
# re-run, timings, a TF32 model run and compute-sanitizer memcheck. Run from a folder
# holding test_cuda_ops (built by `make cuda-tests`) and lib/ (its non-CUDA shared libs).
# Logs go to $OUT (or ./out); the summary is printed last.
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=$(nproc)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv; uname -a;
  ldd --version | head -1; ldd ./test_cuda_ops; } > "$OUT/env.txt" 2>&1
if ldd ./test_cuda_ops | grep -q "not found"; then
    d=$(dirname "$(find / -name 'libcublas.so.13' -not -path '/proc/*' 2>/dev/null | head -1)")
    echo "cublas from $d" >> "$OUT/env.txt"
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
fi
S=$OUT/summary.txt
: > "$S"
t0=$(date +%s)
timeout 200 ./test_cuda_ops --bench > "$OUT/test.log" 2>&1; echo "main test rc=$? ($(( $(date +%s) - t0 )) s)" >> "$S"
timeout 60 ./test_cuda_ops --ops > "$OUT/ops2.log" 2>&1; echo "ops re-run rc=$?" >> "$S"
grep -E "err " "$OUT/test.log" | head -$(grep -c "err " "$OUT/ops2.log") > "$OUT/ops1.txt"
grep -E "err " "$OUT/ops2.log" > "$OUT/ops2.txt"
cmp -s "$OUT/ops1.txt" "$OUT/ops2.txt" && echo "ops re-run: identical errors (deterministic)" >> "$S" || echo "ops re-run: DIFFERENT errors" >> "$S"
LM_CUDA_GEMM=tf32 timeout 60 ./test_cuda_ops --model > "$OUT/tf32.log" 2>&1; echo "tf32 model rc=$?" >> "$S"
t1=$(date +%s)
timeout ${MEMCHECK_S:-90} compute-sanitizer --tool memcheck --leak-check no --print-limit 20 ./test_cuda_ops --ops > "$OUT/memcheck.log" 2>&1
echo "memcheck ops rc=$? ($(( $(date +%s) - t1 )) s): $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)" >> "$S"
t1=$(date +%s)
timeout ${MEMCHECK_S:-90} compute-sanitizer --tool memcheck --leak-check no --print-limit 20 ./test_cuda_ops --model > "$OUT/memcheck_model.log" 2>&1
echo "memcheck model rc=$? ($(( $(date +%s) - t1 )) s): $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_model.log" | tail -1)" >> "$S"
t1=$(date +%s)
timeout 60 compute-sanitizer --tool racecheck --print-limit 20 ./test_cuda_ops --ops > "$OUT/racecheck.log" 2>&1
echo "racecheck ops rc=$? ($(( $(date +%s) - t1 )) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)" >> "$S"
echo "---- failures:" >> "$S"; grep -E "FAIL|linmoe: error|CUDA error|Segmentation|Aborted" "$OUT/test.log" | head -30 >> "$S"
echo "---- model/generate:" >> "$S"; grep -E "model |generate |floor|^  [a-z].*: B=" "$OUT/test.log" >> "$S"
echo "---- tf32:" >> "$S"; grep -E "model |generate |summary" "$OUT/tf32.log" >> "$S"
echo "---- timings:" >> "$S"; sed -n '/== timings/,/== summary/p' "$OUT/test.log" >> "$S"
tail -1 "$OUT/test.log" >> "$S"
cat "$S"
