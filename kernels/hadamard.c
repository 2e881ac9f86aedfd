/* The subsampled randomized Hadamard sketch of many rows, with per-block sums of the sketches
 * and of their squares in the same pass.
 *
 * Why: a prefill sketches every key of a layer (engine/sketch.py SRHT) and pools the sketches and
 * their squares per key block. As a [L, d] x [d, r] product the sketch costs d * r multiply-adds
 * a row (4096 at d = r = 64: ~2.3 ms a layer at 7k tokens on 2 cores) and the pooling re-reads
 * it twice; the Hadamard transform itself needs m log2(m) additions. Here a row's m = 8 M
 * coordinates are taken as M vectors of 8: H_m = H_M (x) H_8 in the Sylvester order of
 * engine/sketch.py fwht, so each vector is multiplied by H_8 (8 broadcast multiply-adds, no
 * shuffles, which GCC and Clang spell differently) and the vectors then go through M-point
 * butterflies. Reference and launcher: kernels/hadamard.py; loader: kernels/native.py.
 *
 * y[i] = f * (H_m (signs * pad_m(x)))[keep[i]] for i < r (f = 1 / sqrt(r): the transform's
 * 1 / sqrt(m) times the sketch's sqrt(m / r)).
 */
#include <stdint.h>
#include <stdlib.h>

#include "vec.h"

/* One row x [m] into buf [nv = m / 8 vectors]: H_m (signs * x), the signs folded into g:
 * g[8 a + b] = signs[8 a + b] * H_8[b], so vector a is the sum over b of x[8 a + b] g[8 a + b]. */
static inline void hadamard_row(const float* x, int64_t nv, const vec8* g, vec8* buf) {
    for (int64_t a = 0; a < nv; a++) {
        const float* xa = x + 8 * a;
        const vec8* ga = g + 8 * a;
        vec8 acc = xa[0] * ga[0];
        for (int b = 1; b < 8; b++) acc += xa[b] * ga[b];
        buf[a] = acc;
    }
    for (int64_t h = 1; h < nv; h *= 2) /* H_M across the vectors */
        for (int64_t i = 0; i < nv; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const vec8 u = buf[j], v = buf[j + h];
                buf[j] = u + v;
                buf[j + h] = u - v;
            }
}

#define MAX_VECTORS 128 /* m up to 1024 */

/* Rows t0 .. t1 - 1 of one unit (x at row stride st, weights w or NULL) into y (row stride r)
 * and, with s (NULL: no pooling), their weighted sums into s [r] and sums of squares into q [r]
 * (or not, q NULL). pad: m floats, zero past d, for rows of d < m coordinates. The sums gather
 * over all m coordinates in registers (no loads from memory that y might alias) and are added
 * once per block. */
static inline void block_rows(const float* x, int64_t st, int64_t t0, int64_t t1, int64_t d,
                              int64_t nv, const vec8* g, const int64_t* keep, int64_t r,
                              const float* w, float* pad, float* y, float* s, float* q) {
    vec8 buf[MAX_VECTORS], sacc[MAX_VECTORS], qacc[MAX_VECTORS];
    for (int64_t a = 0; a < nv; a++) sacc[a] = qacc[a] = (vec8){0};
    for (int64_t t = t0; t < t1; t++) {
        const float* xt = x + t * st;
        if (d < 8 * nv) {
            for (int64_t c = 0; c < d; c++) pad[c] = xt[c];
            xt = pad;
        }
        hadamard_row(xt, nv, g, buf);
        float* yt = y + t * r;
        if (keep == NULL)
            for (int64_t a = 0; a < nv; a++) *(vec8*)(yt + 8 * a) = buf[a];
        else
            for (int64_t i = 0; i < r; i++) yt[i] = ((const float*)buf)[keep[i]];
        if (s == NULL) continue;
        const float wt = w == NULL ? 1.0f : w[t];
        for (int64_t a = 0; a < nv; a++) sacc[a] += wt * buf[a];
        for (int64_t a = 0; a < nv; a++) qacc[a] += wt * buf[a] * buf[a];
    }
    if (s == NULL) return;
    const float *sf = (const float*)sacc, *qf = (const float*)qacc;
    for (int64_t i = 0; i < r; i++) s[i] += sf[keep == NULL ? i : keep[i]];
    if (q != NULL)
        for (int64_t i = 0; i < r; i++) q[i] += qf[keep == NULL ? i : keep[i]];
}

/* Rows x[u, t, :] of `units` sequences of len rows (unit u = batch u / heads, head u % heads at
 * x + (u / heads) * sb + (u % heads) * sh + t * st, coordinates contiguous), d coordinates each,
 * padded to m (a power of two, 8 to 1024): y [units, len, r] (contiguous) as above; keep [r]
 * the kept coordinates (NULL: all, r == m). With sums (NULL: no pooling) and squares (NULL:
 * none), [units, n, r] and zeroed by the caller: for each block j of rows j b .. j b + b - 1,
 * the sum of y over its rows, and of y * y, each row weighted by w[u / heads, t] (w NULL: all
 * 1). This call takes the blocks j with j % parts == part, so `parts` calls on as many threads
 * share the rows evenly and write disjoint memory. Returns 0, or -1 when m is not a power of
 * two from 8 to 1024 or the scratch could not be allocated (nothing written). */
int srht_rows_f32(const float* x, int64_t units, int64_t heads, int64_t len, int64_t sb,
                  int64_t sh, int64_t st, int64_t d, int64_t m, const float* signs,
                  const int64_t* keep, int64_t r, float f, const float* w, int64_t b,
                  int64_t part, int64_t parts, float* y, float* sums, float* squares) {
    if (m < 8 || m > 8 * MAX_VECTORS || (m & (m - 1)) || d > m || (keep == NULL && r != m))
        return -1;
    const int64_t nv = m / 8, n = (len + b - 1) / b;
    vec8* g = malloc(sizeof(vec8) * (size_t)m + sizeof(float) * (size_t)m);
    if (g == NULL) return -1;
    float* pad = (float*)(g + m); /* a row of d < m coordinates, zero after them */
    for (int64_t c = 0; c < m; c++) /* H_8[b][b'] = (-1)^popcount(b & b'), times the sign and f */
        for (int64_t j = 0; j < 8; j++)
            g[c][j] = (c < d ? signs[c] * f : 0.0f) *
                      (__builtin_popcount((unsigned)((c & 7) & j)) & 1 ? -1.0f : 1.0f);
    for (int64_t c = 0; c < m; c++) pad[c] = 0.0f;
    for (int64_t u = 0; u < units; u++) {
        const float* xu = x + (u / heads) * sb + (u % heads) * sh;
        const float* wu = w == NULL ? NULL : w + (u / heads) * len;
        float* yu = y + u * len * r;
        for (int64_t j = part; j < n; j += parts) {
            const int64_t t0 = j * b, t1 = (j + 1) * b < len ? (j + 1) * b : len;
            float* s = sums == NULL ? NULL : sums + (u * n + j) * r;
            float* q = squares == NULL ? NULL : squares + (u * n + j) * r;
            if (nv == 8) /* head dim 64: unrolled, a row's vectors stay in registers */
                block_rows(xu, st, t0, t1, d, 8, g, keep, r, wu, pad, yu, s, q);
            else
                block_rows(xu, st, t0, t1, d, nv, g, keep, r, wu, pad, yu, s, q);
        }
    }
    free(g);
    return 0;
}
