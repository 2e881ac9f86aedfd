/* A layer's budget spent best value first (kernels/take_best.py take_best_reference): per unit,
 * items ordered by value descending (ties: lower index first, -0.0 as 0.0) are taken while the
 * running cost stays within the budget and the count within cap, and kept where their value is
 * above -inf. In place of a topk over every item and a gather, cumulative sum and scatter of its
 * order (~15 ms a layer at 16k tokens): the cut is found by a radix select on the values' order
 * keys, each level's histogram weighted by cost, so nothing is sorted. Launcher:
 * kernels/take_best.py; loader: kernels/native.py. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Unsigned keys in the order of the values (best_first's: the bits made monotone). */
static inline uint32_t order_key(float v) {
    int32_t b;
    memcpy(&b, &v, 4);
    if (b == (int32_t)0x80000000) b = 0; /* -0.0 ties with 0.0 */
    const int32_t o = b < 0 ? b ^ 0x7fffffff : b;
    return (uint32_t)o ^ 0x80000000u;
}

/* v > -inf by its bits (NaN is not; the library is built with -ffinite-math-only, under which a
 * comparison with -inf may be folded away). */
static inline int above_neg_inf(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return (b & 0x7fffffffu) <= 0x7f800000u && b != 0xff800000u;
}

/* value [units, n] (unit u = batch u / groups), cost [units / groups, n], budget [units], cap:
 * at most this many items a unit; keep [units, n] (1: taken). Returns 0, or -1 without memory. */
int take_best_f32(const float* value, const float* cost, int64_t units, int64_t groups,
                  int64_t n, const int64_t* budget, int64_t cap, uint8_t* keep) {
    uint32_t* key = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    int64_t* live = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!key || !live) {
        free(key), free(live);
        return -1;
    }
    for (int64_t u = 0; u < units; u++) {
        const float* v = value + u * n;
        const float* c = cost + (u / groups) * n;
        uint8_t* out = keep + u * n;
        double left = (double)budget[u];
        int64_t room = cap;
        int64_t m = n; /* items still matching the key's prefix, listed in live */
        for (int64_t i = 0; i < n; i++) key[i] = order_key(v[i]), live[i] = i;
        uint32_t cut = 0; /* the key of the last item taken, once the levels fix it */
        int all = 0;      /* every item fits */
        for (int shift = 24; shift >= 0; shift -= 8) {
            double hc[256] = {0};
            int64_t hn[256] = {0};
            for (int64_t t = 0; t < m; t++) {
                const int64_t i = live[t];
                const int d = (int)((key[i] >> shift) & 255u);
                hc[d] += (double)c[i], hn[d]++;
            }
            int d = 255;
            for (; d >= 0; d--) { /* buckets above the cut are taken whole */
                if (hc[d] > left || hn[d] > room) break;
                left -= hc[d], room -= hn[d];
            }
            if (d < 0) { /* everything matching fits: the cut is below all of them */
                all = 1;
                break;
            }
            cut |= (uint32_t)d << shift;
            int64_t w = 0;
            for (int64_t t = 0; t < m; t++) /* in index order, as they were listed */
                if ((int)((key[live[t]] >> shift) & 255u) == d) live[w++] = live[t];
            m = w;
        }
        for (int64_t i = 0; i < n; i++) out[i] = all ? 1 : key[i] > cut;
        if (!all) /* ties at the cut: in index order while the budget and the count allow */
            for (int64_t t = 0; t < m; t++) {
                const int64_t i = live[t];
                if ((double)c[i] > left || room < 1) break;
                left -= (double)c[i], room--, out[i] = 1;
            }
        for (int64_t i = 0; i < n; i++) out[i] = out[i] && above_neg_inf(v[i]);
    }
    free(key), free(live);
    return 0;
}
