/* The GGUF kernels' AVX2 path (a part of gguf_kernels.c; built where the compiler targets
 * AVX2 with F16C, also on AVX-512 CPUs): one weight row by up to RT activation rows for
 * the 32-value types (dpbusd where AVX-512 VNNI or AVX-VNNI is there), the K types and the
 * float types, and activation quantization. The tiles that take many rows at once are in
 * gguf_tiles.c.
 */
#include "../../gguf_kernels.h"

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
             * takes five (measurably faster on Q5_0, the type most of Gemma 3 1B's Q4_K_M
             * file falls back to). */
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
 * mullo: faster for one row, from cache and from memory. More rows keep super_lanes_avx2,
 * whose spread scales serve every row. */
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
 * took a large share of the row's time. */
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
#endif /* GK_AVX2 */
