/* The io_uring backend: opens, statx, reads, timers and polls are ring operations whose user_data is
 * the loop_op_t; the doorbell is an eventfd read kept armed in the same ring, so one wait covers both. */
#include "loop_internal.h"

#if UFORM_WITH_URING

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* loop_timer leaves its delay in place as a __kernel_timespec: timeout_sec, then timeout_nsec. The
 * kernel copies it when the SQE is submitted, and the op lives until its callback. */
_Static_assert(offsetof(loop_op_t, timeout_nsec) == offsetof(loop_op_t, timeout_sec) + sizeof(int64_t),
               "timeout_sec and timeout_nsec must form a struct __kernel_timespec");
_Static_assert(sizeof(struct __kernel_timespec) == 2 * sizeof(int64_t), "unexpected __kernel_timespec");

/* One read SQE asks for at most this much: its length is 32 bits, and the kernel stops a read just
 * under 2 GiB anyway. Larger reads continue like short ones. */
#define URING_READ_CHUNK ((size_t)1 << 30)

/* Ring sizes: at least room for a send and its fence plus work; at most what keeps the 4x CQ within
 * the kernel's limit of 65536 CQEs. */
#define URING_ENTRIES_DEFAULT 64u
#define URING_ENTRIES_MIN     8u
#define URING_ENTRIES_MAX     16384u

/* ---- Probe ----------------------------------------------------------------------------------- */

bool loop_uring_probe(void) {
    static int const needed[] = {IORING_OP_OPENAT,  IORING_OP_STATX,    IORING_OP_READ,
                                 IORING_OP_TIMEOUT, IORING_OP_POLL_ADD, IORING_OP_ASYNC_CANCEL,
                                 IORING_OP_MSG_RING};
    struct io_uring ring;
    struct io_uring_probe *probe = NULL;
    struct io_uring_sqe *sqe;
    struct io_uring_cqe *cqe;
    bool usable = false;

    /* 2 turns io_uring off for everyone. 1 still admits CAP_SYS_ADMIN and io_uring_group, so setup
     * decides. Kernels before 6.6 have no such file. */
    int fd = open("/proc/sys/kernel/io_uring_disabled", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char value = '0';
        ssize_t got = read(fd, &value, 1);
        (void)close(fd); /* read-only: nothing to lose */
        if (got == 1 && value == '2') return false;
    }
    /* EPERM (seccomp, the sysctl), ENOSYS (old or stripped kernel, gVisor), EOPNOTSUPP, EINVAL,
     * ENOMEM (locked memory): all mean the portable backend. */
    if (io_uring_queue_init(URING_ENTRIES_MIN, &ring, 0) < 0) return false;

    /* A send's success is seen through the fence linked after it, which needs CQE_SKIP (5.17; any
     * kernel with MSG_RING has it). */
    if (!(ring.features & IORING_FEAT_CQE_SKIP)) goto done;

    /* A filter may allow setup and refuse io_uring_enter: only a round trip shows it. */
    sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, LOOP_TAG_FENCE);
    if (io_uring_submit_and_wait(&ring, 1) != 1) goto done;
    if (io_uring_peek_cqe(&ring, &cqe) != 0) goto done;
    bool answered = cqe->user_data == LOOP_TAG_FENCE && cqe->res == 0;
    io_uring_cqe_seen(&ring, cqe);
    if (!answered) goto done;

    /* ... and one that refuses io_uring_register shows here. */
    probe = io_uring_get_probe_ring(&ring);
    if (!probe) goto done;
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!io_uring_opcode_supported(probe, needed[i])) goto done;
    usable = true;

done:
    if (probe) io_uring_free_probe(probe);
    io_uring_queue_exit(&ring);
    return usable;
}

/* ---- SQEs and CQEs --------------------------------------------------------------------------- */

/* Takes a free SQE; when the SQ is full, submits what is queued and tries again. */
static int uring_get_sqe(struct io_uring *ring, struct io_uring_sqe **out) {
    for (;;) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (sqe) {
            *out = sqe;
            return 0;
        }
        int submitted = io_uring_submit(ring);
        if (submitted == -EINTR) continue;
        if (submitted < 0) return submitted;
        if (submitted == 0) return -EBUSY;
    }
}

/* The doorbell exists only to end a wait: the posts themselves are on the stack. */
static int uring_arm_doorbell(loop_t *loop) {
    struct io_uring_sqe *sqe;
    int ret = uring_get_sqe(&loop->ring, &sqe);
    if (ret < 0) return ret;
    io_uring_prep_read(sqe, loop->doorbell.read_fd, &loop->doorbell_value, sizeof loop->doorbell_value, 0);
    io_uring_sqe_set_data64(sqe, LOOP_TAG_DOORBELL);
    loop->doorbell_armed = true;
    return 0;
}

/* Queues the SQE of `op` (or of the rest of a read). Without an SQE the op fails with the error,
 * delivered by the next loop_run like any completion. */
static void uring_queue(loop_t *loop, loop_op_t *op) {
    struct io_uring_sqe *sqe;
    int ret = uring_get_sqe(&loop->ring, &sqe);
    if (ret < 0) {
        op->result = ret;
        loop_ready_push(loop, op);
        return;
    }
    if (op->kind == LOOP_OP_OPEN) {
        io_uring_prep_openat(sqe, AT_FDCWD, op->path, op->flags, LOOP_CREATE_MODE);
    } else if (op->kind == LOOP_OP_STATX) {
        io_uring_prep_statx(sqe, op->fd, "", AT_EMPTY_PATH, LOOP_STATX_MASK, op->statx);
    } else if (op->kind == LOOP_OP_READ) {
        size_t rest = op->length - op->done;
        unsigned chunk = (unsigned)(rest < URING_READ_CHUNK ? rest : URING_READ_CHUNK);
        /* An offset of all ones reads at the file position, which the kernel advances itself. */
        uint64_t offset = op->offset == UINT64_MAX ? UINT64_MAX : op->offset + op->done;
        void *into = op->done ? (char *)op->buffer + op->done : op->buffer;
        io_uring_prep_read(sqe, op->fd, into, chunk, offset);
    } else if (op->kind == LOOP_OP_POLL) {
        io_uring_prep_poll_add(sqe, op->fd, (unsigned)op->flags); /* one-shot without IORING_POLL_ADD_MULTI */
    } else {
        io_uring_prep_timeout(sqe, (struct __kernel_timespec *)(void *)&op->timeout_sec, 0, 0);
    }
    io_uring_sqe_set_data(sqe, op);
}

/* A CQE of a caller's operation: a short read asks for the rest, anything else is final. */
static void uring_complete(loop_t *loop, loop_op_t *op, int32_t res) {
    if (op->kind == LOOP_OP_READ && (res > 0 || res == -EINTR)) {
        if (res > 0) op->done += (size_t)res;
        if (op->done < op->length) {
            uring_queue(loop, op);
            return;
        }
    }
    /* A read's result is the total; 0 bytes from the kernel means end of file. */
    op->result = op->kind == LOOP_OP_READ && res >= 0 ? (int64_t)op->done : (int64_t)res;
    loop_ready_push(loop, op);
}

/* `loop` is NULL for the messenger ring, which carries nothing but sends. */
static void uring_handle(loop_t *loop, loop_message_t *message, uint64_t user_data, int32_t res) {
    switch (user_data) {
    case LOOP_TAG_DOORBELL:
        if (!loop) return;
        loop->doorbell_armed = false;
        /* A failure leaves it unarmed; loop_uring_wait arms it before it sleeps. */
        if (!loop->closing) (void)uring_arm_doorbell(loop);
        return;
    case LOOP_TAG_MESSAGE:
        /* CQE_SKIP_SUCCESS: this CQE exists only because the send failed. */
        message->failed = true;
        message->error = res;
        return;
    case LOOP_TAG_FENCE:
        /* 0 only if the send before it succeeded; -ECANCELED (when a kernel posts it) is ignored. */
        if (res == 0) message->confirmed = true;
        return;
    case LOOP_TAG_CANCEL:
        return;
    default:
        if (loop) uring_complete(loop, (loop_op_t *)(uintptr_t)user_data, res);
        return;
    }
}

/* Takes every CQE there is. With TASKRUN_FLAG rings, liburing's peek enters the kernel itself when
 * IORING_SQ_TASKRUN says completions wait as task work. */
static void uring_reap(struct io_uring *ring, loop_t *loop, loop_message_t *message) {
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(ring, &cqe) == 0) {
        uint64_t user_data = cqe->user_data;
        int32_t res = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        uring_handle(loop, message, user_data, res);
    }
}

/* ---- Loop hooks ------------------------------------------------------------------------------ */

int loop_uring_create(loop_t *loop, loop_options_t const *options) {
    /* Tried in order; EINVAL means the kernel lacks a flag, so the next set drops it. */
    static unsigned const flag_sets[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG |
            IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE,     /* 6.1+: the creating thread drives it */
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG, /* 5.19+ */
        0,
    };
    size_t const sets = sizeof flag_sets / sizeof flag_sets[0];
    size_t set = options->single_issuer ? 0 : 1;
    unsigned entries = options->entries ? options->entries : URING_ENTRIES_DEFAULT;
    if (entries < URING_ENTRIES_MIN) entries = URING_ENTRIES_MIN;
    if (entries > URING_ENTRIES_MAX) entries = URING_ENTRIES_MAX;

    int ret;
    for (;;) {
        struct io_uring_params params;
        memset(&params, 0, sizeof params);
        params.flags = flag_sets[set];
        /* Posts do not use the CQ, but reads, timers and sends from many calls may all finish
         * before the loop reaps: a CQ 4x the SQ keeps them off the kernel's overflow list. */
        params.cq_entries = 4 * entries;
        ret = io_uring_queue_init_params(entries, &loop->ring, &params);
        if (ret == 0) break;
        if (ret == -EINVAL && set + 1 < sets) {
            set++;
        } else if (ret == -ENOMEM && entries > URING_ENTRIES_MIN) {
            /* Locked memory (RLIMIT_MEMLOCK) runs out at a few hundred entries when unprivileged. */
            entries /= 2;
        } else {
            return ret;
        }
    }
    loop->defer_taskrun = (flag_sets[set] & IORING_SETUP_DEFER_TASKRUN) != 0;

    if (options->single_issuer) {
        /* Saves a file lookup per io_uring_enter. The registration belongs to the calling thread, so
         * only a ring that one thread drives may use it; failing (16 per thread) costs only that. */
        ret = io_uring_register_ring_fd(&loop->ring);
        (void)ret;
    }

    ret = uring_arm_doorbell(loop);
    if (ret < 0) goto fail;
    return 0;

fail:
    io_uring_queue_exit(&loop->ring);
    return ret;
}

void loop_uring_destroy(loop_t *loop) {
    struct io_uring *ring = &loop->ring;
    struct io_uring_sqe *sqe;
    loop->closing = true;
    /* The doorbell read writes into this loop's memory when it completes: cancel it and see it end
     * before that memory goes. A thread that may not enter the ring (not the owner of a
     * SINGLE_ISSUER ring) leaves it to the ring's teardown. */
    if (loop->doorbell_armed && uring_get_sqe(ring, &sqe) == 0) {
        io_uring_prep_cancel64(sqe, LOOP_TAG_DOORBELL, 0);
        io_uring_sqe_set_data64(sqe, LOOP_TAG_CANCEL);
        while (loop->doorbell_armed) {
            int ret = io_uring_submit_and_wait(ring, 1);
            if (ret < 0 && ret != -EINTR) break;
            uring_reap(ring, loop, &loop->message);
        }
    }
    io_uring_queue_exit(ring);
}

void loop_uring_submit(loop_t *loop, loop_op_t *op) {
    uring_queue(loop, op);
}

/* The cancel's own CQE is ignored; the op's CQE (-ECANCELED, or its result if it was final already)
 * is delivered as usual. The cancel is queued ahead of anything a callback resubmits with the same op,
 * and the ring handles a submission in order, so it cannot reach a later use of the op. Without an
 * SQE the op is left to finish by itself. */
void loop_uring_cancel(loop_t *loop, loop_op_t *op) {
    struct io_uring_sqe *sqe;
    if (uring_get_sqe(&loop->ring, &sqe) < 0) return;
    io_uring_prep_cancel(sqe, op, 0);
    io_uring_sqe_set_data64(sqe, LOOP_TAG_CANCEL);
}

void loop_uring_collect(loop_t *loop) {
    struct io_uring *ring = &loop->ring;
    /* With DEFER_TASKRUN, finished I/O waits as task work until this thread enters the kernel with
     * GETEVENTS; IORING_SQ_TASKRUN says there is some. Other rings post CQEs by themselves. */
    bool deferred = loop->defer_taskrun && (IO_URING_READ_ONCE(*ring->sq.kflags) & IORING_SQ_TASKRUN);
    if (io_uring_sq_ready(ring) > 0 || deferred) {
        int ret = loop->defer_taskrun ? io_uring_submit_and_get_events(ring) : io_uring_submit(ring);
        /* A failed submit leaves its SQEs queued for the next run; a lasting failure also fails the
         * next wait, which makes loop_run return. */
        (void)ret;
    }
    uring_reap(ring, loop, &loop->message);
}

bool loop_uring_pending(loop_t *loop) {
    struct io_uring *ring = &loop->ring;
    if (io_uring_cq_ready(ring) > 0) return true;
    /* Only a DEFER ring's task work is surely this thread's to run; on other rings it may belong to
     * the thread that submitted, and spinning on it would not end. */
    unsigned flags = IO_URING_READ_ONCE(*ring->sq.kflags);
    return (flags & IORING_SQ_CQ_OVERFLOW) || (loop->defer_taskrun && (flags & IORING_SQ_TASKRUN));
}

int loop_uring_wait(loop_t *loop) {
    if (!loop->doorbell_armed) {
        int ret = uring_arm_doorbell(loop);
        if (ret < 0) return ret;
    }
    /* Submits everything queued, the doorbell included, then sleeps for one CQE. */
    int ret = io_uring_submit_and_wait(&loop->ring, 1);
    return ret < 0 && ret != -EINTR ? ret : 0;
}

/* ---- MSG_RING -------------------------------------------------------------------------------- */

/* Sends {res, user_data} into the ring `ring_fd` and waits for the outcome. The send carries
 * CQE_SKIP_SUCCESS and a NOP fence is linked after it: success shows as the fence's CQE with 0, and
 * a failed send still posts its own CQE with the error (the kernel then skips the fence's). Either
 * way exactly one CQE tells, in order, whatever else the ring is doing. */
static int uring_send_message(struct io_uring *ring, loop_t *loop, loop_message_t *message, int ring_fd,
                              int32_t res, uint64_t user_data) {
    /* Both in one submission: a link cut at a batch boundary would let the fence run regardless. */
    if (io_uring_sq_space_left(ring) < 2) {
        int ret = io_uring_submit(ring);
        if (ret < 0) return ret;
        if (io_uring_sq_space_left(ring) < 2) return -EBUSY;
    }
    struct io_uring_sqe *send = io_uring_get_sqe(ring);
    struct io_uring_sqe *fence = io_uring_get_sqe(ring);
    io_uring_prep_msg_ring(send, ring_fd, (unsigned)res, user_data, 0);
    io_uring_sqe_set_data64(send, LOOP_TAG_MESSAGE);
    io_uring_sqe_set_flags(send, IOSQE_IO_LINK | IOSQE_CQE_SKIP_SUCCESS);
    io_uring_prep_nop(fence);
    io_uring_sqe_set_data64(fence, LOOP_TAG_FENCE);

    *message = (loop_message_t){.failed = false, .confirmed = false, .error = 0};
    while (!message->failed && !message->confirmed) {
        int ret = io_uring_submit_and_wait(ring, 1);
        if (ret < 0 && ret != -EINTR) return ret;
        /* The loop's own completions met here go to its ready list, for the next loop_run. */
        uring_reap(ring, loop, message);
    }
    return message->failed ? message->error : 0;
}

/* The process-wide messenger: a small plain ring for loops of the portable backend and for threads
 * without a loop. Created on first use; one send at a time. */
static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    int status; /* 0, or the -errno of its setup */
    struct io_uring ring;
    loop_message_t message;
} loop_messenger = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void loop_messenger_create(void) {
    /* No SINGLE_ISSUER: whichever thread holds the lock submits. */
    loop_messenger.status = io_uring_queue_init(URING_ENTRIES_MIN, &loop_messenger.ring, 0);
}

int loop_uring_msg_ring(loop_t *loop, int ring_fd, int32_t res, uint64_t user_data) {
    if (loop && loop->backend == LOOP_BACKEND_URING)
        return uring_send_message(&loop->ring, loop, &loop->message, ring_fd, res, user_data);

    int ret = pthread_once(&loop_messenger.once, loop_messenger_create);
    if (ret != 0) return -ret;
    if (loop_messenger.status < 0) return loop_messenger.status;
    ret = pthread_mutex_lock(&loop_messenger.lock);
    if (ret != 0) return -ret;
    ret = uring_send_message(&loop_messenger.ring, NULL, &loop_messenger.message, ring_fd, res, user_data);
    /* Unlocking a lock this thread holds cannot fail. */
    (void)pthread_mutex_unlock(&loop_messenger.lock);
    return ret;
}

#endif
