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
 * in its low nibble and weight j + 32 in its high nibble. Scales: bf16 [N, P, 2, G]: per plane, s then z;
 * or, for a GGUF's Q4_K rows (one plane), the super-blocks' own 16-byte headers [N, K/256, 16] (fp16 d and
 * dmin, twelve bytes of 6-bit sub-scales and mins, as the file stores them): s = d sc and z - 8 s = -dmin m
 * are computed from them in fp32, both exact, so such a row reads 4.5 bits a weight instead of 5.
 *
 * Q4_K rows may also come in tiles of TILE rows (kind INT4KT, cpu_pack.tile_rows): per super-block, the tile's
 * TILE 16-byte headers, then each row's 128 bytes of codes (every 32-byte load of codes within one cache line),
 * so that a tile's rows stream from memory as one run of bytes (llama.cpp repacks Q4_K rows alike, q4_K_8x8)
 * where rows laid apart are two streams each, codes and headers, and a pass of up to MB tokens takes the whole
 * tile (dot_tile). On the AVX-512 machine measured (Zen 4, two threads, 20 layers' weights from DRAM), coder's
 * gate_up (17920 x 1536) took 0.52 -> 0.46 ms for one token, 0.70 -> 0.51 for two, 0.71 -> 0.68 for three and
 * 0.87 -> 0.82 for four; rows of more than 2048 inputs were no faster or slower so, and stay apart
 * (cpu_pack.TILE_MAX_K). The arithmetic is dot_rows', output for output.
 *
 * The same driver (run) multiplies 8-bit weights (dot_rows8: two int4 planes joined) and a GGUF's Q6_K
 * as 6-bit codes (dot_rows6). One token takes ROWS weight rows at a time; several take one row at a
 * time (on AVX-512 two) with up to MB tokens, each row's codes unpacked once for them.
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

/* The VNNI variants (built with -mavx512vnni -mavx512vl, or -mavxvnni; engine/quant/cpu_kernel.py picks one
 * by the CPU's flags) take each integer dot of four groups with four vpdpbusd (u8 x s8 -> int32, four products
 * a lane, no saturation) instead of vpmaddubsw and a tree of horizontal adds. For that, every whole 128 weights
 * of the 8-group blocks are stored (and the activations quantized) in "VNNI order" (cpu_kernel.vnni_order):
 * the AVX2 unpacking then yields four vectors w[p] whose 32-bit lane k holds part p (4 weights) of sub-block
 * k (16 weights; lanes 0..3 the four groups' first 16, 4..7 their last 16), so summing the four dots lane by
 * lane gives exactly the int32 sums the AVX2 tree gives, in the same lanes. The float work after them is the
 * AVX2 code's, instruction for instruction: both variants give every output the same bits. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SPECCHAT_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define SPECCHAT_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#else
#define SPECCHAT_VNNI 0
#endif

#if SPECCHAT_VNNI
/* sum_p dot(u[p], s[p]) per 32-bit lane: two chains of two, so the dots do not wait on one another. */
static inline __m256i dot4(const __m256i *u, const __m256i *s, __m256i start) {
    return _mm256_add_epi32(DPBUSD(DPBUSD(start, u[0], s[0]), u[1], s[1]),
                            DPBUSD(DPBUSD(_mm256_setzero_si256(), u[2], s[2]), u[3], s[3]));
}

/* One row's int8 activations (K of them) in VNNI order: in each whole 128 of its 8-group blocks, the 4-byte
 * unit (group, half, part) moves to (part, half, group). The move is its own inverse. */
static void vnni_order(int8_t *xq, int64_t K) {
    const int64_t blocks = K / 256 * 256;
    for (int64_t c = 0; c < blocks; c += 128) {
        uint32_t in[32], out[32];
        memcpy(in, xq + c, sizeof in);
        for (int g = 0; g < 4; g++)
            for (int h = 0; h < 2; h++)
                for (int p = 0; p < 4; p++) out[p * 8 + h * 4 + g] = in[g * 8 + h * 4 + p];
        memcpy(xq + c, out, sizeof out);
    }
}
#endif

/* Which variant this build is (cpu_kernel.py checks it against the one it asked for). */
const char *specchat_kernel_variant(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx512-vnni";
#elif defined(__AVXVNNI__)
    return "avx-vnni";
#else
    return "avx2";
#endif
}

#define ROWS 4      /* output rows sharing each activation load */
#define TILE 4      /* rows a tile of tiled Q4_K rows holds (INT4KT) */
#define TILE_ROW 144 /* bytes a row takes in each super-block of a tile: a 16-byte header, 128 of codes */
#define TILE_AHEAD 2 /* super-blocks of a tile's stream fetched ahead of need */
#define MCHUNK 32   /* tokens per block, so a long prompt's activations stay in cache */
/* Per token, -32 times the sums of each group's first and last 16 codes, four groups at a time: [firsts of
 * groups 4c..4c+3, lasts of the same], the order dot_rows6 sums its lanes in. Floats a token: */
#define HALVES(G) (((G) + 3) / 4 * 8)
#define MB 4        /* tokens sharing each unpacked row of codes in a pass of several */
#if defined(__AVX512VL__)
#define MROWS 2     /* weight rows a tile takes in a pass of several tokens: AVX-512's 32 registers hold their
                     * MROWS x MB accumulators and the MB tokens' activations, each loaded once for the rows */
#else
#define MROWS 1     /* AVX2's 16 registers: one row at a time */
#endif
#define ACC (MROWS * MB > ROWS ? MROWS * MB : ROWS) /* accumulators a tile has at most: rows x tokens */
#if SPECCHAT_VNNI
#define LONG_ROW 512  /* on the VNNI machine measured (AMD Zen 4, a shared host), rows from 512 bytes read from
                       * memory 1.3-1.6x faster one at a time than four at a time (2048 x 1536 int4 streamed
                       * from DRAM: 0.24 -> 0.17 ms; the 151936 x 1536 6-bit head 20 -> 12 ms); shorter ones
                       * (pocket's 576 inputs) stay faster in tiles. The outputs' arithmetic is the same. */
#define SIX_TILE_ROW 4096 /* ... except 6-bit rows from this many bytes (coder's Q6_K down, 8960 inputs: 7840), which
                          * stream faster again in tiles of four there (14 such layers, two threads: 0.59 -> 0.46 ms
                          * a layer), while the 6-bit head's 1344-byte rows run 1.3x slower so */
#else
#define SIX_TILE_ROW INT64_MAX /* the AVX2 variant: long 6-bit rows go one at a time like any other */
#define LONG_ROW 2048 /* bytes of codes a row from which rows go one at a time: four such rows
                       * (and their scales) are eight streams a thread, more than the hardware
                       * prefetchers follow (a 1536 x 8960 int4 product: 6.6 -> 3.9 ms here) */
#endif

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

/* A Q4_K super-block header (fp16 d, fp16 dmin, 12 bytes: bytes 0-3 hold sub-scales 0-3 in their low 6 bits,
 * bytes 4-7 mins 0-3 likewise, bytes 8-11 the low 4 bits of sub-scale (low nibble) and min (high nibble) 4-7,
 * whose top 2 bits are the top 2 bits of bytes 0-3 and 4-7) as the 8 groups' scales d sc and offsets -dmin m,
 * each exact in fp32 (11 bits of d times 6 of sc). In 32-bit lanes of the header, a = lane 1, b = 2, c = 3:
 * sub-scales 0-3 a & 0x3f.., 4-7 (c & 0x0f..) | (a >> 2 & 0x30..); mins 0-3 b & 0x3f.., 4-7 (c >> 4 & 0x0f..) |
 * (b >> 2 & 0x30..), so lanes 1 and 2 of `lo` and `hi` below hold the sub-scales' and the mins' two halves. */
static inline void kq_scales(const uint8_t *h, __m256 *scale, __m256 *off) {
    const __m128i v = _mm_loadu_si128((const __m128i *)h);
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3F));
    const __m128i c = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0xFF), _mm_setr_epi32(0, 0, 4, 0));
    const __m128i hi = _mm_or_si128(_mm_and_si128(c, _mm_set1_epi8(0x0F)),
                                    _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30)));
    const __m128i sc = _mm_srli_si128(_mm_unpacklo_epi32(lo, hi), 8), mn = _mm_unpackhi_epi32(lo, hi);
    const __m128 dd = _mm_cvtph_ps(v); /* lanes 0, 1: d, dmin */
    *scale = _mm256_mul_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
    *off = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_xor_ps(_mm_movehdup_ps(dd), _mm_set1_ps(-0.0f))),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
}

/* Four groups' codes from their 64 bytes at `at` (byte j: code j low, code j + 32 high, two pairs of groups) as
 * four vectors of u8 codes 0..15, the order the activations come in (VNNI order on the VNNI variants). */
static inline void four_groups(const uint8_t *at, __m256i *w) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)at), b1 = _mm256_loadu_si256((const __m256i *)(at + 32));
    w[0] = _mm256_and_si256(b0, m4);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(b0, 4), m4);
    w[2] = _mm256_and_si256(b1, m4);
    w[3] = _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4);
}

/* The int32 dots of four groups' codes w (u8 0..15) with their int8 activations x: lanes 0..3 the four groups'
 * first 16 products summed, 4..7 their last 16. VNNI: four vpdpbusd; AVX2: vpmaddubsw, whose int16 sums of up to
 * 8 products stay exact (|sum| <= 8 * 15 * 127 < 32768), then int32. The same sums either way. */
static inline __m256i four_group_dots(const __m256i *w, const __m256i *x) {
#if SPECCHAT_VNNI
    return dot4(w, x, _mm256_setzero_si256());
#else
    __m256i p[4];
    for (int c = 0; c < 4; c++) p[c] = _mm256_maddubs_epi16(w[c], x[c]);
    return _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3])),
                             _mm256_set1_epi16(1));
#endif
}

/* One group of 32 floats to int8 codes; returns the scale, writes sum(codes) * scale to *xs and -32 times
 * the sums of its first and last 16 codes to half[0] and half[4] (the 6-bit kernel's offsets). */
static inline float quantize_group(const float *v, int8_t *out, float *xs, float *half) {
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
    const __m256i first = _mm256_add_epi32(q[0], q[1]), last = _mm256_add_epi32(q[2], q[3]);
    __m128i s4 = _mm_hadd_epi32(_mm_add_epi32(_mm256_castsi256_si128(first), _mm256_extracti128_si256(first, 1)),
                                _mm_add_epi32(_mm256_castsi256_si128(last), _mm256_extracti128_si256(last, 1)));
    s4 = _mm_hadd_epi32(s4, s4); /* lane 0: the first 16 codes' sum, lane 1: the last 16's */
    const int sum_first = _mm_cvtsi128_si32(s4), sum_last = _mm_extract_epi32(s4, 1);
    half[0] = -32.0f * (float)sum_first;
    half[4] = -32.0f * (float)sum_last;
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
    *xs = d * (float)(sum_first + sum_last);
    return d;
}

/* n accumulator pairs from (sa, sz) to (da, dz): the dot loops work on local copies. */
static inline __attribute__((always_inline)) void copy_acc(int n, __m256 *da, __m256 *dz, const __m256 *sa,
                                                           const __m256 *sz) {
    for (int a = 0; a < n; a++) {
        da[a] = sa[a];
        dz[a] = sz[a];
    }
}

/* The dots of `rows` consecutive weight rows (G groups, one plane) with `mb` consecutive quantized activation
 * rows (xq K apart, dx and xs G apart), into acc/zacc[r * mb + i] (rows * mb <= ROWS). Each row's codes are
 * unpacked once for the mb tokens. Always inlined with constant rows and mb, so the accumulators live in
 * registers; every (row, token) pair gets the same instructions in the same order whatever rows and mb are,
 * which is what makes a pass of several tokens give each the bits of a pass of one. The scales: kq = 0, bf16
 * s then z (row_scales values a row); kq = 1, Q4_K headers (row_scales bytes a row; K % 256 == 0). */
static inline __attribute__((always_inline)) void dot_rows(int rows, int mb, int ahead, int kq, const uint8_t *codes,
                                                           const void *table, int64_t row_bytes, int64_t row_scales,
                                                           int64_t K, const int8_t *xq, const float *dx,
                                                           const float *xs, __m256 *acc_out, __m256 *zacc_out) {
    /* the accumulators in registers (through the pointers every update would go to memory and back) */
    __m256 acc[ACC], zacc[ACC];
    copy_acc(rows * mb, acc, zacc, acc_out, zacc_out);
    const int64_t G = K / 32;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 eight = _mm256_set1_ps(8.0f);
    float sc[ACC][8] __attribute__((aligned(32)));
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) {
        for (int r = 0; r < rows; r++) {
            __m256 scale, off;
            if (kq) {
                kq_scales((const uint8_t *)table + r * row_scales + g * 2, &scale, &off);
            } else {
                const uint16_t *s = (const uint16_t *)table + r * row_scales;
                scale = bf16x8(s + g);
                off = _mm256_fnmadd_ps(eight, scale, bf16x8(s + G + g));
            }
            for (int i = 0; i < mb; i++) {
                _mm256_store_ps(sc[r * mb + i], _mm256_mul_ps(scale, _mm256_loadu_ps(dx + i * G + g)));
                zacc[r * mb + i] = _mm256_fmadd_ps(off, _mm256_loadu_ps(xs + i * G + g), zacc[r * mb + i]);
            }
        }
        for (int r = 0; r < rows; r++) { /* the next tile's same 128 bytes, ahead of need */
            _mm_prefetch((const char *)(codes + (r + ahead) * row_bytes + g * 16), _MM_HINT_T0);
            _mm_prefetch((const char *)(codes + (r + ahead) * row_bytes + g * 16 + 64), _MM_HINT_T0);
        }
        for (int j = 0; j < 8; j += 4) { /* four groups: 64 bytes of codes a row */
            __m256i x[MB][4];
            for (int i = 0; i < mb; i++)
                for (int c = 0; c < 4; c++) x[i][c] = _mm256_loadu_si256((const __m256i *)(xq + i * K + (g + j + c) * 32));
            for (int r = 0; r < rows; r++) {
                __m256i w[4];
                four_groups(codes + r * row_bytes + (g + j) * 16, w);
                for (int i = 0; i < mb; i++) {
                    const __m256i sum = four_group_dots(w, x[i]);
                    acc[r * mb + i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                                      _mm256_broadcast_ps((const __m128 *)&sc[r * mb + i][j]), acc[r * mb + i]);
                }
            }
        }
    }
    for (; g < G; g += 2) { /* G is even: the tail is whole pairs of groups (none with kq) */
        for (int r = 0; r < rows; r++) {
            const uint16_t *s = (const uint16_t *)table + r * row_scales;
            const __m256i b = _mm256_loadu_si256((const __m256i *)(codes + r * row_bytes + g * 16));
            const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            for (int i = 0; i < mb; i++) {
                const int a = r * mb + i;
                const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + i * K + g * 32));
                const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + i * K + g * 32 + 32));
                const __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xa), ones);
                const __m256i pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xb), ones);
                acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pa), _mm256_set1_ps(bf16(s[g]) * dx[i * G + g]), acc[a]);
                acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pb), _mm256_set1_ps(bf16(s[g + 1]) * dx[i * G + g + 1]), acc[a]);
                const __m256 z = _mm256_setr_ps((bf16(s[G + g]) - 8.0f * bf16(s[g])) * xs[i * G + g],
                                                (bf16(s[G + g + 1]) - 8.0f * bf16(s[g + 1])) * xs[i * G + g + 1], 0, 0, 0,
                                                0, 0, 0);
                zacc[a] = _mm256_add_ps(zacc[a], z);
            }
        }
    }
    copy_acc(rows * mb, acc_out, zacc_out, acc, zacc);
}

/* The tile's accumulators, cleared. */
static inline void zero_rows(__m256 *acc, __m256 *zacc) {
    for (int r = 0; r < ACC; r++) {
        acc[r] = _mm256_setzero_ps();
        zacc[r] = _mm256_setzero_ps();
    }
}

/* A tile's outputs from its accumulators (rows r of token i at acc/zacc[r * mb + i]) into y's rows
 * (ldy apart; written, or added with accumulate). */
static inline void store_rows(int rows, int mb, const __m256 *acc, const __m256 *zacc, const float *bias, int64_t n0,
                              float *y, int64_t ldy, int accumulate) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < mb; i++) {
            const float out = hsum8(acc[r * mb + i]) + hsum8(zacc[r * mb + i]) + (bias ? bias[n0 + r] : 0.0f);
            float *dst = y + i * ldy + n0 + r;
            *dst = accumulate ? *dst + out : out;
        }
}

/* x's rows as int8 groups: xq [M, K], their scales dx [M, G] and dx * sum(xq) xs [M, G], in this
 * thread's scratch; norm / gated as for specchat_int4_mm. Returns -1 when scratch could not be had. */
static int prepare(const float *x, int64_t M, int64_t K, const float *norm, float eps, int gated, int8_t **xq_out,
                   float **dx_out, float **xs_out, float **halves_out) {
    const int64_t G = K / 32, H = HALVES(G);
    if ((size_t)(M * K) > t_cap) {
        free(t_xq);
        free(t_dx);
        t_xq = (int8_t *)aligned_alloc(64, (size_t)(M * K + 64));
        /* dx, xs and halves: 2 M G + M H <= 4 M G + 6 M <= M K / 4 floats, as K >= 64 */
        t_dx = (float *)malloc(sizeof(float) * (size_t)(M * K / 4 + 16));
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
    float *dx = t_dx, *xs = t_dx + M * G, *halves = t_dx + 2 * M * G;
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
            dx[m * G + g] = quantize_group(v, xq + m * K + g * 32, xs + m * G + g, halves + m * H + g / 4 * 8 + g % 4);
        }
#if SPECCHAT_VNNI
        vnni_order(xq + m * K, K);
#endif
    }

    *xq_out = xq;
    *dx_out = dx;
    *xs_out = xs;
    *halves_out = halves;
    return 0;
}

/* 8-bit weights (two int4 planes joined: v = 16 h + l - 128): the dots of `rows` consecutive rows with `mb`
 * tokens, as dot_rows. codes int8 [rows][K]; st fp32 per row [2][G]: scales s, then offsets c, w = v s + c.
 * |v| <= 128 and |xq| <= 127, so vpmaddubsw's pair sums (|v| * sign-moved xq) never saturate
 * (2 * 128 * 127 < 32768). */
static inline __attribute__((always_inline)) void dot_rows8(int rows, int mb, int ahead, const int8_t *codes,
                                                            const float *st, int64_t K, const int8_t *xq,
                                                            const float *dx, const float *xs, const float *halves,
                                                            __m256 *acc_out, __m256 *zacc_out) {
    /* the accumulators in registers (through the pointers every update would go to memory and back) */
    __m256 acc[ACC], zacc[ACC];
    copy_acc(rows * mb, acc, zacc, acc_out, zacc_out);
    const int64_t G = K / 32, H = HALVES(G);
    (void)H; /* the VNNI variant's offsets */
    const __m256i ones = _mm256_set1_epi16(1);
    float sc[ACC][8] __attribute__((aligned(32)));
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) {
        for (int r = 0; r < rows; r++) {
            const float *t = st + r * 2 * G;
            const __m256 scale = _mm256_loadu_ps(t + g), off = _mm256_loadu_ps(t + G + g);
            for (int i = 0; i < mb; i++) {
                _mm256_store_ps(sc[r * mb + i], _mm256_mul_ps(scale, _mm256_loadu_ps(dx + i * G + g)));
                zacc[r * mb + i] = _mm256_fmadd_ps(off, _mm256_loadu_ps(xs + i * G + g), zacc[r * mb + i]);
            }
        }
        for (int r = 0; r < rows; r++) /* the next tile's same 256 bytes, ahead of need */
            for (int c = 0; c < 256; c += 64) _mm_prefetch((const char *)(codes + (r + ahead) * K + g * 32 + c), _MM_HINT_T0);
        for (int j = 0; j < 8; j += 4) { /* four groups, summed pairwise as in dot_rows */
            __m256i x[MB][4];
            for (int i = 0; i < mb; i++)
                for (int c = 0; c < 4; c++) x[i][c] = _mm256_loadu_si256((const __m256i *)(xq + i * K + (g + j + c) * 32));
#if SPECCHAT_VNNI
            /* v + 128 is the u8 side of the dots: their sums are sum v xq + 128 sum xq, and each lane starts from
             * -128 times its 16 activations' sum (4 x prepare's halves, -32 x that sum: exact integers) */
            __m256i start[MB];
            for (int i = 0; i < mb; i++)
                start[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_set1_ps(4.0f), _mm256_loadu_ps(halves + i * H + 2 * (g + j))));
            const __m256i flip = _mm256_set1_epi8((char)0x80);
#endif
            for (int r = 0; r < rows; r++) {
#if SPECCHAT_VNNI
                __m256i u[4];
                for (int c = 0; c < 4; c++)
                    u[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(codes + r * K + (g + j + c) * 32)), flip);
                for (int i = 0; i < mb; i++) {
                    const __m256i sum = dot4(u, x[i], start[i]);
#else
                __m256i w[4], aw[4];
                for (int c = 0; c < 4; c++) {
                    w[c] = _mm256_loadu_si256((const __m256i *)(codes + r * K + (g + j + c) * 32));
                    aw[c] = _mm256_sign_epi8(w[c], w[c]);
                }
                for (int i = 0; i < mb; i++) {
                    __m256i p[4];
                    for (int c = 0; c < 4; c++)
                        p[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(x[i][c], w[c])), ones);
                    const __m256i sum = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
#endif
                    acc[r * mb + i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                                      _mm256_broadcast_ps((const __m128 *)&sc[r * mb + i][j]), acc[r * mb + i]);
                }
            }
        }
    }
    for (; g < G; g++) {
        for (int r = 0; r < rows; r++) {
            const float *t = st + r * 2 * G;
            const __m256i w = _mm256_loadu_si256((const __m256i *)(codes + r * K + g * 32));
            const __m256i aw = _mm256_sign_epi8(w, w);
            for (int i = 0; i < mb; i++) {
                const int a = r * mb + i;
                const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + i * K + g * 32));
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xa, w)), ones);
                acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(t[g] * dx[i * G + g]), acc[a]);
                zacc[a] = _mm256_add_ps(zacc[a], _mm256_setr_ps(t[G + g] * xs[i * G + g], 0, 0, 0, 0, 0, 0, 0));
            }
        }
    }
    copy_acc(rows * mb, acc_out, zacc_out, acc, zacc);
}

/* 6-bit weights in sub-blocks of 16 (a GGUF's Q6_K, code for code): w = v s, v = q - 32, q in 0..63, one
 * bf16 scale s per 16 weights. A row is its codes (K * 3/4 bytes) and then its scales (K / 16 bf16), padded
 * to 32 bytes. Each 128 weights take 96 bytes: bytes 0..31 hold weights j (low nibble) and j + 32 (high),
 * bytes 32..63 weights 64 + j and 96 + j, and byte 64 + j the top two bits of weights j, 32 + j, 64 + j and
 * 96 + j (bits 0-1, 2-3, 4-5, 6-7). Per group of 32: vpmaddubsw(q, xq) (|pairs| <= 2 * 63 * 127, no
 * saturation), summed to int32 lanes 0..3 (the first 16 weights) and 4..7 (the next 16); four groups'
 * sums pairwise (vphaddd: lanes 0..3 the groups' first 16 weights, 4..7 their last) and one multiply-add
 * with their scales times dx into acc. The -32 of each code is paid once a super-block into zacc: the
 * scales times dx times -32 sum(xq) per 16 (prepare's halves, in the same lane order).
 * kq = 1: the rows hold only their codes (stride K * 3/4), and the scales come from the super-blocks' own
 * 18 bytes in `table` (row_table bytes a row; per super-block the 16 int8 sub-scales sc, then fp16 d, as a
 * GGUF stores them): s = d sc, exact in fp32 (11 bits of d times 8 of sc), 6.56 bits a weight, not 7. */
static inline __attribute__((always_inline)) void dot_rows6(int rows, int mb, int ahead, int kq, const uint8_t *w,
                                                            int64_t stride, const uint8_t *table, int64_t row_table,
                                                            int64_t K, const int8_t *xq, const float *dx,
                                                            const float *halves, __m256 *acc_out, __m256 *zacc_out) {
    /* the accumulators in registers (through the pointers every update would go to memory and back) */
    __m256 acc[ACC], zacc[ACC];
    copy_acc(rows * mb, acc, zacc, acc_out, zacc_out);
    const int64_t G = K / 32, H = HALVES(G);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
#if !SPECCHAT_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const int64_t code_bytes = K / 4 * 3;
    /* per (row, token) and half super-block: its 8 scales in the order the summed lanes come, times dx */
    __m256 sd[ACC][2];
    for (int64_t b = 0; b < K / 256; b++) { /* super-blocks of 256 weights: 8 groups, 16 scales */
        const int64_t g = 8 * b;
        for (int r = 0; r < rows; r++) {
            __m256 lo, hi;
            if (kq) {
                const uint8_t *t = table + r * row_table + 18 * b;
                const __m128i sc = _mm_loadu_si128((const __m128i *)t);
                uint16_t dh;
                memcpy(&dh, t + 16, sizeof dh);
                const __m256 d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
                lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
                hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
            } else {
                const uint16_t *s = (const uint16_t *)(w + r * stride + code_bytes) + 16 * b;
                lo = bf16x8(s);
                hi = bf16x8(s + 8);
            }
            lo = _mm256_permutevar8x32_ps(lo, order);
            hi = _mm256_permutevar8x32_ps(hi, order);
            for (int i = 0; i < mb; i++) { /* and the offsets' part, sum_i (-32) xq_i s per 16 */
                const int a = r * mb + i;
                sd[a][0] = _mm256_mul_ps(lo, _mm256_broadcast_ps((const __m128 *)(dx + i * G + g)));
                sd[a][1] = _mm256_mul_ps(hi, _mm256_broadcast_ps((const __m128 *)(dx + i * G + g + 4)));
                zacc[a] = _mm256_fmadd_ps(sd[a][0], _mm256_loadu_ps(halves + i * H + 2 * g), zacc[a]);
                zacc[a] = _mm256_fmadd_ps(sd[a][1], _mm256_loadu_ps(halves + i * H + 2 * g + 8), zacc[a]);
            }
        }
        for (int r = 0; r < rows; r++) /* the next tile's same 192 bytes, ahead of need */
            for (int c = 0; c < 192; c += 64) {
#if SPECCHAT_VNNI
                /* a tile of long rows (SIX_TILE_ROW) reads some 30 KB before it needs these: into L2, not
                 * L1, where they would be gone by then (coder's Q6_K down: 0.44 -> 0.38 ms a layer here) */
                if (rows > 1) {
                    _mm_prefetch((const char *)(w + (r + ahead) * stride + 192 * b + c), _MM_HINT_T1);
                    continue;
                }
#endif
                _mm_prefetch((const char *)(w + (r + ahead) * stride + 192 * b + c), _MM_HINT_T0);
            }
        for (int h = 0; h < 2; h++) {
            __m256i xa[MB][4];
            for (int i = 0; i < mb; i++)
                for (int c = 0; c < 4; c++) xa[i][c] = _mm256_loadu_si256((const __m256i *)(xq + i * K + (g + 4 * h + c) * 32));
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
                for (int i = 0; i < mb; i++) {
                    const int a = r * mb + i;
#if SPECCHAT_VNNI
                    const __m256i sum = dot4(q, xa[i], _mm256_setzero_si256()); /* codes 0..63 are the u8 side */
#else
                    __m256i p[4];
                    for (int k = 0; k < 4; k++)
                        p[k] = _mm256_maddubs_epi16(q[k], xa[i][k]);
                    /* int16 sums of 4 products (|sum| <= 4 * 63 * 127 < 32768: exact), int32 sums of 8, then
                     * lanes 0..3 the four groups' first 16 weights, 4..7 their last 16 */
                    const __m256i sum = _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones),
                                                          _mm256_madd_epi16(_mm256_hadd_epi16(p[2], p[3]), ones));
#endif
                    acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sd[a][h], acc[a]);
                }
            }
        }
    }
    copy_acc(rows * mb, acc_out, zacc_out, acc, zacc);
}

enum { INT4 = 0, INT8 = 1, INT6 = 2, INT4K = 3, INT6K = 4, INT4KT = 5 };
#define SIX_BITS(kind) ((kind) == INT6 || (kind) == INT6K)

/* Where one kind of weights lies: codes (and for INT4 P planes side by side), scales/table. */
typedef struct {
    int kind;
    const uint8_t *codes;
    const void *table; /* INT4: bf16 [N, P, 2, G]; INT8: fp32 [N, 2, G]; INT6: NULL (in the rows);
                        * INT4K: Q4_K headers uint8 [N, K / 256, 16]; INT6K: Q6_K's uint8 [N, K / 256, 18];
                        * INT4KT: unused (the headers lie in the tiles: codes [N / TILE, K / 256, TILE * TILE_ROW]) */
    int64_t K, P, row_bytes;
} weights_t;

/* One weights kind's dots for a tile: `rows` rows from n0 with `mb` tokens, the constants each inlined
 * dot needs. ONE(...) expands a call for one (rows, mb, prefetch distance). DOTS: one token in tiles of
 * ROWS rows (or one), several one row at a time; DOTS_WIDE: several tokens in tiles of MROWS rows. */
#define DOTS(ONE)                                                                                                   \
    do {                                                                                                            \
        if (mb == 1 && rows == ROWS) ONE(ROWS, 1, ROWS);                                                            \
        else if (mb == 1 && tile == 1) ONE(1, 1, 1);                                                                \
        else if (mb == 1) ONE(rows, 1, ROWS);                                                                       \
        else if (mb == 2) ONE(1, 2, 1);                                                                             \
        else if (mb == 3) ONE(1, 3, 1);                                                                             \
        else ONE(1, MB, 1);                                                                                         \
    } while (0)
#define DOTS_WIDE(ONE)                                                                                              \
    do {                                                                                                            \
        if (rows == MROWS && mb == 1) ONE(MROWS, 1, MROWS);                                                         \
        else if (rows == MROWS && mb == 2) ONE(MROWS, 2, MROWS);                                                    \
        else if (rows == MROWS && mb == 3) ONE(MROWS, 3, MROWS);                                                    \
        else if (rows == MROWS) ONE(MROWS, MB, MROWS);                                                              \
        else ONE(rows, mb, MROWS);                                                                                  \
    } while (0)

/* The dot products of `rows` weight rows from n0 with `mb` tokens (rows * mb <= ACC), into acc/zacc, each
 * constant (rows, mb) pair its own inlined copy, chosen by shape (CHOOSE: DOTS or DOTS_WIDE). */
#define TILE_DOT(CHOOSE)                                                                                            \
    do {                                                                                                            \
        const int64_t K = wt->K, G = K / 32;                                                                        \
        if (wt->kind == INT4) {                                                                                     \
            const int64_t row_scales = 2 * wt->P * G;                                                               \
            for (int64_t p = 0; p < wt->P; p++) {                                                                   \
                const uint8_t *c = wt->codes + n0 * wt->row_bytes + p * (K / 2);                                    \
                const uint16_t *z = (const uint16_t *)wt->table + n0 * row_scales + p * 2 * G;                      \
                CHOOSE(INT4_DOT);                                                                                   \
            }                                                                                                       \
        } else if (wt->kind == INT4K) {                                                                             \
            const uint8_t *c = wt->codes + n0 * wt->row_bytes;                                                      \
            const uint8_t *z = (const uint8_t *)wt->table + n0 * (K / 16);                                          \
            CHOOSE(INT4K_DOT);                                                                                      \
        } else if (wt->kind == INT8) {                                                                              \
            const int8_t *c = (const int8_t *)wt->codes + n0 * K;                                                   \
            const float *z = (const float *)wt->table + n0 * 2 * G;                                                 \
            CHOOSE(INT8_DOT);                                                                                       \
        } else if (wt->kind == INT6K) {                                                                             \
            const uint8_t *c = wt->codes + n0 * wt->row_bytes;                                                      \
            const uint8_t *z = (const uint8_t *)wt->table + n0 * (K / 256 * 18);                                    \
            CHOOSE(INT6K_DOT);                                                                                      \
        } else {                                                                                                    \
            const uint8_t *c = wt->codes + n0 * wt->row_bytes;                                                      \
            CHOOSE(INT6_DOT);                                                                                       \
        }                                                                                                           \
    } while (0)
#define INT4_DOT(R, B, A) dot_rows(R, B, A, 0, c, z, wt->row_bytes, row_scales, K, xq, dx, xs, acc, zacc)
#define INT4K_DOT(R, B, A) dot_rows(R, B, A, 1, c, z, wt->row_bytes, K / 16, K, xq, dx, xs, acc, zacc)
#define INT8_DOT(R, B, A) dot_rows8(R, B, A, c, z, K, xq, dx, xs, halves, acc, zacc)
#define INT6_DOT(R, B, A) dot_rows6(R, B, A, 0, c, wt->row_bytes, NULL, 0, K, xq, dx, halves, acc, zacc)
#define INT6K_DOT(R, B, A) dot_rows6(R, B, A, 1, c, wt->row_bytes, z, K / 256 * 18, K, xq, dx, halves, acc, zacc)

static inline void tile_dot(const weights_t *wt, int rows, int mb, int64_t tile, int64_t n0, const int8_t *xq,
                            const float *dx, const float *xs, const float *halves, __m256 *acc, __m256 *zacc) {
    TILE_DOT(DOTS);
}

/* tile_dot for several tokens in tiles of MROWS rows (the AVX-512 build's): not inlined, so
 * that its copies leave the code of every other shape as it was (inlined, they slowed the rest by 5-10%). */
static __attribute__((noinline)) void tile_dot_wide(const weights_t *wt, int rows, int mb, int64_t n0, const int8_t *xq,
                                                    const float *dx, const float *xs, const float *halves, __m256 *acc,
                                                    __m256 *zacc) {
    TILE_DOT(DOTS_WIDE);
}

/* The dots of a whole tile of tiled Q4_K rows (INT4KT) with `mb` <= MB consecutive tokens, into acc/zacc[r * mb + i]:
 * dot_rows' arithmetic, output for output, with its accumulators of the rows' offsets (zacc) summed after each
 * run of ZB super-blocks from the offsets kept on the stack, so that the products' TILE x mb accumulators alone
 * hold registers while the codes stream (each activation load serving the tile's rows). */
#define ZB 8 /* super-blocks whose offsets wait on the stack for their sums */
static inline __attribute__((always_inline)) void dot_tile(int mb, const uint8_t *tile, int64_t K, const int8_t *xq,
                                                           const float *dx, const float *xs, __m256 *acc_out,
                                                           __m256 *zacc_out) {
    const int64_t G = K / 32, B = K / 256, bstep = TILE * TILE_ROW;
    __m256 acc[TILE * MB], zacc[TILE * MB];
    for (int a = 0; a < TILE * mb; a++) {
        acc[a] = _mm256_setzero_ps();
        zacc[a] = _mm256_setzero_ps();
    }
    float sc[TILE * MB][8] __attribute__((aligned(32)));
    __m256 offs[ZB][TILE];
    for (int64_t b0 = 0; b0 < B; b0 += ZB) {
        const int64_t b1 = b0 + ZB < B ? b0 + ZB : B;
        for (int64_t b = b0; b < b1; b++) {
            const int64_t g = 8 * b;
            const uint8_t *blk = tile + b * bstep;
            for (int r = 0; r < TILE; r++) {
                __m256 scale;
                kq_scales(blk + 16 * r, &scale, &offs[b - b0][r]);
                for (int i = 0; i < mb; i++)
                    _mm256_store_ps(sc[r * mb + i], _mm256_mul_ps(scale, _mm256_loadu_ps(dx + i * G + g)));
            }
            for (int64_t c = 0; c < bstep; c += 64) /* the tile's stream, TILE_AHEAD super-blocks on */
                _mm_prefetch((const char *)blk + TILE_AHEAD * bstep + c, _MM_HINT_T0);
            for (int j = 0; j < 8; j += 4) { /* four groups: 64 bytes of codes a row */
                for (int r = 0; r < TILE; r++) {
                    __m256i w[4];
                    four_groups(blk + TILE * 16 + r * 128 + j * 16, w);
                    for (int i = 0; i < mb; i++) {
                        const __m256i *xi = (const __m256i *)(xq + i * K + (g + j) * 32);
                        const __m256i x[4] = {_mm256_loadu_si256(xi), _mm256_loadu_si256(xi + 1),
                                              _mm256_loadu_si256(xi + 2), _mm256_loadu_si256(xi + 3)};
                        const __m256i sum = four_group_dots(w, x);
                        acc[r * mb + i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                                          _mm256_broadcast_ps((const __m128 *)&sc[r * mb + i][j]),
                                                          acc[r * mb + i]);
                    }
                }
            }
        }
        for (int r = 0; r < TILE; r++) /* the offsets' sums, super-block by super-block as dot_rows adds them */
            for (int i = 0; i < mb; i++)
                for (int64_t b = b0; b < b1; b++)
                    zacc[r * mb + i] = _mm256_fmadd_ps(offs[b - b0][r], _mm256_loadu_ps(xs + i * G + 8 * b),
                                                       zacc[r * mb + i]);
    }
    for (int a = 0; a < TILE * mb; a++) {
        acc_out[a] = acc[a];
        zacc_out[a] = zacc[a];
    }
}

/* One pass of `mb` <= MB tokens over the tile of tiled Q4_K rows from n0 (a multiple of TILE) into y's rows.
 * Not inlined, like tile_dot_wide. */
static __attribute__((noinline)) void tiled_pass(const weights_t *wt, int mb, int64_t n0, const int8_t *xq,
                                                 const float *dx, const float *xs, const float *bias, float *y,
                                                 int64_t ldy, int accumulate) {
    const int64_t K = wt->K;
    const uint8_t *tile = wt->codes + n0 / TILE * (K / 256 * TILE * TILE_ROW);
    __m256 acc[TILE * MB], zacc[TILE * MB];
    if (mb == 1) dot_tile(1, tile, K, xq, dx, xs, acc, zacc);
    else if (mb == 2) dot_tile(2, tile, K, xq, dx, xs, acc, zacc);
    else if (mb == 3) dot_tile(3, tile, K, xq, dx, xs, acc, zacc);
    else dot_tile(MB, tile, K, xq, dx, xs, acc, zacc);
    store_rows(TILE, mb, acc, zacc, bias, n0, y, ldy, accumulate);
}

/* y [M, N] (rows ldy apart) = x @ W.T (+ bias) for any kind of weights: x's rows quantized once, then
 * blocks of MCHUNK tokens. One token: tiles of ROWS output rows (one row for long rows), one thread a tile.
 * Several: MROWS output rows at a time (AVX-512: two, AVX2: one) with up to MB tokens, so each
 * row's codes are unpacked once for them.
 * Either way each output gets the same instructions (dot_rows), so a token's bits never depend on M. */
static int run(const weights_t *wt, const float *bias, int64_t N, const float *x, int64_t M, float *y, int64_t ldy,
               int threads, const float *norm, float eps, int accumulate, int gated) {
    const int64_t K = wt->K, G = K / 32, H = HALVES(G);
    int8_t *xq;
    float *dx, *xs, *halves;
    if (prepare(x, M, K, norm, eps, gated, &xq, &dx, &xs, &halves)) return -1;
    for (int64_t m0 = 0; m0 < M; m0 += MCHUNK) {
        const int64_t m1 = m0 + MCHUNK < M ? m0 + MCHUNK : M;
        const int tiled = wt->row_bytes < LONG_ROW || (SIX_BITS(wt->kind) && wt->row_bytes >= SIX_TILE_ROW);
        /* several tokens take MROWS rows a tile, each activation load serving them all: on the VNNI machine
         * measured (Zen 4) 1.1-1.3x faster than one row at a time for every int4 shape of pocket and coder,
         * two tokens to 32 (a 32-token prompt piece of coder's gate_up, 17920 x 1536: 10.7 -> 8.4 ms) */
        const int wide = MROWS > 1 && m1 - m0 > 1;
        const int kt = wt->kind == INT4KT; /* tiled rows: a tile of TILE rows at a time, whatever M (N % TILE == 0) */
        const int64_t tile = kt ? TILE : wide ? MROWS : m1 - m0 > 1 || !tiled ? 1 : ROWS;
        const int64_t tiles = (N + tile - 1) / tile;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t n0 = t * tile;
            const int rows = (int)(N - n0 < tile ? N - n0 : tile);
            if (kt) {
                for (int64_t m = m0, q = (m1 - m0 + MB - 1) / MB; q > 0; q--) { /* passes as below */
                    const int mb = (int)((m1 - m + q - 1) / q);
                    tiled_pass(wt, mb, n0, xq + m * K, dx + m * G, xs + m * G, bias, y + m * ldy, ldy, accumulate);
                    m += mb;
                }
                continue;
            }
            if (m1 - m0 == 1) { /* one token (a decoding step): its own call, the shape known here */
                __m256 acc[ACC], zacc[ACC];
                zero_rows(acc, zacc);
                tile_dot(wt, rows, 1, tile, n0, xq + m0 * K, dx + m0 * G, xs + m0 * G, halves + m0 * H, acc, zacc);
                store_rows(rows, 1, acc, zacc, bias, n0, y + m0 * ldy, ldy, accumulate);
                continue;
            }
            /* the block's tokens in passes of at most MB, as even as they go (5 tokens: 3 + 2, not 4 + 1: a
             * pass of one token costs nearly a pass of two, and a pass of four more than two of two) */
            const int64_t passes = (m1 - m0 + MB - 1) / MB;
            int64_t m = m0;
            for (int64_t q = passes; q > 0; q--) {
                const int mb = (int)((m1 - m + q - 1) / q);
                __m256 acc[ACC], zacc[ACC];
                zero_rows(acc, zacc);
                if (wide)
                    tile_dot_wide(wt, rows, mb, n0, xq + m * K, dx + m * G, xs + m * G, halves + m * H, acc, zacc);
                else
                    tile_dot(wt, rows, mb, tile, n0, xq + m * K, dx + m * G, xs + m * G, halves + m * H, acc, zacc);
                store_rows(rows, mb, acc, zacc, bias, n0, y + m * ldy, ldy, accumulate);
                m += mb;
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

/* y [M, N] fp32 = x [M, K] fp32 @ W.T (+ bias) for a GGUF's Q4_K rows: codes as specchat_int4_mm's (one plane),
 * headers uint8 [N, K / 256, 16] the super-blocks' own (see the top of this file); norm, eps, accumulate, gated
 * as for specchat_int4_mm, and the same batch invariance. K % 256 == 0. Returns 0, or -1 (no scratch). */
int specchat_int4k_mm(const uint8_t *codes, const uint8_t *headers, const float *bias, int64_t N, int64_t K,
                      const float *x, int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps,
                      int accumulate, int gated) {
    const weights_t wt = {INT4K, codes, headers, K, 1, K / 2};
    return run(&wt, bias, N, x, M, y, ldy, threads, norm, eps, accumulate, gated);
}

/* specchat_int4k_mm for Q4_K rows in tiles (cpu_pack.tile_rows): tiles uint8 [N / TILE, K / 256, TILE * 144], per
 * super-block the TILE rows' headers then their codes; N % TILE == 0, K % 256 == 0. The same outputs, bit for
 * bit, as specchat_int4k_mm over the same rows. Returns 0, or -1 (no scratch). */
int specchat_int4kt_mm(const uint8_t *tiles, const float *bias, int64_t N, int64_t K, const float *x, int64_t M,
                       float *y, int64_t ldy, int threads, const float *norm, float eps, int accumulate, int gated) {
    const weights_t wt = {INT4KT, tiles, NULL, K, 1, K / 256 * TILE_ROW};
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

/* y [M, N] fp32 = x [M, K] fp32 @ W.T (+ bias) for a GGUF's Q6_K rows: codes uint8 [N, K * 3/4] as dot_rows6
 * reads them, headers uint8 [N, K / 256, 18] the super-blocks' own sub-scales and d; norm, eps, accumulate,
 * gated as for specchat_int4_mm, and the same batch invariance. K % 256 == 0. Returns 0, or -1 (no scratch). */
int specchat_int6k_mm(const uint8_t *codes, const uint8_t *headers, const float *bias, int64_t N, int64_t K,
                      const float *x, int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps,
                      int accumulate, int gated) {
    const weights_t wt = {INT6K, codes, headers, K, 1, K / 4 * 3};
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
