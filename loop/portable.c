/* The portable backend: operations run as plain syscalls when submitted and are delivered by the
 * next loop_run; timers wait in a list sorted by deadline, polls in a list of their own, and the loop
 * sleeps on the doorbell and the polled descriptors until the nearest timer, in its poller: kqueue
 * (kqueue.c) where the system has it, poll(2) (poll.c) elsewhere. */
#include "loop_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

/* A poll the poller cannot watch (a descriptor that is not open, events it cannot tell, no memory for
 * its entries) is final at once with that error. */
static void portable_poll_insert(loop_t *loop, loop_op_t *op) {
    /* poll(2) would skip a negative descriptor silently; the ring answers EBADF */
    int ret = op->fd < 0 ? -EBADF : loop_poller_reserve(loop, op);
    if (ret < 0) {
        op->result = ret;
        loop_ready_push(loop, op);
        return;
    }
    op->next = loop->polls;
    loop->polls = op;
    loop->polls_count++;
}

int loop_portable_create(loop_t *loop) {
    return loop_poller_open(loop);
}

void loop_portable_destroy(loop_t *loop) {
    loop_poller_close(loop);
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
        (void)loop_poller_scan(loop, false, &now, &rang);
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
    int ret = loop_poller_scan(loop, true, until, &rang);
    if (ret < 0) return ret == -EINTR ? 0 : ret;
    if (!rang) return 0;
    /* Only this thread drains it and the poller saw it readable, so this does not block. */
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
