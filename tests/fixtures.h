/* What the test suites share: a temporary folder with a tiny checkpoint and its model, files and blobs,
 * batches of items on one tape, executors of every receiver kind, a progress counter, comparisons of
 * encoded outputs, the verbs behind `void const *`, and checks that every encode verb must pass alike
 * (receivers, progress and cancellation, bad arguments, bad items, conversions, matryoshka widths).
 * Only the public interface (uform.h) is used, so that suites linked against the shared library link
 * this too. Every helper asserts with cmocka: a failure fails the calling test. */
#ifndef UFORM_TESTS_FIXTURES_H
#define UFORM_TESTS_FIXTURES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "uform.h"

#define EVERYTHING (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS | UFORM_OUTPUT_STATES)
#define BATCH_MAX  512 /* items in one batch */

/* ---- Seeded random numbers (splitmix64) ---------------------------------------------------------- */

void random_seed(uint64_t seed);
uint64_t random_bits(void);
float random_uniform(float low, float high); /* in [low, high) */
size_t random_below(size_t bound);           /* in [0, bound) */

/* ---- The suite's folder and model ----------------------------------------------------------------- */

/* Makes the folder `$TMPDIR/uform-<suite>-XXXXXX` (TMPDIR unset: /tmp), writes the checkpoint `tiny`
 * describes there (tiny->path NULL: tiny.safetensors in the folder, valid until fixture_teardown) and,
 * when `model` is not NULL, loads it into RAM and answers its info. Answers 0, or -1 with the reason
 * printed: a cmocka group setup. One folder per program. */
int fixture_setup(char const *suite, uform_tiny_checkpoint_args_t *tiny, uform_model_t **model,
                  uform_model_info_t *info);

/* The cmocka group teardown: frees the model fixture_setup loaded, removes the folder and everything in
 * it. Answers 0 or -1. */
int fixture_teardown(void **state);

/* `name` in the folder. */
void fixture_path(char const *name, char *path, size_t capacity);

/* The calling thread's last error, rendered (uform_error_render), for messages. */
typedef struct error_text {
    char text[512];
} error_text_t;
error_text_t last_error_text(void);

/* Fills 64 KiB of the stack below the caller with `byte`, where the frames of the caller's next call will
 * lie: what a callee reads without writing it first reads `byte`, every run. */
void stack_paint(unsigned char byte);

/* A RAM executor of `threads` threads, pinned or not. */
uform_executor_t *ram_executor(size_t threads, bool pin);

/* A host arena (uform_arena_create_host); the caller frees it. */
uform_arena_t *arena_on_host(void);

/* ---- Receivers and progress ------------------------------------------------------------------------ */

/* The receivers a call may run on, as the suites make them. */
typedef enum receiver {
    RECEIVER_THREAD,     /* no executor: the calling thread */
    RECEIVER_INLINE,     /* uform_executor_create_inline */
    RECEIVER_RAM,        /* a RAM executor of the default options */
    RECEIVER_RAM_TWO,    /* a RAM executor of 2 threads */
    RECEIVER_RAM_DOMAIN, /* a RAM executor bound to NUMA domain 0 through hwloc, where built */
    RECEIVER_POOL,       /* an application's pool */
} receiver_t;

/* An executor of `receiver`, asserted made (RECEIVER_THREAD: NULL); RECEIVER_POOL runs through `vtable`
 * on `pool`. The caller frees it. */
uform_executor_t *receiver_make(receiver_t receiver, uform_pool_vtable_t const *vtable, void *pool);

/* What a progress handler was told, and when it cancels. */
typedef struct progress_counter {
    size_t calls;        /* so far */
    size_t last, total;  /* the last call's `completed` and `total` */
    size_t cancel_at;    /* cancel once `completed` reaches it; 0: never */
    bool cancel_halfway; /* cancel once `completed` reaches half the total */
} progress_counter_t;

/* The progress handler over a progress_counter_t: counts and records each call, asserts that `completed`
 * never goes back nor past `total`, and cancels as the counter says. */
uform_continuation_t count_progress(void *state, size_t completed, size_t total);

/* ---- Files ---------------------------------------------------------------------------------------- */

typedef struct blob {
    uint8_t *data; /* owned: free() it */
    size_t size;
} blob_t;

blob_t blob_copy(void const *data, size_t size);
blob_t blob_read(char const *path);                    /* a whole file, anywhere */
void blob_write(char const *name, blob_t const *blob); /* a file in the folder, replaced */
void sparse_write(char const *name, size_t size);      /* a file of `size` zero bytes, none written */

/* A file a suite writes into the folder, and what its item must answer: the broken and hostile files of
 * a verb, with good ones among them. */
typedef struct file_case {
    char const *name;
    blob_t blob; /* its bytes; data NULL: not written by cases_write (made otherwise, or absent) */
    uform_status_t expected;
    bool file_only; /* not tried from memory: a FIFO, a file past the size limit */
} file_case_t;

/* A suite's cases: fills `cases` (room for CASES_MAX), writes them into the folder, answers how many. */
#define CASES_MAX 32
typedef size_t (*make_cases_t)(file_case_t *cases);

void cases_write(file_case_t const *cases, size_t n);

/* ---- Batches: items on one tape, as the verbs take them -------------------------------------------- */

typedef enum batch_kind {
    BATCH_TEXTS,   /* UTF-8 bytes */
    BATCH_PIXELS,  /* RGB8 rows, with `heights` and `widths` */
    BATCH_SAMPLES, /* mono F32 at `rate`; offsets count samples */
    BATCH_FILES,   /* paths */
    BATCH_MEMORY,  /* the bytes of encoded files */
} batch_kind_t;

typedef struct batch {
    batch_kind_t kind;
    uform_source_t source; /* of files and memory; a test may set an unknown one */
    uint8_t *data;
    size_t bytes, count;
    size_t offsets[BATCH_MAX + 1]; /* in elements: bytes, or floats for samples */
    size_t heights[BATCH_MAX], widths[BATCH_MAX];
    size_t rate;
} batch_t;

batch_t *batch_new(batch_kind_t kind);
void batch_free(batch_t *batch);
void batch_add(batch_t *batch, void const *data, size_t elements);
void batch_add_path(batch_t *batch, char const *name); /* the path of `name` in the folder */
/* RGB8 pixels of `height` x `width` in `bytes` bytes (deliberately wrong in some tests). */
void batch_add_pixels(batch_t *batch, void const *rgb, size_t bytes, size_t height, size_t width);
uform_tape_t batch_tape(batch_t const *batch);

/* A suite's encode verb over a batch: `executor` NULL runs on the calling thread; with `outcome` the call
 * is deferred and `encoded` may be NULL. */
typedef uform_status_t (*batch_encode_t)(batch_t const *batch, uform_executor_t *executor,
                                         uform_outputs_t outputs, uform_arena_t *arena,
                                         uform_encode_config_t const *config, uform_outcome_t *outcome,
                                         uform_encoded_t *encoded);

/* The arguments every encode verb shares, taken from a batch_encode_t's own parameters: for use in one,
 * as `uform_video_encode_args_t args = {ENCODE_ARGS(model), .videos = batch_tape(batch), ...}`. */
#define ENCODE_ARGS(model_)                                                                                  \
    .model = (model_), .executor = executor, .outputs = outputs, .arena = arena, .config = config,           \
    .encoded = encoded, .outcome = outcome

/* ---- Comparisons ---------------------------------------------------------------------------------- */

void const *row_of(uform_view_t const *view, size_t row);
double norm_of(float const *x, size_t n);
double cosine_of(float const *a, float const *b, size_t n); /* two zero vectors: 1 */
/* The float an IEEE half's bits stand for, exactly (not _Float16, which not every compiler has). */
float float_of_half(uint16_t bits);

/* Every output of item `i` of `a` equals every output of item `j` of `b`, bitwise (token vectors: as
 * many, and the same). */
void assert_same_item(uform_encoded_t const *a, size_t i, uform_encoded_t const *b, size_t j);

/* Every row item `i` has in every output is zero. */
void assert_zero_item(uform_encoded_t const *encoded, size_t i);

/* ---- Checks every encode verb passes ---------------------------------------------------------------- */

/* Encodes `batch` (every output) on `executor`, blocking or deferred, in an arena of its own, and copies
 * every output's bytes and the statuses to `copy`. Answers how many bytes. */
size_t encode_copy(batch_encode_t encode, batch_t const *batch, uform_executor_t *executor, bool deferred,
                   unsigned char *copy);

/* Every receiver answers what the calling thread answers for `batch`, bitwise: RAM executors of 1, 2 and
 * 3 threads blocking, and deferred, and an inline executor, deferred. `twin`, the same items another way
 * (files of the bytes `batch` holds; NULL: `batch` itself), is what the calling thread encodes again and
 * what every deferred call encodes. */
void assert_same_on_every_receiver(batch_encode_t encode, batch_t const *batch, batch_t const *twin);

/* On the calling thread and on a RAM executor of 2 threads: a progress handler called every quarter is
 * called 2 to 4 times, last at every item; one that cancels at its first call makes the call CANCELLED
 * before the end; without a handler the same call then works, every item answering `expected`. */
void assert_progress_and_cancel(batch_encode_t encode, batch_t const *batch, uform_status_t expected);

/* Encodes `batch` on `executor` and checks every item's status against `expected`, the stats' counts,
 * failed items' rows zero, and every item equal to its encoding alone. */
/* Encodes `batch` (`outputs`) in F32, then with BF16, F16 and I8 outputs: every row of every output is
 * the F32 row converted by `convert` (the scalar kernels' own, kernels.h), with its scale for I8; then at
 * every matryoshka width of `info`: embeddings (and token vectors) of that many columns, each good
 * item's embedding the prefix of its F32 embedding, renormalized. */
typedef void (*convert_t)(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale);
void assert_conversions_and_matryoshka(batch_encode_t encode, batch_t const *batch, uform_outputs_t outputs,
                                       uform_model_info_t const *info, convert_t convert);

/* A verb over files or memory: an unknown source is refused at once ("unknown source"), blocking and
 * deferred (the outcome final with the same status); with the files source a missing file answers IO for
 * its item, the call itself `expected` (UFORM_OK; UFORM_UNSUPPORTED saying `why` where it is not built). */
void assert_sources_checked(batch_encode_t encode, uform_status_t expected, char const *why);

void assert_items_fail_alone(batch_encode_t encode, batch_t const *batch, uform_status_t const *expected,
                             uform_executor_t *executor);

/* A verb behind `void const *`: a suite's wrapper of one verb, over that verb's own arguments. */
typedef uform_status_t (*verb_t)(void const *args);

/* The verbs as verb_t, each over its own arguments type. */
uform_status_t text_encode_verb(void const *args);
uform_status_t image_encode_verb(void const *args);
uform_status_t image_encode_pixels_verb(void const *args);
uform_status_t audio_encode_samples_verb(void const *args);

/* `verb` refuses NULL arguments, then each of `count` bad argument sets (`bad`, an array of them, each
 * `size` bytes; `what[i]` names set i in a failure) with INVALID_ARGUMENT at once; after each, `good`
 * still answers `expected`. */
void assert_bad_arguments(verb_t verb, void const *good, void const *bad, size_t size,
                          char const *const *what, size_t count, uform_status_t expected);

/* The cases as files, then a missing file, the folder itself, an empty path and a path holding a NUL
 * byte (IO, IO, INVALID_ARGUMENT, INVALID_ARGUMENT), and the cases not file_only as bytes in memory:
 * every item answers its status alone (assert_items_fail_alone), on the calling thread and on a RAM
 * executor of 2 threads, which then still encodes a good case, deferred. */
void assert_cases_fail_alone(batch_encode_t encode, make_cases_t make);

/* More files than two chunks hold (150, the cases over and over), read through the ring while earlier
 * chunks compute, on the calling thread and a RAM executor of 2 threads: every item answers its case's
 * status and equals, bitwise, the first item of its case. */
void assert_chunked_reads(batch_encode_t encode, make_cases_t make);

/* The two checks above as cmocka tests, over the verb and cases their test's initial state points to:
 * in a suite's table, FILE_CASES_TEST("bad_files_fail_alone", test_cases_fail_alone, &file_cases). */
typedef struct file_cases {
    batch_encode_t encode;
    make_cases_t make;
} file_cases_t;

void test_cases_fail_alone(void **state); /* assert_cases_fail_alone over the file_cases_t */
void test_chunked_reads(void **state);    /* assert_chunked_reads over the file_cases_t */

/* A struct CMUnitTest named `name_` that runs `test_` with `cases_` (a file_cases_t *) as its state. */
#define FILE_CASES_TEST(name_, test_, cases_)                                                                \
    { .name = (name_), .test_func = (test_), .initial_state = (cases_) }

/* Both tests over the same cases, in a suite's table: `name_` for test_cases_fail_alone, then
 * "chunked_reads". */
#define FILE_CASES_TESTS(name_, cases_)                                                                      \
    FILE_CASES_TEST(name_, test_cases_fail_alone, cases_),                                                   \
        FILE_CASES_TEST("chunked_reads", test_chunked_reads, cases_)

#endif
