/*
 * dsv4moe: the mark of the public API. The shared library is built with -fvisibility=hidden, so
 * it exports only the functions declared with DSV4_API in these headers (ci/release-clean.sh
 * checks that every symbol it exports is one of them); everything else in the library (the
 * backends' internals, the harness's helpers, test control) stays internal to it. Programs that
 * need internal symbols (the tests, the CLI, the benchmarks) link the static archive.
 * Define DSV4_API before including a dsv4moe header to override it (empty for a compiler
 * without ELF visibility).
 */
#ifndef DSV4MOE_API_H
#define DSV4MOE_API_H

#ifndef DSV4_API
#if defined(__GNUC__) || defined(__clang__)
#define DSV4_API __attribute__((visibility("default")))
#else
#define DSV4_API
#endif
#endif

#endif
