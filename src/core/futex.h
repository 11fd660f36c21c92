/* Waiting on a 32-bit word: the one primitive that outcomes, executors and their teams sleep on.
 * A leaf: it knows nothing of the engine.
 *
 * futex_wait and the wakes are, by platform: Linux's private futexes; on macOS 14.4 and later
 * os_sync_wait_on_address and os_sync_wake_by_address_all; and the address-keyed table below in the
 * POSIX-only build (-Dplatform=posix), on older macOS and on any other system. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

/* Blocks while *word == expected; spurious returns are possible. A waker changes the word before it
 * wakes, so a wait that began before the change is woken and one that begins after it does not block. */
void futex_wait(_Atomic uint32_t *word, uint32_t expected);
void futex_wake_all(_Atomic uint32_t *word);

/* The wait without a kernel primitive: a fixed table of (mutex, condition variable) pairs that words
 * share by a hash of their address. The wait re-reads the word under its pair's mutex and sleeps on the
 * condition variable, which releases the mutex atomically, so a wake that follows the word's change
 * cannot be lost; every wake broadcasts, since other words may share the pair (their waiters return
 * spuriously and look again). Compiled on every platform, so that the normal build checks it too. */
void futex_table_wait(_Atomic uint32_t *word, uint32_t expected);
void futex_table_wake_all(_Atomic uint32_t *word);
