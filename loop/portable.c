/* The portable backend: operations run as plain syscalls when submitted and are delivered by the
 * next loop_run; timers wait in a list sorted by deadline, and the loop sleeps in ppoll(2) on the
 * doorbell eventfd until the nearest one. */
#include "loop_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

static int64_t portable_open(loop_op_t const *op) {
    for (;;) {
        int fd = openat(AT_FDCWD, op->path, op->flags, LOOP_CREATE_MODE);
        if (fd >= 0) return fd;
        if (errno != EINTR) return -errno; /* a FIFO's open can be interrupted */
    }
}

static int64_t portable_statx(loop_op_t const *op) {
    return statx(op->fd, "", AT_EMPTY_PATH, LOOP_STATX_MASK, op->statx) == 0 ? 0 : -errno;
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

void loop_portable_submit(loop_t *loop, loop_op_t *op) {
    if (op->kind == LOOP_OP_TIMER) {
        portable_timer_insert(loop, op);
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
    struct pollfd doorbell = {.fd = loop->doorbell_fd, .events = POLLIN, .revents = 0};
    struct timespec timeout;
    struct timespec *until = NULL;
    if (loop->timers) {
        uint64_t now = loop_now_ns();
        uint64_t left = loop->timers->deadline_ns > now ? loop->timers->deadline_ns - now : 0;
        timeout.tv_sec = (time_t)(left / 1000000000u);
        timeout.tv_nsec = (long)(left % 1000000000u);
        until = &timeout;
    }
    int ready = ppoll(&doorbell, 1, until, NULL);
    if (ready < 0) return errno == EINTR ? 0 : -errno;
    if (ready == 0 || !(doorbell.revents & POLLIN)) return 0;
    /* Resets the counter. Only this thread reads it and poll saw it non-zero, so this cannot block. */
    uint64_t count;
    for (;;) {
        ssize_t got = read(loop->doorbell_fd, &count, sizeof count);
        if (got >= 0) return 0;
        if (errno != EINTR) return -errno;
    }
}
