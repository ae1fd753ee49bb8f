/* specchat's CPU attention step: rope, the KV cache write and attention for T new tokens in one
 * call (AVX2 + FMA). Built with int4_avx2.c by engine/quant/cpu_kernel.py, with -ffp-contract=off
 * so that every written expression rounds as written.
 *
 * For new rows t = 0..T-1 at positions start + t, with qkv [T, (H + 2 KV) d] (q heads, k heads,
 * v heads) and cos, sin [T, d] (the model's rotary tables):
 *
 *   rope:    x'[j] = x[j] cos[j] + (-x[j + d/2]) sin[j]   (j < d/2)
 *            x'[j] = x[j] cos[j] + x[j - d/2] sin[j]      (j >= d/2)
 *            (rotate_half, with torch's rounding: a product, a product, a sum)
 *   cache:   k'[t], v[t] are written to kbuf, vbuf [KV, cap, d] at position start + t, as fp16 (rounded to
 *            nearest even, F16C's vcvtps2ph): half the bytes of fp32, and from a few hundred cached tokens
 *            on, reading them is most of the step; attention reads them back through vcvtph2ps (exact)
 *   attend:  out[t, h] = sum_{j <= start + t} softmax_j(scale q'[t, h] . k[g(h), j]) v[g(h), j],
 *            g(h) = h / (H / KV) (grouped-query attention)
 *
 * Row exactness: out[t, h] is computed by one thread with the same instructions in the same order
 * whatever T and the thread count are, so a verify pass gives each row the numbers a one-token
 * step at that position gives (greedy speculation stays token-identical to plain decoding).
 * A job takes several query heads of one KV group side by side (each key and value read once for
 * them, and their dot products' chains interleaved); which heads share a job never changes a head's
 * instructions, so it changes no bits either.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "simd_math.h"

#define MAX_HEAD_DIM 256

static __thread float *t_p = NULL; /* one row's scores, then weights */
static __thread size_t t_p_cap = 0;

/* One head of rope in place (d values, cos and sin of the row). */
static inline void rope(float *x, const float *cos, const float *sin, int64_t d) {
    float tmp[MAX_HEAD_DIM];
    const int64_t half = d / 2;
    memcpy(tmp, x, sizeof(float) * (size_t)d);
    for (int64_t j = 0; j < half; j++) {
        const float a = tmp[j] * cos[j];
        const float b = -tmp[j + half] * sin[j];
        x[j] = a + b;
    }
    for (int64_t j = half; j < d; j++) {
        const float a = tmp[j] * cos[j];
        const float b = tmp[j - half] * sin[j];
        x[j] = a + b;
    }
}

/* 8 fp16 values to fp32 (exact). */
static inline __m256 half8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* d fp32 values (d % 8 == 0) to fp16, rounded to nearest even. */
static inline void to_half(uint16_t *dst, const float *src, int64_t d) {
    for (int64_t c = 0; c < d; c += 8)
        _mm_storeu_si128((__m128i *)(dst + c), _mm256_cvtps_ph(_mm256_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT));
}

#define HEADS_MAX 8 /* query heads one job attends with at most (one KV group's, or part of it) */

/* hsum8 of 4 vectors at once, [hsum8(a[0]), ..., hsum8(a[3])]: the same sums in the same pairs (lanes l and l + 4,
 * then l and l + 2, then l and l + 1; a + b is b + a bit for bit), so the same bits in fewer instructions. */
static inline __m128 hsum8x4(const __m256 *a) {
    const __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(a[0], a[1], 0x20), _mm256_permute2f128_ps(a[0], a[1], 0x31));
    const __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(a[2], a[3], 0x20), _mm256_permute2f128_ps(a[2], a[3], 0x31));
    const __m256 y = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2))); /* keys 0 2 | 1 3, 2 each */
    const __m256 z = _mm256_add_ps(y, _mm256_shuffle_ps(y, y, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 2, 6, 0, 0, 0, 0)));
}

/* The scores of NH (<= 4) query rows q (d apart) over keys k [n, d] into p (rows n + 8 apart), scaled, and their
 * maxima: each head's dot with each key in its own chain (mul, then fmadd by 8 dims in order, hsum8), in blocks of
 * 4 keys x NH heads side by side (each key's vectors converted once for the heads, each head's once for the keys).
 * Each (head, key) gets the instructions it would get alone, so the bits never depend on NH or on which heads share
 * a job: the chains only run side by side, where one alone waits on each fmadd. */
static inline __attribute__((always_inline)) void scores(int NH, const float *q, const uint16_t *k, int64_t n,
                                                         int64_t d, float scale, float *p, float *mx) {
    const int64_t stride = n + 8;
    int64_t j = 0;
    __m128 mv[4];
    for (int h = 0; h < NH; h++) mv[h] = _mm_set1_ps(-INFINITY);
    for (; j + 4 <= n; j += 4) {
        __m256 acc[4][4];
        for (int i = 0; i < 4; i++) {
            const __m256 k0 = half8(k + (j + i) * d);
            for (int h = 0; h < NH; h++) acc[h][i] = _mm256_mul_ps(_mm256_loadu_ps(q + h * d), k0);
        }
        for (int64_t c = 8; c < d; c += 8) {
            __m256 kc[4];
            for (int i = 0; i < 4; i++) kc[i] = half8(k + (j + i) * d + c);
            for (int h = 0; h < NH; h++) {
                const __m256 qc = _mm256_loadu_ps(q + h * d + c);
                for (int i = 0; i < 4; i++) acc[h][i] = _mm256_fmadd_ps(qc, kc[i], acc[h][i]);
            }
        }
        for (int h = 0; h < NH; h++) {
            const __m128 v = _mm_mul_ps(hsum8x4(acc[h]), _mm_set1_ps(scale));
            _mm_storeu_ps(p + h * stride + j, v);
            mv[h] = _mm_max_ps(mv[h], v);
        }
    }
    for (int h = 0; h < NH; h++) {
        __m128 m = _mm_max_ps(mv[h], _mm_movehl_ps(mv[h], mv[h]));
        mx[h] = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    }
    for (; j < n; j++) { /* the last n % 4 keys one at a time */
        const uint16_t *kj = k + j * d;
        __m256 acc[4];
        const __m256 k0 = half8(kj);
        for (int h = 0; h < NH; h++) acc[h] = _mm256_mul_ps(_mm256_loadu_ps(q + h * d), k0);
        for (int64_t c = 8; c < d; c += 8) {
            const __m256 kc = half8(kj + c);
            for (int h = 0; h < NH; h++) acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + c), kc, acc[h]);
        }
        for (int h = 0; h < NH; h++) {
            const float s = hsum8(acc[h]) * scale;
            p[h * stride + j] = s;
            mx[h] = s > mx[h] ? s : mx[h];
        }
    }
}

/* One row of n scores (max mx) in place to e^(s - mx); returns 1 / their sum. */
static float softmax_row(float *p, int64_t n, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), m));
        _mm256_storeu_ps(p + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < n) { /* the last n % 8 scores, the rest of the lanes zero */
        float last[8] __attribute__((aligned(32))) = {0};
        memcpy(last, p + j, sizeof(float) * (size_t)(n - j));
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane));
        const __m256 e = _mm256_and_ps(keep, exp8(_mm256_sub_ps(_mm256_load_ps(last), m)));
        _mm256_store_ps(last, e);
        memcpy(p + j, last, sizeof(float) * (size_t)(n - j));
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum8(sum);
}

#if defined(__AVX512VL__)
#define VALUE_HEADS 4 /* heads summing values side by side: 4 x 4 accumulators, 4 values and a weight in 32 registers */
#else
#define VALUE_HEADS 2 /* AVX2's 16 registers: 2 x 4 accumulators (3 heads spilled: pocket's step 1.1x slower) */
#endif

/* acc [NH, d] (rows d apart) += sum_{i0 <= i < i1} p[h, i] v[i] for NH (<= VALUE_HEADS) heads (p's rows `stride` apart),
 * 32 dims at a time: each value's vectors converted once for the heads, each head's lanes summed in key order (one
 * fmadd a key, as a head alone would sum them: the heads sharing the loop change no bits). d % 32 == 0. */
static inline __attribute__((always_inline)) void values(int NH, const float *p, int64_t stride, const uint16_t *v,
                                                         int64_t i0, int64_t i1, int64_t d, float *acc) {
    for (int64_t c0 = 0; c0 < d; c0 += 32) {
        __m256 r[4][4];
        for (int h = 0; h < NH; h++)
            for (int c = 0; c < 4; c++) r[h][c] = _mm256_loadu_ps(acc + h * d + c0 + 8 * c);
        for (int64_t i = i0; i < i1; i++) {
            const uint16_t *vi = v + i * d + c0;
            const __m256 v0 = half8(vi), v1 = half8(vi + 8), v2 = half8(vi + 16), v3 = half8(vi + 24);
            for (int h = 0; h < NH; h++) {
                const __m256 w = _mm256_broadcast_ss(p + h * stride + i);
                r[h][0] = _mm256_fmadd_ps(w, v0, r[h][0]);
                r[h][1] = _mm256_fmadd_ps(w, v1, r[h][1]);
                r[h][2] = _mm256_fmadd_ps(w, v2, r[h][2]);
                r[h][3] = _mm256_fmadd_ps(w, v3, r[h][3]);
            }
        }
        for (int h = 0; h < NH; h++)
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(acc + h * d + c0 + 8 * c, r[h][c]);
    }
}

/* values() for one head and any d % 8 == 0, 64 dims (8 registers) at a time: the same sums in the same order. */
static void values_one(const float *p, const uint16_t *v, int64_t i0, int64_t i1, int64_t d, float *acc) {
    for (int64_t c0 = 0; c0 < d; c0 += 64) {
        const int64_t width = d - c0 < 64 ? d - c0 : 64;
        float *a = acc + c0;
        __m256 r[8];
        for (int c = 0; c < width / 8; c++) r[c] = _mm256_loadu_ps(a + 8 * c);
        for (int64_t i = i0; i < i1; i++) {
            const __m256 w = _mm256_broadcast_ss(p + i);
            const uint16_t *vi = v + i * d + c0;
            for (int c = 0; c < width / 8; c++) r[c] = _mm256_fmadd_ps(w, half8(vi + 8 * c), r[c]);
        }
        for (int c = 0; c < width / 8; c++) _mm256_storeu_ps(a + 8 * c, r[c]);
    }
}

/* Attention of nh (<= HEADS_MAX) query rows q (d apart; heads sharing one KV group) over keys/values k, v [n, d]
 * into out (rows d apart). p: nh (n + 8) floats; acc: nh d floats. Per head and lane the arithmetic is one head's
 * alone: its scores, e^(s - max), then every key's weighted value summed in key order from zero, times 1 / sum.
 * The values are taken in blocks of keys that stay in L1 while up to VALUE_HEADS heads sum them side by side (each
 * value converted once for them), so a group's values are read from memory once, not once a head (the partial sums
 * wait in acc between blocks: fp32 either way, no rounding). */
static void attend_heads(int nh, const float *q, const uint16_t *k, const uint16_t *v, int64_t n, int64_t d,
                         float scale, float *p, float *acc, float *out) {
    float mx[HEADS_MAX], inv[HEADS_MAX];
    const int64_t stride = n + 8, block = 4096 / d; /* p's rows; 8 KB of fp16 values a block */
    for (int h0 = 0; h0 < nh; h0 += 4) { /* up to 4 heads at a time, each count its own code (accumulators in registers) */
        const float *qh = q + h0 * d;
        float *ph = p + h0 * stride, *mh = mx + h0;
        switch (nh - h0 < 4 ? nh - h0 : 4) {
        case 1: scores(1, qh, k, n, d, scale, ph, mh); break;
        case 2: scores(2, qh, k, n, d, scale, ph, mh); break;
        case 3: scores(3, qh, k, n, d, scale, ph, mh); break;
        default: scores(4, qh, k, n, d, scale, ph, mh); break;
        }
    }
    for (int h = 0; h < nh; h++) {
        inv[h] = softmax_row(p + h * stride, n, mx[h]);
        memset(acc + h * d, 0, sizeof(float) * (size_t)d);
    }
    for (int64_t i0 = 0; i0 < n; i0 += block) {
        const int64_t i1 = i0 + block < n ? i0 + block : n;
        if (d % 32 != 0) {
            for (int h = 0; h < nh; h++) values_one(p + h * stride, v, i0, i1, d, acc + h * d);
            continue;
        }
        for (int h0 = 0; h0 < nh; h0 += VALUE_HEADS) {
            const float *ph = p + h0 * stride;
            float *ah = acc + h0 * d;
            switch (nh - h0 < VALUE_HEADS ? nh - h0 : VALUE_HEADS) {
            case 1: values(1, ph, stride, v, i0, i1, d, ah); break;
#if VALUE_HEADS > 2
            case 2: values(2, ph, stride, v, i0, i1, d, ah); break;
            case 3: values(3, ph, stride, v, i0, i1, d, ah); break;
#endif
            default: values(VALUE_HEADS, ph, stride, v, i0, i1, d, ah); break;
            }
        }
    }
    for (int h = 0; h < nh; h++) {
        const __m256 s = _mm256_set1_ps(inv[h]);
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(out + h * d + c, _mm256_mul_ps(_mm256_loadu_ps(acc + h * d + c), s));
    }
}

/* See the header. qkv is roped in place; kbuf/vbuf must hold start + T positions (cap >= start + T);
 * out [T, H d] (may be NULL with attend == 0: rope and cache write only). d % 8 == 0, d <= 256,
 * H % KV == 0. Returns 0, or -1 when scratch memory could not be had or the shape is not taken. */
int specchat_attention(float *qkv, int64_t T, int64_t start, const float *cos, const float *sin, uint16_t *kbuf,
                       uint16_t *vbuf, int64_t cap, int64_t H, int64_t KV, int64_t d, float scale, float *out,
                       int threads, int attend_rows) {
    if (d % 8 != 0 || d > MAX_HEAD_DIM || KV <= 0 || H % KV != 0 || start + T > cap) return -1;
    const int64_t width = (H + 2 * KV) * d;
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * width;
        for (int64_t h = 0; h < H + KV; h++) rope(row + h * d, cos + t * d, sin + t * d, d);
        for (int64_t g = 0; g < KV; g++) {
            to_half(kbuf + (g * cap + start + t) * d, row + (H + g) * d, d);
            to_half(vbuf + (g * cap + start + t) * d, row + (H + KV + g) * d, d);
        }
    }
    if (!attend_rows) return 0;
    const int64_t group = H / KV;
    /* jobs: (row, KV group, part of the group's heads); a group's heads in parts of at most HEADS_MAX, and in
     * more parts where rows x groups leave a thread fewer than two jobs (one row of pocket's 3 groups: 6 jobs) */
    int64_t parts = (group + HEADS_MAX - 1) / HEADS_MAX;
    while (parts < group && T * KV * parts < 2 * (int64_t)threads) parts++;
    const int64_t per = (group + parts - 1) / parts; /* heads a part (the last may have fewer) */
    parts = (group + per - 1) / per;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        const size_t need = (size_t)(per * (start + T + 8) + per * d);
        if (need > t_p_cap) {
            free(t_p);
            t_p = (float *)malloc(sizeof(float) * need);
            t_p_cap = t_p ? need : 0;
        }
        float *p = t_p;
        if (p == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t job = 0; job < T * KV * parts; job++) {
            const int64_t t = job / (KV * parts), g = job / parts % KV, first = job % parts * per; /* in the group */
            const int64_t nh = group - first < per ? group - first : per, h0 = g * group + first;
            if (p != NULL)
                attend_heads((int)nh, qkv + t * width + h0 * d, kbuf + g * cap * d, vbuf + g * cap * d, start + t + 1,
                             d, scale, p, p + nh * (start + t + 1 + 8), out + t * H * d + h0 * d);
        }
    }
    return failed ? -1 : 0;
}
