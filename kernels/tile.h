/* The score product of the C kernels (block_softmax.c, prefill_attention.c): TILE_ROWS query rows
 * against keys packed in panels of PANEL keys, coordinate-major inside a panel (kp[p][c][j] is
 * coordinate c of key p * PANEL + j, kernels/block_softmax.py pack_keys), so a tile reads them
 * front to back; the inner loop holds TILE_ROWS x PANEL scores in vector registers, the register
 * tile of the usual 6 x 16 float GEMM micro-kernel for 16 vector registers. */
#ifndef SKETCHWALK_TILE_H
#define SKETCHWALK_TILE_H

#include <stdint.h>

#include "vec.h"

#define TILE_ROWS 6
#define PANEL 16

#if defined(__AVX512F__)
/* With AVX-512 a panel is one 16-lane register and two panels go at once: 12 independent
 * accumulators again, each multiply-add twice as wide (the same products in the same order
 * per score, so the same scores bit for bit). */
typedef float vec16 __attribute__((vector_size(64), aligned(4)));

static inline void score_panels(const float* q, int64_t d, const float* kp, int64_t np, float* s,
                                int64_t lds) {
    int64_t p = 0;
    for (; p + 1 < np; p += 2) {
        const float* p0 = kp + p * d * PANEL;
        const float* p1 = p0 + d * PANEL;
        vec16 acc[TILE_ROWS][2];
        for (int i = 0; i < TILE_ROWS; i++) acc[i][0] = acc[i][1] = (vec16){0};
        for (int64_t c = 0; c < d; c++) {
            const vec16 k0 = *(const vec16*)(p0 + c * PANEL);
            const vec16 k1 = *(const vec16*)(p1 + c * PANEL);
            for (int i = 0; i < TILE_ROWS; i++) {
                const float qv = q[i * d + c];
                acc[i][0] += qv * k0;
                acc[i][1] += qv * k1;
            }
        }
        for (int i = 0; i < TILE_ROWS; i++) {
            *(vec16*)(s + i * lds + p * PANEL) = acc[i][0];
            *(vec16*)(s + i * lds + p * PANEL + PANEL) = acc[i][1];
        }
    }
    for (; p < np; p++) {
        const float* panel = kp + p * d * PANEL;
        vec16 acc[TILE_ROWS];
        for (int i = 0; i < TILE_ROWS; i++) acc[i] = (vec16){0};
        for (int64_t c = 0; c < d; c++) {
            const vec16 k = *(const vec16*)(panel + c * PANEL);
            for (int i = 0; i < TILE_ROWS; i++) acc[i] += q[i * d + c] * k;
        }
        for (int i = 0; i < TILE_ROWS; i++) *(vec16*)(s + i * lds + p * PANEL) = acc[i];
    }
}
#else
/* s[i][0 .. np * PANEL) = q[i] . key for the TILE_ROWS rows of q [TILE_ROWS, d] and the np
 * panels at kp; s has row stride lds. */
static inline void score_panels(const float* q, int64_t d, const float* kp, int64_t np, float* s,
                                int64_t lds) {
    for (int64_t p = 0; p < np; p++) {
        const float* panel = kp + p * d * PANEL;
        vec8 acc[TILE_ROWS][2];
        for (int i = 0; i < TILE_ROWS; i++) acc[i][0] = acc[i][1] = (vec8){0};
        for (int64_t c = 0; c < d; c++) {
            const vec8 k0 = *(const vec8*)(panel + c * PANEL);
            const vec8 k1 = *(const vec8*)(panel + c * PANEL + 8);
            for (int i = 0; i < TILE_ROWS; i++) {
                const float qv = q[i * d + c];
                acc[i][0] += qv * k0;
                acc[i][1] += qv * k1;
            }
        }
        for (int i = 0; i < TILE_ROWS; i++) {
            *(vec8*)(s + i * lds + p * PANEL) = acc[i][0];
            *(vec8*)(s + i * lds + p * PANEL + 8) = acc[i][1];
        }
    }
}
#endif

#endif
