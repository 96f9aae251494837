/* The GGUF kernels' tiles on x86 (a part of gguf_kernels.c, after gguf_avx2.c, whose helpers
 * they use): 16 weight rows by many activation rows, for the K types and the 32-value
 * types, what a prefill's products take (tile_min_rows says from how many rows). AVX2
 * alone adds maddubs's pairs; with AVX-512 VNNI or AVX-VNNI dpbusd takes their place; with
 * AVX-512 VNNI and BW the rows go in 512-bit registers (tile_rows_zmm, small_tile_rows_zmm).
 */
#include "../../gguf_kernels.h"

#if defined(GK_AVX2)

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
 * cache, and a block's share asked at once (53 lines of Q6_K) stalled on the queue of
 * misses. */
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
 * float operations. Faster than tile_rows on a prompt; 8 rows at a time (TILE_GROUP_ZMM)
 * keep 8 chains of dpbusd going, where 4 were no faster than tile_rows. */
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
 * tile_rows_zmm: one dpbusd a quad and row, the float terms of the 16 rows at once. Its
 * gain over small_tile_rows on a prompt was within the measuring machine's noise. */
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
 * block once for 8 rows), as measured per type with and without dpbusd
 * (docs/performance.md): Q6_K's tile scales twice the groups, and without dpbusd its pairs
 * int16 holds for only 2 quads, so it needs more rows; without dpbusd Q8_0 keeps the
 * per-row loop (see small_tile_avx2). */
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
 * made the compiler lay out Q4_K's tile slower). */
static void quant_tile(int type, const uint8_t *w, int64_t rb, int64_t k, const uint8_t *x,
                       int64_t xstride, int64_t R, float *y, int64_t ystride)
{
    if (info(type).family == F_SUPER)
        super_tile(type, w, rb, k, x, xstride, R, y, ystride);
    else
        small_tile(type, w, rb, k, x, xstride, R, y, ystride);
}
#endif /* GK_AVX2 */
