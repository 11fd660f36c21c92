/* The portable backend's poller on poll(2), where the system has no kqueue (Linux, the POSIX-only
 * build): each scan fills an array of pollfd with the doorbell (when asked) and every pending poll,
 * sleeps in ppoll(2) (poll(2) without Linux), and moves the polls found ready to the ready list. */
#include "loop_internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <time.h>

int loop_poller_open(loop_t *loop) {
    loop->poller_fd = -1;
    return 0;
}

void loop_poller_close(loop_t *loop) {
    free(loop->poller_entries);
    loop->poller_entries = NULL;
    loop->poller_capacity = 0;
}

/* Keeps room in the array for the doorbell, every pending poll and `op`. */
int loop_poller_reserve(loop_t *loop, loop_op_t const *op) {
    (void)op; /* poll(2) watches any events */
    if (loop->polls_count + 2 <= loop->poller_capacity) return 0;
    size_t capacity = loop->poller_capacity ? 2 * loop->poller_capacity : 8;
    struct pollfd *grown = realloc(loop->poller_entries, capacity * sizeof *grown);
    if (!grown) return -ENOMEM;
    loop->poller_entries = grown;
    loop->poller_capacity = capacity;
    return 0;
}

/* Waits in ppoll, or in poll with the timeout rounded up to whole milliseconds (so that a timer is
 * never found early and the loop never spins on a timeout of 0 before its deadline). */
static int poller_poll(struct pollfd *fds, nfds_t count, struct timespec const *timeout) {
#if UFORM_LINUX
    return ppoll(fds, count, timeout, NULL);
#else
    int milliseconds = -1;
    if (timeout) {
        uint64_t ms = (uint64_t)timeout->tv_sec * 1000u + ((uint64_t)timeout->tv_nsec + 999999u) / 1000000u;
        milliseconds = ms > INT_MAX ? INT_MAX : (int)ms;
    }
    return poll(fds, count, milliseconds);
#endif
}

/* Moves the polls whose entries (`polled`, in list order) have events to the ready list, with their
 * events as result (-EBADF for a descriptor that is not open). */
static void poller_deliver(loop_t *loop, struct pollfd const *polled) {
    for (loop_op_t **link = &loop->polls; *link; polled++) {
        loop_op_t *op = *link;
        if (!polled->revents) {
            link = &op->next;
            continue;
        }
        *link = op->next;
        loop->polls_count--;
        op->result = polled->revents & POLLNVAL ? -EBADF : (int64_t)(unsigned short)polled->revents;
        loop_ready_push(loop, op);
    }
}

int loop_poller_scan(loop_t *loop, bool doorbell, struct timespec const *timeout, bool *rang) {
    struct pollfd single;
    struct pollfd *fds = loop->polls_count ? loop->poller_entries : &single;
    nfds_t count = 0;
    *rang = false;
    if (doorbell)
        fds[count++] = (struct pollfd){.fd = loop->doorbell.read_fd, .events = POLLIN, .revents = 0};
    for (loop_op_t *op = loop->polls; op; op = op->next)
        fds[count++] = (struct pollfd){.fd = op->fd, .events = (short)op->flags, .revents = 0};
    if (count == 0) return 0;
    int ready = poller_poll(fds, count, timeout);
    if (ready < 0) return -errno;
    if (ready == 0) return 0;
    *rang = doorbell && (fds[0].revents & POLLIN);
    poller_deliver(loop, doorbell ? fds + 1 : fds);
    return 0;
}
