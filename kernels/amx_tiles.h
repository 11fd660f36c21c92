/* The tile configuration every AMX user of the project loads (kernels/gemm_amx.c, bench/bench_gemm.c): palette
 * 1, tiles 0-7 each 16 rows of 64 bytes, as `_tile_loadconfig` reads it (64 bytes). */
#pragma once

#include <stdint.h>

typedef struct amx_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config_t;

/* Static, never a local: GCC 12 can drop the stores to a local configuration before `_tile_loadconfig`. */
static _Alignas(64) amx_tile_config_t const amx_tile_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};
