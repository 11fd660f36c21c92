/* The row counts a GEMM micro-kernel is compiled for, 1 to 14, listed once for the drivers' switches
 * (gemm_tile in gemm_driver.h, sgemm_tile in sgemm_driver.h): each applies its own case to every count,
 * and the counts past its path's rows fold away. */
#pragma once

#define TILE_ROW_COUNTS(tile_case)                                                                           \
    tile_case(1) tile_case(2) tile_case(3) tile_case(4) tile_case(5) tile_case(6) tile_case(7) tile_case(8)  \
        tile_case(9) tile_case(10) tile_case(11) tile_case(12) tile_case(13) tile_case(14)
