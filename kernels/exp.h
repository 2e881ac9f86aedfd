/* e^x for x <= 0, shared by the C kernels of this folder (block_softmax.c, decode_attention.c).
 *
 * Relative error ~1e-7 above e^-87, 0 below: 2^(x log2 e) split into 2^n 2^f with |f| <= 1/2;
 * 2^f = e^(f ln 2) by its Taylor series to degree 6 (error (ln2/2)^7/7!); 2^n written into the
 * exponent bits. Plain C so that the compiler vectorises the loops that call it. */
#ifndef SKETCHWALK_EXP_H
#define SKETCHWALK_EXP_H

#include <stdint.h>
#include <string.h>

#include "vec.h"

static inline float exp_nonpositive(float x) {
    if (x < -87.0f) x = -87.0f;
    const float t = x * 1.44269504088896341f;
    const float n = __builtin_floorf(t + 0.5f);
    const float f = (t - n) * 0.693147180559945309f;
    const float p =
        1.0f + f * (1.0f + f * (0.5f + f * (1.66666667e-1f +
        f * (4.16666667e-2f + f * (8.33333333e-3f + f * 1.38888889e-3f)))));
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x <= -87.0f ? 0.0f : p * scale;
}

/* exp_nonpositive on 8 lanes at once, in as few vector operations as it takes (a loop of the
 * scalar one vectorises only where the compiler sees a long loop; this one runs in a block's
 * 2-8 vectors): n = trunc(t - 1/2) rounds t = x log2 e <= 0 to within 1/2, 2^f by the same
 * series with ln 2 folded into its coefficients. Agrees with exp_nonpositive to ~2e-7. */
static inline vec8 exp8_nonpositive(vec8 x) {
    const vec8 t = max8(x, (vec8){0} - 87.0f) * 1.44269504088896341f;
    const ivec8 n = __builtin_convertvector(t - 0.5f, ivec8);
    const vec8 f = t - __builtin_convertvector(n, vec8);
    const vec8 p =
        1.0f + f * (6.93147181e-1f + f * (2.40226507e-1f + f * (5.55041087e-2f +
        f * (9.61812911e-3f + f * (1.33335581e-3f + f * 1.54035304e-4f)))));
    return p * (vec8)((n + 127) << 23);
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* e^x for x <= 0 on 16 lanes in 10 vector operations: t = x log2 e split as n + f, n rounded to
 * nearest (|f| <= 1/2), 2^f by its series to degree 5 (relative error ~2e-6), 2^n applied by
 * vscalefps. t is held at -125 and above, as exp_nonpositive holds x at -87: below that the
 * result would be subnormal, and each subnormal result cost ~40x a normal one here (hidden
 * columns at -3e38 thus give ~2e-38, not 0). */
static inline __m512 exp16_nonpositive(__m512 x) {
    const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                   _mm512_set1_ps(-125.0f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.33335581e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.61812911e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.55041087e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.40226507e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93147181e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
