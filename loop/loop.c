/* The parts of the event loop both backends share: backend choice, creation, the posted-operation
 * stack and its doorbell, the ready list, and loop_run itself. */
#include "loop_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Backend choice -------------------------------------------------------------------------- */

/* The io_uring probe runs once per process: it costs a ring setup and a few syscalls. */
static pthread_once_t loop_probe_once = PTHREAD_ONCE_INIT;
static bool loop_probe_usable;

static void loop_probe(void) {
#if UFORM_WITH_URING
    loop_probe_usable = loop_uring_probe();
#else
    loop_probe_usable = false;
#endif
}

bool loop_uring_available(void) {
    /* pthread_once fails only on misuse; then io_uring is treated as absent. */
    if (pthread_once(&loop_probe_once, loop_probe) != 0) return false;
    return loop_probe_usable;
}

/* Resolves AUTO. `forced` tells whether io_uring was asked for by name (option or UFORM_LOOP), in
 * which case failing to use it is an error rather than a reason to fall back. */
static loop_backend_t loop_resolve_backend(loop_backend_t asked, bool *forced) {
    *forced = asked == LOOP_BACKEND_URING;
    if (asked != LOOP_BACKEND_AUTO) return asked;
    char const *choice = getenv("UFORM_LOOP");
    if (choice && strcmp(choice, "portable") == 0) return LOOP_BACKEND_PORTABLE;
    if (choice && strcmp(choice, "uring") == 0) {
        *forced = true;
        return LOOP_BACKEND_URING;
    }
    return loop_uring_available() ? LOOP_BACKEND_URING : LOOP_BACKEND_PORTABLE;
}

loop_backend_t loop_default_backend(void) {
    bool forced;
    return loop_resolve_backend(LOOP_BACKEND_AUTO, &forced);
}

loop_backend_t loop_backend(loop_t const *loop) {
    return loop->backend;
}

uint64_t loop_now_ns(void) {
    struct timespec now;
    /* CLOCK_MONOTONIC cannot fail on Linux; 0 keeps a broken clock from faking a far deadline. */
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) return 0;
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* What a backend does for the shared parts here. */
typedef struct loop_hooks {
    void (*submit)(loop_t *loop, loop_op_t *op);
    void (*cancel)(loop_t *loop, loop_op_t *op); /* a pending poll or timer */
    void (*collect)(loop_t *loop);               /* whatever is final, without blocking */
    bool (*pending)(loop_t *loop);               /* something to deliver, checked without syscalls */
    int (*wait)(loop_t *loop);                   /* blocks; 0, or -errno when it cannot wait */
    void (*destroy)(loop_t *loop);               /* NULL: nothing of its own to free */
} loop_hooks_t;

/* Each backend's hooks, by loop_backend_t (a build without io_uring has none for it). */
static loop_hooks_t const loop_hooks[] = {
    [LOOP_BACKEND_PORTABLE] = {loop_portable_submit, loop_portable_cancel, loop_portable_collect,
                               loop_portable_pending, loop_portable_wait, loop_portable_destroy},
#if UFORM_WITH_URING
    [LOOP_BACKEND_URING] = {loop_uring_submit, loop_uring_cancel, loop_uring_collect, loop_uring_pending,
                            loop_uring_wait, loop_uring_destroy},
#endif
};

static loop_hooks_t const *loop_hooks_of(loop_t const *loop) {
    return &loop_hooks[loop->backend];
}

/* ---- Creation -------------------------------------------------------------------------------- */

int loop_create(loop_options_t const *options, loop_t **out) {
    static loop_options_t const defaults = {.backend = LOOP_BACKEND_AUTO};
    loop_t *loop = NULL;
    int ret;
    if (!out) return -EINVAL;
    *out = NULL;
    if (!options) options = &defaults;

    bool forced;
    loop_backend_t backend = loop_resolve_backend(options->backend, &forced);
    if (backend != LOOP_BACKEND_URING && backend != LOOP_BACKEND_PORTABLE) return -EINVAL;
    if (backend == LOOP_BACKEND_URING && !loop_uring_available()) return -ENOSYS;

    /* The posters' fields and the loop thread's fields sit on separate cache lines. */
    size_t size = (sizeof *loop + 63) & ~(size_t)63;
    loop = aligned_alloc(64, size);
    if (!loop) return -ENOMEM;
    memset(loop, 0, size);
    atomic_init(&loop->posted, NULL);
    atomic_init(&loop->sleeping, false);
    atomic_init(&loop->woken, false);
    loop->backend = backend;

    ret = loop_doorbell_open(&loop->doorbell);
    if (ret < 0) goto fail;

#if UFORM_WITH_URING
    if (backend == LOOP_BACKEND_URING) {
        ret = loop_uring_create(loop, options);
        if (ret < 0 && forced) {
            /* Out of memory or descriptors is said as such; anything else means unusable. */
            if (ret != -ENOMEM && ret != -EMFILE && ret != -ENFILE) ret = -ENOSYS;
            goto fail;
        }
        /* The probe passed but this ring did not come (locked memory spent by other rings, say):
         * the portable backend serves this loop instead. */
        if (ret < 0) loop->backend = LOOP_BACKEND_PORTABLE;
    }
#endif
    if (loop->backend == LOOP_BACKEND_PORTABLE) {
        ret = loop_portable_create(loop);
        if (ret < 0) goto fail;
    }

    *out = loop;
    return 0;

fail:
    loop_doorbell_close(&loop->doorbell);
    free(loop);
    return ret;
}

void loop_destroy(loop_t *loop) {
    if (!loop) return;
    if (loop_hooks_of(loop)->destroy) loop_hooks_of(loop)->destroy(loop);
    loop_doorbell_close(&loop->doorbell);
    free(loop);
}

/* ---- Submission ------------------------------------------------------------------------------ */

/* Appends the chain first .. last (linked by next, last's NULL) to the ready list. */
static void loop_ready_append(loop_t *loop, loop_op_t *first, loop_op_t *last) {
    if (loop->ready_tail)
        loop->ready_tail->next = first;
    else
        loop->ready_head = first;
    loop->ready_tail = last;
}

void loop_ready_push(loop_t *loop, loop_op_t *op) {
    op->next = NULL;
    loop_ready_append(loop, op, op);
}

static void loop_submit(loop_t *loop, loop_op_t *op) {
    loop->in_flight++;
    loop_hooks_of(loop)->submit(loop, op);
}

void loop_open(loop_t *loop, loop_op_t *op, char const *path, int flags) {
    op->kind = LOOP_OP_OPEN;
    op->path = path;
    op->flags = flags | O_CLOEXEC;
    loop_submit(loop, op);
}

void loop_statx(loop_t *loop, loop_op_t *op, int fd, loop_stat_t *out) {
    op->kind = LOOP_OP_STATX;
    op->fd = fd;
    op->statx = out;
    loop_submit(loop, op);
}

void loop_read(loop_t *loop, loop_op_t *op, int fd, void *buffer, size_t length, uint64_t offset) {
    op->kind = LOOP_OP_READ;
    op->fd = fd;
    op->buffer = buffer;
    op->length = length;
    op->done = 0;
    op->offset = offset;
    loop_submit(loop, op);
}

void loop_timer(loop_t *loop, loop_op_t *op, uint64_t nanoseconds) {
    op->kind = LOOP_OP_TIMER;
    op->timeout_sec = (int64_t)(nanoseconds / 1000000000u);
    op->timeout_nsec = (long long)(nanoseconds % 1000000000u);
    uint64_t now = loop_now_ns();
    op->deadline_ns = nanoseconds > UINT64_MAX - now ? UINT64_MAX : now + nanoseconds;
    loop_submit(loop, op);
}

void loop_poll(loop_t *loop, loop_op_t *op, int fd, short events) {
    op->kind = LOOP_OP_POLL;
    op->fd = fd;
    op->flags = (unsigned short)events;
    loop_submit(loop, op);
}

void loop_cancel(loop_t *loop, loop_op_t *op) {
    if (op->kind != LOOP_OP_POLL && op->kind != LOOP_OP_TIMER) return;
    loop_hooks_of(loop)->cancel(loop, op);
}

size_t loop_in_flight(loop_t const *loop) {
    return loop->in_flight;
}

/* ---- Posts and wakes from other threads ------------------------------------------------------ */

/* The full fence of loop_ring_doorbell and loop_sleep. ThreadSanitizer does not model fences (GCC
 * refuses them under -fsanitize=thread, -Wtsan): what it checks there is the seq_cst accesses beside
 * each fence, which C11 orders without it, so its builds leave the fence out and may be optimized. */
static inline void loop_full_fence(void) {
#if !defined(__SANITIZE_THREAD__)
    atomic_thread_fence(memory_order_seq_cst);
#endif
}

/* Rings the doorbell if the loop announced it is going to sleep. Dekker-style with loop_sleep: the
 * poster publishes (its post or the woken flag) and then reads `sleeping`; the loop sets `sleeping`
 * and then re-reads what posters publish. All four accesses are seq_cst, so at least one side sees
 * the other: either the loop does not sleep, or the poster rings. Only the poster that clears the
 * flag writes, so a sleep costs one doorbell write however many posts arrive. */
static void loop_ring_doorbell(loop_t *loop) {
    /* A full fence between the poster's publication and its read of `sleeping`, beside the seq_cst
     * accesses: C11 already orders a seq_cst store before a later seq_cst load, but qemu-user's
     * translation of AArch64 STLR then LDAR onto an x86 host lets the load pass the store (no barrier
     * between them), and a lost wake-up hung the emulated CI run; `dmb ish` (a fence) it translates
     * faithfully. Posts are per call, so the fence costs nothing measurable. */
    loop_full_fence();
    if (!atomic_load(&loop->sleeping) || !atomic_exchange(&loop->sleeping, false)) return;
    loop_doorbell_ring(&loop->doorbell);
}

void loop_post(loop_t *loop, loop_op_t *op) {
    op->kind = LOOP_OP_POST;
    loop_op_t *head = atomic_load_explicit(&loop->posted, memory_order_relaxed);
    do {
        op->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&loop->posted, &head, op, memory_order_seq_cst,
                                                    memory_order_relaxed));
    loop_ring_doorbell(loop);
}

void loop_wake(loop_t *loop) {
    atomic_store(&loop->woken, true);
    loop_ring_doorbell(loop);
}

/* Takes every posted operation at once and appends them to the ready list in posting order (the
 * stack holds them newest first). */
static void loop_take_posts(loop_t *loop) {
    if (!atomic_load_explicit(&loop->posted, memory_order_relaxed)) return;
    loop_op_t *newest = atomic_exchange_explicit(&loop->posted, NULL, memory_order_acquire);
    loop_op_t *oldest = NULL, *last = newest; /* the newest ends the reversed chain */
    while (newest) {
        loop_op_t *next = newest->next;
        newest->next = oldest;
        oldest = newest;
        newest = next;
    }
    if (!oldest) return;
    loop_ready_append(loop, oldest, last);
}

/* ---- Running ----------------------------------------------------------------------------------- */

static bool loop_has_work(loop_t *loop) {
    return atomic_load(&loop->posted) != NULL || atomic_load(&loop->woken) || loop->ready_head != NULL ||
           loop_hooks_of(loop)->pending(loop);
}

/* Runs the callbacks of everything final now. Operations made final by these callbacks (a portable
 * open submitted from a callback, say) wait for the next call, so that a callback which resubmits
 * cannot keep one loop_run going forever. */
static size_t loop_deliver(loop_t *loop) {
    loop_hooks_of(loop)->collect(loop); /* CQEs, expired timers */
    loop_take_posts(loop);
    loop_op_t *op = loop->ready_head;
    loop->ready_head = NULL;
    loop->ready_tail = NULL;
    size_t count = 0;
    while (op) {
        loop_op_t *next = op->next; /* the callback may resubmit op, which rewrites next */
        if (op->kind != LOOP_OP_POST) loop->in_flight--;
        op->next = NULL;
        if (op->callback) op->callback(op);
        count++;
        op = next;
    }
    return count;
}

static inline void loop_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls for up to spin_ns without syscalls (the clock is read through the vDSO). */
static void loop_spin(loop_t *loop, uint64_t spin_ns) {
    uint64_t now = loop_now_ns();
    uint64_t deadline = spin_ns > UINT64_MAX - now ? UINT64_MAX : now + spin_ns;
    for (unsigned round = 0;; round++) {
        if (loop_has_work(loop)) return;
        if ((round & 63) == 63 && loop_now_ns() >= deadline) return;
        loop_cpu_relax();
    }
}

/* Blocks until the backend has a completion, a timer is due, or the doorbell rings. */
static int loop_sleep(loop_t *loop) {
    atomic_store(&loop->sleeping, true);
    loop_full_fence(); /* the other half of loop_ring_doorbell's fence */
    int ret = 0;
    if (!loop_has_work(loop)) ret = loop_hooks_of(loop)->wait(loop);
    atomic_store(&loop->sleeping, false);
    return ret;
}

size_t loop_run(loop_t *loop, bool block, uint64_t spin_ns) {
    size_t count = loop_deliver(loop);
    if (count > 0 || !block) return count;
    if (spin_ns > 0) {
        loop_spin(loop, spin_ns);
        count = loop_deliver(loop);
        if (count > 0) return count;
    }
    for (;;) {
        /* A wake makes one blocking run return, even with nothing delivered. */
        if (atomic_exchange(&loop->woken, false)) return 0;
        /* A backend that cannot wait (an error the caller cannot be told of) makes this run return
         * instead of spinning here. */
        if (loop_sleep(loop) < 0) return loop_deliver(loop);
        count = loop_deliver(loop);
        if (count > 0) return count;
    }
}

/* ---- MSG_RING -------------------------------------------------------------------------------- */

int loop_msg_ring(loop_t *loop, int ring_fd, int32_t res, uint64_t user_data) {
#if UFORM_WITH_URING
    if (!loop_uring_available()) return -EOPNOTSUPP;
    return loop_uring_msg_ring(loop, ring_fd, res, user_data);
#else
    (void)loop;
    (void)ring_fd;
    (void)res;
    (void)user_data;
    return -EOPNOTSUPP;
#endif
}
