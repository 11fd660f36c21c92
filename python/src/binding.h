/* The CPython extension uform._uform over include/uform.h: what its files share.
 *
 * Data flow of every verb: Python objects are copied into a tape (tape.c) while the GIL is held; the GIL
 * is released for the whole engine call, which runs blocking on an executor (executor.c) into that
 * executor's arena; the views are copied out of the arena into NumPy arrays (tape.c) before the executor
 * is handed back, so that no Python object ever points into an arena. A failed status turns into an
 * exception of the uform.Error family carrying the engine's error (module.c). */
#ifndef UFORM_PYTHON_BINDING_H
#define UFORM_PYTHON_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include <uform.h>

/* ---- errors (module.c) ------------------------------------------------------------------------ */

/* Raises the exception of `status` for the failure `error` (its strings copied now). Answers NULL. */
PyObject *binding_raise(uform_error_t error);
/* Raises the calling thread's last engine error, which `status` is expected to match. Answers NULL. */
PyObject *binding_raise_last(uform_status_t status);
/* Raises the exception of `status` with a message of the binding's own, for `entry`. Answers NULL. */
PyObject *binding_raise_status(uform_status_t status, char const *entry, char const *message);

/* ---- executors (executor.c) ------------------------------------------------------------------- */

/* A Python executor: the engine's executor and the arena its calls write into. `busy` is set, under the
 * GIL, by the Python call that holds the executor, so that a second Python thread never rewinds the
 * arena between another call's return and its copy. */
typedef struct binding_executor {
    PyObject ob_base;
    uform_executor_t *executor;
    uform_arena_t *arena;      /* made at the first call */
    uform_arena_t *side_arena; /* made at the first choose: the states it reads, which its call's arena
                                  must not hold */
    bool busy;
} binding_executor_t;

extern PyTypeObject binding_executor_type;

/* Takes `executor` for one call: the arena made if needed. Answers 0, or -1 with an exception set
 * (ContendedError when another Python thread holds it). */
int binding_executor_acquire(binding_executor_t *executor, char const *entry);
void binding_executor_release(binding_executor_t *executor);
/* Makes the executor's side arena if needed, for a call that holds the executor. Answers 0, or -1. */
int binding_executor_side_arena(binding_executor_t *executor);
/* Whether the executor runs on CUDA devices (a VRAM executor): models load into its device memory. */
bool binding_executor_is_vram(binding_executor_t *executor);

/* ---- tapes and arrays (tape.c) ---------------------------------------------------------------- */

/* What the items of a call are: one kind per call. */
typedef enum binding_media {
    BINDING_ENCODED = 0, /* bytes-like: encoded files (texts, for the text verbs) */
    BINDING_PATHS = 1,   /* str or os.PathLike: files to read */
    BINDING_PIXELS = 2,  /* C-contiguous uint8 buffers of (height, width, 3): RGB8 pixels */
    BINDING_SAMPLES = 3, /* C-contiguous float32 buffers of one dimension: mono PCM samples */
} binding_media_t;

/* A tape whose bytes and offsets the binding owns (PyMem_RawMalloc: freed without the GIL too). Offsets
 * count the tape's elements: bytes, or floats for samples. */
typedef struct binding_tape {
    uform_tape_t tape;
    unsigned char *bytes;
    size_t *offsets;
    size_t *heights, *widths; /* pixels: one per item; else NULL */
    size_t rate;              /* samples: their rate in Hz, as the call was given it */
    binding_media_t media;
} binding_tape_t;

/* What a verb takes: texts, or the media kinds its items may be (paths and encoded files for each). */
typedef enum binding_items {
    BINDING_TEXTS = 0,  /* str (UTF-8) or bytes-like */
    BINDING_IMAGES = 1, /* paths, encoded files or pixels, not mixed */
    BINDING_CLIPS = 2,  /* paths or encoded files, not mixed */
    BINDING_SOUNDS = 3, /* paths, encoded files or samples, not mixed */
} binding_items_t;

/* Copies a sequence of items into `tape`. Answers 0, or -1 with TypeError naming the bad item. */
int binding_tape_from(PyObject *sequence, binding_items_t kind, binding_tape_t *tape);
void binding_tape_free(binding_tape_t *tape);

/* A new C-contiguous NumPy array of `rows` x `columns` (`columns` 0: one dimension of `rows`) of
 * `dtype` ("float32", "uint32"), and its writable buffer in `buffer`. Answers NULL with an exception. */
PyObject *binding_array(size_t rows, size_t columns, char const *dtype, Py_buffer *buffer);

/* The NumPy dtype of a scalar: float32, uint16 (BF16's bits), float16, int8, uint32; NULL for another. */
char const *binding_dtype_of(uform_scalar_t scalar);

/* A new uint64 array of the `items` + 1 offsets that group a view's rows per item. */
PyObject *binding_offsets_array(size_t const *offsets, size_t items);

/* A new array holding a copy of the view's rows in its scalar's dtype, `columns_as` columns (0: one
 * dimension); an I8 view gives the pair (int8 rows, float32 scales, one per row). NULL with an exception. */
PyObject *binding_array_of_view(uform_view_t const *view, size_t columns_as);

/* ---- progress callbacks (progress.c) ---------------------------------------------------------- */

/* A Python callable behind a uform_progress_t: `progress` is what a call's config takes (no handler for
 * None). Its state must stay at one address until the call is final. */
typedef struct binding_progress {
    PyObject *callback; /* owned, or NULL */
    PyObject *raised;   /* what the callback raised (owned), or NULL */
    uform_progress_t progress;
} binding_progress_t;

/* Answers 0, or -1 with TypeError for a callback that is neither callable nor None. */
int binding_progress_init(binding_progress_t *progress, PyObject *callback);
/* After the call: sets what the callback raised, if it did, and answers -1; else 0. */
int binding_progress_raise(binding_progress_t *progress);
void binding_progress_clear(binding_progress_t *progress);

/* The exception being raised, taken (a new reference; the error indicator cleared), and set again. */
PyObject *binding_exception_take(void);
void binding_exception_restore(PyObject *exception);

/* ---- encoding (model.c) and deferred calls (call.c) ------------------------------------------- */

/* What an encode asks for and how it answers: the embeddings' rows alone (`named` false), or a dict of the
 * outputs asked, by name ("embeddings", "token_vectors", "states"). */
typedef struct binding_request {
    uform_outputs_t outputs;
    bool named;
} binding_request_t;

/* Raises the status of the first item of `items` that failed, naming it ("item 3 failed: format", `noun`
 * "item"), for `entry`, and answers -1; 0 when none failed. */
int binding_items_check(char const *entry, char const *noun, uform_status_t const *statuses, size_t items);

/* The outputs of a final encode copied into new arrays, as `request` says (token vectors as the pair of
 * rows and uint64 offsets, items + 1), or the first failed item's status raised (NULL), for `entry`. */
PyObject *binding_encoded_result(char const *entry, uform_encoded_t const *encoded,
                                 binding_request_t request);

typedef struct binding_call binding_call_t;
extern PyTypeObject binding_call_type;

/* A deferred call taking over `tape` (left empty) and a copy of `config` with the `progress` callback (or
 * None), holding `executor` (acquired by
 * the caller) until its result is taken, its outcome initialized and notifying the call's pipe. Answers
 * NULL with an exception, the executor then still the caller's to release. */
binding_call_t *binding_call_new(binding_executor_t *executor, PyObject *model, char const *entry,
                                 binding_request_t request, binding_tape_t *tape,
                                 uform_encode_config_t const *config, PyObject *progress);
/* What the submission passes to the engine: the call's own copies. */
uform_outcome_t *binding_call_outcome(binding_call_t *call);
binding_tape_t const *binding_call_tape(binding_call_t *call);
uform_encode_config_t const *binding_call_config(binding_call_t *call);

/* ---- the module and its types (module.c, model.c, tokenizer.c, checkpoint.c) ----------------------- */

PyMODINIT_FUNC PyInit__uform(void);

/* The engine's model of a loaded uform.Model (borrowed: it lives as long as the object), or NULL with
 * TypeError or ValueError. */
uform_model_t *binding_model_of(PyObject *object);

/* The weights keyword: "stored", "bf16" or "i8" (by uform_weights_t). Answers 0, or -1 with ValueError. */
int binding_weights_of(char const *name, uform_weights_t *weights);

/* The checkpoint tools, module functions: convert_checkpoint, quantize_checkpoint, tiny_checkpoint. */
extern PyMethodDef binding_checkpoint_methods[];

extern PyTypeObject binding_model_type;
extern PyTypeObject binding_tokenizer_type;
extern PyTypeObject binding_arrow_rows_type; /* arrow.c */

#endif
