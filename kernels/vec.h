/* 8-lane float and int32 vectors for the C kernels of this folder (GCC/Clang vector
 * extensions: AVX with -march=native, narrower SIMD or scalar code elsewhere). */
#ifndef SKETCHWALK_VEC_H
#define SKETCHWALK_VEC_H

#include <stdint.h>

/* read and written at any float alignment (vector types may alias their elements) */
typedef float vec8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t ivec8 __attribute__((vector_size(32), aligned(4)));

/* x where mask (all ones), else y: C has no ?: on vectors */
static inline vec8 pick(ivec8 mask, vec8 x, vec8 y) {
    return (vec8)(((ivec8)x & mask) | ((ivec8)y & ~mask));
}

#if defined(__AVX__)
#include <immintrin.h>
static inline vec8 max8(vec8 a, vec8 b) { return (vec8)_mm256_max_ps((__m256)a, (__m256)b); }
#else
static inline vec8 max8(vec8 a, vec8 b) { return pick(a > b, a, b); }
#endif

#endif
