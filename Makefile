# dsv4moe build. Objects go under $(BUILD) (build/ by default); variants
# (asan, coverage) use their own folders so they never mix with the release.
#
#   make / make all     library (shared + static), CLI
#   make run            build, generate a small layer, run the CLI on it (out/)
#   make test           build and run the Check suite and the CLI tests
#   make test-asan      the same under AddressSanitizer + UBSan
#   make cuda           compile and link the CUDA sources with nvcc
#   make bench          benchmarks (results under out/)
#   make coverage       gcov/lcov report under out/coverage/
#   make install        PREFIX=/usr/local: libs with soname, headers, dsv4moe.pc
#   make clean

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
CPPFLAGS_ALL := -Iinclude -Icore -Iref -D_DEFAULT_SOURCE -D_FILE_OFFSET_BITS=64 -DDSV4_VERSION=\"$(VERSION)\"
CFLAGS_ALL := -std=c11 $(WARN) $(OPT) -g -fPIC -pthread $(SANFLAGS) $(COVFLAGS) $(CFLAGS)
# The reference's numerics must not depend on the compiler fusing a*b+c.
CFLAGS_REF := -ffp-contract=off
LDLIBS_ALL := -ljansson -lyaml -lopenblas -lm -pthread
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -pthread)

LIB_SRCS := $(wildcard core/*.c) $(wildcard ref/*.c) $(wildcard fast/*/*.c) $(wildcard compare/*.c) $(wildcard scenarios/*.c)
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
CLI_SRCS := $(wildcard cli/*.c)
CLI_OBJS := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/tests/main.o
CUDA_SRCS := $(wildcard fast/cuda/*.cu)

SONAME := libdsv4moe.so.$(VERSION_MAJOR)
LIB_A := $(BUILD)/libdsv4moe.a
LIB_SO := $(BUILD)/libdsv4moe.so.$(VERSION)
CLI := $(BUILD)/dsv4moe
TEST_BIN := $(BUILD)/tests/run_tests

.PHONY: all run test test-asan test-run cuda bench coverage install clean deps fuzz fuzz-replay
.DEFAULT_GOAL := all

all: $(LIB_A) $(LIB_SO) $(CLI)

deps:
	@sh ci/deps.sh

$(BUILD)/ref/%.o: ref/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) $(CFLAGS_REF) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(LIB_A): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(LIB_SO): $(LIB_OBJS)
	$(CC) -shared -Wl,-soname,$(SONAME) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)
	ln -sf libdsv4moe.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/libdsv4moe.so

$(CLI): $(CLI_OBJS) $(LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJS) $(LIB_A) $(LDLIBS_ALL)

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
	$(CC) $(CPPFLAGS_ALL) -Itests -Iref -Ifast $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(TEST_BIN): $(TEST_OBJS) $(LIB_A)
	$(CC) $(CFLAGS_ALL) $(ALLOCFAIL_WRAP) -o $@ $(TEST_OBJS) $(LIB_A) $(LDLIBS_ALL) $(CHECK_LIBS)

# Runs the suite of this build variant; tests find the CLI and data through the environment.
test-run: $(TEST_BIN) $(CLI)
	DSV4MOE_CLI=$(abspath $(CLI)) DSV4MOE_TMP=$(abspath $(BUILD)/tests/tmp) DSV4MOE_SRC=$(CURDIR) \
	  DSV4MOE_PYTHON=$(PYTHON) \
	  CK_DEFAULT_TIMEOUT=600 $(TEST_BIN)
	@$(MAKE) --no-print-directory fuzz-replay

test: deps
	@$(MAKE) --no-print-directory test-run

test-asan: deps
	@$(MAKE) --no-print-directory BUILD=build/asan OPT=-O1 \
	  SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  test-run

run: deps
	@$(MAKE) --no-print-directory all
	@sh ci/run-default.sh $(CLI) $(OUT)

cuda:
	@sh ci/build-cuda.sh $(BUILD)/cuda $(CUDA_SRCS)

BENCH_BIN := $(BUILD)/bench/bench_core

$(BUILD)/bench/%.o: bench/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BENCH_BIN): $(BUILD)/bench/bench_core.o $(LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIB_A) $(LDLIBS_ALL)

BENCH_CPU_BIN := $(BUILD)/bench/bench_cpu

$(BENCH_CPU_BIN): $(BUILD)/bench/bench_cpu.o $(LIB_A)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIB_A) $(LDLIBS_ALL)

bench: deps
	@$(MAKE) --no-print-directory all $(BENCH_BIN) $(BENCH_CPU_BIN)
	@mkdir -p $(OUT)/bench
	$(BENCH_BIN) $(OUT)/bench/core.json $(OUT)/bench
	$(BENCH_CPU_BIN) $(OUT)/bench/cpu.json $(OUT)/bench

coverage: deps
	@find build/cov -name '*.gcda' -delete 2>/dev/null || true
	@$(MAKE) --no-print-directory BUILD=build/cov OPT=-O0 COVFLAGS=--coverage test-run
	@sh coverage/report.sh build/cov $(OUT)/coverage

# ---------------- fuzzing (tests/fuzz, docs/reliability.md) ----------------
# `make fuzz` builds one libFuzzer binary per target with clang (ASan + UBSan)
# under build/fuzz; `make fuzz-replay` (run by every test-run) feeds the kept
# corpus and every crash reproducer to the same LLVMFuzzerTestOneInput through
# tests/fuzz/driver.c, built with $(CC), so CI needs no clang to replay.
FUZZ_TARGETS := scenario safetensors index config
FUZZ_CC ?= clang
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
REPLAY_BINS := $(FUZZ_TARGETS:%=$(BUILD)/fuzz-replay/replay_%)
# The parsers under test live in core/, scenarios/ (and fast/plan for its defaults); linking only those keeps
# the fuzz build independent of backend code (fast/cpu uses GCC-only builtins).
FUZZ_LIB_OBJS := $(filter $(BUILD)/core/% $(BUILD)/scenarios/% $(BUILD)/fast/plan/%,$(LIB_OBJS))

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJS) $(LDLIBS_ALL)

$(BUILD)/fuzz-replay/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h tests/fuzz/driver.c $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -o $@ $< tests/fuzz/driver.c $(LIB_A) $(LDLIBS_ALL)

fuzz:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=$(FUZZ_CC) OPT="-O1" \
	  SANFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" \
	  $(FUZZ_TARGETS:%=build/fuzz/fuzz/fuzz_%)
	@echo "fuzz: binaries in build/fuzz/fuzz/; run e.g. build/fuzz/fuzz/fuzz_scenario tests/fuzz/corpus/scenario"

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
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/dsv4moe $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libdsv4moe.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libdsv4moe.so
	install -m 644 include/dsv4moe/*.h $(DESTDIR)$(PREFIX)/include/dsv4moe/
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' dsv4moe.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dsv4moe.pc

clean:
	rm -rf build $(OUT)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
