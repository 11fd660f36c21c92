/* An LD_PRELOAD allocator for tests/core/test_alloc_fail.c: glibc's own allocator behind every malloc,
 * calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc and free of the
 * process (glibc lets a preloaded object replace them, and routes its own internal calls through them),
 * counting the allocations and failing one of them on request.
 *
 * Armed with n > 0, the n-th allocation counted from then on answers NULL (ENOMEM) and every other one
 * succeeds; armed with 0, allocations are only counted. Not counted, so never failed: allocations whose
 * immediate caller is in libjansson or libhwloc, whose own handling of a failed allocation is outside
 * the engine's control (jansson 2.14's lexer drops a byte when growing its token buffer fails, and can
 * then overflow its heap; hwloc 2.9 dereferences NULL inside hwloc_topology_load). The count of live
 * blocks (allocated and not yet freed, whatever the caller) tells a leak.
 *
 * The functions below the allocator are the driver's controls, looked up with dlsym; they tell the call
 * stack of the failed allocation too. With ALLOC_FAIL_BACKTRACE in the environment, each injected failure
 * prints that stack on stderr. */
#include <errno.h>
#include <execinfo.h>
#include <link.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* glibc's allocator under its exported internal names. */
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void *pointer);

#define EXPORT __attribute__((visibility("default")))

/* The controls, below. */
EXPORT void alloc_fail_arm(size_t n);
EXPORT size_t alloc_fail_counted(void);
EXPORT bool alloc_fail_injected(uintptr_t *caller);
EXPORT int alloc_fail_injected_stack(void *const **frames);
EXPORT long alloc_fail_live(void);

static atomic_size_t armed_at; /* the allocation that fails; 0: none */
static atomic_size_t counted;  /* allocations counted since arming */
static atomic_bool injected;   /* whether the armed allocation was reached */
static atomic_uintptr_t injected_caller;
static atomic_long live; /* blocks allocated and not freed */

/* The text of the libraries not counted: [begin, end) each, found at the first arming. */
#define EXCLUDED_MAX 8
static uintptr_t excluded_begin[EXCLUDED_MAX], excluded_end[EXCLUDED_MAX];
static atomic_size_t excluded_count;

static int exclude_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    char const *name = info->dlpi_name;
    if (!name || (!strstr(name, "libjansson.so") && !strstr(name, "libhwloc.so"))) return 0;
    size_t const count = atomic_load_explicit(&excluded_count, memory_order_relaxed);
    for (int i = 0; i < info->dlpi_phnum && count < EXCLUDED_MAX; ++i) {
        ElfW(Phdr) const *segment = &info->dlpi_phdr[i];
        if (segment->p_type != PT_LOAD || !(segment->p_flags & PF_X)) continue;
        size_t const slot = atomic_load_explicit(&excluded_count, memory_order_relaxed);
        if (slot >= EXCLUDED_MAX) break;
        excluded_begin[slot] = info->dlpi_addr + segment->p_vaddr;
        excluded_end[slot] = excluded_begin[slot] + segment->p_memsz;
        atomic_store_explicit(&excluded_count, slot + 1, memory_order_release);
    }
    return 0;
}

static bool excluded(uintptr_t caller) {
    size_t const count = atomic_load_explicit(&excluded_count, memory_order_acquire);
    for (size_t i = 0; i < count; ++i)
        if (caller >= excluded_begin[i] && caller < excluded_end[i]) return true;
    return false;
}

/* Whether this allocation, made from `caller`, is the one to fail. */
static bool tracing; /* ALLOC_FAIL_BACKTRACE set: each injected failure prints its stack on stderr */
static void *injected_frames[32];
static int injected_depth;

static bool fails(uintptr_t caller) {
    if (excluded(caller)) return false;
    size_t const n = atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed) + 1;
    if (n != atomic_load_explicit(&armed_at, memory_order_relaxed)) return false;
    injected_depth = backtrace(injected_frames, 32);
    if (tracing) backtrace_symbols_fd(injected_frames, injected_depth, 2);
    atomic_store_explicit(&injected_caller, caller, memory_order_relaxed);
    atomic_store_explicit(&injected, true, memory_order_release);
    errno = ENOMEM;
    return true;
}

static void *made(void *pointer) {
    if (pointer) atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return pointer;
}

#define CALLER ((uintptr_t)__builtin_return_address(0))

EXPORT void *malloc(size_t size) {
    return fails(CALLER) ? NULL : made(__libc_malloc(size));
}

EXPORT void *calloc(size_t count, size_t size) {
    return fails(CALLER) ? NULL : made(__libc_calloc(count, size));
}

static void *resize(void *pointer, size_t size, uintptr_t caller) {
    if (!pointer) return fails(caller) ? NULL : made(__libc_realloc(NULL, size));
    if (size == 0) { /* glibc frees the block and answers NULL */
        atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
        return __libc_realloc(pointer, 0);
    }
    return fails(caller) ? NULL : __libc_realloc(pointer, size);
}

EXPORT void *realloc(void *pointer, size_t size) {
    return resize(pointer, size, CALLER);
}

EXPORT void *reallocarray(void *pointer, size_t count, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return resize(pointer, bytes, CALLER);
}

static void *aligned(size_t alignment, size_t size, uintptr_t caller) {
    return fails(caller) ? NULL : made(__libc_memalign(alignment, size));
}

EXPORT int posix_memalign(void **pointer, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1))) return EINVAL;
    void *block = aligned(alignment, size, CALLER);
    if (!block) return ENOMEM;
    *pointer = block;
    return 0;
}

EXPORT void *aligned_alloc(size_t alignment, size_t size) {
    return aligned(alignment, size, CALLER);
}

EXPORT void *memalign(size_t alignment, size_t size) {
    return aligned(alignment, size, CALLER);
}

EXPORT void *valloc(size_t size) {
    return aligned(4096, size, CALLER);
}

EXPORT void *pvalloc(size_t size) {
    return aligned(4096, (size + 4095) & ~(size_t)4095, CALLER);
}

EXPORT void free(void *pointer) {
    if (!pointer) return;
    atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
    __libc_free(pointer);
}

/* ---- The driver's controls ------------------------------------------------------------------------ */

/* Fails the n-th allocation counted from now (0: none), and starts the count again. */
EXPORT void alloc_fail_arm(size_t n) {
    if (atomic_load_explicit(&excluded_count, memory_order_acquire) == 0) {
        dl_iterate_phdr(exclude_object, NULL);
        tracing = getenv("ALLOC_FAIL_BACKTRACE") != NULL;
        void *frame;
        backtrace(&frame, 1); /* loads the unwinder now, not inside an allocation */
    }
    atomic_store_explicit(&injected, false, memory_order_relaxed);
    atomic_store_explicit(&counted, 0, memory_order_relaxed);
    atomic_store_explicit(&armed_at, n, memory_order_release);
}

/* Allocations counted since the last arming. */
EXPORT size_t alloc_fail_counted(void) {
    return atomic_load_explicit(&counted, memory_order_relaxed);
}

/* Whether the armed allocation failed; if so, *caller is the address it was called from. */
EXPORT bool alloc_fail_injected(uintptr_t *caller) {
    bool const was = atomic_load_explicit(&injected, memory_order_acquire);
    if (was && caller) *caller = atomic_load_explicit(&injected_caller, memory_order_relaxed);
    return was;
}

/* The call stack of the allocation that failed, innermost first: how many frames, in *frames. */
EXPORT int alloc_fail_injected_stack(void *const **frames) {
    *frames = injected_frames;
    return atomic_load_explicit(&injected, memory_order_acquire) ? injected_depth : 0;
}

/* Blocks allocated and not yet freed, over the whole process. */
EXPORT long alloc_fail_live(void) {
    return atomic_load_explicit(&live, memory_order_relaxed);
}
