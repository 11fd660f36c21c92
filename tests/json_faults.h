#pragma once
/* jansson's allocator failing one allocation of a parse, for the readers' out-of-memory paths. */

#include <stddef.h>

/* From now on jansson fails its `nth` counted allocation (1: the first; 0: none) and counts from 0.
 * Its token buffer's growths (powers of two from 32 bytes) are neither failed nor counted: jansson 2.14's
 * lexer ignores such a failure, drops the byte and parses on, past the end of its copy of a string (a
 * heap overflow inside jansson, outside the engine's reach; uform_model_load_ram says so). */
void json_fail_allocation(size_t nth);

/* The allocations counted since the last json_fail_allocation. */
size_t json_allocations_counted(void);

/* jansson allocates with malloc again. */
void json_allocations_restore(void);
