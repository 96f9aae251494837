/* GGUF's 4-bit and 8-bit weights times float32 activations on the CPU (built by cpu_quant.py).
 *
 * Weights come in groups of 32 values along a row, each group with a float32 scale:
 *   4-bit: 16 bytes, low nibbles values 0..15, high nibbles 16..31 (GGUF's layout), and a
 *          zero: w = (q - 8) * scale + zero, q in 0..15 (Q4_0 and Q4_1 both map onto it);
 *   8-bit: 32 signed bytes: w = q * scale (Q8_0).
 * Each weight is formed as exactly that float32 expression (built with -ffp-contract=off,
 * so no compiler fuses it into one rounding), the very value the dense path multiplies;
 * only the order of the sums differs from a dense product. Each output sums in 32 lanes (one
 * per position in a group) in a fixed order, so a row's result does not depend on the
 * other rows of the call.
 * Portable C that compilers vectorise with -march=native (x86-64, ARM64), with AVX2
 * intrinsics for the one step they vectorised badly: splitting the nibbles.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define GROUP 32
#define MAX_ROWS 32

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));

/* Where the CPU fuses a multiply-add in hardware, each lane accumulates with one rounding. */
#ifdef FP_FAST_FMAF
#define MULADD(a, b, c) fmaf(a, b, c)
#else
#define MULADD(a, b, c) ((a) * (b) + (c))
#endif

/* The 32 float32 weights of one 4-bit group. */
static inline void unpack_q4(const uint8_t *bytes, float scale, float zero, float *w)
{
#ifdef __AVX2__
    /* Compilers do not vectorise the nibble split well; AVX2 does it in a few instructions. */
    const __m128i b = _mm_loadu_si128((const __m128i *)bytes), mask = _mm_set1_epi8(15);
    const __m128i halves[2] = {_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask)};
    const __m256i eight = _mm256_set1_epi32(8);
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero);
    for (int h = 0; h < 2; h++)
        for (int part = 0; part < 2; part++) {
            const __m128i bytes8 = part ? _mm_srli_si128(halves[h], 8) : halves[h];
            const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes8), eight);
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), z);
            _mm256_storeu_ps(w + 16 * h + 8 * part, v);
        }
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
