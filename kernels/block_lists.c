/* A kept-block mask as sorted index lists: the select's last step.
 *
 * Why: in torch the lists came from a cumulative sum, a scatter and a select over the whole
 * [B, G, nq, nk] mask, each converting its dtype (~1-2 ms a layer at 8k tokens on 2 cores); one
 * scan per row does it here. Reference and launcher: kernels/block_lists.py; loader:
 * kernels/native.py.
 *
 * keep [rows, nk] (one byte per flag, 0 or 1) -> index [rows, kmax]: row r's kept key blocks in
 * ascending order, then its first kept block repeated (nk - 1 for a row that keeps none);
 * kmax must be at least every row's count. Returns 0, or -1 without memory for a scratch row. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int block_lists_i32(const uint8_t* keep, int64_t rows, int64_t nk, int64_t kmax,
                    int32_t* index) {
    /* every block written at the row's next place, the place advanced by its flag: no branch
     * on the flags (a [3, 1024, 1024] mask, 20% kept at random: 7.8 -> 1.1 ms with a branch
     * per block), into a scratch row with room for all */
    int32_t* row = malloc((size_t)(nk + 1) * sizeof(int32_t));
    if (!row) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t* k = keep + r * nk;
        int32_t* out = index + r * kmax;
        int64_t c = 0;
        for (int64_t j = 0; j < nk; j++) row[c] = (int32_t)j, c += k[j] != 0;
        if (c > kmax) c = kmax;
        memcpy(out, row, (size_t)c * sizeof(int32_t));
        const int32_t pad = c > 0 ? out[0] : (int32_t)(nk > 0 ? nk - 1 : 0);
        for (; c < kmax; c++) out[c] = pad;
    }
    free(row);
    return 0;
}
