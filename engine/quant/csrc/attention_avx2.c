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
 *   cache:   k'[t], v[t] are written to kbuf, vbuf [KV, cap, d] at position start + t
 *   attend:  out[t, h] = sum_{j <= start + t} softmax_j(scale q'[t, h] . k[g(h), j]) v[g(h), j],
 *            g(h) = h / (H / KV) (grouped-query attention)
 *
 * Row exactness: out[t, h] is computed by one thread with the same instructions in the same order
 * whatever T and the thread count are, so a verify pass gives each row the numbers a one-token
 * step at that position gives (greedy speculation stays token-identical to plain decoding).
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

/* Attention of one query row q [d] over keys/values k, v [n, d] into out [d]. p: n + 8 floats. */
static void attend(const float *q, const float *k, const float *v, int64_t n, int64_t d, float scale,
                   float *p, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const float *kj = k + j * d;
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kj));
        for (int64_t c = 8; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(kj + c), acc);
        const float s = hsum8(acc) * scale;
        p[j] = s;
        mx = s > mx ? s : mx;
    }
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
    const __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
    for (int64_t c0 = 0; c0 < d; c0 += 64) { /* 64 dims (8 registers) at a time, every key in order */
        const int64_t width = d - c0 < 64 ? d - c0 : 64;
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            const __m256 w = _mm256_broadcast_ss(p + i);
            const float *vi = v + i * d + c0;
            for (int c = 0; c < width / 8; c++) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vi + 8 * c), acc[c]);
        }
        for (int c = 0; c < width / 8; c++) _mm256_storeu_ps(out + c0 + 8 * c, _mm256_mul_ps(acc[c], inv));
    }
}

/* See the header. qkv is roped in place; kbuf/vbuf must hold start + T positions (cap >= start + T);
 * out [T, H d] (may be NULL with attend == 0: rope and cache write only). d % 8 == 0, d <= 256,
 * H % KV == 0. Returns 0, or -1 when scratch memory could not be had or the shape is not taken. */
int specchat_attention(float *qkv, int64_t T, int64_t start, const float *cos, const float *sin, float *kbuf,
                       float *vbuf, int64_t cap, int64_t H, int64_t KV, int64_t d, float scale, float *out,
                       int threads, int attend_rows) {
    if (d % 8 != 0 || d > MAX_HEAD_DIM || KV <= 0 || H % KV != 0 || start + T > cap) return -1;
    const int64_t width = (H + 2 * KV) * d;
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * width;
        for (int64_t h = 0; h < H + KV; h++) rope(row + h * d, cos + t * d, sin + t * d, d);
        for (int64_t g = 0; g < KV; g++) {
            memcpy(kbuf + (g * cap + start + t) * d, row + (H + g) * d, sizeof(float) * (size_t)d);
            memcpy(vbuf + (g * cap + start + t) * d, row + (H + KV + g) * d, sizeof(float) * (size_t)d);
        }
    }
    if (!attend_rows) return 0;
    const int64_t group = H / KV;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        const size_t need = (size_t)(start + T + 8);
        if (need > t_p_cap) {
            free(t_p);
            t_p = (float *)malloc(sizeof(float) * need);
            t_p_cap = t_p ? need : 0;
        }
        float *p = t_p;
        if (p == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t job = 0; job < T * H; job++) {
            const int64_t t = job / H, h = job % H, g = h / group;
            if (p != NULL)
                attend(qkv + t * width + h * d, kbuf + g * cap * d, vbuf + g * cap * d, start + t + 1, d, scale, p,
                       out + t * H * d + h * d);
        }
    }
    return failed ? -1 : 0;
}
