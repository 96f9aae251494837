/* One packed step of a Llama-family decoder on the CPU, in one call (built by cpu_forward.py).
 *
 * transformers' modules cost a Python call, a tensor and a framework dispatch per operation:
 * a decode step of a small model is mostly that, and the threads are woken and put back to
 * sleep at every product. Here the whole stack runs inside one OpenMP parallel region: the
 * threads split each operation (the products' output chunks, the rows of the norms, the
 * attention's spans) and meet at a barrier after it, as llama.cpp's graph does.
 *
 * The layer is transformers' Llama decoder layer, operation for operation: RMSNorm (float32
 * sums), the q/k/v products (GGUF matrices through gguf_kernels.c, each input quantized
 * once per activation family), Qwen3's per-head q/k norms, rotary embeddings from the cos
 * and sin the model's own rotary module worked out, K/V stored into the paged pool (float32,
 * or float16/bfloat16 rounded to nearest even as torch rounds), causal paged attention
 * (cpu_attention.c's spans, a sliding window where the layer has one), the output product
 * added to the residual, RMSNorm, SiLU(gate) * up, and the down product added. A prompt's
 * row i reads keys 0..i of its sequence, those of this step included (stored before any
 * row reads them, so prompt and later decodes read the same rounded values); a decode row
 * goes through cpu_attention.c's spans, consecutive prompt rows through tiles that read
 * each key once for up to TILE_QUERIES queries. The last norm and the head run on the rows
 * that sample only.
 *
 * Gemma 2 and Gemma 3 (text) differ in their own places, each a field set only for them:
 * the embedding scaled by sqrt(hidden), norms after the attention and after the MLP as
 * well as before (their weights handed in as 1 + w, the product transformers' Gemma norm
 * forms), GELU (tanh) for SiLU, Gemma 3's own rotary table on its sliding layers, and
 * Gemma 2's soft-capped attention scores and logits.
 */
#include "gguf_kernels.c"
#include "cpu_attention.c"

/* A GGUF weight matrix [n, k] in its file's blocks; output i is file row order[i] when order
 * is set (llama.cpp's order of Llama's q and k rows), plus bias[i] when bias is set. */
typedef struct {
    const uint8_t *w;
    const float *bias;
    const int64_t *order;
    int64_t type, n, k;
} cf_matrix;

typedef struct {
    const float *attn_norm, *ffn_norm;
    const float *q_norm, *k_norm; /* [dim] each (Qwen3, Gemma 3), or NULL */
    const float *post_attn_norm, *post_ffn_norm; /* [hidden] each (Gemma), or NULL */
    cf_matrix q, k, v, o, gate, up, down;
    void *k_cache, *v_cache; /* [blocks, block_size, kv_heads, dim] of kv_kind */
    int64_t window;          /* a sliding window's keys, 0 for full attention */
    int64_t local_rope;      /* 1: the step's local cos and sin (Gemma 3's sliding layers) */
} cf_layer;

/* The MLP's activation of gate before it multiplies up. */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

typedef struct {
    const cf_layer *layer;
    cf_matrix embed, head;
    const float *final_norm;
    int64_t layers, hidden, heads, kv_heads, dim, inter;
    int64_t kv_kind, block_size, num_blocks;
    float eps, scale;
    int64_t act;                 /* ACT_SILU or ACT_GELU_TANH */
    float embed_scale;           /* the embedding's factor (Gemma), 0: none */
    float softcap, final_softcap; /* Gemma 2's caps of scores and logits, 0: none */
} cf_model;

/* One packed step: rows query tokens, row r of sequence seq[r] at position pos[r], its K/V
 * going to pool slot slot[r]; tables [sequences, table_width]; cos and sin [rows, dim]
 * (cos_local and sin_local too where a layer takes them, else NULL);
 * logits [kept, vocab] for the rows keep[0..kept-1]; threads to run it on (0, or more than
 * cf_max_threads: that many). */
typedef struct {
    const int64_t *ids, *pos, *seq, *slot, *keep;
    const int32_t *tables;
    const float *cos, *sin, *cos_local, *sin_local;
    float *logits;
    int64_t rows, table_width, kept, threads;
} cf_step;

/* An input's activation rows, quantized at most once per family (each thread keeps its own
 * flags: every thread takes the same path, so they agree). */
typedef struct {
    uint8_t *small, *super;
    int small_done, super_done;
} cf_acts;

/* Bytes of activation rows a family needs for width k (0 when k is not its blocks). */
static int64_t acts_bytes(int64_t rows, int64_t k)
{
    const int64_t small = k % 32 ? 0 : gk_act_bytes(T_Q8_0, k);
    const int64_t super = k % 256 ? 0 : gk_act_bytes(T_Q4_K, k);
    return rows * (small + super);
}

static cf_acts acts_at(uint8_t *at, int64_t rows, int64_t k)
{
    const int64_t small = k % 32 ? 0 : gk_act_bytes(T_Q8_0, k);
    return (cf_acts){at, at + rows * small, 0, 0};
}

/* y = x @ W.T (+ bias, in the matrix's output order), or add_to += that when add_to is set.
 * tmp holds [rows, n] floats when the matrix reorders or adds. */
static void linear_for(const cf_matrix *m, const float *x, cf_acts *a, int64_t rows, float *y,
                       float *tmp, float *add_to)
{
    const int family = info((int)m->type).family;
    const uint8_t *xq = (const uint8_t *)x;
    if (family != F_FLOAT) {
        int *done = family == F_SMALL ? &a->small_done : &a->super_done;
        uint8_t *buf = family == F_SMALL ? a->small : a->super;
        if (!*done)
            quantize_for((int)m->type, x, rows, m->k, buf);
        *done = 1;
        xq = buf;
    }
    const int direct = !m->order && !m->bias && !add_to;
    float *out = direct ? y : tmp;
    matmul_for((int)m->type, m->w, m->n, m->k, xq, rows, out);
    if (direct)
        return;
    const int64_t n = m->n;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *src = out + r * n;
        float *dst = add_to ? add_to + r * n : y + r * n;
        for (int64_t i = 0; i < n; i++) {
            float v = src[m->order ? m->order[i] : i];
            if (m->bias)
                v = v + m->bias[i];
            dst[i] = add_to ? dst[i] + v : v;
        }
    }
}

/* transformers' RMSNorm of one row: w * (x * rsqrt(mean(x^2) + eps)), float32 sums. */
static inline void rms_row(const float *x, const float *w, float *y, int64_t n, float eps)
{
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += x[i + j] * x[i + j];
    float sum = 0.0f;
    for (int j = 0; j < 8; j++)
        sum += lane[j];
    for (; i < n; i++)
        sum += x[i] * x[i];
    const float inv = 1.0f / sqrtf(sum / (float)n + eps);
    for (i = 0; i < n; i++)
        y[i] = w[i] * (x[i] * inv);
}

static void rms_for(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps)
{
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        rms_row(x + r * n, w, y + r * n, n, eps);
}

/* transformers' rotary embedding of one head: x * cos + rotate_half(x) * sin. */
static inline void rope_head(float *x, const float *cos, const float *sin, int64_t dim)
{
    const int64_t half = dim / 2;
    float rotated[MAX_DIM];
    for (int64_t i = 0; i < half; i++) {
        rotated[i] = x[i] * cos[i] - x[i + half] * sin[i];
        rotated[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
    memcpy(x, rotated, sizeof(float) * dim);
}

/* A float rounded to float16 bits, to nearest even (torch's .to(torch.float16)). */
static inline uint16_t to_half(float f)
{
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#elif defined(NEON_HALF)
    const float16x4_t h = vcvt_f16_f32(vdupq_n_f32(f));
    return vget_lane_u16(vreinterpret_u16_f16(h), 0);
#else
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or NaN (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x477ff000u) /* rounds past the largest half: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal half: a subnormal or zero */
        float magnitude;
        memcpy(&magnitude, &abs, sizeof magnitude);
        return (uint16_t)(sign | (uint32_t)rintf(magnitude * 16777216.0f));
    }
    const uint32_t lsb = (abs >> 13) & 1u;
    return (uint16_t)(sign | ((abs - 0x38000000u + 0xfffu + lsb) >> 13));
#endif
}

/* A float rounded to bfloat16 bits, to nearest even (NaN kept quiet), as torch rounds. */
static inline uint16_t to_bfloat(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* n values of src stored at element `at` of a pool of this kind. */
static inline void store_row(void *pool, int64_t at, const float *src, int64_t n, int64_t kind)
{
    if (kind == KV_FLOAT32) {
        memcpy((float *)pool + at, src, sizeof(float) * n);
        return;
    }
    uint16_t *dst = (uint16_t *)pool + at;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kind == KV_FLOAT16 ? to_half(src[i]) : to_bfloat(src[i]);
}

/* Per row: Qwen3's head norms, rotary embeddings on q and k, and k and v into their slot. */
static void rope_store_for(const cf_model *m, const cf_layer *L, const cf_step *s, float *q,
                           float *k, const float *v)
{
    const int64_t dim = m->dim, qw = m->heads * dim, kw = m->kv_heads * dim;
    const float *cos_all = L->local_rope ? s->cos_local : s->cos;
    const float *sin_all = L->local_rope ? s->sin_local : s->sin;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s->rows; r++) {
        const float *cos = cos_all + r * dim, *sin = sin_all + r * dim;
        for (int64_t h = 0; h < m->heads; h++) {
            float *x = q + r * qw + h * dim;
            if (L->q_norm)
                rms_row(x, L->q_norm, x, dim, m->eps);
            rope_head(x, cos, sin, dim);
        }
        for (int64_t h = 0; h < m->kv_heads; h++) {
            float *x = k + r * kw + h * dim;
            if (L->k_norm)
                rms_row(x, L->k_norm, x, dim, m->eps);
            rope_head(x, cos, sin, dim);
        }
        if (s->slot[r] < 0)
            continue;
        store_row(L->k_cache, s->slot[r] * kw, k + r * kw, kw, m->kv_kind);
        store_row(L->v_cache, s->slot[r] * kw, v + r * kw, kw, m->kv_kind);
    }
}

/* Queries a prompt tile attends at once (rows times the kv head's group of query heads):
 * each key and value is converted once per tile, not once per query row. */
#define TILE_QUERIES 32

/* 8 floats: one AVX2 register, two NEON ones. The tile's loops use them rather than the
 * 16-float vectors of cpu_attention.c, which gcc spills through memory on AVX2. */
typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p)
{
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Causal attention for a tile of n consecutive prompt rows of one sequence (rows r0.., at
 * positions pos0..) and the query heads of kv head h: row i sees keys from its window's
 * start to pos0 + i. Online softmax per query head over blocks of up to 16 keys, converted
 * to float32 once for the whole tile (the keys transposed, so a query's 16 scores are dim
 * vector multiply-adds); out rows [r0, r0 + n) of that group of heads. */
static void attend_tile(const float *q, const void *kc, const void *vc, int64_t kind,
                        const int32_t *table, int64_t r0, int64_t n, int64_t pos0,
                        int64_t window, int64_t h, int64_t group, int64_t heads,
                        int64_t kv_heads, int64_t dim, int64_t block_size, float scale,
                        float softcap, float *out)
{
    const int64_t queries = n * group, token_stride = kv_heads * dim, parts = dim / 8;
    float top[TILE_QUERIES], sum[TILE_QUERIES];
    int64_t first_key[TILE_QUERIES] = {0};
    static _Thread_local v8 acc[TILE_QUERIES * (MAX_DIM / 8)];
    for (int64_t j = 0; j < queries; j++) {
        top[j] = -INFINITY;
        sum[j] = 0.0f;
        for (int64_t c = 0; c < parts; c++)
            acc[j * parts + c] = (v8){0};
        const int64_t pos = pos0 + j / group, from = window > 0 ? pos - window + 1 : 0;
        first_key[j] = from > 0 ? from : 0;
    }
    const int64_t start = first_key[0], end = pos0 + n;
    float keys_t[MAX_DIM][16], values[16][MAX_DIM];
    for (int64_t at = start; at < end;) {
        const int64_t block = table[at / block_size], slot0 = at % block_size;
        int64_t count = block_size - slot0;
        count = count < end - at ? count : end - at;
        count = count < 16 ? count : 16;
        const int64_t base = ((block * block_size + slot0) * kv_heads + h) * dim;
        for (int64_t t = 0; t < 16; t++)
            for (int64_t c = 0; c < dim / 16; c++) {
                v16 key = (v16){0}, value = (v16){0};
                if (t < count) {
                    key = load16_kv(kc, base + t * token_stride + 16 * c, (int)kind);
                    value = load16_kv(vc, base + t * token_stride + 16 * c, (int)kind);
                }
                float lanes[16];
                memcpy(lanes, &key, sizeof lanes);
                memcpy(values[t] + 16 * c, &value, sizeof value);
                for (int e = 0; e < 16; e++)
                    keys_t[16 * c + e][t] = lanes[e];
            }
        for (int64_t j = 0; j < queries; j++) {
            const int64_t i = j / group, g = j % group, pos = pos0 + i;
            const float *qj = q + (r0 + i) * heads * dim + (h * group + g) * dim;
            /* four independent sums (keys 0..7 and 8..15, even and odd head values) */
            v8 lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0};
            for (int64_t d = 0; d < dim; d += 2) {
                lo0 += qj[d] * load8(keys_t[d]);
                hi0 += qj[d] * load8(keys_t[d] + 8);
                lo1 += qj[d + 1] * load8(keys_t[d + 1]);
                hi1 += qj[d + 1] * load8(keys_t[d + 1] + 8);
            }
            const v8 lo = lo0 + lo1, hi = hi0 + hi1;
            float scores[16], block_top = top[j];
            memcpy(scores, &lo, sizeof lo);
            memcpy(scores + 8, &hi, sizeof hi);
            for (int64_t t = 0; t < 16; t++) {
                const int64_t key = at + t;
                if (t >= count || key > pos || key < first_key[j]) {
                    scores[t] = -INFINITY;
                    continue;
                }
                scores[t] *= scale;
                if (softcap > 0.0f) /* as cpu_attention.c's spans */
                    scores[t] = tanhf(scores[t] / softcap) * softcap;
                block_top = scores[t] > block_top ? scores[t] : block_top;
            }
            if (block_top == -INFINITY)
                continue; /* no visible key in this block for this query */
            v8 *a = acc + j * parts;
            if (block_top > top[j]) {
                const float rescale = top[j] == -INFINITY ? 0.0f : expf(top[j] - block_top);
                sum[j] *= rescale;
                for (int64_t c = 0; c < parts; c++)
                    a[c] *= rescale;
                top[j] = block_top;
            }
            const v16 p = exp16(load16(scores) - top[j]);
            float weights[16];
            memcpy(weights, &p, sizeof weights);
            for (int64_t t = 0; t < count; t++)
                if (scores[t] != -INFINITY)
                    sum[j] += weights[t];
            for (int64_t c = 0; c < parts; c++) {
                v8 v = a[c];
                for (int64_t t = 0; t < count; t++)
                    if (scores[t] != -INFINITY)
                        v += weights[t] * load8(values[t] + 8 * c);
                a[c] = v;
            }
        }
        at += count;
    }
    for (int64_t j = 0; j < queries; j++) {
        const int64_t i = j / group, g = j % group;
        float *o = out + (r0 + i) * heads * dim + (h * group + g) * dim;
        for (int64_t c = 0; c < parts; c++) {
            const v8 v = sum[j] > 0.0f ? acc[j * parts + c] / sum[j] : (v8){0};
            memcpy(o + 8 * c, &v, sizeof v);
        }
    }
}

/* Floats each step buffer holds, in the order cf_forward lays them out. */
typedef struct {
    float *x, *h, *q, *k, *v, *att, *gate, *up, *tmp, *partials;
    int64_t *first, *lens, *rows, *starts, *tile_row, *tile_len;
    uint8_t *acts_hidden, *acts_att, *acts_inter;
    int64_t singles, tiles; /* this layer's decode rows and prompt tiles */
} cf_buffers;

static void *take(uint8_t **at, int64_t bytes)
{
    void *p = *at;
    *at += (bytes + 63) & ~(int64_t)63;
    return p;
}

/* The step's buffers in one allocation (NULL when memory is short); *block to free. */
static cf_buffers buffers(const cf_model *m, const cf_step *s, int64_t tasks, void **block)
{
    const int64_t R = s->rows, qw = m->heads * m->dim, kw = m->kv_heads * m->dim;
    const int64_t widest = m->hidden > qw ? (m->inter > m->hidden ? m->inter : m->hidden)
                                          : (m->inter > qw ? m->inter : qw);
    int64_t vocab = m->head.n > widest ? m->head.n : widest;
    const int64_t sizes[] = {
        4 * R * m->hidden, 4 * R * m->hidden, 4 * R * qw, 4 * R * kw, 4 * R * kw, 4 * R * qw,
        4 * R * m->inter, 4 * R * m->inter, 4 * R * vocab,
        4 * (tasks * m->heads * (m->dim + 2) + 1), 8 * R, 8 * R, 8 * R, 8 * (R + 1),
        acts_bytes(R, m->hidden), acts_bytes(R, qw), acts_bytes(R, m->inter), 8 * R, 8 * R,
    };
    int64_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += (sizes[i] + 63) & ~(int64_t)63;
    cf_buffers b = {0};
    uint8_t *at = *block = aligned_alloc(64, (size_t)total);
    if (!at)
        return b;
    b.x = take(&at, sizes[0]);
    b.h = take(&at, sizes[1]);
    b.q = take(&at, sizes[2]);
    b.k = take(&at, sizes[3]);
    b.v = take(&at, sizes[4]);
    b.att = take(&at, sizes[5]);
    b.gate = take(&at, sizes[6]);
    b.up = take(&at, sizes[7]);
    b.tmp = take(&at, sizes[8]);
    b.partials = take(&at, sizes[9]);
    b.first = take(&at, sizes[10]);
    b.lens = take(&at, sizes[11]);
    b.rows = take(&at, sizes[12]);
    b.starts = take(&at, sizes[13]);
    b.acts_hidden = take(&at, sizes[14]);
    b.acts_att = take(&at, sizes[15]);
    b.acts_inter = take(&at, sizes[16]);
    b.tile_row = take(&at, sizes[17]);
    b.tile_len = take(&at, sizes[18]);
    return b;
}

/* Split the step's rows for attention: a row alone in its sequence's run (a decode) goes
 * to the spans of cpu_attention.c, which also split one long context across the threads;
 * runs of consecutive prompt rows go in tiles of up to TILE_QUERIES queries. */
static void plan_attention(const cf_model *m, const cf_layer *L, const cf_step *s,
                           cf_buffers *b)
{
    const int64_t group = m->heads / m->kv_heads;
    const int64_t most = TILE_QUERIES / group > 0 ? TILE_QUERIES / group : 1;
    b->singles = b->tiles = 0;
    for (int64_t r = 0; r < s->rows;) {
        int64_t run = 1;
        while (r + run < s->rows && s->seq[r + run] == s->seq[r] &&
               s->pos[r + run] == s->pos[r] + run)
            run++;
        if (run == 1 || most == 1) {
            for (int64_t i = r; i < r + run; i++) {
                const int64_t n = b->singles++;
                b->rows[n] = i;
                b->lens[n] = s->pos[i] + 1;
                const int64_t from = L->window > 0 ? b->lens[n] - L->window : 0;
                b->first[n] = from > 0 ? from : 0;
            }
        } else {
            for (int64_t i = r; i < r + run; i += most) {
                b->tile_row[b->tiles] = i;
                b->tile_len[b->tiles++] = r + run - i < most ? r + run - i : most;
            }
        }
        r += run;
    }
    decode_spans(b->first, b->lens, b->singles, m->block_size, b->starts);
}

/* SiLU, or GELU's tanh form in the order of torch's CPU kernel (approximate="tanh"). */
static inline float activated(int64_t act, float g)
{
    if (act == ACT_GELU_TANH) {
        const float beta = 0.7978845608028654f, kappa = 0.044715f; /* sqrt(2 / pi) */
        return 0.5f * g * (1.0f + tanhf(beta * (g + kappa * (g * g * g))));
    }
    return g / (1.0f + expf(-g));
}

/* The residual rows b->x plus a product's output: added as it comes, or (Gemma) normed by
 * norm first, in b->h, which no later part of the layer reads before it is written again. */
static void add_output(const cf_model *m, const cf_matrix *w, const float *in, cf_acts *a,
                       int64_t rows, const float *norm, cf_buffers *b)
{
    if (!norm) {
        linear_for(w, in, a, rows, NULL, b->tmp, b->x);
        return;
    }
    linear_for(w, in, a, rows, b->h, b->tmp, NULL);
    const int64_t n = m->hidden;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        rms_row(b->h + r * n, norm, b->h + r * n, n, m->eps);
        for (int64_t i = r * n; i < (r + 1) * n; i++)
            b->x[i] = b->x[i] + b->h[i];
    }
}

/* One decoder layer on the step's residual rows b->x. */
static void layer_for(const cf_model *m, const cf_layer *L, const cf_step *s, cf_buffers *b)
{
    const int64_t R = s->rows, qw = m->heads * m->dim;
    rms_for(b->x, L->attn_norm, b->h, R, m->hidden, m->eps);
    cf_acts in = acts_at(b->acts_hidden, R, m->hidden);
    linear_for(&L->q, b->h, &in, R, b->q, b->tmp, NULL);
    linear_for(&L->k, b->h, &in, R, b->k, b->tmp, NULL);
    linear_for(&L->v, b->h, &in, R, b->v, b->tmp, NULL);
    rope_store_for(m, L, s, b->q, b->k, b->v);
#pragma omp single
    plan_attention(m, L, s, b); /* the single's barrier: every thread sees the plan */
    decode_spans_for(b->q, L->k_cache, L->v_cache, m->kv_kind, s->tables, s->table_width,
                     s->seq, b->rows, b->first, b->lens, b->starts, b->singles, m->heads,
                     m->kv_heads, m->dim, m->block_size, m->scale, m->softcap, b->partials);
    decode_merge_for(b->partials, b->rows, b->starts, b->singles, m->heads, m->dim, b->att);
    const int64_t group = m->heads / m->kv_heads;
#pragma omp for schedule(dynamic) collapse(2)
    for (int64_t t = 0; t < b->tiles; t++)
        for (int64_t h = 0; h < m->kv_heads; h++) {
            const int64_t r0 = b->tile_row[t];
            attend_tile(b->q, L->k_cache, L->v_cache, m->kv_kind, s->tables + s->seq[r0] * s->table_width,
                        r0, b->tile_len[t], s->pos[r0], L->window, h, group, m->heads,
                        m->kv_heads, m->dim, m->block_size, m->scale, m->softcap, b->att);
        }
    cf_acts att = acts_at(b->acts_att, R, qw);
    add_output(m, &L->o, b->att, &att, R, L->post_attn_norm, b);
    rms_for(b->x, L->ffn_norm, b->h, R, m->hidden, m->eps);
    cf_acts mlp = acts_at(b->acts_hidden, R, m->hidden);
    linear_for(&L->gate, b->h, &mlp, R, b->gate, b->tmp, NULL);
    linear_for(&L->up, b->h, &mlp, R, b->up, b->tmp, NULL);
    const int64_t inter = m->inter;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = r * inter; i < (r + 1) * inter; i++)
            b->gate[i] = activated(m->act, b->gate[i]) * b->up[i];
    cf_acts down = acts_at(b->acts_inter, R, inter);
    add_output(m, &L->down, b->gate, &down, R, L->post_ffn_norm, b);
}

/* The threads a step runs on by default: the OpenMP runtime's count for the calling thread
 * (OMP_NUM_THREADS, else the cores it may use); 1 where the library built without OpenMP. */
int cf_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Run the step; logits of the kept rows into s->logits. Returns 0; -1 when memory is short
 * or the shapes are beyond the kernels; having changed nothing, -2 when a block table names
 * a block outside the pool or a slot lies outside it, -3 when a token id is outside the
 * vocabulary, -4 when a kept row is not a row of the step. */
int cf_forward(const cf_model *m, const cf_step *s)
{
    const int64_t R = s->rows, kept = s->kept;
    if (!decode_takes(m->kv_kind, m->heads, m->kv_heads, m->dim) || m->dim % 2)
        return -1;
    if (R <= 0)
        return 0;
    for (int64_t r = 0; r < R; r++) {
        if (s->ids[r] < 0 || s->ids[r] >= m->embed.n)
            return -3;
        if (s->slot[r] >= m->num_blocks * m->block_size)
            return -2;
    }
    for (int64_t j = 0; j < kept; j++)
        if (s->keep[j] < 0 || s->keep[j] >= R)
            return -4;
    /* Every row reads keys 0..pos of its table: check them once for all layers. */
    int64_t *zeros = calloc((size_t)R, sizeof(int64_t)), *lens = malloc(sizeof(int64_t) * R);
    if (!zeros || !lens) {
        free(zeros);
        free(lens);
        return -1;
    }
    for (int64_t r = 0; r < R; r++)
        lens[r] = s->pos[r] + 1;
    const int ok = blocks_in_pool(s->tables, s->table_width, s->seq, zeros, lens, R,
                                  m->block_size, m->num_blocks);
    int64_t *starts = malloc(sizeof(int64_t) * (R + 1));
    const int64_t tasks = starts ? decode_spans(zeros, lens, R, m->block_size, starts) : 0;
    free(starts);
    free(zeros);
    free(lens);
    if (!ok)
        return -2;
    void *block = NULL;
    cf_buffers b = buffers(m, s, tasks, &block);
    if (!block)
        return -1;
    const int64_t rb = gk_row_bytes((int)m->embed.type, m->hidden);
    const int most = cf_max_threads();
    const int threads = s->threads > 0 && s->threads < most ? (int)s->threads : most;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            float *x = b.x + r * m->hidden;
            dequantize_row((int)m->embed.type, m->embed.w + s->ids[r] * rb, m->hidden, x);
            if (m->embed_scale != 0.0f)
                for (int64_t i = 0; i < m->hidden; i++)
                    x[i] = x[i] * m->embed_scale;
        }
        for (int64_t l = 0; l < m->layers; l++)
            layer_for(m, &m->layer[l], s, &b);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < kept; j++)
            rms_row(b.x + s->keep[j] * m->hidden, m->final_norm, b.h + j * m->hidden, m->hidden,
                    m->eps);
        cf_acts last = acts_at(b.acts_hidden, kept, m->hidden);
        linear_for(&m->head, b.h, &last, kept, s->logits, b.tmp, NULL);
        if (m->final_softcap > 0.0f) {
            const int64_t vocab = m->head.n;
#pragma omp for schedule(static)
            for (int64_t j = 0; j < kept; j++)
                for (int64_t i = j * vocab; i < (j + 1) * vocab; i++)
                    s->logits[i] = tanhf(s->logits[i] / m->final_softcap) * m->final_softcap;
        }
    }
    free(block);
    return 0;
}
