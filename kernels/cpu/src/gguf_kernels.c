/* GGUF weight matrices times float32 activations, the weights read in their own block
 * formats (built by gguf_kernels.py with the machine's compiler, -O3 -march=native
 * -ffp-contract=off -fopenmp).
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
 * kernels waiting on memory: over 100 copies of an 8192 x 2048 matrix on 2 threads (AVX-512
 * VNNI Xeon) Q4_0 took 833 us a call (11.3 GB/s) without and 481 us (19.6 GB/s) with 2048
 * bytes ahead, Q4_K 1066 -> 508 us, Q6_K 987 -> 701 us; 1024 was slower, 4096 the same.
 * On a 2-core AMD EPYC (Zen 4), whose own prefetcher kept one row at 26-32 GB/s either way,
 * 8 and 32 rows gained 10-45% (Q4_0 8 rows 1244 -> 1034 us, Q8_0 2033 -> 1154 us). */
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

/* ---- sizes ------------------------------------------------------------------------------ */

int64_t gk_row_bytes(int type, int64_t k)
{
    const type_info t = info(type);
    if (t.family == F_NONE || k < 0 || k % t.block)
        return -1;
    return k / t.block * t.bytes;
}

int64_t gk_act_bytes(int type, int64_t k)
{
    const type_info t = info(type);
    if (t.family == F_NONE || k < 0 || k % t.block)
        return -1;
    if (t.family == F_FLOAT)
        return 4 * k;
    if (t.family == F_SMALL) { /* groups of 8 blocks: 256 codes, 8 float scales, 8 sums */
        const int64_t groups = (k / 32 + 7) / 8;
        return pad64(groups * (256 + 32 + 16));
    }
    return pad64(k + 4 * (k / 256) + 2 * (k / 16)); /* codes, a scale per 256, a sum per 16 */
}

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

/* ---- activation quantization (portable; the compiler vectorises it) -------------------- */

/* The codes of n values with scale d = max|x| / 127, their sum, and d. */
static inline float quantize_block(const float *x, int n, int8_t *q)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (int8_t)rintf(x[i] * id);
    return d;
}

static void quantize_row_ref(int type, const float *x, int64_t k, uint8_t *out)
{
    const type_info t = info(type);
    if (t.family == F_FLOAT) {
        memcpy(out, x, sizeof(float) * k);
        return;
    }
    if (t.family == F_SMALL) {
        const int64_t groups = (k / 32 + 7) / 8;
        memset(out, 0, gk_act_bytes(type, k)); /* the last group's missing blocks: zeros */
        for (int64_t b = 0; b < k / 32; b++) {
            int8_t q[32];
            const float d = quantize_block(x + 32 * b, 32, q);
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                out[code_at(b, i)] = (uint8_t)q[i];
                sum += q[i];
            }
            const int16_t s = (int16_t)sum;
            memcpy(out + 256 * groups + 4 * slot_at(b), &d, sizeof d);
            memcpy(out + 288 * groups + 2 * slot_at(b), &s, sizeof s);
        }
        return;
    }
    int8_t *q = (int8_t *)out;
    const int64_t nsums = k / 16, used = k + 4 * (k / 256) + 2 * nsums;
    for (int64_t b = 0; b < k / 256; b++) {
        const float d = quantize_block(x + 256 * b, 256, q + 256 * b);
        memcpy(out + k + 4 * b, &d, sizeof d);
    }
    for (int64_t b = 0; b < nsums; b++) {
        int sum = 0;
        for (int i = 0; i < 16; i++)
            sum += q[16 * b + i];
        const int16_t s = (int16_t)sum;
        memcpy(out + k + 4 * (k / 256) + 2 * b, &s, sizeof s);
    }
    memset(out + used, 0, gk_act_bytes(type, k) - used);
}

/* ---- dequantization: GGUF's float expressions, value for value ------------------------- */

static void dequantize_row(int type, const uint8_t *w, int64_t k, float *out)
{
    const type_info t = info(type);
    if (type == T_F32) {
        memcpy(out, w, sizeof(float) * k);
        return;
    }
    if (type == T_F16 || type == T_BF16) {
        for (int64_t i = 0; i < k; i++)
            out[i] = type == T_F16 ? h2f(rd16(w + 2 * i)) : bf2f(rd16(w + 2 * i));
        return;
    }
    for (int64_t b = 0; b < k / t.block; b++) {
        const uint8_t *blk = w + b * t.bytes;
        float *y = out + b * t.block;
        switch (type) {
        case T_Q4_0: {
            const float d = h2f(rd16(blk));
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)((blk[2 + j] & 15) - 8);
                y[j + 16] = d * (float)((blk[2 + j] >> 4) - 8);
            }
            break;
        }
        case T_Q4_1: {
            const float d = h2f(rd16(blk)), m = h2f(rd16(blk + 2));
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)(blk[4 + j] & 15) + m;
                y[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
            }
            break;
        }
        case T_Q5_0:
        case T_Q5_1: {
            const int min = type == T_Q5_1;
            const float d = h2f(rd16(blk)), m = min ? h2f(rd16(blk + 2)) : 0.0f;
            const uint32_t qh = rd32(blk + 2 + 2 * min);
            const uint8_t *qs = blk + 6 + 2 * min;
            for (int j = 0; j < 16; j++) {
                const int lo = (qs[j] & 15) | (((qh >> j) & 1) << 4);
                const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                if (min) {
                    y[j] = d * (float)lo + m;
                    y[j + 16] = d * (float)hi + m;
                } else {
                    y[j] = d * (float)(lo - 16);
                    y[j + 16] = d * (float)(hi - 16);
                }
            }
            break;
        }
        case T_Q8_0: {
            const float d = h2f(rd16(blk));
            for (int j = 0; j < 32; j++)
                y[j] = (float)(int8_t)blk[2 + j] * d;
            break;
        }
        case T_Q4_K:
        case T_Q5_K: {
            const float d = h2f(rd16(blk)), dmin = h2f(rd16(blk + 2));
            const int five = type == T_Q5_K;
            const uint8_t *qh = blk + 16, *qs = blk + 16 + 32 * five;
            for (int j = 0; j < 8; j++) {
                int sc, m;
                scale_min_k4(blk + 4, j, &sc, &m);
                const float dl = d * (float)sc, ml = dmin * (float)m;
                for (int i = 0; i < 32; i++) {
                    int q = (qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 15;
                    if (five)
                        q |= ((qh[i] >> j) & 1) << 4;
                    y[32 * j + i] = dl * (float)q - ml;
                }
            }
            break;
        }
        case T_Q6_K: {
            const uint8_t *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            const float d = h2f(rd16(blk + 208));
            for (int v = 0; v < 256; v++) {
                const int h = v / 128, j = (v % 128) / 32, i = v % 32;
                const int q = ((ql[64 * h + 32 * (j & 1) + i] >> (4 * (j >> 1))) & 15) |
                              (((qh[32 * h + i] >> (2 * j)) & 3) << 4);
                y[v] = (d * (float)sc[v / 16]) * (float)(q - 32);
            }
            break;
        }
        default:
            break;
        }
    }
}

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

/* ---- portable reference ----------------------------------------------------------------- */

/* Block b's 32 codes as integers and its offset (8, 16 or 0), its fp16 scale and min. */
static inline int ref_codes(int type, const uint8_t *blk, int q[32], uint16_t *dh, uint16_t *mh)
{
    *dh = rd16(blk);
    *mh = 0;
    switch (type) {
    case T_Q4_0:
    case T_Q4_1: {
        const int min = type == T_Q4_1;
        if (min)
            *mh = rd16(blk + 2);
        for (int j = 0; j < 16; j++) {
            q[j] = blk[2 + 2 * min + j] & 15;
            q[j + 16] = blk[2 + 2 * min + j] >> 4;
        }
        return min ? 0 : 8;
    }
    case T_Q5_0:
    case T_Q5_1: {
        const int min = type == T_Q5_1;
        if (min)
            *mh = rd16(blk + 2);
        const uint32_t qh = rd32(blk + 2 + 2 * min);
        const uint8_t *qs = blk + 6 + 2 * min;
        for (int j = 0; j < 16; j++) {
            q[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4);
            q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
        return min ? 0 : 16;
    }
    default: /* Q8_0 */
        for (int j = 0; j < 32; j++)
            q[j] = (int8_t)blk[2 + j];
        return 0;
    }
}

/* One output of one row for a 32-value type: the lanes of the header comment. */
static float ref_small(int type, const uint8_t *w, int64_t k, const uint8_t *xrow)
{
    const type_info t = info(type);
    const act_view x = act_at(xrow, k, F_SMALL);
    const int64_t nb = k / 32, padded = (nb + LANES_SMALL - 1) / LANES_SMALL * LANES_SMALL;
    const int min = type == T_Q4_1 || type == T_Q5_1;
    float lane[LANES_SMALL] = {0};
    for (int64_t b = 0; b < padded; b++) {
        float term = 0.0f;
        if (b < nb) {
            int q[32];
            uint16_t dh, mh;
            const int offset = ref_codes(type, w + b * t.bytes, q, &dh, &mh);
            int32_t s = 0;
            for (int j = 0; j < 32; j++)
                s += q[j] * x.q[code_at(b, j)];
            const int32_t sum = x.s[slot_at(b)];
            s -= offset * sum;
            term = small_term(min, h2f(dh), h2f(mh), x.d[slot_at(b)], s, sum);
        }
        lane[b % LANES_SMALL] += term;
    }
    return pairwise(lane, LANES_SMALL);
}

/* The integer sums S and M of one 256-value block against one activation block. */
static void ref_super_sums(int type, const uint8_t *blk, const int8_t *xq, const int16_t *xs,
                           int32_t *S, int32_t *M)
{
    int32_t s = 0, m = 0;
    if (type == T_Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int v = 16 * g; v < 16 * g + 16; v++) {
                const int h = v / 128, j = (v % 128) / 32, i = v % 32;
                const int q = ((ql[64 * h + 32 * (j & 1) + i] >> (4 * (j >> 1))) & 15) |
                              (((qh[32 * h + i] >> (2 * j)) & 3) << 4);
                dot += q * xq[v];
            }
            s += sc[g] * dot;
            m += sc[g] * xs[g];
        }
    } else {
        const int five = type == T_Q5_K;
        const uint8_t *qh = blk + 16, *qs = blk + 16 + 32 * five;
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            scale_min_k4(blk + 4, j, &sc, &mn);
            int32_t dot = 0;
            for (int i = 0; i < 32; i++) {
                int q = (qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 15;
                if (five)
                    q |= ((qh[i] >> j) & 1) << 4;
                dot += q * xq[32 * j + i];
            }
            s += sc * dot;
            m += mn * (xs[2 * j] + xs[2 * j + 1]);
        }
    }
    *S = s;
    *M = m;
}

/* One output of one row for a K type: the blocks' terms added in order. */
static float ref_super(int type, const uint8_t *w, int64_t k, const uint8_t *xrow)
{
    const type_info t = info(type);
    const act_view x = act_at(xrow, k, F_SUPER);
    const int dpos = type == T_Q6_K ? 208 : 0;
    float acc = 0.0f;
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + b * t.bytes;
        int32_t S, M;
        ref_super_sums(type, blk, x.q + 256 * b, x.s + 16 * b, &S, &M);
        const float dmin = type == T_Q6_K ? 0.0f : h2f(rd16(blk + 2));
        acc += super_term(type, h2f(rd16(blk + dpos)), dmin, x.d[b], S, M);
    }
    return acc;
}

static inline float float_weight(int type, const uint8_t *w, int64_t i)
{
    if (type == T_F32) {
        float f;
        memcpy(&f, w + 4 * i, sizeof f);
        return f;
    }
    return type == T_F16 ? h2f(rd16(w + 2 * i)) : bf2f(rd16(w + 2 * i));
}

/* One output of one row for a float type: 32 lanes, then their pairwise sum. */
static float ref_float(int type, const uint8_t *w, int64_t k, const float *x)
{
    float lane[LANES_FLOAT] = {0};
    const int64_t padded = (k + LANES_FLOAT - 1) / LANES_FLOAT * LANES_FLOAT;
    for (int64_t i = 0; i < padded; i++)
        lane[i % LANES_FLOAT] += i < k ? float_weight(type, w, i) * x[i] : 0.0f;
    return pairwise(lane, LANES_FLOAT);
}

/* Output o (weight row w) of R activation rows x (xstride bytes apart) into y[r * ystride]:
 * the reference, also the path where no SIMD one exists. */
static void ref_rows(int type, const uint8_t *w, int64_t k, const uint8_t *x, int64_t xstride,
                     int64_t R, float *y, int64_t ystride)
{
    const int family = info(type).family;
    for (int64_t r = 0; r < R; r++) {
        const uint8_t *xr = x + r * xstride;
        float v;
        if (family == F_SMALL)
            v = ref_small(type, w, k, xr);
        else if (family == F_SUPER)
            v = ref_super(type, w, k, xr);
        else
            v = ref_float(type, w, k, (const float *)(const void *)xr);
        y[r * ystride] = v;
    }
}

/* ---- AVX2 ------------------------------------------------------------------------------- */
#if defined(GK_AVX2)

/* A half's float value by F16C (as h2f, for every value but signalling NaNs). */
static inline float fp16(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

static inline __m256i mm_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m128i mm_load128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Two 128-bit halves as one register (lo in the low half). */
INLINE __m256i pair128(__m128i lo, __m128i hi) { return _mm256_set_m128i(hi, lo); }

/* 0x10 in byte i of each half where bit i (upper: i + 16) of that half's qh is set: the
 * fifth bits of values 0..15 (16..31) of two Q5 blocks. */
INLINE __m256i high_bits(uint32_t qh0, uint32_t qh1, int upper)
{
    const __m256i spread = upper ? _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)
                                : _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                   0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i qh = pair128(_mm_set1_epi32((int)qh0), _mm_set1_epi32((int)qh1));
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* One group of up to 8 blocks (nblk, a constant where inlined) of a 32-value type from blk,
 * for R rows: the blocks decoded once, two to a register pair (lo: values 0..15 of both,
 * hi: values 16..31), then for each row the 8 integer sums in slot order and its lanes.
 * Without VNNI the unsigned codes' pair products (maddubs) are added in 16 bits up to 8
 * products (at most 8 * 31 * 127 = 31496), or 16 for 4-bit codes (16 * 15 * 127 = 30480),
 * then widened; Q8_0's signed codes (products up to 128 * 127) widen at once. */
INLINE void small_step_avx2(const int type, const int nblk, const uint8_t *blk, const uint8_t *x,
                            int64_t xstride, int64_t k, int64_t g, int64_t R, __m256 *acc)
{
    const int bytes = info(type).bytes;
    const int min = type == T_Q4_1 || type == T_Q5_1;
    const int at = 2 + 2 * min + 4 * (type == T_Q5_0 || type == T_Q5_1); /* codes' offset */
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i lo[4], hi[4];
    uint16_t dh[8], mh[8];
    for (int j = 0; j < 4; j++) {
        const uint8_t *p0 = blk + 2 * j * bytes, *p1 = p0 + bytes;
        const int have0 = 2 * j < nblk, have1 = 2 * j + 1 < nblk;
        /* slots 0..3 hold the even blocks, 4..7 the odd ones */
        dh[j] = have0 ? rd16(p0) : 0;
        dh[4 + j] = have1 ? rd16(p1) : 0;
        mh[j] = have0 && min ? rd16(p0 + 2) : 0;
        mh[4 + j] = have1 && min ? rd16(p1 + 2) : 0;
        if (type == T_Q8_0) {
            const __m128i z = _mm_setzero_si128();
            lo[j] = pair128(have0 ? mm_load128(p0 + 2) : z, have1 ? mm_load128(p1 + 2) : z);
            hi[j] = pair128(have0 ? mm_load128(p0 + 18) : z, have1 ? mm_load128(p1 + 18) : z);
#if defined(GK_VNNI)
            lo[j] = _mm256_xor_si256(lo[j], _mm256_set1_epi8((char)0x80));
            hi[j] = _mm256_xor_si256(hi[j], _mm256_set1_epi8((char)0x80));
#endif
            continue;
        }
        const __m128i z = _mm_setzero_si128();
        const __m256i v = pair128(have0 ? mm_load128(p0 + at) : z, have1 ? mm_load128(p1 + at) : z);
        lo[j] = _mm256_and_si256(v, m4);
        hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (type == T_Q5_0 || type == T_Q5_1) {
            const uint32_t qh0 = have0 ? rd32(p0 + at - 4) : 0, qh1 = have1 ? rd32(p1 + at - 4) : 0;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
            /* byte i of lo (hi) is value i % 16 (16 + i % 16) of block i / 16 of the pair:
             * its bit of qh as a mask lane, 16 added where set, one op where high_bits
             * takes five. One row of Q5_0 (Gemma 3 1B's 6912 x 1152, the type most of its
             * Q4_K_M file falls back to), one Xeon thread, best of 300: 460 -> 364 us;
             * 32 rows through the tile's own: 2,590 -> 2,340 us. */
            const __m256i sixteen = _mm256_set1_epi8(0x10);
            const __mmask32 low = (qh0 & 0xffffu) | (qh1 << 16);
            const __mmask32 high = (qh0 >> 16) | (qh1 & 0xffff0000u);
            lo[j] = _mm256_mask_add_epi8(lo[j], low, lo[j], sixteen);
            hi[j] = _mm256_mask_add_epi8(hi[j], high, hi[j], sixteen);
#else
            lo[j] = _mm256_or_si256(lo[j], high_bits(qh0, qh1, 0));
            hi[j] = _mm256_or_si256(hi[j], high_bits(qh0, qh1, 1));
#endif
        }
    }
    const __m256 dw = _mm256_cvtph_ps(
        _mm_setr_epi16((short)dh[0], (short)dh[1], (short)dh[2], (short)dh[3], (short)dh[4],
                       (short)dh[5], (short)dh[6], (short)dh[7]));
    __m256 mw = _mm256_setzero_ps();
    if (min)
        mw = _mm256_cvtph_ps(_mm_setr_epi16((short)mh[0], (short)mh[1], (short)mh[2],
                                            (short)mh[3], (short)mh[4], (short)mh[5],
                                            (short)mh[6], (short)mh[7]));
#if !defined(GK_VNNI)
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int64_t r = 0; r < R; r++) {
        const act_view xv = act_at(x + r * xstride, k, F_SMALL);
        const int8_t *xq = xv.q + 256 * g;
        __m256i u[4];
        for (int j = 0; j < 4; j++) {
            const __m256i xa = mm_load(xq + 64 * j), xb = mm_load(xq + 64 * j + 32);
#if defined(GK_VNNI)
            u[j] = DPBUSD(DPBUSD(_mm256_setzero_si256(), lo[j], xa), hi[j], xb);
#else
            if (type == T_Q8_0)
                u[j] = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(lo[j]),
                                                           _mm256_sign_epi8(xa, lo[j])), ones),
                    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(hi[j]),
                                                           _mm256_sign_epi8(xb, hi[j])), ones));
            else
                u[j] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[j], xa),
                                        _mm256_maddubs_epi16(hi[j], xb));
#endif
        }
        __m256i s;
#if defined(GK_VNNI)
        s = _mm256_hadd_epi32(_mm256_hadd_epi32(u[0], u[1]), _mm256_hadd_epi32(u[2], u[3]));
#else
        if (type == T_Q8_0)
            s = _mm256_hadd_epi32(_mm256_hadd_epi32(u[0], u[1]), _mm256_hadd_epi32(u[2], u[3]));
        else if (type == T_Q4_0 || type == T_Q4_1) /* 16 products of codes <= 15 fit 16 bits */
            s = _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(u[0], u[1]),
                                                    _mm256_hadd_epi16(u[2], u[3])),
                                  ones);
        else
            s = _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_hadd_epi16(u[0], u[1]), ones),
                                  _mm256_madd_epi16(_mm256_hadd_epi16(u[2], u[3]), ones));
#endif
        const __m256 dx = _mm256_loadu_ps(xv.d + 8 * g);
        const __m256i sum = _mm256_cvtepi16_epi32(mm_load128(xv.s + 8 * g));
        if (type == T_Q4_0)
            s = _mm256_sub_epi32(s, _mm256_slli_epi32(sum, 3));
        else if (type == T_Q5_0)
            s = _mm256_sub_epi32(s, _mm256_slli_epi32(sum, 4));
#if defined(GK_VNNI)
        else if (type == T_Q8_0)
            s = _mm256_sub_epi32(s, _mm256_slli_epi32(sum, 7));
#endif
        __m256 term = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(s));
        if (min)
            term = _mm256_add_ps(term,
                                 _mm256_mul_ps(_mm256_mul_ps(mw, dx), _mm256_cvtepi32_ps(sum)));
        acc[r] = _mm256_add_ps(acc[r], term);
    }
}

INLINE void small_rows_avx2_(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                             int64_t xstride, const int64_t R, float *y, int64_t ystride)
{
    const int bytes = info(type).bytes;
    const int64_t nb = k / 32, whole = nb / 8;
    __m256 acc[RT];
    for (int64_t r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < whole; g++) {
        prefetch_ahead(w + 8 * g * bytes, 8 * bytes);
        small_step_avx2(type, 8, w + 8 * g * bytes, x, xstride, k, g, R, acc);
    }
    if (8 * whole < nb)
        small_step_avx2(type, (int)(nb - 8 * whole), w + 8 * whole * bytes, x, xstride, k, whole,
                        R, acc);
    for (int64_t r = 0; r < R; r++) {
        float slot[8], lane[8];
        _mm256_storeu_ps(slot, acc[r]);
        for (int l = 0; l < 8; l++)
            lane[slot_block[l]] = slot[l];
        y[r * ystride] = pairwise(lane, 8);
    }
}

/* Byte-shuffle masks that spread int16 word a over a register's low half and word b over
 * its high half (a madd's scales for one 32-value group). */
#define W2(a) (char)(2 * (a)), (char)(2 * (a) + 1)
#define W8(a) W2(a), W2(a), W2(a), W2(a), W2(a), W2(a), W2(a), W2(a)
#define SPREAD(a, b) _mm256_setr_epi8(W8(a), W8(b))

/* The 8 six-bit scales (low half, int16) and mins (high half) of a Q4_K or Q5_K block. */
INLINE __m256i scales_mins_k4(const uint8_t *p)
{
    const uint32_t a = rd32(p), b = rd32(p + 4), c = rd32(p + 8);
    const uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = b & 0x3f3f3f3fu;
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi));
}

/* The 8 lanes of M for a Q4_K or Q5_K block against one activation row: lane j = min m_j
 * (from scales_mins_k4's high half) times the row's two sums of 16 of group j, one madd
 * (at most 2 * 63 * 16 * 127 a lane). */
INLINE __m256i min_lanes(__m256i mins, const int16_t *xs)
{
    const __m256i both = _mm256_permute4x64_epi64(mins, 0xEE); /* the mins in both halves */
    const __m256i spread = _mm256_setr_epi8(W2(0), W2(0), W2(1), W2(1), W2(2), W2(2), W2(3),
                                            W2(3), W2(4), W2(4), W2(5), W2(5), W2(6), W2(6),
                                            W2(7), W2(7));
    return _mm256_madd_epi16(_mm256_shuffle_epi8(both, spread), mm_load(xs));
}

/* One row's unreduced sums against a decoded K block: s (8 lanes of S: 32-value group j's
 * codes q[j] times the row's inputs, times its scales scv[j]) and m (8 lanes of M, see
 * min_lanes; Q6_K's is folded into s as S - 32 M, its m left 0). */
INLINE void super_lanes_avx2(const int type, const __m256i q[8], const __m256i scv[8],
                             __m256i mins, const int8_t *xq, const int16_t *xs, __m256i *s_out,
                             __m256i *m_out)
{
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++)
        s = _mm256_add_epi32(
            s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], mm_load(xq + 32 * j)), scv[j]));
    if (type == T_Q6_K) { /* S - 32 M in one: super_term takes M = 0 */
        *s_out = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(mins, mm_load(xs)), 5));
        *m_out = _mm256_setzero_si256();
        return;
    }
    *s_out = s;
    *m_out = min_lanes(mins, xs);
}

/* Lane r = the sum of p[r]'s 8 lanes. */
INLINE __m256i reduce8(const __m256i p[8])
{
    const __m256i a = _mm256_hadd_epi32(p[0], p[1]), b = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i c = _mm256_hadd_epi32(p[4], p[5]), d = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i e = _mm256_hadd_epi32(a, b), f = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20),
                            _mm256_permute2x128_si256(e, f, 0x31));
}

/* The codes of groups 2c and 2c + 1 of a Q4_K or Q5_K block from its code bytes v of chunk
 * c (low nibbles, high nibbles) and, for Q5_K, its high-bit bytes hb, byte for byte in step
 * with v (bit j of a byte is the fifth bit of group j; 16-bit shifts keep bytes apart here,
 * since only bit 4 is kept). */
INLINE void k4_codes(const int five, __m256i v, __m256i hb, int c, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (!five)
        return;
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    const __m256i b0 = c < 2 ? _mm256_slli_epi16(hb, 4 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 4);
    const __m256i b1 = c < 2 ? _mm256_slli_epi16(hb, 3 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 3);
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(b0, bit4));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(b1, bit4));
}

/* The codes of Q6_K's groups of 32 values j = 0..3 of one half of a block, from its low
 * bytes l0 (groups 0, 2) and l1 (1, 3) and its high bits hb (bits 2j, 2j + 1), byte for
 * byte in step. */
INLINE void q6_codes(__m256i l0, __m256i l1, __m256i hb, __m256i out[4])
{
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(0x30);
    out[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                             _mm256_and_si256(_mm256_slli_epi16(hb, 4), m3));
    out[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                             _mm256_and_si256(_mm256_slli_epi16(hb, 2), m3));
    out[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                             _mm256_and_si256(hb, m3));
    out[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m3));
}

/* A K block decoded: its codes q (32 values each), their scales spread for madd (scv), the
 * mins (Q6_K: its 16 scales) as int16, d and dmin. */
INLINE void super_decode_avx2(const int type, const uint8_t *blk, __m256i q[8], __m256i scv[8],
                              __m256i *mins, float *d, float *dmin)
{
    *dmin = 0.0f;
    if (type == T_Q6_K) {
        *d = fp16(blk + 208);
        *mins = _mm256_cvtepi8_epi16(mm_load128(blk + 192)); /* the 16 scales */
        const __m256i e = _mm256_permute4x64_epi64(*mins, 0x44); /* scales 0..7 twice */
        const __m256i f = _mm256_permute4x64_epi64(*mins, 0xEE); /* scales 8..15 twice */
        scv[0] = _mm256_shuffle_epi8(e, SPREAD(0, 1));
        scv[1] = _mm256_shuffle_epi8(e, SPREAD(2, 3));
        scv[2] = _mm256_shuffle_epi8(e, SPREAD(4, 5));
        scv[3] = _mm256_shuffle_epi8(e, SPREAD(6, 7));
        scv[4] = _mm256_shuffle_epi8(f, SPREAD(0, 1));
        scv[5] = _mm256_shuffle_epi8(f, SPREAD(2, 3));
        scv[6] = _mm256_shuffle_epi8(f, SPREAD(4, 5));
        scv[7] = _mm256_shuffle_epi8(f, SPREAD(6, 7));
        for (int h = 0; h < 2; h++)
            q6_codes(mm_load(blk + 64 * h), mm_load(blk + 64 * h + 32),
                     mm_load(blk + 128 + 32 * h), q + 4 * h);
    } else {
        *d = fp16(blk);
        *dmin = fp16(blk + 2);
        *mins = scales_mins_k4(blk + 4);
        const __m256i e = _mm256_permute4x64_epi64(*mins, 0x44); /* scales twice */
        scv[0] = _mm256_shuffle_epi8(e, SPREAD(0, 0));
        scv[1] = _mm256_shuffle_epi8(e, SPREAD(1, 1));
        scv[2] = _mm256_shuffle_epi8(e, SPREAD(2, 2));
        scv[3] = _mm256_shuffle_epi8(e, SPREAD(3, 3));
        scv[4] = _mm256_shuffle_epi8(e, SPREAD(4, 4));
        scv[5] = _mm256_shuffle_epi8(e, SPREAD(5, 5));
        scv[6] = _mm256_shuffle_epi8(e, SPREAD(6, 6));
        scv[7] = _mm256_shuffle_epi8(e, SPREAD(7, 7));
        const int five = type == T_Q5_K;
        const __m256i hb = five ? mm_load(blk + 16) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++)
            k4_codes(five, mm_load(blk + 16 + 32 * five + 32 * c), hb, c, q + 2 * c,
                     q + 2 * c + 1);
    }
}

/* Lane i's term of 8 blocks' sums (block i's S in sv[i], M in mv[i]) and float factors:
 * super_term's float operations, lane by lane. */
INLINE __m256 super_terms8(const int type, __m256 d, __m256 dmin, __m256 dx, const __m256i sv[8],
                           const __m256i mv[8])
{
    const __m256 t = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(reduce8(sv)));
    if (type == T_Q6_K)
        return t;
    return _mm256_sub_ps(t, _mm256_mul_ps(_mm256_mul_ps(dmin, dx),
                                          _mm256_cvtepi32_ps(reduce8(mv))));
}

#if defined(GK_VNNI)
/* Byte-shuffle masks that spread int16 word a over words 0..3 of each 128-bit half and word
 * b over words 4..7 (as packs_epi32 lays out two registers' lanes). */
#define W4(a) W2(a), W2(a), W2(a), W2(a)
#define PACKED(a, b) _mm256_setr_epi8(W4(a), W4(b), W4(a), W4(b))

/* super_lanes_avx2 for Q4_K and Q5_K by dpbusd, for one row: each 32-value group's sums
 * (lanes of at most 4 * 31 * 127, so int16 holds them) packed two groups to a register and
 * scaled by one dpwssd, where the lanes of each group were reduced (hadd) and scaled by a
 * mullo. One row of Q4_K on 2 threads, Zen 4: 2048 x 2048 from cache 75 -> 66 us, 8192 x
 * 2048 from memory 367 -> 342 us. More rows keep super_lanes_avx2, whose spread scales
 * serve every row. */
INLINE void super_lanes_vnni(const __m256i q[8], __m256i mins, const int8_t *xq,
                             const int16_t *xs, __m256i *s_out, __m256i *m_out)
{
    const __m256i zero = _mm256_setzero_si256();
    const __m256i e = _mm256_permute4x64_epi64(mins, 0x44); /* the scales in both halves */
    const __m256i spread[4] = {PACKED(0, 1), PACKED(2, 3), PACKED(4, 5), PACKED(6, 7)};
    __m256i t[4];
    for (int p = 0; p < 4; p++) { /* apart, then added: one chain of dpwssd waited on itself */
        const __m256i a = DPBUSD(zero, q[2 * p], mm_load(xq + 64 * p));
        const __m256i b = DPBUSD(zero, q[2 * p + 1], mm_load(xq + 64 * p + 32));
        t[p] = DPWSSD(zero, _mm256_packs_epi32(a, b), _mm256_shuffle_epi8(e, spread[p]));
    }
    *s_out = _mm256_add_epi32(_mm256_add_epi32(t[0], t[1]), _mm256_add_epi32(t[2], t[3]));
    *m_out = min_lanes(mins, xs);
}
#endif

/* A decode step's one row: the blocks taken 8 at a time, their sums reduced together with
 * block i in lane i and their terms formed lane by lane (super_term's float operations),
 * then added to the row's sum in block order. Reducing and combining each block on its own
 * took a fifth of the row's time. */
INLINE void super_row1_avx2(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                            float *y)
{
    const int bytes = info(type).bytes;
    const act_view xv = act_at(x, k, F_SUPER);
    const int64_t nb = k / 256;
    float acc = 0.0f;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int64_t count = nb - b0 < 8 ? nb - b0 : 8;
        __m256i sv[8];
        __m256i mv[8];
        float d[8] = {0}, dmin[8] = {0}, dx[8] = {0}, term[8];
        for (int64_t i = 0; i < 8; i++) {
            if (i >= count) {
                sv[i] = _mm256_setzero_si256();
                mv[i] = _mm256_setzero_si256();
                continue;
            }
            const int64_t b = b0 + i;
            const uint8_t *blk = w + b * bytes;
            prefetch_ahead(blk, bytes);
            __m256i q[8], scv[8], mins;
            super_decode_avx2(type, blk, q, scv, &mins, d + i, dmin + i);
#if defined(GK_VNNI)
            if (type != T_Q6_K)
                super_lanes_vnni(q, mins, xv.q + 256 * b, xv.s + 16 * b, sv + i, mv + i);
            else
#endif
                super_lanes_avx2(type, q, scv, mins, xv.q + 256 * b, xv.s + 16 * b, sv + i,
                                 mv + i);
            dx[i] = xv.d[b];
        }
        _mm256_storeu_ps(term, super_terms8(type, _mm256_loadu_ps(d), _mm256_loadu_ps(dmin),
                                            _mm256_loadu_ps(dx), sv, mv));
        for (int64_t i = 0; i < count; i++)
            acc += term[i];
    }
    y[0] = acc;
}

INLINE void super_rows_avx2_(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                             int64_t xstride, const int64_t R, float *y, int64_t ystride)
{
    if (R == 1) {
        super_row1_avx2(type, w, k, x, y);
        return;
    }
    /* More rows: each block decoded once, the rows' sums reduced and combined 8 rows at
     * once, row r in lane r (the same float operations as super_term, lane by lane) */
    const int bytes = info(type).bytes;
    __m256 acc8 = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + b * bytes;
        prefetch_ahead(blk, bytes);
        __m256i q[8], scv[8], mins;
        float d, dmin;
        super_decode_avx2(type, blk, q, scv, &mins, &d, &dmin);
        __m256i sv[8];
        __m256i mv[8];
        float dx[8] = {0};
        for (int64_t r = 0; r < 8; r++) {
            if (r >= R) {
                sv[r] = _mm256_setzero_si256();
                mv[r] = _mm256_setzero_si256();
                continue;
            }
            const act_view xv = act_at(x + r * xstride, k, F_SUPER);
            super_lanes_avx2(type, q, scv, mins, xv.q + 256 * b, xv.s + 16 * b, sv + r, mv + r);
            dx[r] = xv.d[b];
        }
        acc8 = _mm256_add_ps(acc8, super_terms8(type, _mm256_set1_ps(d), _mm256_set1_ps(dmin),
                                                _mm256_loadu_ps(dx), sv, mv));
    }
    float lane[8];
    _mm256_storeu_ps(lane, acc8);
    for (int64_t r = 0; r < R; r++)
        y[r * ystride] = lane[r];
}

/* ---- K types as tiles: 16 weight rows by many activation rows ---------------------------
 * A product of many rows takes 16 weight rows at once, 8 to a register, one in each 32-bit
 * lane: a block's codes are decoded once into quads (4 values of each row: the rows' 32-bit
 * words transposed), and an activation row then costs one broadcast of 4 input codes and
 * two dpbusd per 4 values of the 16 rows; each group's sum is scaled once for 8 rows
 * (mullo). Without dpbusd (AVX2 alone) two maddubs take their place, their 16-bit pairs
 * added for as many quads as int16 holds, then one madd by the group's scale in both halves
 * of each lane. The per-row loop above spends a maddubs and a madd on every 32 values of
 * each row, and a reduction across lanes. Integers are exact, and each lane's float terms
 * are super_term's operations added in block order, so a tile gives the reference's bits. */
#if !defined(GK_VNNI)
/* dpwssd's integers (no saturation) where the CPU lacks it. */
#define DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif

/* One quad of a tile's 16 weight rows (q0, q1: its two halves) times a broadcast input word
 * xb, added to a0, a1: with dpbusd as 32-bit sums, else as maddubs's 16-bit pairs (how many
 * quads int16 holds is the caller's run). */
INLINE void add_quad(__m256i *a0, __m256i *a1, __m256i q0, __m256i q1, __m256i xb)
{
#if defined(GK_VNNI)
    *a0 = DPBUSD(*a0, q0, xb);
    *a1 = DPBUSD(*a1, q1, xb);
#else
    *a0 = _mm256_add_epi16(*a0, _mm256_maddubs_epi16(q0, xb));
    *a1 = _mm256_add_epi16(*a1, _mm256_maddubs_epi16(q1, xb));
#endif
}

#define TILE_OUT 16  /* weight rows a tile takes: two registers of 8 lanes */
#define TILE_ROWS 64 /* activation rows a pass over a chunk's tiles takes */
#define TILE_GROUP_ZMM 8 /* (tile_rows_zmm: two 512-bit registers a row) */
#if defined(__AVX512F__)
#define TILE_GROUP 4 /* activation rows whose sums the 32 registers hold at once */
#else
#define TILE_GROUP 2 /* (16 registers) */
#endif

/* The next tile's weights (the rows after the tile at w, where a thread's chunk goes on),
 * a share at each of the tile's nb blocks, asked for a few lines before each of the block's
 * calls over rows: the prefetcher alone left a tile's first blocks waiting on the last-level
 * cache, a fifth of a 32-row product of Q4_K 8192 x 2048, and a block's share asked at once
 * (53 lines of Q6_K) stalled on the queue of misses, a tenth of Q6_K's tile. */
typedef struct {
    const uint8_t *at, *end;
    int64_t bytes; /* asked for before each call */
} tile_prefetch;

INLINE tile_prefetch next_tile_share(const uint8_t *w, int64_t rb, int64_t nb, int64_t b,
                                     int64_t R, int64_t group)
{
    const int64_t span = (TILE_OUT * rb / nb + 63) & ~(int64_t)63;
    const int64_t calls = R / group + R % group;
    const uint8_t *at = w + TILE_OUT * rb + b * span;
    return (tile_prefetch){at, at + span, (span / 64 + calls - 1) / calls * 64};
}

INLINE void prefetch_some(tile_prefetch *p)
{
    for (int64_t i = 0; i < p->bytes && p->at < p->end; i += 64, p->at += 64)
        __builtin_prefetch(p->at, 0, 3);
}

/* One 256-value block of 16 weight rows, decoded; half h holds rows 8h..8h+7, row 8h + i in
 * lane i: q[u][h] the unsigned codes of quad u (values 4u..4u+3); sc[g][h] group g's scale;
 * mins[p][h] the int16 pair that meets the input sums' pair p (Q4_K, Q5_K: the mins of
 * sub-blocks 2p, 2p + 1 against sums of 32 values; Q6_K: the scales of groups 2p, 2p + 1
 * against sums of 16); d and dmin. The halves lie side by side: a 512-bit load takes both,
 * the 16 rows in its 16 lanes. */
typedef struct {
    __m256i q[64][2];
    __m256i sc[16][2];
    __m256i mins[8][2];
    __m256 d[2], dmin[2];
} tile_block;

/* out[t] lane i = 32-bit word t of in[i]. */
INLINE void transpose8(const __m256i in[8], __m256i out[8])
{
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(in[i], in[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(in[i], in[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);     /* words 0, 4 */
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]); /* words 1, 5 */
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int t = 0; t < 4; t++) {
        out[t] = _mm256_permute2x128_si256(b[t], b[4 + t], 0x20);
        out[t + 4] = _mm256_permute2x128_si256(b[t], b[4 + t], 0x31);
    }
}

/* The 32 bytes at offset at of the 8 rows' blocks, transposed (see transpose8). */
INLINE void load_transposed(const uint8_t *const blk[8], int at, __m256i out[8])
{
    __m256i v[8];
    for (int i = 0; i < 8; i++)
        v[i] = mm_load(blk[i] + at);
    transpose8(v, out);
}

/* 8 rows' halves at offset at as floats, lane i = row i's. */
INLINE __m256 halves8(const uint8_t *const blk[8], int at)
{
    return _mm256_cvtph_ps(_mm_setr_epi16(
        (short)rd16(blk[0] + at), (short)rd16(blk[1] + at), (short)rd16(blk[2] + at),
        (short)rd16(blk[3] + at), (short)rd16(blk[4] + at), (short)rd16(blk[5] + at),
        (short)rd16(blk[6] + at), (short)rd16(blk[7] + at)));
}

/* The scales of two groups from their int16 pair t (lane i = row i's; signed: Q6_K's), as
 * tile_rows takes them: with dpbusd each as an int32 (mullo), else in both halves of the
 * lane (madd). */
INLINE void tile_scales(__m256i t, const int is_signed, __m256i *out0, __m256i *out1)
{
    const __m256i low16 = _mm256_set1_epi32(0xffff);
#if defined(GK_VNNI)
    *out0 = is_signed ? _mm256_srai_epi32(_mm256_slli_epi32(t, 16), 16)
                      : _mm256_and_si256(t, low16);
    *out1 = is_signed ? _mm256_srai_epi32(t, 16) : _mm256_srli_epi32(t, 16);
#else
    (void)is_signed; /* the bits of each int16 are what madd reads */
    const __m256i a = _mm256_and_si256(t, low16), b = _mm256_srli_epi32(t, 16);
    *out0 = _mm256_or_si256(a, _mm256_slli_epi32(a, 16));
    *out1 = _mm256_or_si256(b, _mm256_slli_epi32(b, 16));
#endif
}

/* Block b of the 8 weight rows at w (rb bytes apart) into half h of tb. */
INLINE void tile_decode8(const int type, const uint8_t *w, int64_t rb, int64_t b, int h,
                         tile_block *tb)
{
    const int bytes = info(type).bytes;
    const uint8_t *blk[8];
    for (int i = 0; i < 8; i++)
        blk[i] = w + i * rb + b * bytes;
    __m256i v[8], t[8];
    if (type == T_Q6_K) {
        tb->d[h] = halves8(blk, 208);
        tb->dmin[h] = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++) /* the 16 scales as int16: 8 pairs of groups */
            v[i] = _mm256_cvtepi8_epi16(mm_load128(blk[i] + 192));
        transpose8(v, t);
        for (int p = 0; p < 8; p++) {
            tb->mins[p][h] = t[p];
            tile_scales(t[p], 1, &tb->sc[2 * p][h], &tb->sc[2 * p + 1][h]);
        }
        for (int half = 0; half < 2; half++) {
            __m256i l0[8], l1[8], hb[8];
            load_transposed(blk, 64 * half, l0);
            load_transposed(blk, 64 * half + 32, l1);
            load_transposed(blk, 128 + 32 * half, hb);
            for (int u = 0; u < 8; u++) { /* group j's quad u in q[32 half + 8 j + u] */
                __m256i c[4];
                q6_codes(l0[u], l1[u], hb[u], c);
                for (int j = 0; j < 4; j++)
                    tb->q[32 * half + 8 * j + u][h] = c[j];
            }
        }
        return;
    }
    tb->d[h] = halves8(blk, 0);
    tb->dmin[h] = halves8(blk, 2);
    for (int i = 0; i < 8; i++) /* 4 pairs of scales, then 4 pairs of mins */
        v[i] = scales_mins_k4(blk[i] + 4);
    transpose8(v, t);
    for (int p = 0; p < 4; p++) {
        tile_scales(t[p], 0, &tb->sc[2 * p][h], &tb->sc[2 * p + 1][h]);
        tb->mins[p][h] = t[4 + p];
    }
    const int five = type == T_Q5_K;
    __m256i hb[8] = {0};
    if (five)
        load_transposed(blk, 16, hb);
    for (int c = 0; c < 4; c++) { /* groups 2c, 2c + 1: quad u in q[16 c + u], q[16 c + 8 + u] */
        load_transposed(blk, 16 + 32 * five + 32 * c, v);
        for (int u = 0; u < 8; u++)
            k4_codes(five, v[u], hb[u], c, &tb->q[16 * c + u][h], &tb->q[16 * c + 8 + u][h]);
    }
}

/* What NR activation rows (x, xstride bytes apart) bring to block b: their codes xq, their
 * input sums' int16 pairs xp (as mins[p] meets them) and their scales dx. */
INLINE void tile_inputs(const int type, const uint8_t *x, int64_t xstride, int64_t k, int64_t b,
                        const int NR, const uint8_t **xq, int32_t (*xp)[8], float *dx)
{
    for (int r = 0; r < NR; r++) {
        const act_view xv = act_at(x + r * xstride, k, F_SUPER);
        xq[r] = (const uint8_t *)(xv.q + 256 * b);
        dx[r] = xv.d[b];
        const __m128i s0 = mm_load128(xv.s + 16 * b), s1 = mm_load128(xv.s + 16 * b + 8);
        if (type == T_Q6_K) {
            _mm_storeu_si128((__m128i *)xp[r], s0);
            _mm_storeu_si128((__m128i *)xp[r] + 1, s1);
        } else { /* sums of 32 values (at most 2 * 16 * 127) */
            _mm_storeu_si128((__m128i *)xp[r], _mm_hadd_epi16(s0, s1));
        }
    }
}

/* NR activation rows (x, xstride bytes apart) against the decoded block b: lane i's term of
 * half h added to y[r * ystride + 8h + i]. */
INLINE void tile_rows(const int type, const tile_block *tb, const uint8_t *x, int64_t xstride,
                      int64_t k, int64_t b, const int NR, float *y, int64_t ystride)
{
    const int groups = type == T_Q6_K ? 16 : 8, quads = 64 / groups;
    const int pairs = type == T_Q6_K ? 8 : 4;
    const uint8_t *xq[TILE_GROUP];
    int32_t xp[TILE_GROUP][8];
    float dx[TILE_GROUP];
    tile_inputs(type, x, xstride, k, b, NR, xq, xp, dx);
    __m256i S[2][TILE_GROUP];
    for (int r = 0; r < NR; r++)
        S[0][r] = S[1][r] = _mm256_setzero_si256();
#if defined(GK_VNNI)
    const int run = quads;
#else
    /* Quads whose maddubs pairs int16 holds added: codes up to 15, 31, 63 times inputs up to
     * 127 make pairs up to 3810, 7874, 16002. */
    const int run = type == T_Q4_K ? 8 : type == T_Q5_K ? 4 : 2;
#endif
#pragma GCC unroll 16
    for (int g = 0; g < groups; g++) {
#pragma GCC unroll 4
        for (int u0 = g * quads; u0 < (g + 1) * quads; u0 += run) {
            __m256i A[2][TILE_GROUP];
            for (int r = 0; r < NR; r++)
                A[0][r] = A[1][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int u = u0; u < u0 + run; u++) {
                const __m256i q0 = tb->q[u][0], q1 = tb->q[u][1];
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++)
                    add_quad(&A[0][r], &A[1][r], q0, q1,
                             _mm256_set1_epi32((int)rd32(xq[r] + 4 * u)));
            }
            for (int h = 0; h < 2; h++)
                for (int r = 0; r < NR; r++)
#if defined(GK_VNNI)
                    S[h][r] = _mm256_add_epi32(S[h][r],
                                               _mm256_mullo_epi32(A[h][r], tb->sc[g][h]));
#else
                    S[h][r] = DPWSSD(S[h][r], A[h][r], tb->sc[g][h]);
#endif
        }
    }
    for (int r = 0; r < NR; r++) {
        const __m256 dxv = _mm256_set1_ps(dx[r]);
        for (int h = 0; h < 2; h++) {
            __m256i M = _mm256_setzero_si256();
            for (int p = 0; p < pairs; p++)
                M = DPWSSD(M, tb->mins[p][h], _mm256_set1_epi32(xp[r][p]));
            __m256 term;
            if (type == T_Q6_K)
                term = _mm256_mul_ps(_mm256_mul_ps(tb->d[h], dxv),
                                     _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                         S[h][r], _mm256_slli_epi32(M, 5))));
            else
                term = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(tb->d[h], dxv), _mm256_cvtepi32_ps(S[h][r])),
                    _mm256_mul_ps(_mm256_mul_ps(tb->dmin[h], dxv), _mm256_cvtepi32_ps(M)));
            float *yr = y + r * ystride + 8 * h;
            _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), term));
        }
    }
}

#if defined(GK_ZMM)
/* tile_rows with the 16 weight rows in the 16 lanes of 512-bit registers (row i in lane i):
 * per quad and activation row one dpbusd where tile_rows takes two, per group one mullo,
 * and the float terms of the 16 rows at once; the same integers and, lane by lane, the same
 * float operations. A 400-token prompt of a SmolLM2-1.7B-shape Q4_K_M file on a 2-core
 * Xeon (Emerald Rapids, 3 runs each): 7.4-7.9 s with tile_rows, 5.3-6.4 s with this one,
 * 7.5-9.0 s with 4 rows at a time (TILE_GROUP_ZMM; 8 keep 8 chains of dpbusd going). */
INLINE void tile_rows_zmm(const int type, const tile_block *tb, const uint8_t *x,
                          int64_t xstride, int64_t k, int64_t b, const int NR, float *y,
                          int64_t ystride)
{
    const int groups = type == T_Q6_K ? 16 : 8, quads = 64 / groups;
    const int pairs = type == T_Q6_K ? 8 : 4;
    const uint8_t *xq[TILE_GROUP_ZMM];
    int32_t xp[TILE_GROUP_ZMM][8];
    float dx[TILE_GROUP_ZMM];
    tile_inputs(type, x, xstride, k, b, NR, xq, xp, dx);
    __m512i S[TILE_GROUP_ZMM];
    for (int r = 0; r < NR; r++)
        S[r] = _mm512_setzero_si512();
    /* The groups not unrolled: unrolled with the quads and rows, the tile's code outgrew
     * the instruction cache (76 KiB), and its sums went through the stack. */
#pragma GCC unroll 1
    for (int g = 0; g < groups; g++) {
        __m512i A[TILE_GROUP_ZMM];
        for (int r = 0; r < NR; r++)
            A[r] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int u = g * quads; u < (g + 1) * quads; u++) {
            const __m512i q = _mm512_loadu_si512(tb->q[u]);
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++)
                A[r] = _mm512_dpbusd_epi32(A[r], q, _mm512_set1_epi32((int)rd32(xq[r] + 4 * u)));
        }
        const __m512i sc = _mm512_loadu_si512(tb->sc[g]);
        for (int r = 0; r < NR; r++)
            S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(A[r], sc));
    }
    const __m512 d = _mm512_loadu_ps((const float *)tb->d);
    const __m512 dmin = _mm512_loadu_ps((const float *)tb->dmin);
    for (int r = 0; r < NR; r++) {
        const __m512 dxv = _mm512_set1_ps(dx[r]);
        __m512i M = _mm512_setzero_si512();
        for (int p = 0; p < pairs; p++)
            M = _mm512_dpwssd_epi32(M, _mm512_loadu_si512(tb->mins[p]),
                                    _mm512_set1_epi32(xp[r][p]));
        __m512 term;
        if (type == T_Q6_K)
            term = _mm512_mul_ps(_mm512_mul_ps(d, dxv), _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                            S[r], _mm512_slli_epi32(M, 5))));
        else
            term = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(d, dxv), _mm512_cvtepi32_ps(S[r])),
                                 _mm512_mul_ps(_mm512_mul_ps(dmin, dxv), _mm512_cvtepi32_ps(M)));
        float *yr = y + r * ystride;
        _mm512_storeu_ps(yr, _mm512_add_ps(_mm512_loadu_ps(yr), term));
    }
}
#define TILE_ROWS_FN tile_rows_zmm
#define TILE_GROUP_RUN TILE_GROUP_ZMM
#else
#define TILE_ROWS_FN tile_rows
#define TILE_GROUP_RUN TILE_GROUP
#endif

/* 16 weight rows (w, rb bytes apart) times R activation rows into y[r * ystride + i]. */
INLINE void super_tile_avx2(const int type, const uint8_t *w, int64_t rb, int64_t k,
                            const uint8_t *x, int64_t xstride, int64_t R, float *y,
                            int64_t ystride)
{
    tile_block tb;
    for (int64_t r = 0; r < R; r++)
        memset(y + r * ystride, 0, sizeof(float) * TILE_OUT);
    const int64_t nb = k / 256;
    for (int64_t b = 0; b < nb; b++) {
        tile_prefetch next = next_tile_share(w, rb, nb, b, R, TILE_GROUP_RUN);
        tile_decode8(type, w, rb, b, 0, &tb);
        tile_decode8(type, w + 8 * rb, rb, b, 1, &tb);
        int64_t r = 0;
        for (; r + TILE_GROUP_RUN <= R; r += TILE_GROUP_RUN) {
            prefetch_some(&next);
            TILE_ROWS_FN(type, &tb, x + r * xstride, xstride, k, b, TILE_GROUP_RUN,
                         y + r * ystride, ystride);
        }
        for (; r < R; r++) {
            prefetch_some(&next);
            TILE_ROWS_FN(type, &tb, x + r * xstride, xstride, k, b, 1, y + r * ystride, ystride);
        }
    }
}

/* ---- 32-value types as tiles ------------------------------------------------------------
 * The same layout for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: a block of 16 weight rows decoded
 * once into 8 quads a half (row i's 32-bit word u in lane i), then per activation row 8
 * broadcasts and 16 dpbusd, against the per-row loop's maddubs or dpbusd, three hadd and a
 * float combination per 8 blocks of every output. Without dpbusd (AVX2 alone) each dpbusd
 * is a maddubs whose int16 pairs are added over the block's quads (or half of them), then
 * one madd by ones; Q8_0, whose codes as unsigned bytes times 127 would overflow maddubs's
 * pairs, keeps the per-row loop there. Each block's term is small_term's float operations
 * for the 8 rows of a half at once, added to its lane (b % 8) of the row's outputs, and the
 * lanes' pairwise sum closes them: the reference's bits. */

/* One 32-value block of 16 weight rows, decoded: q[u][h] quad u (values 4u..4u+3) of rows
 * 8h..8h+7 as unsigned codes, one row in each lane; dw, mw the rows' scales and mins. The
 * halves lie side by side, as in tile_block. */
typedef struct {
    __m256i q[8][2];
    __m256 dw[2], mw[2];
} small_tile_block;

/* The value an unsigned code of a 32-value type stands above (s - offset * sum): Q8_0's
 * signed codes go to dpbusd as code + 128. */
INLINE int small_offset(const int type)
{
    return type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q8_0 ? 128 : 0;
}

/* Block b of the 8 weight rows at w (rb bytes apart) into half h of tb. */
INLINE void small_tile_decode8(const int type, const uint8_t *w, int64_t rb, int64_t b, int h,
                               small_tile_block *tb)
{
    const int bytes = info(type).bytes;
    const int min = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
    const int at = 2 + 2 * min + 4 * five; /* codes' offset */
    const uint8_t *blk[8];
    for (int i = 0; i < 8; i++)
        blk[i] = w + i * rb + b * bytes;
    tb->dw[h] = halves8(blk, 0);
    tb->mw[h] = min ? halves8(blk, 2) : _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    __m256i v[8];
    for (int i = 0; i < 8; i++) { /* values 0..15 in the low half, 16..31 in the high */
        if (type == T_Q8_0) {
            v[i] = _mm256_xor_si256(mm_load(blk[i] + 2), _mm256_set1_epi8((char)0x80));
            continue;
        }
        const __m128i raw = mm_load128(blk[i] + at);
        v[i] = pair128(_mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        if (five) {
            const uint32_t qh = rd32(blk[i] + at - 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
            /* byte u is value u: bit u of qh adds 16 (as in small_step_avx2) */
            v[i] = _mm256_mask_add_epi8(v[i], (__mmask32)qh, v[i], _mm256_set1_epi8(0x10));
#else
            v[i] = _mm256_or_si256(
                v[i], pair128(_mm256_castsi256_si128(high_bits(qh, qh, 0)),
                              _mm256_castsi256_si128(high_bits(qh, qh, 1))));
#endif
        }
    }
    __m256i t[8];
    transpose8(v, t);
    for (int u = 0; u < 8; u++)
        tb->q[u][h] = t[u];
}

/* NR activation rows (x, xstride bytes apart) against the decoded block b: lane i's term of
 * half h added to lane b % 8 of output 8h + i of each row, acc[(r * 8 + b % 8) * 16 + ...]. */
INLINE void small_tile_rows(const int type, const small_tile_block *tb, const uint8_t *x,
                            int64_t xstride, int64_t k, int64_t b, const int NR, float *acc)
{
    const int min = type == T_Q4_1 || type == T_Q5_1, offset = small_offset(type);
    const int64_t at = code_at(b, 0), slot = slot_at(b);
    __m256i S[2][TILE_GROUP];
    const int8_t *xq[TILE_GROUP];
    for (int r = 0; r < NR; r++) {
        xq[r] = act_at(x + r * xstride, k, F_SMALL).q + at;
        S[0][r] = S[1][r] = _mm256_setzero_si256();
    }
#if defined(GK_VNNI)
    const int run = 8;
#else
    /* Quads whose maddubs pairs int16 holds added: 4-bit codes up to 15 times inputs up to
     * 127 make pairs up to 3810 (8 quads: 30480), 5-bit codes up to 7874 (4 quads). */
    const int run = type == T_Q5_0 || type == T_Q5_1 ? 4 : 8;
    const __m256i ones = _mm256_set1_epi16(1);
#endif
#pragma GCC unroll 2
    for (int u0 = 0; u0 < 8; u0 += run) {
        __m256i A[2][TILE_GROUP];
        for (int r = 0; r < NR; r++)
            A[0][r] = A[1][r] = _mm256_setzero_si256();
        /* quad u: values 4u..4u+3, where code_at puts them */
#pragma GCC unroll 8
        for (int u = u0; u < u0 + run; u++) {
            const __m256i q0 = tb->q[u][0], q1 = tb->q[u][1];
            const int64_t off = u < 4 ? 4 * u : 32 + 4 * (u - 4);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                add_quad(&A[0][r], &A[1][r], q0, q1,
                         _mm256_set1_epi32((int)rd32((const uint8_t *)xq[r] + off)));
        }
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < NR; r++)
#if defined(GK_VNNI)
                S[h][r] = _mm256_add_epi32(S[h][r], A[h][r]);
#else
                S[h][r] = DPWSSD(S[h][r], A[h][r], ones);
#endif
    }
    for (int r = 0; r < NR; r++) {
        const act_view xv = act_at(x + r * xstride, k, F_SMALL);
        const int32_t sum = xv.s[slot];
        const __m256 dx = _mm256_set1_ps(xv.d[slot]);
        const __m256i shift = _mm256_set1_epi32(offset * sum);
        for (int h = 0; h < 2; h++) {
            __m256 term = _mm256_mul_ps(_mm256_mul_ps(tb->dw[h], dx),
                                        _mm256_cvtepi32_ps(_mm256_sub_epi32(S[h][r], shift)));
            if (min)
                term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_mul_ps(tb->mw[h], dx),
                                                         _mm256_set1_ps((float)sum)));
            float *lane = acc + (r * 8 + b % 8) * TILE_OUT + 8 * h;
            _mm256_storeu_ps(lane, _mm256_add_ps(_mm256_loadu_ps(lane), term));
        }
    }
}

#if defined(GK_ZMM)
/* small_tile_rows with the 16 weight rows in the 16 lanes of 512-bit registers, as
 * tile_rows_zmm: one dpbusd a quad and row, the float terms of the 16 rows at once. A
 * 300-token prompt of a SmolLM2-1.7B-shape Q4_0 file on a 2-core Xeon (Emerald Rapids), 8
 * runs each: 4.6-5.7 s (mean 5.1) against small_tile_rows' 4.0-6.9 (mean 5.5): about 7%
 * on the mean, within that machine's noise, so not a measured gain on its own. */
INLINE void small_tile_rows_zmm(const int type, const small_tile_block *tb, const uint8_t *x,
                                int64_t xstride, int64_t k, int64_t b, const int NR,
                                float *acc)
{
    const int min = type == T_Q4_1 || type == T_Q5_1, offset = small_offset(type);
    const int64_t at = code_at(b, 0), slot = slot_at(b);
    __m512i A[TILE_GROUP_ZMM];
    const int8_t *xq[TILE_GROUP_ZMM];
    for (int r = 0; r < NR; r++) {
        xq[r] = act_at(x + r * xstride, k, F_SMALL).q + at;
        A[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) { /* quad u: values 4u..4u+3, where code_at puts them */
        const __m512i q = _mm512_loadu_si512(tb->q[u]);
        const int64_t off = u < 4 ? 4 * u : 32 + 4 * (u - 4);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++)
            A[r] = _mm512_dpbusd_epi32(
                A[r], q, _mm512_set1_epi32((int)rd32((const uint8_t *)xq[r] + off)));
    }
    const __m512 dw = _mm512_loadu_ps((const float *)tb->dw);
    const __m512 mw = _mm512_loadu_ps((const float *)tb->mw);
    for (int r = 0; r < NR; r++) {
        const act_view xv = act_at(x + r * xstride, k, F_SMALL);
        const int32_t sum = xv.s[slot];
        const __m512 dx = _mm512_set1_ps(xv.d[slot]);
        __m512 term = _mm512_mul_ps(
            _mm512_mul_ps(dw, dx),
            _mm512_cvtepi32_ps(_mm512_sub_epi32(A[r], _mm512_set1_epi32(offset * sum))));
        if (min)
            term = _mm512_add_ps(term,
                                 _mm512_mul_ps(_mm512_mul_ps(mw, dx), _mm512_set1_ps((float)sum)));
        float *lane = acc + (r * 8 + b % 8) * TILE_OUT;
        _mm512_storeu_ps(lane, _mm512_add_ps(_mm512_loadu_ps(lane), term));
    }
}
#define SMALL_ROWS_FN small_tile_rows_zmm
#else
#define SMALL_ROWS_FN small_tile_rows
#endif

/* 16 weight rows (w, rb bytes apart) times R <= TILE_ROWS activation rows into
 * y[r * ystride + i]: every block's terms into its row's lanes, then the pairwise sums. */
INLINE void small_tile_avx2(const int type, const uint8_t *w, int64_t rb, int64_t k,
                            const uint8_t *x, int64_t xstride, int64_t R, float *y,
                            int64_t ystride)
{
    float acc[TILE_ROWS * 8 * TILE_OUT];
    memset(acc, 0, sizeof(float) * R * 8 * TILE_OUT);
    small_tile_block tb;
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < nb; b++) {
        tile_prefetch next = next_tile_share(w, rb, nb, b, R, TILE_GROUP_RUN);
        small_tile_decode8(type, w, rb, b, 0, &tb);
        small_tile_decode8(type, w + 8 * rb, rb, b, 1, &tb);
        int64_t r = 0;
        for (; r + TILE_GROUP_RUN <= R; r += TILE_GROUP_RUN) {
            prefetch_some(&next);
            SMALL_ROWS_FN(type, &tb, x + r * xstride, xstride, k, b, TILE_GROUP_RUN,
                          acc + r * 8 * TILE_OUT);
        }
        for (; r < R; r++) {
            prefetch_some(&next);
            SMALL_ROWS_FN(type, &tb, x + r * xstride, xstride, k, b, 1, acc + r * 8 * TILE_OUT);
        }
    }
    const int64_t padded = (nb + 7) / 8 * 8;
    for (int64_t r = 0; r < R; r++) {
        const float *a = acc + r * 8 * TILE_OUT;
        for (int h = 0; h < 2; h++) {
            __m256 l[8];
            for (int j = 0; j < 8; j++) { /* the reference adds +0 for the padding blocks */
                l[j] = _mm256_loadu_ps(a + j * TILE_OUT + 8 * h);
                if (nb % 8 && j >= nb % 8 && padded > nb)
                    l[j] = _mm256_add_ps(l[j], _mm256_setzero_ps());
            }
            for (int width = 4; width > 0; width /= 2) /* pairwise, as the reference */
                for (int j = 0; j < width; j++)
                    l[j] = _mm256_add_ps(l[j], l[j + width]);
            _mm256_storeu_ps(y + r * ystride + 8 * h, l[0]);
        }
    }
}

/* The fewest rows for which tiles beat the per-row loop (whose pass of RT rows decodes a
 * block once for 8 rows), on a Zen 4 EPYC, 2 threads, 8192 x 2048 (one copy, mostly in
 * cache), per-row against tiles: Q4_K 8 rows 1,140 against 1,200 us, 10 rows 1,830 against
 * 1,420 us, 32 rows 4,360 against 2,700 us; Q6_K, whose tile scales twice the groups, 9 rows
 * 1,290 against 1,370 us, 10 rows 1,480 against 1,370 us, 16 rows 1,960 against 1,730 us, 32
 * rows 3,870 against 3,040 us; Q4_0 4 rows 460 against 491 us, 8 rows 828 against 723 us,
 * 32 rows 3,300 against 2,100 us, 128 rows 13,200 against 8,300 us (Q5_0 even at 8 rows:
 * 996, 993 us); Q8_0 32 rows 3,570 against 2,330 us. */

/* Without dpbusd (Zen 3, one thread, 256 x 2048 in cache, per-row against tiles): Q4_K 9
 * rows 104.6 against 115.2 us, 10 rows 132.4 against 101.3, 32 rows 336.6 against 251.6;
 * Q5_K 10 rows 134.2 against 113.1, 64 rows 668.0 against 473.3; Q6_K, whose pairs int16
 * holds for only 2 quads, 16 rows 167.1 against 171.8, 24 rows 250.2 against 236.9, 32 rows
 * 331.7 against 301.5. The 32-value types' tiles (built for x86-64-v3 on a Xeon, one thread,
 * 8192 x 2048 from memory, per-row against tiles): Q4_0 8 rows 3,034-3,268 against
 * 2,625-2,643 us, 32 rows 10,336-15,239 against 8,112-8,409, 128 rows 42,795-56,915 against
 * 33,910-34,261; Q5_0 8 rows 3,338-3,499 against 3,309-3,342, 32 rows 13,712-14,063 against
 * 8,316-8,531. */
static int64_t tile_min_rows(int type)
{
#if defined(GK_VNNI)
    if (info(type).family == F_SMALL)
        return RT;
    return type == T_Q6_K ? RT + 2 : RT + 1;
#else
    if (info(type).family == F_SMALL)
        return type == T_Q8_0 ? INT64_MAX : RT;
    return type == T_Q6_K ? 24 : RT + 2;
#endif
}

/* Q4_K, Q5_K and Q6_K through super_tile_avx2. */
static void super_tile(int type, const uint8_t *w, int64_t rb, int64_t k, const uint8_t *x,
                       int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    if (type == T_Q4_K)
        super_tile_avx2(T_Q4_K, w, rb, k, x, xstride, R, y, ystride);
    else if (type == T_Q5_K)
        super_tile_avx2(T_Q5_K, w, rb, k, x, xstride, R, y, ystride);
    else
        super_tile_avx2(T_Q6_K, w, rb, k, x, xstride, R, y, ystride);
}

/* The 32-value types through small_tile_avx2 (Q8_0 only with dpbusd). */
static void small_tile(int type, const uint8_t *w, int64_t rb, int64_t k, const uint8_t *x,
                       int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    switch (type) {
#define CASE(t)                                                                                 \
    case t:                                                                                    \
        small_tile_avx2(t, w, rb, k, x, xstride, R, y, ystride);                               \
        return;
        CASE(T_Q4_0)
        CASE(T_Q4_1)
        CASE(T_Q5_0)
        CASE(T_Q5_1)
#if defined(GK_VNNI)
        CASE(T_Q8_0)
#endif
#undef CASE
    default:
        return;
    }
}

/* Tiles for the quantized types (each family's code compiled apart: sharing one function
 * made the compiler lay out Q4_K's tile 20% slower). */
static void quant_tile(int type, const uint8_t *w, int64_t rb, int64_t k, const uint8_t *x,
                       int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    if (info(type).family == F_SUPER)
        super_tile(type, w, rb, k, x, xstride, R, y, ystride);
    else
        small_tile(type, w, rb, k, x, xstride, R, y, ystride);
}
#define QUANT_TILE quant_tile

/* 32 float weights from w (type F32, F16 or BF16) at value i in 4 registers. */
INLINE void float_weights_avx2(const int type, const uint8_t *w, int64_t i, __m256 v[4])
{
    for (int c = 0; c < 4; c++) {
        const int64_t at = i + 8 * c;
        if (type == T_F32)
            v[c] = _mm256_loadu_ps((const float *)(const void *)w + at);
        else if (type == T_F16)
            v[c] = _mm256_cvtph_ps(mm_load128(w + 2 * at));
        else
            v[c] = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(mm_load128(w + 2 * at)), 16));
    }
}

/* Up to 2 rows (R2, a constant where inlined) of one output of a float type. */
INLINE void float_pair_avx2(const int type, const int R2, const uint8_t *w, int64_t k,
                            const float *x, int64_t xstride, float *y, int64_t ystride)
{
    __m256 acc[2][4];
    for (int r = 0; r < R2; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm256_setzero_ps();
    const int64_t whole = k - k % 32;
    for (int64_t i = 0; i < whole; i += 32) {
        __m256 v[4];
        float_weights_avx2(type, w, i, v);
        for (int r = 0; r < R2; r++)
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm256_add_ps(
                    acc[r][c], _mm256_mul_ps(v[c], _mm256_loadu_ps(x + r * xstride + i + 8 * c)));
    }
    if (whole < k) { /* the last values, padded with zeros (adding +0, as the reference) */
        float wt[32] = {0}, xt[2][32] = {{0}};
        for (int64_t i = whole; i < k; i++) {
            wt[i - whole] = float_weight(type, w, i);
            for (int r = 0; r < R2; r++)
                xt[r][i - whole] = x[r * xstride + i];
        }
        for (int r = 0; r < R2; r++)
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_loadu_ps(wt + 8 * c),
                                                                   _mm256_loadu_ps(xt[r] + 8 * c)));
    }
    for (int r = 0; r < R2; r++) {
        float lane[32];
        for (int c = 0; c < 4; c++)
            _mm256_storeu_ps(lane + 8 * c, acc[r][c]);
        y[r * ystride] = pairwise(lane, 32);
    }
}

INLINE void float_rows_avx2_(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                             int64_t xstride, const int64_t R, float *y, int64_t ystride)
{
    const float *xf = (const float *)(const void *)x;
    const int64_t fs = xstride / 4;
    int64_t r = 0;
    for (; r + 2 <= R; r += 2)
        float_pair_avx2(type, 2, w, k, xf + r * fs, fs, y + r * ystride, ystride);
    if (r < R)
        float_pair_avx2(type, 1, w, k, xf + r * fs, fs, y + r * ystride, ystride);
}

/* ---- activation quantization with AVX2: the portable code's operations, 8 at a time ---- */

/* The codes of 32 values (scale d = max|x| / 127, as quantize_block) into lo (values 0..15)
 * and hi (16..31); returns d, their sum in *sum. amax is the block's max |x| when given
 * (K types: over 256 values), else taken here. */
INLINE float quantize32_avx2(const float *x, float amax, int have_amax, int8_t *lo, int8_t *hi,
                             __m256i *sum)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int c = 0; c < 4; c++)
        v[c] = _mm256_loadu_ps(x + 8 * c);
    if (!have_amax) {
        const __m256 m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        amax = _mm_cvtss_f32(h);
    }
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int c = 0; c < 4; c++)
        q[c] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[c], id),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    /* packs interleave 128-bit lanes; the permute puts the 4-value runs back in order */
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                         _mm256_packs_epi32(q[2], q[3]));
    const __m256i codes = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128((__m128i *)lo, _mm256_castsi256_si128(codes));
    _mm_storeu_si128((__m128i *)hi, _mm256_extracti128_si256(codes, 1));
    return d;
}

static void quantize_row_avx2(int type, const float *x, int64_t k, uint8_t *out)
{
    const type_info t = info(type);
    if (t.family == F_SMALL) {
        const int64_t groups = (k / 32 + 7) / 8;
        memset(out, 0, gk_act_bytes(type, k));
        for (int64_t b = 0; b < k / 32; b++) {
            __m256i sum;
            const float d = quantize32_avx2(x + 32 * b, 0.0f, 0, (int8_t *)out + code_at(b, 0),
                                            (int8_t *)out + code_at(b, 16), &sum);
            const int16_t s = (int16_t)hsum_i32(sum);
            memcpy(out + 256 * groups + 4 * slot_at(b), &d, sizeof d);
            memcpy(out + 288 * groups + 2 * slot_at(b), &s, sizeof s);
        }
        return;
    }
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 256; b++) {
        const float *xb = x + 256 * b;
        __m256 m = _mm256_setzero_ps();
        for (int c = 0; c < 32; c++)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * c)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        int8_t *q = (int8_t *)out + 256 * b;
        float d = 0.0f;
        for (int j = 0; j < 8; j++) {
            __m256i sum;
            d = quantize32_avx2(xb + 32 * j, amax, 1, q + 32 * j, q + 32 * j + 16, &sum);
        }
        memcpy(out + k + 4 * b, &d, sizeof d);
        for (int g = 0; g < 16; g++) { /* the sums of 16 codes, from the codes themselves */
            const __m256i v = _mm256_cvtepi8_epi16(mm_load128(q + 16 * g));
            const int16_t s = (int16_t)hsum_i32(_mm256_madd_epi16(v, _mm256_set1_epi16(1)));
            memcpy(out + k + 4 * (k / 256) + 2 * (16 * b + g), &s, sizeof s);
        }
    }
    const int64_t used = k + 4 * (k / 256) + 2 * (k / 16);
    memset(out + used, 0, gk_act_bytes(type, k) - used);
}

/* One row (a decode step's usual call) and a full tile compiled apart, R a constant there. */
#define ONE_ROW_APART(fn)                                                                       \
    INLINE void fn(const int type, const uint8_t *w, int64_t k, const uint8_t *x,               \
                   int64_t xstride, int64_t R, float *y, int64_t ystride)                      \
    {                                                                                          \
        if (R == 1)                                                                            \
            fn##_(type, w, k, x, xstride, 1, y, ystride);                                      \
        else if (R == RT)                                                                      \
            fn##_(type, w, k, x, xstride, RT, y, ystride);                                     \
        else                                                                                   \
            fn##_(type, w, k, x, xstride, R, y, ystride);                                      \
    }
ONE_ROW_APART(small_rows_avx2)
ONE_ROW_APART(super_rows_avx2)
ONE_ROW_APART(float_rows_avx2)

#define SIMD_PATH 1
#define QUANTIZE_ROW quantize_row_avx2
#define SMALL_ROWS small_rows_avx2
#define SUPER_ROWS super_rows_avx2
#define FLOAT_ROWS float_rows_avx2
#endif /* GK_AVX2 */

/* ---- NEON ------------------------------------------------------------------------------- */
#if defined(GK_NEON)

/* Lanes of int32 sums of 16 signed products (codes q, inputs x). */
INLINE int32x4_t dot16(int32x4_t acc, int8x16_t q, int8x16_t x)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, q, x);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(q), vget_low_s8(x)));
    return vpadalq_s16(acc, vmull_high_s8(q, x));
#endif
}

/* 0x10 in byte j of (lo, hi) where bit j of qh is set. */
INLINE void high_bits_neon(uint32_t qh, uint8x16_t *lo, uint8x16_t *hi)
{
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t b16 = vdupq_n_u8(16);
    const uint8x16_t a = vcombine_u8(vdup_n_u8(qh & 255), vdup_n_u8((qh >> 8) & 255));
    const uint8x16_t b = vcombine_u8(vdup_n_u8((qh >> 16) & 255), vdup_n_u8(qh >> 24));
    *lo = vandq_u8(vtstq_u8(a, bit), b16);
    *hi = vandq_u8(vtstq_u8(b, bit), b16);
}

/* One group of up to 8 blocks (nblk) for R rows, as small_step_avx2: the blocks' integer
 * sums in slot order (even blocks, then odd), then each row's 8 lanes (acc[2r], acc[2r+1]). */
INLINE void small_step_neon(const int type, const int nblk, const uint8_t *blk, const uint8_t *x,
                            int64_t xstride, int64_t k, int64_t g, int64_t R, float32x4_t *acc)
{
    const int bytes = info(type).bytes;
    const int min = type == T_Q4_1 || type == T_Q5_1;
    const int five = type == T_Q5_0 || type == T_Q5_1;
    const uint8x16_t m4 = vdupq_n_u8(15);
    int8x16_t q[8][2]; /* slot order: block slot_block[l], values 0..15 and 16..31 */
    uint16_t dh[8], mh[8];
    for (int l = 0; l < 8; l++) {
        const int b = slot_block[l];
        q[l][0] = q[l][1] = vdupq_n_s8(0);
        dh[l] = mh[l] = 0;
        if (b >= nblk)
            continue;
        const uint8_t *p = blk + b * bytes;
        dh[l] = rd16(p);
        if (min)
            mh[l] = rd16(p + 2);
        if (type == T_Q8_0) {
            q[l][0] = vld1q_s8((const int8_t *)p + 2);
            q[l][1] = vld1q_s8((const int8_t *)p + 18);
            continue;
        }
        const uint8x16_t v = vld1q_u8(p + 2 + 2 * min + 4 * five);
        uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
        if (five) {
            uint8x16_t hl, hh;
            high_bits_neon(rd32(p + 2 + 2 * min), &hl, &hh);
            lo = vorrq_u8(lo, hl);
            hi = vorrq_u8(hi, hh);
        }
        q[l][0] = vreinterpretq_s8_u8(lo);
        q[l][1] = vreinterpretq_s8_u8(hi);
    }
    const uint16x8_t dv = vld1q_u16(dh), mv = vld1q_u16(mh);
    const float32x4_t dw[2] = {vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(dv))),
                               vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(dv)))};
    const float32x4_t mw[2] = {vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(mv))),
                               vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(mv)))};
    const int shift = type == T_Q4_0 ? 3 : type == T_Q5_0 ? 4 : -1;
    for (int64_t r = 0; r < R; r++) {
        const act_view xv = act_at(x + r * xstride, k, F_SMALL);
        const int8_t *xq = xv.q + 256 * g;
        int32x4_t p[8];
        for (int l = 0; l < 8; l++) {
            const int b = slot_block[l];
            const int8_t *xb = xq + b / 2 * 64 + b % 2 * 16;
            p[l] = vdupq_n_s32(0);
            if (b < nblk)
                p[l] = dot16(dot16(p[l], q[l][0], vld1q_s8(xb)), q[l][1], vld1q_s8(xb + 32));
        }
        for (int half = 0; half < 2; half++) {
            const int32x4_t *ph = p + 4 * half;
            int32x4_t s = vpaddq_s32(vpaddq_s32(ph[0], ph[1]), vpaddq_s32(ph[2], ph[3]));
            const int32x4_t sum = vmovl_s16(vld1_s16(xv.s + 8 * g + 4 * half));
            const float32x4_t dx = vld1q_f32(xv.d + 8 * g + 4 * half);
            if (shift > 0)
                s = vsubq_s32(s, vshlq_s32(sum, vdupq_n_s32(shift)));
            float32x4_t term = vmulq_f32(vmulq_f32(dw[half], dx), vcvtq_f32_s32(s));
            if (min)
                term = vaddq_f32(term, vmulq_f32(vmulq_f32(mw[half], dx), vcvtq_f32_s32(sum)));
            acc[2 * r + half] = vaddq_f32(acc[2 * r + half], term);
        }
    }
}

INLINE void small_rows_neon(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                            int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    const int bytes = info(type).bytes;
    const int64_t nb = k / 32, whole = nb / 8;
    float32x4_t acc[2 * RT];
    for (int64_t r = 0; r < 2 * R; r++)
        acc[r] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < whole; g++)
        small_step_neon(type, 8, w + 8 * g * bytes, x, xstride, k, g, R, acc);
    if (8 * whole < nb)
        small_step_neon(type, (int)(nb - 8 * whole), w + 8 * whole * bytes, x, xstride, k, whole,
                        R, acc);
    for (int64_t r = 0; r < R; r++) {
        float slot[8], lane[8];
        vst1q_f32(slot, acc[2 * r]);
        vst1q_f32(slot + 4, acc[2 * r + 1]);
        for (int l = 0; l < 8; l++)
            lane[slot_block[l]] = slot[l];
        y[r * ystride] = pairwise(lane, 8);
    }
}

INLINE void super_rows_neon(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                            int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    const int bytes = info(type).bytes;
    const uint8x16_t m4 = vdupq_n_u8(15);
    float acc[RT];
    for (int64_t r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + b * bytes;
        int8x16_t q[16]; /* codes, 16 values each */
        int32_t scale[16], mins[16];
        float d, dmin = 0.0f;
        if (type == T_Q6_K) {
            d = h2f(rd16(blk + 208));
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int g = 0; g < 16; g++)
                scale[g] = mins[g] = sc[g];
            const uint8x16_t m3 = vdupq_n_u8(0x30);
            for (int h = 0; h < 2; h++)
                for (int half = 0; half < 2; half++) {
                    const uint8_t *l = blk + 64 * h + 16 * half;
                    const uint8x16_t l0 = vld1q_u8(l), l1 = vld1q_u8(l + 32);
                    const uint8x16_t hb = vld1q_u8(blk + 128 + 32 * h + 16 * half);
                    const uint8x16_t v[4] = {
                        vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m3)),
                        vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hb, 2), m3)),
                        vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hb, m3)),
                        vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m3))};
                    for (int j = 0; j < 4; j++)
                        q[8 * h + 2 * j + half] = vreinterpretq_s8_u8(v[j]);
                }
        } else {
            d = h2f(rd16(blk));
            dmin = h2f(rd16(blk + 2));
            const int five = type == T_Q5_K;
            const uint8_t *qs = blk + 16 + 32 * five;
            for (int j = 0; j < 8; j++) {
                int sc, mn;
                scale_min_k4(blk + 4, j, &sc, &mn);
                scale[2 * j] = scale[2 * j + 1] = sc;
                mins[2 * j] = mins[2 * j + 1] = mn;
            }
            for (int c = 0; c < 4; c++)
                for (int half = 0; half < 2; half++) {
                    const uint8x16_t v = vld1q_u8(qs + 32 * c + 16 * half);
                    uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
                    if (five) {
                        const uint8x16_t hb = vld1q_u8(blk + 16 + 16 * half), b4 = vdupq_n_u8(16);
                        lo = vorrq_u8(lo, vandq_u8(vshlq_u8(hb, vdupq_n_s8(4 - 2 * c)), b4));
                        hi = vorrq_u8(hi, vandq_u8(vshlq_u8(hb, vdupq_n_s8(3 - 2 * c)), b4));
                    }
                    q[4 * c + half] = vreinterpretq_s8_u8(lo);
                    q[4 * c + 2 + half] = vreinterpretq_s8_u8(hi);
                }
        }
        for (int64_t r = 0; r < R; r++) {
            const act_view xv = act_at(x + r * xstride, k, F_SUPER);
            const int8_t *xq = xv.q + 256 * b;
            const int16_t *xs = xv.s + 16 * b;
            int32x4_t s = vdupq_n_s32(0);
            int32_t m = 0;
            for (int g = 0; g < 16; g++) {
                s = vmlaq_n_s32(s, dot16(vdupq_n_s32(0), q[g], vld1q_s8(xq + 16 * g)), scale[g]);
                m += mins[g] * xs[g];
            }
            acc[r] += super_term(type, d, dmin, xv.d[b], vaddvq_s32(s), m);
        }
    }
    for (int64_t r = 0; r < R; r++)
        y[r * ystride] = acc[r];
}

INLINE float32x4_t float4_neon(const int type, const uint8_t *w, int64_t at)
{
    if (type == T_F32)
        return vld1q_f32((const float *)(const void *)w + at);
    const uint16x4_t h = vld1_u16((const uint16_t *)(const void *)(w + 2 * at));
    if (type == T_F16)
        return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

INLINE void float_pair_neon(const int type, const int R2, const uint8_t *w, int64_t k,
                            const float *x, int64_t xstride, float *y, int64_t ystride)
{
    float32x4_t acc[2][8];
    for (int r = 0; r < R2; r++)
        for (int c = 0; c < 8; c++)
            acc[r][c] = vdupq_n_f32(0.0f);
    const int64_t whole = k - k % 32;
    for (int64_t i = 0; i < whole; i += 32) {
        float32x4_t v[8];
        for (int c = 0; c < 8; c++)
            v[c] = float4_neon(type, w, i + 4 * c);
        for (int r = 0; r < R2; r++)
            for (int c = 0; c < 8; c++)
                acc[r][c] =
                    vaddq_f32(acc[r][c], vmulq_f32(v[c], vld1q_f32(x + r * xstride + i + 4 * c)));
    }
    if (whole < k) {
        float wt[32] = {0}, xt[2][32] = {{0}};
        for (int64_t i = whole; i < k; i++) {
            wt[i - whole] = float_weight(type, w, i);
            for (int r = 0; r < R2; r++)
                xt[r][i - whole] = x[r * xstride + i];
        }
        for (int r = 0; r < R2; r++)
            for (int c = 0; c < 8; c++)
                acc[r][c] = vaddq_f32(acc[r][c],
                                      vmulq_f32(vld1q_f32(wt + 4 * c), vld1q_f32(xt[r] + 4 * c)));
    }
    for (int r = 0; r < R2; r++) {
        float lane[32];
        for (int c = 0; c < 8; c++)
            vst1q_f32(lane + 4 * c, acc[r][c]);
        y[r * ystride] = pairwise(lane, 32);
    }
}

INLINE void float_rows_neon(const int type, const uint8_t *w, int64_t k, const uint8_t *x,
                            int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    const float *xf = (const float *)(const void *)x;
    const int64_t fs = xstride / 4;
    int64_t r = 0;
    for (; r + 2 <= R; r += 2)
        float_pair_neon(type, 2, w, k, xf + r * fs, fs, y + r * ystride, ystride);
    if (r < R)
        float_pair_neon(type, 1, w, k, xf + r * fs, fs, y + r * ystride, ystride);
}

/* ---- activation quantization with NEON: the portable code's operations, 4 at a time ---- */

/* The codes of 32 values into lo (values 0..15) and hi (16..31), as quantize32_avx2. */
INLINE float quantize32_neon(const float *x, float amax, int have_amax, int8_t *lo, int8_t *hi,
                             int32_t *sum)
{
    float32x4_t v[8];
    for (int c = 0; c < 8; c++)
        v[c] = vld1q_f32(x + 4 * c);
    if (!have_amax) {
        float32x4_t m = vabsq_f32(v[0]);
        for (int c = 1; c < 8; c++)
            m = vmaxq_f32(m, vabsq_f32(v[c]));
        amax = vmaxvq_f32(m);
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32x4_t q[8];
    for (int c = 0; c < 8; c++)
        q[c] = vcvtnq_s32_f32(vmulq_n_f32(v[c], id));
    int32x4_t s = q[0];
    for (int c = 1; c < 8; c++)
        s = vaddq_s32(s, q[c]);
    *sum = vaddvq_s32(s);
    for (int half = 0; half < 2; half++) {
        const int32x4_t *h = q + 4 * half;
        const int16x8_t a = vcombine_s16(vqmovn_s32(h[0]), vqmovn_s32(h[1]));
        const int16x8_t b = vcombine_s16(vqmovn_s32(h[2]), vqmovn_s32(h[3]));
        vst1q_s8(half ? hi : lo, vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
    }
    return d;
}

static void quantize_row_neon(int type, const float *x, int64_t k, uint8_t *out)
{
    const type_info t = info(type);
    if (t.family == F_SMALL) {
        const int64_t groups = (k / 32 + 7) / 8;
        memset(out, 0, gk_act_bytes(type, k));
        for (int64_t b = 0; b < k / 32; b++) {
            int32_t sum;
            const float d = quantize32_neon(x + 32 * b, 0.0f, 0, (int8_t *)out + code_at(b, 0),
                                            (int8_t *)out + code_at(b, 16), &sum);
            const int16_t s = (int16_t)sum;
            memcpy(out + 256 * groups + 4 * slot_at(b), &d, sizeof d);
            memcpy(out + 288 * groups + 2 * slot_at(b), &s, sizeof s);
        }
        return;
    }
    for (int64_t b = 0; b < k / 256; b++) {
        const float *xb = x + 256 * b;
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int c = 0; c < 64; c++)
            m = vmaxq_f32(m, vabsq_f32(vld1q_f32(xb + 4 * c)));
        const float amax = vmaxvq_f32(m);
        int8_t *q = (int8_t *)out + 256 * b;
        float d = 0.0f;
        for (int j = 0; j < 8; j++) {
            int32_t sum;
            d = quantize32_neon(xb + 32 * j, amax, 1, q + 32 * j, q + 32 * j + 16, &sum);
        }
        memcpy(out + k + 4 * b, &d, sizeof d);
        for (int g = 0; g < 16; g++) {
            const int16_t s = (int16_t)vaddlvq_s8(vld1q_s8(q + 16 * g));
            memcpy(out + k + 4 * (k / 256) + 2 * (16 * b + g), &s, sizeof s);
        }
    }
    const int64_t used = k + 4 * (k / 256) + 2 * (k / 16);
    memset(out + used, 0, gk_act_bytes(type, k) - used);
}

#define SIMD_PATH 1
#define QUANTIZE_ROW quantize_row_neon
#define SMALL_ROWS small_rows_neon
#define SUPER_ROWS super_rows_neon
#define FLOAT_ROWS float_rows_neon
#endif /* GK_NEON */

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
 * waiting. Any thread gives an output the same bits. Steps of guided and static in turn in
 * one engine (omp_set_schedule), 2-core Xeon, median step of 59 each: Qwen2.5-1.5B-shape
 * Q4_0 at 32 sequences 374.5 against 407.7 ms, at one 67.6 against 70.3 ms;
 * SmolLM2-1.7B-shape Q4_K_M 463.4 against 473.7 and 80.5 against 88.6 ms (dynamic, one
 * chunk at a time: 401.4, 70.6, 496.5, 83.1 ms). */
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
