/* The event loop, each test once per backend: io_uring (skipped, with the reason, when this process
 * cannot use it) and portable. Nothing here depends on timing to pass except the lower bounds of
 * timers; a watchdog alarm turns a hang into a failure. */
#include "common.h"
#include "doorbell.h"
#include "loop.h"
#include "uform_config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#if UFORM_WITH_URING
#include <liburing.h>
#include <sys/eventfd.h>
#endif

#define TEST_CONTAINER_OF(pointer, type, member) ((type *)(void *)((char *)(pointer)-offsetof(type, member)))

/* The whole program is killed past this: only a hang gets near it. */
#define TEST_WATCHDOG_SECONDS 240

static loop_backend_t test_backend_uring = LOOP_BACKEND_URING;
static loop_backend_t test_backend_portable = LOOP_BACKEND_PORTABLE;

/* ---- Helpers --------------------------------------------------------------------------------- */

static loop_t *test_loop_new(void **state, bool single_issuer) {
    loop_backend_t backend = *(loop_backend_t *)*state;
    if (backend == LOOP_BACKEND_URING && !loop_uring_available()) {
        print_message("[  SKIP    ] io_uring is unavailable here (%s)\n",
                      UFORM_WITH_URING ? "the probe failed: seccomp, sysctl or kernel"
                                       : "built without liburing");
        skip();
    }
    loop_options_t options = {.backend = backend, .single_issuer = single_issuer, .entries = 0};
    loop_t *loop = NULL;
    assert_int_equal(loop_create(&options, &loop), 0);
    assert_non_null(loop);
    assert_int_equal(loop_backend(loop), backend);
    return loop;
}

static void test_sleep_ms(long ms) {
    struct timespec pause = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
}

static uint8_t test_pattern(size_t i) {
    return (uint8_t)((i * 2654435761u) >> 13);
}

/* A temporary file holding `size` bytes of test_pattern; the caller unlinks `path`. */
static void test_file_make(char *path, size_t size) {
    strcpy(path, "/tmp/uform-test-loop-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    uint8_t chunk[65536];
    for (size_t at = 0; at < size;) {
        size_t piece = size - at < sizeof chunk ? size - at : sizeof chunk;
        for (size_t i = 0; i < piece; i++)
            chunk[i] = test_pattern(at + i);
        ssize_t written = write(fd, chunk, piece);
        assert_true(written > 0);
        at += (size_t)written;
    }
    assert_int_equal(close(fd), 0);
}

/* An operation whose callback records what happened. */
typedef struct test_op {
    loop_op_t op;
    int calls;
    int64_t result;
    uint64_t at_ns;
} test_op_t;

static void test_op_done(loop_op_t *op) {
    test_op_t *record = TEST_CONTAINER_OF(op, test_op_t, op);
    record->calls++;
    record->result = op->result;
    record->at_ns = loop_now_ns();
}

static void test_op_init(test_op_t *record) {
    memset(record, 0, sizeof *record);
    record->op.callback = test_op_done;
}

/* Blocking runs until `*calls` reaches `want`; a blocking run returns only with something done. */
static void test_run_until(loop_t *loop, int const *calls, int want) {
    while (*calls < want)
        loop_run(loop, true, 0);
}

static int64_t test_read(loop_t *loop, int fd, void *buffer, size_t length, uint64_t offset) {
    test_op_t record;
    test_op_init(&record);
    loop_read(loop, &record.op, fd, buffer, length, offset);
    test_run_until(loop, &record.calls, 1);
    assert_int_equal(record.calls, 1);
    return record.result;
}

static int test_open(loop_t *loop, char const *path) {
    test_op_t record;
    test_op_init(&record);
    loop_open(loop, &record.op, path, O_RDONLY);
    test_run_until(loop, &record.calls, 1);
    assert_true(record.result >= 0);
    return (int)record.result;
}

/* ---- Open, statx and read as one chain of callbacks ------------------------------------------- */

typedef struct file_job {
    loop_t *loop;
    loop_op_t op;
    char const *path;
    loop_stat_t stat;
    uint8_t *buffer;
    size_t capacity;
    int stage;
    int fd;
    int64_t error;
    int64_t bytes;
    bool finished;
} file_job_t;

/* The job stops at a failure: `error`, a negative errno. */
static void file_job_fail(file_job_t *job, int64_t error) {
    job->error = error;
    job->finished = true;
}

/* Each callback submits the next step with the same operation. */
static void file_job_step(loop_op_t *op) {
    file_job_t *job = TEST_CONTAINER_OF(op, file_job_t, op);
    if (op->result < 0) {
        file_job_fail(job, op->result);
        return;
    }
    switch (job->stage++) {
    case 0:
        job->fd = (int)op->result;
        loop_statx(job->loop, op, job->fd, &job->stat);
        break;
    case 1:
        if (job->stat.stx_size > job->capacity) {
            file_job_fail(job, -EFBIG);
            break;
        }
        loop_read(job->loop, op, job->fd, job->buffer, (size_t)job->stat.stx_size, 0);
        break;
    default:
        job->bytes = op->result;
        job->finished = true;
        break;
    }
}

static void file_job_run(loop_t *loop, char const *path, size_t size) {
    file_job_t job;
    memset(&job, 0, sizeof job);
    job.loop = loop;
    job.path = path;
    job.fd = -1;
    job.capacity = size;
    job.buffer = malloc(size);
    assert_non_null(job.buffer);
    job.op.callback = file_job_step;

    loop_open(loop, &job.op, path, O_RDONLY);
    /* Never inside the submitting call, whatever the backend. */
    assert_int_equal(job.stage, 0);
    assert_int_equal(loop_in_flight(loop), 1);
    while (!job.finished)
        loop_run(loop, true, 0);

    assert_int_equal(job.error, 0);
    assert_int_equal(job.stage, 3);
#if UFORM_LINUX
    assert_true(job.stat.stx_mask & STATX_SIZE);
#endif
    assert_true(S_ISREG(job.stat.stx_mode));
    assert_int_equal(job.stat.stx_size, size);
    assert_int_equal(job.bytes, (int64_t)size);
    for (size_t i = 0; i < size; i++)
        if (job.buffer[i] != test_pattern(i)) fail_msg("byte %zu differs", i);
    assert_int_equal(loop_in_flight(loop), 0);
    assert_int_equal(close(job.fd), 0);
    free(job.buffer);
}

static void test_open_statx_read(void **state) {
    loop_t *loop = test_loop_new(state, false);
    char path[64];
    size_t const size = (3u << 20) + 12345; /* a few MiB, not a multiple of any page */
    test_file_make(path, size);
    file_job_run(loop, path, size);
    assert_int_equal(unlink(path), 0);
    loop_destroy(loop);
}

static void test_open_missing(void **state) {
    loop_t *loop = test_loop_new(state, false);
    char directory[] = "/tmp/uform-test-loop-XXXXXX";
    assert_non_null(mkdtemp(directory));
    char path[64];
    snprintf(path, sizeof path, "%s/missing", directory);

    test_op_t record;
    test_op_init(&record);
    loop_open(loop, &record.op, path, O_RDONLY);
    assert_int_equal(record.calls, 0);
    test_run_until(loop, &record.calls, 1);
    assert_int_equal(record.result, -ENOENT);
    assert_int_equal(loop_in_flight(loop), 0);

    assert_int_equal(rmdir(directory), 0);
    loop_destroy(loop);
}

static void test_read_past_end(void **state) {
    loop_t *loop = test_loop_new(state, false);
    char path[64];
    test_file_make(path, 1000);
    int fd = test_open(loop, path);
    uint8_t buffer[4096];

    assert_int_equal(test_read(loop, fd, buffer, sizeof buffer, 0), 1000);
    for (size_t i = 0; i < 1000; i++)
        assert_int_equal(buffer[i], test_pattern(i));
    assert_int_equal(test_read(loop, fd, buffer, 100, 950), 50);
    assert_int_equal(buffer[0], test_pattern(950));
    assert_int_equal(test_read(loop, fd, buffer, 100, 5000), 0);
    assert_int_equal(test_read(loop, fd, buffer, 0, 0), 0);

    assert_int_equal(close(fd), 0);
    assert_int_equal(unlink(path), 0);
    loop_destroy(loop);
}

/* ---- Short reads: a pipe fed in small pieces --------------------------------------------------- */

#define PIPE_PIECE  509
#define PIPE_PIECES 160

static void *pipe_writer(void *argument) {
    int fd = *(int *)argument;
    uint8_t piece[PIPE_PIECE];
    for (size_t n = 0; n < PIPE_PIECES; n++) {
        for (size_t i = 0; i < PIPE_PIECE; i++)
            piece[i] = test_pattern(n * PIPE_PIECE + i);
        for (size_t at = 0; at < PIPE_PIECE;) {
            ssize_t written = write(fd, piece + at, PIPE_PIECE - at);
            if (written < 0) return (void *)(intptr_t)errno;
            at += (size_t)written;
        }
        /* The reader finds the pipe empty again and again: each piece is a short read. */
        if (n % 8 == 0) test_sleep_ms(1);
    }
    return NULL;
}

static void test_short_reads(void **state) {
    loop_t *loop = test_loop_new(state, false);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pthread_t writer;
    assert_int_equal(pthread_create(&writer, NULL, pipe_writer, &fds[1]), 0);

    size_t const total = (size_t)PIPE_PIECE * PIPE_PIECES;
    uint8_t *buffer = calloc(1, total);
    assert_non_null(buffer);
    /* A pipe has no positions: the offset is ignored, as io_uring does for streams. */
    assert_int_equal(test_read(loop, fds[0], buffer, total, 0), (int64_t)total);
    for (size_t i = 0; i < total; i++)
        if (buffer[i] != test_pattern(i)) fail_msg("byte %zu differs", i);

    void *written;
    assert_int_equal(pthread_join(writer, &written), 0);
    assert_null(written);
    /* At end of file a read answers what it got. */
    assert_int_equal(close(fds[1]), 0);
    assert_int_equal(test_read(loop, fds[0], buffer, 10, 0), 0);
    assert_int_equal(close(fds[0]), 0);
    free(buffer);
    loop_destroy(loop);
}

/* ---- Timers ---------------------------------------------------------------------------------- */

static void test_timers(void **state) {
    loop_t *loop = test_loop_new(state, false);
    uint64_t const delays_ms[] = {30, 10, 20, 0};
    test_op_t timers[4];
    uint64_t start = loop_now_ns();
    for (size_t i = 0; i < 4; i++) {
        test_op_init(&timers[i]);
        loop_timer(loop, &timers[i].op, delays_ms[i] * 1000000u);
    }
    assert_int_equal(loop_in_flight(loop), 4);
    int fired = 0;
    while (fired < 4) {
        loop_run(loop, true, 0);
        fired = timers[0].calls + timers[1].calls + timers[2].calls + timers[3].calls;
    }
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(timers[i].calls, 1);
        assert_int_equal(timers[i].result, -ETIME);
        assert_true(timers[i].at_ns - start >= delays_ms[i] * 1000000u);
    }
    assert_int_equal(loop_in_flight(loop), 0);
    loop_destroy(loop);
}

/* ---- Posts from other threads ----------------------------------------------------------------- */

#define POSTS_PER_PRODUCER 100000
#define PRODUCERS          2

typedef struct post_item {
    loop_op_t op;
    struct post_test *test;
    int producer;
} post_item_t;

typedef struct post_test {
    loop_t *loop;
    post_item_t *items[PRODUCERS];
    int64_t next[PRODUCERS]; /* the sequence number each producer's next post must carry */
    int64_t received;
    int64_t out_of_order;
    pthread_barrier_t start;
} post_test_t;

typedef struct producer {
    post_test_t *test;
    int index;
} producer_t;

static void post_received(loop_op_t *op) {
    post_item_t *item = TEST_CONTAINER_OF(op, post_item_t, op);
    post_test_t *test = item->test;
    if (op->result != test->next[item->producer]) test->out_of_order++;
    test->next[item->producer] = op->result + 1;
    test->received++;
}

static void *post_producer(void *argument) {
    producer_t *producer = argument;
    post_test_t *test = producer->test;
    post_item_t *items = test->items[producer->index];
    pthread_barrier_wait(&test->start);
    for (int64_t i = 0; i < POSTS_PER_PRODUCER; i++) {
        /* Pauses now and then let the loop run dry and fall asleep, so the doorbell rings too. */
        if (i % 5000 == 4999) test_sleep_ms(1);
        items[i].op.callback = post_received;
        items[i].op.result = i;
        items[i].test = test;
        items[i].producer = producer->index;
        loop_post(test->loop, &items[i].op);
    }
    return NULL;
}

static void test_posts(void **state) {
    loop_t *loop = test_loop_new(state, false);
    post_test_t test;
    memset(&test, 0, sizeof test);
    test.loop = loop;
    assert_int_equal(pthread_barrier_init(&test.start, NULL, PRODUCERS), 0);
    producer_t producers[PRODUCERS];
    pthread_t threads[PRODUCERS];
    for (int p = 0; p < PRODUCERS; p++) {
        test.items[p] = calloc(POSTS_PER_PRODUCER, sizeof(post_item_t));
        assert_non_null(test.items[p]);
        producers[p] = (producer_t){.test = &test, .index = p};
        assert_int_equal(pthread_create(&threads[p], NULL, post_producer, &producers[p]), 0);
    }
    /* Alternate sleeping at once and spinning first, so that both paths meet the producers. */
    for (unsigned round = 0; test.received < (int64_t)PRODUCERS * POSTS_PER_PRODUCER; round++)
        loop_run(loop, true, round % 2 ? 20000 : 0);
    for (int p = 0; p < PRODUCERS; p++)
        assert_int_equal(pthread_join(threads[p], NULL), 0);

    assert_int_equal(test.out_of_order, 0);
    assert_int_equal(test.received, (int64_t)PRODUCERS * POSTS_PER_PRODUCER);
    for (int p = 0; p < PRODUCERS; p++)
        assert_int_equal(test.next[p], POSTS_PER_PRODUCER);
    /* Exactly once: nothing is left to deliver. */
    assert_int_equal(loop_run(loop, false, 0), 0);
    assert_int_equal(loop_in_flight(loop), 0);

    for (int p = 0; p < PRODUCERS; p++)
        free(test.items[p]);
    assert_int_equal(pthread_barrier_destroy(&test.start), 0);
    loop_destroy(loop);
}

/* ---- Wakes ----------------------------------------------------------------------------------- */

typedef struct waker {
    loop_t *loop;
    loop_op_t *post; /* NULL: wake instead of posting */
} waker_t;

static void *waker_main(void *argument) {
    waker_t *waker = argument;
    /* Most likely after the loop fell asleep; a wake or post before that must work too. */
    test_sleep_ms(20);
    if (waker->post)
        loop_post(waker->loop, waker->post);
    else
        loop_wake(waker->loop);
    return NULL;
}

/* A post of `value` from another thread, most likely while the loop sleeps: delivered once, by a run. */
static void test_post_from_thread(loop_t *loop, int64_t value) {
    test_op_t record;
    test_op_init(&record);
    record.op.result = value;
    waker_t poster = {.loop = loop, .post = &record.op};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, waker_main, &poster), 0);
    test_run_until(loop, &record.calls, 1);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(record.calls, 1);
    assert_int_equal(record.result, value);
}

static void test_wake(void **state) {
    loop_t *loop = test_loop_new(state, false);

    /* A wake before the run makes it return without sleeping, once. */
    loop_wake(loop);
    assert_int_equal(loop_run(loop, true, 0), 0);

    /* From another thread, while it sleeps, then while it spins (for up to a minute). */
    uint64_t const spins[] = {0, 60000000000u};
    for (size_t i = 0; i < 2; i++) {
        waker_t waker = {.loop = loop, .post = NULL};
        pthread_t thread;
        assert_int_equal(pthread_create(&thread, NULL, waker_main, &waker), 0);
        assert_int_equal(loop_run(loop, true, spins[i]), 0);
        assert_int_equal(pthread_join(thread, NULL), 0);
    }

    /* A post from another thread ends a sleep as well, and is delivered by it. */
    test_post_from_thread(loop, 7);
    loop_destroy(loop);
}

/* ---- MSG_RING -------------------------------------------------------------------------------- */

#if UFORM_WITH_URING
static void test_expect_message(struct io_uring *target, int32_t res, uint64_t user_data) {
    struct io_uring_cqe *cqe;
    assert_int_equal(io_uring_wait_cqe(target, &cqe), 0);
    assert_int_equal(cqe->user_data, user_data);
    assert_int_equal(cqe->res, res);
    io_uring_cqe_seen(target, cqe);
}
#endif

static void test_msg_ring(void **state) {
    loop_t *loop = test_loop_new(state, false);
    if (!loop_uring_available()) {
        assert_int_equal(loop_msg_ring(loop, 0, 1, 2), -EOPNOTSUPP);
        assert_int_equal(loop_msg_ring(NULL, 0, 1, 2), -EOPNOTSUPP);
        loop_destroy(loop);
        return;
    }
#if UFORM_WITH_URING
    struct io_uring target;
    assert_int_equal(io_uring_queue_init(8, &target, 0), 0);

    /* With an operation of the loop finishing meanwhile: it is kept for loop_run. */
    test_op_t timer;
    test_op_init(&timer);
    loop_timer(loop, &timer.op, 0);
    assert_int_equal(loop_msg_ring(loop, target.ring_fd, 42, 0xfeedULL), 0);
    assert_int_equal(timer.calls, 0);
    test_expect_message(&target, 42, 0xfeedULL);
    test_run_until(loop, &timer.calls, 1);
    assert_int_equal(timer.result, -ETIME);

    /* The messenger ring, from any thread. */
    assert_int_equal(loop_msg_ring(NULL, target.ring_fd, -7, UINT64_MAX - 1), 0);
    test_expect_message(&target, -7, UINT64_MAX - 1);

    /* A descriptor that is not a ring: the failed send's own CQE carries the error, and the next
     * sends are not confused by it. */
    int not_a_ring = eventfd(0, EFD_CLOEXEC);
    assert_true(not_a_ring >= 0);
    assert_int_equal(loop_msg_ring(loop, not_a_ring, 1, 1), -EBADFD);
    assert_int_equal(loop_msg_ring(NULL, not_a_ring, 1, 1), -EBADFD);
    for (int32_t i = 0; i < 5; i++) {
        assert_int_equal(loop_msg_ring(loop, target.ring_fd, i, 100 + (uint64_t)i), 0);
        assert_int_equal(loop_msg_ring(NULL, target.ring_fd, -i, 200 + (uint64_t)i), 0);
    }
    for (int32_t i = 0; i < 5; i++) {
        test_expect_message(&target, i, 100 + (uint64_t)i);
        test_expect_message(&target, -i, 200 + (uint64_t)i);
    }
    assert_int_equal(close(not_a_ring), 0);
    io_uring_queue_exit(&target);
#endif
    assert_int_equal(loop_in_flight(loop), 0);
    loop_destroy(loop);
}

/* ---- A single-issuer loop, created and driven by one thread ------------------------------------ */

static void test_single_issuer(void **state) {
    loop_t *loop = test_loop_new(state, true);
    char path[64];
    size_t const size = 200000;
    test_file_make(path, size);
    file_job_run(loop, path, size);

    /* Non-blocking runs alone must reap finished I/O (DEFER_TASKRUN holds it until asked). */
    test_op_t timer;
    test_op_init(&timer);
    uint64_t start = loop_now_ns();
    loop_timer(loop, &timer.op, 5000000u);
    while (timer.calls == 0) {
        if (loop_run(loop, false, 0) == 0) sched_yield();
    }
    assert_int_equal(timer.result, -ETIME);
    assert_true(timer.at_ns - start >= 5000000u);

    test_post_from_thread(loop, 3);

#if UFORM_WITH_URING
    if (loop_uring_available()) {
        struct io_uring target;
        assert_int_equal(io_uring_queue_init(8, &target, 0), 0);
        assert_int_equal(loop_msg_ring(loop, target.ring_fd, 5, 55), 0);
        test_expect_message(&target, 5, 55);
        io_uring_queue_exit(&target);
    }
#endif
    assert_int_equal(loop_in_flight(loop), 0);
    assert_int_equal(unlink(path), 0);
    loop_destroy(loop);
}

/* ---- Resubmission from a callback waits for the next run ------------------------------------- */

typedef struct reopen {
    loop_t *loop;
    loop_op_t op;
    char const *path;
    int opened;
    int64_t error;
} reopen_t;

static void reopen_step(loop_op_t *op) {
    reopen_t *reopen = TEST_CONTAINER_OF(op, reopen_t, op);
    if (op->result < 0) {
        reopen->error = op->result;
        return;
    }
    if (close((int)op->result) != 0) reopen->error = -errno;
    if (++reopen->opened < 3) loop_open(reopen->loop, op, reopen->path, O_RDONLY);
}

static void test_resubmit(void **state) {
    loop_t *loop = test_loop_new(state, false);
    char path[64];
    test_file_make(path, 10);
    reopen_t reopen = {.loop = loop, .path = path};
    reopen.op.callback = reopen_step;
    loop_open(loop, &reopen.op, path, O_RDONLY);
    while (reopen.opened < 3 && reopen.error == 0) {
        size_t ran = loop_run(loop, true, 0);
        /* One callback per run: the reopen it submits is not run by the same loop_run. */
        assert_int_equal(ran, 1);
    }
    assert_int_equal(reopen.error, 0);
    assert_int_equal(reopen.opened, 3);
    assert_int_equal(loop_in_flight(loop), 0);
    assert_int_equal(unlink(path), 0);
    loop_destroy(loop);
}

/* ---- Lifetime -------------------------------------------------------------------------------- */

static void test_lifetime(void **state) {
    /* More single-issuer loops on one thread than it may register ring descriptors for (16). */
    loop_t *loops[40];
    for (size_t i = 0; i < 40; i++)
        loops[i] = test_loop_new(state, true);
    for (size_t i = 0; i < 40; i++) {
        test_op_t timer;
        test_op_init(&timer);
        loop_timer(loops[i], &timer.op, 0);
        test_run_until(loops[i], &timer.calls, 1);
        assert_int_equal(timer.result, -ETIME);
    }
    /* Posted operations that never ran are dropped with the loop. */
    test_op_t posted[3];
    for (size_t i = 0; i < 3; i++) {
        test_op_init(&posted[i]);
        loop_post(loops[0], &posted[i].op);
    }
    for (size_t i = 0; i < 40; i++)
        loop_destroy(loops[i]);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(posted[i].calls, 0);
}

/* ---- Backend choice -------------------------------------------------------------------------- */

static void test_backend_choice(void **state) {
    (void)state;
    /* Restored at the end: the suite also runs under UFORM_LOOP=portable. */
    char const *outer = getenv("UFORM_LOOP");
    char *saved = outer ? strdup(outer) : NULL;
    assert_true(!outer || saved);
    loop_t *loop = NULL;
    loop_options_t automatic = {.backend = LOOP_BACKEND_AUTO, .single_issuer = false, .entries = 0};

    assert_int_equal(setenv("UFORM_LOOP", "portable", 1), 0);
    assert_int_equal(loop_default_backend(), LOOP_BACKEND_PORTABLE);
    assert_int_equal(loop_create(&automatic, &loop), 0);
    assert_int_equal(loop_backend(loop), LOOP_BACKEND_PORTABLE);
    loop_destroy(loop);

    assert_int_equal(setenv("UFORM_LOOP", "uring", 1), 0);
    assert_int_equal(loop_default_backend(), LOOP_BACKEND_URING);
    int created = loop_create(&automatic, &loop);
    if (loop_uring_available()) {
        assert_int_equal(created, 0);
        assert_int_equal(loop_backend(loop), LOOP_BACKEND_URING);
        loop_destroy(loop);
    } else {
        assert_int_equal(created, -ENOSYS);
        assert_null(loop);
    }

    assert_int_equal(unsetenv("UFORM_LOOP"), 0);
    loop_backend_t expected = loop_uring_available() ? LOOP_BACKEND_URING : LOOP_BACKEND_PORTABLE;
    assert_int_equal(loop_default_backend(), expected);
    assert_int_equal(loop_create(NULL, &loop), 0);
    assert_int_equal(loop_backend(loop), expected);
    loop_destroy(loop);

    /* Sizes out of range are brought into it. */
    unsigned const sizes[] = {1, 100000};
    for (size_t i = 0; i < 2; i++) {
        loop_options_t options = {.backend = expected, .single_issuer = i == 1, .entries = sizes[i]};
        assert_int_equal(loop_create(&options, &loop), 0);
        loop_destroy(loop);
    }

    loop_options_t uring = {.backend = LOOP_BACKEND_URING, .single_issuer = false, .entries = 0};
    if (!loop_uring_available()) assert_int_equal(loop_create(&uring, &loop), -ENOSYS);

    if (saved) {
        assert_int_equal(setenv("UFORM_LOOP", saved, 1), 0);
        free(saved);
    }
}

/* ---- Polls and cancels ------------------------------------------------------------------------ */

typedef struct poll_writer {
    int fd;
    char byte;
} poll_writer_t;

static void *poll_writer_main(void *argument) {
    poll_writer_t *writer = argument;
    test_sleep_ms(20); /* most likely after the loop fell asleep in its wait */
    ssize_t written = write(writer->fd, &writer->byte, 1);
    (void)written; /* checked by the reader */
    return NULL;
}

static void test_poll(void **state) {
    loop_t *loop = test_loop_new(state, true);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(fcntl(fds[i], F_SETFL, O_NONBLOCK), 0);

    /* Nothing to read: the poll stays pending through runs that do not block. */
    test_op_t readable;
    test_op_init(&readable);
    loop_poll(loop, &readable.op, fds[0], POLLIN);
    assert_int_equal(loop_in_flight(loop), 1);
    for (int i = 0; i < 3; i++)
        loop_run(loop, false, 0);
    assert_int_equal(readable.calls, 0);

    /* A write from another thread ends the loop's sleep and completes it, once. */
    poll_writer_t writer = {.fd = fds[1], .byte = 'x'};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, poll_writer_main, &writer), 0);
    test_run_until(loop, &readable.calls, 1);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_true(readable.result > 0);
    assert_true(readable.result & POLLIN);
    assert_int_equal(loop_in_flight(loop), 0);

    /* Level-triggered: the unread byte completes a second poll at once, but not inside the submit. */
    loop_poll(loop, &readable.op, fds[0], POLLIN);
    assert_int_equal(readable.calls, 1);
    test_run_until(loop, &readable.calls, 2);
    assert_true(readable.result & POLLIN);

    /* A writable end completes a POLLOUT poll; closing the writer hangs the reader up. */
    test_op_t writable, hangup;
    test_op_init(&writable);
    test_op_init(&hangup);
    loop_poll(loop, &writable.op, fds[1], POLLOUT);
    test_run_until(loop, &writable.calls, 1);
    assert_true(writable.result & POLLOUT);
    char byte;
    assert_int_equal(read(fds[0], &byte, 1), 1);
    loop_poll(loop, &hangup.op, fds[0], POLLIN);
    loop_run(loop, false, 0);
    assert_int_equal(hangup.calls, 0);
    assert_int_equal(close(fds[1]), 0);
    test_run_until(loop, &hangup.calls, 1);
    assert_true(hangup.result & POLLHUP);
    assert_int_equal(close(fds[0]), 0);

    /* A descriptor that is not open fails the poll rather than waiting forever. */
    test_op_t closed;
    test_op_init(&closed);
    loop_poll(loop, &closed.op, -1, POLLIN);
    test_run_until(loop, &closed.calls, 1);
    assert_int_equal(closed.result, -EBADF);
    assert_int_equal(loop_in_flight(loop), 0);
    loop_destroy(loop);
}

typedef struct cancel_pair cancel_pair_t;

typedef struct pair_op {
    loop_op_t op;
    cancel_pair_t *pair;
    int index;
} pair_op_t;

struct cancel_pair {
    loop_t *loop;
    pair_op_t ops[2];
    int calls[2];
    int64_t results[2][2];
    bool cancelled;
};

static void cancel_pair_done(loop_op_t *op) {
    pair_op_t *own = TEST_CONTAINER_OF(op, pair_op_t, op);
    cancel_pair_t *pair = own->pair;
    int index = own->index;
    pair->results[index][pair->calls[index]++] = op->result;
    if (!pair->cancelled) {
        pair->cancelled = true;
        loop_cancel(pair->loop, &pair->ops[1 - index].op);
    }
    if (pair->calls[index] == 1) loop_poll(pair->loop, op, op->fd, POLLIN);
}

static void test_cancel(void **state) {
    loop_t *loop = test_loop_new(state, true);
    /* A descriptor that stays readable once rung: the platform's doorbell. */
    loop_doorbell_t bell;
    assert_int_equal(loop_doorbell_open(&bell), 0);
    int fd = bell.read_fd;

    /* A pending poll and a far timer end with -ECANCELED, each callback once, nothing left in flight. */
    test_op_t watch, timer, near;
    test_op_init(&watch);
    test_op_init(&timer);
    test_op_init(&near);
    loop_poll(loop, &watch.op, fd, POLLIN);
    loop_timer(loop, &timer.op, 3600ull * 1000000000u);
    loop_run(loop, false, 0);
    loop_cancel(loop, &watch.op);
    loop_cancel(loop, &timer.op);
    assert_int_equal(watch.calls + timer.calls, 0); /* never inside the call */
    while (watch.calls + timer.calls < 2)
        loop_run(loop, true, 0);
    assert_int_equal(watch.calls, 1);
    assert_int_equal(timer.calls, 1);
    assert_int_equal(watch.result, -ECANCELED);
    assert_int_equal(timer.result, -ECANCELED);
    assert_int_equal(loop_in_flight(loop), 0);

    /* A timer that fired already keeps its own result; so does a poll whose fd was ready. */
    loop_timer(loop, &near.op, 0);
    test_sleep_ms(2);
    loop_doorbell_ring(&bell);
    loop_poll(loop, &watch.op, fd, POLLIN);
    test_run_until(loop, &near.calls, 1);
    test_run_until(loop, &watch.calls, 2);
    loop_cancel(loop, &near.op);
    loop_cancel(loop, &watch.op);
    assert_int_equal(near.result, -ETIME);
    assert_true(watch.result & POLLIN);

    /* Cancelled at once: the poll's own result if the backend saw it ready first, else -ECANCELED. */
    loop_poll(loop, &watch.op, fd, POLLIN);
    loop_cancel(loop, &watch.op);
    test_run_until(loop, &watch.calls, 3);
    assert_true(watch.result == -ECANCELED || (watch.result & POLLIN));

    /* A cancel of an op that is final but not yet delivered does not reach its resubmission: the first
     * of two ready polls to run cancels the other, and both resubmit themselves once. */
    cancel_pair_t pair = {.loop = loop};
    for (int i = 0; i < 2; i++) {
        pair.ops[i] = (pair_op_t){.op = {.callback = cancel_pair_done}, .pair = &pair, .index = i};
        loop_poll(loop, &pair.ops[i].op, fd, POLLIN);
    }
    while (pair.calls[0] + pair.calls[1] < 4)
        loop_run(loop, true, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pair.calls[i], 2);
        for (int call = 0; call < 2; call++)
            assert_true(pair.results[i][call] & POLLIN);
    }
    assert_int_equal(loop_in_flight(loop), 0);
    loop_doorbell_close(&bell);
    loop_destroy(loop);
}

/* Read and write events over one socket pair, each poll answered only the events it asked (with the
 * hangup and errors it did not), however many watch one descriptor; and a poll that asks neither to
 * read nor to write, which poll(2) and io_uring take as a watch for hangup and kqueue cannot watch. */
static void test_poll_events(void **state) {
    loop_t *loop = test_loop_new(state, true);
    int pair[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    test_op_t both, in, out, hangup;
    test_op_init(&both);
    test_op_init(&in);
    test_op_init(&out);
    test_op_init(&hangup);

    /* Nothing to read: writable only. */
    loop_poll(loop, &both.op, pair[0], POLLIN | POLLOUT);
    test_run_until(loop, &both.calls, 1);
    assert_int_equal(both.result, POLLOUT);

    /* Something to read: a read poll and a write poll on the same descriptor, each with its own. */
    assert_int_equal(write(pair[1], "x", 1), 1);
    loop_poll(loop, &in.op, pair[0], POLLIN);
    loop_poll(loop, &out.op, pair[0], POLLOUT);
    test_run_until(loop, &in.calls, 1);
    test_run_until(loop, &out.calls, 1);
    assert_int_equal(in.result, POLLIN);
    assert_int_equal(out.result, POLLOUT);
    char byte;
    assert_int_equal(read(pair[0], &byte, 1), 1);

    /* The peer gone: a read poll says so. */
    assert_int_equal(close(pair[1]), 0);
    loop_poll(loop, &in.op, pair[0], POLLIN);
    test_run_until(loop, &in.calls, 2);
    assert_true(in.result > 0 && (in.result & POLLHUP));
    assert_int_equal(in.result & POLLOUT, 0);

    loop_poll(loop, &hangup.op, pair[0], 0);
    test_run_until(loop, &hangup.calls, 1);
    bool on_kqueue = UFORM_WITH_KQUEUE && loop_backend(loop) == LOOP_BACKEND_PORTABLE;
    if (on_kqueue)
        assert_int_equal(hangup.result, -EINVAL);
    else
        assert_true(hangup.result > 0 && (hangup.result & POLLHUP));
    assert_int_equal(loop_in_flight(loop), 0);
    assert_int_equal(close(pair[0]), 0);
    loop_destroy(loop);
}

/* ---- Doorbells ------------------------------------------------------------------------------- */

static bool test_readable(int fd) {
    struct pollfd poller = {.fd = fd, .events = POLLIN};
    int ready = poll(&poller, 1, 0);
    assert_true(ready >= 0);
    return ready == 1 && (poller.revents & POLLIN);
}

/* Rung once or many times (a pipe's worth and more: the rings past a full pipe are dropped), the
 * doorbell is readable until drained, then not; and it rings again after. */
static void test_doorbell_check(loop_doorbell_t *bell) {
    assert_false(test_readable(bell->read_fd));
    loop_doorbell_ring(bell);
    assert_true(test_readable(bell->read_fd));
    assert_int_equal(loop_doorbell_drain(bell), 0);
    assert_false(test_readable(bell->read_fd));
    for (int i = 0; i < 200000; ++i)
        loop_doorbell_ring(bell);
    assert_true(test_readable(bell->read_fd));
    assert_int_equal(loop_doorbell_drain(bell), 0);
    assert_false(test_readable(bell->read_fd));
    loop_doorbell_ring(bell);
    assert_true(test_readable(bell->read_fd));
    loop_doorbell_close(bell);
    assert_int_equal(bell->read_fd, -1);
    assert_int_equal(bell->write_fd, -1);
}

/* The platform's doorbell (an eventfd on Linux: one descriptor) and the pipe every platform has. */
static void test_doorbells(void **state) {
    (void)state;
    loop_doorbell_t bell;
    assert_int_equal(loop_doorbell_open(&bell), 0);
    assert_int_equal(bell.read_fd == bell.write_fd, UFORM_LINUX);
    test_doorbell_check(&bell);
    assert_int_equal(loop_doorbell_open_pipe(&bell), 0);
    assert_true(bell.read_fd != bell.write_fd);
    assert_true(fcntl(bell.read_fd, F_GETFL) & O_NONBLOCK);
    assert_true(fcntl(bell.write_fd, F_GETFL) & O_NONBLOCK);
    assert_true(fcntl(bell.read_fd, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(bell.write_fd, F_GETFD) & FD_CLOEXEC);
    test_doorbell_check(&bell);
}

/* ---- Main ------------------------------------------------------------------------------------ */

/* Each backend is a test of its own, named after it. */
/* clang-format off */
#define TEST_BOTH(function) \
    {#function "/uring", function, NULL, NULL, &test_backend_uring}, \
    {#function "/portable", function, NULL, NULL, &test_backend_portable}
/* clang-format on */

int main(void) {
    alarm(TEST_WATCHDOG_SECONDS);
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_backend_choice),
        cmocka_unit_test(test_doorbells),
        TEST_BOTH(test_open_statx_read),
        TEST_BOTH(test_open_missing),
        TEST_BOTH(test_read_past_end),
        TEST_BOTH(test_short_reads),
        TEST_BOTH(test_timers),
        TEST_BOTH(test_posts),
        TEST_BOTH(test_wake),
        TEST_BOTH(test_msg_ring),
        TEST_BOTH(test_single_issuer),
        TEST_BOTH(test_resubmit),
        TEST_BOTH(test_lifetime),
        TEST_BOTH(test_poll),
        TEST_BOTH(test_cancel),
        TEST_BOTH(test_poll_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
