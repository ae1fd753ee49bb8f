/* specchat's CPU decoder layer in one call: the joint q/k/v product (its pre-norm folded in), the attention
 * step, o (added into the residual stream), gate/up (its pre-norm folded in) and down (silu(gate) * up,
 * added into the stream), each through the very entry points a layer's five Python calls reach
 * (int4_avx2.c, attention_avx2.c), in the same order with the same arguments: the same bits, without five
 * ctypes calls and their argument checks a layer (about 30 us a layer on a 2-core Zen 4). Built with the
 * other kernels by engine/quant/cpu_kernel.py; called by engine/model/cpu_layer.py. */
#include <stddef.h>
#include <stdint.h>

int specchat_int4_mm(const uint8_t *codes, const uint16_t *sz, const float *bias, int64_t N, int64_t K, int64_t P,
                     const float *x, int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps,
                     int accumulate, int gated);
int specchat_int8_mm(const int8_t *codes, const float *st, const float *bias, int64_t N, int64_t K, const float *x,
                     int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps, int accumulate,
                     int gated);
int specchat_int6_mm(const uint8_t *rows, int64_t stride, const float *bias, int64_t N, int64_t K, const float *x,
                     int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps, int accumulate,
                     int gated);
int specchat_int4k_mm(const uint8_t *codes, const uint8_t *headers, const float *bias, int64_t N, int64_t K,
                      const float *x, int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps,
                      int accumulate, int gated);
int specchat_int6k_mm(const uint8_t *codes, const uint8_t *headers, const float *bias, int64_t N, int64_t K,
                      const float *x, int64_t M, float *y, int64_t ldy, int threads, const float *norm, float eps,
                      int accumulate, int gated);
int specchat_int4kt_mm(const uint8_t *tiles, const float *bias, int64_t N, int64_t K, const float *x, int64_t M,
                       float *y, int64_t ldy, int threads, const float *norm, float eps, int accumulate, int gated);
int specchat_attention(float *qkv, int64_t T, int64_t start, const float *cos, const float *sin, uint16_t *kbuf,
                       uint16_t *vbuf, int64_t cap, int64_t H, int64_t KV, int64_t d, float scale, float *out,
                       int threads, int attend_rows);

/* One product as engine/quant/cpu_linear.linear calls it: kind 0 int4 (one plane), 1 8-bit, 2 6-bit rows
 * (`stride` bytes apart; table unused), 3 int4 with Q4_K headers, 4 6-bit codes with Q6_K headers, 5 Q4_K rows
 * in tiles (table unused). */
typedef struct {
    int64_t kind;
    const void *codes, *table;
    int64_t stride;
    const float *bias;
    int64_t N, K;
} specchat_product;

/* A layer: up to 4 runs of the q/k/v product writing side by side, o, gate/up, down, the two pre-norms. */
typedef struct {
    specchat_product qkv[4];
    int64_t n_qkv;
    specchat_product o, gate_up, down;
    const float *norm1, *norm2;
    float eps1, eps2, scale;
    int64_t H, KV, d;
} specchat_layer_t;

static int product(const specchat_product *p, const float *x, int64_t M, float *y, int64_t ldy, int threads,
                   const float *norm, float eps, int accumulate, int gated) {
    if (p->kind == 0)
        return specchat_int4_mm((const uint8_t *)p->codes, (const uint16_t *)p->table, p->bias, p->N, p->K, 1, x, M,
                                y, ldy, threads, norm, eps, accumulate, gated);
    if (p->kind == 4)
        return specchat_int6k_mm((const uint8_t *)p->codes, (const uint8_t *)p->table, p->bias, p->N, p->K, x, M, y,
                                 ldy, threads, norm, eps, accumulate, gated);
    if (p->kind == 3)
        return specchat_int4k_mm((const uint8_t *)p->codes, (const uint8_t *)p->table, p->bias, p->N, p->K, x, M, y,
                                 ldy, threads, norm, eps, accumulate, gated);
    if (p->kind == 5)
        return specchat_int4kt_mm((const uint8_t *)p->codes, p->bias, p->N, p->K, x, M, y, ldy, threads, norm, eps,
                                  accumulate, gated);
    if (p->kind == 1)
        return specchat_int8_mm((const int8_t *)p->codes, (const float *)p->table, p->bias, p->N, p->K, x, M, y, ldy,
                                threads, norm, eps, accumulate, gated);
    return specchat_int6_mm((const uint8_t *)p->codes, p->stride, p->bias, p->N, p->K, x, M, y, ldy, threads, norm,
                            eps, accumulate, gated);
}

/* x [T, hidden] fp32 (the residual stream, updated in place) through layer L for T new tokens at positions
 * start .. start + T - 1: kbuf/vbuf fp16 [KV, cap, d] (written at those positions), cos/sin [T, d], and scratch
 * qkv [T, sum of qkv's N], att [T, H d], gu [T, gate_up's N]. Returns 0, or the first failing call's code. */
int specchat_layer(const specchat_layer_t *L, float *x, int64_t T, int64_t start, const float *cos, const float *sin,
                   uint16_t *kbuf, uint16_t *vbuf, int64_t cap, float *qkv, float *att, float *gu, int threads) {
    int64_t width = 0;
    for (int64_t r = 0; r < L->n_qkv; r++) width += L->qkv[r].N;
    const int64_t hidden = L->o.N;
    int64_t col = 0;
    for (int64_t r = 0; r < L->n_qkv; r++) {
        if (product(&L->qkv[r], x, T, qkv + col, width, threads, L->norm1, L->eps1, 0, 0)) return -1;
        col += L->qkv[r].N;
    }
    if (specchat_attention(qkv, T, start, cos, sin, kbuf, vbuf, cap, L->H, L->KV, L->d, L->scale, att, threads, 1))
        return -2;
    if (product(&L->o, att, T, x, hidden, threads, NULL, 0.0f, 1, 0)) return -1;
    if (product(&L->gate_up, x, T, gu, L->gate_up.N, threads, L->norm2, L->eps2, 0, 0)) return -1;
    if (product(&L->down, gu, T, x, hidden, threads, NULL, 0.0f, 1, 1)) return -1;
    return 0;
}
