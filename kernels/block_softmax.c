/* Softmax mass per key block, one pass per row, without writing the probabilities.
 *
 * The sampled estimator (engine/sketch.py) scores a few queries per block against every key and
 * needs, per query, the softmax mass of each key block. In torch that is a causal mask, a softmax
 * that writes every probability and a block sum that reads them back: on a 2-core AVX2 CPU those
 * three passes took ~16 ms of a 30 ms chunk (the score product the rest). This file does them as
 * two passes over each row while it sits in cache: the row's max, then exp and block sums.
 * Reference and launcher: kernels/block_softmax.py; loader: kernels/native.py.
 *
 * Row i of `rows` sees columns lo[i] .. hi[i] - 1 of its `width` scores (the causal limit and any
 * left padding); every other column has no mass. out[i, j] is the mass of columns j*b .. j*b+b-1,
 * nb = ceil(width / b) of them per row, summing to 1 (all 0 when the row sees nothing).
 *
 * Compiled with -O3 and the parts of -ffast-math that let the loops vectorise (never -ffast-math
 * itself: it would link crtfastmath.o, which flushes subnormals to zero process-wide), and
 * -march=native where the compiler has it; the scores must be finite (columns outside lo .. hi
 * are never read).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp.h"

/* One row: x (already float32) visible over [lo, hi), into o[nb]; tmp holds nb * b floats. */
static void row_block_mass(const float* x, int64_t lo, int64_t hi, int64_t b, int64_t nb,
                           float* tmp, float* o) {
    for (int64_t j = 0; j < nb; j++) o[j] = 0.0f;
    if (lo < 0) lo = 0;
    if (hi > nb * b) hi = nb * b;
    if (hi <= lo) return;
    float m = x[lo];
    for (int64_t i = lo; i < hi; i++) m = x[i] > m ? x[i] : m;
    const int64_t j0 = lo / b, j1 = (hi + b - 1) / b;
    for (int64_t i = j0 * b; i < lo; i++) tmp[i] = 0.0f;
    for (int64_t i = lo; i < hi; i++) tmp[i] = exp_nonpositive(x[i] - m);
    for (int64_t i = hi; i < j1 * b; i++) tmp[i] = 0.0f;
    float total = 0.0f;
    for (int64_t j = j0; j < j1; j++) {
        float s = 0.0f;
        for (int64_t i = 0; i < b; i++) s += tmp[j * b + i];
        o[j] = s;
        total += s;
    }
    const float inv = 1.0f / total;
    for (int64_t j = j0; j < j1; j++) o[j] *= inv;
}

/* scores [rows, width] float32, row-major; lo, hi [rows]; out [rows, ceil(width / b)].
 * Returns 0, or -1 when the scratch row could not be allocated (out is then untouched). */
int block_softmax_sums_f32(const float* scores, int64_t rows, int64_t width, const int64_t* lo,
                           const int64_t* hi, int64_t b, float* out) {
    const int64_t nb = (width + b - 1) / b;
    float* tmp = malloc(sizeof(float) * (size_t)(nb * b));
    if (tmp == NULL) return -1;
    for (int64_t r = 0; r < rows; r++)
        row_block_mass(scores + r * width, lo[r], hi[r], b, nb, tmp, out + r * nb);
    free(tmp);
    return 0;
}

/* The same for bfloat16 scores (the score product's dtype where it is native): each row is
 * widened to float32 first, its visible columns only (a bfloat16 is the top half of a float32). */
int block_softmax_sums_bf16(const uint16_t* scores, int64_t rows, int64_t width,
                            const int64_t* lo, const int64_t* hi, int64_t b, float* out) {
    const int64_t nb = (width + b - 1) / b;
    float* tmp = malloc(sizeof(float) * (size_t)(2 * nb * b));
    if (tmp == NULL) return -1;
    float* row = tmp + nb * b;
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t* x = scores + r * width;
        const int64_t end = hi[r] < width ? hi[r] : width;
        for (int64_t i = lo[r] > 0 ? lo[r] : 0; i < end; i++) {
            const uint32_t bits = (uint32_t)x[i] << 16;
            memcpy(row + i, &bits, sizeof(float));
        }
        row_block_mass(row, lo[r], hi[r], b, nb, tmp, out + r * nb);
    }
    free(tmp);
    return 0;
}
