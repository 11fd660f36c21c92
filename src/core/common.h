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
