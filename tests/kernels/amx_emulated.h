/* The AMX tile instructions kernels/gemm_amx.c uses, emulated in C over a register file of the calling
 * thread, for the build of that file with UFORM_AMX_EMULATED (tests/kernels/test_gemm_amx.c): included
 * after <immintrin.h>, it replaces the intrinsics by name, so the kernel's source is the one that ships.
 * amx_emulated.c follows the instructions (Intel SDM, "LDTILECFG", "TDPBF16PS", "TDPBUSD"):
 *   - ldtilecfg: palette 1 (palette 0 releases), 16 rows and 64 bytes at most per tile, reserved bytes 0;
 *   - tileloadd / tilestored: each configured row, colsb bytes at base + row * stride; rows past the
 *     configuration read as zero;
 *   - tdpbf16ps: for each (m, n), two F32 chains of fused multiply-adds from 0 over the step's k pairs, one
 *     over the even k and one over the odd k, then c += even + odd; BF16 inputs with a zero exponent read as
 *     zero and results below FLT_MIN are flushed to zero: the model that reproduced the instruction bit for
 *     bit on a Sapphire Rapids class Xeon (docs/DESIGN.md, the amx path), where the SDM's sequential
 *     pseudo-code (c += a0 b0, then c += a1 b1) does not;
 *   - tdpbusd: for each (m, n), c += the four u8 x s8 products of each group over the step, in int32 with
 *     wrap-around.
 * A use the hardware would fault on (a tile or a shape not configured, a configuration out of bounds, a
 * multiply whose shapes disagree) is counted, not executed: amx_emulated_counts() answers how many. */
#pragma once

#include <stddef.h>
#include <stdint.h>

void amx_emulated_loadconfig(void const *config);
void amx_emulated_release(void);
void amx_emulated_loadd(int tile, void const *base, size_t stride);
void amx_emulated_stored(int tile, void *base, size_t stride);
void amx_emulated_zero(int tile);
void amx_emulated_dpbf16ps(int c, int a, int b);
void amx_emulated_dpbusd(int c, int a, int b);

/* What the emulation counted over every thread since the process started. */
typedef struct amx_emulated_counts {
    size_t configs;  /* ldtilecfg of palette 1 */
    size_t releases; /* tilerelease */
    size_t faults;   /* uses the hardware would fault on */
} amx_emulated_counts_t;

amx_emulated_counts_t amx_emulated_counts(void);

#undef _tile_loadconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_dpbusd
#define _tile_loadconfig(config)         amx_emulated_loadconfig(config)
#define _tile_release()                  amx_emulated_release()
#define _tile_loadd(tile, base, stride)  amx_emulated_loadd(tile, base, stride)
#define _tile_stored(tile, base, stride) amx_emulated_stored(tile, base, stride)
#define _tile_zero(tile)                 amx_emulated_zero(tile)
#define _tile_dpbf16ps(c, a, b)          amx_emulated_dpbf16ps(c, a, b)
#define _tile_dpbusd(c, a, b)            amx_emulated_dpbusd(c, a, b)
