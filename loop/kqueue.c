/* The portable backend's poller on kqueue(2), where the system has it (macOS, the BSDs; on Linux through
 * libkqueue, with -Dkqueue=enabled). The doorbell's read end stays registered for the loop's life, a
 * level-triggered read filter. A pending poll is a one-shot read filter, write filter or both on its
 * descriptor; each scan registers every pending poll again (a filter not yet fired is the same one, a
 * fired one is armed anew) in the one kevent call that waits, so that polls keep poll(2)'s
 * level-triggered, one-shot semantics however many watch one descriptor.
 *
 *   entries: [ changes: 2 per pending poll + 1 | events: as many ]   (struct kevent)
 *
 * An event completes every pending poll of its descriptor that wants its filter: a read filter answers
 * the read events the poll asked (kqueue cannot tell out-of-band data: POLLPRI comes with POLLIN),
 * a write filter the write events; end of file adds POLLHUP (a read end with nothing left to read
 * answers POLLHUP alone, as poll(2) does for a pipe), and a pending socket error POLLERR. A filter that
 * cannot be registered (a descriptor not open) completes its polls with its error (-EBADF); a change
 * answered with EV_ERROR and no error is a receipt (libkqueue gives one for a filter re-armed). Filters
 * left by polls that completed or were cancelled fire once, find no poll, and are gone. */
#include "loop_internal.h"

#include <sys/types.h>

#include <sys/event.h>
#include <sys/time.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#define POLLER_READ  (POLLIN | POLLRDNORM | POLLRDBAND | POLLPRI)
#define POLLER_WRITE (POLLOUT | POLLWRNORM | POLLWRBAND)

int loop_poller_open(loop_t *loop) {
    int kq = kqueue();
    if (kq < 0) return -errno;
    /* A kqueue is not inherited by fork(2); close on exec covers the emulations where it would be. */
    struct kevent change;
    EV_SET(&change, (uintptr_t)loop->doorbell.read_fd, EVFILT_READ, EV_ADD, 0, 0, 0);
    if (fcntl(kq, F_SETFD, FD_CLOEXEC) != 0 || kevent(kq, &change, 1, NULL, 0, NULL) != 0) {
        int ret = -errno;
        (void)close(kq);
        return ret;
    }
    loop->poller_fd = kq;
    return 0;
}

void loop_poller_close(loop_t *loop) {
    /* Nothing can be done about a failed close: the descriptor is released either way. */
    if (loop->poller_fd >= 0) (void)close(loop->poller_fd);
    loop->poller_fd = -1;
    free(loop->poller_entries);
    loop->poller_entries = NULL;
    loop->poller_capacity = 0;
}

/* Changes (and as many events) for every pending poll, `op` and the doorbell's event. */
int loop_poller_reserve(loop_t *loop, loop_op_t const *op) {
    if (!(op->flags & (POLLER_READ | POLLER_WRITE))) return -EINVAL;
    size_t slots = 2 * (loop->polls_count + 1) + 1;
    if (2 * slots <= loop->poller_capacity) return 0;
    size_t capacity = 2 * slots > 2 * loop->poller_capacity ? 2 * slots : 2 * loop->poller_capacity;
    struct kevent *grown = realloc(loop->poller_entries, capacity * sizeof *grown);
    if (!grown) return -ENOMEM;
    loop->poller_entries = grown;
    loop->poller_capacity = capacity;
    return 0;
}

/* The one-shot filters of `op`, written at `changes`; answers how many (1 or 2). */
static int poller_register(struct kevent *changes, loop_op_t const *op) {
    int count = 0;
    if (op->flags & POLLER_READ)
        EV_SET(&changes[count++], (uintptr_t)op->fd, EVFILT_READ, EV_ADD | EV_ONESHOT, 0, 0, 0);
    if (op->flags & POLLER_WRITE)
        EV_SET(&changes[count++], (uintptr_t)op->fd, EVFILT_WRITE, EV_ADD | EV_ONESHOT, 0, 0, 0);
    return count;
}

/* The poll(2) events a fired filter means, before they are narrowed to what each poll asked. */
static short poller_events(struct kevent const *event) {
    bool end = event->flags & EV_EOF;
    short events = 0;
    if (event->filter == EVFILT_WRITE)
        events = POLLER_WRITE;
    else if (!end || event->data > 0)
        events = POLLER_READ;
    if (end) events |= POLLHUP;
    if (end && event->fflags != 0) events |= POLLERR; /* the socket's error, as errno */
    return events;
}

/* Completes every pending poll on the event's descriptor that wants its filter. */
static void poller_deliver(loop_t *loop, struct kevent const *event) {
    short wanted = event->filter == EVFILT_WRITE ? POLLER_WRITE : POLLER_READ;
    bool failed = event->flags & EV_ERROR;
    short events = failed ? 0 : poller_events(event);
    for (loop_op_t **link = &loop->polls; *link;) {
        loop_op_t *op = *link;
        if ((uintptr_t)op->fd != event->ident || !(op->flags & wanted)) {
            link = &op->next;
            continue;
        }
        *link = op->next;
        loop->polls_count--;
        op->result = failed ? -(int64_t)event->data : (int64_t)(events & (op->flags | POLLHUP | POLLERR));
        loop_ready_push(loop, op);
    }
}

/* The longest wait asked of kevent: systems refuse a timeout past some bound (select(2)'s 10^8 s on
 * macOS), and a loop that wakes once in three years to wait again loses nothing. */
#define POLLER_LONGEST_SECONDS 99999999

int loop_poller_scan(loop_t *loop, bool doorbell, struct timespec const *timeout, bool *rang) {
    struct timespec longest = {POLLER_LONGEST_SECONDS, 0};
    if (timeout && timeout->tv_sec > POLLER_LONGEST_SECONDS) timeout = &longest;
    struct kevent single;
    size_t slots = loop->poller_capacity / 2;
    struct kevent *changes = loop->poller_entries;
    struct kevent *events = slots ? changes + slots : &single;
    int count = 0;
    *rang = false;
    for (loop_op_t *op = loop->polls; op; op = op->next)
        count += poller_register(changes + count, op);
    if (count == 0 && !doorbell) return 0;
    int ready = kevent(loop->poller_fd, changes, count, events, slots ? (int)slots : 1, timeout);
    if (ready < 0) return -errno;
    for (int i = 0; i < ready; i++) {
        struct kevent const *event = &events[i];
        bool bell = event->ident == (uintptr_t)loop->doorbell.read_fd && event->filter == EVFILT_READ;
        if ((event->flags & EV_ERROR) && event->data == 0) continue; /* a change's receipt: it succeeded */
        if (bell && !(event->flags & EV_ERROR))
            *rang = doorbell;
        else
            poller_deliver(loop, event);
    }
    return 0;
}
