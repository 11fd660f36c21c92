/* Futex words (futex.h): Linux's private futexes, macOS's os_sync wait on address, or the table of
 * futex_table.c. UFORM_LINUX (meson.build) is 0 in the POSIX-only build, which compiles no Linux call. */
#include "futex.h"

#if UFORM_LINUX

#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

#elif defined(__APPLE__) && !UFORM_POSIX_ONLY

/* macOS 14.4 added the wait on address; older systems take the table. A failed wait (EINTR, EFAULT)
 * is a spurious return, and a wake with no waiter (ENOENT) is not a fault. */
#include <os/os_sync_wait_on_address.h>

void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    if (__builtin_available(macOS 14.4, *))
        (void)os_sync_wait_on_address((void *)word, expected, sizeof *word, OS_SYNC_WAIT_ON_ADDRESS_NONE);
    else
        futex_table_wait(word, expected);
}

void futex_wake_all(_Atomic uint32_t *word) {
    if (__builtin_available(macOS 14.4, *))
        (void)os_sync_wake_by_address_all((void *)word, sizeof *word, OS_SYNC_WAKE_BY_ADDRESS_NONE);
    else
        futex_table_wake_all(word);
}

#else

void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    futex_table_wait(word, expected);
}

void futex_wake_all(_Atomic uint32_t *word) {
    futex_table_wake_all(word);
}

#endif
