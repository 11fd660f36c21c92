/* UForm: a multimodal embedding engine. The whole public C interface.
 *
 * One model maps texts, images, video clips and sounds into one embedding space. Every verb is a
 * submission to an executor's event loop, and every verb can run three ways through one calling
 * convention:
 *
 *   - on the calling thread:       `args.executor = NULL`, `args.outcome = NULL`;
 *   - blocking on an executor:     `args.executor = e`,    `args.outcome = NULL`;
 *   - deferred on an executor:     `args.executor = e`,    `args.outcome = o`: the function returns as
 *                                  soon as the call is submitted, and `o` says the rest.
 *
 * A blocking call is literally submit-then-wait on an outcome of its own. Validation that needs no
 * I/O happens before submission, so a bad argument fails at once with the same status whichever
 * receiver was chosen; with an outcome, that outcome is then already final with the same status.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *   - Statuses: every fallible function answers a `uform_status_t`. A failure also records a
 *     `uform_error_t` (status, entry point, message) readable with `uform_last_error` on the thread
 *     that got it, and, for verbs with an outcome, with `uform_outcome_error`; how long its strings
 *     live is said once, at uform_error_t.
 *   - Ownership: the caller owns every input; the engine reads inputs only until the call is final
 *     (blocking: until the function returns; deferred: until the outcome is final). Handles returned
 *     through `**` arguments are owned by the caller and released with their `_free` function.
 *   - Threads: handles are not locked; an executor runs one call at a time and answers
 *     `UFORM_CONTENDED` to a second one; a model may be used by several executors at once.
 *   - Nothing in the library calls abort() or exit(), and bad input leaves every other item, the
 *     model, the executor and the arena usable.
 *
 * A verb this build lacks (a feature not found, or a kind of executor or model it does not run on)
 * validates its arguments and then answers `UFORM_UNSUPPORTED`, as its comment says.
 *
 * The design behind this interface (the execution model, the model and checkpoint format, the numerics
 * every implementation agrees on) is docs/DESIGN.md in the source tree, installed as
 * share/doc/uform/DESIGN.md. */
#ifndef UFORM_H
#define UFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(UFORM_BUILDING)
#define UFORM_EXPORT __attribute__((visibility("default")))
#else
#define UFORM_EXPORT
#endif

#define UFORM_VERSION_MAJOR 4
#define UFORM_VERSION_MINOR 0
#define UFORM_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------------- */
/* Statuses and errors                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* One enumeration shared by every layer. Values are stable across versions. */
typedef enum uform_status {
    UFORM_OK = 0,
    UFORM_PENDING = 1,          /* an outcome whose call is not final yet; never a final status */
    UFORM_CANCELLED = 2,        /* a progress handler answered UFORM_CANCEL */
    UFORM_CONTENDED = 3,        /* the executor (or arena) is held by another call */
    UFORM_INVALID_ARGUMENT = 4, /* a bad argument, a stale view, offsets out of order, ... */
    UFORM_IO = 5,               /* a file could not be opened, read or written */
    UFORM_FORMAT = 6,           /* a checkpoint, image, clip or sound is malformed */
    UFORM_OUT_OF_MEMORY = 7,    /* host or device memory, or threads, could not be had */
    UFORM_DEVICE = 8,           /* no such device, a device fault, or a host accessor on device memory */
    UFORM_UNSUPPORTED = 9,      /* not built in, a tower the model lacks, an executor it does not run on */
    UFORM_INTERNAL = 10,        /* an invariant of the engine broke: please report it */
    UFORM_MISSING_SYMBOL = 11,  /* bindings only: the loaded library lacks an entry point */
} uform_status_t;

/* The short lowercase name of a status: "ok", "io", "format", ...; "unknown" for other values.
 * Static storage; never fails. */
UFORM_EXPORT char const *uform_status_name(uform_status_t status);

/* The bytes a failure's message holds at most, its NUL included; a longer one is cut there. */
#define UFORM_ERROR_MESSAGE_SIZE 160

/* A failure: its status, the public entry point that failed, and a message. Nothing is ever allocated
 * to report an error. Lifetimes:
 *   - `entry` has static storage;
 *   - `message` is a copy of the engine's, never a pointer into a handle, so it outlives the handle
 *     that failed (a trainer freed after its failed step) and every later call on that handle. The
 *     copy of uform_last_error lives in a thread-local buffer of UFORM_ERROR_MESSAGE_SIZE bytes: it
 *     holds until the next failure recorded on the same thread (that failure overwrites it) and ends
 *     with the thread. The copy of uform_outcome_error lives in the outcome: it holds until the outcome
 *     is given its next call, initialized again or destroyed. Copy the text to keep it longer. */
typedef struct uform_error {
    uform_status_t status;
    char const *entry;   /* "uform_model_load_ram"; never NULL */
    char const *message; /* "cannot open checkpoint"; never NULL, NUL-terminated */
} uform_error_t;

/* The last failure recorded on the calling thread (status UFORM_OK with empty strings if none), its
 * message in the thread's buffer (see uform_error_t). A successful call does not clear it.
 * Thread-local; never fails. */
UFORM_EXPORT uform_error_t uform_last_error(void);

/* Renders `UForm: io [uform_model_load_ram]: cannot open checkpoint` into `buffer` (NUL-terminated,
 * truncated to `capacity`). Answers the length the full text needs, excluding the NUL, as snprintf. */
UFORM_EXPORT size_t uform_error_render(uform_error_t const *error, char *buffer, size_t capacity);

/* ---------------------------------------------------------------------------------------------- */
/* The library                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* Optional features this build has. A missing one turns its verbs into UFORM_UNSUPPORTED. */
typedef enum uform_feature {
    UFORM_FEATURE_URING = 1u << 0,      /* io_uring loop backend (liburing) */
    UFORM_FEATURE_HWLOC = 1u << 1,      /* topology, NUMA domains, pinning (hwloc) */
    UFORM_FEATURE_JPEG = 1u << 2,       /* libjpeg-turbo */
    UFORM_FEATURE_SPNG = 1u << 3,       /* libspng */
    UFORM_FEATURE_FFMPEG = 1u << 4,     /* video and audio decoding */
    UFORM_FEATURE_CUDA = 1u << 5,       /* VRAM executors */
    UFORM_FEATURE_NCCL = 1u << 6,       /* device collectives */
    UFORM_FEATURE_MPI = 1u << 7,        /* mesh bootstrap, host collectives */
    UFORM_FEATURE_MICROHTTPD = 1u << 8, /* the embedding server */
    UFORM_FEATURE_FORK_UNION = 1u << 9, /* executors over fork_union pools */
    UFORM_FEATURE_TOKENIZERS = 1u << 10, /* tokenizer.json files (utf8proc and Oniguruma) */
    UFORM_FEATURE_SENTENCEPIECE = 1u << 11, /* SentencePiece .model files (libsentencepiece) */
} uform_feature_t;

/* A bitwise OR of uform_feature_t. Never fails. */
UFORM_EXPORT uint32_t uform_features(void);

/* The library's version, for bindings that load it at run time. Never fails. */
UFORM_EXPORT void uform_version(int *major, int *minor, int *patch);

/* The CPU kernel path this process computes on ("scalar", "avx2", "avx512bf16", "amx", "neon", ...), with,
 * as static strings where the pointers are not NULL: in *reason why it was chosen, in *amx whether Intel
 * AMX's tiles are used and why not ("amx: enabled", "amx: not on this CPU (...)", "amx: not enabled by the OS
 * (...)" or "amx: refused by the kernel (errno N: ...)", then the next path is used). Chosen once, on the
 * first call or the first use of the kernels, and kept for the process: the path UFORM_KERNELS names when
 * this CPU and build run it (reason "UFORM_KERNELS"), else a fixed rule over the CPU's vendor and features
 * whose exceptions measurements justify, never a timing of its own, so that every process on one machine
 * writes the same bits (docs/DESIGN.md, "Kernels"); on x86-64 Linux with AMX the first choice asks the kernel
 * for the tiles. Thread-safe; never fails. */
UFORM_EXPORT char const *uform_kernels(char const **reason, char const **amx);

/* ---------------------------------------------------------------------------------------------- */
/* Outcomes                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

/* An outcome is caller-owned memory of this size and alignment, holding a 32-bit status word (pending,
 * then one final status), the failure if any, and what the call produced. It must stay at the same
 * address while its call is pending. Nothing is allocated per call. */
#define UFORM_OUTCOME_SIZE      768
#define UFORM_OUTCOME_ALIGNMENT 64
typedef struct uform_outcome {
    _Alignas(UFORM_OUTCOME_ALIGNMENT) unsigned char opaque[UFORM_OUTCOME_SIZE];
} uform_outcome_t;

/* Prepares an outcome for its first call: no notification, status UFORM_OK, no products. An outcome
 * is reused by passing it to another call once final; its notification targets are kept. Never fails. */
UFORM_EXPORT void uform_outcome_init(uform_outcome_t *outcome);

/* Waits for a pending call (as uform_outcome_wait), then forgets the outcome; the memory may then be
 * freed or reused after uform_outcome_init. Products not yet taken (a loaded model) are released. */
UFORM_EXPORT void uform_outcome_destroy(uform_outcome_t *outcome);

/* The status word, read without blocking: UFORM_PENDING, or the final status. Never blocks. */
UFORM_EXPORT uform_status_t uform_outcome_status(uform_outcome_t const *outcome);

/* Blocks until the call is final (briefly spinning, then a futex on Linux, os_sync_wait_on_address on
 * macOS 14.4 and later, a condition variable elsewhere) and answers its final status; a
 * failure is also recorded as the calling thread's last error. May be asked any number of times from
 * any number of threads. Answers at once for a final outcome; UFORM_INVALID_ARGUMENT for a NULL or
 * uninitialized one. */
UFORM_EXPORT uform_status_t uform_outcome_wait(uform_outcome_t *outcome);

/* The failure of a final outcome (status UFORM_OK and empty strings for a success; UFORM_PENDING while
 * pending), its message the outcome's own copy (see uform_error_t). Never blocks. */
UFORM_EXPORT uform_error_t uform_outcome_error(uform_outcome_t const *outcome);

/* Notification of an external loop when the outcome turns final, set before submission and kept for
 * later calls on the same outcome. The status word is final before the notification is sent, so the
 * notified loop can read it at once.
 *
 * `eventfd`: a descriptor that becomes readable, for a poll(2), epoll or kqueue loop to watch: the
 * engine writes the 8 bytes of a uint64_t 1 to it each time the outcome turns final; -1 turns it off.
 * On Linux, an eventfd(2): its counter grows by 1, and one 8-byte read resets it. On macOS and other
 * systems without eventfd, the write end of a pipe(2) whose read end the loop watches: each
 * notification is 8 bytes to read away. Make a pipe's write end non-blocking (O_NONBLOCK): a full
 * pipe is readable already, and the engine then drops the notification instead of waiting. The write
 * comes just after the status turns final: a caller that learns of it otherwise (uform_outcome_wait or
 * _status) keeps the descriptor open until the notification has arrived, lest the write land in a
 * descriptor reused meanwhile.
 * Answers UFORM_OK, or UFORM_INVALID_ARGUMENT for a NULL outcome.
 *
 * `ring_fd`: a completion {user_data, res = final status} is posted into that io_uring with
 * IORING_OP_MSG_RING; -1 turns it off. Answers UFORM_OK, UFORM_INVALID_ARGUMENT, or UFORM_UNSUPPORTED
 * when io_uring is not available in this process (always outside Linux). A failed post (a ring closed
 * meanwhile) does not change the outcome's status. */
UFORM_EXPORT uform_status_t uform_outcome_notify_eventfd(uform_outcome_t *outcome, int eventfd);
UFORM_EXPORT uform_status_t uform_outcome_notify_ring(uform_outcome_t *outcome, int ring_fd,
                                                      uint64_t user_data);

/* ---------------------------------------------------------------------------------------------- */
/* Progress handlers and continuations                                                            */
/* ---------------------------------------------------------------------------------------------- */

typedef enum uform_continuation {
    UFORM_CONTINUE = 0,
    UFORM_CANCEL = 1, /* the call ends with UFORM_CANCELLED once in-flight work drains */
} uform_continuation_t;

/* Called on the executor's loop thread between completions, `steps` times over a call (or fewer when
 * the work has fewer units), with `completed` of `total` units done (bytes for loads, items for
 * encodes, batches for training). It must not call into the engine on the same executor. */
typedef uform_continuation_t (*uform_progress_handler_t)(void *state, size_t completed, size_t total);

typedef struct uform_progress {
    uform_progress_handler_t handler; /* NULL: no progress reports */
    void *state;                      /* passed through; must outlive the call */
    size_t steps;                     /* 0 takes 100 */
} uform_progress_t;

/* ---------------------------------------------------------------------------------------------- */
/* Executors                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

/* An executor owns where a call runs and one event loop. It runs one call at a time: a call finding
 * another one holding it finishes at once with UFORM_CONTENDED. Freeing an executor with a call in
 * flight waits for that call; arenas and models made on it keep it alive until they are freed. */
typedef struct uform_executor uform_executor_t;

typedef enum uform_executor_kind {
    UFORM_EXECUTOR_INLINE = 0, /* the calling thread */
    UFORM_EXECUTOR_RAM = 1,    /* worker threads of its own, pinned, over NUMA domains */
    UFORM_EXECUTOR_POOL = 2,   /* a caller's thread pool */
    UFORM_EXECUTOR_VRAM = 3,   /* one host thread, one CUDA stream per device */
} uform_executor_kind_t;

typedef enum uform_mood {
    UFORM_SLEEPING = 0, /* idle workers sleep (a futex or its stand-in): no CPU, wake-up latency. In
                           either mood, during a call, workers poll a little (200 us) for its next step */
    UFORM_SPINNING = 1, /* idle workers poll: until the next call after a drain, `spin_ns` after a call */
} uform_mood_t;

/* Creates an executor with no threads: every call handed to it, blocking or deferred, runs to
 * completion on the calling thread, so a deferred call's outcome is final when the verb returns.
 * Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL), UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_executor_create_inline(uform_executor_t **executor);

typedef struct uform_ram_options {
    size_t const *domains; /* NUMA node indices (hwloc logical) to run and place memory on; NULL: all */
    size_t domains_count;
    size_t threads;   /* 0 takes 7/8 of the cores in the domains, at least 1 */
    uint64_t spin_ns; /* how long idle workers poll in UFORM_SPINNING; 0 takes 100 ms */
    bool pin;         /* pin each thread to one core (needs hwloc); the default options pin */
} uform_ram_options_t;

/* The defaults: every domain, threads = 0, spin 100 ms, pinned, sleeping. */
UFORM_EXPORT uform_ram_options_t uform_ram_options_default(void);
/* The same defaults written through a pointer, for bindings whose FFI cannot take a structure returned
 * by value (Mojo 1.2's external_call). Does nothing for NULL. */
UFORM_EXPORT void uform_ram_options_init(uform_ram_options_t *options);

/* Creates an executor of `threads` worker threads; the first one also runs the executor's loop. Memory
 * it hands out (arenas, model weights) is bound to its domains. `options` may be NULL for defaults.
 * May block while the threads start. With hwloc, the machine's topology is loaded by the first RAM
 * executor that succeeds and shared by every later one for the rest of the process (a failed load keeps
 * nothing: the next creation tries again); that first load runs inside hwloc, whose own handling of a
 * failed allocation there the engine cannot check (hwloc 2.9 may dereference NULL), so a process that
 * must survive allocation failure creates its first RAM executor early. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT (no such domain, NULL executor), UFORM_UNSUPPORTED (domains asked without
 * hwloc), UFORM_OUT_OF_MEMORY (memory or threads, or hwloc out of memory loading the topology), UFORM_IO
 * (the loop could not be created, or hwloc could not read the topology). */
UFORM_EXPORT uform_status_t uform_executor_create_ram(uform_ram_options_t const *options,
                                                      uform_executor_t **executor);

/* A thread pool of the caller's, for executors that must start no threads of their own. */
typedef struct uform_pool_vtable {
    /* The number of threads `for_threads` runs on, the calling one included. */
    size_t (*count_threads)(void *pool);
    /* Runs `work(context, thread)` once for every thread in [0, count_threads) and returns when all
     * have returned. Called from the thread that runs the call. */
    void (*for_threads)(void *pool, void (*work)(void *context, size_t thread), void *context);
} uform_pool_vtable_t;

/* Creates an executor over a caller's pool. It starts no thread, so, like the inline executor, a call
 * runs its loop on the calling thread and fans compute out through `for_threads`; a deferred call's
 * outcome is final when the verb returns. The vtable and pool must outlive the executor.
 * Answers UFORM_OK, UFORM_INVALID_ARGUMENT, UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_executor_create_pool(uform_pool_vtable_t const *vtable, void *pool,
                                                       uform_executor_t **executor);

/* The same over a fork_union `fu_pool_t *` (fork_union 2.x C interface): calls fan out through
 * fu_pool_for_threads; the pool must outlive the executor. Answers UFORM_OK, UFORM_INVALID_ARGUMENT
 * (NULL pool or executor), UFORM_OUT_OF_MEMORY, UFORM_UNSUPPORTED (a build without fork_union). */
UFORM_EXPORT uform_status_t uform_executor_create_fork_union(void *fu_pool, uform_executor_t **executor);

typedef struct uform_vram_options {
    size_t const *devices; /* CUDA device ordinals; NULL: device 0 */
    size_t devices_count;
} uform_vram_options_t;

/* Creates an executor with one host thread and one CUDA stream per device. `options` may be NULL for
 * device 0. The first VRAM executor of a process opens the NVIDIA driver (libcuda.so.1), the CUDA runtime
 * and cuBLASLt the build found (a process that makes none maps none of them). May block while they load
 * and the devices start. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL executor, NULL devices with a
 * count, more than 16 devices, a device listed twice), UFORM_UNSUPPORTED (a build without CUDA),
 * UFORM_DEVICE (the driver, the runtime or cuBLASLt missing, named in the message; no device, no such
 * device, a stream, event or cuBLASLt handle that cannot be made), UFORM_OUT_OF_MEMORY, UFORM_IO (the
 * loop could not be created). */
UFORM_EXPORT uform_status_t uform_executor_create_vram(uform_vram_options_t const *options,
                                                       uform_executor_t **executor);

/* Releases the caller's reference. Waits for a call in flight (blocking, with no timeout), then stops
 * and joins the threads once no arena or model still refers to the executor. NULL is ignored. */
UFORM_EXPORT void uform_executor_free(uform_executor_t *executor);

/* Waits until no call holds the executor, then leaves idle workers in `mood` for later calls.
 * UFORM_SPINNING: the workers and the loop thread poll from now until the next call begins (or a drain
 * into UFORM_SLEEPING), so that call starts without a wake-up; the cost is one busy core per thread of
 * the executor for as long as it lasts. After each call they poll for the executor's `spin_ns`, then
 * sleep. UFORM_SLEEPING: idle threads sleep at once, using no CPU. Blocks. Answers UFORM_OK or
 * UFORM_INVALID_ARGUMENT. */
UFORM_EXPORT uform_status_t uform_executor_drain(uform_executor_t *executor, uform_mood_t mood);

typedef struct uform_executor_info {
    uform_executor_kind_t kind;
    size_t threads;       /* threads a call fans out to (1 for inline) */
    size_t domains_count; /* NUMA domains it runs on (0 when unknown) */
    bool uring;           /* its loop runs on io_uring (false: the portable backend) */
} uform_executor_info_t;

/* Never blocks. Answers UFORM_OK or UFORM_INVALID_ARGUMENT. */
UFORM_EXPORT uform_status_t uform_executor_info(uform_executor_t const *executor,
                                                uform_executor_info_t *info);

/* The empty verb: one trip through the executor's loop, after at least `delay_ns` (a ring timer) when
 * it is not 0. For health checks, latency benchmarks and tests of contention. Answers UFORM_OK,
 * UFORM_CONTENDED, UFORM_INVALID_ARGUMENT. */
typedef struct uform_executor_nop_args {
    uform_executor_t *executor; /* NULL: the calling thread */
    uint64_t delay_ns;
    uform_outcome_t *outcome; /* NULL: blocking */
} uform_executor_nop_args_t;
UFORM_EXPORT uform_status_t uform_executor_nop(uform_executor_nop_args_t const *args);

/* ---------------------------------------------------------------------------------------------- */
/* Arenas and views                                                                               */
/* ---------------------------------------------------------------------------------------------- */

/* An arena holds every output whose size only the call knows. Each call rewinds the arena it is given
 * and bumps its generation, so the views of the previous call die; a steady loop allocates once
 * (growth during a call adds blocks and never moves what was written; the next rewind coalesces).
 * An arena is used by one call at a time (a second finds UFORM_CONTENDED) and keeps its executor
 * alive. */
typedef struct uform_arena uform_arena_t;

/* An arena placed where `executor` computes: host pages bound to a RAM executor's domains, or device
 * memory for a VRAM executor (serving only that executor's calls). Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT, UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_arena_create(uform_executor_t *executor, uform_arena_t **arena);

/* An arena of host pages for the calling thread alone: serves calls of any host executor. Answers
 * UFORM_OK, UFORM_INVALID_ARGUMENT (NULL), UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_arena_create_host(uform_arena_t **arena);

/* Reserves `bytes` now so that the first calls need no growth. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT, UFORM_CONTENDED (a call holds the arena), UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_arena_reserve(uform_arena_t *arena, size_t bytes);

/* Bytes the arena holds now; 0 for NULL. Never blocks. */
UFORM_EXPORT size_t uform_arena_capacity(uform_arena_t const *arena);

/* The arena's generation, bumped by every call that rewinds it; 0 for NULL. Never blocks. */
UFORM_EXPORT uint64_t uform_arena_generation(uform_arena_t const *arena);

/* Frees the arena; views into it must not be used after. Waits for a pending call that writes into it.
 * NULL is ignored. */
UFORM_EXPORT void uform_arena_free(uform_arena_t *arena);

typedef enum uform_scalar {
    UFORM_F32 = 0,
    UFORM_BF16 = 1,
    UFORM_F16 = 2,
    UFORM_I8 = 3,  /* scaled per row: value = q * scale, with the scale in `scales` */
    UFORM_U32 = 4, /* unsigned 32-bit integers: token ids and byte offsets */
} uform_scalar_t;

/* Size in bytes of one scalar of a kind (0 for an unknown kind). Never fails. */
UFORM_EXPORT size_t uform_scalar_size(uform_scalar_t scalar);

/* A matrix of `rows` x `columns` scalars in an arena, row-major. When `item_offsets` is not NULL the
 * rows are grouped per item (token vectors, choice probabilities): item i owns rows
 * [item_offsets[i], item_offsets[i + 1]). A view is valid until its arena is rewound by the next call
 * (its generation changes) or freed. */
typedef struct uform_view {
    void *data;                 /* rows * row_stride bytes; device memory for device arenas */
    float const *scales;        /* I8 only: one scale per row, else NULL */
    size_t const *item_offsets; /* items + 1 host offsets, or NULL for one row per item */
    size_t rows;
    size_t columns;
    size_t items;
    size_t row_stride; /* bytes between rows */
    uform_scalar_t scalar;
    bool device;
    uform_arena_t *arena;
    uint64_t generation;
} uform_view_t;

/* UFORM_OK while the view is readable from the host; UFORM_INVALID_ARGUMENT once stale (or NULL);
 * UFORM_DEVICE for a view of device memory. Never blocks. */
UFORM_EXPORT uform_status_t uform_view_check(uform_view_t const *view);

/* The address of row `row` for host reading, after the same checks as uform_view_check, plus
 * UFORM_INVALID_ARGUMENT for a row out of range. */
UFORM_EXPORT uform_status_t uform_view_row(uform_view_t const *view, size_t row, void const **data);

/* Copies a view's rows into host memory, from device memory (views of VRAM arenas) or host memory
 * alike: `data` receives rows * columns scalars, packed row after row, and `scales` (I8 views only;
 * ignored otherwise) one F32 per row. Blocks until copied. Answers UFORM_OK, UFORM_INVALID_ARGUMENT
 * (a NULL or stale view, NULL data, `capacity` bytes too few, NULL scales for an I8 view),
 * UFORM_DEVICE (the copy failed). */
UFORM_EXPORT uform_status_t uform_view_copy(uform_view_t const *view, void *data, size_t capacity,
                                            float *scales);

/* ---------------------------------------------------------------------------------------------- */
/* Tapes                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

/* Every list input: items end to end plus `count + 1` offsets, in elements of the tape (bytes for
 * texts, paths and encoded files; F32 samples for sounds; RGB8 bytes for pixels). Item i spans
 * [offsets[i], offsets[i + 1]). Offsets must be non-decreasing ("offsets out of order") and at most
 * `length` ("offsets past the end of the tape"), else UFORM_INVALID_ARGUMENT; offsets[0] need not be
 * 0. `data` may be host or device memory (classified through the CUDA driver where present);
 * `offsets` are host memory. */
typedef struct uform_tape {
    void const *data;
    size_t const *offsets;
    size_t count;  /* items */
    size_t length; /* elements `data` holds */
} uform_tape_t;

/* ---------------------------------------------------------------------------------------------- */
/* Models                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* A model owns its weights (BF16, as the checkpoint stores them, or I8 where it stores or asks for them),
 * placed where the executor that loaded it computes. It may be used by any number of executors of its
 * residency at once; a call keeps it alive until final. */
typedef struct uform_model uform_model_t;

/* The weights of the transformer blocks' linear layers (attn.qkv, attn.out, mlp.up, mlp.down of every
 * tower) on host executors. I8 weights are one int8 per weight with an F32 scale per output row
 * (symmetric: w = q * scale), and the activations each such layer reads are quantized per row as it
 * runs (8 bits with a zero point): about half the memory and, where the CPU has an 8-bit dot product
 * (AVX512-VNNI, AVX-VNNI, Arm's SDOT or SMMLA), about twice the multiply-adds a second of BF16. Their
 * embeddings agree with the BF16 weights' to a cosine of about 0.999 (docs/DESIGN.md gives the
 * measurements). Norms, embeddings, positions, the patch layers and the projections stay BF16; so does a
 * layer of more than 65536 inputs. */
typedef enum uform_weights {
    UFORM_WEIGHTS_STORED = 0, /* as the checkpoint stores each layer: BF16, or I8 with its scales */
    UFORM_WEIGHTS_BF16,       /* BF16: I8 layers widened, q * scale rounded to BF16 */
    UFORM_WEIGHTS_I8,         /* I8: BF16 layers quantized as they load, as uform_checkpoint_quantize does */
} uform_weights_t;

typedef struct uform_load_config {
    uform_progress_t progress; /* completed and total are bytes of tensor data */
    bool map; /* mmap the file instead of reading it through the ring: the weights stay in the page
                 cache, and the file must not shrink while the model lives (the kernel would answer
                 a read past its end with SIGBUS) */
    uform_weights_t weights; /* host loads; uform_model_load_vram answers UFORM_UNSUPPORTED for I8 weights,
                                asked or stored */
} uform_load_config_t;

typedef struct uform_model_load_args {
    uform_executor_t *executor;        /* where the weights go and the reads run; NULL: the calling thread */
    char const *path; /* a format-4 safetensors checkpoint, or a pretrained model's folder (or, where no
                         such file or folder exists, a hub id: uform_hub_folder); read until the call is
                         final */
    uform_load_config_t const *config; /* NULL: defaults */
    uform_model_t **model;    /* blocking calls: receives the model; deferred: see uform_outcome_model */
    uform_outcome_t *outcome; /* NULL: blocking */
} uform_model_load_args_t;

/* Loads a checkpoint into host memory: opens, stats and reads it through the executor's loop,
 * validating the header (JSON, dtypes, shapes, offsets, each tensor's data aligned to its dtype in the
 * file, the format-4 metadata and the ranges of its numbers, every tensor each tower needs) before
 * reading any tensor byte. Reports progress in bytes; a handler answering UFORM_CANCEL ends the call
 * with UFORM_CANCELLED once in-flight reads drain, freeing everything. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT, UFORM_CONTENDED, UFORM_IO (cannot open or read), UFORM_FORMAT (any
 * malformation), UFORM_OUT_OF_MEMORY (memory, jansson's parsing the header included), UFORM_CANCELLED.
 * Outside the engine's control: jansson 2.14, when growing its token buffer fails, drops the byte and
 * parses on (a header that then fails validation as FORMAT, or a heap overflow inside jansson when the
 * byte was a string's closing quote). */
UFORM_EXPORT uform_status_t uform_model_load_ram(uform_model_load_args_t const *args);

/* The folder of a model in the local cache that Hugging Face's hub libraries (huggingface_hub,
 * transformers, sentence-transformers) download into, found as huggingface_hub finds it offline
 * (snapshot_download(id, revision=REVISION, local_files_only=True)); never downloads. `id` is NAME or
 * OWNER/NAME ("sentence-transformers/all-MiniLM-L6-v2"), then "@REVISION" for another revision than main:
 * a branch or tag (the commit its refs/ file names) or a commit's 40 hex digits. The cache is
 * $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub (a leading "~/" read as $HOME; other variables in them are not expanded).
 * Copies the snapshot folder's path into `folder` (`capacity` bytes, NUL-terminated), its length into
 * `*length`. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (a NULL argument, an `id` that is not one, a path of
 * `capacity` bytes or more), UFORM_IO (not cached: the message names the folder looked in). Blocks for a
 * few stat(2) calls and one small read. uform_model_load_ram and _vram take such an id as their path where
 * no file or folder of that name exists. */
UFORM_EXPORT uform_status_t uform_hub_folder(char const *id, char *folder, size_t capacity, size_t *length);

/* Pretrained models load from their folders as published on the Hugging Face hub, read in place: `path`
 * names the folder, or its hub id in the local cache (uform_hub_folder). Its configuration becomes the
 * block's settings of the one transformer (uform_transformer_info_t), its safetensors weights (F32, F16 or
 * BF16) BF16 tensors of the engine's schema (or I8 with UFORM_WEIGHTS_I8), its tokenizer the model's
 * (tokenizer.json, or a SentencePiece model). Families, each checked against its reference implementation:
 *   - UForm 3 (unum-cloud/uform3-image-text-*: config.json with text_encoder and image_encoder,
 *     text_encoder.safetensors, image_encoder.safetensors): both towers, as PyPI's `uform` 3.1.3 runs them;
 *     register tokens (the large model's) included;
 *   - CLIP (transformers' CLIPModel: model_type "clip"), both towers, transformers' defaults where
 *     config.json is sparse, the image processor's mean and std;
 *   - SigLIP (SiglipModel: model_type "siglip"), both towers: texts padded to the context, the image
 *     tower's attention-pooling head;
 *   - BERT-family sentence embedders (model_type "bert", "roberta", "xlm-roberta", "distilbert", "mpnet":
 *     all-MiniLM-L6-v2, BGE, E5, GTE, multilingual-e5, multi-qa-distilbert, all-mpnet-base-v2), with
 *     sentence-transformers'
 *     modules where the folder has them (Pooling: cls, mean or last token; a Dense module after it, tanh
 *     or not: LaBSE, distiluse; Normalize; max_seq_length), as sentence-transformers 3.0 runs them.
 * Weights may be sharded as transformers saves large models (model.safetensors.index.json and its files).
 * A folder is read on the executor's loop thread (blocking its other calls while it converts); its progress
 * is reported once, when it is read. A folder of another family, or with a setting the engine does not
 * implement, answers UFORM_UNSUPPORTED naming it; a damaged one UFORM_FORMAT or UFORM_IO naming the file and
 * the fault. uform_checkpoint_convert writes a folder as one checkpoint, which loads faster and to the same
 * embeddings. */

/* The same into device memory of a VRAM executor: the statuses of uform_model_load_ram, plus
 * UFORM_INVALID_ARGUMENT for an executor that is not a VRAM one, UFORM_DEVICE for a device that fails,
 * and UFORM_UNSUPPORTED in builds without CUDA (after checking the path). Of a pretrained family's folder
 * or converted checkpoint it places the text towers that read tokens (MPNet's bias by relative position
 * included) and the image towers (every family's: CLIP's, SigLIP's, UForm 3's), and towers with the
 * engine's own settings; the verbs of a tower it does not place (an image tower pooled by the mean) answer
 * UFORM_UNSUPPORTED naming the setting it lacks, and a model with no tower it places is refused so at load;
 * image_encode_pixels of a model with Pillow's resampling, register tokens or the attention-pooling head
 * prepares the pixels on the host, as image files are, and answers UFORM_UNSUPPORTED for pixels in device
 * memory (docs/DESIGN.md, "Pretrained families on VRAM executors"). */
UFORM_EXPORT uform_status_t uform_model_load_vram(uform_model_load_args_t const *args);

/* Takes the model a final, successful load produced: the caller then owns it. Answers NULL if the
 * outcome is pending, failed, held another verb, or its model was already taken. */
UFORM_EXPORT uform_model_t *uform_outcome_model(uform_outcome_t *outcome);

/* Releases the caller's reference; weights are freed once no pending call uses them. NULL is ignored. */
UFORM_EXPORT void uform_model_free(uform_model_t *model);

#define UFORM_MATRYOSHKA_MAX 16

/* The settings of the one transformer block every tower runs, read once as a model loads: the engine's
 * own checkpoints take the first value of each (RMSNorm before each branch, tanh GELU, rotary positions
 * for text), pretrained families the values their reference implementations use. */
typedef enum uform_norm {
    UFORM_NORM_RMS = 0,   /* x / sqrt(mean(x^2) + eps) * weight */
    UFORM_NORM_LAYER = 1, /* (x - mean) / sqrt(var + eps) * weight + bias */
} uform_norm_t;

typedef enum uform_activation {
    UFORM_ACTIVATION_GELU_TANH = 0,  /* 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) */
    UFORM_ACTIVATION_GELU_ERF = 1,   /* 0.5x(1 + erf(x / sqrt 2)): PyTorch's exact GELU */
    UFORM_ACTIVATION_GELU_QUICK = 2, /* x sigmoid(1.702x): CLIP's quick_gelu */
} uform_activation_t;

/* Which states of an item make its embedding. */
typedef enum uform_pooling {
    UFORM_POOLING_LAST = 0,  /* the last position's */
    UFORM_POOLING_FIRST = 1, /* the first position's: a class token */
    UFORM_POOLING_MEAN = 2,  /* the mean over every position, special tokens included */
    UFORM_POOLING_END = 3,   /* the end-of-text token's: the position of the largest token id (CLIP) */
    UFORM_POOLING_HEAD = 4,  /* an attention-pooling head: a learned query over every position, then a
                                residual MLP (SigLIP's vision tower) */
} uform_pooling_t;

/* How an image tower's preprocessing resizes and crops (docs/DESIGN.md, "Image front end"). */
typedef enum uform_image_resize {
    UFORM_RESIZE_SHORT_SIDE = 0, /* the short side to `size`, then the centre crop from floor((out - size) / 2):
                                    the engine's own, and Hugging Face's image processors (CLIP) */
    UFORM_RESIZE_SHORT_SIDE_ROUND_CROP = 1, /* the same, the crop from round((out - size) / 2), halves to
                                               even: torchvision's CenterCrop (UForm 3) */
    UFORM_RESIZE_SQUARE = 2,                /* both sides to `size`, no crop (SigLIP) */
} uform_image_resize_t;

typedef enum uform_image_resample {
    UFORM_RESAMPLE_FLOAT_BILINEAR = 0,  /* the engine's own: antialiased bilinear in float */
    UFORM_RESAMPLE_PILLOW_BICUBIC = 1,  /* Pillow's 8-bit BICUBIC, bit for bit (Pillow 9.4) */
    UFORM_RESAMPLE_PILLOW_BILINEAR = 2, /* Pillow's 8-bit BILINEAR */
} uform_image_resample_t;

typedef struct uform_transformer_info {
    size_t depth, hidden, heads, mlp;
    size_t head;     /* each head's width: hidden / heads (64 in the engine's own checkpoints) */
    uform_norm_t norm;
    float norm_eps;
    bool post_norm;  /* each norm after its branch's residual add (BERT); else before each branch */
    bool input_norm; /* a norm over the input embeddings before the first block (BERT, CLIP's vision) */
    bool final_norm; /* a norm over the last block's states */
    uform_activation_t activation;
    bool rotary;     /* rotary positions inside attention; else learned ones added to the inputs */
    bool causal;     /* each position attends to itself and those before it; else to every position */
    uform_pooling_t pooling;
    bool projection;      /* the pooled state projected to `dims`; else dims == hidden */
    bool projection_bias; /* the projection has a bias (SigLIP's text head) */
    bool class_token;     /* patch towers: a class token before the patches (none in SigLIP's) */
    size_t registers;     /* patch towers: learned register tokens between the class token and the patches,
                             attended to but in no output (UForm 3 large's); 0 for none */
    size_t relative_buckets; /* text towers: a learned bias on each attention score, per head, by the bucket
                                of the query's distance from the key (MPNet's: 32 buckets, 16 each way, exact
                                to 8 and logarithmic to 128), added after the score's scale; 0 for none */
    bool projection_tanh;    /* text towers: the projection (with its bias) followed by tanh, as
                                sentence-transformers' Dense module runs it (LaBSE's, distiluse's) */
} uform_transformer_info_t;

typedef struct uform_model_info {
    size_t dims; /* the shared embedding width */
    size_t matryoshka[UFORM_MATRYOSHKA_MAX];
    size_t matryoshka_count; /* ascending widths, each a valid embedding prefix */
    size_t parameters;       /* scalars in every tensor */
    size_t bytes;            /* bytes of tensor data */
    bool has_text, has_image, has_video, has_audio, has_logit;
    struct {
        uform_transformer_info_t transformer;
        size_t context;         /* bytes at most, BOS excluded; tokens at most (special ones included)
                                   where the model reads tokens */
        size_t vocab;           /* 0: the model reads bytes; else token ids below it, cut by its tokenizer */
        size_t positions;       /* learned positions: the table's rows (0 with rotary ones) */
        size_t position_offset; /* the table's row of the first position (2 in RoBERTa's) */
        bool token_type;        /* a token-type row (type 0) added to every input (BERT) */
        bool cut_ids;           /* texts past the context lose their last tokens, special ones included, as
                                   UForm 3's processor cuts them; else truncation keeps the special tokens */
        bool padded;            /* texts padded with pad_id to the context and attended whole, as SigLIP's
                                   were in training */
        size_t pad_id;          /* the padding token; with a position_offset (RoBERTa's), a pad_id token in a
                                   text takes position pad_id and the others count only tokens that are not */
        bool strip;             /* texts lose their leading and trailing whitespace, as Python's str.strip()
                                   (sentence-transformers) */
    } text;
    struct {
        uform_transformer_info_t transformer;
        size_t size, patch; /* square input side and patch side, in pixels */
        float mean[3], std[3];
        uform_image_resize_t resize;
        uform_image_resample_t resample;
    } image;
    struct {
        size_t frames; /* sampled per clip; uses the image tower's weights (a pretrained folder's: 8) */
    } video;
    struct {
        uform_transformer_info_t transformer;
        size_t rate, mels, window, hop, patch_frames, max_patches;
        double seconds;
    } audio;
    uform_weights_t weights; /* the blocks' linear layers as the model runs them: UFORM_WEIGHTS_I8 where they
                                are I8 (stored so, or quantized as they loaded), else UFORM_WEIGHTS_BF16 */
    char family[16]; /* "uform" (the engine's own), or the pretrained family: "bert", "distilbert", ... */
    bool normalized;         /* embeddings are unit vectors as the family's reference gives them */
} uform_model_info_t;

/* Answers UFORM_OK or UFORM_INVALID_ARGUMENT. Never blocks. */
UFORM_EXPORT uform_status_t uform_model_info(uform_model_t const *model, uform_model_info_t *info);

/* ---------------------------------------------------------------------------------------------- */
/* Encoding                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

typedef enum uform_outputs {
    UFORM_OUTPUT_EMBEDDINGS = 1u << 0,    /* one row of `dims` (or the matryoshka width) per item */
    UFORM_OUTPUT_TOKEN_VECTORS = 1u << 1, /* per item, one projected row per kept byte, patch or frame */
    UFORM_OUTPUT_STATES = 1u << 2,        /* per item, the final hidden state (text: the last position) */
} uform_outputs_t;

typedef struct uform_encode_stats {
    size_t items, failed; /* items asked, items whose status is not UFORM_OK */
    size_t bytes;         /* input bytes (text bytes, file bytes, or samples * 4) */
    size_t truncated;     /* texts longer than `context`, clips longer than `seconds` */
    uint64_t read_ns, decode_ns, compute_ns, convert_ns, total_ns; /* time per stage */
} uform_encode_stats_t;

typedef struct uform_encode_config {
    uform_scalar_t outputs_scalar; /* the kind outputs land as; F32 by default */
    size_t matryoshka;             /* 0: full `dims`; else one of the model's matryoshka widths, which
                                      narrows embeddings and token vectors alike */
    uform_progress_t progress;     /* completed and total are items */
    uform_encode_stats_t *stats;   /* written when the call is final; may be NULL */
    bool normalize; /* embeddings as unit vectors even where the model's family gives them unnormalized
                       (uform_model_info_t.normalized false); by default they are as its reference gives
                       them */
    /* Texts of a model that reads tokens: a prompt put before each text, as sentence-transformers does: `prompt`
     * (UTF-8, NUL-terminated) itself, or else the model's prompt named `prompt_name` (its
     * config_sentence_transformers.json's "prompts"; a name it lacks is UFORM_INVALID_ARGUMENT); with neither,
     * the model's default prompt (its "default_prompt_name"), if it has one. "" for either: no prompt. */
    char const *prompt;
    char const *prompt_name;
} uform_encode_config_t;

/* What an encode produced, views into the arena. Unrequested outputs have data == NULL. `statuses`
 * holds one status per item: a failed item's rows are zero and the rest of the batch is encoded. Every
 * verb, whatever its other item statuses: an item whose outputs in host memory would hold a NaN or an
 * infinity (weights that carry it there) fails with UFORM_FORMAT instead; outputs in device memory are
 * not checked. */
typedef struct uform_encoded {
    uform_view_t embeddings, token_vectors, states;
    uform_status_t const *statuses;
    size_t items;
    /* With TOKEN_VECTORS of a model that reads tokens: one row of two U32 per token vector, the bytes
     * [begin, end) of the item's text that the token covers (special, padding and prompt tokens: [0, 0)),
     * grouped by the same item_offsets (host memory). Else empty: rows 0, data NULL. */
    uform_view_t token_spans;
} uform_encoded_t;

/* Reads the products of a final, successful encode outcome. Answers UFORM_OK, UFORM_PENDING, the
 * call's failure, or UFORM_INVALID_ARGUMENT if the outcome held another verb. */
UFORM_EXPORT uform_status_t uform_outcome_encoded(uform_outcome_t const *outcome, uform_encoded_t *encoded);

/* Where encoded media come from. */
typedef enum uform_source {
    UFORM_SOURCE_FILES = 0,  /* the tape holds file paths (bytes, no NUL needed), read through the ring */
    UFORM_SOURCE_MEMORY = 1, /* the tape holds encoded files (JPEG, PNG, MP4, WAV, ...) */
} uform_source_t;

/* Shared by every encode verb. `model` and `arena` are required; `encoded` receives the views of a
 * blocking call (deferred: uform_outcome_encoded). Inputs are read until the call is final. */
#define UFORM_ENCODE_COMMON                                                                                  \
    uform_model_t *model;                                                                                    \
    uform_executor_t *executor; /* NULL: the calling thread */                                               \
    uform_outputs_t outputs;                                                                                 \
    uform_arena_t *arena;                                                                                    \
    uform_encode_config_t const *config; /* NULL: defaults */                                                \
    uform_encoded_t *encoded;                                                                                \
    uform_outcome_t *outcome /* NULL: blocking */

/* Texts. A model whose text tower reads tokens (a pretrained family: uform_model_info_t.text.vocab > 0)
 * cuts each text with its tokenizer, as its reference does: at most `context` tokens with the special ones
 * kept (UForm 3: the ids cut at the context), padded to the context for SigLIP; a text that is not UTF-8
 * fails alone with UFORM_FORMAT. Its EMBEDDINGS are the tower's pooled state (uform_pooling_t), projected
 * where the tower has a projection, unit vectors where the family gives them so (info.normalized) or the
 * config asks (normalize); STATES the pooled state; TOKEN_VECTORS one row per token the tower reads (the
 * special tokens and SigLIP's padding included), grouped per text by item_offsets: its final state,
 * projected and made a unit vector as the embeddings are, with its byte span in token_spans.
 * The engine's own models read bytes, no tokenizer: BOS, then at most `context` bytes of each text (longer
 * ones are cut and counted in stats.truncated; an empty text is valid, BOS alone), packed end to end without
 * padding and split over the executor's threads. EMBEDDINGS: one row per text; TOKEN_VECTORS: one row
 * per kept byte, grouped per text by item_offsets; STATES: the final state of each text's last
 * position, `hidden` wide. Results are bitwise identical whatever the receiver and thread count, and
 * a text's vectors do not depend on the other texts of the batch. A text's only item status is
 * UFORM_FORMAT, for outputs that would not be finite (uform_encoded_t). Progress counts texts, reported
 * between chunks of at most 2048 tokens. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (a NULL or empty
 * tape, offsets out of order or past the tape, an arena of another executor, a bad config),
 * UFORM_CONTENDED (executor or arena held), UFORM_UNSUPPORTED (no text tower), UFORM_OUT_OF_MEMORY,
 * UFORM_CANCELLED. */
typedef struct uform_text_encode_args {
    UFORM_ENCODE_COMMON;
    uform_tape_t texts; /* bytes */
} uform_text_encode_args_t;
UFORM_EXPORT uform_status_t uform_text_encode(uform_text_encode_args_t const *args);

/* Execution of the media verbs (images, clips, sounds). Items go in chunks, one chunk per loop turn;
 * each verb's "Execution" says how large a chunk is and what decoding covers. A chunk's items are
 * decoded, then run through the tower together. On a RAM executor of N >= 2 threads, one worker is lent
 * to decode chunk k + 1 into a second set of patch rows while the loop thread and the other N - 1 run
 * chunk k through the tower (each decoded item posted to the loop as a completion; the worker rejoins
 * the tower's work as soon as it is done); the first chunk, and every chunk on inline, pool and
 * one-thread executors, is decoded on its own turn over every thread. Files are read through the
 * executor's ring two chunks ahead. Results are bitwise identical whatever the receiver and thread
 * count. Progress is reported between chunks. In the stats, read_ns is the time spent waiting for
 * reads not hidden behind compute, and decode_ns counts decoding on turns and on the lent worker alike
 * (so decode_ns + compute_ns may exceed total_ns). */

/* The image verbs. Each image is independent of its batch (bitwise: the same pixels give the same
 * rows whatever the batch, receiver and thread count), and goes through these steps:
 *
 *   - decode (uform_image_encode only), chosen by content, never by file name: JPEG (FF D8 FF) through
 *     libjpeg-turbo with its defaults (accurate integer DCT, smooth chroma upsampling: the pixels
 *     Pillow decodes), PNG (its 8-byte signature) through libspng, any colour type and depth, alpha
 *     dropped, 16-bit samples reduced to their high byte. No gamma, colour profile or EXIF orientation
 *     is applied. Anything else answers UFORM_FORMAT for that item;
 *   - resize, antialiased bilinear, so that the short side is the model's `size` and the long one
 *     floor(long * size / short); per axis, from `in` to `out` samples: scale = in / out, support =
 *     max(scale, 1), output o centred at c = (o + 0.5) * scale averages input samples j in
 *     [max(trunc(c - support + 0.5), 0), min(trunc(c + support + 0.5), in)) with weights
 *     max(0, 1 - |j + 0.5 - c| / support), normalized to sum 1. This is PyTorch's
 *     F.interpolate(mode="bilinear", align_corners=False, antialias=True) and Pillow's
 *     resize(BILINEAR) (half-pixel centres, a triangle filter widened when shrinking), computed in
 *     float without rounding to 8 bits between the horizontal and the vertical pass;
 *   - centre crop to size x size, starting at floor((out - size) / 2) on each axis;
 *   - value = (sample / 255 - mean[c]) / std[c]; patch x patch patches, row-major, each flattened
 *     channel, row, column; the class token first; learned positions; bidirectional attention.
 *
 * Outputs: EMBEDDINGS, one row per image, the projection of the class token's final state; STATES,
 * that state (`hidden` wide); TOKEN_VECTORS, the projections of the (size / patch)^2 patch states,
 * normalized like embeddings, item i owning rows [i * patches, (i + 1) * patches) (`item_offsets`),
 * failed items included.
 *
 * Per-item failure: an item that cannot be encoded gets its status in `encoded.statuses[i]` and zero
 * rows in every output (I8 scales 0) and is counted in stats.failed; the call still answers UFORM_OK
 * and the other items are encoded as if alone. Item statuses: UFORM_INVALID_ARGUMENT (pixels: a span
 * other than heights[i] * widths[i] * 3 bytes, a zero side; files: an empty path or one holding a NUL
 * byte), UFORM_IO (a file that cannot be opened, stat'ed or read, or is not a regular file),
 * UFORM_FORMAT (not JPEG or PNG by content, malformed, truncated, any libjpeg-turbo warning, a CRC error
 * in a critical PNG chunk, an empty file, or past the limits below), UFORM_UNSUPPORTED (a JPEG in a
 * build without libjpeg-turbo, a PNG without libspng, a CMYK or YCCK JPEG), UFORM_OUT_OF_MEMORY.
 *
 * Limits against hostile files, checked against the header's dimensions before any pixel memory is
 * allocated: at most UFORM_IMAGE_MAX_PIXELS decoded pixels per image, at most UFORM_IMAGE_MAX_BYTES per
 * encoded image (a file's size is checked before it is read), and at most 16 MiB of ancillary PNG
 * chunks; progressive JPEGs of more than 500 scans are refused. Pixels handed to
 * uform_image_encode_pixels have no limit beyond the caller's memory.
 *
 * Execution, as "Execution of the media verbs" above: chunks of about 2048 tokens (at least one image
 * per executor thread, at most 64 images), whose images are decoded and resized. Progress counts images.
 * stats.bytes counts pixel bytes, encoded bytes or file bytes read; decode_ns covers decoding and
 * resizing.
 *
 * Call statuses: UFORM_OK, UFORM_INVALID_ARGUMENT (a NULL or empty tape, offsets out of order or past
 * the tape, NULL heights or widths, an unknown source, an arena of another executor, a bad config),
 * UFORM_CONTENDED, UFORM_UNSUPPORTED (no image tower), UFORM_OUT_OF_MEMORY, UFORM_CANCELLED. */
#define UFORM_IMAGE_MAX_PIXELS ((size_t)1 << 26) /* 64 Mi pixels: 192 MiB of RGB8 */
#define UFORM_IMAGE_MAX_BYTES  ((size_t)1 << 28) /* 256 MiB */

/* Images from files (`source` UFORM_SOURCE_FILES: the tape holds paths, without NUL) or encoded images
 * in memory (UFORM_SOURCE_MEMORY: the tape holds the files' bytes), JPEG or PNG. */
typedef struct uform_image_encode_args {
    UFORM_ENCODE_COMMON;
    uform_tape_t images;
    uform_source_t source;
} uform_image_encode_args_t;
UFORM_EXPORT uform_status_t uform_image_encode(uform_image_encode_args_t const *args);

/* Interleaved RGB8 pixels in memory (row-major, 3 bytes per pixel, no padding between rows), item i of
 * heights[i] x widths[i]; `heights` and `widths` hold one value per item. */
typedef struct uform_image_encode_pixels_args {
    UFORM_ENCODE_COMMON;
    uform_tape_t pixels; /* bytes; item i holds heights[i] * widths[i] * 3 */
    size_t const *heights;
    size_t const *widths;
} uform_image_encode_pixels_args_t;
UFORM_EXPORT uform_status_t uform_image_encode_pixels(uform_image_encode_pixels_args_t const *args);

/* Video clips from files (`source` UFORM_SOURCE_FILES: the tape holds paths, without NUL) or encoded clips
 * in memory (UFORM_SOURCE_MEMORY: the tape holds the files' bytes), in any container and codec the
 * FFmpeg libraries of the build know. Each clip goes through these steps, on host executors:
 *
 *   - demux and decode (libavformat, libavcodec) its first video stream that is not cover art. Times
 *     come from that stream's packets: `start` is the smallest packet time (pts, else dts), `end` the
 *     latest end of a packet, its time plus its duration (where the container gives none, the frame
 *     period 1 / average frame rate, else the gap between the two latest packet times), and
 *     duration = end - start;
 *   - sample F = the model's `video.frames` frames: sample k is the frame shown at time
 *     start + (k + 0.5) * duration / F, a frame being shown from its presentation time until the next
 *     frame's (the last until `end`; a time before every frame takes the first). Frames are decoded
 *     sequentially from the start, without seeking, and decoding stops after the last sample; a clip with
 *     fewer frames than F repeats frames by the same rule;
 *   - convert each sample to RGB8 with libswscale at its own size (YUV with the frame's matrix, BT.601
 *     where unspecified, and range; bit-exact mode), ignoring sample aspect ratio, rotation metadata and
 *     interlacing; then each goes through the image tower exactly as uform_image_encode_pixels takes it.
 *
 * Outputs, with f_k the image embedding of sample k at the full `dims` (normalized projection of its
 * class token's final state) and s_k that state:
 *   EMBEDDINGS, one row per clip: e = normalize(mean_k f_k); at a matryoshka width w, the first w values
 *     of e, renormalized (the prefix rule of every embedding);
 *   TOKEN_VECTORS, F rows per clip, clip i owning rows [i * F, (i + 1) * F) (`item_offsets`), failed
 *     clips included: row k is f_k at the output width, what uform_image_encode_pixels answers for that
 *     frame's pixels;
 *   STATES, one row per clip: mean_k s_k (`hidden` wide).
 *
 * Per-item failure, as for images: the item's status in `encoded.statuses[i]`, zero rows, counted in
 * stats.failed, the rest encoded as if alone. Item statuses: UFORM_INVALID_ARGUMENT (an empty path or one
 * holding a NUL byte), UFORM_IO (a file that cannot be opened, stat'ed or read, or is not a regular file),
 * UFORM_FORMAT (an empty file, not a container FFmpeg knows, no video stream (an audio-only file), no
 * frames (a zero-length clip), a demuxer read error other than the end of the file, a packet flagged
 * corrupt, a decoder error (decoders run with AV_EF_EXPLODE; frames flagged corrupt are refused), or past
 * the limits below; a file that simply ends early, where neither its container nor its codec can tell,
 * is encoded from the frames it holds), UFORM_UNSUPPORTED (a codec or pixel format this FFmpeg lacks),
 * UFORM_OUT_OF_MEMORY.
 *
 * Limits against hostile files: at most UFORM_VIDEO_MAX_BYTES per encoded clip (a file's size is
 * checked before it is read, and it is held in memory whole while decoded), at most
 * UFORM_VIDEO_MAX_PACKETS packets demuxed (of every stream) in each of the two passes over a clip (one
 * finds its span, one decodes) and frames decoded, and UFORM_IMAGE_MAX_PIXELS per frame (checked on the
 * stream's parameters and on every frame, and enforced inside the decoders). Nested opens that a
 * demuxer may attempt (playlists, concat lists, image sequences) are refused: a clip reads only its own
 * bytes. FFmpeg's own log messages go through the engine, as for the audio verbs below.
 *
 * Outside the engine's control, for the video and audio verbs alike: FFmpeg does not report every
 * allocation of its own that fails. A demuxer may take one for a malformed file (UFORM_FORMAT for the
 * item) or go on without what it could not allocate (the item encoded from what FFmpeg read), and
 * libswresample keeps a buffer it was growing. Every allocation of the engine's, and every failure FFmpeg
 * reports, answers UFORM_OUT_OF_MEMORY.
 *
 * Execution, as "Execution of the media verbs" above: chunks of about 2048 tokens (F frames of 1 +
 * patches tokens each; at least one clip per executor thread while that stays within 32768 tokens, at
 * least one clip, at most 64 clips). Each clip is decoded on one thread (FFmpeg single-threaded inside),
 * then every frame of the chunk runs through the image tower together. The files of up to three chunks
 * are held in memory whole. Progress counts clips. stats.bytes counts encoded or file bytes; decode_ns
 * covers demuxing, decoding, conversion and resizing.
 *
 * Call statuses: UFORM_OK, UFORM_INVALID_ARGUMENT (as uform_image_encode), UFORM_CONTENDED,
 * UFORM_UNSUPPORTED (no video entry in the model, a build without FFmpeg, a VRAM model: video runs on
 * host executors only), UFORM_OUT_OF_MEMORY, UFORM_CANCELLED. */
#define UFORM_VIDEO_MAX_BYTES   ((size_t)1 << 30) /* 1 GiB */
#define UFORM_VIDEO_MAX_PACKETS ((size_t)1 << 18) /* 262144: over two hours at 30 frames per second */
typedef struct uform_video_encode_args {
    UFORM_ENCODE_COMMON;
    uform_tape_t videos;
    uform_source_t source;
} uform_video_encode_args_t;
UFORM_EXPORT uform_status_t uform_video_encode(uform_video_encode_args_t const *args);

/* The audio verbs. Each clip is independent of its batch (bitwise: the same samples give the same rows
 * whatever the batch, receiver and thread count), and goes through these steps:
 *
 *   - decode (uform_audio_encode only): FFmpeg's libavformat recognizes the format by content, never by
 *     file name, and demuxes the first audio stream; libavcodec decodes it on one thread; libswresample
 *     converts it to F32 and downmixes it to mono as the mean of all channels. Decoding stops once the
 *     samples the model reads are in hand. Demuxers that would open other files or URLs (playlists,
 *     concat lists) are refused. FFmpeg's log is routed through the engine: at the first clip decoded
 *     (audio or video) the engine sets av_log's callback, which is process-wide, once. It prints nothing
 *     unless the environment holds UFORM_LOG=debug, then each of FFmpeg's lines on stderr after
 *     "uform: ffmpeg: ", up to the level av_log_set_level sets (AV_LOG_INFO by default). An application
 *     with its own callback sets it after its first media call, and the engine leaves it in place;
 *   - resample to the model's `rate` with libswresample's defaults (the SWR engine: a windowed-sinc filter
 *     of 32 taps, 1024 phases linearly interpolated, Kaiser window of beta 9, cutoff 0.97 of Nyquist,
 *     exact rational ratios, flushed at the end of the clip), mono F32 in and out: n samples at rate r
 *     give floor(n * rate / r) samples, those produced past the filter's flush being zero. When r equals
 *     `rate` the samples are used as they stand, with no filter;
 *   - cut: the model reads at most reach = min(floor(seconds * rate), window + (max_patches *
 *     patch_frames - 1) * hop) samples; a longer clip is cut there and counted in stats.truncated. Only
 *     the input the reach needs (plus the filter's span) is resampled and, for sounds, decoded;
 *   - log-mel: a periodic Hann window of `window` samples every `hop` samples, no centre padding
 *     (1 + (n - window) / hop frames), the DFT of `window` points through libavutil's FFT (av_tx; by
 *     Bluestein's chirp-z over a power-of-two FFT when `window` is not a power of two), the unscaled power
 *     spectrum of bins 0 .. window / 2 (bin k at k * rate / window Hz), `mels` triangular filters of peak
 *     1 whose mels + 2 edges are spaced evenly in HTK mel, 2595 log10(1 + hz / 700), over 0 .. rate / 2,
 *     then log10(max(mel, 1e-10));
 *   - patches of `patch_frames` consecutive frames of every band, flattened frame-major (frame * mels +
 *     band), trailing frames dropped, at most max_patches; the class token first, with row 0 of
 *     audio.pos, and row j + 1 added to patch j; bidirectional attention.
 *
 * Outputs: EMBEDDINGS, one row per clip, the projection of the class token's final state; STATES, that
 * state (`hidden` wide); TOKEN_VECTORS, the projections of the clip's patch states, normalized like
 * embeddings and packed: item i owns rows [item_offsets[i], item_offsets[i + 1]), one per patch, none for
 * a failed item. The arena holds room for the most patches each clip could have (max_patches for each
 * encoded sound).
 *
 * Per-item failure, as with the image verbs: the status in `encoded.statuses[i]`, zero embedding and
 * state rows (I8 scales 0), no token vector, counted in stats.failed; the call still answers UFORM_OK.
 * Item statuses: UFORM_INVALID_ARGUMENT (samples: a NaN or infinite sample anywhere in the item, more
 * than UFORM_AUDIO_MAX_SAMPLES samples, fewer samples at the model's rate than one patch spans, window +
 * (patch_frames - 1) * hop; files: an empty path or one holding a NUL byte), UFORM_IO (a file that
 * cannot be opened, stat'ed or read, or is not a regular file), UFORM_FORMAT (sounds: an empty file, more
 * than UFORM_AUDIO_MAX_BYTES, a format FFmpeg does not recognize, demuxing or decoding that reports an
 * error or a corrupt packet, no audio stream, a rate of 0 or over UFORM_AUDIO_MAX_RATE, no channel or more
 * than 64, a rate, sample format or channel count changing within the stream, a NaN or infinite decoded
 * sample, more than 2^20 packets before the samples the model reads, and a clip, zero-length included,
 * shorter than one patch), UFORM_UNSUPPORTED (a codec this FFmpeg cannot decode), UFORM_OUT_OF_MEMORY. A
 * file cut within its samples answers UFORM_FORMAT when the demuxer finds its last packet short (FFmpeg
 * marks it corrupt: a WAV whose data chunk lost its end), and is otherwise the shorter clip it holds.
 *
 * Limits against hostile inputs: UFORM_AUDIO_MAX_BYTES per encoded sound (a file's size is checked before
 * it is read), UFORM_AUDIO_MAX_SAMPLES per item of samples, input rates up to UFORM_AUDIO_MAX_RATE. Past
 * those, the work a clip costs is bounded by the model's reach whatever its length: an item of samples
 * is scanned once for NaN and infinities, and only its first samples are read beyond that.
 *
 * Execution, as "Execution of the media verbs" above: chunks of about 2048 tokens counted at
 * max_patches (at least one clip per executor thread, at most 64 clips), whose clips are decoded,
 * resampled and turned into patches. Progress counts clips. stats.bytes counts samples * 4, encoded
 * bytes or file bytes read; decode_ns covers decoding, resampling and the log-mel front end.
 *
 * Call statuses: UFORM_OK, UFORM_INVALID_ARGUMENT (a NULL or empty tape, offsets out of order or past the
 * tape, an unknown source, a rate of 0 or over UFORM_AUDIO_MAX_RATE, samples not aligned to a float, an
 * arena of another executor, a bad config), UFORM_CONTENDED, UFORM_UNSUPPORTED (no audio tower; a VRAM
 * model, as the audio tower runs on host executors only; a build without FFmpeg, where the verbs
 * validate their arguments, then answer UFORM_UNSUPPORTED), UFORM_OUT_OF_MEMORY, UFORM_CANCELLED. */
#define UFORM_AUDIO_MAX_BYTES   ((size_t)1 << 28) /* 256 MiB per encoded sound */
#define UFORM_AUDIO_MAX_SAMPLES ((size_t)1 << 31) /* per item of samples: 12 hours at 48 kHz */
#define UFORM_AUDIO_MAX_RATE    ((size_t)1 << 20) /* Hz, of samples and of decoded streams */

/* Sound files (`source` UFORM_SOURCE_FILES: the tape holds paths, without NUL) or encoded sounds in
 * memory (UFORM_SOURCE_MEMORY: the tape holds the files' bytes), in any format and codec FFmpeg decodes
 * (WAV, FLAC, MP3, Ogg, MP4/AAC, ...). */
typedef struct uform_audio_encode_args {
    UFORM_ENCODE_COMMON;
    uform_tape_t sounds;
    uform_source_t source;
} uform_audio_encode_args_t;
UFORM_EXPORT uform_status_t uform_audio_encode(uform_audio_encode_args_t const *args);

/* F32 PCM samples, mono, at `rate` Hz (1 .. UFORM_AUDIO_MAX_RATE, one rate for the whole call): the tape's
 * elements are floats, `data` aligned to a float. */
typedef struct uform_audio_encode_samples_args {
    UFORM_ENCODE_COMMON;
    uform_tape_t samples; /* floats */
    size_t rate;
} uform_audio_encode_samples_args_t;
UFORM_EXPORT uform_status_t uform_audio_encode_samples(uform_audio_encode_samples_args_t const *args);

/* Per item, the softmax over only that item's legal next bytes, through the tied byte table. The view
 * has one row of one F32 per legal byte, in the order each item lists them, grouped per item by
 * `item_offsets`. `states` is a STATES view of this model produced by text_encode into another arena
 * (this call rewinds its own), F32 or BF16, one row per item. An item with no legal byte or with a
 * repeated one, a count of items other than the states' rows, or states in `arena` itself answer
 * UFORM_INVALID_ARGUMENT. Answers UFORM_OK, UFORM_INVALID_ARGUMENT, UFORM_CONTENDED, UFORM_UNSUPPORTED
 * (no text tower, or one that reads tokens: it has no byte table), UFORM_OUT_OF_MEMORY, UFORM_CANCELLED. */
typedef struct uform_text_choose_args {
    uform_model_t *model;
    uform_executor_t *executor; /* NULL: the calling thread */
    uform_view_t const *states; /* F32 or BF16 rows of `hidden` */
    uform_tape_t choices;       /* bytes: the legal next bytes of each item */
    uform_arena_t *arena;
    uform_progress_t const *progress;
    uform_view_t *probabilities; /* blocking calls: receives the view */
    uform_outcome_t *outcome;    /* NULL: blocking */
} uform_text_choose_args_t;
UFORM_EXPORT uform_status_t uform_text_choose(uform_text_choose_args_t const *args);

/* Reads the probabilities of a final, successful text_choose outcome. As uform_outcome_encoded. */
UFORM_EXPORT uform_status_t uform_outcome_probabilities(uform_outcome_t const *outcome, uform_view_t *view);

/* ---------------------------------------------------------------------------------------------- */
/* Tokenizers                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

/* A tokenizer cuts UTF-8 texts into the token ids a pretrained text encoder reads, exactly as Hugging
 * Face's `tokenizers` (0.19) cuts them from the same `tokenizer.json`: the added tokens first (matched
 * on the raw text, then on the normalized text, longest first), then the normalizer, the pre-tokenizer,
 * the model, truncation, the post-processor's special tokens and padding, each as that library defines
 * it. Every token carries the span of input bytes it covers ([0, 0) for the special tokens a
 * post-processor or padding adds), as tokenizers' offsets do, but in bytes rather than characters, and
 * whether it is one of those special tokens (tokenizers' special_tokens_mask).
 *
 * The components read (any other answers UFORM_UNSUPPORTED naming it):
 *   - normalizers: BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace,
 *     Prepend, Precompiled (SentencePiece's charsmap), Nmt, Sequence;
 *   - pre-tokenizers: BertPreTokenizer, Whitespace, WhitespaceSplit, Punctuation, Split, ByteLevel,
 *     Metaspace, Digits, Sequence;
 *   - models: WordPiece, BPE (without dropout), Unigram, WordLevel;
 *   - post-processors: BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, Sequence;
 *   - truncation (its max_length less the special tokens, as tokenizers counts them) and padding
 *     (Fixed per text; BatchLongest to the longest text of one call). The decoder is not read.
 * Unicode comes from utf8proc (Unicode 15.0) and regular expressions from Oniguruma (6.9, Unicode 14.0),
 * as tokenizers uses Oniguruma too. tokenizers' own tables are older (its normal forms and StripAccents
 * Unicode 9.0, BertNormalizer's and the punctuation pre-tokenizers' categories Unicode 8.0): code points
 * assigned since those versions may be cut differently (a few hundred marks, format characters and
 * punctuation of recent scripts; docs/DESIGN.md, "Tokenizers", lists them). Every code point assigned in
 * older versions is cut the same.
 *
 * A text that is not valid UTF-8 cannot reach tokenizers at all (a Rust `str` and a Python `str`
 * hold only valid text): here it fails alone, with item status UFORM_FORMAT and no tokens, and the
 * other texts of the call are cut as if alone.
 *
 * Folders published without a tokenizer.json (SigLIP's) hold a SentencePiece model instead, cut by
 * libsentencepiece itself as transformers' (4.44) slow tokenizers cut with it, their class named by the
 * folder's tokenizer_config.json: SiglipTokenizer (lowercased, ASCII punctuation removed, whitespace
 * collapsed, </s> after the text) and XLMRobertaTokenizer (fairseq's ids, <s> and </s> around the text);
 * a bare .model file is cut as SentencePieceProcessor.encode cuts (no special tokens). Neither truncates
 * nor pads. Spans come from SentencePiece's own byte offsets, mapped back through SigLIP's preprocessing:
 * text it removed lies in no token's span unless inside one. Debian's libsentencepiece (0.1.97) may break
 * an exact tie of two Unigram segmentations (the same pieces in another order: "w" "ww", "ww" "w"), or
 * in a text of a megabyte a near one, otherwise than PyPI's (0.2); docs/DESIGN.md, "Tokenizers", says
 * more.
 *
 * Builds without utf8proc and Oniguruma answer UFORM_UNSUPPORTED to every tokenizer function; builds
 * without libsentencepiece (UFORM_FEATURE_SENTENCEPIECE) to a SentencePiece model. A tokenizer is
 * read-only once opened: any number of calls, on any executors and threads, may use it at once. */
typedef struct uform_tokenizer uform_tokenizer_t;

/* Opens a tokenizer from `path`: a file, a `tokenizer.json` (its first byte past whitespace is '{') or
 * else a SentencePiece model (`spiece.model`, `sentencepiece.bpe.model`: cut as SentencePiece's encode
 * cuts); or a model's folder, read from its tokenizer.json, or without one from its spiece.model or
 * sentencepiece.bpe.model and the tokenizer_config.json that names the class (SiglipTokenizer,
 * XLMRobertaTokenizer; its do_lower_case read, other special tokens refused). Reads and checks the whole
 * file on the calling thread (blocking). Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL arguments),
 * UFORM_IO (cannot open or read, a model without tokenizer_config.json in a folder), UFORM_FORMAT
 * (malformed JSON, a component that is, a file SentencePiece does not read as a model: the message names
 * the fault), UFORM_UNSUPPORTED (a component or tokenizer class outside the lists above, or a build
 * without tokenizers or without SentencePiece: the message names it), UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_tokenizer_open(char const *path, uform_tokenizer_t **tokenizer);

/* The same from the `length` bytes of a tokenizer.json in memory (read only during the call; never a
 * SentencePiece model). */
UFORM_EXPORT uform_status_t uform_tokenizer_parse(void const *json, size_t length, uform_tokenizer_t **tokenizer);

/* Frees the tokenizer; it must not be in use by a pending call. NULL is ignored. */
UFORM_EXPORT void uform_tokenizer_free(uform_tokenizer_t *tokenizer);

typedef struct uform_tokenizer_info {
    size_t vocabulary;    /* ids are below this: the model's vocabulary and the added tokens */
    size_t max_length;    /* the file's truncation, in tokens with the special ones; 0 for none */
    size_t special_added; /* tokens the post-processor (or a SentencePiece class) adds to one text */
    char model[16];       /* "WordPiece", "BPE", "Unigram", "WordLevel"; a SentencePiece model's trainer:
                             "Unigram", "BPE", "Word", "Char" */
} uform_tokenizer_info_t;

/* Answers UFORM_OK or UFORM_INVALID_ARGUMENT. Never blocks. */
UFORM_EXPORT uform_status_t uform_tokenizer_info(uform_tokenizer_t const *tokenizer, uform_tokenizer_info_t *info);

/* The string of token `id`, as tokenizers' id_to_token gives it: an added token's content, else the
 * model's vocabulary entry as the file writes it ("##ing", "\u0120the", "\u2581the"); for a SentencePiece
 * model, its class's special token of that id, else SentencePiece's piece (XLM-R's ids shifted back by
 * fairseq's offset). `*string` points into the tokenizer: `*length` bytes, not NUL-terminated, valid while
 * the tokenizer lives. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (a NULL argument, or an id no token has:
 * then `*string` is NULL and `*length` 0), UFORM_UNSUPPORTED (a build without tokenizers). Never blocks. */
UFORM_EXPORT uform_status_t uform_tokenizer_token(uform_tokenizer_t const *tokenizer, uint32_t id,
                                                  char const **string, size_t *length);

/* The tokenizer of a model whose text tower reads tokens (uform_model_info_t.text.vocab > 0: a pretrained
 * folder, or a checkpoint converted from one, which carries its tokenizer.json), borrowed: it lives as
 * long as the model and is never freed by the caller. It cuts as the model's text verbs do: never padded,
 * truncated at the model's context (docs/DESIGN.md, "Tokenizers", says how each family truncates);
 * uform_tokenize_config_t.without_truncation cuts whole texts. Answers UFORM_OK, UFORM_INVALID_ARGUMENT
 * (a NULL argument), UFORM_UNSUPPORTED (a model that reads bytes or has no text tower, or a build without
 * tokenizers: `*tokenizer` is then NULL). Never blocks. */
UFORM_EXPORT uform_status_t uform_model_tokenizer(uform_model_t const *model, uform_tokenizer_t const **tokenizer);

/* The prompt a text of the model takes before it is cut, as uform_encode_config_t's prompt_name picks it:
 * the model's prompt `name`, or with `name` NULL its default prompt; "" (no prompt) for `name` "" or a
 * model without a default. Copies it into `prompt` (`capacity` bytes, NUL-terminated) and its length
 * without the NUL into `*length`. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (a NULL model, prompt or
 * length; a name the model lacks; a prompt of `capacity` bytes or more, `*length` then its length),
 * UFORM_UNSUPPORTED (a model that reads bytes, which takes no prompt, for a name other than NULL or "").
 * Never blocks. */
UFORM_EXPORT uform_status_t uform_model_prompt(uform_model_t const *model, char const *name, char *prompt,
                                               size_t capacity, size_t *length);

typedef struct uform_tokenize_stats {
    size_t items, failed; /* texts asked, texts whose status is not UFORM_OK */
    size_t bytes, tokens; /* input bytes, tokens produced (special tokens and padding included) */
    size_t truncated;     /* texts the truncation cut */
    uint64_t total_ns;
} uform_tokenize_stats_t;

typedef struct uform_tokenize_config {
    bool without_special_tokens; /* true: no post-processor tokens (tokenizers' add_special_tokens=False) */
    bool without_truncation;     /* true: the tokenizer's truncation is not applied (tokenizers'
                                    with_truncation(None)); a model's tokenizer truncates at its context */
    uform_progress_t progress;   /* completed and total are texts */
    uform_tokenize_stats_t *stats; /* written when the call is final; may be NULL */
} uform_tokenize_config_t;

/* What a tokenize call produced, views into the arena (host memory). `ids`: one U32 per token, one
 * column, grouped per text by `ids.item_offsets`; `spans`: one row of two U32 per token, the input
 * bytes [begin, end) it covers, counted from the text's first byte, grouped by the same offsets.
 * `statuses`: one per text, UFORM_OK or UFORM_FORMAT (not UTF-8, or longer than 4 GiB), a failed text
 * having no tokens. `special`: one byte per token (ids.rows of them, in the arena too), tokenizers'
 * special_tokens_mask: 1 for a token the post-processor or padding added (a SentencePiece class's <s> and
 * </s>, and the special tokens it finds in a text), 0 for the others, added tokens found in the text
 * included. */
typedef struct uform_tokenized {
    uform_view_t ids, spans;
    uform_status_t const *statuses;
    size_t items;
    uint8_t const *special;
} uform_tokenized_t;

/* Reads the products of a final, successful tokenize outcome. As uform_outcome_encoded. */
UFORM_EXPORT uform_status_t uform_outcome_tokenized(uform_outcome_t const *outcome, uform_tokenized_t *tokenized);

/* Cuts every text of `texts` (UTF-8 bytes) into tokens, in the arena, split over the executor's
 * threads in chunks (progress counts texts, reported between chunks; each text's tokens do not depend
 * on the others, save for BatchLongest padding, which pads to the longest text of the call). A text
 * needs no terminating NUL; an empty text gets the special tokens alone. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT (a NULL tokenizer, arena or tape, offsets out of order or past the tape, an
 * arena of another executor, a device arena), UFORM_CONTENDED, UFORM_UNSUPPORTED (a build without
 * tokenizers; a VRAM executor), UFORM_OUT_OF_MEMORY, UFORM_CANCELLED. */
typedef struct uform_text_tokenize_args {
    uform_tokenizer_t const *tokenizer;
    uform_executor_t *executor; /* NULL: the calling thread */
    uform_tape_t texts;         /* bytes */
    uform_arena_t *arena;
    uform_tokenize_config_t const *config; /* NULL: defaults */
    uform_tokenized_t *tokenized;          /* blocking calls: receives the views */
    uform_outcome_t *outcome;              /* NULL: blocking */
} uform_text_tokenize_args_t;
UFORM_EXPORT uform_status_t uform_text_tokenize(uform_text_tokenize_args_t const *args);

/* ---------------------------------------------------------------------------------------------- */
/* Mesh and trainer                                                                               */
/* ---------------------------------------------------------------------------------------------- */

/* A mesh joins the processes of one run (launched by mpirun or Slurm) through MPI (Open MPI): bootstrap
 * initializes MPI on the executor's loop thread when the process has not (MPI_THREAD_SERIALIZED), and
 * freeing the last mesh finalizes it then, so a process bootstraps at most once. An application that
 * initialized MPI itself keeps it, and may bootstrap meshes over communicators of its own
 * (options.communicator) as long as it does not finalize MPI. A trainer made with a mesh (config.mesh)
 * runs data-parallel: each process steps on its own items, the loss spans every process's items (pairs
 * across processes are unrelated; relations index a process's own items), gradients are summed with
 * non-blocking collectives that the executor's loop progresses, and N processes equal one process on the
 * concatenated batch, to rounding. Every process passes the same config, and the same executor to the
 * mesh and its trainer.
 *
 * Over VRAM executors each process's trainer steps on one device of its executor: the process's rank
 * among those of its node (its local rank) modulo the executor's devices, so that an executor made over
 * a node's devices spreads its processes over them, and one made over one device puts them all there.
 * The embeddings' exchange and the gradients' sum run on device memory, over NCCL (opened on first use,
 * a non-blocking communicator whose unique id rank 0 broadcasts over MPI), or, where some process cannot
 * load NCCL, or processes share a device and the NCCL found is older than 2.30 (its multi-rank mode,
 * which the engine enables through NCCL_MULTI_RANK_GPU_ENABLE unless that says 0), staged through pinned
 * host memory over MPI: chosen at bootstrap, the same on every process, and reported by
 * uform_mesh_info. A collective of a VRAM mesh (the counts' exchange over MPI included) that does not
 * finish within options.timeout_seconds ends the step with UFORM_DEVICE on every process that waits for
 * it, NCCL's communicator aborted: the mesh is then unusable, and every later step over it answers
 * UFORM_DEVICE saying so (uform_mesh_info's `usable` is false); free it. */
typedef struct uform_mesh uform_mesh_t;

/* The collectives of a mesh. */
typedef enum uform_mesh_collectives {
    UFORM_MESH_HOST = 0,   /* RAM executors: MPI on host memory */
    UFORM_MESH_NCCL = 1,   /* VRAM executors: NCCL on device memory */
    UFORM_MESH_STAGED = 2, /* VRAM executors: device to pinned host memory, MPI, and back */
} uform_mesh_collectives_t;

typedef struct uform_mesh_options {
    /* The address of an MPI_Comm (<mpi.h>) whose processes form the mesh, read at bootstrap and
     * duplicated: every process of that communicator bootstraps with it, and the mesh's rank and size
     * are that communicator's. The application must have initialized MPI (at MPI_THREAD_SERIALIZED or
     * above: the engine calls MPI from the executor's loop thread). NULL: MPI_COMM_WORLD. */
    void const *communicator;
    /* VRAM meshes: the seconds a collective may take (NCCL's communicator's start included) before the
     * step ends with UFORM_DEVICE and the mesh is unusable; 0 takes 300. Meshes over RAM executors wait
     * as MPI does. */
    double timeout_seconds;
} uform_mesh_options_t;

typedef struct uform_mesh_bootstrap_args {
    uform_executor_t *executor;          /* its loop thread makes every MPI call of the mesh */
    uform_mesh_options_t const *options; /* NULL: MPI_COMM_WORLD */
    uform_mesh_t **mesh;                 /* blocking and deferred calls alike: receives the mesh */
    uform_outcome_t *outcome;            /* NULL: blocking */
} uform_mesh_bootstrap_args_t;

/* Joins this process to a mesh: a collective over the communicator's processes (MPI_Comm_dup; over
 * VRAM executors also the choice of collectives and NCCL's communicator), so the call is final once every
 * one of them has bootstrapped. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL args, executor or mesh;
 * options.communicator given before MPI was initialized, after it was finalized, or naming
 * MPI_COMM_NULL; a negative or non-finite timeout), UFORM_UNSUPPORTED (a build without MPI; MPI
 * finalized already; MPI initialized by the application below MPI_THREAD_SERIALIZED), UFORM_IO (MPI
 * failed), UFORM_DEVICE (NCCL's communicator failed or did not start within the timeout, every process
 * alike), UFORM_CONTENDED, UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_mesh_bootstrap(uform_mesh_bootstrap_args_t const *args);

/* Frees the mesh (MPI_Comm_free of its duplicate: every process of the mesh frees its own), which no
 * trainer may still use: a trainer made with it uses it until uform_trainer_free. Freeing the last mesh
 * of a process whose MPI the engine initialized finalizes MPI there (MPI_Finalize, which may block until
 * the other processes of the run finalize too), and MPI cannot start again in that process; an MPI the
 * application initialized stays the application's. NULL is ignored. */
UFORM_EXPORT void uform_mesh_free(uform_mesh_t *mesh);

/* Rank and size of this process in the mesh; 0 and 1 for NULL (one process alone). Never blocks. */
UFORM_EXPORT size_t uform_mesh_rank(uform_mesh_t const *mesh);
UFORM_EXPORT size_t uform_mesh_size(uform_mesh_t const *mesh);

typedef struct uform_mesh_info {
    size_t rank, size;             /* as uform_mesh_rank and uform_mesh_size */
    size_t local_rank, local_size; /* among the mesh's processes on this node */
    uform_mesh_collectives_t collectives;
    int device;             /* the CUDA ordinal this process's VRAM trainer steps on; -1 on RAM */
    bool shared_device;     /* VRAM meshes: some processes share a device */
    bool usable;            /* false once a collective timed out (see above) */
    double timeout_seconds; /* VRAM meshes; 0 on RAM */
    char const *broken;     /* why the mesh is unusable (static text), or NULL */
} uform_mesh_info_t;

/* What the mesh is: its ranks, its collectives, its device and whether it is still usable; for NULL, one
 * process alone on the host. Never blocks. Answers UFORM_OK, or UFORM_INVALID_ARGUMENT for a NULL info. */
UFORM_EXPORT uform_status_t uform_mesh_info(uform_mesh_t const *mesh, uform_mesh_info_t *info);

typedef struct uform_trainer uform_trainer_t;

typedef enum uform_modality {
    UFORM_MODALITY_TEXT = 0,
    UFORM_MODALITY_IMAGE = 1, /* an encoded image */
    UFORM_MODALITY_VIDEO = 2, /* an encoded clip */
    UFORM_MODALITY_AUDIO = 3, /* an encoded sound */
} uform_modality_t;

typedef struct uform_trainer_config {
    /* The model, when it starts from scratch (no resume_path). Every tower shares depth and hidden;
     * 0 takes the defaults written by uform_trainer_config_default. */
    size_t depth, hidden; /* heads = hidden / 64, mlp = 4 * hidden; hidden a multiple of 64 */
    size_t dims;          /* the shared embedding width; matryoshka widths are dims / 2 and dims */
    uint32_t towers;      /* bits 1 << uform_modality_t: text, image (video rides the image tower), audio */
    size_t context;       /* text bytes */
    size_t image_size, image_patch; /* pixels */
    size_t video_frames;
    size_t audio_rate, audio_mels; /* the audio front end: window 25 ms, hop 10 ms, 4 frames a patch */
    double audio_seconds;
    /* The optimizer: AdamW with a linear warmup over warmup_steps, then a cosine decay to 0 at
     * total_steps; weight decay on the rank-2 weights only (not norms, biases, embeddings, positions,
     * class tokens, logit parameters); gradients clipped to a global L2 norm of clip_norm (0: never). */
    double learning_rate, weight_decay, beta1, beta2, epsilon, clip_norm, lm_weight;
    size_t warmup_steps, total_steps;
    uint64_t seed;           /* initial weights */
    char const *resume_path; /* a checkpoint to continue from: its weights, and when the optimizer
                                state uform_trainer_save wrote beside it is there and belongs to it,
                                the master weights, moments and step, bit-exactly (what an interrupted
                                save to it left is settled first: see uform_trainer_save); or NULL */
    uform_mesh_t *mesh;      /* NULL: one process */
} uform_trainer_config_t;

/* Fills `config` with the defaults: depth 2, hidden 128, dims 64, every tower, context 64, image 32
 * with patches of 8, 4 video frames, audio at 16 kHz with 32 mels over 2 s, learning rate 1e-3,
 * weight decay 0.01, betas 0.9 and 0.999, epsilon 1e-8, clip_norm 1, lm_weight 0.1, 100 warmup of 10000
 * steps, seed 42, no resume, no mesh. Does nothing for NULL; never fails. */
UFORM_EXPORT void uform_trainer_config_default(uform_trainer_config_t *config);

typedef struct uform_trainer_init_args {
    uform_executor_t *executor;
    uform_trainer_config_t const *config;
    uform_trainer_t **trainer;
    uform_outcome_t *outcome;
} uform_trainer_init_args_t;

/* A trainer (docs/DESIGN.md, "Training"): F32 master weights, AdamW moments and the schedule, over a host
 * executor, from the config's sizes and seed or from config.resume_path. It owns no threads: its verbs
 * run on the executor it was made on. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL, a bad config, a
 * VRAM executor), UFORM_IO and UFORM_FORMAT (resume_path unreadable, not a checkpoint, or beside an
 * optimizer state that belongs to another checkpoint), UFORM_CONTENDED, UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_trainer_init_ram(uform_trainer_init_args_t const *args);

/* A trainer on a VRAM executor, the same as a RAM trainer (the same config, the same step, save and files)
 * but that its steps run on the executor's first device: BF16 weights and activations there, F32 master
 * weights, gradients and AdamW moments, the loss, the gradient's clipping and a skipped update (a loss or a
 * gradient norm that is not finite) decided on the device without the host waiting; the batch's items are
 * decoded on the executor's host threads. A save copies the masters and moments back and writes the files
 * a RAM trainer writes, so that either residency resumes from either's saves (to rounding: the device
 * computes in BF16, the host in F32; on the same residency a resume continues bit-exactly). Answers
 * Over a mesh it steps on the mesh's device of the executor (see uform_mesh_bootstrap). Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT (NULL, a bad config, a host executor, a mesh bootstrapped over another
 * executor), UFORM_IO and UFORM_FORMAT (as uform_trainer_init_ram), UFORM_UNSUPPORTED (a build without
 * CUDA), UFORM_DEVICE (a device failure; a mesh made unusable), UFORM_CONTENDED, UFORM_OUT_OF_MEMORY
 * (host or device memory). */
UFORM_EXPORT uform_status_t uform_trainer_init_vram(uform_trainer_init_args_t const *args);

/* Frees the trainer, its master weights, moments and buffers. No call of it may be pending: wait for a
 * deferred step or save first. Its executor and mesh stay the caller's (a VRAM trainer keeps its executor
 * alive until it is freed, as an arena does, since its memory is on the executor's device), and failures
 * it reported stay readable (their messages are copies: see uform_error_t). NULL is ignored. Never
 * fails. */
UFORM_EXPORT void uform_trainer_free(uform_trainer_t *trainer);

typedef struct uform_trainer_step_stats {
    double loss, contrastive_loss, lm_loss, learning_rate;
    size_t step;
} uform_trainer_step_stats_t;

typedef struct uform_trainer_step_args {
    uform_trainer_t *trainer;
    uform_executor_t *executor;         /* required: a trainer runs on the executor it was made on */
    uform_modality_t const *modalities; /* one per item */
    uform_tape_t contents;              /* bytes per item, interpreted per modality */
    uint32_t const *relations;          /* pairs (i, j) of related items, 2 * relations_count values */
    size_t relations_count;
    uform_progress_t const *progress;
    uform_trainer_step_stats_t *stats; /* written when final; may be NULL */
    uform_outcome_t *outcome;
} uform_trainer_step_args_t;
/* One optimizer step on a batch: contents are texts (bytes) and encoded images, clips and sounds, as the
 * encode verbs read them from memory. The loss is docs/DESIGN.md's: the pairwise sigmoid loss over every
 * matryoshka prefix (the listed pairs related, in either order; every other pair unrelated) plus
 * lm_weight times the next-byte loss; then gradients clipped and AdamW. Progress counts the step's phases
 * (inputs, forward passes, the text tower's backward pass, the rest) and may cancel. A failed or cancelled
 * step changes nothing; so does a step whose loss or gradient norm is not finite, which answers
 * UFORM_INVALID_ARGUMENT saying which. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL, no item, a bad tape,
 * an unknown modality, a relation that is not two distinct items of the batch, another executor; a loss or
 * norm that is not finite), UFORM_UNSUPPORTED (a modality the model lacks or this build cannot decode),
 * UFORM_FORMAT (an item that cannot be decoded: the message names it), UFORM_CONTENDED, UFORM_CANCELLED,
 * UFORM_OUT_OF_MEMORY, UFORM_IO (a collective of the mesh failed), UFORM_DEVICE (a VRAM trainer's device
 * failed; a collective of its mesh timed out, or the mesh was made unusable by one that did). */
UFORM_EXPORT uform_status_t uform_trainer_step(uform_trainer_step_args_t const *args);

typedef struct uform_trainer_save_args {
    uform_trainer_t *trainer;
    uform_executor_t *executor;
    char const *path; /* the inference checkpoint; the optimizer state goes beside it */
    uform_outcome_t *outcome;
} uform_trainer_save_args_t;
/* Writes the BF16 inference checkpoint at `path` (weights rounded from the F32 masters; logit.scale and
 * logit.bias in F32) and beside it, at `path` + ".optimizer", the F32 masters, moments, step and
 * optimizer settings with the fingerprint of the checkpoint they belong to. Both are written whole and
 * synced under staging names (`path` + ".next", `path` + ".optimizer.next") before the state, then the
 * checkpoint, is renamed over its file, so that a failure (a full disk) or a kill at any point leaves on
 * disk the previous pair or the new one; the next save, or a trainer resuming from `path`, finishes or
 * removes what an interrupted save left, with the temporaries of killed saves. Resuming from `path`
 * continues bit-exactly. Over a mesh only the first process writes. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT, UFORM_IO (the message names the file and the system's reason: "cannot write
 * PATH.optimizer: No space left on device"), UFORM_CONTENDED, UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_trainer_save(uform_trainer_save_args_t const *args);

/* ---------------------------------------------------------------------------------------------- */
/* Checkpoint tools                                                                               */
/* ---------------------------------------------------------------------------------------------- */

typedef struct uform_tiny_checkpoint_args {
    char const *path;   /* written atomically: a temporary file, fsync, rename */
    uint64_t seed;      /* the same seed writes the same bytes */
    size_t depth;       /* of every tower; 0 takes 2 */
    size_t hidden;      /* of every tower, a multiple of 64; 0 takes 64 */
    size_t mlp;         /* of every tower; 0 takes 2 * hidden */
    size_t context;     /* of the text tower, in bytes; 0 takes 64 */
    size_t image_size;  /* the image tower's input side in pixels; 0 takes 32 */
    size_t image_patch; /* its patch side, dividing image_size; 0 takes 8 */
} uform_tiny_checkpoint_args_t;

/* Writes a small, seeded, fully valid format-4 checkpoint with every tower (text, image, video,
 * audio) and the logit parameters. Blocks on file writes. Answers UFORM_OK, UFORM_INVALID_ARGUMENT,
 * UFORM_IO, UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_tiny_checkpoint(uform_tiny_checkpoint_args_t const *args);

typedef struct uform_checkpoint_quantize_args {
    char const *input;  /* a format-4 checkpoint (or a pretrained folder); read whole before the output is written */
    char const *output; /* written atomically (a temporary file, fsync, rename); may be the input */
} uform_checkpoint_quantize_args_t;

/* Writes `input` again with I8 weights (uform_weights_t): every block's linear layer of at most 65536
 * inputs that the input stores in BF16 is quantized per output row, the same bytes a load asking for
 * UFORM_WEIGHTS_I8 makes, into an I8 tensor of its name and an F32 tensor of its scales,
 * `<name>.scale` [out] (docs/DESIGN.md); every other tensor, and layers already I8, are copied. Loads the
 * input on the calling thread first, with every check of uform_model_load_ram. Blocks on file reads and
 * writes. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (NULL or empty paths), the statuses of
 * uform_model_load_ram for the input, UFORM_IO (cannot write the output), UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_checkpoint_quantize(uform_checkpoint_quantize_args_t const *args);

typedef struct uform_checkpoint_convert_args {
    char const *input;       /* a format-4 checkpoint or a pretrained model's folder; read whole first */
    char const *output;      /* written atomically (a temporary file, fsync, rename); may be the input file */
    uform_weights_t weights; /* UFORM_WEIGHTS_STORED: the weights as they load (a folder's in BF16);
                                UFORM_WEIGHTS_I8: as uform_checkpoint_quantize writes them */
} uform_checkpoint_convert_args_t;

/* Writes the model at `input` as one self-contained format-4 checkpoint: the tensors a load makes of it (a
 * pretrained folder's converted to BF16 in the checkpoint schema), its block's settings in the metadata
 * (docs/DESIGN.md), and the tokenizer.json of a text tower that reads tokens in the metadata too. The output
 * loads to the same embeddings, bit for bit. Loads the input on the calling thread first, with every check
 * of uform_model_load_ram. Answers UFORM_OK, UFORM_INVALID_ARGUMENT, the statuses of uform_model_load_ram for
 * the input, UFORM_UNSUPPORTED (a model cut by a SentencePiece model file: its tokenizer does not travel in
 * a checkpoint yet), UFORM_IO (cannot write the output), UFORM_OUT_OF_MEMORY. */
UFORM_EXPORT uform_status_t uform_checkpoint_convert(uform_checkpoint_convert_args_t const *args);

#ifdef __cplusplus
}
#endif
#endif /* UFORM_H */
