/* What every part of the GGUF kernels shares (gguf_kernels.c lists the parts): the weights'
 * and activations' formats, the float combination every path follows, the path this build
 * takes, which kernels that path supplies, and the exported functions' declarations.
 *
 * Weights: GGML's blocks, as a GGUF file stores them (one weight row = k / block blocks):
 *   32 values a block:  Q4_0 (fp16 d, 16 bytes of nibbles: w = d * (q - 8)),
 *                       Q4_1 (fp16 d, m, nibbles: w = d * q + m),
 *                       Q5_0 (fp16 d, 32 high bits, nibbles: w = d * (q - 16)),
 *                       Q5_1 (fp16 d, m, high bits, nibbles: w = d * q + m),
 *                       Q8_0 (fp16 d, 32 signed bytes: w = d * q);
 *   256 values a block: Q4_K, Q5_K (fp16 d, dmin, 8 six-bit scales and mins, 4/5-bit codes:
 *                       w = d * sc_j * q - dmin * m_j for the 32 values of sub-block j),
 *                       Q6_K (6-bit codes, 16 signed 8-bit scales, fp16 d:
 *                       w = d * sc_j * (q - 32) for the 16 values of group j);
 *   F32, F16, BF16: one value each.
 * Low nibbles hold a block's first values, high nibbles the next (GGML's order).
 *
 * Activations are quantized per block to 8 bits, as llama.cpp does, in this kernel's own
 * format (one "activation row" of gk_act_bytes bytes per input row):
 *   32-value types: per group of 8 blocks, 256 int8 codes (two blocks' halves interleaved,
 *                   see code_at), 8 float scales and 8 int16 sums of codes (slot order);
 *   K types:        k int8 codes, one float scale per 256 values, one int16 sum per 16;
 *   float types:    the float32 row itself.
 * A code is rint(x / d) (to nearest, ties to even) with d = max|x| / 127 over its block.
 *
 * Each block's dot product is an exact integer (codes times codes, with the scales of the
 * K types and the offsets 8, 16, 32 folded in as integers); the SIMD paths (AVX2's
 * maddubs + madd, VNNI's dpbusd, NEON's sdot or widening multiplies) compute the very
 * integers the portable reference does. The float combination is written once, in a fixed
 * order that the SIMD paths follow lane for lane:
 *   32-value types: term_b = (dw_b * dx_b) * s_b [+ (mw_b * dx_b) * sum_b], term b added to
 *                   lane b % 8 (mul then add, two roundings), then a fixed pairwise sum of
 *                   the 8 lanes;
 *   K types:        one float per 256-value block, added in order to one sum;
 *   float types:    w_i * x_i added to lane i % 32, then a pairwise sum of the 32 lanes.
 * So every path gives the same bits as the reference, and a (row, output) value does not
 * depend on the other rows of a call, the thread count or the tile it falls in (batch
 * invariance). Dequantization (gk_dequantize, gk_get_rows) is GGUF's own float expression,
 * value for value.
 */
#ifndef GGUF_KERNELS_H
#define GGUF_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define GK_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define GK_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#if defined(__AVX512BW__)
#define GK_ZMM 1 /* the tiles' rows in 512-bit registers (tile_rows_zmm, small_tile_rows_zmm) */
#endif
#elif defined(__AVXVNNI__)
#define GK_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define GK_NEON 1
#endif

#define INLINE static inline __attribute__((always_inline))

/* How far ahead of the weights in use the SIMD kernels ask for them (bytes). A decode step
 * reads each weight once, a row after the other, and the hardware prefetcher alone left the
 * kernels waiting on memory; 2048 bytes ahead was the fastest distance tried (1024 slower,
 * 4096 no better), for one row and for several (docs/performance.md has the figures). */
#define PREFETCH_AHEAD 2048

/* Ask for the cache lines PREFETCH_AHEAD bytes past [p, p + bytes). A prefetch never faults,
 * so reading past the end of the weights is harmless. */
INLINE void prefetch_ahead(const uint8_t *p, int64_t bytes)
{
    for (int64_t line = 0; line < bytes; line += 64)
        __builtin_prefetch(p + PREFETCH_AHEAD + line, 0, 3);
}

/* GGML's type ids. */
enum {
    T_F32 = 0,
    T_F16 = 1,
    T_Q4_0 = 2,
    T_Q4_1 = 3,
    T_Q5_0 = 6,
    T_Q5_1 = 7,
    T_Q8_0 = 8,
    T_Q4_K = 12,
    T_Q5_K = 13,
    T_Q6_K = 14,
    T_BF16 = 30,
};

/* How a type's products are formed. */
enum { F_NONE, F_FLOAT, F_SMALL /* 32-value blocks */, F_SUPER /* 256-value blocks */ };

#define RT 8 /* input rows a tile takes: each weight block is decoded once for them (the
              * AVX2 K kernels keep a tile's rows in the 8 lanes of one register) */
#define LANES_SMALL 8
#define LANES_FLOAT 32

typedef struct {
    int family;
    int block; /* values a block */
    int bytes; /* bytes a block */
} type_info;

static type_info info(int type)
{
    switch (type) {
    case T_F32:
        return (type_info){F_FLOAT, 1, 4};
    case T_F16:
    case T_BF16:
        return (type_info){F_FLOAT, 1, 2};
    case T_Q4_0:
        return (type_info){F_SMALL, 32, 18};
    case T_Q4_1:
        return (type_info){F_SMALL, 32, 20};
    case T_Q5_0:
        return (type_info){F_SMALL, 32, 22};
    case T_Q5_1:
        return (type_info){F_SMALL, 32, 24};
    case T_Q8_0:
        return (type_info){F_SMALL, 32, 34};
    case T_Q4_K:
        return (type_info){F_SUPER, 256, 144};
    case T_Q5_K:
        return (type_info){F_SUPER, 256, 176};
    case T_Q6_K:
        return (type_info){F_SUPER, 256, 210};
    default:
        return (type_info){F_NONE, 1, 0};
    }
}

/* ---- small helpers --------------------------------------------------------------------- */

static inline uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* An IEEE half's exact float value (subnormals, infinities and NaN payloads kept, as
 * numpy's conversion does). */
static inline float h2f(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        exp = 113; /* 127 - 15 + 1, lowered below until the leading bit is the implicit one */
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        return bits_f32(sign | (exp << 23) | ((man & 0x3ff) << 13));
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline float bf2f(uint16_t b) { return bits_f32((uint32_t)b << 16); }

static inline int64_t pad64(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }

/* The six-bit scale and min of sub-block j of a Q4_K or Q5_K block (12 packed bytes). */
static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The fixed pairwise sum of n lanes (n a power of two), in place. */
static inline float pairwise(float *lane, int n)
{
    for (int width = n / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++)
            lane[l] += lane[l + width];
    return lane[0];
}

/* ---- the activation rows' layout -------------------------------------------------------- */

/* Where an activation row's parts lie. */
typedef struct {
    const int8_t *q;
    const float *d;
    const int16_t *s;
} act_view;

static inline act_view act_at(const uint8_t *row, int64_t k, int family)
{
    if (family == F_SMALL) {
        const int64_t groups = (k / 32 + 7) / 8;
        return (act_view){(const int8_t *)row, (const float *)(const void *)(row + 256 * groups),
                          (const int16_t *)(const void *)(row + 288 * groups)};
    }
    return (act_view){(const int8_t *)row, (const float *)(const void *)(row + k),
                      (const int16_t *)(const void *)(row + k + 4 * (k / 256))};
}

/* The 32-value types' activations come in groups of 8 blocks (the last group padded with
 * zeros), laid out for the SIMD paths: blocks 2j and 2j+1 of a group share 64 bytes, first
 * values 0..15 of each, then values 16..31 of each, so one 256-bit register holds the
 * halves of two blocks that one load of two blocks' nibbles meets. The scales and sums of a
 * group lie in slot order: blocks 0, 2, 4, 6, 1, 3, 5, 7 (how the pairs' sums come out of
 * the reduction). */
static inline int64_t code_at(int64_t b, int i)
{
    const int64_t in = b % 8;
    return b / 8 * 256 + in / 2 * 64 + i / 16 * 32 + in % 2 * 16 + i % 16;
}

static inline int64_t slot_at(int64_t b) { return b / 8 * 8 + b % 2 * 4 + b % 8 / 2; }

/* The block (within its group) whose term slot l of a group holds. */
static const int slot_block[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* ---- the float combinations, shared by every path -------------------------------------- */

/* One 32-value block's term: (dw * dx) * s [+ (mw * dx) * sum]. */
static inline float small_term(int min, float dw, float mw, float dx, int32_t s, int32_t sum)
{
    float t = (dw * dx) * (float)s;
    if (min)
        t = t + (mw * dx) * (float)sum;
    return t;
}

/* One 256-value block's term, from its integer sums S (codes times scales) and M (the
 * mins, or Q6_K's scales, times the input sums). */
static inline float super_term(int type, float d, float dmin, float dx, int32_t S, int32_t M)
{
    if (type == T_Q6_K)
        return (d * dx) * (float)(S - 32 * M);
    return (d * dx) * (float)S - (dmin * dx) * (float)M;
}

/* Value i of a float type's weight row. */
static inline float float_weight(int type, const uint8_t *w, int64_t i)
{
    if (type == T_F32) {
        float f;
        memcpy(&f, w + 4 * i, sizeof f);
        return f;
    }
    return type == T_F16 ? h2f(rd16(w + 2 * i)) : bf2f(rd16(w + 2 * i));
}

/* ---- the kernels this build's path supplies (gguf_kernels.c dispatches to them; where
 * none is defined, the portable reference of gguf_portable.c runs) ----------------------- */
#if defined(GK_AVX2)
#define SIMD_PATH 1
#define QUANTIZE_ROW quantize_row_avx2 /* arch/x86/gguf_avx2.c */
#define SMALL_ROWS small_rows_avx2
#define SUPER_ROWS super_rows_avx2
#define FLOAT_ROWS float_rows_avx2
#define QUANT_TILE quant_tile /* arch/x86/gguf_tiles.c */
#elif defined(GK_NEON)
#define SIMD_PATH 1
#define QUANTIZE_ROW quantize_row_neon /* arch/arm/gguf_neon.c */
#define SMALL_ROWS small_rows_neon
#define SUPER_ROWS super_rows_neon
#define FLOAT_ROWS float_rows_neon
#endif

/* ---- exports (defined in gguf_portable.c and gguf_kernels.c) ---------------------------- */

int64_t gk_row_bytes(int type, int64_t k);
int64_t gk_act_bytes(int type, int64_t k);
const char *gk_path(void);
void gk_quantize_act(int type, const float *x, int64_t rows, int64_t k, void *out);
void gk_dequantize_act(int type, const void *xq, int64_t rows, int64_t k, float *out);
void gk_matmul(int type, const void *w, int64_t n, int64_t k, const void *xq, int64_t rows,
               float *y);
void gk_linear(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t rows,
               float *y, void *scratch);
void gk_dequantize(int type, const void *w, int64_t rows, int64_t k, float *out);
void gk_get_rows(int type, const void *w, int64_t k, const int64_t *ids, int64_t n, float *out);

#endif /* GGUF_KERNELS_H */
