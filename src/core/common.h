/* What every file of the engine shares: the public header, the build's configuration, failure
 * recording (errors.h) and three small helpers. */
#pragma once

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uform.h"
#include "uform_config.h"
#include "errors.h"

/* The POSIX-only build (meson.build) compiles with _POSIX_C_SOURCE alone; a dependency's flags that turned
 * on GNU or BSD extensions would make its check hollow. */
#if UFORM_POSIX_ONLY && (defined(_GNU_SOURCE) || defined(_DEFAULT_SOURCE) || defined(_BSD_SOURCE))
#error "the POSIX-only build must not define _GNU_SOURCE, _DEFAULT_SOURCE or _BSD_SOURCE"
#endif

#define container_of(pointer, type, member) ((type *)((char *)(pointer)-offsetof(type, member)))

/* A pause in a spin loop, so that the sibling hyperthread and the memory system get a turn. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Bytes rounded up to a multiple of 64: cache lines, and the alignment of scratch carved in pieces. */
static inline size_t round_up_64(size_t bytes) {
    return (bytes + 63) & ~(size_t)63;
}
