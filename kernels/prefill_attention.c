/* Block-sparse prefill attention on CPU: both products in register tiles.
 *
 * The torch path (kernels/cpu.py) gathers each query tile's listed K/V blocks and calls torch's
 * flash kernel per group of rows: its calls run at dense attention's efficiency, but a layer
 * spends ~25% more in the thousands of small ops around them (gathers, masks, log-sum-exp
 * merges). Here one call does a layer: for each (sequence, KV head, query tile) its listed blocks
 * are taken in chunks of up to CHUNK_KEYS keys, copied side by side once per chunk (they then
 * stay in L2 while every row of the tile passes over them); 6 rows at a time are scored against
 * the chunk (tile.h's register tile over the keys packed in panels of 16: 6 x 32 with AVX-512,
 * else 6 x 16), the scores become probabilities with a running max per row (online softmax, as
 * in FlashAttention), and the same 6 rows take the chunk's values (a register tile of the same
 * size over V's rows). The query heads of a KV head that share a list are rows of one problem,
 * so each K and V row is read once for all of them. The copy lets the register tiles run over
 * the whole chunk rather than block by block: 1.3-1.4x at 2k-16k tokens (docs/notes/speed-log.md).
 * Reference: kernels/reference.py (block_sparse_attention_reference); launcher:
 * kernels/prefill_attention.py; loader: kernels/native.py.
 *
 * Layout: q [B, H, Lq, d] of any batch, head and token strides, out [B, H, Lq, d] contiguous,
 * float32; kp [B, Hkv, np, d, 16]: the
 * keys packed in panels of 16 (kernels/block_softmax.py pack_keys; np * 16 >= ceil(Lk / b) * b,
 * whole blocks); v [B, Hkv,
 * Lk, d] with any batch, head and token strides (the head dim contiguous). ids [B, G, nt, width]
 * with counts [B, G, nt]: key-block ids per query tile of qt rows (any order, repeats and ids
 * past the cache ignored). b, qt and d multiples of 16; qt a multiple of b. Query row r sits at
 * position Lk - Lq + r and sees keys starts[bi] .. its position (starts may be NULL). A row that
 * sees no key gets zeros.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp.h"
#include "tile.h"

#define CHUNK_KEYS 512
/* below every score: the library is built with -ffinite-math-only, so no infinities */
#define HIDDEN (-3.0e38f)

/* o[i][0 .. d) += sum over n keys of p[i][j] * v[j] for TILE_ROWS rows: p has row stride ldp,
 * v's rows are vts floats apart; d a multiple of 16. A pass holds TILE_ROWS x 2 vectors of o in
 * registers: 32 columns with AVX-512 (the 6 x 32 tile, as the score product's), else 16. */
#if defined(__AVX512F__)
typedef vec16 vecv;
#define VW 16
#else
typedef vec8 vecv;
#define VW 8
#endif
static void add_values(const float* p, int64_t ldp, int64_t n, const float* v, int64_t vts,
                       int64_t d, float* o) {
    int64_t c = 0;
    for (; c + 2 * VW <= d; c += 2 * VW) {
        vecv acc[TILE_ROWS][2];
        for (int i = 0; i < TILE_ROWS; i++) {
            acc[i][0] = *(const vecv*)(o + i * d + c);
            acc[i][1] = *(const vecv*)(o + i * d + c + VW);
        }
        for (int64_t j = 0; j < n; j++) {
            const vecv v0 = *(const vecv*)(v + j * vts + c);
            const vecv v1 = *(const vecv*)(v + j * vts + c + VW);
            for (int i = 0; i < TILE_ROWS; i++) {
                const float pv = p[i * ldp + j];
                acc[i][0] += pv * v0;
                acc[i][1] += pv * v1;
            }
        }
        for (int i = 0; i < TILE_ROWS; i++) {
            *(vecv*)(o + i * d + c) = acc[i][0];
            *(vecv*)(o + i * d + c + VW) = acc[i][1];
        }
    }
    for (; c < d; c += 8) { /* what is left of d (16 columns with AVX-512), 8 at a time */
        vec8 acc[TILE_ROWS];
        for (int i = 0; i < TILE_ROWS; i++) acc[i] = *(const vec8*)(o + i * d + c);
        for (int64_t j = 0; j < n; j++) {
            const vec8 v0 = *(const vec8*)(v + j * vts + c);
            for (int i = 0; i < TILE_ROWS; i++) acc[i] += p[i * ldp + j] * v0;
        }
        for (int i = 0; i < TILE_ROWS; i++) *(vec8*)(o + i * d + c) = acc[i];
    }
}

/* The n listed blocks' key panels into kc [n * b / PANEL, d, PANEL] and value rows into vc
 * [n * b, d], zeros past the cache's last key: every tile of the chunk then runs both products
 * over one contiguous chunk (the pair-of-panels register tile instead of one panel a call). */
static void gather_chunk(const float* ku, const float* vu, int64_t vts, const int64_t* blocks,
                         int64_t n, int64_t b, int64_t d, int64_t lk, float* kc, float* vc) {
    for (int64_t x = 0; x < n; x++) {
        const int64_t k0 = blocks[x] * b, live = lk - k0 < b ? lk - k0 : b;
        memcpy(kc + x * b * d, ku + k0 * d, sizeof(float) * (size_t)(b * d));
        for (int64_t j = 0; j < live; j++)
            memcpy(vc + (x * b + j) * d, vu + (k0 + j) * vts, sizeof(float) * (size_t)d);
        memset(vc + (x * b + live) * d, 0, sizeof(float) * (size_t)((b - live) * d));
    }
}

/* The largest of row[0 .. w), w a multiple of 16. */
static float row_max(const float* row, int64_t w) {
#if defined(__AVX512F__)
    __m512 m0 = _mm512_set1_ps(HIDDEN), m1 = m0; /* two chains: max's latency overlaps */
    int64_t j = 0;
    for (; j + 32 <= w; j += 32) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(row + j));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(row + j + 16));
    }
    if (j < w) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(row + j));
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
#else
    float mx = HIDDEN;
    for (int64_t j = 0; j < w; j++) mx = row[j] > mx ? row[j] : mx;
    return mx;
#endif
}

/* row[j] = e^(row[j] - m) for j < w (a multiple of 16), returning their sum. */
static float exponentiate(float* row, int64_t w, float m) {
#if defined(__AVX512F__)
    const __m512 base = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < w; j += 16) {
        const __m512 p = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), base));
        _mm512_storeu_ps(row + j, p);
        sum = _mm512_add_ps(sum, p);
    }
    return _mm512_reduce_add_ps(sum);
#else
    float sum = 0.0f;
    for (int64_t j = 0; j < w; j++) {
        row[j] = exp_nonpositive(row[j] - m);
        sum += row[j];
    }
    return sum;
#endif
}

/* The units u0, u0 + step, ... of B * Hkv * nt (sequence, KV head, query tile), so that callers
 * can split a layer over threads. Returns 0, or -1 when scratch memory could not be allocated. */
int prefill_block_attention_f32(const float* q, int64_t qbs, int64_t qhs, int64_t qts,
                                const float* kp, const float* v, int64_t vbs, int64_t vhs,
                                int64_t vts, int64_t bsz, int64_t h, int64_t hkv,
                                int64_t lq, int64_t lk, int64_t d, int64_t np, int64_t b,
                                int64_t qt, const int64_t* ids, const int64_t* counts, int64_t g,
                                int64_t width, const int64_t* starts, float scale, int64_t u0,
                                int64_t step, float* out) {
    const int64_t gh = h / hkv, nt = (lq + qt - 1) / qt, nk = (lk + b - 1) / b;
    const int64_t max_rows = gh * qt + TILE_ROWS;
    float* s = malloc(sizeof(float) * (size_t)(TILE_ROWS * CHUNK_KEYS + 2 * CHUNK_KEYS * d +
                                               max_rows * d + max_rows * (d + 2)));
    unsigned char* mark = malloc((size_t)nk);
    int64_t* blocks = malloc(sizeof(int64_t) * (size_t)nk);
    if (s == NULL || mark == NULL || blocks == NULL) {
        free(s), free(mark), free(blocks);
        return -1;
    }
    float* kc = s + TILE_ROWS * CHUNK_KEYS; /* the chunk's key panels and value rows, gathered */
    float* vc = kc + CHUNK_KEYS * d;
    float* qs = vc + CHUNK_KEYS * d;        /* the problem's scaled queries, zero rows after */
    float* o = qs + max_rows * d;           /* their outputs so far */
    float* m = o + max_rows * d;            /* running max and total per row */
    float* l = m + max_rows;
    const int64_t off = lk - lq;
    for (int64_t u = u0; u < bsz * hkv * nt; u += step) {
        const int64_t t = u % nt, kh = (u / nt) % hkv, bi = u / (nt * hkv);
        const int64_t start = starts == NULL ? 0 : starts[bi];
        const int64_t r0 = t * qt, tr = lq - r0 < qt ? lq - r0 : qt; /* the tile's rows */
        const float* ku = kp + (bi * hkv + kh) * np * d * PANEL;
        const float* vu = v + bi * vbs + kh * vhs;
        int64_t qh = kh * gh;
        while (qh < (kh + 1) * gh) { /* runs of this KV head's query heads that share a list */
            const int64_t gi = qh * g / h;
            int64_t end = qh + 1;
            while (end < (kh + 1) * gh && end * g / h == gi) end++;
            const int64_t rows = (end - qh) * tr, tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
            /* the list: ascending, distinct, within the cache and the tile's causal reach */
            memset(mark, 0, (size_t)nk);
            const int64_t* list = ids + ((bi * g + gi) * nt + t) * width;
            const int64_t cnt = counts[(bi * g + gi) * nt + t];
            for (int64_t i = 0; i < cnt && i < width; i++)
                if (list[i] >= 0 && list[i] < nk) mark[list[i]] = 1;
            const int64_t reach = off + r0 + tr - 1; /* the tile's last position */
            int64_t nbl = 0;
            for (int64_t j = 0; j < nk && j * b <= reach; j++)
                if (mark[j] && (j + 1) * b > start) blocks[nbl++] = j;
            for (int64_t hq = qh; hq < end; hq++) /* rows (head, row) in head-major order */
                for (int64_t r = 0; r < tr; r++)
                    for (int64_t c = 0; c < d; c++)
                        qs[((hq - qh) * tr + r) * d + c] =
                            q[bi * qbs + hq * qhs + (r0 + r) * qts + c] * scale;
            memset(qs + rows * d, 0, sizeof(float) * (size_t)((tiles * TILE_ROWS - rows) * d));
            memset(o, 0, sizeof(float) * (size_t)(tiles * TILE_ROWS * d));
            for (int64_t i = 0; i < tiles * TILE_ROWS; i++) m[i] = HIDDEN, l[i] = 0.0f;
            const int64_t per_chunk = CHUNK_KEYS / b > 0 ? CHUNK_KEYS / b : 1;
            for (int64_t c0 = 0; c0 < nbl; c0 += per_chunk) {
                const int64_t c1 = c0 + per_chunk < nbl ? c0 + per_chunk : nbl;
                const int64_t w = (c1 - c0) * b;
                gather_chunk(ku, vu, vts, blocks + c0, c1 - c0, b, d, lk, kc, vc);
                for (int64_t ti = 0; ti < tiles; ti++) {
                    const int64_t i0 = ti * TILE_ROWS;
                    score_panels(qs + i0 * d, d, kc, w / PANEL, s, CHUNK_KEYS);
                    for (int64_t i = 0; i < TILE_ROWS; i++) {
                        float* row = s + i * CHUNK_KEYS;
                        const int64_t pos = i0 + i < rows ? off + r0 + (i0 + i) % tr : -1;
                        int seen = 0;
                        for (int64_t x = c0; x < c1; x++) { /* hide the keys it cannot see */
                            const int64_t k0 = blocks[x] * b;
                            const int64_t a = start > k0 ? start - k0 : 0;
                            int64_t e = pos + 1 < lk ? pos + 1 - k0 : lk - k0;
                            e = e < b ? e : b;
                            float* seg = row + (x - c0) * b;
                            if (a > 0 || e < b) /* only edge blocks: the rest is all visible */
                                for (int64_t j = 0; j < b; j++)
                                    if (j < a || j >= e) seg[j] = HIDDEN;
                            seen |= e > a;
                        }
                        if (!seen) { /* sees nothing in this chunk */
                            memset(row, 0, sizeof(float) * (size_t)w);
                            continue;
                        }
                        const float mx = row_max(row, w); /* hidden keys are below all */
                        float* mi = m + i0 + i;
                        if (mx > *mi) { /* rescale what earlier chunks added */
                            const float f = l[i0 + i] > 0.0f ? exp_nonpositive(*mi - mx) : 0.0f;
                            for (int64_t c = 0; c < d; c++) o[(i0 + i) * d + c] *= f;
                            l[i0 + i] *= f;
                            *mi = mx;
                        }
                        l[i0 + i] += exponentiate(row, w, *mi); /* hidden keys: ~2e-38 each */
                    }
                    add_values(s, CHUNK_KEYS, w, vc, d, d, o + i0 * d);
                }
            }
            for (int64_t hq = qh; hq < end; hq++)
                for (int64_t r = 0; r < tr; r++) {
                    const int64_t i = (hq - qh) * tr + r;
                    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
                    float* dst = out + ((bi * h + hq) * lq + r0 + r) * d;
                    for (int64_t c = 0; c < d; c++) dst[c] = o[i * d + c] * inv;
                }
            qh = end;
        }
    }
    free(s), free(mark), free(blocks);
    return 0;
}
