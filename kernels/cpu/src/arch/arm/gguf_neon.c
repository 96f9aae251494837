/* The GGUF kernels' NEON path on aarch64 (a part of gguf_kernels.c): one weight row by up
 * to RT activation rows for the 32-value, K and float types (sdot where the dotprod
 * extension is there, widening multiplies elsewhere), and activation quantization.
 */
#include "../../gguf_kernels.h"

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
#endif /* GK_NEON */
