/* GGUF weight matrices times float32 activations, the weights read in their own block
 * formats: the entry points, the dispatch to this build's path and the parallel loops.
 * Built by gguf_matmul.py (native_build.py: -O3 -march=native -ffp-contract=off -fopenmp)
 * and included by cpu_forward.c, whose one library exports these functions too.
 *
 * One translation unit of these parts, each included once, in this order:
 *   gguf_kernels.h         the block and activation formats, the float combination every
 *                          path follows, the path this build takes and the kernels it
 *                          supplies, the exports' declarations;
 *   cpu_needs.h            paged_llm_cpu_needs(): the CPU features this build needs (the
 *                          prebuilt wheel's loader checks it);
 *   gguf_portable.c        portable C: sizes, activation quantization, dequantization and
 *                          the reference products (the path where no SIMD one exists);
 *   arch/x86/gguf_avx2.c   AVX2 (VNNI where there): one weight row by a few activation
 *                          rows, float weights, activation quantization;
 *   arch/x86/gguf_tiles.c  tiles of 16 weight rows by many activation rows (AVX2, VNNI,
 *                          AVX-512);
 *   arch/arm/gguf_neon.c   NEON (sdot where the dotprod extension is there);
 *   this file              the dispatch by type, the parallel loops, the exports.
 * An arch file compiles to nothing off its own architecture.
 *
 * Paths, chosen when the library is built (-march=native): AVX2 with F16C (vectors of 256
 * bits, also on AVX-512 CPUs; the products of many rows of the K types by tiles of 16 weight
 * rows, see super_tile_avx2; the 32-value types' integer dots by dpbusd where AVX-512 VNNI
 * or AVX-VNNI is there, and there their tiles too, see small_tile_avx2; with AVX-512 VNNI
 * both tiles take their rows in 512-bit registers, see tile_rows_zmm), NEON on
 * aarch64 (sdot where the dotprod extension is there), and portable C everywhere else.
 * The same source builds on every path; gguf_kernels_test.c checks each against the
 * portable reference.
 */
#include "gguf_kernels.h"
#include "cpu_needs.h"

#include "gguf_portable.c"

#include "arch/x86/gguf_avx2.c"
#include "arch/x86/gguf_tiles.c"

#include "arch/arm/gguf_neon.c"

/* ---- dispatch and the parallel loops ----------------------------------------------------- */

/* One output (weight row w) of R <= RT activation rows, on this build's path. */
static void out_rows(int type, const uint8_t *w, int64_t k, const uint8_t *x, int64_t xstride,
                     int64_t R, float *y, int64_t ystride)
{
#if defined(SIMD_PATH)
    switch (type) {
#define CASE(t, fn)                                                                             \
    case t:                                                                                    \
        fn(t, w, k, x, xstride, R, y, ystride);                                                \
        return;
        CASE(T_Q4_0, SMALL_ROWS)
        CASE(T_Q4_1, SMALL_ROWS)
        CASE(T_Q5_0, SMALL_ROWS)
        CASE(T_Q5_1, SMALL_ROWS)
        CASE(T_Q8_0, SMALL_ROWS)
        CASE(T_Q4_K, SUPER_ROWS)
        CASE(T_Q5_K, SUPER_ROWS)
        CASE(T_Q6_K, SUPER_ROWS)
        CASE(T_F32, FLOAT_ROWS)
        CASE(T_F16, FLOAT_ROWS)
        CASE(T_BF16, FLOAT_ROWS)
#undef CASE
    default:
        break;
    }
#endif
    ref_rows(type, w, k, x, xstride, R, y, ystride);
}

/* Outputs a chunk takes: about 64 KiB of weights, so a prefill's tiles of rows find them
 * in cache, and at least 4 outputs. */
static int64_t chunk_outputs(int64_t row_bytes, int64_t n)
{
    int64_t c = row_bytes > 0 ? (64 << 10) / row_bytes : n;
    c = c < 4 ? 4 : c;
    return c < n ? c : n;
}

/* Threads share a product's chunks guided (schedule(guided) below): each takes what is
 * left over the thread count (with 2, a half, then a quarter, ...), so a thread that
 * starts late or runs slower (woken late from the last barrier, a core shared with another
 * process, a hybrid CPU's small core) takes fewer, where static halves keep the other
 * waiting. Any thread gives an output the same bits. Guided steps were faster than static
 * and dynamic ones, at one sequence and at many. */
#if defined(QUANT_TILE)
/* matmul_for by tiles of TILE_OUT outputs (QUANT_TILE): chunks of whole tiles, each pass
 * over a chunk takes up to TILE_ROWS rows; the outputs past the last whole tile go by
 * out_rows. */
static void tiles_for(int type, const uint8_t *w, int64_t n, int64_t k, const uint8_t *xq,
                      int64_t rows, float *y)
{
    const int64_t rb = gk_row_bytes(type, k), ab = gk_act_bytes(type, k);
    const int64_t tiled = n / TILE_OUT * TILE_OUT;
    const int64_t oc = (chunk_outputs(rb, n) + TILE_OUT - 1) / TILE_OUT * TILE_OUT;
    const int64_t chunks = (tiled + oc - 1) / oc + (tiled < n);
#pragma omp for schedule(guided)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t o0 = c * oc;
        if (o0 >= tiled) { /* the last outputs, one at a time */
            for (int64_t r0 = 0; r0 < rows; r0 += RT) {
                const int64_t R = rows - r0 < RT ? rows - r0 : RT;
                for (int64_t o = tiled; o < n; o++)
                    out_rows(type, w + o * rb, k, xq + r0 * ab, ab, R, y + r0 * n + o, n);
            }
            continue;
        }
        const int64_t o1 = o0 + oc < tiled ? o0 + oc : tiled;
        for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
            const int64_t R = rows - r0 < TILE_ROWS ? rows - r0 : TILE_ROWS;
            for (int64_t o = o0; o < o1; o += TILE_OUT)
                QUANT_TILE(type, w + o * rb, rb, k, xq + r0 * ab, ab, R, y + r0 * n + o, n);
        }
    }
}
#endif

/* The product's work-shared loop (an orphaned `omp for`: inside a parallel region the
 * threads split the chunks of outputs, outside it one thread does them all). Within a chunk
 * each tile of up to RT rows passes over the chunk's outputs, every block decoded once per
 * tile. */
static void matmul_for(int type, const uint8_t *w, int64_t n, int64_t k, const uint8_t *xq,
                       int64_t rows, float *y)
{
    const int64_t rb = gk_row_bytes(type, k), ab = gk_act_bytes(type, k);
#if defined(QUANT_TILE)
    if (info(type).family != F_FLOAT && rows >= tile_min_rows(type)) {
        tiles_for(type, w, n, k, xq, rows, y);
        return;
    }
#endif
    const int64_t oc = chunk_outputs(rb, n), chunks = (n + oc - 1) / oc;
#pragma omp for schedule(guided)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t o0 = c * oc, o1 = o0 + oc < n ? o0 + oc : n;
        for (int64_t r0 = 0; r0 < rows; r0 += RT) {
            const int64_t R = rows - r0 < RT ? rows - r0 : RT;
            for (int64_t o = o0; o < o1; o++)
                out_rows(type, w + o * rb, k, xq + r0 * ab, ab, R, y + r0 * n + o, n);
        }
    }
}

/* One activation row on this build's path (the same bytes on every path). */
static void quantize_row(int type, const float *x, int64_t k, uint8_t *out)
{
#if defined(QUANTIZE_ROW)
    if (info(type).family != F_FLOAT) {
        QUANTIZE_ROW(type, x, k, out);
        return;
    }
#endif
    quantize_row_ref(type, x, k, out);
}

static void quantize_for(int type, const float *x, int64_t rows, int64_t k, uint8_t *out)
{
    const int64_t ab = gk_act_bytes(type, k);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        quantize_row(type, x + r * k, k, out + r * ab);
}

/* Whether a call has work enough to wake the other threads. */
static int parallel_worth(int64_t n, int64_t k, int64_t rows) { return n * k * rows >= (1 << 16); }

static int valid(int type, int64_t n, int64_t k, int64_t rows)
{
    return gk_row_bytes(type, k) >= 0 && n >= 0 && rows >= 0 && k > 0;
}

/* ---- exports ----------------------------------------------------------------------------- */

/* The path this build takes (the products' bits are the same on every path). */
const char *gk_path(void)
{
#if defined(GK_AVX2) && defined(GK_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "AVX-512 VNNI";
#elif defined(GK_AVX2) && defined(GK_VNNI)
    return "AVX-VNNI";
#elif defined(GK_AVX2)
    return "AVX2";
#elif defined(GK_NEON) && defined(__ARM_FEATURE_DOTPROD)
    return "NEON dotprod";
#elif defined(GK_NEON)
    return "NEON";
#else
    return "portable C";
#endif
}

/* Quantize rows of k float32 values into activation rows of gk_act_bytes each. */
void gk_quantize_act(int type, const float *x, int64_t rows, int64_t k, void *out)
{
    if (!valid(type, 1, k, rows))
        return;
#pragma omp parallel if (rows > 1 && parallel_worth(1, k, rows))
    quantize_for(type, x, rows, k, out);
}

/* The float32 values activation rows stand for: code * scale (the float rows themselves for
 * float types). */
void gk_dequantize_act(int type, const void *xq, int64_t rows, int64_t k, float *out)
{
    if (!valid(type, 1, k, rows))
        return;
    const type_info t = info(type);
    const int64_t ab = gk_act_bytes(type, k);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)xq + r * ab;
        if (t.family == F_FLOAT) {
            memcpy(out + r * k, row, sizeof(float) * k);
            continue;
        }
        const act_view x = act_at(row, k, t.family);
        for (int64_t i = 0; i < k; i++) {
            if (t.family == F_SMALL)
                out[r * k + i] = (float)x.q[code_at(i / 32, i % 32)] * x.d[slot_at(i / 32)];
            else
                out[r * k + i] = (float)x.q[i] * x.d[i / 256];
        }
    }
}

/* y[rows, n] = x @ W.T from activation rows xq (gk_quantize_act) and n weight rows w. */
void gk_matmul(int type, const void *w, int64_t n, int64_t k, const void *xq, int64_t rows,
               float *y)
{
    if (!valid(type, n, k, rows))
        return;
#pragma omp parallel if (parallel_worth(n, k, rows))
    matmul_for(type, w, n, k, xq, rows, y);
}

/* gk_quantize_act into scratch (rows * gk_act_bytes bytes), then gk_matmul: one parallel
 * region, one call per layer. Float types read x itself. */
void gk_linear(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t rows,
               float *y, void *scratch)
{
    if (!valid(type, n, k, rows))
        return;
    if (info(type).family == F_FLOAT) {
#pragma omp parallel if (parallel_worth(n, k, rows))
        matmul_for(type, w, n, k, (const uint8_t *)x, rows, y);
        return;
    }
#pragma omp parallel if (parallel_worth(n, k, rows))
    {
        quantize_for(type, x, rows, k, scratch);
        matmul_for(type, w, n, k, scratch, rows, y);
    }
}

/* The float32 values of rows weight rows (GGUF's dequantization, bit for bit). */
void gk_dequantize(int type, const void *w, int64_t rows, int64_t k, float *out)
{
    if (!valid(type, 1, k, rows))
        return;
    const int64_t rb = gk_row_bytes(type, k);
#pragma omp parallel for schedule(static) if (parallel_worth(1, k, rows))
    for (int64_t r = 0; r < rows; r++)
        dequantize_row(type, (const uint8_t *)w + r * rb, k, out + r * k);
}

/* An embedding lookup: out[i] = the dequantized weight row ids[i]. */
void gk_get_rows(int type, const void *w, int64_t k, const int64_t *ids, int64_t n, float *out)
{
    if (!valid(type, 1, k, n))
        return;
    const int64_t rb = gk_row_bytes(type, k);
#pragma omp parallel for schedule(static) if (parallel_worth(1, k, n))
    for (int64_t i = 0; i < n; i++)
        dequantize_row(type, (const uint8_t *)w + ids[i] * rb, k, out + i * k);
}
