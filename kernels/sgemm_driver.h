/* The F32 GEMM driver every SIMD path shares: c[m, n] (+)= op(a)[m, k] . op(b)[k, n] (kernels.h).
 *
 * Blocking, BLIS-style:
 *   - a tile of `rows` x `columns` outputs lives in registers over a whole depth block (the path's
 *     micro-kernel, `tile`);
 *   - for each column block (SGEMM_BLOCK columns) and depth block (SGEMM_DEPTH values of k), op(b) is
 *     packed into `b_pack` [SGEMM_BLOCK / columns panels][SGEMM_DEPTH][columns] (128 KiB, in L2), whatever
 *     its layout, and streams through the tiles of every row block;
 *   - for each row block, op(a) is packed into `a_pack` [SGEMM_DEPTH][row_lanes] (at most 6 KiB, in L1),
 *     so that the values of one k are adjacent, whether a is stored [m, k] or [k, m].
 * Partial sums between depth blocks are kept in c itself. Each output is one chain of FMAs over k in
 * ascending order, started from 0 (or from the old c when accumulating), whatever tile, block or thread
 * computes it: splitting the columns between threads never changes a bit.
 *
 * A path's file (sgemm_<path>.c) brings only what depends on its instruction set, in a `sgemm_path_t`:
 * its tile's sizes, the micro-kernel and the packing of one k of an op(b) panel. It calls sgemm_drive in its
 * own translation unit, compiled with its own target flags, with a pointer to a static constant: the driver,
 * the micro-kernel and the packing are inlined there with the sizes as constants, the same code as if
 * each path spelled the driver out. */
#pragma once

#include <stdbool.h>
#include <string.h>

#include "kernels.h"
#include "tile_rows.h"

enum {
    SGEMM_ROWS_MAX = 12, /* the most rows per tile sgemm_tile compiles, and the most a_pack values per k */
    SGEMM_DEPTH = 128,   /* k values per depth block */
    SGEMM_BLOCK = 256,   /* columns per column block: a multiple of every path's columns */
};

typedef struct sgemm_path {
    size_t rows;      /* rows of op(a) per tile, at most SGEMM_ROWS_MAX */
    size_t row_lanes; /* a_pack values per k: rows, or more when the micro-kernel loads whole vectors */
    size_t columns;   /* columns per tile */
    /* to[0, columns) = from[0, width), zero past width (width <= columns): one k of an op(b) panel when b
     * is stored [k, n]; NULL for a plain copy (memcpy and memset). */
    void (*pack_b_row)(float *to, float const *from, size_t width);
    /* One tile: c[rows][width] = (load ? c : 0) + a_pack[depth][row_lanes] . b_panel[depth][columns]
     * (width <= columns). Called with a constant `rows` (sgemm_tile): declared always_inline, each count
     * compiles on its own and its accumulators stay in registers. */
    void (*tile)(size_t rows, float const *a_pack, float const *b_panel, size_t depth, float *c,
                 size_t c_stride, size_t width, bool load);
} sgemm_path_t;

/* a_pack[i][r] = op(a)[row + r][k0 + i] for r < rows, i < depth. Where the path's row_lanes exceed its
 * rows (its micro-kernel loads whole vectors of a_pack), every lane past `rows` is zero: the micro-kernel
 * never reads stale or uninitialised values. */
static inline __attribute__((always_inline)) void sgemm_pack_a(sgemm_path_t const *path, float *a_pack,
                                                               kernel_sgemm_t const *s, size_t row,
                                                               size_t rows, size_t k0, size_t depth) {
    size_t lanes = path->row_lanes;
    if (lanes > path->rows) memset(a_pack, 0, depth * lanes * sizeof(float));
    if (s->a_transposed) {
        /* A whole row block copies a constant size per k, a few vector moves rather than a loop of 8-byte
         * ones: each k reads another row of a, and this copy was a fifth of a dW product's time. */
        float const *from = s->a + k0 * s->a_stride + row;
        if (rows == path->rows) {
            for (size_t i = 0; i < depth; ++i)
                memcpy(a_pack + i * lanes, from + i * s->a_stride, path->rows * sizeof(float));
            return;
        }
        for (size_t i = 0; i < depth; ++i)
            memcpy(a_pack + i * lanes, from + i * s->a_stride, rows * sizeof(float));
        return;
    }
    for (size_t r = 0; r < rows; ++r) {
        float const *from = s->a + (row + r) * s->a_stride + k0;
        for (size_t i = 0; i < depth; ++i)
            a_pack[i * lanes + r] = from[i];
    }
}

/* b_pack[panel][i][j] = op(b)[k0 + i][n0 + panel * columns + j] for columns [n0, n1), zero past n1. */
static inline __attribute__((always_inline)) void sgemm_pack_b(sgemm_path_t const *path, float *b_pack,
                                                               kernel_sgemm_t const *s, size_t n0, size_t n1,
                                                               size_t k0, size_t depth) {
    size_t columns = path->columns;
    for (size_t column = n0; column < n1; column += columns, b_pack += depth * columns) {
        size_t width = n1 - column < columns ? n1 - column : columns;
        if (!s->b_transposed) {
            for (size_t i = 0; i < depth; ++i) {
                float *to = b_pack + i * columns;
                float const *from = s->b + (k0 + i) * s->b_stride + column;
                if (path->pack_b_row) {
                    path->pack_b_row(to, from, width);
                    continue;
                }
                memcpy(to, from, width * sizeof(float));
                memset(to + width, 0, (columns - width) * sizeof(float));
            }
            continue;
        }
        for (size_t j = 0; j < columns; ++j) {
            float const *from = s->b + (column + j) * s->b_stride + k0;
            for (size_t i = 0; i < depth; ++i)
                b_pack[i * columns + j] = j < width ? from[i] : 0.0f;
        }
    }
}

/* path->tile for any rows <= path->rows, with `rows` a constant in each case; the cases past path->rows
 * fold away, so that a path never compiles a tile with more rows than it has accumulators for. */
static inline __attribute__((always_inline)) void sgemm_tile(sgemm_path_t const *path, size_t rows,
                                                             float const *a_pack, float const *b_panel,
                                                             size_t depth, float *c, size_t c_stride,
                                                             size_t width, bool load) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count:                                                                                              \
        if (count <= path->rows) path->tile(count, a_pack, b_panel, depth, c, c_stride, width, load);        \
        break;
        TILE_ROW_COUNTS(TILE_CASE)
#undef TILE_CASE
    default:
        break;
    }
}

/* Output columns [n_begin, n_end) of s. The packing buffers are on the calling thread's stack (kernels.h),
 * aligned for any path's vector loads. */
static inline __attribute__((always_inline)) void
sgemm_drive(sgemm_path_t const *path, kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    _Alignas(64) float b_pack[SGEMM_DEPTH * SGEMM_BLOCK];
    _Alignas(64) float a_pack[SGEMM_DEPTH * SGEMM_ROWS_MAX];
    for (size_t n0 = n_begin; n0 < n_end; n0 += SGEMM_BLOCK) {
        size_t n1 = n_end - n0 < SGEMM_BLOCK ? n_end : n0 + SGEMM_BLOCK;
        size_t k0 = 0;
        do { /* at least once, so that k = 0 still writes c = (accumulate ? c : 0) */
            size_t depth = s->k - k0 < SGEMM_DEPTH ? s->k - k0 : SGEMM_DEPTH;
            bool load = k0 > 0 || s->accumulate;
            sgemm_pack_b(path, b_pack, s, n0, n1, k0, depth);
            for (size_t row = 0; row < s->m; row += path->rows) {
                size_t rows = s->m - row < path->rows ? s->m - row : path->rows;
                sgemm_pack_a(path, a_pack, s, row, rows, k0, depth);
                for (size_t column = n0; column < n1; column += path->columns) {
                    size_t width = n1 - column < path->columns ? n1 - column : path->columns;
                    sgemm_tile(path, rows, a_pack, b_pack + (column - n0) * depth, depth,
                               s->c + row * s->c_stride + column, s->c_stride, width, load);
                }
            }
            k0 += depth;
        } while (k0 < s->k);
    }
}
