/*
 * beagle_bench: time BEAGLE's CPU likelihood on transition matrices given as input.
 *
 * Build:  cc -O2 beagle_bench.c $(pkg-config --cflags --libs hmsbeagle-1) -o beagle_bench
 * Run:    beagle_bench INPUT            (one JSON line on stdout, diagnostics on stderr)
 *
 * The instance is asked for the CPU, double precision, SSE vectors and no threading.
 * Transition matrices are set directly (beagleSetTransitionMatrix), so BEAGLE computes
 * exactly the likelihood of the matrices it is given; what is timed is
 * beagleUpdatePartials over all post-order operations plus
 * beagleCalculateRootLogLikelihoods, without and with per-node rescaling.
 * When derivative matrices (dP/dt) are given, the branch-length gradient is timed too:
 * BEAGLE 3.1 has no pre-order API, so "upper" partials are built with ordinary
 * beagleUpdatePartials operations (valid for a reversible model) and
 * beagleCalculateEdgeLogLikelihoods is called with first derivatives for every edge.
 *
 * Input: whitespace-separated tokens, every section introduced by its keyword, in this order:
 *   beagle_bench 1
 *   tips N nodes M patterns P states S categories C repeats R     (R = 0: choose)
 *   pattern_weights   P doubles
 *   category_weights  C doubles
 *   frequencies       S doubles
 *   tip k states   P ints in 0..S (S = missing)        } one of the two for each tip
 *   tip k partials P*S doubles (pattern-major)          } k = 0..N-1, in order
 *   matrix k  C*S*S doubles (category, from-state, to-state) for every non-root node k
 *   derivatives 0|1
 *   [dmatrix k  C*S*S doubles for every non-root node k]      (when derivatives 1)
 *   operations K
 *   K lines "parent child1 child2" in post-order (the root's operation last)
 * Nodes: tips 0..N-1, internal nodes N..M-1; the tree must be binary and rooted.
 */

#define _POSIX_C_SOURCE 199309L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "libhmsbeagle/beagle.h"

static const char *g_call = "";

#define CHECK(call)                                                                      \
    do {                                                                                 \
        g_call = #call;                                                                  \
        int code_ = (call);                                                              \
        if (code_ < 0) {                                                                 \
            fprintf(stderr, "beagle_bench: %s failed with BEAGLE code %d\n", g_call, code_); \
            exit(3);                                                                     \
        }                                                                                \
    } while (0)

static void die(const char *message, const char *detail) {
    fprintf(stderr, "beagle_bench: %s%s%s\n", message, detail ? ": " : "", detail ? detail : "");
    exit(2);
}

/* ---- input reading ---- */

static FILE *g_in;

static void expect(const char *word) {
    char token[64];
    if (fscanf(g_in, "%63s", token) != 1 || strcmp(token, word) != 0) die("expected keyword", word);
}

static int read_int(void) {
    int value;
    if (fscanf(g_in, "%d", &value) != 1) die("expected an integer", NULL);
    return value;
}

static double read_double(void) {
    double value;
    if (fscanf(g_in, "%lf", &value) != 1) die("expected a number", NULL);
    return value;
}

static void *checked_malloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) die("out of memory", NULL);
    return p;
}

/* ---- timing ---- */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int n) {
    qsort(values, n, sizeof(double), compare_doubles);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/* ---- the problem ---- */

typedef struct {
    int tips, nodes, patterns, states, categories, repeats, n_ops, root;
    int *op_parent, *op_child1, *op_child2; /* post-order */
    int *parent, *sibling;                  /* per node */
    int instance;
    int has_derivatives;
    /* buffer / matrix / scale indices */
    int ones_buffer;      /* partials of all ones: the "upper" partial above the root */
    int identity_matrix;  /* P = I for the ones buffer */
    int root_cumulative;  /* scale buffer summing all post-order scalers */
    BeagleOperation *post_plain, *post_scaled, *pre_plain, *pre_scaled;
    int n_pre;
    int *edge_nodes, n_edges; /* non-root nodes in pre-order (parents before children) */
    double *edge_derivatives;
} Problem;

/* Buffer layout (nodes M, internal I = M - N):
 *   partials: 0..M-1 the post-order (lower) partials of each node (tips 0..N-1),
 *             M + v the upper partial of non-root node v, 2M the all-ones buffer.
 *   matrices: v = P of the branch above v, M + v = dP/dt of it, 2M = identity.
 *   scale:    k - N for internal node k (lower), I + v for upper of v,
 *             I + M the root cumulative, I + M + 1 + v the cumulative for edge v. */
static int lower_scale(const Problem *p, int node) { return node - p->tips; }
static int upper_scale(const Problem *p, int node) { return p->nodes - p->tips + node; }
static int edge_scale(const Problem *p, int node) { return p->nodes - p->tips + p->nodes + 1 + node; }

static void post_order(const Problem *p, int scaled) {
    if (scaled) {
        CHECK(beagleResetScaleFactors(p->instance, p->root_cumulative));
        CHECK(beagleUpdatePartials(p->instance, p->post_scaled, p->n_ops, p->root_cumulative));
    } else {
        CHECK(beagleUpdatePartials(p->instance, p->post_plain, p->n_ops, BEAGLE_OP_NONE));
    }
}

static double root_log_likelihood(const Problem *p, int scaled) {
    int buffer = p->root, weights = 0, frequencies = 0;
    int cumulative = scaled ? p->root_cumulative : BEAGLE_OP_NONE;
    double log_likelihood = 0.0;
    CHECK(beagleCalculateRootLogLikelihoods(p->instance, &buffer, &weights, &frequencies, &cumulative, 1,
                                            &log_likelihood));
    return log_likelihood;
}

static double evaluate(const Problem *p, int scaled) {
    post_order(p, scaled);
    return root_log_likelihood(p, scaled);
}

/* Post-order pass, then upper partials and d logL / d t for every edge. Returns logL. */
static double gradient(const Problem *p, int scaled) {
    double log_likelihood = evaluate(p, scaled);
    if (scaled) {
        CHECK(beagleUpdatePartials(p->instance, p->pre_scaled, p->n_pre, BEAGLE_OP_NONE));
    } else {
        CHECK(beagleUpdatePartials(p->instance, p->pre_plain, p->n_pre, BEAGLE_OP_NONE));
    }
    for (int e = 0; e < p->n_edges; e++) {
        int v = p->edge_nodes[e];
        int upper = p->nodes + v, lower = v, matrix = v, dmatrix = p->nodes + v, weights = 0, frequencies = 0;
        int cumulative = BEAGLE_OP_NONE;
        if (scaled) {
            /* edge v needs every lower scaler except those of v's ancestors, plus the upper
             * scalers on the path from v to the root: C_v = C_parent - lower(parent) + upper(v). */
            int up = p->parent[v];
            int source = up == p->root ? p->root_cumulative : edge_scale(p, up);
            int remove = lower_scale(p, up), add = upper_scale(p, v);
            cumulative = edge_scale(p, v);
            CHECK(beagleCopyScaleFactors(p->instance, cumulative, source));
            CHECK(beagleRemoveScaleFactors(p->instance, &remove, 1, cumulative));
            CHECK(beagleAccumulateScaleFactors(p->instance, &add, 1, cumulative));
        }
        double edge_log_likelihood = 0.0, first = 0.0;
        CHECK(beagleCalculateEdgeLogLikelihoods(p->instance, &upper, &lower, &matrix, &dmatrix, NULL, &weights,
                                                &frequencies, &cumulative, 1, &edge_log_likelihood, &first,
                                                NULL));
        p->edge_derivatives[v] = first;
    }
    return log_likelihood;
}

typedef double (*Work)(const Problem *, int);

/* Median wall milliseconds of `work`; repeats chosen to fill about `budget_ms` when 0. */
static double time_work(const Problem *p, Work work, int scaled, int repeats, double budget_ms, double *value,
                        double *cpu_per_wall, int *used_repeats) {
    double start = now_ms();
    *value = work(p, scaled); /* warm-up */
    work(p, scaled);
    double once = (now_ms() - start) / 2.0;
    if (repeats <= 0) {
        repeats = once > 0 ? (int)(budget_ms / once) : 1000;
        if (repeats < 7) repeats = 7;
        if (repeats > 2000) repeats = 2000;
    }
    double *times = checked_malloc(sizeof(double) * repeats);
    double wall0 = now_ms(), cpu0 = cpu_ms();
    for (int r = 0; r < repeats; r++) {
        double t0 = now_ms();
        work(p, scaled);
        times[r] = now_ms() - t0;
    }
    double wall = now_ms() - wall0, cpu = cpu_ms() - cpu0;
    *cpu_per_wall = wall > 0 ? cpu / wall : 1.0;
    *used_repeats = repeats;
    double result = median(times, repeats);
    free(times);
    return result;
}

static void json_string(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    putchar('"');
}

static void print_flags(long flags) {
    static const struct { long bit; const char *name; } names[] = {
        {BEAGLE_FLAG_PRECISION_SINGLE, "PRECISION_SINGLE"}, {BEAGLE_FLAG_PRECISION_DOUBLE, "PRECISION_DOUBLE"},
        {BEAGLE_FLAG_COMPUTATION_SYNCH, "COMPUTATION_SYNCH"}, {BEAGLE_FLAG_COMPUTATION_ASYNCH, "COMPUTATION_ASYNCH"},
        {BEAGLE_FLAG_EIGEN_REAL, "EIGEN_REAL"}, {BEAGLE_FLAG_EIGEN_COMPLEX, "EIGEN_COMPLEX"},
        {BEAGLE_FLAG_SCALING_MANUAL, "SCALING_MANUAL"}, {BEAGLE_FLAG_SCALING_AUTO, "SCALING_AUTO"},
        {BEAGLE_FLAG_SCALING_ALWAYS, "SCALING_ALWAYS"}, {BEAGLE_FLAG_SCALING_DYNAMIC, "SCALING_DYNAMIC"},
        {BEAGLE_FLAG_SCALERS_RAW, "SCALERS_RAW"}, {BEAGLE_FLAG_SCALERS_LOG, "SCALERS_LOG"},
        {BEAGLE_FLAG_VECTOR_SSE, "VECTOR_SSE"}, {BEAGLE_FLAG_VECTOR_AVX, "VECTOR_AVX"},
        {BEAGLE_FLAG_VECTOR_NONE, "VECTOR_NONE"}, {BEAGLE_FLAG_THREADING_CPP, "THREADING_CPP"},
        {BEAGLE_FLAG_THREADING_OPENMP, "THREADING_OPENMP"}, {BEAGLE_FLAG_THREADING_NONE, "THREADING_NONE"},
        {BEAGLE_FLAG_PROCESSOR_CPU, "PROCESSOR_CPU"}, {BEAGLE_FLAG_PROCESSOR_GPU, "PROCESSOR_GPU"},
        {BEAGLE_FLAG_FRAMEWORK_CPU, "FRAMEWORK_CPU"}, {BEAGLE_FLAG_FRAMEWORK_CUDA, "FRAMEWORK_CUDA"},
        {BEAGLE_FLAG_FRAMEWORK_OPENCL, "FRAMEWORK_OPENCL"},
    };
    putchar('[');
    int first = 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (flags & names[i].bit) {
            if (!first) putchar(',');
            json_string(names[i].name);
            first = 0;
        }
    }
    putchar(']');
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: beagle_bench INPUT", NULL);
    g_in = fopen(argv[1], "r");
    if (!g_in) die("cannot open input", strerror(errno));

    Problem pb = {0};
    Problem *p = &pb;
    expect("beagle_bench");
    if (read_int() != 1) die("unsupported input version", NULL);
    expect("tips"); p->tips = read_int();
    expect("nodes"); p->nodes = read_int();
    expect("patterns"); p->patterns = read_int();
    expect("states"); p->states = read_int();
    expect("categories"); p->categories = read_int();
    expect("repeats"); p->repeats = read_int();
    int N = p->tips, M = p->nodes, P = p->patterns, S = p->states, C = p->categories;
    if (N < 2 || M != 2 * N - 1 || P < 1 || S < 2 || C < 1) die("sizes are not those of a binary rooted tree", NULL);

    double *pattern_weights = checked_malloc(sizeof(double) * P);
    double *category_weights = checked_malloc(sizeof(double) * C);
    double *frequencies = checked_malloc(sizeof(double) * S);
    expect("pattern_weights");
    for (int i = 0; i < P; i++) pattern_weights[i] = read_double();
    expect("category_weights");
    for (int i = 0; i < C; i++) category_weights[i] = read_double();
    expect("frequencies");
    for (int i = 0; i < S; i++) frequencies[i] = read_double();

    int *tip_kind = checked_malloc(sizeof(int) * N); /* 0 states, 1 partials */
    int **tip_states = checked_malloc(sizeof(int *) * N);
    double **tip_partials = checked_malloc(sizeof(double *) * N);
    int partial_tips = 0;
    for (int t = 0; t < N; t++) {
        char kind[16];
        expect("tip");
        if (read_int() != t) die("tips must be listed in order", NULL);
        if (fscanf(g_in, "%15s", kind) != 1) die("expected states or partials", NULL);
        if (strcmp(kind, "states") == 0) {
            tip_states[t] = checked_malloc(sizeof(int) * P);
            for (int i = 0; i < P; i++) {
                tip_states[t][i] = read_int();
                if (tip_states[t][i] < 0 || tip_states[t][i] > S) die("tip state out of range", NULL);
            }
        } else if (strcmp(kind, "partials") == 0) {
            tip_kind[t] = 1;
            partial_tips++;
            tip_partials[t] = checked_malloc(sizeof(double) * P * S);
            for (int i = 0; i < P * S; i++) tip_partials[t][i] = read_double();
        } else {
            die("expected states or partials", kind);
        }
    }

    /* matrices come before the operations, so keep them until the root is known */
    int matrix_size = C * S * S;
    double *matrices = checked_malloc(sizeof(double) * (size_t)M * matrix_size);
    double *dmatrices = NULL;
    int *has_matrix = checked_malloc(sizeof(int) * M);
    for (int k = 0; k < M - 1; k++) {
        expect("matrix");
        int node = read_int();
        if (node < 0 || node >= M || has_matrix[node]) die("bad matrix node", NULL);
        has_matrix[node] = 1;
        for (int i = 0; i < matrix_size; i++) matrices[(size_t)node * matrix_size + i] = read_double();
    }
    expect("derivatives");
    p->has_derivatives = read_int();
    if (p->has_derivatives) {
        dmatrices = checked_malloc(sizeof(double) * (size_t)M * matrix_size);
        for (int k = 0; k < M - 1; k++) {
            expect("dmatrix");
            int node = read_int();
            if (node < 0 || node >= M || !has_matrix[node]) die("bad dmatrix node", NULL);
            for (int i = 0; i < matrix_size; i++) dmatrices[(size_t)node * matrix_size + i] = read_double();
        }
    }
    expect("operations");
    p->n_ops = read_int();
    if (p->n_ops != N - 1) die("a binary rooted tree has tips - 1 operations", NULL);
    p->op_parent = checked_malloc(sizeof(int) * p->n_ops);
    p->op_child1 = checked_malloc(sizeof(int) * p->n_ops);
    p->op_child2 = checked_malloc(sizeof(int) * p->n_ops);
    p->parent = checked_malloc(sizeof(int) * M);
    p->sibling = checked_malloc(sizeof(int) * M);
    int *done = checked_malloc(sizeof(int) * M);
    for (int i = 0; i < M; i++) p->parent[i] = -1;
    for (int i = 0; i < N; i++) done[i] = 1;
    for (int o = 0; o < p->n_ops; o++) {
        int a = read_int(), b = read_int(), c = read_int();
        if (a < N || a >= M || b < 0 || b >= M || c < 0 || c >= M || done[a] || !done[b] || !done[c] ||
            p->parent[b] >= 0 || p->parent[c] >= 0 || b == c)
            die("operations are not a post-order of a binary tree", NULL);
        p->op_parent[o] = a; p->op_child1[o] = b; p->op_child2[o] = c;
        p->parent[b] = a; p->parent[c] = a;
        p->sibling[b] = c; p->sibling[c] = b;
        done[a] = 1;
    }
    fclose(g_in);
    p->root = p->op_parent[p->n_ops - 1];
    if (has_matrix[p->root]) die("the root has no branch above it; give no matrix for it", NULL);

    /* ---- the instance ---- */
    int I = M - N;
    /* buffer indices run 0..2M (see the layout above); BEAGLE's buffer count is the sum of
     * partials and compact buffers, compact (tip states) ones for the tips given as states */
    int compact_buffers = N - partial_tips;
    int partials_buffers = 2 * M + 1 - compact_buffers;
    int matrix_buffers = 2 * M + 1;
    int scale_buffers = I + M + 1 + M;
    long requirement = BEAGLE_FLAG_PROCESSOR_CPU | BEAGLE_FLAG_FRAMEWORK_CPU | BEAGLE_FLAG_PRECISION_DOUBLE |
                       BEAGLE_FLAG_VECTOR_SSE | BEAGLE_FLAG_SCALING_MANUAL;
    long preference = BEAGLE_FLAG_THREADING_NONE | BEAGLE_FLAG_COMPUTATION_SYNCH | BEAGLE_FLAG_SCALERS_LOG;
    BeagleInstanceDetails details;
    memset(&details, 0, sizeof details);
    g_call = "beagleCreateInstance";
    p->instance = beagleCreateInstance(N, partials_buffers, compact_buffers, S, P, 1, matrix_buffers, C,
                                       scale_buffers, NULL, 0, preference, requirement, &details);
    if (p->instance < 0) {
        fprintf(stderr, "beagle_bench: beagleCreateInstance failed with BEAGLE code %d\n", p->instance);
        return 3;
    }
    if (details.flags & (BEAGLE_FLAG_THREADING_CPP | BEAGLE_FLAG_THREADING_OPENMP))
        fprintf(stderr, "beagle_bench: warning: BEAGLE chose a threaded implementation\n");

    for (int t = 0; t < N; t++) {
        if (tip_kind[t]) CHECK(beagleSetTipPartials(p->instance, t, tip_partials[t]));
        else CHECK(beagleSetTipStates(p->instance, t, tip_states[t]));
    }
    CHECK(beagleSetPatternWeights(p->instance, pattern_weights));
    CHECK(beagleSetCategoryWeights(p->instance, 0, category_weights));
    CHECK(beagleSetStateFrequencies(p->instance, 0, frequencies));
    for (int v = 0; v < M; v++) {
        if (!has_matrix[v]) continue;
        CHECK(beagleSetTransitionMatrix(p->instance, v, matrices + (size_t)v * matrix_size, 1.0));
        if (dmatrices) CHECK(beagleSetTransitionMatrix(p->instance, M + v, dmatrices + (size_t)v * matrix_size, 0.0));
    }
    p->identity_matrix = 2 * M;
    double *identity = checked_malloc(sizeof(double) * matrix_size);
    for (int c = 0; c < C; c++)
        for (int i = 0; i < S; i++) identity[(c * S + i) * S + i] = 1.0;
    CHECK(beagleSetTransitionMatrix(p->instance, p->identity_matrix, identity, 1.0));
    p->ones_buffer = 2 * M;
    double *ones = checked_malloc(sizeof(double) * (size_t)P * S * C);
    for (size_t i = 0; i < (size_t)P * S * C; i++) ones[i] = 1.0;
    CHECK(beagleSetPartials(p->instance, p->ones_buffer, ones));
    p->root_cumulative = I + M;

    /* post-order operations */
    p->post_plain = checked_malloc(sizeof(BeagleOperation) * p->n_ops);
    p->post_scaled = checked_malloc(sizeof(BeagleOperation) * p->n_ops);
    for (int o = 0; o < p->n_ops; o++) {
        BeagleOperation op = {p->op_parent[o], BEAGLE_OP_NONE, BEAGLE_OP_NONE,
                              p->op_child1[o], p->op_child1[o], p->op_child2[o], p->op_child2[o]};
        p->post_plain[o] = op;
        op.destinationScaleWrite = lower_scale(p, p->op_parent[o]);
        p->post_scaled[o] = op;
    }

    /* upper partials, parents before children (reverse post-order):
     * U_v = (P_sibling L_sibling) * (P_parent U_parent), and U_v = P_sibling L_sibling below the root. */
    p->n_pre = M - 1;
    p->pre_plain = checked_malloc(sizeof(BeagleOperation) * p->n_pre);
    p->pre_scaled = checked_malloc(sizeof(BeagleOperation) * p->n_pre);
    p->edge_nodes = checked_malloc(sizeof(int) * p->n_pre);
    p->edge_derivatives = checked_malloc(sizeof(double) * M);
    int k = 0;
    for (int o = p->n_ops - 1; o >= 0; o--) {
        int up = p->op_parent[o];
        int children[2] = {p->op_child1[o], p->op_child2[o]};
        for (int j = 0; j < 2; j++) {
            int v = children[j], s = p->sibling[v];
            BeagleOperation op = {M + v, BEAGLE_OP_NONE, BEAGLE_OP_NONE, s, s,
                                  up == p->root ? p->ones_buffer : M + up,
                                  up == p->root ? p->identity_matrix : up};
            p->pre_plain[k] = op;
            op.destinationScaleWrite = upper_scale(p, v);
            p->pre_scaled[k] = op;
            p->edge_nodes[k] = v;
            k++;
        }
    }
    p->n_edges = k;

    /* ---- timing ---- */
    double budget_ms = 1500.0;
    double log_likelihood, log_likelihood_scaled, ratio_plain, ratio_scaled;
    int repeats_plain, repeats_scaled;
    double ms_plain = time_work(p, evaluate, 0, p->repeats, budget_ms, &log_likelihood, &ratio_plain, &repeats_plain);
    double ms_scaled = time_work(p, evaluate, 1, p->repeats, budget_ms, &log_likelihood_scaled, &ratio_scaled,
                                 &repeats_scaled);

    printf("{\"version\":");
    json_string(beagleGetVersion());
    printf(",\"implementation\":");
    json_string(details.implName);
    printf(",\"resource\":");
    json_string(details.resourceName);
    printf(",\"resource_number\":%d,\"flags\":", details.resourceNumber);
    print_flags(details.flags);
    printf(",\"tips\":%d,\"patterns\":%d,\"states\":%d,\"categories\":%d", N, P, S, C);
    printf(",\"log_likelihood\":%.17g,\"log_likelihood_rescaled\":%.17g", log_likelihood, log_likelihood_scaled);
    printf(",\"median_ms\":%.6g,\"median_ms_rescaled\":%.6g", ms_plain, ms_scaled);
    printf(",\"repeats\":%d,\"repeats_rescaled\":%d", repeats_plain, repeats_scaled);
    printf(",\"cpu_per_wall\":%.3f,\"cpu_per_wall_rescaled\":%.3f", ratio_plain, ratio_scaled);
    if (p->has_derivatives) {
        double g_log_likelihood, g_log_likelihood_scaled, g_ratio, g_ratio_scaled;
        int g_repeats, g_repeats_scaled;
        double g_ms = time_work(p, gradient, 0, p->repeats, budget_ms, &g_log_likelihood, &g_ratio, &g_repeats);
        double *plain_derivatives = checked_malloc(sizeof(double) * M);
        gradient(p, 0);
        memcpy(plain_derivatives, p->edge_derivatives, sizeof(double) * M);
        double g_ms_scaled = time_work(p, gradient, 1, p->repeats, budget_ms, &g_log_likelihood_scaled,
                                       &g_ratio_scaled, &g_repeats_scaled);
        gradient(p, 1);
        printf(",\"gradient_median_ms\":%.6g,\"gradient_median_ms_rescaled\":%.6g", g_ms, g_ms_scaled);
        printf(",\"gradient_repeats\":%d,\"gradient_repeats_rescaled\":%d", g_repeats, g_repeats_scaled);
        printf(",\"derivatives\":[");
        for (int v = 0; v < M; v++) printf("%s%.17g", v ? "," : "", v == p->root ? 0.0 : plain_derivatives[v]);
        printf("],\"derivatives_rescaled\":[");
        for (int v = 0; v < M; v++) printf("%s%.17g", v ? "," : "", v == p->root ? 0.0 : p->edge_derivatives[v]);
        printf("]");
    }
    printf("}\n");
    CHECK(beagleFinalizeInstance(p->instance));
    return 0;
}
