/* The GEMM driver every SIMD path shares, for BF16 weights and for I8 ones: y[m, n] = residual +
 * epilogue(x[m, k] . w[n, k]^T + bias) (kernels.h).
 *
 * Blocking:
 *   - a tile of `rows` x `columns` outputs lives in registers over a whole depth block (the path's
 *     micro-kernel, `tile`, which applies the epilogue after the last one);
 *   - the activations of the tile's rows over one depth block are loaded into the path's `a_block`, in its
 *     own layout (`load_rows`), and reused by every tile of the column block;
 *   - the packed weights of a column block (up to GEMM_BLOCK_BYTES) stream from L3 through the tiles of
 *     each row block in one sequential run (each path's gemm_pack stores, for each depth block, the
 *     panels of `columns` columns one after the other); wide blocks load each row of x fewer times.
 * Partial sums of a depth block that is not the last go to `partial` [block][rows] and come back for the
 * next one. Each output is the same chain of FMAs (or dot products) over k in order, whatever tile, block
 * or thread computes it, so splitting the columns between threads never changes a bit.
 *
 * A path's file (gemm_<path>.c, gemm_i8_<path>.c) brings only what depends on its instruction set: its
 * packing (gemm_pack, gemm_pack_halves where it widens a pair of columns per lane, gemm_pack_i8 for I8
 * weights), and in a `gemm_path_t` its tile's sizes, the loading of activations and the micro-kernel with
 * its epilogue (reading g through gemm_epilogue_at; the x86 paths share theirs, gemm_epilogue.h). It calls
 * gemm_drive in its own translation unit, compiled with its own target flags, with a pointer to a static
 * constant, as sgemm_driver.h does: the same code as if each path spelled the driver out. Every function here
 * that takes `path` is always_inline: one left out of line would keep `path`, and with it an out-of-line
 * micro-kernel for any row count. */
#pragma once

#include <stdbool.h>

#include "kernels.h"
#include "tile_rows.h"

enum {
    GEMM_ROWS_MAX = 14,                 /* the most rows per tile gemm_tile compiles */
    GEMM_BLOCK_MAX = 1024,              /* columns per column block at most */
    GEMM_BLOCK_BYTES = 4 * 1024 * 1024, /* packed weights per column block at most */
};

typedef struct gemm_path {
    size_t rows;    /* rows of x per tile, at most GEMM_ROWS_MAX */
    size_t columns; /* outputs per tile row: the columns of a packed panel */
    size_t depth;   /* k values per depth block: a multiple of 2 where k is packed in pairs, of `group` */
    bool pairs;     /* BF16 weights: whether k is packed in pairs (an odd k padded with a zero) */
    size_t group;   /* I8 weights: k values packed side by side per column (2, 4 or 8), the last group
                       padded with zeros; 0 for BF16 weights */
    bool prefetch;  /* whether to fetch the next depth block's activations while the tiles compute */
    /* a_block = the activations x[row, row + rows)[k0, k0 + depth), in the path's layout. */
    void (*load_rows)(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth);
    /* One tile: `rows` rows of a_block times one panel over `depth` k values; partial sums to and from
     * `partial` [rows][columns] unless `last`, then y = residual + epilogue(sum + bias) at (row, column).
     * Called with a constant `rows` (gemm_tile): declared always_inline, each count compiles on its own
     * and its accumulators stay in registers. */
    void (*tile)(size_t rows, void const *a_block, void const *panel, size_t depth, float *partial,
                 bool first, bool last, kernel_gemm_t const *g, size_t row, size_t column);
} gemm_path_t;

/* Panels of `columns` columns that cover n columns (the last one zero-padded). */
static inline size_t gemm_panels_of(size_t n, size_t columns) {
    return (n + columns - 1) / columns;
}

/* The packing of the paths that widen BF16 weights to F32 with one shift and one mask (gemm_fma.c, avx2 and
 * avx512): for each depth block of `depth_max` k values (the last one shorter), for each panel of
 * `columns` columns: [depth][columns / 2] uint32, lane i of row k pairing w[c0 + i][k] (low half) with
 * w[c0 + columns / 2 + i][k] (high half). Columns past n are zero. The panels of one depth block follow
 * each other, so that the tiles of a row block read one sequential stream. */
static inline __attribute__((always_inline)) void
gemm_pack_halves(uint32_t *out, uint16_t const *w, size_t n, size_t k, size_t columns, size_t depth_max) {
    size_t lanes = columns / 2;
    for (size_t k0 = 0; k0 < k; k0 += depth_max) {
        size_t depth = k - k0 < depth_max ? k - k0 : depth_max;
        for (size_t panel = 0; panel < gemm_panels_of(n, columns); ++panel)
            for (size_t i = k0; i < k0 + depth; ++i)
                for (size_t lane = 0; lane < lanes; ++lane, ++out) {
                    size_t low = panel * columns + lane, high = low + lanes;
                    *out =
                        (low < n ? w[low * k + i] : 0u) | (high < n ? (uint32_t)w[high * k + i] << 16 : 0u);
                }
    }
}

/* What a tile's epilogue y = residual + epilogue(sum + bias) reads and writes at (row, column), g's fields
 * read once: stores to y may alias them. */
typedef struct gemm_epilogue {
    float const *bias;     /* bias[n], or NULL */
    float const *residual; /* residual at (row, column), or NULL */
    float *y;              /* y at (row, column) */
    size_t y_stride, residual_stride;
    kernel_epilogue_t kind; /* the activation */
} gemm_epilogue_t;

static inline __attribute__((always_inline)) gemm_epilogue_t gemm_epilogue_at(kernel_gemm_t const *g,
                                                                              size_t row, size_t column) {
    gemm_epilogue_t e = {.bias = g->bias,
                         .residual = g->residual,
                         .y = g->y + row * g->y_stride + column,
                         .y_stride = g->y_stride,
                         .residual_stride = g->residual_stride,
                         .kind = g->epilogue};
    if (e.residual) e.residual += row * e.residual_stride + column;
    return e;
}

/* k rounded up to whole groups (I8) or pairs of the path. */
static inline __attribute__((always_inline)) size_t gemm_grouped(gemm_path_t const *path, size_t k) {
    size_t group = path->group ? path->group : path->pairs ? 2 : 1;
    return (k + group - 1) / group * group;
}

/* Bytes of one packed weight. */
static inline __attribute__((always_inline)) size_t gemm_element(gemm_path_t const *path) {
    return path->group ? sizeof(int8_t) : sizeof(uint16_t);
}

/* The packed panel of `column` in the depth block at k0, of `depth` k values. Every path's gemm_pack
 * stores, for each depth block, the panels of `columns` columns one after the other, each [depth][columns]
 * weights in its own order (depth rounded up to whole groups). */
static inline __attribute__((always_inline)) void const *
gemm_panel_at(gemm_path_t const *path, void const *packed, size_t n, size_t k0, size_t depth, size_t column) {
    size_t panels = gemm_panels_of(n, path->columns), values = gemm_grouped(path, depth);
    return (char const *)packed +
           (k0 * panels + column / path->columns * values) * path->columns * gemm_element(path);
}

/* ---- I8 weights ----------------------------------------------------------------------------------
 * The packing of every SIMD path's I8 GEMM: for each depth block of path->depth k values (the last one
 * shorter), for each panel of path->columns columns, for each group of path->group k values:
 * [columns][group] int8, w[c0 + c][k0 + group * g + j] at c * group + j (zero past n and past k). Then,
 * at the next multiple of 64 bytes, each column's scale and the sum of its weights over k, which takes
 * the activations' zero point out of the sums: [n rounded up to panels] F32, then as many int32. */
typedef struct gemm_i8_columns {
    float const *scales; /* [panels * columns] */
    int32_t const *sums; /* [panels * columns]: sum over k of w[c, k] */
} gemm_i8_columns_t;

static inline __attribute__((always_inline)) size_t gemm_i8_panels_bytes(gemm_path_t const *path, size_t n,
                                                                         size_t k) {
    size_t bytes = gemm_panels_of(n, path->columns) * path->columns * gemm_grouped(path, k);
    return (bytes + 63) / 64 * 64;
}

static inline __attribute__((always_inline)) size_t gemm_i8_packed_size(gemm_path_t const *path, size_t n,
                                                                        size_t k) {
    size_t padded = gemm_panels_of(n, path->columns) * path->columns;
    return gemm_i8_panels_bytes(path, n, k) + padded * (sizeof(float) + sizeof(int32_t));
}

static inline __attribute__((always_inline)) gemm_i8_columns_t
gemm_i8_columns_of(gemm_path_t const *path, void const *packed, size_t n, size_t k) {
    char const *at = (char const *)packed + gemm_i8_panels_bytes(path, n, k);
    size_t padded = gemm_panels_of(n, path->columns) * path->columns;
    return (gemm_i8_columns_t){.scales = (float const *)(void const *)at,
                               .sums = (int32_t const *)(void const *)(at + padded * sizeof(float))};
}

/* The packed weights' per-column scales and sums of w over k (0 past n), behind their panels. */
static inline __attribute__((always_inline)) void gemm_i8_columns_fill(gemm_path_t const *path, void *packed,
                                                                       int8_t const *w, float const *scales,
                                                                       size_t n, size_t k) {
    gemm_i8_columns_t at = gemm_i8_columns_of(path, packed, n, k);
    float *column_scales = (float *)(uintptr_t)at.scales;
    int32_t *sums = (int32_t *)(uintptr_t)at.sums;
    for (size_t c = 0; c < gemm_panels_of(n, path->columns) * path->columns; ++c) {
        column_scales[c] = c < n ? scales[c] : 0.0f;
        sums[c] = 0;
        for (size_t i = 0; c < n && i < k; ++i)
            sums[c] += w[c * k + i];
    }
}

static inline __attribute__((always_inline)) void gemm_pack_i8(gemm_path_t const *path, void *packed,
                                                               int8_t const *w, float const *scales, size_t n,
                                                               size_t k) {
    size_t columns = path->columns, group = path->group, panels = gemm_panels_of(n, columns);
    int8_t *out = packed;
    for (size_t k0 = 0; k0 < k; k0 += path->depth) {
        size_t end = k - k0 < path->depth ? k : k0 + path->depth;
        for (size_t panel = 0; panel < panels; ++panel)
            for (size_t g = k0; g < end; g += group)
                for (size_t c = panel * columns; c < (panel + 1) * columns; ++c)
                    for (size_t i = g; i < g + group; ++i)
                        *out++ = c < n && i < end ? w[c * k + i] : 0;
    }
    gemm_i8_columns_fill(path, packed, w, scales, n, k);
}

/* path->tile for any rows <= path->rows, with `rows` a constant in each case; the cases past path->rows
 * fold away, so that a path never compiles a tile with more rows than it has accumulators for. */
static inline __attribute__((always_inline)) void
gemm_tile(gemm_path_t const *path, size_t rows, void const *a_block, void const *panel, size_t depth,
          float *partial, bool first, bool last, kernel_gemm_t const *g, size_t row, size_t column) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count:                                                                                              \
        if (count <= path->rows)                                                                             \
            path->tile(count, a_block, panel, depth, partial, first, last, g, row, column);                  \
        break;
        TILE_ROW_COUNTS(TILE_CASE)
#undef TILE_CASE
    default:
        break;
    }
}

/* Walks the lines of x[row, row + rows)[k0, k0 + depth) a share per tile, fetching them, so that the
 * next depth block's activations arrive while this block's tiles compute instead of stalling `load_rows`
 * on L3 or memory (3-5% at k = 3072 with AVX512-BF16, where x is 6 MiB). */
typedef struct gemm_prefetcher {
    char const *row_start; /* the row being fetched, at k0 */
    size_t row_bytes;      /* x_stride in bytes */
    size_t row_lines;      /* lines per row, one more than whole ones: a row may start mid-line */
    size_t line, rows_left, per_tile;
} gemm_prefetcher_t;

static inline gemm_prefetcher_t gemm_prefetcher_make(kernel_gemm_t const *g, size_t row, size_t rows,
                                                     size_t k0, size_t depth, size_t tiles) {
    if (!rows) return (gemm_prefetcher_t){0}; /* the last block: nothing next */
    size_t size = g->x_u8 ? 1 : g->x_bf16 ? sizeof(uint16_t) : sizeof(float);
    char const *x = g->x_u8     ? (char const *)g->x_u8
                    : g->x_bf16 ? (char const *)g->x_bf16
                                : (char const *)g->x;
    gemm_prefetcher_t p = {.row_start = x + (row * g->x_stride + k0) * size,
                           .row_bytes = g->x_stride * size,
                           .row_lines = depth * size / 64 + 1,
                           .rows_left = rows};
    p.per_tile = (rows * p.row_lines + tiles - 1) / tiles;
    return p;
}

static inline void gemm_prefetcher_step(gemm_prefetcher_t *p) {
    for (size_t i = 0; i < p->per_tile && p->rows_left; ++i) {
        __builtin_prefetch(p->row_start + p->line * 64, 0, 3);
        if (++p->line < p->row_lines) continue;
        p->line = 0;
        p->row_start += p->row_bytes;
        --p->rows_left;
    }
}

/* Fetches the lines of the residual (or, without one, of y) that the tile at (row, column) ends by
 * reading or writing, as its first depth block starts, so that they arrive while it computes: the tiles
 * walk y down one panel's columns of every row at a stride the hardware's prefetchers do not follow, and
 * a cold residual stalled the epilogue of every tile (13% of a 384-column layer's time with AVX512-BF16). */
static inline __attribute__((always_inline)) void gemm_prefetch_outputs(gemm_path_t const *path,
                                                                        kernel_gemm_t const *g, size_t row,
                                                                        size_t rows, size_t column) {
    bool residual = g->residual != NULL;
    float const *at = residual ? g->residual : g->y;
    size_t stride = residual ? g->residual_stride : g->y_stride;
    size_t bytes = (g->n - column < path->columns ? g->n - column : path->columns) * sizeof(float);
    for (size_t r = 0; r < rows; ++r) {
        char const *line = (char const *)(at + (row + r) * stride + column);
        for (size_t b = 0; b < bytes; b += 64)
            __builtin_prefetch(line + b, 0, 3);
        __builtin_prefetch(line + bytes - 1, 0, 3);
    }
}

/* Output columns [n_begin, n_end) of g, with the path's buffers a_block (for load_rows) and partial
 * [GEMM_BLOCK_MAX * rows], aligned for its vector loads. */
static inline __attribute__((always_inline)) void gemm_drive(gemm_path_t const *path, kernel_gemm_t const *g,
                                                             size_t n_begin, size_t n_end, void *a_block,
                                                             float *partial) {
    if (n_begin >= n_end) return;
    /* Column blocks of equal width (in whole panels) at most GEMM_BLOCK_BYTES of weights each. */
    size_t columns = path->columns, panel_bytes = gemm_grouped(path, g->k) * columns * gemm_element(path);
    size_t widest = panel_bytes ? GEMM_BLOCK_BYTES / panel_bytes * columns : GEMM_BLOCK_MAX;
    widest = widest < columns ? columns : widest > GEMM_BLOCK_MAX ? GEMM_BLOCK_MAX : widest;
    size_t blocks = (n_end - n_begin + widest - 1) / widest;
    size_t block = ((n_end - n_begin + columns - 1) / columns + blocks - 1) / blocks * columns;
    for (size_t n0 = n_begin; n0 < n_end; n0 += block) {
        size_t n1 = n_end - n0 < block ? n_end : n0 + block, tiles = (n1 - n0 + columns - 1) / columns;
        for (size_t row = 0; row < g->m; row += path->rows) {
            size_t rows = g->m - row < path->rows ? g->m - row : path->rows;
            size_t k0 = 0;
            do { /* at least once, so that k = 0 still writes residual + epilogue(bias) */
                size_t depth = g->k - k0 < path->depth ? g->k - k0 : path->depth;
                bool first = k0 == 0, last = k0 + depth == g->k;
                path->load_rows(a_block, g, row, rows, k0, depth);
                gemm_prefetcher_t prefetcher = {0};
                if (path->prefetch) {
                    size_t next_row = last ? row + path->rows : row, next_k0 = last ? 0 : k0 + depth;
                    size_t next_rows = next_row >= g->m               ? 0
                                       : g->m - next_row < path->rows ? g->m - next_row
                                                                      : path->rows;
                    size_t next_depth = g->k - next_k0 < path->depth ? g->k - next_k0 : path->depth;
                    prefetcher = gemm_prefetcher_make(g, next_row, next_rows, next_k0, next_depth, tiles);
                }
                for (size_t column = n0; column < n1; column += columns) {
                    if (first) gemm_prefetch_outputs(path, g, row, rows, column);
                    gemm_tile(path, rows, a_block, gemm_panel_at(path, g->w, g->n, k0, depth, column), depth,
                              partial + (column - n0) * path->rows, first, last, g, row, column);
                    if (path->prefetch) gemm_prefetcher_step(&prefetcher);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}
