/* The GGUF kernels' portable C (a part of gguf_kernels.c): the rows' sizes, activation
 * quantization, dequantization (GGUF's own float expressions), and the reference products
 * that every SIMD path matches bit for bit, which also run where no SIMD path exists.
 */
#include "gguf_kernels.h"

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
