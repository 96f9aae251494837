/* Decode attention over the paged KV pool on the CPU (built by cpu_attention.py).
 *
 * Queries and outputs are float32; the pool holds float32, float16 or bfloat16 keys and
 * values, converted to float32 as they are loaded (F16C or AVX-512 on x86, NEON on ARM,
 * plain C elsewhere; bfloat16 is a shift), and every sum is a float32 one. A 16-bit pool
 * halves the bytes a long context reads, which is what decode attention waits on.
 * Each decoding sequence has one query row of `heads` heads; its keys and values stay in
 * their pool blocks [block, slot, kv_head, dim] and are read in place, block by block, with
 * no gathered copy (what the torch path spends most of a long context's time on). A
 * sequence's keys are cut into spans of SPAN_BLOCKS blocks so one long sequence keeps
 * every core busy; each span keeps a running maximum, sum and weighted value sum per head
 * (online softmax), and the spans of a sequence are merged at the end, as split-K decoding
 * kernels on GPUs do. A work item is a span and up to ITEM_HEADS query heads, read a token
 * at a time across its heads (see attend_item_v), which roughly halved a step of many
 * sequences. The sums' order differs from SDPA's, so the last bits may too.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) || (defined(__ARM_NEON) && defined(__ARM_FP) && (__ARM_FP & 2))
#include <arm_neon.h>
#define NEON_HALF 1
#endif

/* The 16-float vectors pass only between static inline functions, so gcc's note that their
 * ABI differs without AVX-512 concerns no caller. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* Blocks one task reads: 16 blocks of 16 tokens is 256 keys. */
#define SPAN_BLOCKS 16
/* The widest head the accumulators hold (in registers of 16 floats). */
#define MAX_DIM 256

/* 16 floats: gcc and clang map it onto one AVX-512 register, two AVX2 ones, or four NEON. */
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
/* 16 halves (float16 or bfloat16 bits), and the same widened to 32 bits. */
typedef uint16_t h16v __attribute__((vector_size(32)));
typedef uint32_t u16v __attribute__((vector_size(64)));

/* What the pool holds (cpu_attention.py passes it): one kernel per kind, each converting
 * as it loads. */
enum { KV_FLOAT32 = 0, KV_FLOAT16 = 1, KV_BFLOAT16 = 2 };

/* 16 floats from p, aligned or not. */
static inline v16 load16(const float *p)
{
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One IEEE half as a float, exactly (every half is a float); for CPUs without conversions. */
static inline float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) /* infinity, or NaN made quiet as the hardware conversions do */
        bits = sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u);
    else if (exponent != 0) /* normal: rebias 15 -> 127 */
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else { /* zero or subnormal: mantissa * 2^-24, exact in a float */
        const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* 16 float16 values from p as floats. */
static inline v16 load16_f16(const uint16_t *p)
{
    v16 v;
#if defined(__AVX512F__)
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&v, &x, sizeof v);
#elif defined(__F16C__)
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    memcpy(&v, &lo, sizeof lo);
    memcpy((char *)&v + sizeof lo, &hi, sizeof hi);
#elif defined(NEON_HALF)
    for (int j = 0; j < 4; j++) {
        const float32x4_t x = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * j)));
        memcpy((char *)&v + sizeof x * j, &x, sizeof x);
    }
#else
    float lanes[16];
    for (int j = 0; j < 16; j++)
        lanes[j] = half_to_float(p[j]);
    memcpy(&v, lanes, sizeof v);
#endif
    return v;
}

/* 16 bfloat16 values from p as floats: a bfloat16 is a float's top 16 bits. */
static inline v16 load16_bf16(const uint16_t *p)
{
    h16v h;
    memcpy(&h, p, sizeof h);
    const u16v bits = __builtin_convertvector(h, u16v) << 16;
    v16 v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* 16 values of a pool of this kind from element `at` of base, as floats. kind is a
 * constant where it is inlined, so only one branch is left. */
static inline __attribute__((always_inline)) v16 load16_kv(const void *base, int64_t at,
                                                           const int kind)
{
    if (kind == KV_FLOAT16)
        return load16_f16((const uint16_t *)base + at);
    if (kind == KV_BFLOAT16)
        return load16_bf16((const uint16_t *)base + at);
    return load16((const float *)base + at);
}

/* The sum of the 16 lanes, in lane order. */
static inline float hsum16(v16 v)
{
    float lanes[16];
    memcpy(lanes, &v, sizeof lanes);
    float sum = 0.0f;
    for (int j = 0; j < 16; j++)
        sum += lanes[j];
    return sum;
}

/* Lanes of a where mask (a comparison's all-ones lanes) is set, else of b. */
static inline v16 select16(i16v mask, v16 a, v16 b)
{
    i16v ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    const i16v bits = (ia & mask) | (ib & ~mask);
    v16 out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* exp(x) for 16 lanes: within 1 ulp of glibc's expf for every float x in [-87, 0] (checked
 * one by one; softmax weights only need x <= 0); below -87.3 (and -inf) 0. Range reduction
 * by ln 2 in two parts (Cody-Waite), then Cephes' degree-6 polynomial. */
static inline v16 exp16(v16 x)
{
    const v16 zero = {0};
    const i16v tiny = x < -87.3f;
    x = select16(x > 88.3f, zero + 88.3f, select16(tiny, zero, x));
    /* n = round(x / ln 2) through the float magic number 1.5 * 2^23 */
    const v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const v16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    v16 p = zero + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const i16v bits = (__builtin_convertvector(n, i16v) + 127) << 23;
    v16 two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return select16(tiny, zero, p * two_n);
}

/* Query heads one work item attends: their dot products, weights and sums stay on the
 * thread's stack (about 33 KiB at MAX_DIM). */
#define ITEM_HEADS 32

/* Two 16-float vectors' lanes picked by 16 constant indices (0-15 from a, 16-31 from b). */
#if defined(__clang__)
#define SHUFFLE16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE16(a, b, ...) __builtin_shuffle(a, b, (i16v){__VA_ARGS__})
#endif

/* Lane t of the result is the sum of d[t]'s 16 lanes: a tree of shuffles and adds, each
 * level halving the lanes a token keeps, instead of 16 horizontal sums. */
static inline v16 sum16x16(const v16 *d)
{
    v16 x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7: token 2i, 8-15: token 2i + 1 */
        x[i] = SHUFFLE16(d[2 * i], d[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20,
                         21, 22, 23) +
               SHUFFLE16(d[2 * i], d[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                         28, 29, 30, 31);
    for (int i = 0; i < 4; i++) /* four lanes for each of tokens 4i .. 4i + 3 */
        y[i] = SHUFFLE16(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                         25, 26, 27) +
               SHUFFLE16(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                         29, 30, 31);
    for (int i = 0; i < 2; i++) /* two lanes for each of tokens 8i .. 8i + 7 */
        z[i] = SHUFFLE16(y[2 * i], y[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24,
                         25, 28, 29) +
               SHUFFLE16(y[2 * i], y[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26,
                         27, 30, 31);
    return SHUFFLE16(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SHUFFLE16(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* Attend query heads [q0, q1) (at most ITEM_HEADS) of one sequence over keys [begin, end);
 * partial[j - q0] = (max, sum, acc[DIM]) for query head j. Keys and values are read a token
 * at a time across the item's heads, each token's run of them contiguous in the pool:
 * reading one head at a time strides kv_heads * DIM elements from key to key, a page with
 * 32 kv heads of 64, where the hardware prefetchers stop. Each head's sums do not depend
 * on the other heads of its item. DIM and the pool's kind are constants at each call, so
 * the loops over DIM unroll into registers and each load converts the one way it needs. */
static inline __attribute__((always_inline)) void
attend_item_v(const float *q, const void *kc, const void *vc, const int kind,
              const int32_t *table, int64_t begin, int64_t end, int64_t q0, int64_t q1,
              int64_t group, int64_t kv_heads, const int64_t DIM, int64_t block_size,
              float scale, float softcap, float *partial)
{
    const int64_t parts = DIM / 16, n = q1 - q0, token_stride = kv_heads * DIM;
    const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v16 dots[ITEM_HEADS][16], weights[ITEM_HEADS], acc[ITEM_HEADS][MAX_DIM / 16];
    float top[ITEM_HEADS], sum[ITEM_HEADS];
    for (int64_t j = 0; j < n; j++) {
        top[j] = -INFINITY;
        sum[j] = 0.0f;
        for (int64_t c = 0; c < parts; c++)
            acc[j][c] = (v16){0};
        for (int64_t t = 0; t < 16; t++)
            dots[j][t] = (v16){0};
    }
    for (int64_t at = begin; at < end;) {
        const int64_t block = table[at / block_size];
        const int64_t slot0 = at % block_size;
        int64_t count = block_size - slot0;
        if (count > end - at)
            count = end - at;
        if (count > 16)
            count = 16;
        /* The first key's and value's element in the pool (both share the layout). */
        const int64_t first = (block * block_size + slot0) * token_stride;
        for (int64_t t = 0; t < count; t++) {
            for (int64_t j = q0; j < q1;) {
                const int64_t h = j / group, last = (h + 1) * group < q1 ? (h + 1) * group : q1;
                v16 k[MAX_DIM / 16];
                for (int64_t c = 0; c < parts; c++)
                    k[c] = load16_kv(kc, first + t * token_stride + h * DIM + 16 * c, kind);
                for (; j < last; j++) {
                    v16 d = (v16){0};
                    for (int64_t c = 0; c < parts; c++)
                        d += load16(q + j * DIM + 16 * c) * k[c];
                    dots[j - q0][t] = d;
                }
            }
        }
        for (int64_t j = 0; j < n; j++) {
            v16 s = sum16x16(dots[j]) * scale;
            if (softcap > 0.0f)
                for (int64_t t = 0; t < count; t++)
                    s[t] = tanhf(s[t] / softcap) * softcap;
            s = select16(lane < (float)count, s, (v16){0} - INFINITY);
            float block_top = top[j];
            for (int64_t t = 0; t < count; t++)
                if (s[t] > block_top)
                    block_top = s[t];
            if (block_top > top[j]) {
                const float rescale = top[j] == -INFINITY ? 0.0f : expf(top[j] - block_top);
                sum[j] *= rescale;
                for (int64_t c = 0; c < parts; c++)
                    acc[j][c] *= rescale;
                top[j] = block_top;
            }
            weights[j] = exp16(s - top[j]);
            for (int64_t t = 0; t < count; t++)
                sum[j] += weights[j][t];
        }
        for (int64_t t = 0; t < count; t++) {
            for (int64_t j = q0; j < q1;) {
                const int64_t h = j / group, last = (h + 1) * group < q1 ? (h + 1) * group : q1;
                v16 v[MAX_DIM / 16];
                for (int64_t c = 0; c < parts; c++)
                    v[c] = load16_kv(vc, first + t * token_stride + h * DIM + 16 * c, kind);
                for (; j < last; j++) {
                    const float w = weights[j - q0][t];
                    for (int64_t c = 0; c < parts; c++)
                        acc[j - q0][c] += w * v[c];
                }
            }
        }
        at += count;
    }
    for (int64_t j = 0; j < n; j++) {
        float *part = partial + j * (DIM + 2);
        part[0] = top[j];
        part[1] = sum[j];
        for (int64_t c = 0; c < parts; c++)
            memcpy(part + 2 + 16 * c, &acc[j][c], sizeof acc[j][c]);
    }
}

/* attend_item_v with the head size a constant for the common sizes (64, 128). */
static inline __attribute__((always_inline)) void
attend_item_kind(const float *q, const void *kc, const void *vc, const int kind,
                 const int32_t *table, int64_t begin, int64_t end, int64_t q0, int64_t q1,
                 int64_t group, int64_t kv_heads, int64_t dim, int64_t block_size, float scale,
                 float softcap, float *partial)
{
    switch (dim) {
    case 64:
        attend_item_v(q, kc, vc, kind, table, begin, end, q0, q1, group, kv_heads, 64,
                      block_size, scale, softcap, partial);
        return;
    case 128:
        attend_item_v(q, kc, vc, kind, table, begin, end, q0, q1, group, kv_heads, 128,
                      block_size, scale, softcap, partial);
        return;
    default:
        attend_item_v(q, kc, vc, kind, table, begin, end, q0, q1, group, kv_heads, dim,
                      block_size, scale, softcap, partial);
    }
}

/* attend_item_kind with the pool's kind a constant. */
static void attend_item(const float *q, const void *kc, const void *vc, int kind,
                        const int32_t *table, int64_t begin, int64_t end, int64_t q0,
                        int64_t q1, int64_t group, int64_t kv_heads, int64_t dim,
                        int64_t block_size, float scale, float softcap, float *partial)
{
    switch (kind) {
    case KV_FLOAT16:
        attend_item_kind(q, kc, vc, KV_FLOAT16, table, begin, end, q0, q1, group, kv_heads, dim,
                         block_size, scale, softcap, partial);
        return;
    case KV_BFLOAT16:
        attend_item_kind(q, kc, vc, KV_BFLOAT16, table, begin, end, q0, q1, group, kv_heads,
                         dim, block_size, scale, softcap, partial);
        return;
    default:
        attend_item_kind(q, kc, vc, KV_FLOAT32, table, begin, end, q0, q1, group, kv_heads, dim,
                         block_size, scale, softcap, partial);
    }
}

/* Whether every block the sequences read is in the pool and in their tables' width. */
static int blocks_in_pool(const int32_t *tables, int64_t table_width, const int64_t *seqs,
                          const int64_t *first, const int64_t *lens, int64_t n,
                          int64_t block_size, int64_t num_blocks)
{
    for (int64_t i = 0; i < n; i++) {
        if (first[i] < 0 || lens[i] > table_width * block_size)
            return 0;
        const int32_t *table = tables + seqs[i] * table_width;
        for (int64_t b = first[i] / block_size; b * block_size < lens[i]; b++)
            if (table[b] < 0 || table[b] >= num_blocks)
                return 0;
    }
    return 1;
}

/* Cut each sequence's keys into spans of up to SPAN_BLOCKS blocks: sequence i's spans are
 * starts[i] .. starts[i + 1] - 1 (starts holds n + 1 entries). Returns how many in all. */
static int64_t decode_spans(const int64_t *first, const int64_t *lens, int64_t n,
                            int64_t block_size, int64_t *starts)
{
    const int64_t span = SPAN_BLOCKS * block_size;
    starts[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t keys = lens[i] - first[i];
        starts[i + 1] = starts[i] + (keys > 0 ? (keys + span - 1) / span : 0);
    }
    return starts[n];
}

/* The sequence a span belongs to: the last i with starts[i] <= task (binary search, as a
 * prefill step has a sequence per query row). */
static inline int64_t span_owner(const int64_t *starts, int64_t n, int64_t task)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (starts[mid] <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Query heads a work item takes: whole groups of a kv head, at most ITEM_HEADS, and few
 * enough that each thread gets two items where the spans alone are too few. The same in
 * every thread of the region. */
static int64_t item_heads(int64_t tasks, int64_t heads, int64_t group)
{
#ifdef _OPENMP
    const int64_t threads = omp_get_num_threads();
#else
    const int64_t threads = 1;
#endif
    int64_t items = tasks > 0 ? (2 * threads + tasks - 1) / tasks : 1;
    if (items > heads)
        items = heads;
    int64_t size = (heads + items - 1) / items;
    if (group > ITEM_HEADS)
        return size < ITEM_HEADS ? size : ITEM_HEADS;
    size = (size + group - 1) / group * group;
    return size < ITEM_HEADS ? size : ITEM_HEADS / group * group;
}

/* Each span's partial sums, heads * (dim + 2) floats a span, as a work-shared loop: inside a
 * parallel region the threads split the spans' items, outside it one thread does them all. */
static void decode_spans_for(const float *q, const void *kc, const void *vc, int64_t kind,
                             const int32_t *tables, int64_t table_width, const int64_t *seqs,
                             const int64_t *rows, const int64_t *first, const int64_t *lens,
                             const int64_t *starts, int64_t n, int64_t heads, int64_t kv_heads,
                             int64_t dim, int64_t block_size, float scale, float softcap,
                             float *partials)
{
    const int64_t group = heads / kv_heads, span = SPAN_BLOCKS * block_size;
    const int64_t tasks = starts[n], stride = dim + 2;
    const int64_t size = item_heads(tasks, heads, group), items = (heads + size - 1) / size;
#pragma omp for schedule(static) collapse(2)
    for (int64_t task = 0; task < tasks; task++)
        for (int64_t item = 0; item < items; item++) {
            const int64_t i = span_owner(starts, n, task);
            const int64_t begin = first[i] + (task - starts[i]) * span;
            const int64_t end = begin + span < lens[i] ? begin + span : lens[i];
            const int64_t q0 = item * size, q1 = q0 + size < heads ? q0 + size : heads;
            attend_item(q + rows[i] * heads * dim, kc, vc, (int)kind,
                        tables + seqs[i] * table_width, begin, end, q0, q1, group, kv_heads,
                        dim, block_size, scale, softcap, partials + (task * heads + q0) * stride);
        }
}

/* Merge each sequence's spans into out[rows[i], head, :] (zeros for one with no keys), as a
 * work-shared loop like decode_spans_for's. */
static void decode_merge_for(const float *partials, const int64_t *rows, const int64_t *starts,
                             int64_t n, int64_t heads, int64_t dim, float *out)
{
    const int64_t stride = dim + 2;
#pragma omp for schedule(static) collapse(2)
    for (int64_t i = 0; i < n; i++)
        for (int64_t head = 0; head < heads; head++) {
            float *o = out + (rows[i] * heads + head) * dim;
            float top = -INFINITY;
            for (int64_t task = starts[i]; task < starts[i + 1]; task++) {
                const float m = partials[(task * heads + head) * stride];
                if (m > top)
                    top = m;
            }
            float sum = 0.0f;
            for (int64_t d = 0; d < dim; d++)
                o[d] = 0.0f;
            for (int64_t task = starts[i]; task < starts[i + 1]; task++) {
                const float *part = partials + (task * heads + head) * stride;
                if (part[0] == -INFINITY)
                    continue;
                const float weight = expf(part[0] - top);
                sum += part[1] * weight;
                for (int64_t d = 0; d < dim; d++)
                    o[d] += part[2 + d] * weight;
            }
            for (int64_t d = 0; d < dim; d++)
                o[d] = sum > 0.0f ? o[d] / sum : 0.0f;
        }
}

/* Whether the shape and the pool's kind are within the kernel's limits. */
static int decode_takes(int64_t kind, int64_t heads, int64_t kv_heads, int64_t dim)
{
    if (dim % 16 || dim > MAX_DIM || kv_heads <= 0 || heads % kv_heads)
        return 0;
    return kind == KV_FLOAT32 || kind == KV_FLOAT16 || kind == KV_BFLOAT16;
}

/* out[rows[i], head, :] for each decoding sequence i: its query q[rows[i]] [heads, dim] over
 * keys first[i] .. lens[i] - 1 of the blocks in tables[seqs[i]] (row stride table_width) of
 * a pool of num_blocks blocks whose keys kc and values vc are of `kind` (KV_FLOAT32,
 * KV_FLOAT16, KV_BFLOAT16). softcap <= 0: none. dim must be a multiple of 16, at most
 * MAX_DIM. Returns 0; -1 when a shape or kind is beyond those limits or memory for the
 * partial sums is short (the caller then takes the torch path); -2, having read nothing,
 * when a block table names a block outside the pool. */
int paged_decode(const float *q, const void *kc, const void *vc, int64_t kind,
                 const int32_t *tables, int64_t table_width, int64_t num_blocks,
                 const int64_t *seqs, const int64_t *rows, const int64_t *first,
                 const int64_t *lens, int64_t n, int64_t heads, int64_t kv_heads, int64_t dim,
                 int64_t block_size, float scale, float softcap, float *out)
{
    if (!decode_takes(kind, heads, kv_heads, dim))
        return -1;
    if (!blocks_in_pool(tables, table_width, seqs, first, lens, n, block_size, num_blocks))
        return -2;
    int64_t *starts = malloc(sizeof(int64_t) * (n + 1));
    if (!starts)
        return -1;
    const int64_t tasks = decode_spans(first, lens, n, block_size, starts);
    float *partials = malloc(sizeof(float) * (tasks * heads * (dim + 2) + 1));
    if (!partials) {
        free(starts);
        return -1;
    }
#pragma omp parallel
    {
        decode_spans_for(q, kc, vc, kind, tables, table_width, seqs, rows, first, lens, starts,
                         n, heads, kv_heads, dim, block_size, scale, softcap, partials);
        decode_merge_for(partials, rows, starts, n, heads, dim, out);
    }
    free(partials);
    free(starts);
    return 0;
}
