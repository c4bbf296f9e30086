# dsv4moe build. Objects go under $(BUILD) (build/ by default); variants
# (asan, coverage) use their own folders so they never mix with the release.
#
#   make / make all     library (shared + static), CLI (with as many jobs as cores, unless -j is given)
#   make run            build, run scenarios/default.yaml (reports in out/)
#   make doc-test       the runnable blocks of README.md and docs/*.md
#   make test           the line limit, then build and run the Check suite and the CLI tests
#   make test-asan      the same under AddressSanitizer + UBSan
#   make cuda           the CUDA variant under build/cuda (library, CLI, device tests); no GPU needed
#   make cuda-test      on a GPU machine: the device tests, scenarios/gpu.yaml, compute-sanitizer
#   make nccl           the NCCL communicator + EP dispatch (build/nccl/), its test build/nccl/test_nccl
#   make test-nccl      build and run it (needs one GPU)
#   make bench          benchmarks (results under out/)
#   make coverage       gcov/lcov report under out/coverage/
#   make install        PREFIX=/usr/local: libs with soname, headers, dsv4moe.pc
#   make clean

# Parallel by default: as many jobs as the machine has cores, unless the command line gives -j (make
# 4.3 does not show the command line's -j in MAKEFLAGS while it reads the makefile, so the top-level
# make reads its own arguments; sub-makes share its job server).
ifeq ($(MAKELEVEL),0)
ifeq ($(filter -j% --jobs%,$(shell ps -o args= -p $$PPID 2>/dev/null)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
endif

VERSION_MAJOR := 0
VERSION_MINOR := 1
VERSION_PATCH := 0
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)

CC ?= cc
NVCC ?= nvcc
BUILD ?= build
PREFIX ?= /usr/local
OUT ?= out
DESTDIR ?=
# The interpreter with Debian's python3-numpy, for the independent implementation test.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)

OPT ?= -O2
SANFLAGS ?=
COVFLAGS ?=
WARN := -Wall -Wextra -Werror -pedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
CPPFLAGS_ALL := -I. -Iinclude -D_DEFAULT_SOURCE -D_FILE_OFFSET_BITS=64 -DDSV4_VERSION=\"$(VERSION)\"
# Hidden by default: the shared library exports only the functions include/dsv4moe/api.h's DSV4_API
# marks (ci/release-clean.sh checks it); programs using internal symbols link the static archive.
CFLAGS_ALL := -std=c11 $(WARN) $(OPT) -g -fPIC -fvisibility=hidden -pthread $(SANFLAGS) $(COVFLAGS) $(CFLAGS)
# The reference's numerics must not depend on the compiler fusing a*b+c.
CFLAGS_REF := -ffp-contract=off
# The production library (libdsv4moe) needs no libyaml; the harness (libdsv4moe_harness) and the
# programs that link it do.
LDLIBS_PROD := -ljansson -lopenblas -lm -pthread
LDLIBS_ALL := -ljansson -lyaml -lopenblas -lm -pthread
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -pthread)

# Two libraries: libdsv4moe (core, ref, fast: what a server links) and libdsv4moe_harness
# (scenarios, harness, compare: the test rig). PROD_SRCS and HARN_SRCS; LIB_SRCS is both.
FAULT_SRCS := core/testctl.c harness/fault_runs.c
PROD_SRCS := $(filter-out $(FAULT_SRCS),$(wildcard core/*.c) $(wildcard ref/*.c) $(wildcard fast/*/*.c) \
  $(wildcard fast/cpu/kernels/*.c))
HARN_SRCS := $(filter-out $(FAULT_SRCS),$(wildcard harness/*.c) $(wildcard compare/*.c) $(wildcard scenarios/*.c))
# ---- the fault build (make faults): test control (core/testctl.h) and the fault runs of harness/fault_runs.h ----
# FAULTS=1 compiles every object with -DDSV4_FAULTS and adds FAULT_SRCS; only ever
# with its own BUILD folder (build/faults), so the release library never holds a fault.
ifeq ($(FAULTS),1)
CPPFLAGS_ALL += -DDSV4_FAULTS
PROD_SRCS += core/testctl.c
HARN_SRCS += harness/fault_runs.c
endif
# ---- end of the fault build ----
LIB_SRCS := $(PROD_SRCS) $(HARN_SRCS)
PROD_OBJS := $(PROD_SRCS:%.c=$(BUILD)/%.o)
HARN_OBJS := $(HARN_SRCS:%.c=$(BUILD)/%.o)
LIB_OBJS := $(PROD_OBJS) $(HARN_OBJS)
CLI_SRCS := $(wildcard cli/*.c)
CLI_OBJS := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/tests/main.o $(BUILD)/bench/timeline.o
CUDA_SRCS := $(wildcard fast/cuda/*.cu) $(wildcard fast/cuda/gemm_fp8/*.cu)

SONAME := libdsv4moe.so.$(VERSION_MAJOR)
LIB_A := $(BUILD)/libdsv4moe.a
LIB_SO := $(BUILD)/libdsv4moe.so.$(VERSION)
HSONAME := libdsv4moe_harness.so.$(VERSION_MAJOR)
HLIB_A := $(BUILD)/libdsv4moe_harness.a
HLIB_SO := $(BUILD)/libdsv4moe_harness.so.$(VERSION)
# What programs link: the harness's archive before the production one's.
LIBS_A := $(HLIB_A) $(LIB_A)
CLI := $(BUILD)/dsv4moe
TEST_BIN := $(BUILD)/tests/run_tests

.PHONY: all run test line-limit release-clean test-asan test-asan-suites test-run test-suites test-build ci-build coverage-run cuda cuda-test bench bench-cuda bench-cuda-build tile-fill coverage install clean deps faults test-faults fuzz fuzz-replay example doc-test
.DEFAULT_GOAL := all

all: $(LIB_A) $(LIB_SO) $(HLIB_A) $(HLIB_SO) $(CLI)

deps:
	@sh ci/deps.sh

$(BUILD)/ref/%.o: ref/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) $(CFLAGS_REF) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# core/route.c is the reference's selection and top-p, shared with the cpu backend: the reference's flags.
$(BUILD)/core/route.o: CFLAGS_ALL += $(CFLAGS_REF)

$(LIB_A): $(PROD_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(HLIB_A): $(HARN_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# libdsv4moe.map: only dsv4_ symbols (the DSV4_API ones; the rest are hidden) leave the library.
SO_EXPORTS := -Wl,--version-script=libdsv4moe.map

$(LIB_SO): $(PROD_OBJS) libdsv4moe.map
	$(CC) -shared -Wl,-soname,$(SONAME) $(SO_EXPORTS) $(CFLAGS_ALL) -o $@ $(PROD_OBJS) $(LDLIBS_PROD)
	ln -sf libdsv4moe.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/libdsv4moe.so

# The harness's shared library links against libdsv4moe for the production API and holds its own
# copy of the few core helpers it shares with it (error records, strings, file writes), which
# libdsv4moe keeps hidden; it exports exactly the functions its headers declare with DSV4_API
# (the export list is made from include/dsv4moe_harness/*.h) and leaves no symbol unresolved.
HARN_SUPPORT_OBJS := $(BUILD)/core/status.o $(BUILD)/core/strbuf.o $(BUILD)/core/fileio.o
ifeq ($(FAULTS),1)
HARN_SUPPORT_OBJS += $(BUILD)/core/testctl.o
endif
$(BUILD)/libdsv4moe_harness.map: $(wildcard include/dsv4moe_harness/*.h)
	@mkdir -p $(dir $@)
	( echo '{ global:'; sed -n 's/.*DSV4_API[^(]*[ *]\([a-z_0-9]*\)(.*/  \1;/p' $^ | sort -u; echo 'local: *; };' ) > $@

$(HLIB_SO): $(HARN_OBJS) $(HARN_SUPPORT_OBJS) $(LIB_SO) $(BUILD)/libdsv4moe_harness.map
	$(CC) -shared -Wl,-soname,$(HSONAME) -Wl,--version-script=$(BUILD)/libdsv4moe_harness.map -Wl,--no-undefined \
	  $(CFLAGS_ALL) -o $@ $(HARN_OBJS) $(HARN_SUPPORT_OBJS) -L$(BUILD) -ldsv4moe $(LDLIBS_ALL)
	ln -sf libdsv4moe_harness.so.$(VERSION) $(BUILD)/$(HSONAME)
	ln -sf $(HSONAME) $(BUILD)/libdsv4moe_harness.so

$(CLI): $(CLI_OBJS) $(LIBS_A)
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJS) $(LIBS_A) $(LDLIBS_ALL)

# Each tests/test_NAME.c defines `Suite *NAME_suite(void)`; the list is generated.
$(BUILD)/tests/suites.h: $(TEST_SRCS)
	@mkdir -p $(dir $@)
	@( for f in $(sort $(TEST_SRCS)); do n=$$(basename $$f .c); echo "SUITE($${n#test_})"; done ) > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp

$(BUILD)/tests/main.o: tests/main.c $(BUILD)/tests/suites.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -I$(BUILD)/tests $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(TEST_BIN): $(TEST_OBJS) $(LIBS_A)
	$(CC) $(CFLAGS_ALL) $(ALLOCFAIL_WRAP) -o $@ $(TEST_OBJS) $(LIBS_A) $(LDLIBS_ALL) $(CHECK_LIBS)

# The umbrella header's example program: the lines between its EXAMPLE markers, built as a
# user would (only -Iinclude, linked against the shared library: what it exports is enough), run
# by tests/test_example.c (DSV4MOE_EXAMPLE).
EXAMPLE_BIN := $(BUILD)/examples/example

$(BUILD)/examples/example.c: include/dsv4moe/dsv4moe.h
	@mkdir -p $(dir $@)
	sed -n '/^ \* EXAMPLE-BEGIN$$/,/^ \* EXAMPLE-END$$/p' $< | sed -e '1d' -e '$$d' -e 's/^ \* \{0,1\}//' -e 's/^ \*$$//' > $@

$(EXAMPLE_BIN): $(BUILD)/examples/example.c $(LIB_SO)
	$(CC) -Iinclude $(CFLAGS_ALL) -o $@ $< -L$(BUILD) -ldsv4moe -Wl,-rpath,$(abspath $(BUILD)) -lm

# `make example` builds it alone (the README's embedded use); doc-test runs the README's and docs'
# blocks marked runnable (ci/doc-test.sh) against this build.
example: deps
	@$(MAKE) --no-print-directory $(EXAMPLE_BIN)

doc-test: deps
	@$(MAKE) --no-print-directory all $(EXAMPLE_BIN)
	@PYTHON=$(PYTHON) sh ci/doc-test.sh

# Runs the suite of this build variant; tests find the CLI and data through the environment.
# test-suites is the Check program alone (CK_RUN_SUITE / DSV4MOE_EXCLUDE_SUITE select suites).
test-run: test-suites
	@$(MAKE) --no-print-directory fuzz-replay

# (the shared library too: the Python package's tests load this build's, DSV4MOE_BUILD)
# The backend table's metric rows go to $(BUILD)/tests/rows.txt, not into the runner's output.
test-suites: $(TEST_BIN) $(CLI) $(EXAMPLE_BIN) $(LIB_SO) $(HLIB_SO)
	@rm -f $(BUILD)/tests/rows.txt
	DSV4MOE_CLI=$(abspath $(CLI)) DSV4MOE_TMP=$(abspath $(BUILD)/tests/tmp) DSV4MOE_SRC=$(CURDIR) \
	  DSV4MOE_PYTHON=$(PYTHON) DSV4MOE_EXAMPLE=$(abspath $(EXAMPLE_BIN)) DSV4MOE_TEST_COVERAGE=$(DSV4MOE_TEST_COVERAGE) \
	  DSV4MOE_TEST_ROWS=$(abspath $(BUILD)/tests/rows.txt) CK_DEFAULT_TIMEOUT=600 $(TEST_BIN)
	@echo "metric rows of the backend table: $(BUILD)/tests/rows.txt"

test: deps
	@$(MAKE) --no-print-directory line-limit
	@$(MAKE) --no-print-directory test-run
	@$(MAKE) --no-print-directory release-clean
	@$(MAKE) --no-print-directory test-faults

# The release libraries export no test or fault symbol and no installed header mentions them;
# the production library holds nothing of the harness and needs no libyaml.
release-clean: $(LIB_SO) $(HLIB_SO) $(LIB_A) $(HLIB_A)
	@sh ci/release-clean.sh $(BUILD)/libdsv4moe.so
	@sh ci/release-clean.sh $(BUILD)/libdsv4moe_harness.so $(HLIB_A) include/dsv4moe_harness

# No library source file over 1000 lines (ci/line-limit.sh lists the offenders; also a phase of .ci/run).
line-limit:
	@sh ci/line-limit.sh

# The variants' make arguments (also used by ci-build, so CI builds exactly what these run).
ASAN_VARS := BUILD=build/asan OPT=-O1 SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# Coverage at -O1: gcov's line counts stay exact for the gated code (ref, harness, scenarios,
# fast/plan) and the suite runs about 3x faster than at -O0.
COV_OPT ?= -O1
COV_VARS := BUILD=build/cov OPT=$(COV_OPT) COVFLAGS=--coverage DSV4MOE_TEST_COVERAGE=1
FAULT_VARS := BUILD=build/faults FAULTS=1

test-asan: deps
	@$(MAKE) --no-print-directory $(ASAN_VARS) test-run

# The ASan build's Check program alone (.ci/run: the allocation sweep beside the other suites).
test-asan-suites:
	@$(MAKE) --no-print-directory $(ASAN_VARS) test-suites

run: deps
	@$(MAKE) --no-print-directory all
	@sh ci/run-default.sh $(CLI) $(OUT)

# The fault build: build/faults/dsv4moe (dsv4moe run --faults) and its library.
faults: deps
	@$(MAKE) --no-print-directory BUILD=build/faults FAULTS=1 all

# The fault build's test binary runs the test cases named "faults" only (tests/test_faults.c: the detection
# table; tests/test_dist.c: a skipped metadata collective reported), the ones that need test control.
test-faults: deps
	@$(MAKE) --no-print-directory BUILD=build/faults FAULTS=1 all build/faults/tests/run_tests
	DSV4MOE_CLI=$(abspath build/faults/dsv4moe) DSV4MOE_TMP=$(abspath build/faults/tests/tmp) DSV4MOE_SRC=$(CURDIR) \
	  DSV4MOE_PYTHON=$(PYTHON) CK_RUN_CASE=faults CK_DEFAULT_TIMEOUT=600 build/faults/tests/run_tests

# ---- the CUDA variant (docs/cuda.md): build/cuda/libdsv4moe.a (the library with backend.c compiled
# -DDSV4_WITH_CUDA and fast/cuda/*.cu by nvcc for sm_90a), build/cuda/dsv4moe (the CLI) and
# build/cuda/test_cuda (the device test program). Compiles and links without a GPU.
NVCC := $(shell command -v $(NVCC) 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_BUILD := $(BUILD)/cuda
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(CUDA_BUILD)/%.o)
CUDA_LIB_A := $(CUDA_BUILD)/libdsv4moe.a
CUDA_CLI := $(CUDA_BUILD)/dsv4moe
CUDA_TEST := $(CUDA_BUILD)/test_cuda
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++ -ldl -lrt
NVCCFLAGS := -std=c++17 -O3 -I. -Iinclude -gencode=arch=compute_90a,code=sm_90a -Werror all-warnings \
  -Xcompiler -Wall,-Wextra,-Werror,-fPIC,-fvisibility=hidden $(NVCCEXTRA)

ifeq ($(FAULTS),1)
NVCCFLAGS += -DDSV4_FAULTS
endif

$(CUDA_BUILD)/fast/cuda/%.o: fast/cuda/%.cu $(wildcard fast/cuda/*.cuh) $(wildcard fast/cuda/*.h) $(wildcard include/dsv4moe/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# NVCC_ROUTER_FLAGS: nvcc flags for the one-block router (router_count.cu) alone, to weigh its code
# size against its speed (its block runs each step's code once, through cold instruction caches:
# ci/device-check.sh DSV4_DEVCHECK_PROFILE=route-opt builds it with lower optimization levels
# beside the default). Empty by default.
NVCC_ROUTER_FLAGS ?=
$(CUDA_BUILD)/fast/cuda/router_count.o: NVCCFLAGS += $(NVCC_ROUTER_FLAGS)

# The fp8 mode's grouped GEMM is CUTLASS 4.2 (header-only; ci/cutlass.sh puts the pinned wheel's
# headers under CUTLASS_DIR, docs/dependencies.md). Only fast/cuda/gemm_fp8/ includes it; NDEBUG keeps
# CUTLASS's device asserts out, which would otherwise serialize its wgmma pipeline (ptxas C7510).
CUTLASS_DIR ?= build/cutlass-4.2.0.0
CUTLASS_STAMP := $(CUTLASS_DIR)/include/cutlass/util/packed_stride.hpp
$(CUTLASS_STAMP):
	sh ci/cutlass.sh $(CUTLASS_DIR)

# Its two configurations (weight scales 1x128 and 128x128) are one translation unit each, built side by side.
$(CUDA_BUILD)/fast/cuda/gemm_fp8/%.o: fast/cuda/gemm_fp8/%.cu $(wildcard fast/cuda/gemm_fp8/*.cuh) \
    $(wildcard fast/cuda/gemm_fp8/*.h) fast/cuda/gemm_fp8.h $(CUTLASS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DNDEBUG -isystem $(CUTLASS_DIR)/include --expt-relaxed-constexpr -c $< -o $@

# The CUDA backend's registration compiled -DDSV4_WITH_CUDA: it then names the backend's entry points.
CUDA_HOST_OBJS := $(CUDA_BUILD)/fast/cuda/reg.o
$(CUDA_BUILD)/fast/cuda/reg.o: fast/cuda/reg.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -DDSV4_WITH_CUDA $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(CUDA_LIB_A): $(filter-out $(BUILD)/fast/cuda/reg.o,$(PROD_OBJS)) \
  $(CUDA_HOST_OBJS) $(CUDA_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# The shared CUDA library, for programs that load it at run time (the Python package, python/).
CUDA_LIB_SO := $(CUDA_BUILD)/libdsv4moe.so
$(CUDA_LIB_SO): $(filter-out $(BUILD)/fast/cuda/reg.o,$(PROD_OBJS)) \
  $(CUDA_HOST_OBJS) $(CUDA_OBJS) libdsv4moe.map
	$(CC) -shared -Wl,-soname,$(SONAME) $(SO_EXPORTS) $(CFLAGS_ALL) -o $@ $(filter %.o,$^) $(LDLIBS_PROD) $(CUDA_LDLIBS)

# docs/embedding.md's C example (docs/examples/embed.c), compiled and linked by `make cuda`.
CUDA_EMBED_EXAMPLE := $(CUDA_BUILD)/embed_example
$(CUDA_EMBED_EXAMPLE): docs/examples/embed.c $(CUDA_LIB_A)
	$(CC) $(CPPFLAGS_ALL) -isystem $(CUDA_HOME)/include $(CFLAGS_ALL) -o $@ $< $(CUDA_LIB_A) $(LDLIBS_PROD) $(CUDA_LDLIBS)

$(CUDA_CLI): $(CLI_OBJS) $(HLIB_A) $(CUDA_LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJS) $(HLIB_A) $(CUDA_LIB_A) $(LDLIBS_ALL) $(CUDA_LDLIBS)

$(CUDA_BUILD)/tests/cuda/test_cuda.o: tests/cuda/test_cuda.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -DDSV4_WITH_CUDA -isystem $(CUDA_HOME)/include $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# The backend test table's suite (tests/test_backend_ops.c) with the cuda backend in its list,
# linked into the device test program beside the cuda suite.
$(CUDA_BUILD)/tests/test_backend_ops.o: tests/test_backend_ops.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -DDSV4_WITH_CUDA $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# The device half of test_cuda's e4m3 hardware-conversion test (the library's kernels.cuh).
$(CUDA_BUILD)/tests/cuda/e4m3_hw.o: tests/cuda/e4m3_hw.cu fast/cuda/kernels.cuh tests/cuda/dev_arena.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# and of its per-kernel tests, each tests/cuda/NAME_hw.cu with its header NAME_hw.h: k_route_small
# and k_dec_mix through their launchers, count2_warp against count2_block (group_parts.cuh).
CUDA_TEST_HW := route_small dec_mix group_warp logits quant_x8 quant8 tile8 dec_qin
$(CUDA_BUILD)/tests/cuda/%_hw.o: tests/cuda/%_hw.cu tests/cuda/%_hw.h tests/cuda/dev_arena.cuh $(wildcard fast/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(CUDA_TEST): $(CUDA_BUILD)/tests/cuda/test_cuda.o $(CUDA_BUILD)/tests/test_backend_ops.o \
  $(CUDA_BUILD)/tests/cuda/e4m3_hw.o $(CUDA_TEST_HW:%=$(CUDA_BUILD)/tests/cuda/%_hw.o) \
  $(HLIB_A) $(CUDA_LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $(filter %.o,$^) $(HLIB_A) $(CUDA_LIB_A) $(LDLIBS_ALL) $(CUDA_LDLIBS) $(CHECK_LIBS)

# The device sim communicator's device test (include/dsv4moe/comm_devsim.h): ep 2, 4, 8 on one GPU.
CUDA_DEVSIM_TEST := $(CUDA_BUILD)/test_devsim

$(CUDA_BUILD)/tests/cuda/test_devsim.o: tests/cuda/test_devsim.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -isystem $(CUDA_HOME)/include $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(CUDA_DEVSIM_TEST): $(CUDA_BUILD)/tests/cuda/test_devsim.o $(HLIB_A) $(CUDA_LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(HLIB_A) $(CUDA_LIB_A) $(LDLIBS_ALL) $(CUDA_LDLIBS) $(CHECK_LIBS)

# The benchmark's CUDA build: device-resident buffers through the CUDA runtime (dsv4_backend_forward_device),
# and, where the toolkit has CUPTI (its include/ or extras/CUPTI/), --timeline's kernel records
# (bench/timeline.h).
CUDA_BENCH := $(CUDA_BUILD)/bench_cuda
CUPTI_DIR := $(firstword $(foreach d,$(CUDA_HOME) $(CUDA_HOME)/extras/CUPTI,$(if $(wildcard $(d)/include/cupti.h),$(d))))
ifneq ($(CUPTI_DIR),)
CUPTI_CPPFLAGS := -DDSV4_BENCH_CUPTI -isystem $(CUPTI_DIR)/include
CUPTI_LDLIBS := -L$(CUPTI_DIR)/lib64 -Wl,-rpath,$(CUPTI_DIR)/lib64 -lcupti
endif

$(CUDA_BUILD)/bench/bench_cuda.o: bench/bench_cuda.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -DDSV4_BENCH_CUDA_RT $(CUPTI_CPPFLAGS) -isystem $(CUDA_HOME)/include $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(CUDA_BUILD)/bench/timeline.o: bench/timeline.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CUPTI_CPPFLAGS) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(CUDA_BENCH): $(CUDA_BUILD)/bench/bench_cuda.o $(CUDA_BUILD)/bench/timeline.o $(HLIB_A) $(CUDA_LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(CUDA_BUILD)/bench/timeline.o $(HLIB_A) $(CUDA_LIB_A) $(LDLIBS_ALL) $(CUDA_LDLIBS) \
	  $(CUPTI_LDLIBS)

cuda: deps
	@$(MAKE) --no-print-directory $(CUDA_LIB_A) $(CUDA_LIB_SO) $(CUDA_CLI) $(CUDA_TEST) $(CUDA_DEVSIM_TEST) $(CUDA_BENCH) \
	  $(CEILINGS_BIN) $(CUDA_EMBED_EXAMPLE)

# On the GPU machine: the device tests, the scenario file and a memcheck run (logs under $(OUT)/cuda).
cuda-test: cuda
	@sh ci/cuda-test.sh $(CUDA_BUILD) $(OUT)/cuda

# ---- NCCL communicator (fast/comm/nccl, docs/nccl.md) ----
# Not part of the CPU-only library (fast/comm/nccl/ is below the fast/*/*.c wildcard): the
# host code is C11 against the CUDA runtime and NCCL C APIs, the kernels are nvcc-compiled.
# `make cuda` builds it too (CI, no GPU: compiles and links; test-nccl needs a GPU).
CUDA_HOME ?= /usr/local/cuda
NCCL_INC ?=
NCCL_LIB ?= $(if $(wildcard $(CUDA_HOME)/lib64/libnccl.so),-lnccl,-l:libnccl.so.2)
NCCL_CPPFLAGS := $(CPPFLAGS_ALL) -isystem $(CUDA_HOME)/include $(NCCL_INC)
NCCL_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(NCCL_LIB) -lcudart -lstdc++ -lm -pthread -ldl -lrt
NCCL_C_SRCS := $(wildcard fast/comm/nccl/*.c)
NCCL_CU_SRCS := $(wildcard fast/comm/nccl/*.cu)
NCCL_OBJS := $(NCCL_C_SRCS:%.c=$(BUILD)/nccl/%.o) $(NCCL_CU_SRCS:%.cu=$(BUILD)/nccl/%.o)
NCCL_LIB_A := $(BUILD)/nccl/libdsv4moe_nccl.a
NCCL_TEST := $(BUILD)/nccl/test_nccl
NVCC_NCCL_FLAGS := -std=c++17 -O3 -I. -Iinclude -gencode=arch=compute_90a,code=sm_90a \
  -Xcompiler -Wall,-Wextra,-Werror,-fPIC

.PHONY: nccl test-nccl

$(BUILD)/nccl/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(NCCL_CPPFLAGS) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/nccl/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_NCCL_FLAGS) -MMD -MP -c $< -o $@

$(NCCL_LIB_A): $(NCCL_OBJS)
	rm -f $@
	ar rcs $@ $^

$(NCCL_TEST): $(BUILD)/nccl/tests/nccl/test_nccl.o $(NCCL_LIB_A) $(LIBS_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(NCCL_LIB_A) $(LIBS_A) $(LDLIBS_ALL) $(NCCL_LDLIBS)

nccl: $(NCCL_TEST)

test-nccl: nccl
	NCCL_NVLS_ENABLE=0 $(NCCL_TEST)

cuda: nccl

BENCH_BIN := $(BUILD)/bench/bench_core

$(BUILD)/bench/%.o: bench/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BENCH_BIN): $(BUILD)/bench/bench_core.o $(LIBS_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS_A) $(LDLIBS_ALL)

BENCH_CPU_BIN := $(BUILD)/bench/bench_cpu

$(BENCH_CPU_BIN): $(BUILD)/bench/bench_cpu.o $(LIBS_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS_A) $(LDLIBS_ALL)

# The device benchmark: ceilings (copy bandwidth, cuBLASLt FP8/bf16 GEMMs) built with nvcc
# directly, and bench_cuda through the public API against this library (ci/device-check.sh relinks
# it against build/cuda/libdsv4moe.a when the CUDA build exists). Runs on the GPU machine only.
BENCH_CUDA_BIN := $(BUILD)/bench/bench_cuda
CEILINGS_BIN := $(BUILD)/bench/ceilings

$(BENCH_CUDA_BIN): $(BUILD)/bench/bench_cuda.o $(BUILD)/bench/timeline.o $(LIBS_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/bench/timeline.o $(LIBS_A) $(LDLIBS_ALL)

$(CEILINGS_BIN): bench/ceilings.cu
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra,-Werror -o $@ $< -lcublasLt

bench-cuda-build: $(BENCH_CUDA_BIN) $(CEILINGS_BIN)

bench-cuda: deps
	@$(MAKE) --no-print-directory all bench-cuda-build
	@mkdir -p $(OUT)/bench
	$(CEILINGS_BIN) $(OUT)/bench/ceilings.json
	$(PYTHON) bench/torch_peer.py --json $(OUT)/bench/torch_peer.json
	$(BENCH_CUDA_BIN) --ceilings $(OUT)/bench/ceilings.json --peer $(OUT)/bench/torch_peer.json \
	  --json $(OUT)/bench/cuda.json --dir $(OUT)/bench

# The grouped FP8 GEMM's row-tile fill on bench_cuda's prefill routing (bench/tile_fill.c: the
# reference's routing, any machine; generates bench_cuda's v4-flash files under $(OUT)/bench if missing).
TILE_FILL_BIN := $(BUILD)/bench/tile_fill

$(TILE_FILL_BIN): $(BUILD)/bench/tile_fill.o $(LIBS_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS_A) $(LDLIBS_ALL)

tile-fill: deps
	@$(MAKE) --no-print-directory all $(TILE_FILL_BIN)
	@mkdir -p $(OUT)/bench
	$(TILE_FILL_BIN) --dir $(OUT)/bench

bench: deps
	@$(MAKE) --no-print-directory all $(BENCH_BIN) $(BENCH_CPU_BIN)
	@mkdir -p $(OUT)/bench
	$(BENCH_BIN) $(OUT)/bench/core.json $(OUT)/bench
	$(BENCH_CPU_BIN) $(OUT)/bench/cpu.json $(OUT)/bench

coverage: deps coverage-run
	@sh coverage/report.sh build/cov $(OUT)/coverage

# The coverage build's suite alone (no report): .ci/run runs it beside the others. The suite
# sees DSV4MOE_TEST_COVERAGE=1: the large-T duplicates of the cpu cases (the same code paths
# at a smaller shape run anyway) are skipped there.
coverage-run:
	@find build/cov -name '*.gcda' -delete 2>/dev/null || true
	@$(MAKE) --no-print-directory $(COV_VARS) test-run

# CI's build phase (.ci/run): the release build, the asan, coverage and fault builds, one after
# the other (each make -j2 keeps both cores busy), so the suites can then run side by side.
ci-build: deps
	@$(MAKE) --no-print-directory all test-build
	@$(MAKE) --no-print-directory $(ASAN_VARS) test-build
	@$(MAKE) --no-print-directory $(COV_VARS) test-build
	@$(MAKE) --no-print-directory $(FAULT_VARS) all build/faults/tests/run_tests

# ---------------- fuzzing (tests/fuzz, docs/reliability.md) ----------------
# `make fuzz` builds one libFuzzer binary per target with clang (ASan + UBSan)
# under build/fuzz; `make fuzz-replay` (run by every test-run) feeds the kept
# corpus and every crash reproducer to the same LLVMFuzzerTestOneInput through
# tests/fuzz/driver.c, built with $(CC), so CI needs no clang to replay.
FUZZ_TARGETS := scenario safetensors index config trace manifest casejson
FUZZ_CC ?= clang
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
REPLAY_BINS := $(FUZZ_TARGETS:%=$(BUILD)/fuzz-replay/replay_%)
# The parsers under test live in core/, scenarios/ (and fast/plan for its defaults), the trace and manifest
# readers in compare/symmetry.c and compare/manifest.c (with the names of fast/comm/comm.c); linking only those keeps
# the fuzz build independent of backend code (fast/cpu uses GCC-only builtins).
FUZZ_LIB_OBJS := $(filter $(BUILD)/core/% $(BUILD)/scenarios/% $(BUILD)/fast/plan/% $(BUILD)/compare/symmetry.o $(BUILD)/compare/manifest.o $(BUILD)/fast/comm/comm.o,$(LIB_OBJS))

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJS) $(LDLIBS_ALL)

$(BUILD)/fuzz-replay/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h tests/fuzz/driver.c $(LIBS_A)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -o $@ $< tests/fuzz/driver.c $(LIBS_A) $(LDLIBS_ALL)

fuzz:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=$(FUZZ_CC) OPT="-O1" \
	  SANFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" \
	  $(FUZZ_TARGETS:%=build/fuzz/fuzz/fuzz_%)
	@echo "fuzz: binaries in build/fuzz/fuzz/; run e.g. build/fuzz/fuzz/fuzz_scenario tests/fuzz/corpus/scenario"

# Everything a variant's test-run needs, built without running anything (after REPLAY_BINS:
# prerequisites are expanded where the rule is read).
test-build: $(TEST_BIN) $(CLI) $(EXAMPLE_BIN) $(LIB_SO) $(HLIB_SO) $(REPLAY_BINS)

fuzz-replay: $(REPLAY_BINS)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p tests/fuzz/crashes/$$t; \
	  printf 'fuzz-replay %s: ' $$t; \
	  DSV4_FUZZ_TMP=$(abspath $(BUILD)/tests) $(BUILD)/fuzz-replay/replay_$$t tests/fuzz/corpus/$$t tests/fuzz/crashes/$$t \
	    || exit 1; \
	done

# ---------------- allocation-failure injection (tests/test_allocfail.c) ----------------
# The test binary routes the library's (and the tests') malloc family through
# the counting wrappers of tests/test_allocfail.c; shared libraries (libyaml,
# OpenBLAS, libc internals) are not wrapped. `make test` sweeps every 7th n
# (after the first 64); `make allocfail` sweeps every n under ASan's leak checker.
ALLOCFAIL_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=free
DSV4_ALLOCFAIL_STRIDE ?= 7
export DSV4_ALLOCFAIL_STRIDE

.PHONY: allocfail
allocfail: deps
	@$(MAKE) --no-print-directory BUILD=build/asan OPT=-O1 \
	  SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  $(TEST_BIN) $(CLI)
	DSV4_ALLOCFAIL_STRIDE=1 CK_RUN_SUITE=allocfail ASAN_OPTIONS=detect_leaks=1 \
	  DSV4MOE_TMP=$(abspath build/asan/tests/tmp) CK_DEFAULT_TIMEOUT=1800 build/asan/tests/run_tests

# ---------------- valgrind memcheck on a smoke run (docs/reliability.md) ----------------
VALGRIND ?= valgrind
VALGRIND_FLAGS := --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect

.PHONY: test-valgrind
test-valgrind: deps
	@$(MAKE) --no-print-directory all
	@rm -rf $(BUILD)/valgrind && mkdir -p $(BUILD)/valgrind
	OPENBLAS_NUM_THREADS=1 $(VALGRIND) $(VALGRIND_FLAGS) $(CLI) run tests/smoke.yaml \
	  --report $(BUILD)/valgrind/report --cache $(BUILD)/valgrind/cache

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/dsv4moe $(DESTDIR)$(PREFIX)/include/dsv4moe_harness \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(LIB_A) $(HLIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(HLIB_SO) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libdsv4moe.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libdsv4moe.so
	ln -sf libdsv4moe_harness.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(HSONAME)
	ln -sf $(HSONAME) $(DESTDIR)$(PREFIX)/lib/libdsv4moe_harness.so
	install -m 644 include/dsv4moe/*.h $(DESTDIR)$(PREFIX)/include/dsv4moe/
	install -m 644 include/dsv4moe_harness/*.h $(DESTDIR)$(PREFIX)/include/dsv4moe_harness/
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' dsv4moe.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dsv4moe.pc
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' dsv4moe_harness.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dsv4moe_harness.pc

clean:
	rm -rf build $(OUT)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
