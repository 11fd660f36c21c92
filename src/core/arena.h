/* Arenas: where a call's outputs live, bumped newest first over blocks of one kind of memory (host, or
 * the device of a VRAM executor), rewound by the next call (arena.c). */
#pragma once

#include "common.h"

typedef struct arena_block arena_block_t;

/* Blocks of one kind of memory, bumped newest first. */
typedef struct arena_pool {
    arena_block_t *blocks; /* newest first */
    size_t capacity;       /* bytes in every block */
    size_t used_total;     /* bytes handed out since the rewind, for coalescing */
    bool device;           /* blocks of device memory (headers stay on the host) */
} arena_pool_t;

struct uform_arena {
    uform_executor_t *executor; /* NULL for host arenas */
    _Atomic uint64_t generation;
    _Atomic bool busy; /* a call writes into it */
    arena_pool_t outputs;
    arena_pool_t host; /* device arenas: what the host reads (statuses, item offsets) */
};

/* Takes the arena for one call (UFORM_CONTENDED when another call has it), rewinds it (coalescing
 * its blocks into one when the last call needed several) and bumps its generation. */
uform_status_t arena_begin(uform_arena_t *arena);
void arena_end(uform_arena_t *arena);

/* Aligned memory for this call's outputs (device memory in device arenas); never moves what was
 * handed out earlier in the call. Answers NULL when out of memory. */
void *arena_allocate(uform_arena_t *arena, size_t bytes, size_t alignment);
/* The same in host memory, whatever the arena: per-item statuses and item offsets. */
void *arena_allocate_host(uform_arena_t *arena, size_t bytes, size_t alignment);

/* A view over `rows` x `columns` of `scalar` at `data`, in the arena's current generation. */
uform_view_t arena_view(uform_arena_t *arena, void *data, size_t rows, size_t columns, uform_scalar_t scalar);

/* Arenas of an executor serve its calls and calling-thread calls; host arenas serve any host call.
 * UFORM_OK, or UFORM_INVALID_ARGUMENT with a message. */
uform_status_t arena_check(uform_arena_t const *arena, uform_executor_t const *executor,
                           char const **message);
