/* e^x for x <= 0, shared by the C kernels of this folder (block_softmax.c, decode_attention.c).
 *
 * Relative error ~1e-7 above e^-87, 0 below: 2^(x log2 e) split into 2^n 2^f with |f| <= 1/2;
 * 2^f = e^(f ln 2) by its Taylor series to degree 6 (error (ln2/2)^7/7!); 2^n written into the
 * exponent bits. Plain C so that the compiler vectorises the loops that call it. */
#ifndef SKETCHWALK_EXP_H
#define SKETCHWALK_EXP_H

#include <stdint.h>
#include <string.h>

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

#endif
