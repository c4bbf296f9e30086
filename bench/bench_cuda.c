/*
 * bench/bench_cuda.c: the benchmark of the CUDA backend, through the public API only
 * (dsv4moe/backend.h): v4-flash (fp4 routed, fp8 shared, layer 5, all 256 experts), T in
 * {1, 8, 32, 128, 256, 1024, 4096, 16384}, graphs off and on (when the plan accepts them).
 *
 * Per T: the median of host-timed forward calls, both through dsv4_backend_forward (host x and y:
 * each call includes the upload of x and the download of y) and, in the CUDA build of this
 * program (build/cuda/bench_cuda, -DDSV4_BENCH_CUDA_RT), through dsv4_backend_forward_device on
 * device-resident x and y, as a serving engine holds them; and (io stream, same build) the GPU time
 * of each call between CUDA events on a stream of the bench's, calls back to back, eager
 * dsv4_backend_enqueue or a captured graph of it replayed: the method the PyTorch and HF peers
 * are timed with (their time_fn), so that the small-T latencies compare like with like;
 * the bytes of the touched expert weights (distinct experts in topk ids x their checkpoint
 * bytes, plus the shared expert and the gate) per second as a share of the device-to-device
 * copy bandwidth; FLOP/s as a share of the FP8 GEMM rate; the ratio to the PyTorch peer. The
 * ceilings and the peer's times are read from the JSON that bench/ceilings.cu and
 * bench/torch_peer.py wrote in the same call (ci/device-check.sh runs all three).
 *
 * When the build has no CUDA backend (dsv4_backend_create gives DSV4_ERR_UNSUPPORTED, probed
 * on a small generated layer so that nothing large is generated for nothing), it prints the
 * ceilings, says so, writes a JSON with "available": false and exits 0.
 *
 * usage: bench_cuda [--ceilings F] [--peer F] [--targets F] [--json F] [--dir WORKDIR] [--tokens 1,8,...]
 *                   [--threads N] [--quick] [--backend cuda|cpu] [--preset NAME] [--gemm auto|exact|fp8]
 *                   [--cuda-kernels LIST]  (dsv4_backend_options.params; default: DSV4MOE_CUDA_* of the environment)
 *                   [--timeline N]  (io stream rows: N more calls with CUPTI recording their kernels, and
 *                   the step's kernel list printed and written: bench/timeline.h; the CUDA build with CUPTI)
 * (--backend cpu and --preset mini exercise the timing path on a machine without a GPU.)
 * exit status: 0 every forward ran; 1 a forward failed, or a device error stopped a configuration's
 * set-up (its rows say "forward failed" / "not run"); 2 bad arguments or input.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#ifdef DSV4_BENCH_CUDA_RT
#include <cuda_runtime_api.h>
#endif

#include "dsv4moe/backend.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"
#include "bench/bench_util.h"
#include "bench/group_fill.h"
#include "bench/timeline.h"

#define MAX_T 16
#define MAX_E 1024
/* The speed targets of bench/targets.json (docs/cuda-bench.md, "Targets"): bench_cuda judges those
   whose metric it measures itself (ms, share_of_copy, share_of_fp8, x_torch); the others need the
   peers of the same call, which ci/device-table.py has. */
#define MAX_TARGETS 16
typedef struct {
    char name[48], what[200], metric[24];
    char op;      /* '<' max, '>' min (>=), '!' above (>) */
    double bound;
    int64_t tmin, tmax;
} target;

static double jnum(json_t *o, const char *k);

static int load_targets(const char *path, target *t, int max)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *arr = json_object_get(root, "targets");
    int n = 0;
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x)
    {
        json_t *nm = json_object_get(x, "name"), *wh = json_object_get(x, "what"), *me = json_object_get(x, "metric");
        double lo = jnum(x, "tokens_min"), hi = jnum(x, "tokens_max"), mx = jnum(x, "max"), mn = jnum(x, "min"),
               ab = jnum(x, "above");
        if (n >= max || !json_is_string(nm) || !json_is_string(me) || !isfinite(lo) || !isfinite(hi))
            continue;
        target *g = &t[n++];
        snprintf(g->name, sizeof g->name, "%s", json_string_value(nm));
        snprintf(g->what, sizeof g->what, "%s", json_is_string(wh) ? json_string_value(wh) : "");
        snprintf(g->metric, sizeof g->metric, "%s", json_string_value(me));
        g->tmin = (int64_t)lo, g->tmax = (int64_t)hi;
        g->op = isfinite(mx) ? '<' : isfinite(mn) ? '>' : '!';
        g->bound = isfinite(mx) ? mx : isfinite(mn) ? mn : ab;
    }
    json_decref(root);
    return n;
}

/* Whether bench_cuda measures the target's metric itself (else the device table judges it). */
static bool target_here(const target *g)
{
    return !strcmp(g->metric, "ms") || !strcmp(g->metric, "share_of_copy") || !strcmp(g->metric, "share_of_fp8") ||
           !strcmp(g->metric, "x_torch");
}

/* A row's value of the target's metric; NAN where bench_cuda does not measure it (target_here) or
   the row has no value for it (no ceilings, no torch peer time). */
static double target_metric(const target *g, double ms, double bw_share, double fp8_share, double speedup)
{
    return !strcmp(g->metric, "ms")              ? ms
           : !strcmp(g->metric, "share_of_copy") ? bw_share
           : !strcmp(g->metric, "share_of_fp8")  ? fp8_share
           : !strcmp(g->metric, "x_torch")       ? speedup
                                                  : NAN;
}

static bool target_holds(const target *g, double v)
{
    return g->op == '<' ? v <= g->bound : g->op == '>' ? v >= g->bound : v > g->bound;
}

/* params fp8_cut of the kernels string (docs/cuda.md: groups of more than N rows on the grouped
   GEMM), else its default 32. */
static int fp8_cut_of(const char *kernels)
{
    const char *p = kernels ? strstr(kernels, "fp8_cut=") : NULL;
    return p ? atoi(p + 8) : 32;
}

/* dsv4_backend_create with the cuda kernel variants (NULL or "": the defaults). */
static dsv4_status create(const dsv4_plan *plan, const dsv4_checkpoint *ck, int threads, const char *kernels,
                          dsv4_backend **b, dsv4_error *e)
{
    dsv4_backend_options opt;
    dsv4_backend_options_init(&opt);
    opt.threads = threads;
    opt.params = kernels;
    return dsv4_backend_create_with(plan, ck, &opt, b, e);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    double copy_gbs, fp8_tflops, fp8_block_tflops, fp8_tensor_tflops, bf16_tflops;
    double h2d_gbs, d2h_gbs; /* pageable host copies, as the forward's host buffers are */
    char fp8_kind[64], fp8_mode[128], device[128];
    bool have;
} ceilings;

typedef struct {
    int64_t tokens[32];
    double ms[32];
    char method[32][32];
    int n;
    bool have;
    char shared_path[160];
} peer;

static double jnum(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void jstr(json_t *o, const char *k, char *buf, size_t n)
{
    json_t *v = json_object_get(o, k);
    snprintf(buf, n, "%s", json_is_string(v) ? json_string_value(v) : "?");
}

static void load_ceilings(const char *path, ceilings *c)
{
    memset(c, 0, sizeof *c);
    c->copy_gbs = c->fp8_tflops = c->fp8_block_tflops = c->fp8_tensor_tflops = c->bf16_tflops = NAN;
    c->h2d_gbs = c->d2h_gbs = NAN;
    json_error_t je;
    json_t *r = path ? json_load_file(path, 0, &je) : NULL;
    if (!r) {
        fprintf(stderr, "bench_cuda: no ceilings (%s: %s)\n", path ? path : "(none)", path ? je.text : "not given");
        return;
    }
    c->copy_gbs = jnum(r, "copy_gbs");
    c->fp8_tflops = jnum(r, "fp8_gemm_tflops");
    c->fp8_block_tflops = jnum(r, "fp8_block_tflops");
    c->fp8_tensor_tflops = jnum(r, "fp8_tensor_tflops");
    c->bf16_tflops = jnum(r, "bf16_tflops");
    json_t *hc = json_object_get(r, "host_copy_gbs");
    if (json_is_object(hc)) {
        c->h2d_gbs = jnum(hc, "pageable_h2d");
        c->d2h_gbs = jnum(hc, "pageable_d2h");
    }
    jstr(r, "fp8_gemm_kind", c->fp8_kind, sizeof c->fp8_kind);
    jstr(r, "fp8_block_mode", c->fp8_mode, sizeof c->fp8_mode);
    jstr(r, "device", c->device, sizeof c->device);
    c->have = isfinite(c->copy_gbs);
    json_decref(r);
}

static void load_peer(const char *path, peer *p)
{
    memset(p, 0, sizeof *p);
    json_error_t je;
    json_t *r = path ? json_load_file(path, 0, &je) : NULL;
    if (!r) {
        fprintf(stderr, "bench_cuda: no torch peer times (%s: %s)\n", path ? path : "(none)",
                path ? je.text : "not given");
        return;
    }
    jstr(r, "shared_path", p->shared_path, sizeof p->shared_path);
    json_t *runs = json_object_get(r, "runs");
    size_t i;
    json_t *row;
    json_array_foreach(runs, i, row)
    {
        if (p->n >= 32)
            break;
        json_t *t = json_object_get(row, "tokens");
        if (!json_is_integer(t))
            continue;
        p->tokens[p->n] = json_integer_value(t);
        p->ms[p->n] = jnum(row, "peer_ms");
        jstr(row, "peer_method", p->method[p->n], sizeof p->method[p->n]);
        p->n++;
    }
    p->have = p->n > 0;
    json_decref(r);
}

static double peer_ms(const peer *p, int64_t T, const char **method)
{
    for (int i = 0; i < p->n; i++)
        if (p->tokens[i] == T) {
            if (method)
                *method = p->method[i];
            return p->ms[i];
        }
    if (method)
        *method = "-";
    return NAN;
}

static void print_ceilings(const ceilings *c)
{
    if (!c->have) {
        printf("bench_cuda: ceilings not measured in this call (run bench/ceilings first)\n");
        return;
    }
    printf("bench_cuda: ceilings on %s: copy %.1f GB/s (read + written); FP8 GEMM %.1f TFLOP/s (%s%s%s); "
           "FP8 per-tensor %.1f; bf16 %.1f TFLOP/s\n",
           c->device, c->copy_gbs, c->fp8_tflops, c->fp8_kind, strcmp(c->fp8_kind, "block-scaled") ? "" : ": ",
           strcmp(c->fp8_kind, "block-scaled") ? "" : c->fp8_mode, c->fp8_tensor_tflops, c->bf16_tflops);
    printf("bench_cuda: pageable host copies: h2d %.1f GB/s, d2h %.1f GB/s\n", c->h2d_gbs, c->d2h_gbs);
}

/* A JSON string literal of `text` (escaped by jansson). */
static void json_put_str(FILE *f, const char *text)
{
    json_t *s = json_string(text ? text : "");
    char *txt = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    fputs(txt ? txt : "\"\"", f);
    free(txt);
    json_decref(s);
}

/* JSON numbers: -1 stands for "not measured" */
#define JN(v) (isfinite(v) ? (v) : -1.0)

static void json_ceilings(FILE *f, const ceilings *c, const peer *p)
{
    fprintf(f, "  \"ceilings\": {\"copy_gbs\": %.3f, \"fp8_gemm_tflops\": %.3f, \"fp8_gemm_kind\": \"%s\", "
               "\"fp8_block_tflops\": %.3f, \"fp8_tensor_tflops\": %.3f, \"bf16_tflops\": %.3f, "
               "\"pageable_h2d_gbs\": %.3f, \"pageable_d2h_gbs\": %.3f},\n",
            JN(c->copy_gbs), JN(c->fp8_tflops), c->fp8_kind, JN(c->fp8_block_tflops), JN(c->fp8_tensor_tflops),
            JN(c->bf16_tflops), JN(c->h2d_gbs), JN(c->d2h_gbs));
    fprintf(f, "  \"peer_shared_path\": \"%s\",\n", p->have ? p->shared_path : "none");
}

/* ---- one timed configuration (graph off or on) ---- */

typedef struct {
    int64_t T;
    bool ok;
    char err[1100];
    double ms, min_ms;
    int reps;
    int touched;
    uint64_t touched_bytes;
    double gbs, bw_share, tflops, fp8_share, peer_ms, speedup;
    double floor_mem_ms, floor_fp8_ms; /* touched bytes at the copy rate; FLOPs at the FP8 GEMM rate */
    double io_ms;                       /* x up and y down at the pageable host-copy rates */
    bool bw_reachable;                  /* the 70 % bandwidth time is not below the FP8 floor */
    const char *peer_method;
    int64_t chunks;
    int graph, dev; /* graph replay on; device-resident x / y (dsv4_backend_forward_device) */
    bool fill_ok;   /* gemm fp8 on the grouped GEMM: fill holds its groups' rows and padded rows */
    bench_fill fill;
} result;

#define MAX_ROWS (6 * MAX_T)
#define MAX_REPS 64

/* io modes of a timed row */
enum { IO_HOST, IO_DEVICE, IO_STREAM };
static const char *const io_name[] = {"host", "device", "stream"};

/* --timeline's run of a row (time_stream): steps more calls with CUPTI recording their kernels
   (bench/timeline.h), when steps > 0 and this build has CUPTI; ok 1 with the summary in s, else 0
   with the reason in err. */
typedef struct {
    int steps, ok;
    tl_summary s;
    char err[256];
} tl_run;

#ifdef DSV4_BENCH_CUDA_RT
static dsv4_status rt_fail(cudaError_t ce, const char *what, dsv4_error *e)
{
    snprintf(e->message, sizeof e->message, "%s: %s", what, cudaGetErrorString(ce));
    return DSV4_ERR_DEVICE;
}

/* One call on s: a launch of the captured graph ge, or (ge NULL) dsv4_backend_enqueue of T tokens. */
static dsv4_status one_call(dsv4_backend *b, cudaGraphExec_t ge, cudaStream_t s, int64_t T, const void *dx, const void *din,
                            const dsv4_forward_out *o, dsv4_error *e)
{
    cudaError_t ce;
    if (ge)
        return (ce = cudaGraphLaunch(ge, s)) == cudaSuccess ? DSV4_OK : rt_fail(ce, "cudaGraphLaunch", e);
    return dsv4_backend_enqueue(b, s, T, NULL, dx, (const int32_t *)din, o, e);
}

/*
 * io stream: reps calls of T tokens timed as the peers time theirs (bench/torch_peer.py and
 * bench/hf_peer.py's time_fn): a CUDA event recorded before and after each call on one stream,
 * the calls back to back, one synchronisation at the end; t[i] = the GPU time between call i's
 * events, in seconds. Each call is dsv4_backend_enqueue on the bench's own stream (a server's
 * embedding, docs/embedding.md); replay: the enqueue captured once in a CUDA graph of the bench's
 * (as a server captures its step) and each call a cudaGraphLaunch of it. The device error word
 * is polled after the calls, so a latched input or library error fails the row.
 */
static dsv4_status time_stream(dsv4_backend *b, int replay, int64_t T, const void *dx, const void *din, void *dy,
                               void *dids, int reps, double *t, tl_run *tl, dsv4_error *e)
{
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t ev[2 * MAX_REPS];
    int nev = 0;
    dsv4_status st = DSV4_OK;
    cudaError_t ce;
    dsv4_forward_out o = {(uint16_t *)dy, (int32_t *)dids, NULL, NULL};
    reps = reps < MAX_REPS ? reps : MAX_REPS;
    if ((ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
        return rt_fail(ce, "cudaStreamCreate", e);
    while (nev < 2 * reps && !st)
        if ((ce = cudaEventCreate(&ev[nev])) == cudaSuccess)
            nev++;
        else
            st = rt_fail(ce, "cudaEventCreate", e);
    if (!st && replay) {
        if ((ce = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)) != cudaSuccess)
            st = rt_fail(ce, "cudaStreamBeginCapture", e);
        else {
            st = dsv4_backend_enqueue(b, s, T, NULL, dx, (const int32_t *)din, &o, e);
            ce = cudaStreamEndCapture(s, &g);
            if (!st && ce != cudaSuccess)
                st = rt_fail(ce, "cudaStreamEndCapture", e);
            if (!st && (ce = cudaGraphInstantiate(&ge, g, 0)) != cudaSuccess)
                st = rt_fail(ce, "cudaGraphInstantiate", e);
        }
    }
    for (int i = -3; i < reps && !st; i++) { /* three warm-up calls, untimed */
        if (i >= 0 && (ce = cudaEventRecord(ev[2 * i], s)) != cudaSuccess)
            st = rt_fail(ce, "cudaEventRecord", e);
        else
            st = one_call(b, ge, s, T, dx, din, &o, e);
        if (!st && i >= 0 && (ce = cudaEventRecord(ev[2 * i + 1], s)) != cudaSuccess)
            st = rt_fail(ce, "cudaEventRecord", e);
    }
    if (!st) {
        dsv4_device_errors de = {.struct_size = sizeof de};
        st = dsv4_backend_poll_error(b, s, &de, e); /* waits for the stream */
    }
    tl->ok = 0;
    if (!st && tl->steps > 0) {
#ifdef DSV4_BENCH_CUPTI
        tl_kernel *recs = NULL;
        int nrec = 0;
        if (!tl_begin(tl->err, sizeof tl->err)) {
            for (int i = 0; i < tl->steps && !st; i++)
                st = one_call(b, ge, s, T, dx, din, &o, e);
            if ((ce = cudaStreamSynchronize(s)) != cudaSuccess && !st)
                st = rt_fail(ce, "cudaStreamSynchronize", e);
            if (!tl_end(&recs, &nrec, tl->err, sizeof tl->err) && !st)
                tl->ok = !tl_summarize(recs, nrec, tl->steps, &tl->s, tl->err, sizeof tl->err);
            free(recs);
        }
#else
        snprintf(tl->err, sizeof tl->err, "this build of bench_cuda has no CUPTI");
#endif
    }
    for (int i = 0; i < reps && !st; i++) {
        float ms = 0.0f;
        if ((ce = cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1])) != cudaSuccess)
            st = rt_fail(ce, "cudaEventElapsedTime", e);
        t[i] = 1e-3 * (double)ms;
    }
    cudaStreamSynchronize(s); /* a failed row may have left calls in flight */
    if (ge)
        cudaGraphExecDestroy(ge);
    if (g)
        cudaGraphDestroy(g);
    for (int i = 0; i < nev; i++)
        cudaEventDestroy(ev[i]);
    cudaStreamDestroy(s);
    return st;
}
#endif


/* --timeline's kernel list of a row (bench/timeline.h): the step's span, the GPU's busy time and the
   kernels' sum, then each kernel's stream, start, duration and the idle before it. */
static void print_timeline(const tl_run *tl, int64_t T, int graph)
{
    if (!tl->ok) {
        printf("       timeline T %lld: not recorded: %s\n", (long long)T, tl->err);
        return;
    }
    const tl_summary *s = &tl->s;
    printf("       timeline T %lld (graph %s, medians of %d steps): %d kernels, span %.1f us, GPU busy %.1f us (%.0f %%), "
           "kernels' sum %.1f us\n",
           (long long)T, graph ? "on" : "off", s->steps, s->kernels, s->span_us, s->busy_us,
           s->span_us > 0 ? 100.0 * s->busy_us / s->span_us : 0.0, s->sum_us);
    printf("       %3s %6s %9s %9s %9s  %s\n", "#", "stream", "start us", "dur us", "idle us", "kernel");
    for (int i = 0; i < s->kernels; i++)
        printf("       %3d %6d %9.2f %9.2f %9.2f  %s\n", i, s->rows[i].stream, s->rows[i].start_us, s->rows[i].dur_us,
               s->rows[i].gap_us, s->rows[i].name);
}

static void json_timeline(FILE *f, const tl_run *tl)
{
    if (!tl->ok) {
        fprintf(f, "{\"error\": ");
        json_put_str(f, tl->err);
        fputc('}', f);
        return;
    }
    const tl_summary *s = &tl->s;
    fprintf(f, "{\"steps\": %d, \"kernels\": %d, \"span_us\": %.3f, \"busy_us\": %.3f, \"sum_us\": %.3f, \"rows\": [",
            s->steps, s->kernels, s->span_us, s->busy_us, s->sum_us);
    for (int i = 0; i < s->kernels; i++) {
        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        json_put_str(f, s->rows[i].name);
        fprintf(f, ", \"stream\": %d, \"start_us\": %.3f, \"dur_us\": %.3f, \"idle_us\": %.3f}", s->rows[i].stream,
                s->rows[i].start_us, s->rows[i].dur_us, s->rows[i].gap_us);
    }
    fprintf(f, "]}");
}

int main(int argc, char **argv)
{
    const char *targets_path = "bench/targets.json";
    const char *ceil_path = "out/bench/ceilings.json", *peer_path = "out/bench/torch_peer.json",
               *json = "out/bench/cuda.json", *dir = "out/bench";
    int threads = 16;
    bool quick = false;
    dsv4_backend_kind kind = DSV4_BACKEND_CUDA;
    const char *preset = "v4-flash";
    const char *gemm = "auto"; /* the numerics mode (SPEC.md section 9): the config key gemm */
    char kenv[256];
    const char *kernels = bench_cuda_kernels_env(kenv, sizeof kenv); /* --cuda-kernels replaces it */
    int tl_steps = 0; /* --timeline */
    int64_t Ts[MAX_T] = {1, 8, 32, 128, 256, 1024, 4096, 16384};
    int nT = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            quick = true;
        else if (v && !strcmp(a, "--targets"))
            targets_path = argv[++i];
        else if (v && !strcmp(a, "--ceilings"))
            ceil_path = argv[++i];
        else if (v && !strcmp(a, "--peer"))
            peer_path = argv[++i];
        else if (v && !strcmp(a, "--json"))
            json = argv[++i];
        else if (v && !strcmp(a, "--dir"))
            dir = argv[++i];
        else if (v && !strcmp(a, "--preset"))
            preset = argv[++i];
        else if (v && !strcmp(a, "--gemm"))
            gemm = argv[++i];
        else if (v && !strcmp(a, "--cuda-kernels"))
            kernels = argv[++i];
        else if (v && !strcmp(a, "--timeline")) {
            char *end;
            const long ns = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end || ns < 1 || ns > MAX_REPS) {
                fprintf(stderr, "bench_cuda: --timeline: '%s' is not a step count from 1 to %d\n", argv[i], MAX_REPS);
                return 2;
            }
            tl_steps = (int)ns;
        }
        else if (v && !strcmp(a, "--backend")) {
            i++;
            if (!strcmp(v, "cuda"))
                kind = DSV4_BACKEND_CUDA;
            else if (!strcmp(v, "cpu"))
                kind = DSV4_BACKEND_CPU;
            else {
                fprintf(stderr, "bench_cuda: --backend: '%s' is not cuda or cpu\n", v);
                return 2;
            }
        } else if (v && !strcmp(a, "--threads"))
            threads = atoi(argv[++i]);
        else if (v && !strcmp(a, "--tokens")) {
            nT = 0;
            char *s = argv[++i], *end;
            while (*s && nT < MAX_T) {
                long long t = strtoll(s, &end, 10);
                if (end == s || t < 1) {
                    fprintf(stderr, "bench_cuda: --tokens: '%s' is not a list of positive integers\n", argv[i]);
                    return 2;
                }
                Ts[nT++] = t;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') {
                    fprintf(stderr, "bench_cuda: --tokens: unexpected '%c' in '%s'\n", *end, argv[i]);
                    return 2;
                }
            }
        } else {
            fprintf(stderr,
                    "usage: bench_cuda [--ceilings F] [--peer F] [--targets F] [--json F] [--dir WORKDIR] [--tokens 1,8,...] "
                    "[--threads N] [--quick] [--backend cuda|cpu] [--preset NAME] [--gemm auto|exact|fp8] [--cuda-kernels LIST] "
                    "[--timeline N]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 256)
        threads = 16;
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "bench_cuda: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    ceilings C;
    peer P;
    load_ceilings(ceil_path, &C);
    load_peer(peer_path, &P);
    target tgs[MAX_TARGETS];
    int ntg = load_targets(targets_path, tgs, MAX_TARGETS);
    double bw_target = 0.80; /* the copy-share bound of the targets (for "compute-bound" marks) */
    for (int g = 0; g < ntg; g++)
        if (!strcmp(tgs[g].metric, "share_of_copy"))
            bw_target = tgs[g].bound;
    print_ceilings(&C);
    int64_t tmax = 0;
    for (int i = 0; i < nT; i++)
        tmax = Ts[i] > tmax ? Ts[i] : tmax;

    dsv4_error e;
    char wp[1024], ip[1024];
    /* ---- is there a CUDA backend in this build? (a small layer, so nothing large is generated for nothing) ---- */
    {
        dsv4_config mc;
        if (dsv4_config_preset("mini", &mc, &e)) {
            fprintf(stderr, "bench_cuda: %s\n", e.message);
            return 1;
        }
        mc.layer = 1;
        if (bench_gen_files(&mc, dir, "cuda", "probe", 1, threads, "bench_cuda", wp, ip, sizeof wp))
            return 1;
        dsv4_checkpoint *ck = NULL;
        dsv4_topology topo;
        dsv4_topology_init(&topo);
        topo.backend = kind;
        dsv4_budget bud;
        dsv4_budget_init(&bud);
        dsv4_plan *plan = NULL;
        dsv4_backend *b = NULL;
        dsv4_status st = dsv4_checkpoint_open(wp, &ck, &e);
        if (!st)
            st = dsv4_plan_create(&mc, &topo, &bud, &plan, &e);
        if (!st)
            st = create(plan, ck, 1, kind == DSV4_BACKEND_CUDA ? kernels : NULL, &b, &e);
        dsv4_backend_free(b);
        dsv4_plan_free(plan);
        dsv4_checkpoint_close(ck);
        if (st == DSV4_ERR_UNSUPPORTED) {
            printf("bench_cuda: the CUDA backend is not available in this build: %s\n", e.message);
            printf("bench_cuda: nothing timed; the ceilings above are what the targets will be measured against\n");
            FILE *f = fopen(json, "w");
            if (f) {
                fprintf(f, "{\n  \"available\": false,\n  \"reason\": ");
                json_put_str(f, e.message);
                fprintf(f, ",\n");
                json_ceilings(f, &C, &P);
                fprintf(f, "  \"runs\": []\n}\n");
                fclose(f);
                printf("bench_cuda: wrote %s\n", json);
            }
            return 0;
        }
        if (st) {
            fprintf(stderr, "bench_cuda: creating a CUDA backend on the mini preset failed: %s\n", e.message);
            return 1;
        }
    }

    /* ---- v4-flash, layer 5 (non-hash; the mini preset's layer 1) ---- */
    dsv4_config cfg;
    if (dsv4_config_preset(preset, &cfg, &e)) {
        fprintf(stderr, "bench_cuda: %s\n", e.message);
        return 1;
    }
    cfg.layer = cfg.n_layers > 5 ? 5 : cfg.n_layers - 1;
    if (dsv4_config_set(&cfg, "gemm", gemm, &e)) {
        fprintf(stderr, "bench_cuda: --gemm: %s\n", e.message);
        return 2;
    }
    if (bench_gen_files(&cfg, dir, "cuda", preset, tmax, threads, "bench_cuda", wp, ip, sizeof wp))
        return 1;
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    if (dsv4_checkpoint_open(wp, &ck, &e) || dsv4_st_open(ip, &in, &e)) {
        fprintf(stderr, "bench_cuda: %s\n", e.message);
        return 1;
    }
    const int64_t H = cfg.dim, I = cfg.moe_inter_dim, E = cfg.n_routed_experts, K = cfg.n_activated;
    uint64_t expert_bytes[MAX_E] = {0}, shared_bytes = 0, ckpt_bytes = 0;
    for (int64_t x = 0; x < E && x < MAX_E; x++)
        for (int p = 0; p < 3; p++) {
            dsv4_matrix_view v;
            if (dsv4_weights_matrix(ck, &cfg, x, (dsv4_proj)p, &v, &e) == DSV4_OK)
                expert_bytes[x] += bench_view_bytes(&v);
        }
    for (int p = 0; p < 3 && cfg.n_shared_experts; p++) {
        dsv4_matrix_view v;
        if (dsv4_weights_matrix(ck, &cfg, DSV4_SHARED_EXPERT, (dsv4_proj)p, &v, &e) == DSV4_OK)
            shared_bytes += bench_view_bytes(&v);
    }
    const uint64_t gate_bytes = (uint64_t)E * (uint64_t)H * 2;
    for (int64_t x = 0; x < E; x++)
        ckpt_bytes += expert_bytes[x];
    ckpt_bytes += shared_bytes + gate_bytes;
    const uint16_t *X = dsv4_st_find(in, "x")->data;
    const int32_t *ids_in = dsv4_st_find(in, "input_ids")->data;
    uint16_t *y = malloc((size_t)(tmax * H) * 2);
    int32_t *ids = malloc((size_t)(tmax * K) * 4);
    if (!y || !ids) {
        fprintf(stderr, "bench_cuda: out of host memory\n");
        return 1;
    }

    FILE *jf = fopen(json, "w");
    if (!jf) {
        fprintf(stderr, "bench_cuda: cannot write %s\n", json);
        return 1;
    }
    fprintf(jf, "{\n  \"available\": true,\n  \"backend\": \"%s\",\n  \"preset\": \"%s\",\n  \"layer\": %lld,\n",
            dsv4_backend_kind_name(kind), preset, (long long)cfg.layer);
    fprintf(jf, "  \"gemm\": \"%s\",\n", gemm);
    fprintf(jf, "  \"cuda_kernels\": ");
    json_put_str(jf, kernels && *kernels ? kernels : "default");
    fprintf(jf, ",\n");
    fprintf(jf, "  \"checkpoint_bytes\": %llu,\n  \"timing\": \"host clock around the synchronous forward, warm-ups, "
                "median; io host: dsv4_backend_forward (x upload and y download included); io device: "
                "dsv4_backend_forward_device on device-resident x and y; io stream: CUDA events around each "
                "dsv4_backend_enqueue (graph on: a captured graph of it replayed) on the bench's stream, calls back "
                "to back, as the peers are timed\",\n",
            (unsigned long long)ckpt_bytes);
    json_ceilings(jf, &C, &P);
    fprintf(jf, "  \"runs\": [\n");
    int first = 1;
    static result rows[MAX_ROWS];
    int nrows = 0;
    int nfail = 0; /* forwards that failed, and device failures while setting a configuration up: exit 1 */
    /* device-resident copies of the inputs and outputs (the CUDA build of this program only) */
    void *dx = NULL, *dy = NULL, *dids = NULL, *din = NULL;
    int have_dev = 0;
#ifdef DSV4_BENCH_CUDA_RT
    if (kind == DSV4_BACKEND_CUDA && cudaMalloc(&dx, (size_t)(tmax * H) * 2) == cudaSuccess &&
        cudaMalloc(&dy, (size_t)(tmax * H) * 2) == cudaSuccess && cudaMalloc(&dids, (size_t)(tmax * K) * 4) == cudaSuccess &&
        cudaMalloc(&din, (size_t)tmax * 4) == cudaSuccess &&
        cudaMemcpy(dx, X, (size_t)(tmax * H) * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
        cudaMemcpy(din, ids_in, (size_t)tmax * 4, cudaMemcpyHostToDevice) == cudaSuccess)
        have_dev = 1;
    else if (kind == DSV4_BACKEND_CUDA)
        printf("bench_cuda: no device buffers (%s): forward_device not timed\n", cudaGetErrorString(cudaGetLastError()));
#endif

    for (int graph = 0; graph < 2; graph++) {
        dsv4_topology topo;
        dsv4_topology_init(&topo);
        topo.backend = kind;
        topo.sm = 90;
        topo.max_tokens_per_rank = tmax;
        topo.cuda_graph = graph;
        if (graph) {
            topo.n_buckets = 0;
            for (int i = 0; i < nT && i < DSV4_MAX_BUCKETS; i++)
                topo.buckets[topo.n_buckets++] = Ts[i];
        }
        dsv4_budget bud;
        dsv4_budget_init(&bud);
        bud.device_bytes = 143771ull << 20; /* an H200 */
        bud.taken_bytes = ckpt_bytes;
        dsv4_plan *plan = NULL;
        dsv4_backend *b = NULL;
        dsv4_status st = dsv4_plan_create(&cfg, &topo, &bud, &plan, &e);
        if (st && graph) { /* fewer, small buckets: the decode shapes */
            topo.n_buckets = 0;
            for (int i = 0; i < nT && Ts[i] <= 256; i++)
                topo.buckets[topo.n_buckets++] = Ts[i];
            st = dsv4_plan_create(&cfg, &topo, &bud, &plan, &e);
        }
        double tc0 = now();
        if (!st)
            st = create(plan, ck, threads, kind == DSV4_BACKEND_CUDA ? kernels : NULL, &b, &e);
        if (st) {
            printf("bench_cuda: graph %s: not run: %s\n", graph ? "on" : "off", e.message);
            nfail += st == DSV4_ERR_DEVICE; /* a refused plan is a configuration this layer has not, not a fault */
            fprintf(jf, "%s    {\"graph\": %s, \"error\": ", first ? "" : ",\n", graph ? "true" : "false");
            json_put_str(jf, e.message);
            fputc('}', jf);
            first = 0;
            dsv4_plan_free(plan);
            continue;
        }
        /* the routed groups on the grouped FP8 GEMM (gemm fp8 without direct=): their rows in its
           128-row tiles, from each row's routing (bench/group_fill.h) */
        bool on_gmm = false;
        const int cut = fp8_cut_of(kernels);
        {
            dsv4_backend_stats bs = dsv4_backend_get_stats(b);
            on_gmm = bs.gemm_fp8 && !bs.fp8_direct;
            printf("\nbench_cuda: %s layer %lld, graph %s, backend %s, gemm %s (%s%s; %llu experts on the exact kernels), "
                   "kernels '%s' (created in %.1f s)\n",
                   preset, (long long)cfg.layer, graph ? "on" : "off", dsv4_backend_name(b),
                   dsv4_gemm_mode_name(dsv4_plan_gemm(plan)),
                   bs.fp8_direct ? "routed tile groups: k_tile8 (fp8 wgmma from the fp4 weights); the shared expert: "
                                   "CUTLASS grouped FP8 block-scaled GEMM, weight scales "
                   : bs.gemm_fp8 ? "large groups: CUTLASS grouped FP8 block-scaled GEMM, weight scales "
                                 : "exact kernels",
                   bs.gemm_fp8 ? (bs.fp8_scale_rows == 128 ? "128x128" : "1x128") : "",
                   (unsigned long long)bs.fp8_exact_experts, kernels && *kernels ? kernels : "default", now() - tc0);
        }
        for (int dev = IO_HOST; dev <= (have_dev ? IO_STREAM : IO_HOST); dev++) {
            printf("  io %s\n", dev == IO_STREAM ? "stream (dsv4_backend_enqueue on the bench's stream, CUDA events around "
                                                   "each call, back to back; graph on: the enqueue captured once and "
                                                   "replayed)"
                                 : dev ? "device (dsv4_backend_forward_device)"
                                       : "host (dsv4_backend_forward)");
            printf("%6s %10s %10s %5s %9s %8s %7s %8s %7s %9s %6s %8s %9s %8s  %s\n", "T", "ms", "min ms", "exp",
                   "touch MB", "GB/s", "%copy", "TFLOP/s", "%fp8", "floor ms", "bound", "io ms", "torch ms", "x torch",
                   "targets");
            for (int ti = 0; ti < nT; ti++) {
                result r;
                memset(&r, 0, sizeof r);
                r.T = Ts[ti];
                r.graph = graph, r.dev = dev;
                r.chunks = dsv4_plan_chunks(plan, r.T);
                int64_t T = r.T;
                if (graph && !dsv4_plan_can_replay(plan, T)) {
                    /* runs eager in this plan: still timed, marked */
                    snprintf(r.err, sizeof r.err, "no bucket holds T (eager)");
                }
                int reps = T <= 256 ? 50 : T <= 1024 ? 20 : T <= 4096 ? 10 : 5; /* <= MAX_REPS */
                if (quick)
                    reps = reps / 5 > 3 ? reps / 5 : 3;
                dsv4_forward_out o = {y, ids, NULL, NULL};
                dsv4_forward_out od = {(uint16_t *)dy, (int32_t *)dids, NULL, NULL};
                double t[MAX_REPS];
                int n = 0;
                st = DSV4_OK;
                static tl_run tlr; /* --timeline (its summary is 7 KB) */
                tlr.steps = dev == IO_STREAM ? tl_steps : 0, tlr.ok = 0;
                snprintf(tlr.err, sizeof tlr.err, "the row's calls failed");
                if (dev == IO_STREAM) {
#ifdef DSV4_BENCH_CUDA_RT
                    /* replayed only where the plan's own graphs would replay T (the bucket rule) */
                    st = time_stream(b, graph && dsv4_plan_can_replay(plan, T), T, dx, din, dy, dids, reps, t, &tlr, &e);
                    n = st ? 0 : reps;
#endif
                } else {
                    for (int w = 0; w < 3 && !st; w++)
                        st = dev ? dsv4_backend_forward_device(b, T, dx, (const int32_t *)din, &od, &e)
                                 : dsv4_backend_forward(b, T, X, ids_in, &o, &e);
                    for (int i = 0; i < reps && !st; i++) {
                        double t0 = now();
                        st = dev ? dsv4_backend_forward_device(b, T, dx, (const int32_t *)din, &od, &e)
                                 : dsv4_backend_forward(b, T, X, ids_in, &o, &e);
                        t[n++] = now() - t0;
                    }
                }
#ifdef DSV4_BENCH_CUDA_RT
                if (!st && dev && cudaMemcpy(ids, dids, (size_t)(T * K) * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
                    st = DSV4_ERR_DEVICE;
                    snprintf(e.message, sizeof e.message, "reading topk ids back failed");
                }
#endif
                if (st) {
                    snprintf(r.err, sizeof r.err, "%s", e.message);
                    printf("%6lld  forward failed: %s\n", (long long)T, e.message);
                    nfail++;
                } else {
                    r.ok = true;
                    r.reps = n;
                    double mn = 1e30;
                    for (int i = 0; i < n; i++)
                        mn = t[i] < mn ? t[i] : mn;
                    r.min_ms = mn * 1e3;
                    r.ms = median(t, n) * 1e3;
                    unsigned char touched[MAX_E] = {0};
                    int64_t kept = 0;
                    for (int64_t i = 0; i < T * K; i++)
                        if (ids[i] >= 0 && ids[i] < E) {
                            kept++;
                            if (!touched[ids[i]]) {
                                touched[ids[i]] = 1;
                                r.touched++;
                            }
                        }
                    r.fill_ok = on_gmm && bench_group_fill(ids, T, (int)K, (int)E, dsv4_plan_chunk_tokens(plan),
                                                           cut, 128, &r.fill) == 0;
                    r.touched_bytes = shared_bytes + gate_bytes;
                    for (int64_t x = 0; x < E; x++)
                        r.touched_bytes += touched[x] ? expert_bytes[x] : 0;
                    double sec = r.ms * 1e-3;
                    double flops = 2.0 * 3.0 * (double)H * (double)I * (double)(kept + T * cfg.n_shared_experts) +
                                   2.0 * (double)T * (double)E * (double)H;
                    r.gbs = (double)r.touched_bytes / sec / 1e9;
                    r.bw_share = r.gbs / C.copy_gbs;
                    r.tflops = flops / sec / 1e12;
                    r.fp8_share = r.tflops / C.fp8_tflops;
                    r.floor_mem_ms = (double)r.touched_bytes / (C.copy_gbs * 1e9) * 1e3;
                    r.floor_fp8_ms = flops / (C.fp8_tflops * 1e12) * 1e3;
                    r.bw_reachable = !(r.floor_fp8_ms > r.floor_mem_ms / bw_target);
                    r.io_ms = dev != IO_HOST ? 0.0
                                  : ((double)(T * H * 2) / (C.h2d_gbs * 1e9) + (double)(T * H * 2) / (C.d2h_gbs * 1e9)) * 1e3;
                    r.peer_ms = peer_ms(&P, T, &r.peer_method);
                    r.speedup = r.peer_ms / r.ms;
                }
                char tg[600] = "";
                if (r.ok) {
                    size_t tl = 0;
                    for (int g = 0; g < ntg && tl < sizeof tg; g++) {
                        if (T < tgs[g].tmin || T > tgs[g].tmax || !target_here(&tgs[g]))
                            continue; /* not this T's, or judged with the peers by ci/device-table.py */
                        double v = target_metric(&tgs[g], r.ms, r.bw_share, r.fp8_share, r.speedup);
                        if (isnan(v) && strcmp(tgs[g].metric, "x_torch"))
                            continue; /* not measured in this call (no ceilings) */
                        tl += (size_t)snprintf(tg + tl, sizeof tg - tl, "%s%s %s", tl ? " " : "", tgs[g].name,
                                               !isfinite(v)              ? "n/a"
                                               : target_holds(&tgs[g], v) ? "ok"
                                               : !strcmp(tgs[g].metric, "share_of_copy") && !r.bw_reachable
                                                   ? "MISS(compute-bound)"
                                                   : "MISS");
                    }
                    double fl = r.floor_mem_ms > r.floor_fp8_ms ? r.floor_mem_ms : r.floor_fp8_ms;
                    printf("%6lld %10.4f %10.4f %5d %9.1f %8.1f %6.1f%% %8.1f %6.1f%% %9.4f %6s %8.4f %9.4f %7.2fx  "
                           "%s%s%s\n",
                           (long long)T, r.ms, r.min_ms, r.touched, r.touched_bytes / 1e6, r.gbs, 100 * r.bw_share,
                           r.tflops, 100 * r.fp8_share, fl, r.floor_mem_ms >= r.floor_fp8_ms ? "mem" : "fp8", r.io_ms,
                           r.peer_ms, r.speedup, tg, r.err[0] ? "  " : "", r.err);
                    if (r.fill_ok && dev == IO_HOST && r.fill.padded)
                        printf("%6s grouped GEMM: %llu groups above %d rows, %llu of their %llu padded rows real (%.1f %%), "
                               "%.1f %% of the %llu slots\n",
                               "", (unsigned long long)r.fill.groups, cut,
                               (unsigned long long)r.fill.rows, (unsigned long long)r.fill.padded,
                               100.0 * (double)r.fill.rows / (double)r.fill.padded,
                               100.0 * (double)r.fill.rows / (double)(r.fill.slots ? r.fill.slots : 1),
                               (unsigned long long)r.fill.slots);
                }
                fflush(stdout);
                fprintf(jf,
                        "%s    {\"graph\": %s, \"io\": \"%s\", \"tokens\": %lld, \"ok\": %s, \"chunks\": %lld, "
                        "\"median_ms\": %.5f, "
                        "\"min_ms\": %.5f, \"reps\": %d, \"touched_experts\": %d, \"touched_weight_bytes\": %llu, "
                        "\"touched_gbs\": %.3f, \"share_of_copy\": %.4f, \"tflops\": %.3f, \"share_of_fp8_gemm\": %.4f, "
                        "\"floor_mem_ms\": %.5f, \"floor_fp8_ms\": %.5f, \"io_ms\": %.5f, \"bw_target_reachable\": %s, "
                        "\"torch_ms\": %.5f, \"torch_method\": \"%s\", \"speedup_vs_torch\": %.4f, \"targets\": \"%s\", "
                        "\"gemm_groups\": %lld, \"gemm_rows\": %lld, \"gemm_padded_rows\": %lld, \"note\": ",
                        first ? "" : ",\n", graph ? "true" : "false", io_name[dev], (long long)T,
                        r.ok ? "true" : "false", (long long)r.chunks, JN(r.ms), JN(r.min_ms), r.reps, r.touched,
                        (unsigned long long)r.touched_bytes, JN(r.gbs), JN(r.bw_share), JN(r.tflops), JN(r.fp8_share),
                        JN(r.floor_mem_ms), JN(r.floor_fp8_ms), JN(r.io_ms), r.bw_reachable ? "true" : "false",
                        JN(r.peer_ms), r.peer_method ? r.peer_method : "-", JN(r.speedup), tg,
                        r.fill_ok ? (long long)r.fill.groups : -1LL, r.fill_ok ? (long long)r.fill.rows : -1LL,
                        r.fill_ok ? (long long)r.fill.padded : -1LL);
                json_put_str(jf, r.err);
                if (tlr.steps > 0) {
                    print_timeline(&tlr, T, graph);
                    fprintf(jf, ", \"timeline\": ");
                    json_timeline(jf, &tlr);
                }
                fputc('}', jf);
                first = 0;
                if (nrows < MAX_ROWS)
                    rows[nrows++] = r;
            }
        }
        dsv4_backend_stats s = dsv4_backend_get_stats(b);
        printf("graph %s: workspace peak %.1f MiB (plan %.1f MiB), device memory taken %.1f MiB, launches %llu, "
               "empty skips %llu\n",
               graph ? "on" : "off", s.workspace_peak / 1048576.0, s.workspace_planned / 1048576.0,
               s.device_allocated / 1048576.0, (unsigned long long)s.launches, (unsigned long long)s.empty_skips);
        dsv4_backend_free(b);
        dsv4_plan_free(plan);
    }
#ifdef DSV4_BENCH_CUDA_RT
    cudaFree(dx), cudaFree(dy), cudaFree(dids), cudaFree(din);
#endif
    /* the targets, on the best (lowest median) configuration of each T; a T that failed anywhere fails
       the targets covering it; each: met, missed, not run (no timed T in its range), or left to the
       device table (a peer's metric) */
    fprintf(jf, "\n  ],\n  \"targets_file\": ");
    json_put_str(jf, targets_path);
    fprintf(jf, ",\n  \"targets\": {");
    printf("\ntargets (%s, on the best configuration of each T):\n", targets_path);
    if (!ntg)
        printf("  none read from %s\n", targets_path);
    for (int g = 0; g < ntg; g++) {
        int seen = 0, met = 1, peers = !target_here(&tgs[g]);
        for (int ti = 0; ti < nT && !peers; ti++) {
            if (Ts[ti] < tgs[g].tmin || Ts[ti] > tgs[g].tmax)
                continue;
            const result *best = NULL;
            int failed = 0;
            for (int i = 0; i < nrows; i++) {
                if (rows[i].T != Ts[ti])
                    continue;
                if (!rows[i].ok)
                    failed = 1;
                else if (!best || rows[i].ms < best->ms)
                    best = &rows[i];
            }
            if (!best || failed) {
                seen = 1, met = 0;
                continue;
            }
            double v = target_metric(&tgs[g], best->ms, best->bw_share, best->fp8_share, best->speedup);
            if (!isfinite(v))
                continue; /* no torch peer time for this T */
            seen = 1;
            met &= target_holds(&tgs[g], v);
        }
        fprintf(jf, "%s\"%s\": %s", g ? ", " : "", tgs[g].name, peers || !seen ? "null" : met ? "true" : "false");
        printf("  %-22s %-8s %s\n", tgs[g].name,
               peers ? "peers" : !seen ? "not run" : met ? "met" : "NOT met", tgs[g].what);
    }
    fprintf(jf, "}\n}\n");
    fclose(jf);
    if (ntg)
        printf("  (peers: judged with the HF and GEMM-only peers by ci/device-table.py)\n");
    printf("timing: host clock around the synchronous forward (io host: dsv4_backend_forward, includes the x upload "
           "and y download; io device: dsv4_backend_forward_device on device-resident x and y); io stream: CUDA "
           "events around each dsv4_backend_enqueue on one stream, back to back (graph on: its captured graph "
           "replayed), the peers' method; targets on the best configuration of each T; "
           "touch MB = distinct touched routed experts + shared expert + gate in the checkpoint's format; %%copy "
           "against copy GB/s counting read + written; %%fp8 against the %s FP8 GEMM; floor = the larger of touch bytes "
           "at the copy rate and FLOPs at the FP8 rate (bound: which); 'compute-bound' marks a T where even the FP8 "
           "floor is longer than the copy-share target allows; io ms = x up + y down at the pageable host-copy rates "
           "(inside the timed call)\n",
           C.fp8_kind[0] ? C.fp8_kind : "(unmeasured)");
    printf("bench_cuda: wrote %s\n", json);
    free(y);
    free(ids);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    if (nfail)
        printf("bench_cuda: %d forward%s or configurations failed (exit 1): the times above are incomplete\n", nfail,
               nfail == 1 ? "" : "s");
    return nfail ? 1 : 0;
}
