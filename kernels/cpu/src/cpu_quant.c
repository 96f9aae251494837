/* GGUF's 4-bit and 8-bit weights times float32 activations on the CPU (built by cpu_quant.py).
 *
 * Weights come in groups of 32 values along a row, each group with a float32 scale:
 *   4-bit: 16 bytes, low nibbles values 0..15, high nibbles 16..31 (GGUF's layout), and a
 *          zero: w = (q - 8) * scale + zero, q in 0..15 (Q4_0 and Q4_1 both map onto it);
 *   8-bit: 32 signed bytes: w = q * scale (Q8_0).
 * Each weight is formed as exactly that float32 expression (built with -ffp-contract=off,
 * so no compiler fuses it into one rounding), the very value the dense path multiplies;
 * only the order of the sums differs from a dense product. Each output of a row sums in a
 * fixed order that does not depend on the other rows of the call (batch invariance).
 * With AVX-512 or AVX2 (and FMA) the weights stay in registers and each (row, output) keeps
 * its own accumulators (two of 16 lanes, or one of 8); elsewhere portable C that compilers
 * vectorise with -march=native (ARM64) sums in 32 lanes. The sums, and so the last bits,
 * differ between these paths, never between calls on one machine.
 *
 * Not gguf_kernels.c: this serves a dense model quantized at load (engine/model/quant.py's
 * q4 layers in float32) and promises its dense float32 product of exactly the dequantized
 * weights; gguf_kernels.c reads a GGUF file's own blocks (fp16 scales) against activations
 * quantized to 8 bits, as llama.cpp does, so it cannot give those products bit for bit.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_needs.h"
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define GROUP 32
#define MAX_ROWS 64

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));

/* Where the CPU fuses a multiply-add in hardware, each lane accumulates with one rounding. */
#ifdef FP_FAST_FMAF
#define MULADD(a, b, c) fmaf(a, b, c)
#else
#define MULADD(a, b, c) ((a) * (b) + (c))
#endif

#if defined(__AVX512F__)
/* 16 lanes and 32 registers. */
typedef __m512 vec;
#define LANES 16
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vfmadd _mm512_fmadd_ps
#define vadd _mm512_add_ps
#define vmul _mm512_mul_ps
#define vset1 _mm512_set1_ps
/* A register of floats from the LANES signed bytes at p, or in b. */
#define load_i8(p) _mm_loadu_si128((const __m128i *)(p))
#define vcvt_i8(b) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))
/* A 4-bit group's values 0..15 and 16..31 (low and high nibbles) as LANES bytes each. */
#define SPLIT_NIBBLES(low, high) {low, high}
#define VEC_FORM 1
#elif defined(__AVX2__)
/* 8 lanes and 16 registers. */
typedef __m256 vec;
#define LANES 8
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfmadd _mm256_fmadd_ps
#define vadd _mm256_add_ps
#define vmul _mm256_mul_ps
#define vset1 _mm256_set1_ps
#define load_i8(p) _mm_loadl_epi64((const __m128i *)(p))
#define vcvt_i8(b) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))
#define SPLIT_NIBBLES(low, high) {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)}
#define VEC_FORM 1
#endif

#ifdef VEC_FORM
#define PARTS (GROUP / LANES)

/* The 32 weights of one 4-bit group in PARTS registers: (q - 8) * scale + zero.
 * Compilers do not vectorise the nibble split well; SSE2 does it in a few instructions. */
static inline __attribute__((always_inline)) void form_q4(const uint8_t *bytes, float scale,
                                                          float zero, vec w[PARTS])
{
    const __m128i b = _mm_loadu_si128((const __m128i *)bytes), mask = _mm_set1_epi8(15);
    const __m128i eight = _mm_set1_epi8(8);
    const __m128i low = _mm_sub_epi8(_mm_and_si128(b, mask), eight);
    const __m128i high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), mask), eight);
    const __m128i parts[PARTS] = SPLIT_NIBBLES(low, high);
    const vec s = vset1(scale), z = vset1(zero);
    for (int p = 0; p < PARTS; p++)
        w[p] = vadd(vmul(vcvt_i8(parts[p]), s), z);
}

/* The 32 weights of one 8-bit group in PARTS registers: q * scale. */
static inline __attribute__((always_inline)) void form_q8(const int8_t *bytes, float scale,
                                                          vec w[PARTS])
{
    const vec s = vset1(scale);
    for (int p = 0; p < PARTS; p++)
        w[p] = vmul(vcvt_i8(load_i8(bytes + LANES * p)), s);
}
#endif

/* The 32 float32 weights of one 4-bit group. */
static inline void unpack_q4(const uint8_t *bytes, float scale, float zero, float *w)
{
#ifdef VEC_FORM
    vec v[PARTS];
    form_q4(bytes, scale, zero, v);
    for (int p = 0; p < PARTS; p++)
        vstore(w + LANES * p, v[p]);
#else
    u8x16 b;
    memcpy(&b, bytes, sizeof b);
    const i8x16 low = (i8x16)(b & 15) - 8, high = (i8x16)(b >> 4) - 8;
    int8_t q[GROUP];
    memcpy(q, &low, sizeof low);
    memcpy(q + 16, &high, sizeof high);
    for (int j = 0; j < GROUP; j++)
        w[j] = (float)q[j] * scale + zero;
#endif
}

/* The 32 float32 weights of one 8-bit group. */
static inline void unpack_q8(const int8_t *bytes, float scale, float *w)
{
    for (int j = 0; j < GROUP; j++)
        w[j] = (float)bytes[j] * scale;
}

/* Zero the accumulators of the call's rows. */
static inline void clear(float acc[][GROUP], int64_t rows)
{
    for (int64_t m = 0; m < rows; m++)
        for (int l = 0; l < GROUP; l++)
            acc[m][l] = 0.0f;
}

/* acc[m] += w * x[m, group g] lane by lane, for the call's rows. */
static inline void accumulate(const float *w, const float *x, int64_t rows, int64_t k, int64_t g,
                              float acc[][GROUP])
{
    for (int64_t m = 0; m < rows; m++) {
        const float *xg = x + m * k + g * GROUP;
        for (int l = 0; l < GROUP; l++)
            acc[m][l] = MULADD(w[l], xg[l], acc[m][l]);
    }
}

/* A fixed pairwise sum of each row's lanes into y[m, o]: the same bits on every call. */
static inline void finish(float acc[][GROUP], int64_t rows, int64_t n, int64_t o, float *y)
{
    for (int64_t m = 0; m < rows; m++) {
        for (int width = GROUP / 2; width > 0; width /= 2)
            for (int l = 0; l < width; l++)
                acc[m][l] += acc[m][l + width];
        y[m * n + o] = acc[m][0];
    }
}

#if defined(VEC_FORM) && defined(__FMA__)
/* vfmadd adds w * x to acc lane by lane with one rounding, as the portable path's MULADD. */
#define SINGLE 4 /* outputs one row takes at a time: four outputs' multiply-adds at once */
#define BLOCK 8  /* outputs formed into the buffer at once above CODES_ROWS rows */
#ifdef __AVX512F__
/* Accumulators per (row, output): with 32 registers a group's two halves keep one each, so
 * a row runs twice the chains of multiply-adds (a 6 x 2 tile then holds 24 of them). */
#define ACCS 2
#define TILE 6 /* rows of a tile: 6 rows x 2 outputs x 2 accumulators stay in registers */
/* Rows up to which each tile forms its weights from the codes again rather than reading them
 * formed into a buffer: forming 16 weights an instruction is cheap (measured, 8 and 12 rows). */
#define CODES_ROWS (2 * TILE)
#else
#define TILE 4 /* rows of a tile: 4 rows x 2 outputs of accumulators stay in registers */
#define CODES_ROWS TILE
#define ACCS 1 /* 16 registers: a 4 x 2 tile fits with one accumulator each, not two */
#endif

/* The 32 weights of one group in registers, formed as unpack_q4 and unpack_q8 form them. */
static inline __attribute__((always_inline)) void form(const void *codes, int64_t at,
                                                       const float *scale, const float *zero,
                                                       vec w[PARTS])
{
    if (zero)
        form_q4((const uint8_t *)codes + at * (GROUP / 2), scale[at], zero[at], w);
    else
        form_q8((const int8_t *)codes + at * GROUP, scale[at], w);
}

/* One output's accumulators summed in a fixed order (the accumulators in order, then a
 * pairwise sum of the lanes): the same bits on every call. */
static inline float sum_lanes(const vec acc[ACCS])
{
    vec a = acc[0];
    for (int c = 1; c < ACCS; c++)
        a = vadd(a, acc[c]);
    float lane[LANES];
    vstore(lane, a);
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++)
            lane[l] += lane[l + width];
    return lane[0];
}

/* Every path below sums output o of a row the same way: part p of each group (in order)
 * goes into accumulator p % ACCS, then sum_lanes. So a row's result does not depend on the
 * rows beside it nor on the path its call takes (batch invariance). */

/* Outputs o..o+O-1 of one row (O <= SINGLE, a constant where it is inlined), formed from the
 * codes: one row has too little work per weight to hide a multiply-add's latency with fewer
 * chains. */
static inline __attribute__((always_inline)) void single(int O, const float *x, int64_t k,
                                                         const void *codes, const float *scale,
                                                         const float *zero, int64_t o, float *y)
{
    vec acc[SINGLE][ACCS];
    for (int j = 0; j < O; j++)
        for (int c = 0; c < ACCS; c++)
            acc[j][c] = vzero();
    const int64_t groups = k / GROUP;
    /* Ask for the codes of the outputs 2 * SINGLE ahead early, a cache line at a time: one
     * row's work per byte is too little for the hardware prefetcher to keep ahead of it. */
    const int64_t bytes = zero ? GROUP / 2 : GROUP;
    const uint8_t *next = (const uint8_t *)codes + (o + 2 * SINGLE) * groups * bytes;
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t at = g * SINGLE * bytes; at < (g + 1) * SINGLE * bytes; at += 64)
            __builtin_prefetch(next + at);
        vec xp[PARTS];
        for (int p = 0; p < PARTS; p++)
            xp[p] = vload(x + g * GROUP + LANES * p);
        for (int j = 0; j < O; j++) {
            vec w[PARTS];
            form(codes, (o + j) * groups + g, scale, zero, w);
            for (int p = 0; p < PARTS; p++)
                acc[j][p % ACCS] = vfmadd(w[p], xp[p], acc[j][p % ACCS]);
        }
    }
    for (int j = 0; j < O; j++)
        y[o + j] = sum_lanes(acc[j]);
}

/* Outputs o..o+O-1 (O <= 2) of R rows (R <= TILE), constants where it is inlined, into
 * y[r * n + o]. The weights come from `formed` (rows of k weights, one per output, formed
 * once for several tiles) or, when it is NULL, straight from the codes. */
static inline __attribute__((always_inline)) void tile(int R, int O, const float *x, int64_t k,
                                                       const void *codes, const float *scale,
                                                       const float *zero, const float *formed,
                                                       int64_t n, int64_t o, float *y)
{
    vec acc[TILE][2][ACCS];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < O; j++)
            for (int c = 0; c < ACCS; c++)
                acc[r][j][c] = vzero();
    const int64_t groups = k / GROUP;
    if (formed) {
        /* The outputs share each load of a row's inputs. */
        for (int64_t g = 0; g < groups; g++)
            for (int p = 0; p < PARTS; p++) {
                const int64_t i = g * GROUP + LANES * p;
                vec w[2];
                for (int j = 0; j < O; j++)
                    w[j] = vload(formed + j * k + i);
                for (int r = 0; r < R; r++) {
                    const vec xp = vload(x + r * k + i);
                    for (int j = 0; j < O; j++)
                        acc[r][j][p % ACCS] = vfmadd(w[j], xp, acc[r][j][p % ACCS]);
                }
            }
    } else {
        for (int64_t g = 0; g < groups; g++)
            for (int j = 0; j < O; j++) {
                vec w[PARTS];
                form(codes, (o + j) * groups + g, scale, zero, w);
                for (int r = 0; r < R; r++)
                    for (int p = 0; p < PARTS; p++)
                        acc[r][j][p % ACCS] = vfmadd(
                            w[p], vload(x + r * k + g * GROUP + LANES * p), acc[r][j][p % ACCS]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < O; j++)
            y[r * n + o + j] = sum_lanes(acc[r][j]);
}

/* tile() with R and O known only at run time, as a call with the constants. */
static inline void tile_of(int64_t R, int64_t O, const float *x, int64_t k, const void *codes,
                           const float *scale, const float *zero, const float *formed, int64_t n,
                           int64_t o, float *y)
{
#define TILE_CASE(r)                                                                            \
    case r:                                                                                    \
        if (O == 2)                                                                            \
            tile(r, 2, x, k, codes, scale, zero, formed, n, o, y);                             \
        else                                                                                   \
            tile(r, 1, x, k, codes, scale, zero, formed, n, o, y);                             \
        break;
    switch (R) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
#if TILE > 4
        TILE_CASE(4)
        TILE_CASE(5)
    default:
        TILE_CASE(6)
#else
    default:
        TILE_CASE(4)
#endif
    }
#undef TILE_CASE
}

/* y[m, o] = sum_i x[m, i] * w[o, i] for rows <= MAX_ROWS, w 4-bit (zero given) or 8-bit.
 * One row takes SINGLE outputs at a time; up to CODES_ROWS rows, tiles of one output take the
 * weights from the codes straight into registers; with more, BLOCK outputs' weights are
 * formed once into a per-thread buffer and tiles of two outputs read them from cache, so
 * the outputs share each load of the rows' inputs (what many rows spend their time on). */
static inline void linear(const float *x, int64_t rows, int64_t k, const void *codes,
                          const float *scale, const float *zero, int64_t n, float *y)
{
    const int64_t groups = k / GROUP;
    if (rows == 1) {
        const int64_t whole = n - n % SINGLE;
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < whole; o += SINGLE)
            single(SINGLE, x, k, codes, scale, zero, o, y);
        for (int64_t o = whole; o < n; o++)
            single(1, x, k, codes, scale, zero, o, y);
        return;
    }
    if (rows <= CODES_ROWS) {
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < n; o++)
            for (int64_t m = 0; m < rows; m += TILE)
                tile_of(rows - m < TILE ? rows - m : TILE, 1, x + m * k, k, codes, scale, zero,
                        NULL, n, o, y + m * n);
        return;
    }
#pragma omp parallel
    {
        float *formed = malloc(sizeof(float) * BLOCK * k);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < n; b += BLOCK) {
            const int64_t width = n - b < BLOCK ? n - b : BLOCK;
            /* Without the buffer (no memory for it) each tile forms its own weights. */
            for (int64_t j = 0; formed && j < width; j++)
                for (int64_t g = 0; g < groups; g++) {
                    vec w[PARTS];
                    form(codes, (b + j) * groups + g, scale, zero, w);
                    for (int p = 0; p < PARTS; p++)
                        vstore(formed + j * k + g * GROUP + LANES * p, w[p]);
                }
            for (int64_t m = 0; m < rows; m += TILE)
                for (int64_t j = 0; j < width; j += 2)
                    tile_of(rows - m < TILE ? rows - m : TILE, width - j < 2 ? 1 : 2, x + m * k,
                            k, codes, scale, zero, formed ? formed + j * k : NULL, n, b + j,
                            y + m * n);
        }
        free(formed);
    }
}
#else
/* y[m, o] = sum_i x[m, i] * w[o, i] for rows <= MAX_ROWS, w 4-bit (zero given) or 8-bit.
 * Each group's weights are formed once and applied to every row. The branch on zero takes
 * the same way for a whole call. */
static inline void linear(const float *x, int64_t rows, int64_t k, const void *codes,
                          const float *scale, const float *zero, int64_t n, float *y)
{
    const int64_t groups = k / GROUP;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < n; o++) {
        float acc[MAX_ROWS][GROUP];
        float w[GROUP];
        clear(acc, rows);
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = o * groups + g;
            if (zero)
                unpack_q4((const uint8_t *)codes + at * (GROUP / 2), scale[at], zero[at], w);
            else
                unpack_q8((const int8_t *)codes + at * GROUP, scale[at], w);
            accumulate(w, x, rows, k, g, acc);
        }
        finish(acc, rows, n, o, y);
    }
}
#endif

/* The 4-bit product: w [n, k] from packed codes, scales and zeros. */
void q4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *codes,
               const float *scale, const float *zero, int64_t n, float *y)
{
    linear(x, rows, k, codes, scale, zero, n, y);
}

/* The 8-bit product: w [n, k] from int8 codes and scales. */
void q8_linear(const float *x, int64_t rows, int64_t k, const int8_t *codes, const float *scale,
               int64_t n, float *y)
{
    linear(x, rows, k, codes, scale, NULL, n, y);
}

/* The dense float32 weight [n, k] of 4-bit codes, for calls with many rows. */
void q4_dequantize(const uint8_t *codes, const float *scale, const float *zero, int64_t n,
                   int64_t k, float *out)
{
    const int64_t groups = k / GROUP;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < n; o++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = o * groups + g;
            unpack_q4(codes + at * (GROUP / 2), scale[at], zero[at], out + at * GROUP);
        }
}

/* The dense float32 weight [n, k] of 8-bit codes (also the rows an embedding looks up). */
void q8_dequantize(const int8_t *codes, const float *scale, int64_t n, int64_t k, float *out)
{
    const int64_t groups = k / GROUP;
#pragma omp parallel for schedule(static) if (n > 64)
    for (int64_t o = 0; o < n; o++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = o * groups + g;
            unpack_q8(codes + at * GROUP, scale[at], out + at * GROUP);
        }
}

/* The row limit of one q4_linear or q8_linear call (cpu_quant.py checks it). */
int quant_max_rows(void) { return MAX_ROWS; }

/* The vector path this build takes: the products' last bits differ between paths. */
const char *quant_path(void)
{
#if defined(VEC_FORM) && defined(__FMA__) && defined(__AVX512F__)
    return "AVX-512";
#elif defined(VEC_FORM) && defined(__FMA__)
    return "AVX2";
#else
    return "portable C";
#endif
}
