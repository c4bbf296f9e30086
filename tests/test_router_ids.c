/* dsv4_router_check_input_ids (core/weights.c): the hash-layer input check the backends share. */
#include <check.h>
#include <string.h>

#include "dsv4moe/config.h"
#include "dsv4moe/weights.h"

Suite *router_ids_suite(void);

START_TEST(hash_ids_checked)
{
    dsv4_config c;
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_preset("mini", &c, &e), DSV4_OK);
    c.layer = 0; /* mini's hash layer */
    int64_t V = c.vocab_size, K = c.n_activated, E = c.n_routed_experts;
    static int32_t table[512 * 16];
    ck_assert(V * K <= (int64_t)(sizeof table / sizeof table[0]));
    for (int64_t i = 0; i < V * K; i++)
        table[i] = (int32_t)(i % E);
    int32_t ids[3] = {0, 5, (int32_t)(V - 1)};
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, table, 3, ids, "t", &e), DSV4_OK);
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, table, 0, NULL, "t", &e), DSV4_OK);
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, table, 3, NULL, "t", &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "hash layer"));
    ids[1] = (int32_t)V;
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, table, 3, ids, "t", &e), DSV4_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.message, "input_ids[1]"));
    ids[1] = -1;
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, table, 3, ids, "t", &e), DSV4_ERR_RANGE);
    ids[1] = 5;
    table[5 * K + 1] = (int32_t)E; /* a table entry outside [0, E) */
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, table, 3, ids, "t", &e), DSV4_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.message, "tid2eid[5, 1]"));
    /* a non-hash layer checks nothing */
    c.layer = 1;
    ck_assert_int_eq(dsv4_router_check_input_ids(&c, NULL, 3, NULL, "t", &e), DSV4_OK);
}
END_TEST

Suite *router_ids_suite(void)
{
    Suite *s = suite_create("router_ids");
    TCase *tc = tcase_create("router_ids");
    tcase_add_test(tc, hash_ids_checked);
    suite_add_tcase(s, tc);
    return s;
}
