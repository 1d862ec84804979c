# linmoe — build, test, run.
#
#   make run     build, then train the `tiny` preset on the built-in tasks (CPU)
#   make test    build everything and run the whole test suite (fp32, fp64, ASan+UBSan)
#   make cuda    compile the CUDA backend with nvcc (sm_90a)
#   make test-cuda-ops   build and run the CUDA backend against the CPU reference (needs a GPU)
#
# Debian packages the project needs are installed by `make deps`, which `run` and
# `test` call first.

CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
THREADS ?= $(shell nproc)
# see src/cli/main.c: Debian's OpenBLAS picks SSE3 kernels on CPUs it does not know
ifeq ($(origin OPENBLAS_CORETYPE),undefined)
ifneq ($(shell grep -m1 -o -w avx2 /proc/cpuinfo 2>/dev/null),)
export OPENBLAS_CORETYPE := Haswell
endif
endif

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
BASE    := -std=c11 -D_GNU_SOURCE -fopenmp -Isrc -Iinclude -Itests $(WARN)
OPT     := -O2 -march=native
LDLIBS  := -lopenblas -lcjson -lm
TESTLIB := -lcmocka -lpng

DEBIAN_PKGS := libcmocka-dev libopenblas-openmp-dev libcjson-dev libpng-dev chromium fonts-dejavu-core

SRC_DIRS := src/core src/cpu src/model src/train src/infer
LIB_SRC  := $(foreach d,$(SRC_DIRS),$(wildcard $(d)/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_COMMON := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))

# three builds of the same sources: the fp32 product, the fp64 gradient-check build,
# and fp32 under AddressSanitizer + UndefinedBehaviorSanitizer
CFLAGS_f32 := $(BASE) $(OPT)
CFLAGS_f64 := $(BASE) $(OPT) -DLM_DOUBLE
CFLAGS_san := $(BASE) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all

.PHONY: all run test test-f32 test-f64 test-san test-cuda-harness deps cuda cuda-all cuda-cli cuda-tests test-cuda-ops test-cuda bench-cuda bench-moe clean bench-cpu
.DEFAULT_GOAL := all
.SECONDARY:

all: build/f32/linmoe

define VARIANT
build/$(1)/obj/%.o: %.c | deps-quiet
	@mkdir -p $$(dir $$@)
	@echo "  CC [$(1)] $$<"
	@$$(CC) $$(CFLAGS_$(1)) -MMD -MP -c $$< -o $$@

build/$(1)/liblinmoe.a: $$(patsubst %.c,build/$(1)/obj/%.o,$$(LIB_SRC))
	@rm -f $$@
	@ar rcs $$@ $$^

build/$(1)/tests/%: build/$(1)/obj/tests/%.o $$(patsubst %.c,build/$(1)/obj/%.o,$$(TEST_COMMON)) build/$(1)/liblinmoe.a
	@mkdir -p $$(dir $$@)
	@echo "  LD [$(1)] $$@"
	@$$(CC) $$(CFLAGS_$(1)) $$^ -o $$@ $$(LDLIBS) $$(TESTLIB)

build/$(1)/linmoe: $$(patsubst %.c,build/$(1)/obj/%.o,$$(CLI_SRC)) build/$(1)/liblinmoe.a
	@echo "  LD [$(1)] $$@"
	@$$(CC) $$(CFLAGS_$(1)) $$^ -o $$@ $$(LDLIBS)

TESTS_$(1) := $$(patsubst tests/%.c,build/$(1)/tests/%,$$(TEST_SRC))

test-$(1): $$(TESTS_$(1)) build/$(1)/linmoe
	@set -e; for t in $$(TESTS_$(1)); do \
	  echo "== $(1) $$$$(basename $$$$t)"; \
	  OMP_NUM_THREADS=$(THREADS) LM_BIN=build/$(1)/linmoe $$$$t; \
	done
endef
$(eval $(call VARIANT,f32))
$(eval $(call VARIANT,f64))
$(eval $(call VARIANT,san))

# sanitizer runs: leak checks on, OpenBLAS/OpenMP runtime allocations ignored
test-san test-cuda-harness: export ASAN_OPTIONS = detect_leaks=1:abort_on_error=1
test-san test-cuda-harness: export LSAN_OPTIONS = suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0
test-san test-cuda-harness: export UBSAN_OPTIONS = print_stacktrace=1:halt_on_error=1

test: deps
	$(MAKE) --no-print-directory test-f64 test-f32 test-san test-cuda-harness
	@echo "== all tests passed"

run: deps build/f32/linmoe
	build/f32/linmoe train --preset tiny --out runs/tiny --overwrite

# tests/cuda/test_cuda_ops.c with the CPU table standing in for the GPU, under the sanitizers:
# no GPU here, so every error is 0, but the test's own code (every check's setup, indexing,
# teardown) runs on every CI run and cannot rot between GPU sessions
build/san/tests/test_cuda_harness: tests/cuda/test_cuda_ops.c build/san/obj/tests/compare.o build/san/liblinmoe.a | deps-quiet
	@mkdir -p $(dir $@)
	@echo "  LD [san] $@"
	@$(CC) $(CFLAGS_san) -DTEST_HARNESS_ON_CPU $^ -o $@ $(LDLIBS)
test-cuda-harness: build/san/tests/test_cuda_harness
	@echo "== san test_cuda_ops on the CPU table (harness self-test)"
	@OMP_NUM_THREADS=$(THREADS) $< > $<.log 2>&1 || { cat $<.log; exit 1; }; tail -n 1 $<.log

# Install missing Debian packages (the project is built as root on a fresh machine).
deps:
	@missing=""; for p in $(DEBIAN_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null; } || \
	  { echo "linmoe: error: could not install:$$missing (run as root with Debian's archive reachable)"; exit 1; }; \
	fi
deps-quiet:
	@for p in $(DEBIAN_PKGS); do dpkg -s $$p >/dev/null 2>&1 || { $(MAKE) --no-print-directory deps; break; }; done

# ---- CUDA (compiled on every CI run so it cannot rot; run on a GPU machine) ----
#   make cuda        compile src/cuda/*.cu (no GPU needed)
#   make cuda-all    build every CUDA program (linmoe, tests, benchmarks; no GPU needed)
#   make test-cuda   build and run the CUDA tests against the CPU reference, then
#                    compute-sanitizer memcheck and racecheck on small shapes (GPU machine)
#   make bench-cuda  build bench/bench_kda and the shared library bench/bench_kda_fla.py loads
#   make bench-moe   build and run bench/bench_moe (the MoE layer at Kimi-Linear shapes)
CUDA_SRC := $(wildcard src/cuda/*.cu)
CUDA_OBJ := $(patsubst src/cuda/%.cu,build/cuda/obj/%.o,$(CUDA_SRC))
NVFLAGS  := -O3 -std=c++17 -arch=sm_90a -Isrc -Iinclude -DLM_CUDA --expt-relaxed-constexpr \
            -Xcompiler -Wall,-Wno-unused-parameter,-fPIC
cuda: $(CUDA_OBJ)
	@echo "== CUDA sources compiled: $(words $(CUDA_SRC))"
# every CUDA program (CI builds them all: a changed op signature must not leave a bench behind)
CUDA_PROGRAMS := build/cuda/linmoe build/cuda/tests/test_cuda_ops build/cuda/test_kda_cuda build/cuda/bench_kda \
                 build/cuda/bench_moe build/cuda/bench_generate build/cuda/bench_linres
cuda-all: $(CUDA_PROGRAMS)
	@echo "== CUDA programs built: $(words $(CUDA_PROGRAMS))"
build/cuda/obj/%.o: src/cuda/%.cu $(wildcard src/cuda/*.cuh) $(wildcard src/cuda/*.h) src/ops.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# CPU benchmark figures (bench/RESULTS.md)
build/f32/bench_cpu: build/f32/obj/bench/bench_cpu.o build/f32/liblinmoe.a
	@$(CC) $(CFLAGS_f32) $^ -o $@ $(LDLIBS)
bench-cpu: deps build/f32/bench_cpu
	build/f32/bench_cpu

# the CUDA backend against the CPU reference: every op, then the model (needs a GPU)
build/cuda/obj/tests/%.o: tests/cuda/%.c src/ops.h $(wildcard src/cuda/*.h) | deps-quiet
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_f32) -DLM_CUDA -MMD -MP -c $< -o $@
build/cuda/tests/test_cuda_ops: build/cuda/obj/tests/test_cuda_ops.o build/f32/obj/tests/compare.o $(CUDA_OBJ) build/f32/liblinmoe.a
	@mkdir -p $(dir $@)
	$(NVCC) -arch=sm_90a $^ -o $@ -lcublas -lcublasLt $(LDLIBS) -lgomp
# the `linmoe` program with the CUDA backend (--device cuda)
build/cuda/obj/cli/%.o: src/cli/%.c | deps-quiet
	@mkdir -p $(dir $@)
	@$(CC) $(CFLAGS_f32) -DLM_CUDA -MMD -MP -c $< -o $@
build/cuda/linmoe: $(patsubst src/cli/%.c,build/cuda/obj/cli/%.o,$(CLI_SRC)) $(CUDA_OBJ) build/f32/liblinmoe.a
	$(NVCC) -arch=sm_90a $^ -o $@ -lcublas -lcublasLt $(LDLIBS) -lgomp
cuda-cli: build/cuda/linmoe
# generation benchmark of the `small` preset, hybrid vs all-MLA (bench/RESULTS.md; needs a GPU to run)
build/cuda/obj/bench/%.o: bench/%.c src/ops.h $(wildcard src/cuda/*.h) | deps-quiet
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_f32) -DLM_CUDA -MMD -MP -c $< -o $@
build/cuda/bench_generate: build/cuda/obj/bench/bench_generate.o $(CUDA_OBJ) build/f32/liblinmoe.a
	$(NVCC) -arch=sm_90a $^ -o $@ -lcublas -lcublasLt $(LDLIBS) -lgomp
# a sublayer's output linear added onto the residual (lm_linears.res) against linear + add
build/cuda/bench_linres: build/cuda/obj/bench/bench_linres.o $(CUDA_OBJ) build/f32/liblinmoe.a
	$(NVCC) -arch=sm_90a $^ -o $@ -lcublas -lcublasLt $(LDLIBS) -lgomp
cuda-tests: build/cuda/tests/test_cuda_ops
test-cuda-ops: build/cuda/tests/test_cuda_ops
	build/cuda/tests/test_cuda_ops

# the CPU reference the CUDA tests compare with: the fp32 KDA and conv sources only (no
# OpenBLAS / cJSON / Debian packages needed on the GPU machine)
REF_SRC   := src/core/common.c src/cpu/kda.c src/cpu/kda_chunk.c src/cpu/kda_bwd.c src/cpu/conv.c
REF_OBJ   := $(patsubst %.c,build/cuda/ref/%.o,$(REF_SRC))
REF_FLAGS := -std=c11 -D_GNU_SOURCE -fopenmp -O2 -march=native -Isrc -Iinclude -Wall -Wextra -Wno-unused-parameter
KDA_OBJ   := $(filter build/cuda/obj/kda%.o,$(CUDA_OBJ))
# -MMD: a changed header (ops.h's lm_kda_args) rebuilds them, not only the CUDA objects
build/cuda/ref/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REF_FLAGS) -MMD -MP -c $< -o $@
build/cuda/test_kda_cuda: tests/cuda/test_kda_cuda.cu $(CUDA_OBJ) $(REF_OBJ)
	$(NVCC) $(NVFLAGS) $^ -o $@ -Xcompiler -fopenmp -lcublas -lcublasLt -lm
build/cuda/bench_kda: bench/bench_kda.cu $(KDA_OBJ)
	$(NVCC) $(NVFLAGS) $^ -o $@
build/cuda/libkda_cuda.so: $(KDA_OBJ)
	$(NVCC) -shared -arch=sm_90a $^ -o $@

# the MoE layer at Kimi-Linear shapes (bench/bench_moe.cu; bench/bench_moe_torch.py is the
# PyTorch side)
build/cuda/bench_moe: bench/bench_moe.cu $(CUDA_OBJ) build/f32/liblinmoe.a
	$(NVCC) $(NVFLAGS) $^ -o $@ -lcublas -lcublasLt $(LDLIBS) -lgomp
bench-moe: build/cuda/bench_moe
	build/cuda/bench_moe

test-cuda: build/cuda/test_kda_cuda
	build/cuda/test_kda_cuda
	compute-sanitizer --tool memcheck --error-exitcode 1 build/cuda/test_kda_cuda --small
	compute-sanitizer --tool racecheck --error-exitcode 1 build/cuda/test_kda_cuda --small
	@echo "== CUDA tests passed"
bench-cuda: build/cuda/bench_kda build/cuda/libkda_cuda.so
	bench/run_bench.sh

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
