/* Waiting on a 32-bit word: the one primitive that outcomes, executors and their teams sleep on.
 * A leaf: it knows nothing of the engine. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

/* Blocks while *word == expected (private futex); spurious returns are possible. */
void futex_wait(_Atomic uint32_t *word, uint32_t expected);
void futex_wake_all(_Atomic uint32_t *word);
void futex_wake_one(_Atomic uint32_t *word);
