/* Executors (executor.h): what every kind shares (creation, references, the loop thread of threaded
 * kinds, forks, memory placement, scratch, info) and the inline kind, whose calls run on the calling
 * thread. The kinds with state of their own live in executor_ram.c, executor_pool.c and src/vram. */
#include <errno.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "futex.h"

static executor_ops_t const inline_ops = {.kind = UFORM_EXECUTOR_INLINE};

void (*executor_stop_observer)(uform_executor_t *executor);

uform_executor_t *executor_new(executor_ops_t const *ops) {
    /* Aligned as its call storage is (calloc gives 16 bytes): a call's state placed there may need 64. */
    uform_executor_t *executor = aligned_alloc(alignof(uform_executor_t), sizeof *executor);
    if (!executor) return NULL;
    memset(executor, 0, sizeof *executor);
    executor->ops = ops;
    atomic_init(&executor->references, 1);
    atomic_init(&executor->holder, NULL);
    atomic_init(&executor->active, 0);
    atomic_init(&executor->mood, UFORM_SLEEPING);
    atomic_init(&executor->spin_held, false);
    executor->spin_ns = EXECUTOR_SPIN_NS;
    executor->threads = 1;
    return executor;
}

/* ---- The loop thread of threaded executors -------------------------------------------------------- */

static void *loop_thread_main(void *argument) {
    uform_executor_t *executor = argument;
    if (executor->ops->loop_thread_start) executor->ops->loop_thread_start(executor);
    /* The ring is made here, on the only thread that will ever use it. */
    loop_options_t options = {.backend = LOOP_BACKEND_AUTO, .single_issuer = true, .entries = 0};
    int created = loop_create(&options, &executor->loop);
    executor->loop_error = created;
    atomic_store_explicit(&executor->started, created == 0 ? 1u : 2u, memory_order_release);
    futex_wake_all(&executor->started);
    if (created != 0) return NULL;
    while (!atomic_load_explicit(&executor->stopping, memory_order_acquire))
        loop_run(executor->loop, true, executor_spin_ns(executor));
    /* The destroying thread may still be ringing the doorbell (the loop can wake for other reasons
     * and see `stopping` first): the loop is freed only once that thread says it has rung. */
    while (!atomic_load_explicit(&executor->rung, memory_order_acquire))
        futex_wait(&executor->rung, 0);
    loop_destroy(executor->loop);
    executor->loop = NULL;
    return NULL;
}

uform_status_t executor_loop_failure(int error, char const **message) {
    if (error == -ENOMEM) return *message = "no memory for the executor's event loop", UFORM_OUT_OF_MEMORY;
    if (error == -EMFILE || error == -ENFILE)
        return *message = "too many open files for the executor's event loop", UFORM_IO;
    return *message = "cannot create the executor's event loop", UFORM_IO;
}

uform_status_t executor_start_loop(uform_executor_t *executor, char const **message) {
    executor->threaded = true;
    if (pthread_create(&executor->loop_thread, NULL, loop_thread_main, executor) != 0)
        return *message = "cannot start the loop thread", UFORM_OUT_OF_MEMORY;
    uint32_t started;
    while ((started = atomic_load_explicit(&executor->started, memory_order_acquire)) == 0)
        futex_wait(&executor->started, 0);
    if (started != 1) {
        pthread_join(executor->loop_thread, NULL);
        atomic_store_explicit(&executor->started, 0, memory_order_relaxed);
        return executor_loop_failure(executor->loop_error, message);
    }
    return UFORM_OK;
}

/* ---- Lifetime ------------------------------------------------------------------------------------- */

void executor_destroy(uform_executor_t *executor) {
    if (executor->threaded && atomic_load(&executor->started) == 1) {
        atomic_store_explicit(&executor->stopping, true, memory_order_release);
        if (executor_stop_observer) executor_stop_observer(executor);
        loop_wake(executor->loop);
        atomic_store_explicit(&executor->rung, 1, memory_order_release);
        futex_wake_all(&executor->rung);
        pthread_join(executor->loop_thread, NULL);
    } else if (executor->loop) {
        loop_destroy(executor->loop);
    }
    executor_deallocate(executor, executor->scratch, executor->scratch_bytes);
    if (executor->ops->destroy) executor->ops->destroy(executor);
    free(executor);
}

void executor_retain(uform_executor_t *executor) {
    atomic_fetch_add_explicit(&executor->references, 1, memory_order_relaxed);
}

void executor_release(uform_executor_t *executor) {
    if (atomic_fetch_sub_explicit(&executor->references, 1, memory_order_acq_rel) == 1)
        executor_destroy(executor);
}

UFORM_EXPORT uform_status_t uform_executor_info(uform_executor_t const *executor,
                                                uform_executor_info_t *info) {
    static char const entry[] = "uform_executor_info";
    if (!executor || !info) return failed(UFORM_INVALID_ARGUMENT, entry, "executor or info is NULL");
    info->kind = executor->ops->kind;
    info->threads = executor->ops->threads_total ? executor->ops->threads_total(executor) : executor->threads;
    info->domains_count = executor->domains_count;
    info->uring = executor->loop ? loop_backend(executor->loop) == LOOP_BACKEND_URING
                                 : loop_default_backend() == LOOP_BACKEND_URING;
    return UFORM_OK;
}

/* ---- Inline and the calling thread ------------------------------------------------------------- */

UFORM_EXPORT uform_status_t uform_executor_create_inline(uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_inline";
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    *out = executor_new(&inline_ops);
    return *out ? UFORM_OK : failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
}

static pthread_key_t thread_executor_key;
static pthread_once_t thread_executor_once = PTHREAD_ONCE_INIT;
static _Thread_local uform_executor_t *thread_executor;

/* The thread is exiting: no call of its own can be running on its inline executor. */
static void thread_executor_exit(void *executor) {
    executor_release(executor);
}

static void thread_executor_key_create(void) {
    pthread_key_create(&thread_executor_key, thread_executor_exit);
}

uform_executor_t *call_executor(uform_executor_t *executor) {
    if (executor) return executor;
    if (thread_executor) return thread_executor;
    pthread_once(&thread_executor_once, thread_executor_key_create);
    thread_executor = executor_new(&inline_ops);
    /* Freed when the thread exits; the main thread's lives as long as the process. */
    if (thread_executor) pthread_setspecific(thread_executor_key, thread_executor);
    return thread_executor;
}

/* ---- Forks ---------------------------------------------------------------------------------------- */

void executor_for_threads(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                          void *context) {
    if (executor->ops->for_threads)
        executor->ops->for_threads(executor, work, context);
    else
        work(context, 0);
}

/* ---- Memory placement --------------------------------------------------------------------------- */

void *executor_host_allocate(size_t bytes) {
    if (bytes > SIZE_MAX - 63) return NULL;
    return aligned_alloc(64, round_up_64(bytes));
}

void *executor_allocate(uform_executor_t *executor, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (executor && executor->ops->allocate) return executor->ops->allocate(executor, bytes);
    return executor_host_allocate(bytes);
}

void executor_deallocate(uform_executor_t *executor, void *memory, size_t bytes) {
    if (!memory) return;
    if (executor && executor->ops->deallocate) {
        executor->ops->deallocate(executor, memory, bytes ? bytes : 1);
        return;
    }
    free(memory);
}

void *executor_device_allocate(uform_executor_t *executor, size_t bytes) {
    executor_device_ops_t const *device = &executor->ops->device;
    return device->allocate ? device->allocate(executor, bytes) : NULL;
}

void executor_device_deallocate(uform_executor_t *executor, void *memory) {
    if (memory && executor->ops->device.deallocate) executor->ops->device.deallocate(executor, memory);
}

uform_status_t executor_device_copy_to_host(uform_executor_t *executor, void *host, size_t host_pitch,
                                            void const *device, size_t device_pitch, size_t width,
                                            size_t rows) {
    executor_device_ops_t const *ops = &executor->ops->device;
    if (!ops->copy_to_host) return UFORM_DEVICE;
    return ops->copy_to_host(executor, host, host_pitch, device, device_pitch, width, rows);
}

void *executor_scratch(uform_executor_t *executor, size_t bytes) {
    if (executor->scratch_bytes >= bytes) return executor->scratch;
    /* Grow by half again, so that slowly growing batches settle after a few calls. */
    size_t grown = bytes + bytes / 2;
    void *scratch = executor_allocate(executor, grown);
    if (!scratch) return NULL;
    executor_deallocate(executor, executor->scratch, executor->scratch_bytes);
    executor->scratch = scratch;
    executor->scratch_bytes = grown;
    return scratch;
}
