/* The AMX emulation of amx_emulated.h: a register file of eight tiles per thread, its configuration, and
 * process-wide counts. Compiled with -ffp-contract=off, so that the only fused multiply-adds are fmaf's. */
#include "amx_emulated.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

enum { TILES = 8, TILE_ROWS = 16, TILE_COLSB = 64 };

typedef struct tile_file {
    bool configured;
    uint8_t rows[TILES];
    uint16_t colsb[TILES];
    uint8_t data[TILES][TILE_ROWS][TILE_COLSB];
} tile_file_t;

static _Thread_local tile_file_t file;
static atomic_size_t configs, releases, faults;

amx_emulated_counts_t amx_emulated_counts(void) {
    return (amx_emulated_counts_t){
        .configs = atomic_load(&configs), .releases = atomic_load(&releases), .faults = atomic_load(&faults)};
}

static void fault(void) {
    atomic_fetch_add(&faults, 1);
}

/* Whether `tile` may be used: configured, with rows and bytes. */
static bool usable(int tile) {
    if (tile >= 0 && tile < TILES && file.configured && file.rows[tile] && file.colsb[tile]) return true;
    fault();
    return false;
}

void amx_emulated_loadconfig(void const *config) {
    uint8_t const *bytes = config;
    memset(&file, 0, sizeof file);
    if (bytes[0] == 0) return; /* palette 0: the init state */
    bool valid = bytes[0] == 1 && bytes[1] == 0;
    for (size_t i = 2; i < 16; ++i)
        valid = valid && bytes[i] == 0;
    for (size_t i = 32; i < 48; ++i)
        valid = valid && bytes[i] == 0;
    for (size_t i = 56; i < 64; ++i)
        valid = valid && bytes[i] == 0;
    for (int t = 0; t < TILES; ++t) {
        uint16_t colsb = (uint16_t)(bytes[16 + 2 * t] | bytes[17 + 2 * t] << 8);
        uint8_t rows = bytes[48 + t];
        valid = valid && colsb <= TILE_COLSB && rows <= TILE_ROWS && (colsb == 0) == (rows == 0);
        file.colsb[t] = colsb;
        file.rows[t] = rows;
    }
    if (!valid) {
        memset(&file, 0, sizeof file);
        fault();
        return;
    }
    file.configured = true;
    atomic_fetch_add(&configs, 1);
}

void amx_emulated_release(void) {
    memset(&file, 0, sizeof file);
    atomic_fetch_add(&releases, 1);
}

void amx_emulated_loadd(int tile, void const *base, size_t stride) {
    if (!usable(tile)) return;
    memset(file.data[tile], 0, sizeof file.data[tile]);
    for (size_t r = 0; r < file.rows[tile]; ++r)
        memcpy(file.data[tile][r], (char const *)base + r * stride, file.colsb[tile]);
}

void amx_emulated_stored(int tile, void *base, size_t stride) {
    if (!usable(tile)) return;
    for (size_t r = 0; r < file.rows[tile]; ++r)
        memcpy((char *)base + r * stride, file.data[tile][r], file.colsb[tile]);
}

void amx_emulated_zero(int tile) {
    if (usable(tile)) memset(file.data[tile], 0, sizeof file.data[tile]);
}

/* Whether c += a . b fits the configuration: c is a.rows x b's columns, a's 4-byte groups are b's rows. */
static bool shapes_agree(int c, int a, int b) {
    if (!usable(c) || !usable(a) || !usable(b)) return false;
    if (file.rows[c] == file.rows[a] && file.colsb[c] == file.colsb[b] && file.colsb[a] / 4 == file.rows[b] &&
        file.colsb[a] % 4 == 0)
        return true;
    fault();
    return false;
}

static float bits_float(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static uint32_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* A BF16 input, denormals read as zero. */
static float bf16_in(uint8_t const *at) {
    uint32_t bits = (uint32_t)(at[0] | at[1] << 8) << 16;
    if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
    return bits_float(bits);
}

/* A result, flushed to zero below FLT_MIN. */
static float flushed(float value) {
    uint32_t bits = float_bits(value);
    return (bits & 0x7f800000u) == 0 ? bits_float(bits & 0x80000000u) : value;
}

static float f32_at(uint8_t const *at) {
    uint32_t bits;
    memcpy(&bits, at, sizeof bits);
    return bits_float(bits);
}

void amx_emulated_dpbf16ps(int c, int a, int b) {
    if (!shapes_agree(c, a, b)) return;
    for (size_t m = 0; m < file.rows[c]; ++m)
        for (size_t n = 0; n < file.colsb[c] / 4u; ++n) {
            float even = 0.0f, odd = 0.0f;
            for (size_t k = 0; k < file.rows[b]; ++k) {
                uint8_t const *x = &file.data[a][m][4 * k], *w = &file.data[b][k][4 * n];
                even = flushed(fmaf(bf16_in(x), bf16_in(w), even));
                odd = flushed(fmaf(bf16_in(x + 2), bf16_in(w + 2), odd));
            }
            float sum = flushed(f32_at(file.data[c][m] + 4 * n) + flushed(even + odd));
            memcpy(file.data[c][m] + 4 * n, &sum, sizeof sum);
        }
}

void amx_emulated_dpbusd(int c, int a, int b) {
    if (!shapes_agree(c, a, b)) return;
    for (size_t m = 0; m < file.rows[c]; ++m)
        for (size_t n = 0; n < file.colsb[c] / 4u; ++n) {
            uint32_t sum;
            memcpy(&sum, file.data[c][m] + 4 * n, sizeof sum);
            for (size_t k = 0; k < file.rows[b]; ++k)
                for (size_t i = 0; i < 4; ++i) {
                    int32_t product =
                        (int32_t)file.data[a][m][4 * k + i] * (int8_t)file.data[b][k][4 * n + i];
                    sum += (uint32_t)product;
                }
            memcpy(file.data[c][m] + 4 * n, &sum, sizeof sum);
        }
}
