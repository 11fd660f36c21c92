/* BF16 and I8 GEMMs on Intel AMX's tiles (Sapphire Rapids and later): eight tile registers of 16 rows of
 * 64 bytes; `tdpbf16ps` multiplies a 16 x 32 BF16 tile by a 32 x 16 one (stored as 16 rows of 16 pairs)
 * into a 16 x 16 F32 tile, `tdpbusd` a 16 x 64 u8 tile by a 64 x 16 s8 one (16 rows of 16 groups of four)
 * into a 16 x 16 int32 tile, the four products of each group summed exactly.
 *
 * For y = x . w^T, a block of 32 rows x 32 columns lives in four C tiles over a depth block:
 *   tiles 0-3: C (rows 0-15 x columns 0-15, rows 0-15 x 16-31, rows 16-31 x 0-15, rows 16-31 x 16-31);
 *   tiles 4-5: A, the activations of rows 0-15 and 16-31 over one step (32 BF16 or 64 u8 values);
 *   tiles 6-7: B, the weights of columns 0-15 and 16-31 over the same step.
 * Each step loads four tiles for four multiplies (the 2x2 blocking of docs/DESIGN.md's AMX section).
 *   - gemm_pack writes each panel of 32 columns whole over k: [steps][2 tiles][16][16] uint32, a word being
 *     the pair (w[c][2i], w[c][2i + 1]) (BF16, even k low) or the four w[c][4i .. 4i + 3] (I8); zero past
 *     n and past k. The I8 packing then holds each column's scale and weight sum (gemm_driver.h's).
 *   - per depth block of a 32-row block, the activations are written once into `a_block` [steps][32 rows]
 *     of 64 bytes (F32 rounded to BF16 to nearest even, as avx512bf16 does; u8 as they are), rows past m
 *     and values past k zero, so that partial tiles need no other configuration;
 *   - C goes to `partial` [panels][32][32] after each depth block (and comes back for the next one), and
 *     after the last one the epilogue (gemm_epilogue.h) reads it there, 8 rows at a time. The I8 sums take
 *     the activations' zero points out as avx512vnni does: S = acc - zero * sum_k w.
 * Each output is the same chain of tile multiplies over the steps of k in order, whatever block or thread
 * computes it (the store and reload of C between depth blocks is exact), so splitting the columns between
 * threads never changes a bit; the I8 sums are exact, so bitwise the scalar path's.
 *
 * Tiles: one configuration for both GEMMs (every tile 16 rows x 64 bytes), a static constant (gcc 12's
 * `_tile_loadconfig` reads only 8 bytes as far as the optimizer knows, and drops stores to a local
 * config), loaded once per thread on its first GEMM; a pthread key releases them when the thread ends.
 * The process's permission to use them (arch_prctl) is dispatch.c's, asked before this path is chosen.
 *
 * Built twice: for the kernel table (-mamx-tile -mamx-bf16 -mamx-int8), and, with UFORM_AMX_EMULATED, for
 * tests/kernels/test_gemm_amx.c with the tile instructions replaced by a scalar emulation
 * (tests/kernels/amx_emulated.h), so that CPUs without AMX test this file's logic.
 * Stack: about 130 KiB (a_block and partial). */
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "amx_tiles.h"
#include "gemm_driver.h"
#include "math_avx512.h"
#include "gemm_epilogue.h"
#include "paths.h"

#if defined(UFORM_AMX_EMULATED)
#include "amx_emulated.h"
#define PATH_AMX(name) kernel_##name##_amx_emulated
#else
#define PATH_AMX(name) kernel_##name##_amx
#endif

enum {
    ROWS = 32,                /* rows of a block: two A tiles */
    COLUMNS = 32,             /* columns of a panel: two B tiles */
    TILE_BYTES = 1024,        /* 16 rows of 64 bytes */
    STEP_BF16 = 32,           /* k values per BF16 tile row */
    STEP_I8 = 64,             /* k values per I8 tile row */
    DEPTH_BF16 = 1024,        /* k values per depth block: a_block is 64 KiB */
    DEPTH_I8 = 2048,          /* the same bytes of u8 */
    BLOCK_COLUMNS = 512,      /* columns per column block at most: partial is 64 KiB */
    BLOCK_BYTES = 1024 * 1024 /* packed weights per column block at most: they stay in L2 (2 MiB) */
};

/* ---- Tiles ----------------------------------------------------------------------------------------- */

static pthread_once_t release_once = PTHREAD_ONCE_INIT;
static pthread_key_t release_key;
static bool release_keyed;
static _Thread_local bool tiles_configured;

/* The key's destructor, run by each thread that configured its tiles as it ends. */
static void tiles_release(void *unused) {
    (void)unused;
    _tile_release();
}

static void release_key_create(void) {
    release_keyed = pthread_key_create(&release_key, tiles_release) == 0;
}

/* Loads the configuration on this thread's first GEMM (a thread whose key could not be set keeps its
 * tiles until it ends, which the kernel then frees). */
static void tiles_configure(void) {
    if (tiles_configured) return;
    pthread_once(&release_once, release_key_create);
    _tile_loadconfig(&amx_tile_config);
    if (release_keyed) (void)pthread_setspecific(release_key, (void *)(uintptr_t)&amx_tile_config);
    tiles_configured = true;
}

/* A compiler barrier around the tile loads and stores: gcc 12's `_tile_loadd` and `_tile_stored` are asm
 * statements given only the address, with no memory operand or clobber, so that without it the compiler
 * may keep a_block's stores from before a tile load, or partial's loads from before a tile store, where
 * it likes. */
static inline void tiles_memory_barrier(void) {
    __asm__ volatile("" ::: "memory");
}

/* ---- Packing --------------------------------------------------------------------------------------- */

static size_t steps_of(size_t k, size_t step) {
    return (k + step - 1) / step;
}

/* The panel holding `column`, from the step of k0: [steps][2 tiles] of TILE_BYTES. */
static void const *panel_at(void const *packed, size_t k, size_t step, size_t column, size_t k0) {
    size_t steps = steps_of(k, step);
    return (char const *)packed + ((column / COLUMNS) * steps + k0 / step) * 2 * TILE_BYTES;
}

size_t PATH_AMX(gemm_packed_size)(size_t n, size_t k) {
    return gemm_panels_of(n, COLUMNS) * steps_of(k, STEP_BF16) * 2 * TILE_BYTES;
}

void PATH_AMX(gemm_pack)(void *packed, uint16_t const *w, size_t n, size_t k) {
    uint32_t *out = packed;
    for (size_t panel = 0; panel < gemm_panels_of(n, COLUMNS); ++panel)
        for (size_t pair0 = 0; pair0 < steps_of(k, STEP_BF16) * 16; pair0 += 16)
            for (size_t c = panel * COLUMNS; c < (panel + 1) * COLUMNS; c += 16)
                for (size_t pair = pair0; pair < pair0 + 16; ++pair)
                    for (size_t column = c; column < c + 16; ++column, ++out) {
                        size_t even = 2 * pair;
                        uint32_t low = column < n && even < k ? w[column * k + even] : 0;
                        uint32_t high = column < n && even + 1 < k ? w[column * k + even + 1] : 0;
                        *out = low | high << 16;
                    }
}

/* The I8 packing's sizes for gemm_driver.h's helpers: its panels take as many bytes as panels of 32 columns
 * over k rounded up to groups of STEP_I8, so that the scales and sums sit where gemm_i8_columns_of reads. */
static gemm_path_t const i8_path = {
    .rows = GEMM_ROWS_MAX, .columns = COLUMNS, .depth = DEPTH_I8, .group = STEP_I8};

size_t PATH_AMX(gemm_i8_packed_size)(size_t n, size_t k) {
    return gemm_i8_packed_size(&i8_path, n, k);
}

void PATH_AMX(gemm_i8_pack)(void *packed, int8_t const *w, float const *scales, size_t n, size_t k) {
    size_t panels = gemm_panels_of(n, COLUMNS);
    int8_t *out = packed;
    for (size_t panel = 0; panel < panels; ++panel)
        for (size_t quad0 = 0; quad0 < steps_of(k, STEP_I8) * 16; quad0 += 16)
            for (size_t c = panel * COLUMNS; c < (panel + 1) * COLUMNS; c += 16)
                for (size_t quad = quad0; quad < quad0 + 16; ++quad)
                    for (size_t column = c; column < c + 16; ++column)
                        for (size_t i = 4 * quad; i < 4 * quad + 4; ++i)
                            *out++ = column < n && i < k ? w[column * k + i] : 0;
    gemm_i8_columns_fill(&i8_path, packed, w, scales, n, k);
}

/* ---- Activations ----------------------------------------------------------------------------------- */

/* Tile rows to fill: one A tile for up to 16 rows, two above. */
static size_t rows_used(size_t rows) {
    return rows > 16 ? ROWS : 16;
}

/* a_block [steps][ROWS][32] BF16 = x[row, row + rows)[k0, k0 + depth), zero past rows and past depth. */
static void load_rows_bf16(uint16_t *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                           size_t depth) {
    for (size_t i = 0; i < depth; i += STEP_BF16) {
        size_t left = depth - i;
        __mmask32 mask = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
        for (size_t r = 0; r < rows_used(rows); ++r) {
            __m512i pairs = _mm512_setzero_si512();
            if (r < rows && g->x_bf16) {
                pairs = _mm512_maskz_loadu_epi16(mask, g->x_bf16 + (row + r) * g->x_stride + k0 + i);
            } else if (r < rows) {
                float const *from = g->x + (row + r) * g->x_stride + k0 + i;
                __m512 low = _mm512_maskz_loadu_ps((__mmask16)mask, from);
                __m512 high = _mm512_maskz_loadu_ps((__mmask16)(mask >> 16), from + 16);
                pairs = (__m512i)_mm512_cvtne2ps_pbh(high, low);
            }
            _mm512_store_si512(a_block + (i / STEP_BF16 * ROWS + r) * STEP_BF16, pairs);
        }
    }
}

/* a_block [steps][ROWS][64] u8 = x_u8[row, row + rows)[k0, k0 + depth), zero past rows and past depth. */
static void load_rows_u8(uint8_t *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                         size_t depth) {
    for (size_t i = 0; i < depth; i += STEP_I8) {
        size_t left = depth - i;
        __mmask64 mask = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        for (size_t r = 0; r < rows_used(rows); ++r) {
            __m512i values = r < rows
                                 ? _mm512_maskz_loadu_epi8(mask, g->x_u8 + (row + r) * g->x_stride + k0 + i)
                                 : _mm512_setzero_si512();
            _mm512_store_si512(a_block + (i / STEP_I8 * ROWS + r) * STEP_I8, values);
        }
    }
}

/* ---- Blocks ---------------------------------------------------------------------------------------- */

/* C of a 32 x 32 block (`two`: rows 16-31 too) = c (zero when `first`) + a_block [steps] . panel [steps],
 * stored back to c [32][32] of 4-byte values, `bf16` choosing the multiply. */
static inline __attribute__((always_inline)) void block_multiply(bool bf16, bool two, void const *a_block,
                                                                 void const *panel, size_t steps, void *c,
                                                                 bool first) {
    char *out = c;
    char const *a = a_block, *b = panel;
    size_t const stride = COLUMNS * 4;
    tiles_memory_barrier(); /* a_block and c written */
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, out, stride);
        _tile_loadd(1, out + 64, stride);
        _tile_loadd(2, out + 16 * stride, stride);
        _tile_loadd(3, out + 16 * stride + 64, stride);
    }
    for (size_t s = 0; s < steps; ++s, a += 2 * TILE_BYTES, b += 2 * TILE_BYTES) {
        _tile_loadd(4, a, 64);
        _tile_loadd(6, b, 64);
        _tile_loadd(7, b + TILE_BYTES, 64);
        if (bf16) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        } else {
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
        }
        if (!two) continue;
        _tile_loadd(5, a + TILE_BYTES, 64);
        if (bf16) {
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        } else {
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
    }
    _tile_stored(0, out, stride);
    _tile_stored(1, out + 64, stride);
    if (two) {
        _tile_stored(2, out + 16 * stride, stride);
        _tile_stored(3, out + 16 * stride + 64, stride);
    }
    tiles_memory_barrier(); /* c written */
}

/* y = residual + epilogue(c + bias) for `count` rows of a block's c [32][32] F32 from r0, at (row, column);
 * always inlined with a constant `count` so that the epilogue's rows unroll. */
static inline __attribute__((always_inline)) void
rows_finish_bf16(size_t count, float const *c, size_t r0, kernel_gemm_t const *g, size_t row, size_t column) {
    vfloat sum[8][2];
    for (size_t r = 0; r < count; ++r) {
        sum[r][0] = vf_load(c + (r0 + r) * COLUMNS);
        sum[r][1] = vf_load(c + (r0 + r) * COLUMNS + 16);
    }
    gemm_epilogue(count, sum, g, row + r0, column);
}

/* The same from a block's int32 sums of x_u8 w, through the zero points and scales. */
static inline __attribute__((always_inline)) void
rows_finish_i8(size_t count, int32_t const *c, size_t r0, kernel_gemm_t const *g, size_t row, size_t column) {
    vint acc[8][2];
    for (size_t r = 0; r < count; ++r) {
        acc[r][0] = vi_load(c + (r0 + r) * COLUMNS);
        acc[r][1] = vi_load(c + (r0 + r) * COLUMNS + 16);
    }
    gemm_epilogue_i8(&i8_path, count, acc, g, row + r0, column);
}

/* The epilogue of a block's `rows` rows: 8 at a time, then the rest one by one (two compiled row counts). */
static void block_finish(bool bf16, void const *c, size_t rows, kernel_gemm_t const *g, size_t row,
                         size_t column) {
    size_t r0 = 0;
    for (; r0 + 8 <= rows; r0 += 8)
        if (bf16)
            rows_finish_bf16(8, c, r0, g, row, column);
        else
            rows_finish_i8(8, c, r0, g, row, column);
    for (; r0 < rows; ++r0)
        if (bf16)
            rows_finish_bf16(1, c, r0, g, row, column);
        else
            rows_finish_i8(1, c, r0, g, row, column);
}

/* ---- Driver ---------------------------------------------------------------------------------------- */

/* Output columns [n_begin, n_end) of g: column blocks of equal width (whole panels, at most BLOCK_BYTES of
 * weights), in each the blocks of 32 rows, in each the depth blocks, in each the panels. */
static inline __attribute__((always_inline)) void drive(bool bf16, kernel_gemm_t const *g, size_t n_begin,
                                                        size_t n_end, void *a_block, void *partial) {
    if (n_begin >= n_end) return;
    tiles_configure();
    size_t step = bf16 ? STEP_BF16 : STEP_I8, depth_max = bf16 ? DEPTH_BF16 : DEPTH_I8;
    size_t panel_bytes = steps_of(g->k, step) * 2 * TILE_BYTES;
    size_t widest = panel_bytes ? BLOCK_BYTES / panel_bytes * COLUMNS : BLOCK_COLUMNS;
    widest = widest < COLUMNS ? COLUMNS : widest > BLOCK_COLUMNS ? BLOCK_COLUMNS : widest;
    size_t blocks = (n_end - n_begin + widest - 1) / widest;
    size_t block = ((n_end - n_begin + COLUMNS - 1) / COLUMNS + blocks - 1) / blocks * COLUMNS;
    for (size_t n0 = n_begin; n0 < n_end; n0 += block) {
        size_t n1 = n_end - n0 < block ? n_end : n0 + block;
        for (size_t row = 0; row < g->m; row += ROWS) {
            size_t rows = g->m - row < ROWS ? g->m - row : ROWS, k0 = 0;
            do { /* at least once, so that k = 0 still writes residual + epilogue(bias) */
                size_t depth = g->k - k0 < depth_max ? g->k - k0 : depth_max;
                bool first = k0 == 0, last = k0 + depth == g->k;
                if (bf16)
                    load_rows_bf16(a_block, g, row, rows, k0, depth);
                else
                    load_rows_u8(a_block, g, row, rows, k0, depth);
                for (size_t column = n0; column < n1; column += COLUMNS) {
                    void *c = (char *)partial + (column - n0) / COLUMNS * ROWS * COLUMNS * 4;
                    void const *panel = panel_at(g->w, g->k, step, column, k0);
                    block_multiply(bf16, rows > 16, a_block, panel, steps_of(depth, step), c, first);
                    if (last) block_finish(bf16, c, rows, g, row, column);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}

void PATH_AMX(gemm)(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) uint16_t a_block[ROWS * DEPTH_BF16];
    _Alignas(64) float partial[BLOCK_COLUMNS * ROWS];
    drive(true, g, n_begin, n_end, a_block, partial);
}

void PATH_AMX(gemm_i8)(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) uint8_t a_block[ROWS * DEPTH_I8];
    _Alignas(64) int32_t partial[BLOCK_COLUMNS * ROWS];
    drive(false, g, n_begin, n_end, a_block, partial);
}
