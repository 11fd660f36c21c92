/* What the two backends of the event loop share: the loop's layout, the ready list, and the hooks
 * each backend implements. Only the loop's own sources include this; the engine uses loop.h. */
#pragma once

#include "doorbell.h"
#include "loop.h"
#include "uform_config.h"

#include <poll.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <time.h>

#if UFORM_WITH_URING
#include <liburing.h>
#endif

/* Reserved user_data of the loop's own ring operations. Every loop_op_t pointer is larger: the first
 * page is never mapped. LIBURING_UDATA_TIMEOUT (all ones) is liburing's own and unused here. */
enum {
    LOOP_TAG_DOORBELL = 1, /* the doorbell read that wakes a sleeping loop */
    LOOP_TAG_MESSAGE = 2,  /* an IORING_OP_MSG_RING send; a CQE arrives only when it failed */
    LOOP_TAG_FENCE = 3,    /* the NOP linked after a send; completes with 0 only if the send succeeded */
    LOOP_TAG_CANCEL = 4,   /* a cancel (the doorbell read's on destroy, loop_cancel's): its CQE is ignored */
};

#if UFORM_LINUX
/* Both backends fill a statx with the same fields. */
#define LOOP_STATX_MASK (STATX_SIZE | STATX_BASIC_STATS)
#endif

/* Mode of files created by an open with O_CREAT: loop_open takes none; the umask applies. */
#define LOOP_CREATE_MODE 0666

/* The outcome of the one MSG_RING send in flight on a ring (loop_msg_ring is synchronous). */
typedef struct loop_message {
    bool failed;    /* the send's own CQE came: it carries the error */
    bool confirmed; /* the fence completed with 0: the send succeeded */
    int32_t error;
} loop_message_t;

struct loop {
    /* Touched by other threads (loop_post, loop_wake): kept off the loop thread's cache lines. */
    alignas(64) _Atomic(loop_op_t *) posted; /* Treiber stack, newest first */
    atomic_bool sleeping;     /* the loop is about to block; the first poster to clear it rings */
    atomic_bool woken;        /* loop_wake was called; consumed by a blocking loop_run */
    loop_doorbell_t doorbell; /* set once in loop_create */

    /* The loop thread only. */
    alignas(64) loop_backend_t backend;
    size_t in_flight;      /* submitted, not yet delivered (posts excluded) */
    loop_op_t *ready_head; /* final, callback not yet run; FIFO through op->next */
    loop_op_t *ready_tail;
    loop_op_t *timers; /* portable: pending timers sorted by deadline_ns, earliest first */
    loop_op_t *polls;  /* portable: pending polls, through op->next, newest first */
    size_t polls_count;
    void *poller_entries;   /* portable: the poller's array (struct pollfd, or struct kevent) */
    size_t poller_capacity; /* its entries */
    int poller_fd;          /* portable on kqueue: the kqueue; -1 on poll(2) */
#if UFORM_WITH_URING
    struct io_uring ring;
    bool defer_taskrun;      /* completions appear only when the loop thread enters with GETEVENTS */
    bool doorbell_armed;     /* the doorbell read is queued or in the kernel */
    bool closing;            /* loop_destroy: a doorbell completion is not re-armed */
    uint64_t doorbell_value; /* where the doorbell read puts the eventfd counter; never inspected */
    loop_message_t message;
#endif
};

/* Appends a final operation to the ready list; its callback runs in the next loop_run. */
void loop_ready_push(loop_t *loop, loop_op_t *op);

/* Portable backend (portable.c). */
int loop_portable_create(loop_t *loop);
void loop_portable_destroy(loop_t *loop);
void loop_portable_submit(loop_t *loop, loop_op_t *op);
void loop_portable_collect(loop_t *loop);
bool loop_portable_pending(loop_t *loop);
int loop_portable_wait(loop_t *loop);
void loop_portable_cancel(loop_t *loop, loop_op_t *op);

/* The portable backend's wait on descriptors, its poller: kqueue.c where the system has kqueue (or
 * libkqueue, asked for by -Dkqueue=enabled), poll.c elsewhere; meson compiles one of the two. Both watch
 * the pending polls of loop->polls, which portable.c keeps. */
/* Opens what the poller needs: the kqueue, with the doorbell's read end registered. 0 or -errno. */
int loop_poller_open(loop_t *loop);
void loop_poller_close(loop_t *loop);
/* Before `op` (a poll on an open descriptor) joins loop->polls: room for its entries. 0, -ENOMEM, or
 * -EINVAL for events the poller cannot watch (kqueue: neither a read nor a write event). */
int loop_poller_reserve(loop_t *loop, loop_op_t const *op);
/* Waits up to `timeout` (NULL: no limit) for the doorbell (when `doorbell`) or a pending poll; the
 * polls found ready move to the ready list with their poll(2) events as result. Answers 0 or -errno,
 * and whether the doorbell is readable in *rang. */
int loop_poller_scan(loop_t *loop, bool doorbell, struct timespec const *timeout, bool *rang);

#if UFORM_WITH_URING
/* io_uring backend (uring.c). */
bool loop_uring_probe(void);
int loop_uring_create(loop_t *loop, loop_options_t const *options);
void loop_uring_destroy(loop_t *loop);
void loop_uring_submit(loop_t *loop, loop_op_t *op);
void loop_uring_cancel(loop_t *loop, loop_op_t *op);
void loop_uring_collect(loop_t *loop);
bool loop_uring_pending(loop_t *loop);
int loop_uring_wait(loop_t *loop);
int loop_uring_msg_ring(loop_t *loop, int ring_fd, int32_t res, uint64_t user_data);
#endif
