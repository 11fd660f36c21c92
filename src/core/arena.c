/* Arenas: bump allocation over a list of blocks placed where the executor computes. A call rewinds its
 * arena and bumps the generation; growth adds a block and never moves what was handed out; the next
 * rewind replaces several blocks by one of their total size, so a steady loop allocates once. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "executor.h"

struct arena_block {
    arena_block_t *next;
    size_t size; /* usable bytes */
    size_t used;
    unsigned char *base; /* `bytes` on the host, or device memory */
    alignas(64) unsigned char bytes[];
};

#define ARENA_MINIMUM_BLOCK (64u << 10)

static arena_block_t *arena_block_new(uform_arena_t *arena, arena_pool_t const *pool, size_t size) {
    if (size > SIZE_MAX - sizeof(arena_block_t)) return NULL;
    arena_block_t *block;
    if (pool->device) {
        if (!(block = calloc(1, sizeof *block))) return NULL;
        if (!(block->base = executor_device_allocate(arena->executor, size))) {
            free(block);
            return NULL;
        }
        block->size = size;
        return block;
    }
    block = executor_allocate(pool->device ? NULL : arena->executor, sizeof(arena_block_t) + size);
    if (!block) return NULL;
    block->next = NULL;
    block->size = size;
    block->used = 0;
    block->base = block->bytes;
    return block;
}

static void arena_blocks_free(uform_arena_t *arena, arena_pool_t const *pool, arena_block_t *block) {
    while (block) {
        arena_block_t *next = block->next;
        if (pool->device) {
            executor_device_deallocate(arena->executor, block->base);
            free(block);
            block = next;
            continue;
        }
        executor_deallocate(pool == &arena->host && arena->outputs.device ? NULL : arena->executor, block,
                            sizeof(arena_block_t) + block->size);
        block = next;
    }
}

static uform_status_t arena_new(uform_executor_t *executor, uform_arena_t **out, char const *entry) {
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "arena is NULL");
    *out = NULL;
    uform_arena_t *arena = calloc(1, sizeof *arena);
    if (!arena) return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the arena");
    arena->executor = executor;
    if (executor) executor_retain(executor);
    atomic_init(&arena->generation, 1);
    atomic_init(&arena->busy, false);
    arena->outputs.device = executor && executor_on_device(executor);
    *out = arena;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_arena_create(uform_executor_t *executor, uform_arena_t **arena) {
    static char const entry[] = "uform_arena_create";
    if (!executor) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    return arena_new(executor, arena, entry);
}

UFORM_EXPORT uform_status_t uform_arena_create_host(uform_arena_t **arena) {
    return arena_new(NULL, arena, "uform_arena_create_host");
}

UFORM_EXPORT void uform_arena_free(uform_arena_t *arena) {
    if (!arena) return;
    /* A pending call that writes here finishes first; arenas are rarely freed, so a yield loop does. */
    bool expected = false;
    while (!atomic_compare_exchange_weak(&arena->busy, &expected, true)) {
        expected = false;
        sched_yield();
    }
    arena_blocks_free(arena, &arena->outputs, arena->outputs.blocks);
    arena_blocks_free(arena, &arena->host, arena->host.blocks);
    uform_executor_t *executor = arena->executor;
    free(arena);
    if (executor) executor_release(executor);
}

UFORM_EXPORT size_t uform_arena_capacity(uform_arena_t const *arena) {
    return arena ? arena->outputs.capacity : 0;
}

UFORM_EXPORT uint64_t uform_arena_generation(uform_arena_t const *arena) {
    return arena ? atomic_load(&((uform_arena_t *)arena)->generation) : 0;
}

/* Makes the pool one block of at least `size` bytes, keeping the current one when it is enough. */
static uform_status_t arena_coalesce(uform_arena_t *arena, arena_pool_t *pool, size_t size) {
    if (pool->blocks && !pool->blocks->next && pool->blocks->size >= size) return UFORM_OK;
    if (size < ARENA_MINIMUM_BLOCK) size = ARENA_MINIMUM_BLOCK;
    arena_block_t *block = arena_block_new(arena, pool, size);
    if (!block) return UFORM_OUT_OF_MEMORY;
    arena_blocks_free(arena, pool, pool->blocks);
    pool->blocks = block;
    pool->capacity = size;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_arena_reserve(uform_arena_t *arena, size_t bytes) {
    static char const entry[] = "uform_arena_reserve";
    if (!arena) return failed(UFORM_INVALID_ARGUMENT, entry, "arena is NULL");
    bool expected = false;
    if (!atomic_compare_exchange_strong(&arena->busy, &expected, true))
        return failed(UFORM_CONTENDED, entry, "a call holds the arena");
    uform_status_t status =
        arena->outputs.capacity >= bytes ? UFORM_OK : arena_coalesce(arena, &arena->outputs, bytes);
    atomic_store(&arena->busy, false);
    return status == UFORM_OK ? status : failed(status, entry, "cannot allocate the arena's memory");
}

uform_status_t arena_begin(uform_arena_t *arena) {
    bool expected = false;
    if (!atomic_compare_exchange_strong(&arena->busy, &expected, true)) return UFORM_CONTENDED;
    atomic_fetch_add_explicit(&arena->generation, 1, memory_order_release);
    /* The last call outgrew one block: replace them by one of the total, or keep them on failure. */
    arena_pool_t *pools[] = {&arena->outputs, &arena->host};
    for (size_t i = 0; i < 2; ++i) {
        arena_pool_t *pool = pools[i];
        if (pool->blocks && pool->blocks->next) arena_coalesce(arena, pool, pool->used_total);
        for (arena_block_t *block = pool->blocks; block; block = block->next)
            block->used = 0;
        pool->used_total = 0;
    }
    return UFORM_OK;
}

void arena_end(uform_arena_t *arena) {
    atomic_store_explicit(&arena->busy, false, memory_order_release);
}

static void *pool_allocate(uform_arena_t *arena, arena_pool_t *pool, size_t bytes, size_t alignment) {
    if (alignment < 16) alignment = 16;
    if (alignment > 64 || (alignment & (alignment - 1))) return NULL;
    if (bytes > SIZE_MAX / 2) return NULL;
    /* Earlier blocks are full or too small: only the newest one is bumped. */
    arena_block_t *block = pool->blocks;
    size_t start = block ? (block->used + alignment - 1) & ~(alignment - 1) : 0;
    if (!block || start + bytes > block->size) {
        size_t size = pool->capacity > bytes ? pool->capacity : bytes;
        arena_block_t *grown =
            arena_block_new(arena, pool, size < ARENA_MINIMUM_BLOCK ? ARENA_MINIMUM_BLOCK : size);
        if (!grown) return NULL;
        grown->next = pool->blocks;
        pool->blocks = grown;
        pool->capacity += grown->size;
        block = grown;
        start = 0;
    }
    block->used = start + bytes;
    pool->used_total += bytes + alignment;
    return block->base + start;
}

void *arena_allocate(uform_arena_t *arena, size_t bytes, size_t alignment) {
    return pool_allocate(arena, &arena->outputs, bytes, alignment);
}

void *arena_allocate_host(uform_arena_t *arena, size_t bytes, size_t alignment) {
    return pool_allocate(arena, arena->outputs.device ? &arena->host : &arena->outputs, bytes, alignment);
}

uform_view_t arena_view(uform_arena_t *arena, void *data, size_t rows, size_t columns,
                        uform_scalar_t scalar) {
    return (uform_view_t){
        .data = data,
        .rows = rows,
        .columns = columns,
        .items = rows,
        .row_stride = columns * uform_scalar_size(scalar),
        .scalar = scalar,
        .device = arena->outputs.device,
        .arena = arena,
        .generation = atomic_load_explicit(&arena->generation, memory_order_acquire),
    };
}

/* ---- Views -------------------------------------------------------------------------------------- */

UFORM_EXPORT size_t uform_scalar_size(uform_scalar_t scalar) {
    switch (scalar) {
    case UFORM_F32:
        return 4;
    case UFORM_BF16:
        return 2;
    case UFORM_F16:
        return 2;
    case UFORM_I8:
        return 1;
    case UFORM_U32:
        return 4;
    }
    return 0;
}

UFORM_EXPORT uform_status_t uform_view_check(uform_view_t const *view) {
    static char const entry[] = "uform_view_check";
    if (!view || !view->arena) return failed(UFORM_INVALID_ARGUMENT, entry, "view is NULL or empty");
    if (view->generation != atomic_load_explicit(&view->arena->generation, memory_order_acquire))
        return failed(UFORM_INVALID_ARGUMENT, entry, "stale view: its arena was rewound by a later call");
    if (view->device) return failed(UFORM_DEVICE, entry, "the view is in device memory");
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_view_row(uform_view_t const *view, size_t row, void const **data) {
    static char const entry[] = "uform_view_row";
    if (!data) return failed(UFORM_INVALID_ARGUMENT, entry, "data is NULL");
    *data = NULL;
    uform_status_t status = uform_view_check(view);
    if (status != UFORM_OK) return failed(status, entry, uform_last_error().message);
    if (row >= view->rows) return failed(UFORM_INVALID_ARGUMENT, entry, "row out of range");
    *data = (unsigned char const *)view->data + row * view->row_stride;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_view_copy(uform_view_t const *view, void *data, size_t capacity,
                                            float *scales) {
    static char const entry[] = "uform_view_copy";
    if (!view || !view->arena || !data) return failed(UFORM_INVALID_ARGUMENT, entry, "view or data is NULL");
    if (view->generation != atomic_load_explicit(&view->arena->generation, memory_order_acquire))
        return failed(UFORM_INVALID_ARGUMENT, entry, "stale view: its arena was rewound by a later call");
    size_t row_bytes = view->columns * uform_scalar_size(view->scalar);
    if (view->rows && capacity / view->rows < row_bytes)
        return failed(UFORM_INVALID_ARGUMENT, entry, "capacity is smaller than the view");
    if (view->scalar == UFORM_I8 && !scales) return failed(UFORM_INVALID_ARGUMENT, entry, "scales is NULL");
    if (view->rows == 0) return UFORM_OK;
    if (!view->device) {
        for (size_t row = 0; row < view->rows; ++row)
            memcpy((unsigned char *)data + row * row_bytes,
                   (unsigned char const *)view->data + row * view->row_stride, row_bytes);
        if (view->scalar == UFORM_I8) memcpy(scales, view->scales, view->rows * sizeof(float));
        return UFORM_OK;
    }
    uform_executor_t *executor = view->arena->executor;
    if (!executor ||
        executor_device_copy_to_host(executor, data, row_bytes, view->data, view->row_stride, row_bytes,
                                     view->rows) != UFORM_OK ||
        (view->scalar == UFORM_I8 &&
         executor_device_copy_to_host(executor, scales, view->rows * sizeof(float), view->scales,
                                      view->rows * sizeof(float), view->rows * sizeof(float), 1) != UFORM_OK))
        return failed(UFORM_DEVICE, entry, "cannot copy from the device");
    return UFORM_OK;
}

uform_status_t arena_check(uform_arena_t const *arena, uform_executor_t const *executor,
                           char const **message) {
    uform_executor_t const *owner = arena->executor;
    if (executor && executor_on_device(executor) && owner != executor)
        return *message = "a VRAM executor writes into an arena made on it", UFORM_INVALID_ARGUMENT;
    if (!owner) return UFORM_OK;
    if (executor && owner != executor)
        return *message = "the arena belongs to another executor", UFORM_INVALID_ARGUMENT;
    if (!executor && executor_on_device(owner))
        return *message = "a device arena serves only its executor's calls", UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}
