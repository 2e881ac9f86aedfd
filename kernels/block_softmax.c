/* Softmax mass per key block, one pass per row, without writing the probabilities.
 *
 * The sampled estimator (engine/sketch.py) scores a few queries per block against every key and
 * needs, per query, the softmax mass of each key block. In torch that is a causal mask, a softmax
 * that writes every probability and a block sum that reads them back: on a 2-core AVX2 CPU those
 * three passes took ~16 ms of a 30 ms chunk (the score product the rest). This file does them as
 * two passes over each row while it sits in cache: the row's max, then exp and block sums; and,
 * below, the same from queries and keys without a score matrix (scored_block_mass_f32).
 * Reference and launcher: kernels/block_softmax.py; loader: kernels/native.py.
 *
 * Row i of `rows` sees columns lo[i] .. hi[i] - 1 of its `width` scores (the causal limit and any
 * left padding); every other column has no mass. out[i, j] is the mass of columns j*b .. j*b+b-1,
 * nb = ceil(width / b) of them per row, summing to 1 (all 0 when the row sees nothing).
 *
 * Compiled with -O3, fused multiply-adds and the parts of -ffast-math that let the loops
 * vectorise (never -ffast-math itself: it would link crtfastmath.o, which flushes subnormals to
 * zero process-wide), and -march=native where the compiler has it; the scores must be finite
 * (columns outside lo .. hi are never read).
 */
#define _GNU_SOURCE /* syscall(), to ask Linux for the AMX tile state */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp.h"
#include "tile.h"

/* ---- scores and block mass in one call: the sampled estimator without a score matrix ----
 *
 * The estimator's product q @ k^T has a shallow inner dimension (the head dim, 64 here), so
 * torch's matmul spends much of its time writing the scores (~25 MB a chunk) that the softmax
 * then reads back. Here a tile of TILE_ROWS query rows is scored against the keys into a buffer
 * that stays in cache (the 6 x 16 register tile of tile.h over keys packed in panels), and each
 * row's block mass is taken from it at once. A tile scores the keys up to its rows' largest hi
 * only: no causal waste. */

/* Row i's running softmax over the columns it sees of one key chunk c0 .. c1 - 1 (scores x,
 * x[0] being column c0): the block sums o[nb] and the total are kept relative to the running
 * max *m, and rescaled when a later chunk raises it (online softmax, as in FlashAttention). */
static void row_chunk_mass(const float* x, int64_t c0, int64_t c1, int64_t lo, int64_t hi,
                           int64_t b, float* m, float* total, float* o) {
    const int64_t a = lo > c0 ? lo : c0, e = hi < c1 ? hi : c1;
    if (e <= a) return;
    float mx = x[a - c0];
    for (int64_t i = a; i < e; i++) mx = x[i - c0] > mx ? x[i - c0] : mx;
    if (mx > *m) {
        if (*total > 0.0f) { /* earlier chunks' sums, relative to the old max */
            const float f = exp_nonpositive(*m - mx);
            for (int64_t j = (lo > 0 ? lo : 0) / b; j <= (a - 1) / b; j++) o[j] *= f;
            *total *= f;
        }
        *m = mx;
    }
    const float base = *m;
    const float* xa = x - c0;
    float sum = 0.0f;
    for (int64_t j = a / b; j * b < e; j++) { /* exp and block sum in one pass */
        const int64_t s0 = j * b > a ? j * b : a, s1 = (j + 1) * b < e ? (j + 1) * b : e;
        float part = 0.0f;
        for (int64_t i = s0; i < s1; i++) part += exp_nonpositive(xa[i] - base);
        o[j] += part;
        sum += part;
    }
    *total += sum;
}

/* The same with 8 columns at a time, for blocks of a multiple of 8 columns (every preset's):
 * the scalar loops above ran a block's 32 columns as a short vector loop with its own set-up
 * and tail, and at a sketch width of 32 they took twice the product's time. Chunks start at a
 * multiple of 8 columns, so each group of 8 lies in one block; the groups at the row's edges
 * take their hidden columns as -3e38 (no overflow, and ~1e-38 of mass). x must be readable up
 * to c1 - c0 rounded up to 8. The max runs as four chains and each block's exponentials are
 * summed as they are computed, not stored and read back: 0.52 ns a score in cache against 0.66
 * for one chain and a second pass (one AVX-512 core; this exponential on 16 lanes was slower,
 * the vscalefps one below is not). */
static inline ivec8 lanes_in(int64_t g, int64_t a, int64_t e) {
    const ivec8 col = (ivec8){0, 1, 2, 3, 4, 5, 6, 7} + (int32_t)g;
    return (col >= (int32_t)a) & (col < (int32_t)e);
}

static void row_chunk_mass8(const float* x, int64_t c0, int64_t c1, int64_t lo, int64_t hi,
                            int64_t b, float* m, float* total, float* o) {
    const int64_t a = lo > c0 ? lo : c0, e = hi < c1 ? hi : c1;
    if (e <= a) return;
    const int64_t ar = a - c0, er = e - c0, g0 = ar & ~7, g1 = (er + 7) & ~7;
    const vec8 low = (vec8){0} - 3.0e38f;
    vec8 mv = low, mv1 = low, mv2 = low, mv3 = low; /* four chains: max's latency overlaps */
    int64_t g = g0;
    if (g < ar) { /* the row's first group: its hidden columns as -3e38 */
        mv = pick(lanes_in(g, ar, er), *(const vec8*)(x + g), low);
        g += 8;
    }
    const int64_t gf = g + ((er & ~(int64_t)7) - g) / 32 * 32; /* whole groups, 4 at a time */
    for (; g < gf; g += 32) {
        mv = max8(*(const vec8*)(x + g), mv);
        mv1 = max8(*(const vec8*)(x + g + 8), mv1);
        mv2 = max8(*(const vec8*)(x + g + 16), mv2);
        mv3 = max8(*(const vec8*)(x + g + 24), mv3);
    }
    for (; g < g1; g += 8) {
        vec8 v = *(const vec8*)(x + g);
        if (g < ar || g + 8 > er) v = pick(lanes_in(g, ar, er), v, low);
        mv = max8(v, mv);
    }
    mv = max8(max8(mv, mv1), max8(mv2, mv3));
    float mx = mv[0];
    for (int i = 1; i < 8; i++) mx = mv[i] > mx ? mv[i] : mx;
    if (mx > *m) {
        if (*total > 0.0f) { /* earlier chunks' sums, relative to the old max */
            const float f = exp_nonpositive(*m - mx);
            for (int64_t j = (lo > 0 ? lo : 0) / b; j <= (a - 1) / b; j++) o[j] *= f;
            *total *= f;
        }
        *m = mx;
    }
    const float base = *m;
    float sum = 0.0f;
    for (int64_t j = a / b; j * b < e; j++) { /* exps summed per block as they come */
        const int64_t s0 = j * b - c0 > g0 ? j * b - c0 : g0;
        const int64_t s1 = (j + 1) * b - c0 < g1 ? (j + 1) * b - c0 : g1;
        vec8 acc = {0};
        for (int64_t g = s0; g < s1; g += 8) {
            vec8 v = *(const vec8*)(x + g) - base;
            if (g < ar || g + 8 > er) v = pick(lanes_in(g, ar, er), v, low); /* e^-87: ~1e-38 */
            acc += exp8_nonpositive(v);
        }
        float part = 0.0f;
        for (int i = 0; i < 8; i++) part += acc[i];
        o[j] += part;
        sum += part;
    }
    *total += sum;
}

#if defined(__AVX512F__)
/* The same on 16 lanes, for blocks of a multiple of 16 columns (the defaults'): 0.24 against 0.39
 * ns a score in cache (a C microbenchmark, one core here). Two changes make the difference: the
 * exponential by vscalefps (exp16_nonpositive: about half the operations of exp8_nonpositive's),
 * and each block's sum taken 16 blocks at a time, by a transposing tree of shuffles and adds
 * (sum16x16), where one block's horizontal sum took a dozen operations. Hidden columns at a
 * row's edges are masked out of the loads (nothing past them is read). */
static inline __m512 sum16x16(const __m512* p) { /* lane k: p[order[k]]'s 16 lanes summed */
    __m512 c[8], d[4], e[2];
    for (int k = 0; k < 8; k++) /* 256-bit halves: two blocks x 8 lanes each */
        c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++) /* 128-bit quarters: four blocks x 4 lanes */
        d[k] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++) /* pairs inside each quarter */
        e[k] = _mm512_add_ps(_mm512_shuffle_ps(d[2 * k], d[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(d[2 * k], d[2 * k + 1], 0xEE));
    const __m512 sums =
        _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD));
    /* the tree leaves block 4 (k % 4) + k / 4 in lane k: back to block order */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, sums);
}

/* Lanes of the 16 columns from g (relative to the chunk) that lie in ar .. er - 1. */
static inline __mmask16 lanes16(int64_t g, int64_t ar, int64_t er) {
    const __m512i col = _mm512_add_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int32_t)g));
    return _mm512_cmpge_epi32_mask(col, _mm512_set1_epi32((int32_t)ar)) &
           _mm512_cmplt_epi32_mask(col, _mm512_set1_epi32((int32_t)er));
}

/* The columns g .. g + 15 of x, those outside ar .. er - 1 as -3e38 (and never read). */
static inline __m512 load16(const float* x, int64_t g, int64_t ar, int64_t er) {
    if (g >= ar && g + 16 <= er) return _mm512_loadu_ps(x + g);
    return _mm512_mask_loadu_ps(_mm512_set1_ps(-3.0e38f), lanes16(g, ar, er), x + g);
}

/* Block j's exponentials relative to base, summed lane-wise over its groups of 16 columns. */
static inline __m512 block_exp16(const float* x, int64_t j, int64_t b, int64_t c0, int64_t ar,
                                 int64_t er, __m512 base) {
    const int64_t g0 = ar & ~(int64_t)15;
    const int64_t s0 = j * b - c0 > g0 ? j * b - c0 : g0;
    const int64_t s1 = (j + 1) * b - c0 < er ? (j + 1) * b - c0 : er;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = s0; g < s1; g += 16)
        acc = _mm512_add_ps(acc, exp16_nonpositive(_mm512_sub_ps(load16(x, g, ar, er), base)));
    return acc;
}

static void row_chunk_mass16(const float* x, int64_t c0, int64_t c1, int64_t lo, int64_t hi,
                             int64_t b, float* m, float* total, float* o) {
    const int64_t a = lo > c0 ? lo : c0, e = hi < c1 ? hi : c1;
    if (e <= a) return;
    const int64_t ar = a - c0, er = e - c0;
    __m512 mv = _mm512_set1_ps(-3.0e38f), mv1 = mv; /* two chains: max's latency overlaps */
    int64_t g = ar & ~(int64_t)15;
    for (; g + 16 < er; g += 32) {
        mv = _mm512_max_ps(mv, load16(x, g, ar, er));
        mv1 = _mm512_max_ps(mv1, load16(x, g + 16, ar, er));
    }
    if (g < er) mv = _mm512_max_ps(mv, load16(x, g, ar, er));
    const float mx = _mm512_reduce_max_ps(_mm512_max_ps(mv, mv1));
    if (mx > *m) {
        if (*total > 0.0f) { /* earlier chunks' sums, relative to the old max */
            const float f = exp_nonpositive(*m - mx);
            for (int64_t j = (lo > 0 ? lo : 0) / b; j <= (a - 1) / b; j++) o[j] *= f;
            *total *= f;
        }
        *m = mx;
    }
    const __m512 base = _mm512_set1_ps(*m);
    const int64_t j1 = (e - 1) / b + 1;
    __m512 sums = _mm512_setzero_ps();
    int64_t j = a / b;
    for (; j + 16 <= j1; j += 16) { /* 16 blocks at a time */
        __m512 p[16];
        for (int k = 0; k < 16; k++) p[k] = block_exp16(x, j + k, b, c0, ar, er, base);
        const __m512 part = sum16x16(p);
        _mm512_storeu_ps(o + j, _mm512_add_ps(_mm512_loadu_ps(o + j), part));
        sums = _mm512_add_ps(sums, part);
    }
    if (j < j1) { /* the last 1-15 blocks: the same tree, zeros for the blocks past them */
        __m512 p[16];
        for (int k = 0; k < 16; k++)
            p[k] = j + k < j1 ? block_exp16(x, j + k, b, c0, ar, er, base) : _mm512_setzero_ps();
        const __m512 part = sum16x16(p);
        const __mmask16 live = (__mmask16)((1u << (j1 - j)) - 1);
        _mm512_mask_storeu_ps(o + j, live, _mm512_add_ps(_mm512_maskz_loadu_ps(live, o + j), part));
        sums = _mm512_add_ps(sums, part);
    }
    *total += _mm512_reduce_add_ps(sums);
}
#endif

/* The row chunk loop for blocks of b columns: the widest this build and b allow. */
typedef void row_chunk_fn(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*,
                          float*, float*);
static row_chunk_fn* row_chunk_for(int64_t b) {
#if defined(__AVX512F__)
    if (b % 16 == 0) return row_chunk_mass16;
#endif
    return b % 8 ? row_chunk_mass : row_chunk_mass8;
}

/* One row: x (already float32, readable up to `width` rounded up to 8) visible over [lo, hi),
 * into o[nb]: the chunk loops above over the whole row, then normalised. */
static void row_block_mass(const float* x, int64_t width, int64_t lo, int64_t hi, int64_t b,
                           int64_t nb, float* o) {
    float m = -3.0e38f, total = 0.0f;
    for (int64_t j = 0; j < nb; j++) o[j] = 0.0f;
    row_chunk_for(b)(x, 0, width, lo, hi, b, &m, &total, o);
    if (total <= 0.0f) return;
    const float inv = 1.0f / total;
    for (int64_t j = 0; j < nb; j++) o[j] *= inv;
}

/* scores [rows, width] float32, row-major; lo, hi [rows]; out [rows, ceil(width / b)].
 * Returns 0, or -1 when the scratch row could not be allocated (out is then untouched). */
int block_softmax_sums_f32(const float* scores, int64_t rows, int64_t width, const int64_t* lo,
                           const int64_t* hi, int64_t b, float* out) {
    const int64_t nb = (width + b - 1) / b, wide = (width + 7) & ~(int64_t)7;
    float* tmp = malloc(sizeof(float) * (size_t)wide);
    if (tmp == NULL) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const float* x = scores + r * width;
        if (r == rows - 1 && wide > width) { /* the last row: its groups of 8 read a copy */
            memcpy(tmp, x, sizeof(float) * (size_t)width);
            x = tmp;
        }
        row_block_mass(x, width, lo[r], hi[r], b, nb, out + r * nb);
    }
    free(tmp);
    return 0;
}

/* The same for bfloat16 scores (the score product's dtype where it is native): each row is
 * widened to float32 first, its visible columns only (a bfloat16 is the top half of a float32). */
int block_softmax_sums_bf16(const uint16_t* scores, int64_t rows, int64_t width,
                            const int64_t* lo, const int64_t* hi, int64_t b, float* out) {
    const int64_t nb = (width + b - 1) / b, wide = (width + 7) & ~(int64_t)7;
    float* row = malloc(sizeof(float) * (size_t)wide);
    if (row == NULL) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t* x = scores + r * width;
        const int64_t end = hi[r] < width ? hi[r] : width;
        for (int64_t i = lo[r] > 0 ? lo[r] : 0; i < end; i++) {
            const uint32_t bits = (uint32_t)x[i] << 16;
            memcpy(row + i, &bits, sizeof(float));
        }
        row_block_mass(row, width, lo[r], hi[r], b, nb, out + r * nb);
    }
    free(row);
    return 0;
}

/* Per tile of `tile` rows, where its keys end: its rows' largest hi (at most width), into
 * ends; returns the largest. */
static int64_t tile_ends(const int64_t* hi, int64_t rows, int64_t tile, int64_t width,
                         int64_t* ends) {
    int64_t far = 0;
    for (int64_t t = 0; t * tile < rows; t++) {
        int64_t end = 0;
        for (int64_t i = t * tile; i < rows && i < (t + 1) * tile; i++)
            end = hi[i] > end ? hi[i] : end;
        ends[t] = end < width ? end : width;
        far = ends[t] > far ? ends[t] : far;
    }
    return far;
}

/* Each row's block sums o [rows, nb] divided by its total (rows that saw nothing stay 0). */
static void normalize_rows(float* o, const float* total, int64_t rows, int64_t nb) {
    for (int64_t i = 0; i < rows; i++) {
        if (total[i] <= 0.0f) continue;
        const float inv = 1.0f / total[i];
        for (int64_t j = 0; j < nb; j++) o[i * nb + j] *= inv;
    }
}

/* What both fused calls do before a unit's chunks: its queries (rows of `row_bytes`) copied
 * into qpad with zero rows up to whole tiles, its sums o [rows, nb] zeroed and each row's running
 * max and total reset; returns where its keys end (tile_ends). */
static int64_t unit_start(void* qpad, const void* q, size_t row_bytes, int64_t rows,
                          int64_t tile, const int64_t* hi, int64_t width, int64_t* ends,
                          float* o, int64_t nb, float* m, float* total) {
    const int64_t ntiles = (rows + tile - 1) / tile;
    memset(qpad, 0, row_bytes * (size_t)(ntiles * tile));
    memcpy(qpad, q, row_bytes * (size_t)rows);
    memset(o, 0, sizeof(float) * (size_t)(rows * nb));
    for (int64_t i = 0; i < rows; i++) m[i] = -3.0e38f, total[i] = 0.0f;
    return tile_ends(hi, rows, tile, width, ends);
}

/* Rows i0 .. i0 + tile - 1 (those below rows) of a scored tile s (row stride lds, columns c0 ..
 * c1 - 1) into their running maxima m, totals and block sums o [rows, nb]. */
static void tile_mass(const float* s, int64_t i0, int64_t tile, int64_t rows, int64_t lds,
                      int64_t c0, int64_t c1, const int64_t* lo, const int64_t* hi, int64_t b,
                      float* m, float* total, float* o, int64_t nb) {
    row_chunk_fn* row = row_chunk_for(b);
    for (int64_t i = i0; i < rows && i < i0 + tile; i++)
        row(s + (i - i0) * lds, c0, c1, lo[i], hi[i], b, m + i, total + i, o + i * nb);
}

/* Keys per chunk: every row tile of a unit is scored against one chunk while it sits in L2
 * (512 keys x 64 coordinates = 128 KB), instead of streaming all keys once per tile. */
#define CHUNK_PANELS 32

/* units independent problems, each: q [rows, r] (scaled queries, contiguous), kp [np, r,
 * PANEL] the keys packed as above (np * PANEL >= width; keys past width are never
 * seen), lo, hi [rows]; out [rows, ceil(width / b)] as block_softmax_sums_f32 gives for the
 * scores of q against the keys. Units follow each other in memory (q: rows * r apart, kp:
 * np * r * PANEL, lo, hi: rows, out: rows * nb). Returns 0, or -1 when the scratch could not
 * be allocated. */
int scored_block_mass_f32(const float* q, const float* kp, int64_t units, int64_t rows,
                          int64_t r, int64_t np, int64_t width, const int64_t* lo,
                          const int64_t* hi, int64_t b, float* out) {
    const int64_t nb = (width + b - 1) / b, ck = CHUNK_PANELS * PANEL;
    const int64_t ntiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    float* s = malloc(sizeof(float) * (size_t)(TILE_ROWS * ck + ntiles * TILE_ROWS * r + 2 * rows));
    int64_t* ends = malloc(sizeof(int64_t) * (size_t)(ntiles > 0 ? ntiles : 1));
    if (s == NULL || ends == NULL) {
        free(s), free(ends);
        return -1;
    }
    float* qpad = s + TILE_ROWS * ck; /* the queries, zero rows after the last */
    float* m = qpad + ntiles * TILE_ROWS * r; /* each row's running max and total */
    float* total = m + rows;
    for (int64_t u = 0; u < units; u++) {
        const float* ku = kp + u * np * r * PANEL;
        const int64_t* lu = lo + u * rows;
        const int64_t* hu = hi + u * rows;
        float* ou = out + u * rows * nb;
        const int64_t far = unit_start(qpad, q + u * rows * r, sizeof(float) * (size_t)r, rows,
                                       TILE_ROWS, hu, width, ends, ou, nb, m, total);
        for (int64_t c0 = 0; c0 < far; c0 += ck) {
            for (int64_t t = 0; t < ntiles; t++) {
                const int64_t c1 = ends[t] < c0 + ck ? ends[t] : c0 + ck;
                if (c1 <= c0) continue;
                const int64_t panels = (c1 - c0 + PANEL - 1) / PANEL;
                score_panels(qpad + t * TILE_ROWS * r, r, ku + c0 * r, panels, s,
                             panels * PANEL);
                tile_mass(s, t * TILE_ROWS, TILE_ROWS, rows, panels * PANEL, c0, c1, lu, hu, b, m,
                          total, ou, nb);
            }
        }
        normalize_rows(ou, total, rows, nb);
    }
    free(s), free(ends);
    return 0;
}

/* ---- the same on AMX tiles: bfloat16 queries and keys, float32 scores ----
 *
 * On a CPU with AMX (Intel Xeon since Sapphire Rapids) a tile multiply takes 16 query rows
 * against 16 keys, 32 coordinates deep, in one instruction: the estimator's product ran at ~300
 * GMAC/s on one core here, against ~68 for the float32 register tile above (a C microbenchmark,
 * 16 rows x 7376 keys x 64). The queries and keys are rounded to bfloat16 (the `score_dtype`
 * knob's bfloat16, same estimates: docs/quality.md), the products accumulate in float32, and each
 * 16 x 16 score tile goes to the same per-row chunk loop as above. Elsewhere (no AMX in the
 * compiler or the CPU, or Linux refuses the tile state) it returns -2 and the caller takes the
 * bfloat16 product in torch. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWS 16 /* query rows per tile */
/* Keys per chunk on AMX: 8192, where the float32 call takes 512. The tile product reads its keys
 * from L2 either way; with long chunks a row's masses are taken in one pass over its keys (no
 * rescaling), and its sums are written in long runs instead of 128-byte pieces of every row for
 * every chunk: a layer's estimate at 7376 tokens 60 -> 49 ms (SmolLM2's heads, both cores). */
#define AMX_CHUNK_PANELS 512

/* Linux hands out the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA); once granted it holds for every thread of the process. */
static int amx_granted(void) {
    static int state = -1; /* a race here only asks twice */
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return state;
}

int amx_available(void) { return amx_granted(); }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* s[i][p * 16 + j] = query row i (of the 16 in A tiles 1..kc) . key j of panel p, for np panels
 * of keys packed as pack_keys_vnni gives them (r / 2 pair rows of 16 keys x 2 coordinates). */
static void score_panels_amx(const uint16_t* kp, int64_t r, int64_t np, float* s, int64_t lds) {
    const int64_t panel = r / 2 * PANEL * 2, half = 16 * PANEL * 2; /* bfloat16s */
    for (int64_t p = 0; p < np; p++) {
        const uint16_t* k = kp + p * panel;
        _tile_zero(0);
        _tile_loadd(5, k, 64);
        _tile_dpbf16ps(0, 1, 5);
        _tile_loadd(6, k + half, 64);
        _tile_dpbf16ps(0, 2, 6);
        if (r == 128) {
            _tile_loadd(5, k + 2 * half, 64);
            _tile_dpbf16ps(0, 3, 5);
            _tile_loadd(6, k + 3 * half, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
        _tile_stored(0, s + p * PANEL, lds * (int64_t)sizeof(float));
    }
}

/* scored_block_mass_f32's contract for bfloat16 queries q [units, rows, r] and keys kp packed by
 * pack_keys_vnni [units, np, r / 2, PANEL, 2], r 64 or 128. Returns 0, -1 when the scratch could
 * not be allocated, -2 where AMX cannot run (nothing written). */
int scored_block_mass_amx(const uint16_t* q, const uint16_t* kp, int64_t units, int64_t rows,
                          int64_t r, int64_t np, int64_t width, const int64_t* lo,
                          const int64_t* hi, int64_t b, float* out) {
    if ((r != 64 && r != 128) || !amx_granted()) return -2;
    const int64_t nb = (width + b - 1) / b, ck = AMX_CHUNK_PANELS * PANEL;
    const int64_t ntiles = (rows + AMX_ROWS - 1) / AMX_ROWS;
    float* s = malloc(sizeof(float) * (size_t)(AMX_ROWS * ck + 2 * rows));
    uint16_t* qpad = malloc(sizeof(uint16_t) * (size_t)(ntiles * AMX_ROWS * r));
    int64_t* ends = malloc(sizeof(int64_t) * (size_t)(ntiles > 0 ? ntiles : 1));
    if (s == NULL || qpad == NULL || ends == NULL) {
        free(s), free(qpad), free(ends);
        return -1;
    }
    float* m = s + AMX_ROWS * ck; /* each row's running max and total */
    float* total = m + rows;
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 7; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg); /* per thread: every call configures its own */
    for (int64_t u = 0; u < units; u++) {
        const uint16_t* ku = kp + u * np * r * PANEL;
        const int64_t* lu = lo + u * rows;
        const int64_t* hu = hi + u * rows;
        float* ou = out + u * rows * nb;
        const int64_t far = unit_start(qpad, q + u * rows * r, sizeof(uint16_t) * (size_t)r,
                                       rows, AMX_ROWS, hu, width, ends, ou, nb, m, total);
        for (int64_t c0 = 0; c0 < far; c0 += ck) {
            for (int64_t t = 0; t < ntiles; t++) {
                const int64_t c1 = ends[t] < c0 + ck ? ends[t] : c0 + ck;
                if (c1 <= c0) continue;
                const int64_t panels = (c1 - c0 + PANEL - 1) / PANEL;
                const uint16_t* qt = qpad + t * AMX_ROWS * r;
                _tile_loadd(1, qt, r * 2); /* the tile's rows, 32 coordinates a tile */
                _tile_loadd(2, qt + 32, r * 2);
                if (r == 128) {
                    _tile_loadd(3, qt + 64, r * 2);
                    _tile_loadd(4, qt + 96, r * 2);
                }
                score_panels_amx(ku + c0 / PANEL * r * PANEL, r, panels, s, panels * PANEL);
                tile_mass(s, t * AMX_ROWS, AMX_ROWS, rows, panels * PANEL, c0, c1, lu, hu, b, m,
                          total, ou, nb);
            }
        }
        normalize_rows(ou, total, rows, nb);
    }
    _tile_release();
    free(s), free(qpad), free(ends);
    return 0;
}
#else
int amx_available(void) { return 0; }

int scored_block_mass_amx(const uint16_t* q, const uint16_t* kp, int64_t units, int64_t rows,
                          int64_t r, int64_t np, int64_t width, const int64_t* lo,
                          const int64_t* hi, int64_t b, float* out) {
    (void)q, (void)kp, (void)units, (void)rows, (void)r, (void)np, (void)width, (void)lo;
    (void)hi, (void)b, (void)out;
    return -2;
}
#endif

/* float32 -> bfloat16, rounded to nearest even as torch rounds (a NaN stays a quiet NaN). */
static inline uint16_t bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Keys start .. end - 1 of k [bsz, hkv, L, r] (strides sb, sh, sl; r even) into their panels
 * of out [bsz, hkv, cap, r / 2, PANEL, 2] (kernels/block_softmax.py pack_keys_vnni's layout),
 * from panel start / PANEL (start a multiple of PANEL) to the one holding end - 1, zero keys
 * after end: one pass over the keys, where torch's cast, pad and transpose took three
 * (a layer's keys at 7376 tokens: see the speed log). */
int pack_keys_vnni_f32(const float* k, int64_t sb, int64_t sh, int64_t sl, int64_t bsz,
                       int64_t hkv, int64_t start, int64_t end, int64_t r, uint16_t* out,
                       int64_t cap) {
    const int64_t p0 = start / PANEL, p1 = (end + PANEL - 1) / PANEL, pairs = r / 2;
    for (int64_t u = 0; u < bsz * hkv; u++) {
        const float* src = k + (u / hkv) * sb + (u % hkv) * sh;
        uint16_t* dst = out + u * cap * r * PANEL;
        for (int64_t p = p0; p < p1; p++) {
            uint16_t* panel = dst + p * r * PANEL;
            const int64_t n = end - p * PANEL < PANEL ? end - p * PANEL : PANEL; /* real keys */
            const float* rows = src + p * PANEL * sl;
            for (int64_t j = 0; j < pairs; j++) { /* written front to back, read from L1 */
                uint16_t* pair = panel + j * 2 * PANEL;
                for (int64_t i = 0; i < n; i++) {
                    pair[2 * i] = bf16_rne(rows[i * sl + 2 * j]);
                    pair[2 * i + 1] = bf16_rne(rows[i * sl + 2 * j + 1]);
                }
                for (int64_t i = n; i < PANEL; i++) pair[2 * i] = pair[2 * i + 1] = 0;
            }
        }
    }
    return 0;
}
