/* Decode attention over listed key blocks, read in place from the KV cache.
 *
 * A sparse decode step attends one query per head to the blocks its selection lists. In torch
 * that is a gather of those blocks (or a buffer kept across steps), a copy of the current block
 * and an SDPA call: on a 2-core AVX2 CPU ~1 ms per layer for 1,500 keys with the cache cold,
 * i.e. 2.5-4 GB/s, where reading the rows once can stream at several times that. This file reads
 * each listed K row and V row once, straight from the cache, for all the query heads that share
 * the KV head and the list: scores in a first pass, softmax and the weighted V sum in a second.
 * Reference: kernels/reference.py (block_sparse_attention_reference); launcher:
 * kernels/decode_attention.py; loader: kernels/native.py.
 *
 * Layout: q [B, H, d] (contiguous); k and v of any strides (batch, head, token; the head dim is
 * contiguous); ids [B, G, width] int32 block ids (any order, duplicates and ids outside the cache
 * ignored) with counts [B, G] of them live; query head qh reads list qh * G / H and KV head
 * qh / (H / Hkv). Sequence bi sees tokens starts[bi] .. lk - 1 (left padding before; starts may
 * be NULL). A head whose list sees no token gets zeros. out [B, H, d].
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp.h"

/* One vector of query or key coordinates: 16 lanes with AVX-512, else 8 (vec.h). */
#if defined(__AVX512F__)
typedef float vecw __attribute__((vector_size(64), aligned(4)));
#define WIDE 16
static inline float lane_sum(vecw x) { return _mm512_reduce_add_ps((__m512)x); }
#else
typedef vec8 vecw;
#define WIDE 8
static inline float lane_sum(vecw x) {
    float s = 0.0f;
    for (int i = 0; i < WIDE; i++) s += x[i];
    return s;
}
#endif

#define QROWS 4   /* query rows per pass over the keys (the value sums stay in registers) */
#define VCOLS 256 /* head-dim coordinates per pass of the value sums */
#define AHEAD 32  /* tokens ahead whose K and V rows the score pass prefetches */
#define INLINE static inline __attribute__((always_inline))

/* Bring the row of d floats at x towards the cache: the listed blocks are 4 KB islands in a
 * cold cache (a model's other layers passed through it since this one ran), which the
 * hardware prefetchers do not run ahead into. */
INLINE void prefetch_row(const float* x, int64_t d) {
    for (int64_t c = 0; c < d; c += 64 / (int64_t)sizeof(float)) __builtin_prefetch(x + c);
}

/* Scores of nq query rows (d floats each, already scaled) against the keys of the n tokens
 * rows[] into s (row stride n), prefetching the K and V rows AHEAD tokens on: whole vectors of
 * coordinates, then the tail. Inlined with constant nq and d the loops unroll and every dot
 * product is a few multiply-adds and one lane sum. */
INLINE void row_scores(const float* q, int64_t nq, int64_t d, const float* k, int64_t kts,
                       const float* v, int64_t vts, const int64_t* rows, int64_t n, float* s) {
    const int64_t whole = d / WIDE * WIDE;
    for (int64_t at = 0; at < n; at++) {
        if (at + AHEAD < n) {
            prefetch_row(k + rows[at + AHEAD] * kts, d);
            prefetch_row(v + rows[at + AHEAD] * vts, d);
        }
        const float* kr = k + rows[at] * kts;
        for (int64_t qi = 0; qi < nq; qi++) {
            const float* qr = q + qi * d;
            vecw acc = {0};
            for (int64_t c = 0; c < whole; c += WIDE)
                acc += *(const vecw*)(qr + c) * *(const vecw*)(kr + c);
            float dot = lane_sum(acc);
            for (int64_t c = whole; c < d; c++) dot += qr[c] * kr[c];
            s[qi * n + at] = dot;
        }
    }
}

/* Each score row of s (nq rows of n) -> its softmax, in place. */
INLINE void softmax_rows(float* s, int64_t nq, int64_t n) {
    for (int64_t qi = 0; qi < nq; qi++) {
        float* sr = s + qi * n;
        float m = sr[0];
        for (int64_t j = 1; j < n; j++) m = sr[j] > m ? sr[j] : m;
        float total = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            sr[j] = exp_nonpositive(sr[j] - m);
            total += sr[j];
        }
        const float inv = 1.0f / total;
        for (int64_t j = 0; j < n; j++) sr[j] *= inv;
    }
}

/* out[qi] (row stride d) = sum over the n tokens rows[] of p[qi][token] * v[token],
 * coordinates c0 .. c1 - 1 (at most VCOLS): the sums in a local array that, with constant sizes,
 * lives in registers. */
INLINE void row_values(const float* p, int64_t nq, int64_t c0, int64_t c1, const float* v,
                       int64_t vts, const int64_t* rows, int64_t n, float* out, int64_t d) {
    const int64_t w = c1 - c0, whole = w / WIDE * WIDE;
    vecw acc[QROWS][VCOLS / WIDE];
    float tail[QROWS][WIDE];
    for (int64_t qi = 0; qi < nq; qi++) {
        for (int64_t c = 0; c < whole; c += WIDE) acc[qi][c / WIDE] = (vecw){0};
        for (int64_t c = whole; c < w; c++) tail[qi][c - whole] = 0.0f;
    }
    for (int64_t at = 0; at < n; at++) {
        const float* vr = v + rows[at] * vts + c0;
        for (int64_t c = 0; c < whole; c += WIDE) {
            const vecw x = *(const vecw*)(vr + c);
            for (int64_t qi = 0; qi < nq; qi++) acc[qi][c / WIDE] += p[qi * n + at] * x;
        }
        for (int64_t c = whole; c < w; c++)
            for (int64_t qi = 0; qi < nq; qi++) tail[qi][c - whole] += p[qi * n + at] * vr[c];
    }
    for (int64_t qi = 0; qi < nq; qi++) {
        float* o = out + qi * d + c0;
        for (int64_t c = 0; c < whole; c += WIDE) *(vecw*)(o + c) = acc[qi][c / WIDE];
        for (int64_t c = whole; c < w; c++) o[c] = tail[qi][c - whole];
    }
}

/* At most QROWS query rows over the n tokens rows[] of one KV head (s: nq * n scores). */
INLINE void attend_rows(const float* q, int64_t nq, int64_t d, const float* k, int64_t kts,
                        const float* v, int64_t vts, const int64_t* rows, int64_t n, float* s,
                        float* out) {
    row_scores(q, nq, d, k, kts, v, vts, rows, n, s);
    softmax_rows(s, nq, n);
    for (int64_t c0 = 0; c0 < d; c0 += VCOLS)
        row_values(s, nq, c0, c0 + VCOLS < d ? c0 + VCOLS : d, v, vts, rows, n, out, d);
}

/* Query rows q[0 .. nq - 1] (d floats each, already scaled) over the n tokens rows[] of one KV
 * head; s holds QROWS * n scores. The common head sizes run loops compiled for them (2-3x
 * faster than loops over a runtime d). */
static void attend_tokens(const float* q, int64_t nq, int64_t d, const float* k, int64_t kts,
                          const float* v, int64_t vts, const int64_t* rows, int64_t n, float* s,
                          float* out) {
    if (n == 0) {
        memset(out, 0, sizeof(float) * (size_t)(nq * d));
        return;
    }
    for (int64_t q0 = 0; q0 < nq; q0 += QROWS) {
        const int64_t m = nq - q0 < QROWS ? nq - q0 : QROWS;
        const float* qr = q + q0 * d;
        float* o = out + q0 * d;
#define ROWS(D, M)                                                        \
    if (d == D && m == M) {                                               \
        attend_rows(qr, M, D, k, kts, v, vts, rows, n, s, o);             \
        continue;                                                         \
    }
        ROWS(64, 1) ROWS(64, 2) ROWS(64, 3) ROWS(64, 4)
        ROWS(128, 1) ROWS(128, 2) ROWS(128, 3) ROWS(128, 4)
#undef ROWS
        attend_rows(qr, m, d, k, kts, v, vts, rows, n, s, o);
    }
}

/* Every (sequence, KV head) of q [B, H, d] (B = bsz). Returns 0, or -1 when scratch memory could
 * not be allocated (out is then incomplete). */
int decode_block_attention_f32(const float* q, const float* k, int64_t kbs, int64_t khs,
                               int64_t kts, const float* v, int64_t vbs, int64_t vhs,
                               int64_t vts, int64_t bsz, int64_t h, int64_t hkv, int64_t d,
                               int64_t lk, int64_t b, const int32_t* ids, const int32_t* counts,
                               int64_t g, int64_t width, const int64_t* starts, float scale,
                               float* out) {
    const int64_t gh = h / hkv, nk = (lk + b - 1) / b;
    const int64_t qrows = gh < QROWS ? gh : QROWS;
    float* s = malloc(sizeof(float) * (size_t)(qrows * lk + gh * d));
    int64_t* rows = malloc(sizeof(int64_t) * (size_t)lk);
    unsigned char* mark = malloc((size_t)nk);
    if (s == NULL || rows == NULL || mark == NULL) {
        free(s), free(rows), free(mark);
        return -1;
    }
    float* qs = s + qrows * lk;
    for (int64_t u = 0; u < bsz * hkv; u++) {
        const int64_t bi = u / hkv, kh = u % hkv;
        const int64_t start = starts == NULL ? 0 : starts[bi];
        const float* kb = k + bi * kbs + kh * khs;
        const float* vb = v + bi * vbs + kh * vhs;
        int64_t qh = kh * gh;
        while (qh < (kh + 1) * gh) { /* runs of this KV head's query heads that share a list */
            const int64_t gi = qh * g / h;
            int64_t end = qh + 1;
            while (end < (kh + 1) * gh && end * g / h == gi) end++;
            const int64_t nq = end - qh;
            memset(mark, 0, (size_t)nk);
            const int32_t* list = ids + (bi * g + gi) * width;
            for (int64_t i = 0; i < counts[bi * g + gi] && i < width; i++)
                if (list[i] >= 0 && list[i] < nk) mark[list[i]] = 1;
            int64_t n = 0; /* the listed blocks' visible tokens, ascending */
            for (int64_t j = 0; j < nk; j++) {
                if (!mark[j]) continue;
                const int64_t t1 = j * b + b < lk ? j * b + b : lk;
                for (int64_t t = j * b > start ? j * b : start; t < t1; t++) rows[n++] = t;
            }
            for (int64_t i = 0; i < nq * d; i++) qs[i] = q[(bi * h + qh) * d + i] * scale;
            attend_tokens(qs, nq, d, kb, kts, vb, vts, rows, n, s, out + (bi * h + qh) * d);
            qh = end;
        }
    }
    free(s), free(rows), free(mark);
    return 0;
}
