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
 * kernels on GPUs do. The sums' order differs from SDPA's, so the last bits may too.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Attend the group of query heads of kv head h over keys [begin, end) of one sequence;
 * partial[g] = (max, sum, acc[DIM]) for each query head g of the group. DIM and the pool's
 * kind are constants at each call, so the loops over DIM unroll into registers and each
 * load converts the one way the pool needs. */
static inline __attribute__((always_inline)) void
attend_span_v(const float *q, const void *kc, const void *vc, const int kind,
              const int32_t *table, int64_t begin, int64_t end, int64_t h, int64_t group,
              int64_t kv_heads, const int64_t DIM, int64_t block_size, float scale,
              float softcap, float *partial)
{
    const int64_t stride = DIM + 2, parts = DIM / 16, token_stride = kv_heads * DIM;
    for (int64_t g = 0; g < group; g++) {
        const float *qg = q + (h * group + g) * DIM;
        v16 qv[MAX_DIM / 16];
        for (int64_t c = 0; c < parts; c++)
            qv[c] = load16(qg + 16 * c);
        v16 acc[MAX_DIM / 16];
        for (int64_t c = 0; c < parts; c++)
            acc[c] = (v16){0};
        float top = -INFINITY, sum = 0.0f;
        for (int64_t at = begin; at < end;) {
            const int64_t block = table[at / block_size];
            const int64_t slot0 = at % block_size;
            int64_t count = block_size - slot0;
            if (count > end - at)
                count = end - at;
            if (count > 16)
                count = 16;
            /* The first key's and value's element in the pool (both share the layout). */
            const int64_t first = ((block * block_size + slot0) * kv_heads + h) * DIM;
            float scores[16];
            for (int64_t t = 0; t < 16; t++) {
                if (t >= count) {
                    scores[t] = -INFINITY;
                    continue;
                }
                v16 d = (v16){0};
                for (int64_t c = 0; c < parts; c++)
                    d += qv[c] * load16_kv(kc, first + t * token_stride + 16 * c, kind);
                float s = hsum16(d) * scale;
                if (softcap > 0.0f)
                    s = tanhf(s / softcap) * softcap;
                scores[t] = s;
            }
            float block_top = top;
            for (int64_t t = 0; t < count; t++)
                if (scores[t] > block_top)
                    block_top = scores[t];
            if (block_top > top) {
                const float rescale = top == -INFINITY ? 0.0f : expf(top - block_top);
                sum *= rescale;
                for (int64_t c = 0; c < parts; c++)
                    acc[c] *= rescale;
                top = block_top;
            }
            const v16 p = exp16(load16(scores) - top);
            float weights[16];
            memcpy(weights, &p, sizeof weights);
            for (int64_t t = 0; t < count; t++) {
                sum += weights[t];
                for (int64_t c = 0; c < parts; c++)
                    acc[c] += weights[t] * load16_kv(vc, first + t * token_stride + 16 * c, kind);
            }
            at += count;
        }
        float *part = partial + g * stride;
        part[0] = top;
        part[1] = sum;
        for (int64_t c = 0; c < parts; c++)
            memcpy(part + 2 + 16 * c, &acc[c], sizeof acc[c]);
    }
}

/* attend_span_v with the head size a constant for the common sizes (64, 128). */
static inline __attribute__((always_inline)) void
attend_span_kind(const float *q, const void *kc, const void *vc, const int kind,
                 const int32_t *table, int64_t begin, int64_t end, int64_t h, int64_t group,
                 int64_t kv_heads, int64_t dim, int64_t block_size, float scale, float softcap,
                 float *partial)
{
    switch (dim) {
    case 64:
        attend_span_v(q, kc, vc, kind, table, begin, end, h, group, kv_heads, 64, block_size,
                      scale, softcap, partial);
        return;
    case 128:
        attend_span_v(q, kc, vc, kind, table, begin, end, h, group, kv_heads, 128, block_size,
                      scale, softcap, partial);
        return;
    default:
        attend_span_v(q, kc, vc, kind, table, begin, end, h, group, kv_heads, dim, block_size,
                      scale, softcap, partial);
    }
}

/* attend_span_kind with the pool's kind a constant. */
static void attend_span(const float *q, const void *kc, const void *vc, int kind,
                        const int32_t *table, int64_t begin, int64_t end, int64_t h,
                        int64_t group, int64_t kv_heads, int64_t dim, int64_t block_size,
                        float scale, float softcap, float *partial)
{
    switch (kind) {
    case KV_FLOAT16:
        attend_span_kind(q, kc, vc, KV_FLOAT16, table, begin, end, h, group, kv_heads, dim,
                         block_size, scale, softcap, partial);
        return;
    case KV_BFLOAT16:
        attend_span_kind(q, kc, vc, KV_BFLOAT16, table, begin, end, h, group, kv_heads, dim,
                         block_size, scale, softcap, partial);
        return;
    default:
        attend_span_kind(q, kc, vc, KV_FLOAT32, table, begin, end, h, group, kv_heads, dim,
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

/* Each span's partial sums, heads * (dim + 2) floats a span, as a work-shared loop: inside a
 * parallel region the threads split the spans, outside it one thread does them all. */
static void decode_spans_for(const float *q, const void *kc, const void *vc, int64_t kind,
                             const int32_t *tables, int64_t table_width, const int64_t *seqs,
                             const int64_t *rows, const int64_t *first, const int64_t *lens,
                             const int64_t *starts, int64_t n, int64_t heads, int64_t kv_heads,
                             int64_t dim, int64_t block_size, float scale, float softcap,
                             float *partials)
{
    const int64_t group = heads / kv_heads, span = SPAN_BLOCKS * block_size;
    const int64_t tasks = starts[n], stride = dim + 2;
#pragma omp for schedule(static) collapse(2)
    for (int64_t task = 0; task < tasks; task++)
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t i = span_owner(starts, n, task);
            const int64_t begin = first[i] + (task - starts[i]) * span;
            const int64_t end = begin + span < lens[i] ? begin + span : lens[i];
            attend_span(q + rows[i] * heads * dim, kc, vc, (int)kind,
                        tables + seqs[i] * table_width, begin, end, h, group, kv_heads, dim,
                        block_size, scale, softcap, partials + (task * heads + h * group) * stride);
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
