/* The umbrella header's example (include/dsv4moe/dsv4moe.h, between its EXAMPLE markers): the
   Makefile extracts and compiles it against the installed-style include path; this suite runs
   it and checks what it prints (a real forward on the cpu backend and a refused one). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/testutil.h"

Suite *example_suite(void);

START_TEST(umbrella_example_runs)
{
    const char *bin = getenv("DSV4MOE_EXAMPLE");
    ck_assert_msg(bin != NULL, "DSV4MOE_EXAMPLE is not set (run through make test)");
    char layer[512], log[512], cmd[2048], out[4096];
    tu_path(layer, sizeof layer, "example_layer.safetensors");
    tu_path(log, sizeof log, "example.log");
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>&1", bin, layer, log);
    int rc = system(cmd);
    ck_assert_int_ge(tu_read_file(log, out, sizeof out), 0);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "example failed: %s", out);
    ck_assert_msg(strstr(out, "backend cpu, kernels ") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "refused as expected: backend forward: token count 1000 is outside") != NULL, "%s", out);
    /* a path it cannot write: the example reports the library's message and exits 1 */
    snprintf(cmd, sizeof cmd, "%s /nonexistent-dir/l.safetensors >%s 2>&1", bin, log);
    rc = system(cmd);
    ck_assert_int_ge(tu_read_file(log, out, sizeof out), 0);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "%s", out);
    ck_assert_msg(strstr(out, "generate: ") != NULL && strstr(out, "/nonexistent-dir/l.safetensors") != NULL, "%s", out);
}
END_TEST

Suite *example_suite(void)
{
    Suite *s = suite_create("example");
    TCase *tc = tcase_create("example");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, umbrella_example_runs);
    suite_add_tcase(s, tc);
    return s;
}
