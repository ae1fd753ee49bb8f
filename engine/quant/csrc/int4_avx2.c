/* specchat's CPU int4 matmul: 4-bit weights in groups of 32, activations quantized to int8
 * per group of 32, integer dot products (AVX2 + FMA). Built by engine/quant/cpu_kernel.py.
 *
 *   y[m, n] = bias[n] + sum_p sum_g ( s[n,p,g] * dx[m,g] * sum_i q[n,p,g,i] * xq[m,g,i]
 *                                     + (z[n,p,g] - 8 s[n,p,g]) * dx[m,g] * sum_i xq[m,g,i] )
 *
 * for weights w = (q - 8) * s + z (q in 0..15; s and z bf16, the layout and rounding of torch's own
 * int4 kernel), x[m, g*32 + i] ~ dx[m,g] * xq[m,g,i] (xq in -127..127, dx = max|x| / 127 over the
 * group), and p running over the weight's planes (a two-plane weight sums two int4 matrices over the
 * same input; see engine/quant/int4.py).
 *
 * Layout of one row's codes: per pair of groups (64 weights) 32 bytes; byte j holds weight j
 * in its low nibble and weight j + 32 in its high nibble. Scales: bf16 [N, P, 2, G]: per plane, s then z.
 *
 * Batch invariance: y[m, n] is computed by the same instructions in the same order whatever M
 * and whatever the thread count (one thread computes a whole output; x's quantization is per
 * row), so a verify pass over several tokens gives each token the logits of a one-token step.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "simd_math.h"

#define ROWS 4      /* output rows sharing each activation load */
#define MCHUNK 32   /* tokens per block, so a long prompt's activations stay in cache */
#define LONG_ROW 2048 /* bytes of codes a row from which rows go one at a time: four such rows
                       * (and their scales) are eight streams a thread, more than the hardware
                       * prefetchers follow (a 1536 x 8960 int4 product: 6.6 -> 3.9 ms here) */

static __thread int8_t *t_xq = NULL;
static __thread float *t_dx = NULL;
static __thread size_t t_cap = 0;

/* 8 bf16 values to fp32 (exact). */
static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline float bf16(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One group of 32 floats to int8 codes; returns the scale, writes sum(codes) * scale to *xs. */
static inline float quantize_group(const float *v, int8_t *out, float *xs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_andnot_ps(sign, _mm256_loadu_ps(v));
    for (int i = 8; i < 32; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), inv),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
    *xs = d * (float)_mm_cvtsi128_si32(s4);
    return d;
}

/* The dot of `rows` consecutive weight rows with one quantized activation row (G groups, one plane).
 * Always inlined, so that with rows == ROWS the accumulators live in registers. */
static inline __attribute__((always_inline)) void dot_rows(int rows, int ahead, const uint8_t *codes, const uint16_t *sz, int64_t row_bytes,
                            int64_t row_scales, int64_t G, const int8_t *xq, const float *dx,
                            const float *xs, __m256 *acc, __m256 *zacc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 eight = _mm256_set1_ps(8.0f);
    float sc[ROWS][8] __attribute__((aligned(32)));
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) {
        const __m256 dxv = _mm256_loadu_ps(dx + g);
        const __m256 xsv = _mm256_loadu_ps(xs + g);
        for (int r = 0; r < rows; r++) {
            const uint16_t *s = sz + r * row_scales;
            const __m256 scale = bf16x8(s + g);
            _mm256_store_ps(sc[r], _mm256_mul_ps(scale, dxv));
            zacc[r] = _mm256_fmadd_ps(_mm256_fnmadd_ps(eight, scale, bf16x8(s + G + g)), xsv, zacc[r]);
        }
        for (int r = 0; r < rows; r++) { /* the next tile's same 128 bytes, ahead of need */
            _mm_prefetch((const char *)(codes + (r + ahead) * row_bytes + g * 16), _MM_HINT_T0);
            _mm_prefetch((const char *)(codes + (r + ahead) * row_bytes + g * 16 + 64), _MM_HINT_T0);
        }
        for (int j = 0; j < 8; j += 4) { /* four groups: two bytes' worth of codes per row */
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + (g + j) * 32));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + (g + j) * 32 + 32));
            const __m256i x2 = _mm256_loadu_si256((const __m256i *)(xq + (g + j) * 32 + 64));
            const __m256i x3 = _mm256_loadu_si256((const __m256i *)(xq + (g + j) * 32 + 96));
            for (int r = 0; r < rows; r++) {
                const __m256i b0 = _mm256_loadu_si256((const __m256i *)(codes + r * row_bytes + (g + j) * 16));
                const __m256i b1 = _mm256_loadu_si256((const __m256i *)(codes + r * row_bytes + (g + j) * 16 + 32));
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(b0, m4), x0), ones);
                const __m256i p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(b0, 4), m4), x1), ones);
                const __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(b1, m4), x2), ones);
                const __m256i p3 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), x3), ones);
                /* lanes 0..3: the four groups' first 16 products summed, 4..7: their last 16 */
                const __m256i sum = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ps((const __m128 *)&sc[r][j]), acc[r]);
            }
        }
    }
    for (; g < G; g += 2) { /* G is even: the tail is whole pairs of groups */
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + g * 32));
        const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + g * 32 + 32));
        for (int r = 0; r < rows; r++) {
            const uint16_t *s = sz + r * row_scales;
            const __m256i b = _mm256_loadu_si256((const __m256i *)(codes + r * row_bytes + g * 16));
            const __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(b, m4), xa), ones);
            const __m256i pb = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), xb), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pa), _mm256_set1_ps(bf16(s[g]) * dx[g]), acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pb), _mm256_set1_ps(bf16(s[g + 1]) * dx[g + 1]), acc[r]);
            const __m256 z = _mm256_setr_ps((bf16(s[G + g]) - 8.0f * bf16(s[g])) * xs[g],
                                            (bf16(s[G + g + 1]) - 8.0f * bf16(s[g + 1])) * xs[g + 1], 0, 0, 0, 0, 0, 0);
            zacc[r] = _mm256_add_ps(zacc[r], z);
        }
    }
}

/* The tile's accumulators, cleared. */
static inline void zero_rows(__m256 *acc, __m256 *zacc) {
    for (int r = 0; r < ROWS; r++) {
        acc[r] = _mm256_setzero_ps();
        zacc[r] = _mm256_setzero_ps();
    }
}

/* A tile's `rows` outputs from its accumulators into y's row (written, or added with accumulate). */
static inline void store_rows(int rows, const __m256 *acc, const __m256 *zacc, const float *bias, int64_t n0, float *y,
                              int accumulate) {
    for (int r = 0; r < rows; r++) {
        const float out = hsum8(acc[r]) + hsum8(zacc[r]) + (bias ? bias[n0 + r] : 0.0f);
        y[n0 + r] = accumulate ? y[n0 + r] + out : out;
    }
}

/* x's rows as int8 groups: xq [M, K], their scales dx [M, G] and dx * sum(xq) xs [M, G], in this
 * thread's scratch; norm / gated as for specchat_int4_mm. Returns -1 when scratch could not be had. */
static int prepare(const float *x, int64_t M, int64_t K, const float *norm, float eps, int gated, int8_t **xq_out,
                   float **dx_out, float **xs_out) {
    const int64_t G = K / 32;
    if ((size_t)(M * K) > t_cap) {
        free(t_xq);
        free(t_dx);
        t_xq = (int8_t *)aligned_alloc(64, (size_t)(M * K + 64));
        t_dx = (float *)malloc(sizeof(float) * (size_t)(2 * M * G + 16));
        if (t_xq == NULL || t_dx == NULL) {
            free(t_xq);
            free(t_dx);
            t_xq = NULL;
            t_dx = NULL;
            t_cap = 0;
            return -1;
        }
        t_cap = (size_t)(M * K);
    }
    int8_t *xq = t_xq;
    float *dx = t_dx, *xs = t_dx + M * G;
    float normed[32] __attribute__((aligned(32)));
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * (gated ? 2 * K : K);
        __m256 inv = _mm256_setzero_ps();
        if (norm) {
            __m256 ss = _mm256_setzero_ps();
            for (int64_t k = 0; k < K; k += 8) {
                const __m256 v = _mm256_loadu_ps(row + k);
                ss = _mm256_fmadd_ps(v, v, ss);
            }
            inv = _mm256_set1_ps(1.0f / sqrtf(hsum8(ss) / (float)K + eps));
        }
        for (int64_t g = 0; g < G; g++) {
            const float *v = row + g * 32;
            if (norm) {
                for (int i = 0; i < 32; i += 8)
                    _mm256_store_ps(normed + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv),
                                                              _mm256_loadu_ps(norm + g * 32 + i)));
                v = normed;
            } else if (gated) {
                for (int i = 0; i < 32; i += 8)
                    _mm256_store_ps(normed + i, silu_mul8(_mm256_loadu_ps(v + i), _mm256_loadu_ps(v + K + i)));
                v = normed;
            }
            dx[m * G + g] = quantize_group(v, xq + m * K + g * 32, xs + m * G + g);
        }
    }

    *xq_out = xq;
    *dx_out = dx;
    *xs_out = xs;
    return 0;
}

/* 8-bit weights (two int4 planes joined: v = 16 h + l - 128): the dot of `rows` consecutive rows with
 * one quantized activation row. codes int8 [rows][K]; st fp32 per row [2][G]: scales s, then offsets c,
 * w = v s + c. |v| <= 128 and |xq| <= 127, so vpmaddubsw's pair sums (|v| * sign-moved xq) never
 * saturate (2 * 128 * 127 < 32768). */
static inline __attribute__((always_inline)) void dot_rows8(int rows, int ahead, const int8_t *codes, const float *st,
                                                            int64_t K, int64_t G, const int8_t *xq, const float *dx,
                                                            const float *xs, __m256 *acc, __m256 *zacc) {
    const __m256i ones = _mm256_set1_epi16(1);
    float sc[ROWS][8] __attribute__((aligned(32)));
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) {
        const __m256 dxv = _mm256_loadu_ps(dx + g);
        const __m256 xsv = _mm256_loadu_ps(xs + g);
        for (int r = 0; r < rows; r++) {
            const float *t = st + r * 2 * G;
            _mm256_store_ps(sc[r], _mm256_mul_ps(_mm256_loadu_ps(t + g), dxv));
            zacc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(t + G + g), xsv, zacc[r]);
        }
        for (int r = 0; r < rows; r++) /* the next tile's same 256 bytes, ahead of need */
            for (int c = 0; c < 256; c += 64) _mm_prefetch((const char *)(codes + (r + ahead) * K + g * 32 + c), _MM_HINT_T0);
        for (int j = 0; j < 8; j += 4) { /* four groups, summed pairwise as in dot_rows */
            __m256i xa[4];
            for (int i = 0; i < 4; i++) xa[i] = _mm256_loadu_si256((const __m256i *)(xq + (g + j + i) * 32));
            for (int r = 0; r < rows; r++) {
                __m256i p[4];
                for (int i = 0; i < 4; i++) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(codes + r * K + (g + j + i) * 32));
                    p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xa[i], w)), ones);
                }
                const __m256i sum = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ps((const __m128 *)&sc[r][j]), acc[r]);
            }
        }
    }
    for (; g < G; g++) {
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + g * 32));
        for (int r = 0; r < rows; r++) {
            const float *t = st + r * 2 * G;
            const __m256i w = _mm256_loadu_si256((const __m256i *)(codes + r * K + g * 32));
            const __m256i p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xa, w)), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(t[g] * dx[g]), acc[r]);
            zacc[r] = _mm256_add_ps(zacc[r], _mm256_setr_ps(t[G + g] * xs[g], 0, 0, 0, 0, 0, 0, 0));
        }
    }
}

/* 6-bit weights in sub-blocks of 16 (a GGUF's Q6_K, code for code): w = v s, v = q - 32, q in 0..63, one
 * bf16 scale s per 16 weights. A row is its codes (K * 3/4 bytes) and then its scales (K / 16 bf16), padded
 * to 32 bytes. Each 128 weights take 96 bytes: bytes 0..31 hold weights j (low nibble) and j + 32 (high),
 * bytes 32..63 weights 64 + j and 96 + j, and byte 64 + j the top two bits of weights j, 32 + j, 64 + j and
 * 96 + j (bits 0-1, 2-3, 4-5, 6-7). Per group of 32: vpmaddubsw(q, xq) - vpmaddubsw(32, xq) (|pairs| <=
 * 2 * 63 * 127, no saturation), summed to int32 lanes 0..3 (the first 16 weights) and 4..7 (the next 16),
 * then four groups' sums pairwise (vphaddd: lanes 0..3 the groups' first 16 weights, 4..7 their second) and
 * one multiply-add with their scales times dx; the first half of each super-block sums into acc, the
 * second into zacc (two chains). */
static inline __attribute__((always_inline)) void dot_rows6(int rows, int ahead, const uint8_t *w, int64_t stride,
                                                            int64_t K, const int8_t *xq, const float *dx,
                                                            __m256 *acc, __m256 *zacc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m256i c32 = _mm256_set1_epi8(32);
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t code_bytes = K / 4 * 3;
    /* per row and half super-block: its 8 scales in the order the summed lanes come (see below) times dx */
    __m256 sd[ROWS][2];
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t b = 0; b < K / 256; b++) { /* super-blocks of 256 weights: 8 groups, 16 scales */
        const int64_t g = 8 * b;
        const __m256 dlo = _mm256_broadcast_ps((const __m128 *)(dx + g));
        const __m256 dhi = _mm256_broadcast_ps((const __m128 *)(dx + g + 4));
        for (int r = 0; r < rows; r++) {
            const uint16_t *s = (const uint16_t *)(w + r * stride + code_bytes) + 16 * b;
            sd[r][0] = _mm256_mul_ps(_mm256_permutevar8x32_ps(bf16x8(s), order), dlo);
            sd[r][1] = _mm256_mul_ps(_mm256_permutevar8x32_ps(bf16x8(s + 8), order), dhi);
        }
        for (int r = 0; r < rows; r++) /* the next tile's same 192 bytes, ahead of need */
            for (int c = 0; c < 192; c += 64) _mm_prefetch((const char *)(w + (r + ahead) * stride + 192 * b + c), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            __m256i xa[4], x32[4];
            for (int i = 0; i < 4; i++) {
                xa[i] = _mm256_loadu_si256((const __m256i *)(xq + (g + 4 * h + i) * 32));
                x32[i] = _mm256_maddubs_epi16(c32, xa[i]);
            }
            for (int r = 0; r < rows; r++) {
                const uint8_t *c = w + r * stride + 192 * b + 96 * h;
                const __m256i n0 = _mm256_loadu_si256((const __m256i *)c);
                const __m256i n1 = _mm256_loadu_si256((const __m256i *)(c + 32));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(c + 64));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(n0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), m4),
                                       _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(n1, m4), _mm256_and_si256(hb, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
                __m256i p[4];
                for (int i = 0; i < 4; i++)
                    p[i] = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q[i], xa[i]), x32[i]), ones);
                /* lanes 0..3: the four groups' first 16 weights, 4..7: their second 16 */
                const __m256i sum = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
                if (h)
                    zacc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sd[r][h], zacc[r]);
                else
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sd[r][h], acc[r]);
            }
        }
    }
}

enum { INT4 = 0, INT8 = 1, INT6 = 2 };

/* Where one kind of weights lies: codes (and for INT4 P planes side by side), scales/table. */
typedef struct {
    int kind;
    const uint8_t *codes;
    const void *table; /* INT4: bf16 [N, P, 2, G]; INT8: fp32 [N, 2, G]; INT6: NULL (in the rows) */
    int64_t K, P, row_bytes;
} weights_t;

/* The dot products of `rows` weight rows from n0 with activation row (xq, dx, xs), into acc/zacc. The
 * row count is a constant in each call below, so the always-inlined dots keep their accumulators in
 * registers; the choice is made by shape alone (the same for every M). */
static inline void tile_dot(const weights_t *wt, int rows, int64_t tile, int64_t n0, const int8_t *xq,
                            const float *dx, const float *xs, __m256 *acc, __m256 *zacc) {
    const int64_t K = wt->K, G = K / 32;
    if (wt->kind == INT4) {
        const int64_t row_scales = 2 * wt->P * G;
        for (int64_t p = 0; p < wt->P; p++) {
            const uint8_t *c = wt->codes + n0 * wt->row_bytes + p * (K / 2);
            const uint16_t *z = (const uint16_t *)wt->table + n0 * row_scales + p * 2 * G;
            if (rows == ROWS)
                dot_rows(ROWS, ROWS, c, z, wt->row_bytes, row_scales, G, xq, dx, xs, acc, zacc);
            else if (tile == 1)
                dot_rows(1, 1, c, z, wt->row_bytes, row_scales, G, xq, dx, xs, acc, zacc);
            else
                dot_rows(rows, ROWS, c, z, wt->row_bytes, row_scales, G, xq, dx, xs, acc, zacc);
        }
    } else if (wt->kind == INT8) {
        const int8_t *c = (const int8_t *)wt->codes + n0 * K;
        const float *z = (const float *)wt->table + n0 * 2 * G;
        if (rows == ROWS)
            dot_rows8(ROWS, ROWS, c, z, K, G, xq, dx, xs, acc, zacc);
        else if (tile == 1)
            dot_rows8(1, 1, c, z, K, G, xq, dx, xs, acc, zacc);
        else
            dot_rows8(rows, ROWS, c, z, K, G, xq, dx, xs, acc, zacc);
    } else {
        const uint8_t *c = wt->codes + n0 * wt->row_bytes;
        if (rows == ROWS)
            dot_rows6(ROWS, ROWS, c, wt->row_bytes, K, xq, dx, acc, zacc);
        else if (tile == 1)
            dot_rows6(1, 1, c, wt->row_bytes, K, xq, dx, acc, zacc);
        else
            dot_rows6(rows, ROWS, c, wt->row_bytes, K, xq, dx, acc, zacc);
    }
}

/* y [M, N] (rows ldy apart) = x @ W.T (+ bias) for any kind of weights: x's rows quantized once, then
 * tiles of output rows over blocks of MCHUNK tokens, one thread a tile. */
static int run(const weights_t *wt, const float *bias, int64_t N, const float *x, int64_t M, float *y, int64_t ldy,
               int threads, const float *norm, float eps, int accumulate, int gated) {
    const int64_t K = wt->K, G = K / 32;
    int8_t *xq;
    float *dx, *xs;
    if (prepare(x, M, K, norm, eps, gated, &xq, &dx, &xs)) return -1;
    const int64_t tile = wt->row_bytes >= LONG_ROW ? 1 : ROWS; /* by shape only: the same for any M */
    const int64_t tiles = (N + tile - 1) / tile;
    for (int64_t m0 = 0; m0 < M; m0 += MCHUNK) {
        const int64_t m1 = m0 + MCHUNK < M ? m0 + MCHUNK : M;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t n0 = t * tile;
            const int rows = (int)(N - n0 < tile ? N - n0 : tile);
            for (int64_t m = m0; m < m1; m++) {
                __m256 acc[ROWS], zacc[ROWS];
                zero_rows(acc, zacc);
                tile_dot(wt, rows, tile, n0, xq + m * K, dx + m * G, xs + m * G, acc, zacc);
                store_rows(rows, acc, zacc, bias, n0, y + m * ldy, accumulate);
            }
        }
    }
    return 0;
}

/* y [M, N] fp32 (rows ldy apart) = x [M, K] fp32 @ W.T (+ bias), W as above with P planes; K % 64 == 0.
 * norm (fp32 [K], or NULL): x's rows are RMS-normalised first, x * (1 / sqrt(mean(x^2) + eps)) * norm
 * (a transformer's pre-norm, so it needs no op of its own). accumulate: y += the product (a residual
 * add, in place) instead of y = the product. gated: x is [M, 2K], a gate and an up projection side
 * by side, and the product reads silu(gate) * up (a SwiGLU MLP's down projection; exclusive with norm).
 * Returns 0, or -1 when scratch memory could not be had. */
int specchat_int4_mm(const uint8_t *codes, const uint16_t *sz, const float *bias, int64_t N, int64_t K,
                     int64_t P, const float *x, int64_t M, float *y, int64_t ldy, int threads, const float *norm,
                     float eps, int accumulate, int gated) {
    const weights_t wt = {INT4, codes, sz, K, P, P * K / 2};
    return run(&wt, bias, N, x, M, y, ldy, threads, norm, eps, accumulate, gated);
}

/* y [M, N] fp32 = x [M, K] fp32 @ W.T (+ bias) for 8-bit weights w = v s + c (codes int8 [N, K], st fp32
 * [N, 2, K/32]: per row the scales, then the offsets); norm, eps, accumulate, gated as for
 * specchat_int4_mm, and the same batch invariance. K % 64 == 0. Returns 0, or -1 (no scratch). */
int specchat_int8_mm(const int8_t *codes, const float *st, const float *bias, int64_t N, int64_t K, const float *x,
                     int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps, int accumulate,
                     int gated) {
    const weights_t wt = {INT8, (const uint8_t *)codes, st, K, 1, K};
    return run(&wt, bias, N, x, M, y, ldy, threads, norm, eps, accumulate, gated);
}

/* y [M, N] fp32 = x [M, K] fp32 @ W.T (+ bias) for 6-bit weights (rows as dot_rows6 reads them, `stride`
 * bytes apart); norm, eps, accumulate, gated as for specchat_int4_mm, and the same batch invariance.
 * K % 256 == 0. Returns 0, or -1 (no scratch). */
int specchat_int6_mm(const uint8_t *rows, int64_t stride, const float *bias, int64_t N, int64_t K, const float *x,
                     int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps, int accumulate,
                     int gated) {
    const weights_t wt = {INT6, rows, NULL, K, 1, stride};
    return run(&wt, bias, N, x, M, y, ldy, threads, norm, eps, accumulate, gated);
}
