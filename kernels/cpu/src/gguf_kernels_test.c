/* Self-test of gguf_kernels.c on the path this build takes (AVX2, VNNI, NEON, portable C):
 * every SIMD product is checked against the portable reference of the same build, bit for
 * bit, on random weights and inputs, as are batch and thread-count invariance.
 *
 *   cc -O3 -march=native -ffp-contract=off -fopenmp -std=c11 gguf_kernels_test.c -lm
 *
 * Prints one line per check and "N passed, M failed"; exits non-zero when one failed.
 * (scripts/test_kernels_native builds it natively, for older x86 levels and for aarch64.)
 */
#include "gguf_kernels.c"

#include <stdio.h>
#include <stdlib.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

static int passed, failed;

static void report(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok)
        passed++;
    else
        failed++;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next() >> 8) / 16777216.0f; }

/* A finite half of moderate size (exponent -9..0, either sign): a block's scale. */
static uint16_t sane_half(void)
{
    return (uint16_t)((next() & 1) << 15 | (6 + next() % 10) << 10 | (next() & 0x3ff));
}

/* Random weight rows of a type: random codes, finite scales (and, for F16 and BF16,
 * finite values, some of them subnormal). */
static void random_weights(int type, uint8_t *w, int64_t n, int64_t k)
{
    const type_info t = info(type);
    const int64_t bytes = n * gk_row_bytes(type, k);
    for (int64_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)next();
    if (type == T_F32) {
        for (int64_t i = 0; i < n * k; i++) {
            const float f = uniform(-1.0f, 1.0f);
            memcpy(w + 4 * i, &f, 4);
        }
        return;
    }
    if (type == T_F16 || type == T_BF16) {
        for (int64_t i = 0; i < n * k; i++) {
            uint16_t h;
            if (type == T_F16)
                h = (uint16_t)((next() & 1) << 15 | (next() % 30) << 10 | (next() & 0x3ff));
            else
                h = (uint16_t)((next() & 1) << 15 | (100 + next() % 50) << 7 | (next() & 0x7f));
            memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    for (int64_t b = 0; b < n * k / t.block; b++) {
        uint8_t *blk = w + b * t.bytes;
        uint16_t h = sane_half(), m = sane_half();
        if (type == T_Q6_K) {
            memcpy(blk + 208, &h, 2);
            continue;
        }
        memcpy(blk, &h, 2);
        if (type == T_Q4_1 || type == T_Q5_1 || type == T_Q4_K || type == T_Q5_K)
            memcpy(blk + 2, &m, 2);
    }
}

/* Random inputs; some rows constant (every code 127 or -127: the largest integer sums),
 * some blocks zero (scale 0). */
static void random_inputs(float *x, int64_t rows, int64_t k)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < k; i++) {
            float v = uniform(-3.0f, 3.0f);
            if (r % 5 == 3)
                v = r % 2 ? 2.5f : -2.5f;
            if (r % 7 == 4 && (i / 32) % 3 == 1)
                v = 0.0f;
            x[r * k + i] = v;
        }
}

/* Worst cases for the integer dots: every weight code at its largest (bytes 0xff; Q8_0's
 * -1 then, so 0x80: -128), the scales left sane. */
static void extreme_weights(int type, uint8_t *w, int64_t n, int64_t k)
{
    random_weights(type, w, n, k);
    const type_info t = info(type);
    if (t.family == F_FLOAT)
        return;
    for (int64_t b = 0; b < n * k / t.block; b++) {
        uint8_t *blk = w + b * t.bytes;
        switch (type) {
        case T_Q8_0:
            memset(blk + 2, 0x80, 32);
            break;
        case T_Q6_K:
            memset(blk, 0xff, 192); /* codes 63; the scales stay random */
            break;
        case T_Q4_K:
        case T_Q5_K:
            memset(blk + 4, 0xff, t.bytes - 4); /* scales and mins 63, codes 15 or 31 */
            break;
        default:
            memset(blk + 2 + 2 * (type == T_Q4_1 || type == T_Q5_1), 0xff,
                   t.bytes - 2 - 2 * (type == T_Q4_1 || type == T_Q5_1));
        }
    }
}

static int same_bits(const float *a, const float *b, int64_t count)
{
    return memcmp(a, b, sizeof(float) * count) == 0;
}

static const char *type_name(int type)
{
    switch (type) {
    case T_F32:
        return "F32";
    case T_F16:
        return "F16";
    case T_BF16:
        return "BF16";
    case T_Q4_0:
        return "Q4_0";
    case T_Q4_1:
        return "Q4_1";
    case T_Q5_0:
        return "Q5_0";
    case T_Q5_1:
        return "Q5_1";
    case T_Q8_0:
        return "Q8_0";
    case T_Q4_K:
        return "Q4_K";
    case T_Q5_K:
        return "Q5_K";
    default:
        return "Q6_K";
    }
}

#define MAX_ROWS 70 /* past a tile's TILE_ROWS */

/* The path's product of every row count up to MAX_ROWS against the reference, alone and in
 * a batch, with one thread and with all. */
static void check_product(int type, int64_t n, int64_t k, int extreme)
{
    const int64_t rb = gk_row_bytes(type, k), ab = gk_act_bytes(type, k);
    uint8_t *w = malloc(n * rb), *xq = malloc(MAX_ROWS * ab), *scratch = malloc(MAX_ROWS * ab);
    float *x = malloc(sizeof(float) * MAX_ROWS * k);
    float *ref = malloc(sizeof(float) * MAX_ROWS * n), *got = malloc(sizeof(float) * MAX_ROWS * n);
    float *one = malloc(sizeof(float) * n);
    if (extreme)
        extreme_weights(type, w, n, k);
    else
        random_weights(type, w, n, k);
    random_inputs(x, MAX_ROWS, k);
    gk_quantize_act(type, x, MAX_ROWS, k, xq);
    for (int64_t r = 0; r < MAX_ROWS; r++)
        for (int64_t o = 0; o < n; o++)
            ref_rows(type, w + o * rb, k, xq + r * ab, ab, 1, ref + r * n + o, 1);
    int ok = 1, batch_ok = 1, linear_ok = 1, threads_ok = 1;
    const int64_t counts[] = {1, 2, 3, 5, 8, 9, 13, 17, 49, MAX_ROWS};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        const int64_t rows = counts[c];
        memset(got, 0xff, sizeof(float) * rows * n);
        gk_matmul(type, w, n, k, xq, rows, got);
        ok &= same_bits(got, ref, rows * n);
        memset(got, 0xff, sizeof(float) * rows * n);
        gk_linear(type, w, n, k, x, rows, got, scratch);
        linear_ok &= same_bits(got, ref, rows * n);
    }
    for (int64_t r = 0; r < MAX_ROWS; r++) { /* each row alone, from inside the batch */
        gk_matmul(type, w, n, k, xq + r * ab, 1, one);
        batch_ok &= same_bits(one, ref + r * n, n);
    }
#if defined(_OPENMP)
    const int threads = omp_get_max_threads();
    omp_set_num_threads(threads > 1 ? 1 : 3);
    gk_matmul(type, w, n, k, xq, MAX_ROWS, got);
    threads_ok = same_bits(got, ref, MAX_ROWS * n);
    omp_set_num_threads(threads);
#endif
    char what[160];
    snprintf(what, sizeof what, "%-4s n=%-4lld k=%-5lld%s rows 1..%d: %s=reference%s%s%s",
             type_name(type), (long long)n, (long long)k, extreme ? " (largest codes)" : "",
             MAX_ROWS, gk_path(), batch_ok ? "" : ", a row alone differs",
             linear_ok ? "" : ", gk_linear differs", threads_ok ? "" : ", thread count matters");
    if (!ok)
        strncat(what, " -- product differs", sizeof what - strlen(what) - 1);
    report(ok && batch_ok && linear_ok && threads_ok, what);
    free(w);
    free(xq);
    free(scratch);
    free(x);
    free(ref);
    free(got);
    free(one);
}

/* Activation rows: this path's bytes equal the portable code's; codes within a half step
 * of the inputs; sums exact. Row 2 holds ties (x / d = n + 0.5 exactly: each block's
 * largest value 127, so d = 1), which round to even. */
static void check_activations(int type, int64_t k)
{
    const int64_t ab = gk_act_bytes(type, k), rows = 3;
    const type_info t = info(type);
    float *x = malloc(sizeof(float) * rows * k), *back = malloc(sizeof(float) * rows * k);
    uint8_t *xq = malloc(rows * ab), *ref = malloc(rows * ab);
    random_inputs(x, 2, k);
    for (int64_t i = 0; i < k; i++)
        x[2 * k + i] = i % t.block == 0 ? 127.0f : (float)(i % 61) - 30.5f;
    gk_quantize_act(type, x, rows, k, xq);
    for (int64_t r = 0; r < rows; r++)
        quantize_row_ref(type, x + r * k, k, ref + r * ab);
    int same = memcmp(xq, ref, rows * ab) == 0, ok = 1;
    gk_dequantize_act(type, xq, rows, k, back);
    for (int64_t r = 0; r < rows; r++) {
        const act_view v = act_at(xq + r * ab, k, t.family);
        const int small = t.family == F_SMALL, span = small ? 32 : 16;
        for (int64_t i = 0; i < k; i++) {
            const float d = small ? v.d[slot_at(i / 32)] : v.d[i / 256];
            ok &= fabsf(back[r * k + i] - x[r * k + i]) <= 0.5001f * d;
            if (r == 2 && i % t.block)
                ok &= fmodf(back[r * k + i], 2.0f) == 0.0f; /* ties to even */
        }
        for (int64_t b = 0; b < k / span; b++) {
            int sum = 0;
            for (int i = 0; i < span; i++)
                sum += v.q[small ? code_at(b, i) : b * span + i];
            ok &= sum == v.s[small ? slot_at(b) : b];
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%-4s k=%-5lld activations: %s bytes=portable%s, codes within d/2, sums exact",
             type_name(type), (long long)k, gk_path(), same ? "" : " -- DIFFER");
    report(ok && same, what);
    free(x);
    free(back);
    free(xq);
    free(ref);
}

int main(void)
{
    printf("path: %s\n", gk_path());
    const int small[] = {T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0};
    const int super[] = {T_Q4_K, T_Q5_K, T_Q6_K};
    const int floats[] = {T_F32, T_F16, T_BF16};
    const int64_t outs[] = {1, 7, 33};
    const int64_t small_k[] = {32, 96, 288, 2080}, super_k[] = {256, 512, 2816};
    const int64_t float_k[] = {1, 7, 32, 100, 2080};
    for (size_t i = 0; i < 5; i++) {
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 3; b++)
                check_product(small[i], outs[b], small_k[a], 0);
        check_product(small[i], 5, 288, 1);
        check_product(small[i], 7, 8192, 0); /* rows long enough to go span by span */
        check_activations(small[i], 2080);
        check_activations(small[i], 96);
    }
    for (size_t i = 0; i < 3; i++) {
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < 3; b++)
                check_product(super[i], outs[b], super_k[a], 0);
        check_product(super[i], 16, 512, 0); /* whole tiles of 8 outputs */
        check_product(super[i], 41, 768, 0); /* tiles and one output past them */
        check_product(super[i], 5, 512, 1);
        check_product(super[i], 16, 512, 1);
        check_product(super[i], 7, 8192, 0);
        check_activations(super[i], 2816);
        check_activations(super[i], 256);
    }
    for (size_t i = 0; i < 3; i++)
        for (size_t a = 0; a < 5; a++)
            for (size_t b = 0; b < 3; b++)
                check_product(floats[i], outs[b], float_k[a], 0);
    const int unsupported[] = {4, 9, 10, 11, 15, 16, 23, 28, 31, 39, -1, 1000};
    int sizes_ok = 1;
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        sizes_ok &= gk_row_bytes(unsupported[i], 256) == -1 && gk_act_bytes(unsupported[i], 256) == -1;
    sizes_ok &= gk_row_bytes(T_Q4_0, 48) == -1 && gk_row_bytes(T_Q4_K, 288) == -1;
    sizes_ok &= gk_row_bytes(T_Q4_0, 64) == 36 && gk_row_bytes(T_Q6_K, 512) == 420;
    sizes_ok &= gk_row_bytes(T_BF16, 3) == 6 && gk_act_bytes(T_F16, 3) == 12;
    report(sizes_ok, "sizes: unsupported types and widths give -1, the rest GGUF's bytes");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
