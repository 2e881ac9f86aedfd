/* One decode token into a layer's sketched block sums, in one call: the per-token bookkeeping of
 * the sketch's decode state (engine/decode.py decode_absorb), which in torch was ~15 small ops a
 * layer (~0.25 ms, ~7 ms of a 28-layer step at 7k tokens). Launcher and its torch twin:
 * kernels/token_sketch.py; loader: kernels/native.py.
 *
 * For every sequence b: each query head's sketch qs = q[b, h] @ mat (d -> r coordinates) is added
 * to q_sum[b, h] and written to qs_out[b, h] (strides osb, osh: a slot of the decode state's query
 * window, written in place); each KV head's ks = k[b, g] @ mat to k_sum[b, g],
 * and ks^2 to k_sq[b, g] (when given); both counts of b grow by one. The sums point at the
 * token's block; their last dim is contiguous. */
#include <stdint.h>

/* y[0 .. r) = x[0 .. d) @ mat [d, r] */
static void sketch_row(const float* x, const float* mat, int64_t d, int64_t r, float* y) {
    for (int64_t j = 0; j < r; j++) y[j] = 0.0f;
    for (int64_t c = 0; c < d; c++) {
        const float xc = x[c];
        const float* m = mat + c * r;
        for (int64_t j = 0; j < r; j++) y[j] += xc * m[j];
    }
}

int absorb_token_f32(const float* q, int64_t qb, int64_t qh, const float* k, int64_t kb,
                     int64_t kh, const float* mat, int64_t d, int64_t r, int64_t bsz, int64_t h,
                     int64_t hkv, float* q_sum, int64_t qsb, int64_t qsh, float* k_sum,
                     int64_t ksb, int64_t ksh, float* k_sq, int64_t kqb, int64_t kqh,
                     float* q_count, int64_t qcb, float* k_count, int64_t kcb, float* qs_out,
                     int64_t osb, int64_t osh) {
    float ks[r > 0 ? r : 1];
    for (int64_t b = 0; b < bsz; b++) {
        for (int64_t i = 0; i < h; i++) {
            float* y = qs_out + b * osb + i * osh;
            sketch_row(q + b * qb + i * qh, mat, d, r, y);
            float* s = q_sum + b * qsb + i * qsh;
            for (int64_t j = 0; j < r; j++) s[j] += y[j];
        }
        for (int64_t g = 0; g < hkv; g++) {
            sketch_row(k + b * kb + g * kh, mat, d, r, ks);
            float* s = k_sum + b * ksb + g * ksh;
            for (int64_t j = 0; j < r; j++) s[j] += ks[j];
            if (k_sq != 0) {
                float* s2 = k_sq + b * kqb + g * kqh;
                for (int64_t j = 0; j < r; j++) s2[j] += ks[j] * ks[j];
            }
        }
        q_count[b * qcb] += 1.0f;
        k_count[b * kcb] += 1.0f;
    }
    return 0;
}
