/* The per-executor event loop: one interface, two backends.
 *
 * A loop is driven by one thread at a time (its "loop thread"): that thread submits operations and
 * runs `loop_run`, which invokes each finished operation's callback. Other threads only post
 * (`loop_post`) and wake (`loop_wake`). Every call of the engine is a state machine whose steps are
 * these callbacks.
 *
 * Backends:
 * - io_uring (liburing): opens, statx, reads, timers and polls are ring operations; posts from other
 *   threads go to an intrusive lock-free stack whose doorbell (loop/doorbell.h) is an eventfd read kept
 *   armed in the ring,
 *   and the doorbell is rung only when the loop has announced that it is about to sleep.
 * - portable: the same operations are done with plain syscalls when submitted, and their completions
 *   are delivered by the next `loop_run`, never from inside the submitting call; the loop sleeps in its
 *   poller, kqueue(2) where the system has it (macOS, the BSDs) and poll(2) elsewhere (ppoll on Linux),
 *   on the doorbell (an eventfd on Linux, a pipe elsewhere) and the descriptors of pending polls, with
 *   the nearest timer as its timeout. Without Linux (the POSIX-only build, macOS) it is the only
 *   backend, and a statx is an fstat(2).
 * `LOOP_BACKEND_AUTO` reads UFORM_LOOP ("uring" or "portable"), then probes io_uring once per process
 * (setup, a NOP, the opcodes needed) and falls back to the portable backend on any failure.
 *
 * Nothing here allocates per operation: an operation is caller-owned memory (`loop_op_t`), usually
 * embedded in the call state that the callback recovers with `container_of`. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* A timer answers -ETIME, as io_uring does. ETIME is a STREAMS error that POSIX leaves optional and
 * FreeBSD and OpenBSD do not have: there the loop's timers answer ETIMEDOUT, under this name. */
#ifndef ETIME
#define ETIME ETIMEDOUT
#endif

/* What a statx operation fills: Linux's struct statx, or where there is none (the POSIX-only build,
 * macOS) the fields the engine reads, from fstat(2). */
#if UFORM_LINUX
typedef struct statx loop_stat_t;
#else
typedef struct loop_stat {
    uint32_t stx_mode;
    uint64_t stx_size;
} loop_stat_t;
#endif

typedef enum loop_backend {
    LOOP_BACKEND_AUTO = 0,
    LOOP_BACKEND_URING,
    LOOP_BACKEND_PORTABLE,
} loop_backend_t;

typedef enum loop_op_kind {
    LOOP_OP_POST = 0,
    LOOP_OP_OPEN,
    LOOP_OP_STATX,
    LOOP_OP_READ,
    LOOP_OP_TIMER,
    LOOP_OP_POLL,
} loop_op_kind_t;

typedef struct loop loop_t;
typedef struct loop_op loop_op_t;
typedef void (*loop_callback_t)(loop_op_t *op);

/* One operation. The submitter sets `callback` (and, for posts, `result`); the submit function fills
 * the request fields. The loop owns the whole structure from submission until the callback starts;
 * the callback may resubmit it. */
struct loop_op {
    loop_callback_t callback; /* runs on the loop thread, from loop_run, once the operation is final */
    int64_t result;           /* >= 0 on success (fd, bytes read, 0), or -errno; -ETIME for timers */
    loop_op_t *next;          /* intrusive link, owned by the loop while the op is in flight */
    loop_op_kind_t kind;
    int fd;
    int flags; /* open: the open(2) flags; poll: the poll(2) events asked */
    char const *path;
    void *buffer;
    size_t length; /* read: bytes wanted */
    size_t done;   /* read: bytes read so far (short reads are continued by the loop) */
    uint64_t offset;
    loop_stat_t *statx;
    int64_t timeout_sec; /* timer: relative, as a __kernel_timespec */
    long long timeout_nsec;
    uint64_t deadline_ns; /* timer, portable backend: absolute CLOCK_MONOTONIC */
};

typedef struct loop_options {
    loop_backend_t backend; /* AUTO: UFORM_LOOP, then probe */
    /* The creating thread will be the only thread that ever submits to or runs this loop: allows
     * IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN. Leave false for loops driven by whichever thread
     * calls (inline and pool executors). */
    bool single_issuer;
    unsigned entries; /* submission queue entries; 0 takes 64. Halved on ENOMEM down to 8. */
} loop_options_t;

/* Creates a loop on the calling thread. Answers 0, or -errno: -ENOMEM, -EMFILE, or -ENOSYS when
 * the URING backend was asked for explicitly and io_uring cannot be used. */
int loop_create(loop_options_t const *options, loop_t **loop);

/* Destroys a loop with no operation in flight. Posted operations not yet run are dropped. */
void loop_destroy(loop_t *loop);

loop_backend_t loop_backend(loop_t const *loop);

/* The backend AUTO resolves to in this process: UFORM_LOOP, else the io_uring probe. */
loop_backend_t loop_default_backend(void);

/* True when io_uring works in this process (probed once): MSG_RING notification needs it. */
bool loop_uring_available(void);

/* Submission, from the loop thread only. The callback never runs inside these calls. Opens are
 * O_CLOEXEC added; paths must stay valid until the callback. */
void loop_open(loop_t *loop, loop_op_t *op, char const *path, int flags);
void loop_statx(loop_t *loop, loop_op_t *op, int fd, loop_stat_t *out);
/* Reads `length` bytes at `offset`, continuing short reads; result = bytes read, which is less than
 * `length` only at end of file, or -errno. */
void loop_read(loop_t *loop, loop_op_t *op, int fd, void *buffer, size_t length, uint64_t offset);
/* Completes after `nanoseconds` with result -ETIME. */
void loop_timer(loop_t *loop, loop_op_t *op, uint64_t nanoseconds);
/* Completes once `fd` is ready for any of `events` (POLLIN, POLLOUT, ...: poll(2) bits), with result =
 * the ready events (POLLERR and POLLHUP come unasked), or -errno (-EBADF for a descriptor that is not
 * open). One-shot and level-triggered: an fd already ready completes in the next loop_run, and a
 * callback resubmits to keep watching. `fd` must stay open until the callback. This is how a loop
 * watches descriptors it does not own: an epoll set, an eventfd, a signalfd, a socket.
 * On kqueue (the portable backend on macOS and the BSDs) `events` must hold a read event (POLLIN,
 * POLLRDNORM, POLLRDBAND, POLLPRI: all answered together, as kqueue cannot tell out-of-band data) or a
 * write event (POLLOUT, POLLWRNORM, POLLWRBAND), else the poll ends with -EINVAL; a read end whose peer
 * is gone with nothing left to read answers POLLHUP without POLLIN. */
void loop_poll(loop_t *loop, loop_op_t *op, int fd, short events);

/* Loop thread: asks a pending poll or timer to end early. Its callback still runs exactly once, from a
 * later loop_run: with -ECANCELED, or with its own result when it was final already. Operations of
 * other kinds cannot be cancelled and are left to finish. Used to shorten a timer (cancel, then
 * resubmit from the callback) and to end watches before loop_destroy, which wants nothing in flight. */
void loop_cancel(loop_t *loop, loop_op_t *op);

/* From any thread: queues `op` (with its callback and result already set) to run on the loop
 * thread. Lock-free; makes a syscall only when the loop is asleep. */
void loop_post(loop_t *loop, loop_op_t *op);

/* From any thread: makes a sleeping or spinning loop_run return soon, even with nothing to run. */
void loop_wake(loop_t *loop);

/* Loop thread: runs the callbacks of every operation that is final, including operations posted from
 * other threads. When none is ready and `block` is true, it first polls for up to `spin_ns` (posts and
 * completions already in the queue, without syscalls), then sleeps until an operation is final or
 * loop_wake is called. Answers the number of callbacks run. */
size_t loop_run(loop_t *loop, bool block, uint64_t spin_ns);

/* Operations submitted and not yet delivered to their callbacks (posts excluded). */
size_t loop_in_flight(loop_t const *loop);

/* Loop thread: posts a completion {user_data, res} into another io_uring (IORING_OP_MSG_RING), from
 * this loop's own ring, or from a process-wide messenger ring (created once, under a lock) when this
 * loop runs the portable backend. Answers 0, or -errno from the kernel (-EBADFD, -EOVERFLOW, ...),
 * or -EOPNOTSUPP when io_uring is not available. Also callable with loop == NULL from any thread,
 * which always uses the messenger ring. */
int loop_msg_ring(loop_t *loop, int ring_fd, int32_t res, uint64_t user_data);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t loop_now_ns(void);
