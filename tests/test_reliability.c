/*
 * Reliability: the one file-writing path (destinations, modes,
 * planted temporaries, signals, a full disk at the third report, concurrent runs), loaders
 * that refuse what the contract needs (bias, tid2eid, non-finite gate, files changing under
 * the process, folder members), the config loader on bytes, exit codes, and messages.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsv4moe/config.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"
#include "core/fileio.h"
#include "tests/testutil.h"

Suite *reliability_suite(void);

static char out_buf[1 << 16];

static int run_cli(const char *args)
{
    int rc = tu_run_cli(args, "rel_out.txt", out_buf, sizeof out_buf);
    ck_assert_msg(rc != -2, "DSV4MOE_CLI is not set (run through make test)");
    return rc;
}

/* A fresh, empty folder under the scratch folder. */
static char *fresh(char *buf, size_t n, const char *name)
{
    tu_path(buf, n, name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
    ck_assert_int_eq(system(cmd), 0);
    return buf;
}

/* How many entries of `dir` contain `frag` in their name. */
static int count_named(const char *dir, const char *frag)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strstr(de->d_name, frag) != NULL;
    closedir(d);
    return n;
}

static void read_into(const char *path, char *buf, size_t n)
{
    ck_assert_msg(tu_read_file(path, buf, n) >= 0, "cannot read %s", path);
}

/* ---------------- the file-writing path ---------------- */

START_TEST(destination_must_be_absent_or_regular)
{
    char dir[512], p[700], q[700], buf[256];
    fresh(dir, sizeof dir, "rel_dest");
    dsv4_error e;
    /* Absent: created. */
    snprintf(p, sizeof p, "%s/new.txt", dir);
    ck_assert_int_eq(dsv4_write_file_atomic(p, "one", 3, &e), DSV4_OK);
    read_into(p, buf, sizeof buf);
    ck_assert_str_eq(buf, "one");
    /* A regular file keeps its mode (0600 stays 0600, 0640 stays 0640). */
    mode_t modes[] = {0600, 0640, 0755};
    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_eq(chmod(p, modes[i]), 0);
        ck_assert_int_eq(dsv4_write_file_atomic(p, "two", 3, &e), DSV4_OK);
        struct stat sb;
        ck_assert_int_eq(stat(p, &sb), 0);
        ck_assert_int_eq(sb.st_mode & 07777, modes[i]);
        read_into(p, buf, sizeof buf);
        ck_assert_str_eq(buf, "two");
    }
    /* A symbolic link (to a file, and dangling) is refused, the link and its target untouched. */
    snprintf(q, sizeof q, "%s/link", dir);
    ck_assert_int_eq(symlink("new.txt", q), 0);
    ck_assert_int_eq(dsv4_write_file_atomic(q, "three", 5, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "symbolic link") && strstr(e.message, q), "%s", e.message);
    struct stat lb;
    ck_assert_int_eq(lstat(q, &lb), 0);
    ck_assert(S_ISLNK(lb.st_mode));
    read_into(p, buf, sizeof buf);
    ck_assert_str_eq(buf, "two");
    snprintf(q, sizeof q, "%s/dangling", dir);
    ck_assert_int_eq(symlink("nowhere", q), 0);
    ck_assert_int_eq(dsv4_write_file_atomic(q, "x", 1, &e), DSV4_ERR_IO);
    ck_assert_int_eq(lstat(q, &lb), 0);
    ck_assert(S_ISLNK(lb.st_mode));
    /* A folder and a FIFO are refused, named, and stay what they were. */
    snprintf(q, sizeof q, "%s/sub", dir);
    ck_assert_int_eq(mkdir(q, 0755), 0);
    ck_assert_int_eq(dsv4_write_file_atomic(q, "x", 1, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "a folder") && strstr(e.message, q), "%s", e.message);
    snprintf(q, sizeof q, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(q, 0600), 0);
    ck_assert_int_eq(dsv4_write_file_atomic(q, "x", 1, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "a FIFO"), "%s", e.message);
    ck_assert_int_eq(lstat(q, &lb), 0);
    ck_assert(S_ISFIFO(lb.st_mode));
    /* The safetensors writer takes the same path. */
    dsv4_st_writer *w;
    float v = 1;
    int64_t one = 1;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "a", DSV4_DTYPE_F32, 1, &one, &v, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(w, q, NULL, NULL, &e), DSV4_ERR_IO);
    snprintf(q, sizeof q, "%s/link", dir);
    ck_assert_int_eq(dsv4_st_writer_write(w, q, NULL, NULL, &e), DSV4_ERR_IO);
    dsv4_st_writer_free(w);
    ck_assert_int_eq(count_named(dir, ".tmp."), 0);
}
END_TEST

/* Names a writer might pick for its temporary, planted as links to a victim: never written through. */
START_TEST(planted_temporaries_are_skipped)
{
    char dir[512], dest[700], victim[700], link[800], buf[64];
    fresh(dir, sizeof dir, "rel_planted");
    snprintf(dest, sizeof dest, "%s/report.json", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    ck_assert_int_eq(tu_write_file(victim, "precious", 8), 0);
    for (int i = 0; i < 64; i++) {
        snprintf(link, sizeof link, "%s.tmp.%ld.%d", dest, (long)getpid(), i);
        ck_assert_int_eq(symlink(victim, link), 0);
    }
    dsv4_error e;
    ck_assert_msg(dsv4_write_file_atomic(dest, "{}\n", 3, &e) == DSV4_OK, "%s", e.message);
    read_into(victim, buf, sizeof buf);
    ck_assert_str_eq(buf, "precious");
    read_into(dest, buf, sizeof buf);
    ck_assert_str_eq(buf, "{}\n");
    ck_assert_int_eq(count_named(dir, ".tmp."), 64); /* the planted ones, nothing of ours */
}
END_TEST

/* Root only: a private device node made with mknod is never replaced (it used to become a file). */
START_TEST(device_node_is_refused_as_root)
{
    if (geteuid() != 0) {
        fprintf(stderr, "reliability: device_node_is_refused_as_root skipped (not root)\n");
        return;
    }
    char dir[512], node[700], args[2048];
    fresh(dir, sizeof dir, "rel_mknod");
    snprintf(node, sizeof node, "%s/null", dir);
    if (mknod(node, S_IFCHR | 0666, makedev(1, 3)) != 0) {
        fprintf(stderr, "reliability: mknod not permitted here (%s); device test skipped\n", strerror(errno));
        return;
    }
    dsv4_error e;
    ck_assert_int_eq(dsv4_write_file_atomic(node, "x", 1, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "character device") && strstr(e.message, node), "%s", e.message);
    /* Through the CLI: exit 2 naming it, before any work. */
    snprintf(args, sizeof args, "ref --preset tiny --layer 1 --weights %s/none --input %s/none --out %s", dir, dir,
             node);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "character device") && strstr(out_buf, node), "%s", out_buf);
    struct stat sb;
    ck_assert_int_eq(lstat(node, &sb), 0);
    ck_assert(S_ISCHR(sb.st_mode));
    ck_assert_int_eq(major(sb.st_rdev), 1);
    ck_assert_int_eq(minor(sb.st_rdev), 3);
    ck_assert_int_eq(count_named(dir, ".tmp."), 0);
}
END_TEST

/* Forks `dsv4moe ARGS...` with its output to /dev/null; returns the pid. */
static pid_t spawn_cli(char *const argv[], const struct rlimit *fsize)
{
    const char *cli = getenv("DSV4MOE_CLI");
    ck_assert_ptr_nonnull(cli);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fsize)
            setrlimit(RLIMIT_FSIZE, fsize);
        execv(cli, argv);
        _exit(127);
    }
    return pid;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* SIGINT and SIGTERM while gen writes: the destination is as it was, no temporary is left. */
START_TEST(signal_mid_write_leaves_destination)
{
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int s = 0; s < 2; s++) {
        char dir[512], dest[700], buf[64];
        fresh(dir, sizeof dir, "rel_signal");
        snprintf(dest, sizeof dest, "%s/model.safetensors", dir);
        ck_assert_int_eq(tu_write_file(dest, "OLD", 3), 0);
        /* Large enough that generating the weights (inside the write) takes seconds. */
        char *argv[] = {"dsv4moe", "gen", "--preset", "v4-flash", "--layer", "5", "--set", "n_routed_experts=32",
                        "--tokens", "4", "--threads", "1", "--out", dir, NULL};
        pid_t pid = spawn_cli(argv, NULL);
        double t0 = now_s();
        bool seen = false;
        while (!seen && now_s() - t0 < 120) {
            seen = count_named(dir, "model.safetensors.tmp.") > 0;
            if (!seen)
                usleep(2000);
        }
        ck_assert_msg(seen, "no temporary appeared within 120 s");
        usleep(100000); /* well inside the write */
        ck_assert_int_eq(kill(pid, sigs[s]), 0);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == sigs[s], "status 0x%x", status);
        read_into(dest, buf, sizeof buf);
        ck_assert_str_eq(buf, "OLD");
        ck_assert_int_eq(count_named(dir, ".tmp."), 0);
    }
}
END_TEST

static const char *smoke(void)
{
    static char p[1024];
    const char *src = getenv("DSV4MOE_SRC");
    snprintf(p, sizeof p, "%s/tests/smoke.yaml", src ? src : ".");
    return p;
}

/* The three reports are renamed together: a file-size limit (a full disk) hit at the largest leaves
   all three previous reports byte for byte, and no temporary. */
START_TEST(full_disk_at_largest_report_changes_none)
{
    char dir[512], args[2048], p[700];
    fresh(dir, sizeof dir, "rel_fsize");
    snprintf(args, sizeof args, "run %s --report %s", smoke(), dir);
    ck_assert_msg(run_cli(args) == 0, "%s", out_buf);
    static const char *const names[3] = {"report.json", "junit.xml", "report.html"};
    static char before[3][1 << 16];
    off_t size[3];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        struct stat sb;
        ck_assert_int_eq(stat(p, &sb), 0);
        size[i] = sb.st_size;
        ck_assert_int_lt(sb.st_size, (off_t)sizeof before[i]);
        read_into(p, before[i], sizeof before[i]);
    }
    /* The limit lets the two smaller reports through and stops the largest (report.json for a passing
       run: report.html keeps passing cases to a line each); the cache is already there. */
    int big = 0;
    for (int i = 1; i < 3; i++)
        big = size[i] > size[big] ? i : big;
    off_t second = 0;
    for (int i = 0; i < 3; i++)
        if (i != big && size[i] > second)
            second = size[i];
    ck_assert_int_gt(size[big], second + 1024);
    off_t lim = second + 512;
    struct rlimit rl = {(rlim_t)lim, (rlim_t)lim};
    char *argv[] = {"dsv4moe", "run", (char *)smoke(), "--report", dir, NULL};
    pid_t pid = spawn_cli(argv, &rl);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x (SIGXFSZ must not kill it)", status);
    for (int i = 0; i < 3; i++) {
        static char after[1 << 16];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        read_into(p, after, sizeof after);
        ck_assert_msg(!strcmp(before[i], after), "%s changed although the run failed", names[i]);
    }
    ck_assert_int_eq(count_named(dir, ".tmp."), 0);
}
END_TEST

/* Writes a one-case scenario whose case is named `name`. */
static void write_scenario(const char *path, const char *name)
{
    char text[1024];
    snprintf(text, sizeof text,
             "name: %s\ndefaults:\n  preset: tiny\n  layer: 1\n  topology: {world: 1, tp: 1, dp: 1, ep: 1, backend: "
             "ref}\n  tokens: [5]\n  seed: 5\n  checks: [numerics]\n  expect: pass\ncases:\n  - name: %s\n",
             name, name);
    ck_assert_int_eq(tu_write_file(path, text, strlen(text)), 0);
}

/* Two runs on one report folder at once, several times: the three reports always come from one run. */
START_TEST(concurrent_runs_leave_one_runs_reports)
{
    char dir[512], sa[700], sb[700], p[900];
    fresh(dir, sizeof dir, "rel_concurrent");
    snprintf(sa, sizeof sa, "%s/a.yaml", dir);
    snprintf(sb, sizeof sb, "%s/b.yaml", dir);
    write_scenario(sa, "alpha-case");
    write_scenario(sb, "bravo-case");
    char rep[700];
    snprintf(rep, sizeof rep, "%s/rep", dir);
    int seen_a = 0, seen_b = 0;
    for (int round = 0; round < 6; round++) {
        char *argv_a[] = {"dsv4moe", "run", sa, "--report", rep, NULL};
        char *argv_b[] = {"dsv4moe", "run", sb, "--report", rep, NULL};
        pid_t a = spawn_cli(argv_a, NULL), b = spawn_cli(argv_b, NULL);
        int st_a, st_b;
        ck_assert_int_eq(waitpid(a, &st_a, 0), a);
        ck_assert_int_eq(waitpid(b, &st_b, 0), b);
        ck_assert_msg(WIFEXITED(st_a) && WEXITSTATUS(st_a) == 0, "run a: 0x%x", st_a);
        ck_assert_msg(WIFEXITED(st_b) && WEXITSTATUS(st_b) == 0, "run b: 0x%x", st_b);
        static const char *const names[3] = {"report.json", "junit.xml", "report.html"};
        int alpha = 0, bravo = 0;
        for (int i = 0; i < 3; i++) {
            static char text[1 << 16];
            snprintf(p, sizeof p, "%s/%s", rep, names[i]);
            read_into(p, text, sizeof text);
            alpha += strstr(text, "alpha-case") != NULL;
            bravo += strstr(text, "bravo-case") != NULL;
        }
        ck_assert_msg((alpha == 3 && bravo == 0) || (alpha == 0 && bravo == 3),
                      "round %d: reports mixed (alpha in %d, bravo in %d of 3)", round, alpha, bravo);
        seen_a += alpha == 3;
        seen_b += bravo == 3;
        ck_assert_int_eq(count_named(rep, ".tmp."), 0);
    }
    fprintf(stderr, "reliability: concurrent runs: last writer alpha %d, bravo %d of 6 rounds\n", seen_a, seen_b);
}
END_TEST

/* ---------------- loaders ---------------- */

static dsv4_config tiny_at(int64_t layer)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset("tiny", &c, NULL), DSV4_OK);
    c.layer = layer;
    return c;
}

/* Generates the tiny layer `layer` into dir/model.safetensors. */
static void gen_tiny(const char *dir, int64_t layer, char *path, size_t n)
{
    dsv4_config c = tiny_at(layer);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    snprintf(path, n, "%s/model.safetensors", dir);
    dsv4_error e;
    ck_assert_msg(dsv4_gen_weights(&c, &o, path, &e) == DSV4_OK, "%s", e.message);
}

/* Copies every tensor of src into dst except `drop`; `poison` (if not NULL) gets element 7 set to NaN (BF16). */
static void rewrite(const char *src, const char *dst, const char *drop, const char *poison)
{
    dsv4_st_file *f;
    dsv4_error e;
    ck_assert_msg(dsv4_st_open(src, &f, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer *w;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    void *copy = NULL;
    for (size_t i = 0; i < dsv4_st_count(f); i++) {
        const dsv4_tensor_info *t = dsv4_st_tensor(f, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        const void *data = t->data;
        if (poison && !strcmp(t->name, poison)) {
            copy = malloc(t->nbytes);
            memcpy(copy, t->data, t->nbytes);
            ((uint16_t *)copy)[7] = 0x7FC0; /* BF16 NaN */
            data = copy;
        }
        ck_assert_int_eq(dsv4_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, data, &e), DSV4_OK);
    }
    ck_assert_msg(dsv4_st_writer_write(w, dst, NULL, NULL, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer_free(w);
    free(copy);
    dsv4_st_close(f);
}

START_TEST(router_needs_bias_and_finite_gate)
{
    char dir[512], model[700], bad[700];
    fresh(dir, sizeof dir, "rel_router");
    gen_tiny(dir, 1, model, sizeof model);
    dsv4_config c = tiny_at(1);
    ck_assert(!dsv4_config_is_hash_layer(&c));
    dsv4_checkpoint *ck;
    dsv4_router_view r;
    dsv4_error e;
    /* The complete layer binds. */
    ck_assert_int_eq(dsv4_checkpoint_open(model, &ck, &e), DSV4_OK);
    ck_assert_msg(dsv4_weights_router(ck, &c, &r, &e) == DSV4_OK, "%s", e.message);
    ck_assert_ptr_nonnull(r.bias);
    dsv4_checkpoint_close(ck);
    /* Without the bias: not found, naming the key and the file searched (it used to route as bias 0). */
    snprintf(bad, sizeof bad, "%s/nobias.safetensors", dir);
    rewrite(model, bad, "layers.1.ffn.gate.bias", NULL);
    ck_assert_int_eq(dsv4_checkpoint_open(bad, &ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_weights_router(ck, &c, &r, &e), DSV4_ERR_NOT_FOUND);
    ck_assert_msg(strstr(e.message, "'layers.1.ffn.gate.bias'") && strstr(e.message, "nobias.safetensors") &&
                      strstr(e.message, "searched 1 file"),
                  "%s", e.message);
    dsv4_checkpoint_close(ck);
    /* One NaN in gate.weight: refused like a NaN bias (it used to fall back to experts 0..K-1). */
    snprintf(bad, sizeof bad, "%s/nangate.safetensors", dir);
    rewrite(model, bad, NULL, "layers.1.ffn.gate.weight");
    ck_assert_int_eq(dsv4_checkpoint_open(bad, &ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_weights_router(ck, &c, &r, &e), DSV4_ERR_NUMERIC);
    ck_assert_msg(strstr(e.message, "gate.weight") && strstr(e.message, "element 7") && strstr(e.message, "nan"),
                  "%s", e.message);
    dsv4_checkpoint_close(ck);
}
END_TEST

START_TEST(hash_checkpoint_under_non_hash_config_is_refused)
{
    char dir[512], model[700];
    fresh(dir, sizeof dir, "rel_hash");
    gen_tiny(dir, 0, model, sizeof model);
    dsv4_config c = tiny_at(0);
    ck_assert(dsv4_config_is_hash_layer(&c));
    dsv4_checkpoint *ck;
    dsv4_router_view r;
    dsv4_error e;
    ck_assert_int_eq(dsv4_checkpoint_open(model, &ck, &e), DSV4_OK);
    ck_assert_msg(dsv4_weights_router(ck, &c, &r, &e) == DSV4_OK, "%s", e.message);
    c.n_hash_layers = 0; /* now layer 0 is score-routed: the checkpoint's tid2eid would be ignored */
    ck_assert_int_eq(dsv4_weights_router(ck, &c, &r, &e), DSV4_ERR_CONFIG);
    ck_assert_msg(strstr(e.message, "tid2eid") && strstr(e.message, "n_hash_layers = 0"), "%s", e.message);
    dsv4_checkpoint_close(ck);
}
END_TEST

/* A checkpoint rewritten or truncated after open: an error when its tensors are read, never SIGBUS. */
START_TEST(file_changed_under_the_process_is_an_error)
{
    char dir[512], model[700];
    fresh(dir, sizeof dir, "rel_trunc");
    gen_tiny(dir, 1, model, sizeof model);
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_int_eq(dsv4_checkpoint_open(model, &ck, &e), DSV4_OK);
    const dsv4_tensor_info *t;
    ck_assert_int_eq(dsv4_checkpoint_get(ck, "layers.1.ffn.gate.weight", &t, &e), DSV4_OK); /* read before */
    ck_assert_int_eq(truncate(model, 4096), 0);
    ck_assert_int_eq(dsv4_checkpoint_get(ck, "layers.1.ffn.experts.3.w2.weight", &t, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "changed after it was opened"), "%s", e.message);
    ck_assert_ptr_null(dsv4_checkpoint_find(ck, "layers.1.ffn.experts.3.w2.weight"));
    /* What was read before stays readable (owned memory, not a mapping of the file). */
    const dsv4_tensor_info *g = dsv4_checkpoint_find(ck, "layers.1.ffn.gate.weight");
    ck_assert_ptr_nonnull(g);
    volatile uint8_t sum = 0;
    for (uint64_t i = 0; i < g->nbytes; i++)
        sum = (uint8_t)(sum + ((const uint8_t *)g->data)[i]);
    (void)sum;
    dsv4_checkpoint_close(ck);
    /* A single file opened whole, then truncated: its data stays readable. */
    gen_tiny(dir, 1, model, sizeof model);
    dsv4_st_file *f;
    ck_assert_int_eq(dsv4_st_open(model, &f, &e), DSV4_OK);
    ck_assert_int_eq(truncate(model, 0), 0);
    const dsv4_tensor_info *last = dsv4_st_tensor(f, dsv4_st_count(f) - 1);
    ck_assert_uint_gt(last->nbytes, 0);
    sum = ((const uint8_t *)last->data)[last->nbytes - 1];
    dsv4_st_close(f);
}
END_TEST

START_TEST(weights_folder_takes_layer_files_and_names_the_rest)
{
    char dir[512], model[700], p[800];
    fresh(dir, sizeof dir, "rel_folder");
    gen_tiny(dir, 1, model, sizeof model);
    dsv4_config c = tiny_at(1);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    dsv4_error e;
    snprintf(p, sizeof p, "%s/input.safetensors", dir);
    ck_assert_int_eq(dsv4_gen_input(&c, &o, 4, p, &e), DSV4_OK);
    snprintf(p, sizeof p, "%s/y.safetensors", dir); /* an output holding the same keys twice over */
    ck_assert_int_eq(dsv4_gen_input(&c, &o, 4, p, &e), DSV4_OK);
    snprintf(p, sizeof p, "%s/dangling.safetensors", dir);
    ck_assert_int_eq(symlink("nowhere", p), 0);
    snprintf(p, sizeof p, "%s/pipe.safetensors", dir);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    snprintf(p, sizeof p, "%s/sub.safetensors", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    dsv4_checkpoint *ck;
    ck_assert_msg(dsv4_checkpoint_open(dir, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_checkpoint_file_count(ck), 1);
    ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_file_path(ck, 0), "model.safetensors"));
    ck_assert_uint_eq(dsv4_checkpoint_skipped_count(ck), 5);
    static const struct {
        const char *file, *why;
    } want[5] = {{"dangling.safetensors", "dangling symbolic link"},
                 {"input.safetensors", "holds no layer tensor"},
                 {"pipe.safetensors", "FIFO"},
                 {"sub.safetensors", "folder"},
                 {"y.safetensors", "holds no layer tensor"}};
    for (size_t i = 0; i < 5; i++) {
        const char *why = NULL, *path = dsv4_checkpoint_skipped(ck, i, &why);
        ck_assert_msg(strstr(path, want[i].file) && strstr(why, want[i].why), "%zu: %s: %s", i, path, why);
    }
    dsv4_checkpoint_close(ck);
    /* The CLI says so. */
    char args[1200];
    snprintf(args, sizeof args, "inspect --quiet %s", dir);
    ck_assert_int_eq(run_cli(args), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "skipped"));
    ck_assert_ptr_nonnull(strstr(out_buf, "dangling.safetensors: a dangling symbolic link"));
}
END_TEST

/* ---------------- the config loader ---------------- */

START_TEST(config_loader_reads_bytes)
{
    dsv4_config c = tiny_at(1), before = c;
    dsv4_error e;
    /* /dev/zero used to spin forever; a FIFO must not block. */
    ck_assert_int_eq(dsv4_config_load_file(&c, "/dev/zero", &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "/dev/zero") && strstr(e.message, "character device"), "%s", e.message);
    char dir[512], p[700];
    fresh(dir, sizeof dir, "rel_config");
    snprintf(p, sizeof p, "%s/fifo.cfg", dir);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    ck_assert_int_eq(dsv4_config_load_file(&c, p, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "FIFO"), "%s", e.message);
    ck_assert_int_eq(dsv4_config_load_file(&c, dir, &e), DSV4_ERR_IO);
    ck_assert_msg(strstr(e.message, "folder"), "%s", e.message);
    /* A NUL in line 2 hid the rest of the line (and its bad value): now an error at line:col. */
    snprintf(p, sizeof p, "%s/nul.cfg", dir);
    static const char nul[] = "top_p = 0.5\ntop_k\0junk\ntop_p = 7\n";
    ck_assert_int_eq(tu_write_file(p, nul, sizeof nul - 1), 0);
    ck_assert_int_eq(dsv4_config_load_file(&c, p, &e), DSV4_ERR_FORMAT);
    char where[800];
    snprintf(where, sizeof where, "%s:2:6: NUL byte", p);
    ck_assert_msg(strstr(e.message, where), "%s", e.message);
    /* A range error keeps file:line:col, and prints the value at full precision. */
    snprintf(p, sizeof p, "%s/range.cfg", dir);
    static const char range[] = "# comment\nroute_scale = 1.5\n  top_p = 1.0000001\n";
    ck_assert_int_eq(tu_write_file(p, range, sizeof range - 1), 0);
    ck_assert_int_eq(dsv4_config_load_file(&c, p, &e), DSV4_ERR_CONFIG);
    snprintf(where, sizeof where, "%s:3:11", p);
    ck_assert_msg(strstr(e.message, where) && strstr(e.message, "1.00000012") && strstr(e.message, "(0, 1]"), "%s",
                  e.message);
    ck_assert_int_eq(memcmp(&c, &before, sizeof c), 0); /* unchanged on error */
    /* A line without a trailing newline, CRLF ends: still read. */
    snprintf(p, sizeof p, "%s/ok.cfg", dir);
    static const char ok[] = "route_scale = 2.5\r\ntop_p = 0.75";
    ck_assert_int_eq(tu_write_file(p, ok, sizeof ok - 1), 0);
    ck_assert_msg(dsv4_config_load_file(&c, p, &e) == DSV4_OK, "%s", e.message);
    ck_assert(c.route_scale == 2.5f && c.top_p == 0.75f);
}
END_TEST

/* ---------------- exit codes and messages ---------------- */

START_TEST(exit_codes_never_pass_for_nothing)
{
    ck_assert_int_eq(run_cli("help nonsense"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "no help topic 'nonsense'"));
    ck_assert_int_eq(run_cli("help keys"), 0);
    /* stdout that cannot be written (tu_run_cli redirects 2>&1 after >, so use sh). */
    const char *cli = getenv("DSV4MOE_CLI");
    char cmd[2048];
    static const char *const cmds[] = {"plan --preset tiny --layer 1", "help presets", "--version", "help"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s >/dev/full 2>/dev/null", cli, cmds[i]);
        int rc = system(cmd);
        ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "'%s > /dev/full' exited 0x%x", cmds[i], rc);
    }
    /* A backend this build lacks: exit 2 before any case, no report written. */
#ifndef DSV4_WITH_CUDA
    char dir[512], args[2048];
    fresh(dir, sizeof dir, "rel_backend");
    snprintf(args, sizeof args, "run %s --backend cuda --report %s/rep", smoke(), dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "'cuda' is not part of this build"));
    char rp[700];
    snprintf(rp, sizeof rp, "%s/rep/report.json", dir);
    ck_assert(!tu_file_exists(rp));
#endif
    /* A lock file that is not a regular file: refused, nothing written. */
    char d2[512], lock[700], a2[2048];
    fresh(d2, sizeof d2, "rel_lockfifo");
    snprintf(lock, sizeof lock, "%s/.report.lock", d2);
    ck_assert_int_eq(mkfifo(lock, 0600), 0);
    snprintf(a2, sizeof a2, "run %s --report %s", smoke(), d2);
    ck_assert_int_eq(run_cli(a2), 2);
    ck_assert_msg(strstr(out_buf, "lock file is a FIFO"), "%s", out_buf);
    ck_assert_int_eq(count_named(d2, "report."), 1); /* only the lock itself */
    ck_assert_int_eq(count_named(d2, ".tmp."), 0);
}
END_TEST

START_TEST(messages_show_found_values_and_escape_controls)
{
    char dir[512], p[700], args[2048];
    fresh(dir, sizeof dir, "rel_msgs");
    /* A tensor name with an escape sequence reaches the terminal escaped. */
    snprintf(p, sizeof p, "%s/ctl.safetensors", dir);
    dsv4_st_writer *w;
    dsv4_error e;
    float v = 1;
    int64_t one = 1;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "layers.1.ffn.\x1b[2Jevil", DSV4_DTYPE_F32, 1, &one, &v, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(w, p, NULL, NULL, &e), DSV4_OK);
    dsv4_st_writer_free(w);
    snprintf(args, sizeof args, "inspect %s", p);
    ck_assert_int_eq(run_cli(args), 0);
    ck_assert_ptr_null(strchr(out_buf, '\x1b'));
    ck_assert_ptr_nonnull(strstr(out_buf, "\\x1b[2Jevil"));
    /* In a library message too. */
    dsv4_checkpoint *ck;
    ck_assert_int_eq(dsv4_checkpoint_open(p, &ck, &e), DSV4_OK);
    const dsv4_tensor_info *t;
    ck_assert_int_eq(dsv4_checkpoint_get(ck, "x\x07y", &t, &e), DSV4_ERR_NOT_FOUND);
    ck_assert_ptr_null(strchr(e.message, '\x07'));
    ck_assert_msg(strstr(e.message, "'x\\x07y'") && strstr(e.message, "ctl.safetensors"), "%s", e.message);
    dsv4_checkpoint_close(ck);
    /* ref says what it found instead of x. */
    char model[700];
    gen_tiny(dir, 1, model, sizeof model);
    snprintf(args, sizeof args, "ref --preset tiny --layer 1 --weights %s --input %s --out %s/y.safetensors", model, p,
             dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "found missing"), "%s", out_buf);
    snprintf(args, sizeof args, "ref --preset tiny --layer 1 --weights %s --input %s --out %s/y.safetensors", model,
             model, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "found missing") || strstr(out_buf, "found "), "%s", out_buf);
    /* An index mapping a key to itself used to report a header length of 8e18 and no more. */
    char idx[800];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    static const char selfmap[] = "{\"weight_map\": {\"layers.1.ffn.gate.weight\": \"model.safetensors.index.json\"}}";
    ck_assert_int_eq(tu_write_file(idx, selfmap, sizeof selfmap - 1), 0);
    ck_assert_int_eq(dsv4_checkpoint_open(dir, &ck, &e), DSV4_ERR_FORMAT);
    ck_assert_msg(strstr(e.message, "names the index itself"), "%s", e.message);
    dsv4_st_file *sf;
    ck_assert_int_eq(dsv4_st_open(idx, &sf, &e), DSV4_ERR_FORMAT);
    ck_assert_msg(strstr(e.message, "starts with the text '{\"weight'") && strstr(e.message, "not a safetensors"), "%s",
                  e.message);
    unlink(idx);
    /* A case name with an escape sequence, from a scenario file, in the run summary. */
    char yaml[700], rep[700];
    snprintf(yaml, sizeof yaml, "%s/esc.yaml", dir);
    static const char esc_yaml[] =
        "name: esc\ndefaults:\n  preset: tiny\n  layer: 1\n  topology: {world: 1, tp: 1, dp: 1, ep: 1, backend: ref}\n"
        "  tokens: [5]\n  seed: 5\n  checks: [numerics]\n  expect: {refused: nothing}\ncases:\n"
        "  - name: \"bad\\e[2Jname\"\n";
    ck_assert_int_eq(tu_write_file(yaml, esc_yaml, sizeof esc_yaml - 1), 0);
    snprintf(rep, sizeof rep, "%s/rep", dir);
    snprintf(args, sizeof args, "run %s --report %s", yaml, rep);
    ck_assert_int_eq(run_cli(args), 1);
    ck_assert_ptr_null(strchr(out_buf, '\x1b'));
    ck_assert_msg(strstr(out_buf, "FAIL esc/bad\\x1b[2Jname"), "%s", out_buf);
    /* --set prints the rejected value at full precision. */
    ck_assert_int_eq(run_cli("plan --preset tiny --layer 1 --set top_p=1.0000001"), 2);
    ck_assert_msg(strstr(out_buf, "1.00000012"), "%s", out_buf);
}
END_TEST

Suite *reliability_suite(void)
{
    Suite *s = suite_create("reliability");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, destination_must_be_absent_or_regular);
    tcase_add_test(tc, planted_temporaries_are_skipped);
    tcase_add_test(tc, device_node_is_refused_as_root);
    tcase_add_test(tc, signal_mid_write_leaves_destination);
    tcase_add_test(tc, full_disk_at_largest_report_changes_none);
    tcase_add_test(tc, concurrent_runs_leave_one_runs_reports);
    tcase_add_test(tc, router_needs_bias_and_finite_gate);
    tcase_add_test(tc, hash_checkpoint_under_non_hash_config_is_refused);
    tcase_add_test(tc, file_changed_under_the_process_is_an_error);
    tcase_add_test(tc, weights_folder_takes_layer_files_and_names_the_rest);
    tcase_add_test(tc, config_loader_reads_bytes);
    tcase_add_test(tc, exit_codes_never_pass_for_nothing);
    tcase_add_test(tc, messages_show_found_values_and_escape_controls);
    suite_add_tcase(s, tc);
    return s;
}
