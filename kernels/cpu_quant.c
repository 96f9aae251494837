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
 * With AVX2 and FMA the weights stay in registers and each row keeps two 8-lane
 * accumulators; elsewhere portable C that compilers vectorise with -march=native (ARM64)
 * sums in 32 lanes.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
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

#ifdef __AVX2__
/* The 32 weights of one 4-bit group in four registers of eight: (q - 8) * scale + zero.
 * Compilers do not vectorise the nibble split well; AVX2 does it in a few instructions. */
static inline __attribute__((always_inline)) void form_q4(const uint8_t *bytes, float scale,
                                                          float zero, __m256 w[4])
{
    const __m128i b = _mm_loadu_si128((const __m128i *)bytes), mask = _mm_set1_epi8(15);
    const __m128i low = _mm_and_si128(b, mask), high = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m128i parts[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};
    const __m256i eight = _mm256_set1_epi32(8);
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero);
    for (int p = 0; p < 4; p++) {
        const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[p]), eight);
        w[p] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), z);
    }
}
#endif

/* The 32 float32 weights of one 4-bit group. */
static inline void unpack_q4(const uint8_t *bytes, float scale, float zero, float *w)
{
#ifdef __AVX2__
    __m256 v[4];
    form_q4(bytes, scale, zero, v);
    for (int p = 0; p < 4; p++)
        _mm256_storeu_ps(w + 8 * p, v[p]);
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

#if defined(__AVX2__) && defined(__FMA__)
/* Eight lanes of w * x added to acc with one rounding, as the portable path's MULADD. */
#define LANES 8
#define TILE 4 /* rows whose accumulators stay in registers (2 per row, 4 weight registers) */

/* The 32 weights of one group in four registers, formed as unpack_q4 and unpack_q8 form them. */
static inline __attribute__((always_inline)) void form(const void *codes, int64_t at,
                                                       const float *scale, const float *zero,
                                                       __m256 w[4])
{
    if (zero) {
        form_q4((const uint8_t *)codes + at * (GROUP / 2), scale[at], zero[at], w);
    } else {
        const int8_t *bytes = (const int8_t *)codes + at * GROUP;
        const __m256 s = _mm256_set1_ps(scale[at]);
        for (int p = 0; p < 4; p++) {
            const __m128i b8 = _mm_loadl_epi64((const __m128i *)(bytes + 8 * p));
            w[p] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8)), s);
        }
    }
}

/* A fixed pairwise sum of one row's sixteen lanes: the same bits on every call. */
static inline float sum_lanes(__m256 a, __m256 b)
{
    float lane[LANES];
    _mm256_storeu_ps(lane, _mm256_add_ps(a, b));
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++)
            lane[l] += lane[l + width];
    return lane[0];
}

/* Output o of R rows (R <= TILE, a constant where it is inlined) into y[m * n + o].
 * Each row has two accumulators, the group's first and third eight weights going to one and
 * the second and fourth to the other, in group order: the same sums whatever R is, so a
 * row's result does not depend on the rows beside it. The weights come from `formed` (one
 * output's row, formed once for several tiles) or, when it is NULL, from the codes. */
static inline __attribute__((always_inline)) void tile(int R, const float *x, int64_t k,
                                                       const void *codes, const float *scale,
                                                       const float *zero, const float *formed,
                                                       int64_t n, int64_t o, float *y)
{
    __m256 acc[TILE][2];
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const int64_t groups = k / GROUP;
    for (int64_t g = 0; g < groups; g++) {
        __m256 w[4];
        if (formed)
            for (int p = 0; p < 4; p++)
                w[p] = _mm256_loadu_ps(formed + g * GROUP + LANES * p);
        else
            form(codes, o * groups + g, scale, zero, w);
        for (int r = 0; r < R; r++) {
            const float *xg = x + r * k + g * GROUP;
            for (int p = 0; p < 4; p++)
                acc[r][p & 1] = _mm256_fmadd_ps(w[p], _mm256_loadu_ps(xg + LANES * p), acc[r][p & 1]);
        }
    }
    for (int r = 0; r < R; r++)
        y[r * n + o] = sum_lanes(acc[r][0], acc[r][1]);
}

/* Outputs o and o + 1 of one row: tile(1, ...) twice, interleaved so that four chains of
 * multiply-adds run at once instead of two (one row alone waits on their latency). */
static inline void pair(const float *x, int64_t k, const void *codes, const float *scale,
                        const float *zero, int64_t o, float *y)
{
    __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()},
                        {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    const int64_t groups = k / GROUP;
    /* Ask for the next pairs' codes early: one row's work per byte is too little for the
     * hardware prefetcher to keep ahead of it (measured: 6 against 9 G weights/s). */
    const int64_t ahead = 4 * groups;
    for (int64_t g = 0; g < groups; g++) {
        if (zero) {
            if (g % 2 == 0)
                __builtin_prefetch((const uint8_t *)codes + (o * groups + ahead + g * 2) * 16);
        } else
            __builtin_prefetch((const int8_t *)codes + (o * groups + ahead + g * 2) * GROUP);
        __m256 w[2][4];
        form(codes, o * groups + g, scale, zero, w[0]);
        form(codes, (o + 1) * groups + g, scale, zero, w[1]);
        for (int p = 0; p < 4; p++) {
            const __m256 xp = _mm256_loadu_ps(x + g * GROUP + LANES * p);
            for (int j = 0; j < 2; j++)
                acc[j][p & 1] = _mm256_fmadd_ps(w[j][p], xp, acc[j][p & 1]);
        }
    }
    for (int j = 0; j < 2; j++)
        y[o + j] = sum_lanes(acc[j][0], acc[j][1]);
}

/* R rows of output o, R a run-time value up to TILE, as a call with the constant. */
static inline void tile_of(int64_t R, const float *x, int64_t k, const void *codes,
                           const float *scale, const float *zero, const float *formed, int64_t n,
                           int64_t o, float *y)
{
    switch (R) {
    case 1: tile(1, x, k, codes, scale, zero, formed, n, o, y); break;
    case 2: tile(2, x, k, codes, scale, zero, formed, n, o, y); break;
    case 3: tile(3, x, k, codes, scale, zero, formed, n, o, y); break;
    default: tile(4, x, k, codes, scale, zero, formed, n, o, y); break;
    }
}

/* y[m, o] = sum_i x[m, i] * w[o, i] for rows <= MAX_ROWS, w 4-bit (zero given) or 8-bit.
 * One row takes its outputs in pairs; up to TILE rows the weights go from the codes straight
 * into registers; with more, each output's row of weights is formed once into a buffer that
 * stays in cache for every tile. */
static inline void linear(const float *x, int64_t rows, int64_t k, const void *codes,
                          const float *scale, const float *zero, int64_t n, float *y)
{
    const int64_t groups = k / GROUP;
    if (rows == 1) {
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < n - 1; o += 2)
            pair(x, k, codes, scale, zero, o, y);
        if (n % 2)
            tile(1, x, k, codes, scale, zero, NULL, n, n - 1, y);
        return;
    }
#pragma omp parallel
    {
        float *formed = rows > TILE ? malloc(sizeof(float) * k) : NULL;
#pragma omp for schedule(static)
        for (int64_t o = 0; o < n; o++) {
            /* Without the buffer (few rows, or no memory for it) each tile forms its own. */
            for (int64_t g = 0; formed && g < groups; g++) {
                __m256 w[4];
                form(codes, o * groups + g, scale, zero, w);
                for (int p = 0; p < 4; p++)
                    _mm256_storeu_ps(formed + g * GROUP + LANES * p, w[p]);
            }
            for (int64_t m = 0; m < rows; m += TILE)
                tile_of(rows - m < TILE ? rows - m : TILE, x + m * k, k, codes, scale, zero,
                        formed, n, o, y + m * n);
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
