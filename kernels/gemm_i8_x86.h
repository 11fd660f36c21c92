/* The micro-kernel of the x86 I8 GEMM paths (gemm_i8_avx2.c, gemm_i8_avxvnni.c, gemm_i8_avx512vnni.c),
 * written once over what each defines before including this header (after its math header, gemm_driver.h
 * and gemm_epilogue.h):
 *   - ROWS, COLUMNS (two vints of int32 lanes), GROUP (k values one int32 lane takes per step: 4 for a
 *     VNNI dot product of four u8 by four s8, 2 for a pair of s16 by s16) and DEPTH, as enums;
 *   - PATH_I8(name): the exported name of the path's function `name`: kernel_<name>_<path> for gemm_i8,
 *     gemm_i8_packed_size and gemm_i8_pack;
 *   - load_weights(w, group): one group of a panel [COLUMNS][GROUP] int8 as the two vints `dot` takes;
 *   - dot(acc, x, w): acc += the GROUP products of each lane's activations (x: one row's group broadcast)
 *     and weights, summed, exactly;
 *   - LOAD_ROWS: gemm_path_t's load_rows, writing a_block [ROWS][DEPTH / GROUP] int32 lanes, each one group
 *     of activations of a row in the layout `dot` takes, zero past depth: load_rows_u8 below for the VNNI
 *     paths.
 * The driver (blocking, column blocks, partial sums in int32) is gemm_driver.h's, the end of a tile
 * gemm_epilogue_i8's. Each output is the same chain of exact integer dot products whatever tile, block or
 * thread computes it, so the sums are bitwise the scalar path's. */

static gemm_path_t const path;

/* The load_rows of the VNNI paths: a_block[r] = x_u8[row + r][k0, k0 + depth) as it is, each int32 lane
 * four consecutive k, zero up to the next group. */
static inline void load_rows_u8(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                                size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        uint8_t *to = (uint8_t *)a_block + r * DEPTH;
        memcpy(to, g->x_u8 + (row + r) * g->x_stride + k0, depth);
        memset(to + depth, 0, (depth + GROUP - 1) / GROUP * GROUP - depth);
    }
}

/* One tile: `rows` (<= ROWS) rows of a_block times one panel's groups of `depth` k values; int32 partial
 * sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come back for the next
 * one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    size_t const lanes = sizeof(vint) / sizeof(int32_t), groups = (depth + GROUP - 1) / GROUP;
    int32_t const *a = a_block;
    int8_t const *b = panel;
    int32_t *sums = (int32_t *)(void *)partial;
    vint acc[ROWS][2];
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < 2; ++v)
            acc[r][v] = first ? vi_zero() : vi_load(sums + r * COLUMNS + lanes * v);
#pragma GCC unroll 2
    for (size_t p = 0; p < groups; ++p, b += COLUMNS * GROUP) {
        vint w[2];
        load_weights(w, b);
#pragma GCC unroll 14
        for (size_t r = 0; r < rows; ++r) {
            vint x = vi_set1(a[r * (DEPTH / GROUP) + p]);
#pragma GCC unroll 2
            for (size_t v = 0; v < 2; ++v)
                acc[r][v] = dot(acc[r][v], x, w[v]);
        }
    }
    if (!last) {
#pragma GCC unroll 14
        for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
            for (size_t v = 0; v < 2; ++v)
                vi_store(sums + r * COLUMNS + lanes * v, acc[r][v]);
        return;
    }
    gemm_epilogue_i8(&path, rows, acc, g, row, column);
}

static gemm_path_t const path = {.rows = ROWS,
                                 .columns = COLUMNS,
                                 .depth = DEPTH,
                                 .group = GROUP,
                                 .prefetch = true,
                                 .load_rows = LOAD_ROWS,
                                 .tile = tile};

size_t PATH_I8(gemm_i8_packed_size)(size_t n, size_t k) {
    return gemm_i8_packed_size(&path, n, k);
}

void PATH_I8(gemm_i8_pack)(void *packed, int8_t const *w, float const *scales, size_t n, size_t k) {
    gemm_pack_i8(&path, packed, w, scales, n, k);
}

void PATH_I8(gemm_i8)(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) int32_t a_block[ROWS * (DEPTH / GROUP)];
    _Alignas(64) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
