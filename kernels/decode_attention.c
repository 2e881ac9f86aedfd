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
 * contiguous); ids [B, G, width] block ids (any order, duplicates and ids outside the cache
 * ignored) with counts [B, G] of them live; query head qh reads list qh * G / H and KV head
 * qh / (H / Hkv). Sequence bi sees tokens starts[bi] .. lk - 1 (left padding before; starts may
 * be NULL). A head whose list sees no token gets zeros. out [B, H, d].
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp.h"

/* Query rows q[0 .. nq - 1] (d floats each, already scaled) over the tokens [t0[i], t1[i]) of
 * nspan spans of one KV head; s holds nq * n scores (n = the spans' total length). */
static void attend_spans(const float* q, int64_t nq, int64_t d, const float* k, int64_t kts,
                         const float* v, int64_t vts, const int64_t* t0, const int64_t* t1,
                         int64_t nspan, int64_t n, float* s, float* out) {
    memset(out, 0, sizeof(float) * (size_t)(nq * d));
    if (n == 0) return;
    int64_t at = 0;
    for (int64_t i = 0; i < nspan; i++) {
        for (int64_t t = t0[i]; t < t1[i]; t++, at++) {
            const float* kr = k + t * kts;
            for (int64_t qi = 0; qi < nq; qi++) {
                const float* qr = q + qi * d;
                float dot = 0.0f;
                for (int64_t c = 0; c < d; c++) dot += qr[c] * kr[c];
                s[qi * n + at] = dot;
            }
        }
    }
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
    at = 0;
    for (int64_t i = 0; i < nspan; i++) {
        for (int64_t t = t0[i]; t < t1[i]; t++, at++) {
            const float* vr = v + t * vts;
            for (int64_t qi = 0; qi < nq; qi++) {
                const float p = s[qi * n + at];
                float* o = out + qi * d;
                for (int64_t c = 0; c < d; c++) o[c] += p * vr[c];
            }
        }
    }
}

/* Every (sequence, KV head) of q [B, H, d] (B = bsz). Returns 0, or -1 when scratch memory could
 * not be allocated (out is then incomplete). */
int decode_block_attention_f32(const float* q, const float* k, int64_t kbs, int64_t khs,
                               int64_t kts, const float* v, int64_t vbs, int64_t vhs,
                               int64_t vts, int64_t bsz, int64_t h, int64_t hkv, int64_t d,
                               int64_t lk, int64_t b, const int64_t* ids, const int64_t* counts,
                               int64_t g, int64_t width, const int64_t* starts, float scale,
                               float* out) {
    const int64_t gh = h / hkv, nk = (lk + b - 1) / b;
    float* s = malloc(sizeof(float) * (size_t)(gh * lk + gh * d));
    int64_t* spans = malloc(sizeof(int64_t) * (size_t)(2 * nk));
    unsigned char* mark = malloc((size_t)nk);
    if (s == NULL || spans == NULL || mark == NULL) {
        free(s), free(spans), free(mark);
        return -1;
    }
    float* qs = s + gh * lk;
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
            const int64_t* list = ids + (bi * g + gi) * width;
            for (int64_t i = 0; i < counts[bi * g + gi] && i < width; i++)
                if (list[i] >= 0 && list[i] < nk) mark[list[i]] = 1;
            int64_t nspan = 0, n = 0;
            for (int64_t j = 0; j < nk; j++) { /* ascending, merged where blocks touch */
                if (!mark[j]) continue;
                int64_t t0 = j * b > start ? j * b : start, t1 = j * b + b < lk ? j * b + b : lk;
                if (t1 <= t0) continue;
                if (nspan > 0 && spans[nk + nspan - 1] == t0) {
                    spans[nk + nspan - 1] = t1;
                } else {
                    spans[nspan] = t0;
                    spans[nk + nspan] = t1;
                    nspan++;
                }
                n += t1 - t0;
            }
            for (int64_t i = 0; i < nq * d; i++) qs[i] = q[(bi * h + qh) * d + i] * scale;
            attend_spans(qs, nq, d, kb, kts, vb, vts, spans, spans + nk, nspan, n, s,
                         out + (bi * h + qh) * d);
            qh = end;
        }
    }
    free(s), free(spans), free(mark);
    return 0;
}
