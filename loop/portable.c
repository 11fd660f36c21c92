/* The portable backend: operations run as plain syscalls when submitted and are delivered by the
 * next loop_run; timers wait in a list sorted by deadline, polls in a list of their own, and the loop
 * sleeps in ppoll(2) (poll(2) without Linux) on the doorbell and the polled descriptors until the
 * nearest timer. */
#include "loop_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int64_t portable_open(loop_op_t const *op) {
    for (;;) {
        int fd = openat(AT_FDCWD, op->path, op->flags, LOOP_CREATE_MODE);
        if (fd >= 0) return fd;
        if (errno != EINTR) return -errno; /* a FIFO's open can be interrupted */
    }
}

#if UFORM_LINUX
static int64_t portable_statx(loop_op_t const *op) {
    return statx(op->fd, "", AT_EMPTY_PATH, LOOP_STATX_MASK, op->statx) == 0 ? 0 : -errno;
}
#else
static int64_t portable_statx(loop_op_t const *op) {
    struct stat status;
    if (fstat(op->fd, &status) != 0) return -errno;
    *op->statx = (loop_stat_t){.stx_mode = (uint32_t)status.st_mode, .stx_size = (uint64_t)status.st_size};
    return 0;
}
#endif

/* Waits in ppoll, or in poll with the timeout rounded up to whole milliseconds (so that a timer is
 * never found early and the loop never spins on a timeout of 0 before its deadline). */
static int portable_poll(struct pollfd *fds, nfds_t count, struct timespec const *timeout) {
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

/* Reads until `length` bytes or end of file, like the ring's continued short reads. Like io_uring,
 * an offset of all ones reads at the file position, and a file without positions (a pipe, where
 * pread says ESPIPE) is read as a stream. */
static int64_t portable_read(loop_op_t *op) {
    bool stream = op->offset == UINT64_MAX;
    while (op->done < op->length) {
        size_t rest = op->length - op->done;
        if (rest > SSIZE_MAX) rest = SSIZE_MAX;
        char *into = (char *)op->buffer + op->done;
        ssize_t got =
            stream ? read(op->fd, into, rest) : pread(op->fd, into, rest, (off_t)(op->offset + op->done));
        if (got < 0) {
            if (errno == EINTR) continue;
            if (errno == ESPIPE && !stream) {
                stream = true;
                continue;
            }
            return -errno;
        }
        if (got == 0) break;
        op->done += (size_t)got;
    }
    return (int64_t)op->done;
}

/* Inserted after timers with the same deadline, so equal timers fire in submission order. */
static void portable_timer_insert(loop_t *loop, loop_op_t *op) {
    loop_op_t **link = &loop->timers;
    while (*link && (*link)->deadline_ns <= op->deadline_ns)
        link = &(*link)->next;
    op->next = *link;
    *link = op;
}

/* Keeps room in poll_fds for the doorbell and every pending poll; a poll that finds none fails. */
static void portable_poll_insert(loop_t *loop, loop_op_t *op) {
    if (op->fd < 0) {
        op->result = -EBADF; /* poll(2) would skip it silently; the ring answers EBADF */
        loop_ready_push(loop, op);
        return;
    }
    if (loop->polls_count + 2 > loop->poll_fds_capacity) {
        size_t capacity = loop->poll_fds_capacity ? 2 * loop->poll_fds_capacity : 8;
        struct pollfd *grown = realloc(loop->poll_fds, capacity * sizeof *grown);
        if (!grown) {
            op->result = -ENOMEM;
            loop_ready_push(loop, op);
            return;
        }
        loop->poll_fds = grown;
        loop->poll_fds_capacity = capacity;
    }
    op->next = loop->polls;
    loop->polls = op;
    loop->polls_count++;
}

/* portable_poll over the doorbell (first, when `doorbell`) and every pending poll for up to `timeout`
 * (NULL: no limit); the polls found ready move to the ready list with their events as result.
 * Answers 0 or -errno, and whether the doorbell is readable in *rang. */
static int portable_scan(loop_t *loop, bool doorbell, struct timespec const *timeout, bool *rang) {
    struct pollfd single;
    struct pollfd *fds = loop->polls_count ? loop->poll_fds : &single;
    nfds_t count = 0;
    *rang = false;
    if (doorbell)
        fds[count++] = (struct pollfd){.fd = loop->doorbell.read_fd, .events = POLLIN, .revents = 0};
    for (loop_op_t *op = loop->polls; op; op = op->next)
        fds[count++] = (struct pollfd){.fd = op->fd, .events = (short)op->flags, .revents = 0};
    if (count == 0) return 0;
    int ready = portable_poll(fds, count, timeout);
    if (ready < 0) return -errno;
    if (ready == 0) return 0;
    *rang = doorbell && (fds[0].revents & POLLIN);
    struct pollfd const *polled = doorbell ? fds + 1 : fds;
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
    return 0;
}

void loop_portable_submit(loop_t *loop, loop_op_t *op) {
    if (op->kind == LOOP_OP_TIMER) {
        portable_timer_insert(loop, op);
        return;
    }
    if (op->kind == LOOP_OP_POLL) {
        portable_poll_insert(loop, op);
        return;
    }
    if (op->kind == LOOP_OP_OPEN)
        op->result = portable_open(op);
    else if (op->kind == LOOP_OP_STATX)
        op->result = portable_statx(op);
    else
        op->result = portable_read(op);
    loop_ready_push(loop, op);
}

void loop_portable_collect(loop_t *loop) {
    if (loop->polls) {
        /* Without waiting: a failure (EINTR, ENOMEM) leaves them for the next look. */
        struct timespec const now = {0, 0};
        bool rang;
        (void)portable_scan(loop, false, &now, &rang);
    }
    if (!loop->timers) return;
    uint64_t now = loop_now_ns();
    while (loop->timers && loop->timers->deadline_ns <= now) {
        loop_op_t *op = loop->timers;
        loop->timers = op->next;
        op->result = -ETIME;
        loop_ready_push(loop, op);
    }
}

bool loop_portable_pending(loop_t *loop) {
    return loop->timers && loop->timers->deadline_ns <= loop_now_ns();
}

int loop_portable_wait(loop_t *loop) {
    struct timespec timeout;
    struct timespec *until = NULL;
    if (loop->timers) {
        uint64_t now = loop_now_ns();
        uint64_t left = loop->timers->deadline_ns > now ? loop->timers->deadline_ns - now : 0;
        timeout.tv_sec = (time_t)(left / 1000000000u);
        timeout.tv_nsec = (long)(left % 1000000000u);
        until = &timeout;
    }
    bool rang = false;
    int ret = portable_scan(loop, true, until, &rang);
    if (ret < 0) return ret == -EINTR ? 0 : ret;
    if (!rang) return 0;
    /* Only this thread drains it and poll saw it readable, so this does not block. */
    return loop_doorbell_drain(&loop->doorbell);
}

void loop_portable_cancel(loop_t *loop, loop_op_t *op) {
    bool poll = op->kind == LOOP_OP_POLL;
    for (loop_op_t **link = poll ? &loop->polls : &loop->timers; *link; link = &(*link)->next) {
        if (*link != op) continue;
        *link = op->next;
        if (poll) loop->polls_count--;
        op->result = -ECANCELED;
        loop_ready_push(loop, op);
        return;
    }
}
