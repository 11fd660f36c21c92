/* uform.Model: a checkpoint or a pretrained folder loaded on an executor (into host memory, or device
 * memory for a VRAM executor: uform_model_load_vram), its description, the encode verbs of every modality,
 * text_choose, and its prompts. Each call runs on an executor (the model's own by default), without the
 * GIL: blocking, answering NumPy arrays copied out of that executor's arena, or deferred (submit_*),
 * answering a Call (call.c). A failed item fails the call with its status, naming the item. */
#include <string.h>

#include "binding.h"

typedef struct binding_model {
    PyObject ob_base;
    uform_model_t *model;
    binding_executor_t *executor; /* where it loaded, and where its calls run by default */
    uform_model_info_t info;
} binding_model_t;

/* ---- loading ---------------------------------------------------------------------------------- */

/* The executor argument: an Executor, or for None (`fallback` NULL) a new RAM executor. Answers a new
 * reference, or NULL with an exception. */
static binding_executor_t *executor_argument(PyObject *argument, binding_executor_t *fallback) {
    if (argument && argument != Py_None) {
        if (!PyObject_TypeCheck(argument, &binding_executor_type)) {
            PyErr_Format(PyExc_TypeError, "executor must be a uform.Executor, not %.80s",
                         Py_TYPE(argument)->tp_name);
            return NULL;
        }
        Py_INCREF(argument);
        return (binding_executor_t *)argument;
    }
    if (fallback) {
        Py_INCREF(fallback);
        return fallback;
    }
    return (binding_executor_t *)PyObject_CallMethod((PyObject *)&binding_executor_type, "ram", NULL);
}

static int model_init(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"path", "executor", "weights", "map", "progress", NULL};
    binding_model_t *self = (binding_model_t *)object;
    PyObject *path = NULL, *executor_object = NULL, *callback = NULL;
    char const *weights_name = "stored";
    int map = 0;
    if (self->model) {
        PyErr_SetString(PyExc_TypeError, "a Model is loaded once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|$OspO:Model", keywords, PyUnicode_FSConverter, &path,
                                     &executor_object, &weights_name, &map, &callback))
        return -1;
    uform_load_config_t config = {.map = map != 0};
    int result = -1;
    binding_executor_t *executor = NULL;
    binding_progress_t progress;
    if (binding_progress_init(&progress, callback) < 0) goto done;
    config.progress = progress.progress;
    if (binding_weights_of(weights_name, &config.weights) < 0) goto done;
    executor = executor_argument(executor_object, NULL);
    bool device = executor && binding_executor_is_vram(executor);
    if (!executor ||
        binding_executor_acquire(executor, device ? "uform_model_load_vram" : "uform_model_load_ram") < 0)
        goto done;
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {
        .executor = executor->executor, .path = PyBytes_AS_STRING(path), .config = &config, .model = &model};
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = device ? uform_model_load_vram(&load) : uform_model_load_ram(&load);
    PyEval_RestoreThread(thread);
    binding_executor_release(executor);
    if (binding_progress_raise(&progress) < 0) {
        uform_model_free(model);
        goto done;
    }
    if (status != UFORM_OK) {
        binding_raise_last(status);
        goto done;
    }
    self->model = model;
    uform_model_info(model, &self->info);
    self->executor = executor;
    executor = NULL;
    result = 0;
done:
    binding_progress_clear(&progress);
    Py_XDECREF(executor);
    Py_DECREF(path);
    return result;
}

static void model_dealloc(PyObject *object) {
    binding_model_t *self = (binding_model_t *)object;
    uform_model_free(self->model);
    Py_XDECREF(self->executor);
    Py_TYPE(object)->tp_free(object);
}

static int model_check(binding_model_t *self) {
    if (self->model) return 0;
    PyErr_SetString(PyExc_ValueError, "the Model is not loaded");
    return -1;
}

/* ---- its description -------------------------------------------------------------------------- */

static PyObject *tower_names(uform_model_info_t const *info) {
    bool const has[] = {info->has_text, info->has_image, info->has_video, info->has_audio};
    static char const *const names[] = {"text", "image", "video", "audio"};
    PyObject *towers = PyList_New(0);
    for (size_t i = 0; towers && i < 4; i++) {
        if (!has[i]) continue;
        PyObject *name = PyUnicode_FromString(names[i]);
        if (!name || PyList_Append(towers, name) < 0) Py_CLEAR(towers);
        Py_XDECREF(name);
    }
    if (!towers) return NULL;
    PyObject *tuple = PyList_AsTuple(towers);
    Py_DECREF(towers);
    return tuple;
}

static PyObject *model_info(PyObject *object, PyObject *unused) {
    (void)unused;
    binding_model_t *self = (binding_model_t *)object;
    if (model_check(self) < 0) return NULL;
    uform_model_info_t const *info = &self->info;
    PyObject *matryoshka = PyTuple_New((Py_ssize_t)info->matryoshka_count);
    for (size_t i = 0; matryoshka && i < info->matryoshka_count; i++) {
        PyObject *width = PyLong_FromSize_t(info->matryoshka[i]);
        if (!width)
            Py_CLEAR(matryoshka);
        else
            PyTuple_SET_ITEM(matryoshka, (Py_ssize_t)i, width);
    }
    PyObject *towers = tower_names(info);
    PyObject *dict = NULL;
    if (matryoshka && towers)
        dict = Py_BuildValue(
            "{s:n,s:O,s:n,s:n,s:O,s:s,s:O,s:s,s:n,s:n,s:n,s:n}", "dims", (Py_ssize_t)info->dims, "matryoshka",
            matryoshka, "parameters", (Py_ssize_t)info->parameters, "bytes", (Py_ssize_t)info->bytes,
            "towers", towers, "family", info->family, "normalized", info->normalized ? Py_True : Py_False,
            "weights", info->weights == UFORM_WEIGHTS_I8 ? "i8" : "bf16", "context",
            (Py_ssize_t)info->text.context, "vocab", (Py_ssize_t)info->text.vocab, "image_size",
            (Py_ssize_t)info->image.size, "video_frames", (Py_ssize_t)info->video.frames);
    Py_XDECREF(matryoshka);
    Py_XDECREF(towers);
    return dict;
}

/* ---- encoding --------------------------------------------------------------------------------- */

typedef enum verb { VERB_TEXTS = 0, VERB_IMAGES = 1, VERB_VIDEOS = 2, VERB_AUDIO = 3 } verb_t;

/* Per verb: the entry point its failed items name, its keywords (every one after the items keyword-only:
 * the shared ones, then the verb's own) and their format, and the items it takes. */
typedef struct verb_spec {
    char const *entry;
    char const *format;
    char *keywords[10];
    binding_items_t items;
} verb_spec_t;

#define SHARED_KEYWORDS "executor", "dims", "normalize", "progress", "dtype", "outputs"
static verb_spec_t verb_specs[] = {
    [VERB_TEXTS] = {"uform_text_encode",
                    "O|$OnpOsOzz:encode_texts",
                    {"texts", SHARED_KEYWORDS, "prompt", "prompt_name", NULL},
                    BINDING_TEXTS},
    [VERB_IMAGES] = {"uform_image_encode",
                     "O|$OnpOsO:encode_images",
                     {"images", SHARED_KEYWORDS, NULL},
                     BINDING_IMAGES},
    [VERB_VIDEOS] = {"uform_video_encode",
                     "O|$OnpOsO:encode_videos",
                     {"videos", SHARED_KEYWORDS, NULL},
                     BINDING_CLIPS},
    [VERB_AUDIO] = {"uform_audio_encode",
                    "O|$OnpOsOn:encode_audio",
                    {"sounds", SHARED_KEYWORDS, "rate", NULL},
                    BINDING_SOUNDS},
};
#undef SHARED_KEYWORDS

/* The encode config from the keywords the verbs share; the prompt strings borrowed from `args`. */
typedef struct encode_options {
    PyObject *items, *executor, *progress, *outputs;
    char const *dtype;
    Py_ssize_t dims;
    int normalize;
    char const *prompt, *prompt_name; /* texts */
    Py_ssize_t rate;                  /* sounds given as samples */
} encode_options_t;

static int options_parse(PyObject *args, PyObject *kwargs, verb_t verb, encode_options_t *options) {
    verb_spec_t *spec = &verb_specs[verb];
    *options = (encode_options_t){.dtype = "float32"};
    /* The verb's own keywords follow the shared ones: the prompts' for texts, the rate for sounds. */
    void *own = verb == VERB_AUDIO ? (void *)&options->rate : (void *)&options->prompt;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, spec->format, spec->keywords, &options->items,
                                     &options->executor, &options->dims, &options->normalize,
                                     &options->progress, &options->dtype, &options->outputs, own,
                                     &options->prompt_name))
        return -1;
    if (options->dims < 0) {
        PyErr_SetString(PyExc_ValueError, "dims must be 0 (the model's full width) or a matryoshka width");
        return -1;
    }
    if (options->rate < 0) {
        PyErr_SetString(PyExc_ValueError, "rate must be the samples' rate in Hz");
        return -1;
    }
    return 0;
}

static char const *const output_names[] = {"embeddings", "token_vectors",
                                           "states"}; /* by bit of uform_outputs_t */

/* The outputs keyword: None for the embeddings' rows alone, else an iterable of output names. */
static int request_of(PyObject *outputs, binding_request_t *request) {
    *request = (binding_request_t){.outputs = UFORM_OUTPUT_EMBEDDINGS};
    if (!outputs || outputs == Py_None) return 0;
    *request = (binding_request_t){.named = true};
    PyObject *iterator = PyUnicode_Check(outputs) ? NULL : PyObject_GetIter(outputs);
    PyObject *name = NULL;
    while (iterator && (name = PyIter_Next(iterator))) {
        int bit = -1;
        for (int i = 0; i < 3 && PyUnicode_Check(name); i++)
            if (PyUnicode_CompareWithASCIIString(name, output_names[i]) == 0) bit = i;
        Py_DECREF(name);
        if (bit < 0) break;
        request->outputs |= 1u << bit;
    }
    bool failed = !iterator || PyErr_Occurred() || name;
    Py_XDECREF(iterator);
    if (failed || !request->outputs) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError,
                        "outputs must be None or names among 'embeddings', 'token_vectors' and 'states'");
        return -1;
    }
    return 0;
}

/* The scalar outputs land as: "float32", "bfloat16" (its bits as uint16), "float16", "int8" (with scales). */
static int scalar_of(char const *dtype, uform_scalar_t *scalar) {
    static char const *const names[] = {"float32", "bfloat16", "float16", "int8"}; /* by uform_scalar_t */
    for (int i = 0; i < 4; i++)
        if (!strcmp(dtype, names[i])) return *scalar = (uform_scalar_t)i, 0;
    PyErr_Format(PyExc_ValueError, "dtype must be 'float32', 'bfloat16', 'float16' or 'int8', not %.40s",
                 dtype);
    return -1;
}

/* The call itself, without the GIL: on the executor, into its arena; blocking (`outcome` NULL, the views in
 * `encoded`) or deferred. The verb and the kind of the tape's items pick the entry point. */
static uform_status_t encode_run(verb_t verb, binding_model_t *self, binding_executor_t *executor,
                                 uform_outputs_t outputs, binding_tape_t const *tape,
                                 uform_encode_config_t const *config, uform_encoded_t *encoded,
                                 uform_outcome_t *outcome) {
#define COMMON                                                                                               \
    .model = self->model, .executor = executor->executor, .outputs = outputs, .arena = executor->arena,      \
    .config = config, .encoded = encoded, .outcome = outcome
    uform_source_t source = tape->media == BINDING_PATHS ? UFORM_SOURCE_FILES : UFORM_SOURCE_MEMORY;
    switch (verb) {
    case VERB_TEXTS:
        return uform_text_encode(&(uform_text_encode_args_t){COMMON, .texts = tape->tape});
    case VERB_IMAGES:
        if (tape->media == BINDING_PIXELS)
            return uform_image_encode_pixels(&(uform_image_encode_pixels_args_t){
                COMMON, .pixels = tape->tape, .heights = tape->heights, .widths = tape->widths});
        return uform_image_encode(
            &(uform_image_encode_args_t){COMMON, .images = tape->tape, .source = source});
    case VERB_VIDEOS:
        return uform_video_encode(
            &(uform_video_encode_args_t){COMMON, .videos = tape->tape, .source = source});
    case VERB_AUDIO:
        if (tape->media == BINDING_SAMPLES)
            return uform_audio_encode_samples(
                &(uform_audio_encode_samples_args_t){COMMON, .samples = tape->tape, .rate = tape->rate});
        return uform_audio_encode(
            &(uform_audio_encode_args_t){COMMON, .sounds = tape->tape, .source = source});
    }
#undef COMMON
    return UFORM_INTERNAL; /* no other verb */
}

/* A view's rows (`columns_as` columns; 0: one dimension), and for one grouped per item the pair of them and
 * their offsets. */
static PyObject *rows_of(uform_view_t const *view, size_t columns_as) {
    PyObject *rows = binding_array_of_view(view, columns_as);
    if (!rows || !view->item_offsets) return rows;
    PyObject *offsets = binding_offsets_array(view->item_offsets, view->items);
    PyObject *pair = offsets ? PyTuple_Pack(2, rows, offsets) : NULL;
    Py_DECREF(rows);
    Py_XDECREF(offsets);
    return pair;
}

static PyObject *output_of(uform_view_t const *view) {
    return rows_of(view, view->columns);
}

int binding_items_check(char const *entry, char const *noun, uform_status_t const *statuses, size_t items) {
    for (size_t i = 0; i < items; i++) {
        if (statuses[i] == UFORM_OK) continue;
        char message[UFORM_ERROR_MESSAGE_SIZE];
        PyOS_snprintf(message, sizeof message, "%s %zu failed: %s", noun, i, uform_status_name(statuses[i]));
        binding_raise_status(statuses[i], entry, message);
        return -1;
    }
    return 0;
}

PyObject *binding_encoded_result(char const *entry, uform_encoded_t const *encoded,
                                 binding_request_t request) {
    if (binding_items_check(entry, "item", encoded->statuses, encoded->items) < 0) return NULL;
    if (!request.named) return binding_array_of_view(&encoded->embeddings, encoded->embeddings.columns);
    uform_view_t const *views[] = {&encoded->embeddings, &encoded->token_vectors, &encoded->states};
    PyObject *dict = PyDict_New();
    for (int i = 0; dict && i < 3; i++) {
        if (!(request.outputs & (1u << i))) continue;
        PyObject *output = output_of(views[i]);
        if (!output || PyDict_SetItemString(dict, output_names[i], output) < 0) Py_CLEAR(dict);
        Py_XDECREF(output);
    }
    /* A model that reads tokens: each token vector's byte span in its text. */
    if (dict && (request.outputs & UFORM_OUTPUT_TOKEN_VECTORS) && encoded->token_spans.data) {
        PyObject *spans = output_of(&encoded->token_spans);
        if (!spans || PyDict_SetItemString(dict, "token_spans", spans) < 0) Py_CLEAR(dict);
        Py_XDECREF(spans);
    }
    return dict;
}

/* The width of a verb's STATES: its tower's hidden width (video: the image tower's). */
static size_t states_width(uform_model_info_t const *info, verb_t verb) {
    switch (verb) {
    case VERB_TEXTS:
        return info->text.transformer.hidden;
    case VERB_AUDIO:
        return info->audio.transformer.hidden;
    default:
        return info->image.transformer.hidden;
    }
}

/* What a call of no item answers: the outputs asked, each of no row. */
static PyObject *encode_nothing(binding_model_t *self, verb_t verb, size_t width, uform_scalar_t scalar,
                                binding_request_t request) {
    static size_t const no_item[1] = {0};
    uform_encoded_t none = {
        .embeddings = {.columns = width, .scalar = scalar},
        .token_vectors = {.columns = width, .scalar = scalar, .item_offsets = no_item},
        .states = {.columns = states_width(&self->info, verb), .scalar = scalar},
    };
    return binding_encoded_result(verb_specs[verb].entry, &none, request);
}

/* A blocking call: the outputs copied out of the executor's arena. */
static PyObject *encode_blocking(binding_model_t *self, verb_t verb, binding_executor_t *executor,
                                 binding_request_t request, binding_tape_t const *tape,
                                 uform_encode_config_t *config, PyObject *callback) {
    binding_progress_t progress;
    if (binding_progress_init(&progress, callback) < 0) {
        binding_executor_release(executor);
        return NULL;
    }
    config->progress = progress.progress;
    uform_encoded_t encoded = {0};
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = encode_run(verb, self, executor, request.outputs, tape, config, &encoded, NULL);
    PyEval_RestoreThread(thread);
    PyObject *result = NULL;
    if (binding_progress_raise(&progress) == 0)
        result = status == UFORM_OK ? binding_encoded_result(verb_specs[verb].entry, &encoded, request)
                                    : binding_raise_last(status);
    binding_executor_release(executor);
    binding_progress_clear(&progress);
    return result;
}

/* A deferred call: a Call owning the tape, the config and the executor's hold until its result is taken. A
 * failure found before submission is raised at once, as the engine answers it. */
static PyObject *encode_deferred(binding_model_t *self, verb_t verb, binding_executor_t *executor,
                                 binding_request_t request, binding_tape_t *tape,
                                 uform_encode_config_t const *config, PyObject *progress) {
    binding_call_t *call =
        binding_call_new(executor, (PyObject *)self, verb_specs[verb].entry, request, tape, config, progress);
    if (!call) {
        binding_executor_release(executor);
        return NULL;
    }
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = encode_run(verb, self, executor, request.outputs, binding_call_tape(call),
                                       binding_call_config(call), NULL, binding_call_outcome(call));
    PyEval_RestoreThread(thread);
    if (status == UFORM_OK) return (PyObject *)call;
    binding_raise_last(status);
    Py_DECREF(call);
    return NULL;
}

/* The items of a call into `tape`: samples take the call's rate, which nothing else takes. */
static int items_of(encode_options_t const *options, verb_t verb, binding_tape_t *tape) {
    if (binding_tape_from(options->items, verb_specs[verb].items, tape) < 0) return -1;
    if (tape->media == BINDING_SAMPLES) {
        tape->rate = (size_t)options->rate;
        return 0;
    }
    if (options->rate == 0) return 0;
    binding_tape_free(tape);
    PyErr_SetString(PyExc_ValueError, "rate is the rate of float32 samples: sound files carry their own");
    return -1;
}

static PyObject *model_encode(binding_model_t *self, PyObject *args, PyObject *kwargs, verb_t verb,
                              bool deferred) {
    encode_options_t options;
    if (model_check(self) < 0 || options_parse(args, kwargs, verb, &options) < 0) return NULL;
    uform_scalar_t scalar;
    binding_request_t request;
    if (scalar_of(options.dtype, &scalar) < 0 || request_of(options.outputs, &request) < 0) return NULL;
    binding_tape_t tape;
    if (items_of(&options, verb, &tape) < 0) return NULL;
    PyObject *result = NULL;
    binding_executor_t *executor = executor_argument(options.executor, self->executor);
    if (!executor) goto done;
    if (tape.tape.count == 0 && !deferred) {
        result = encode_nothing(self, verb, options.dims ? (size_t)options.dims : self->info.dims, scalar,
                                request);
        goto done;
    }
    if (binding_executor_acquire(executor, verb_specs[verb].entry) < 0) goto done;
    uform_encode_config_t config = {.outputs_scalar = scalar,
                                    .matryoshka = (size_t)options.dims,
                                    .normalize = options.normalize != 0,
                                    .prompt = options.prompt,
                                    .prompt_name = options.prompt_name};
    result = deferred ? encode_deferred(self, verb, executor, request, &tape, &config, options.progress)
                      : encode_blocking(self, verb, executor, request, &tape, &config, options.progress);
done:
    Py_XDECREF(executor);
    binding_tape_free(&tape);
    return result;
}

#define ENCODE_METHODS(name, verb)                                                                           \
    static PyObject *model_encode_##name(PyObject *self, PyObject *args, PyObject *kwargs) {                 \
        return model_encode((binding_model_t *)self, args, kwargs, verb, false);                             \
    }                                                                                                        \
    static PyObject *model_submit_##name(PyObject *self, PyObject *args, PyObject *kwargs) {                 \
        return model_encode((binding_model_t *)self, args, kwargs, verb, true);                              \
    }
ENCODE_METHODS(texts, VERB_TEXTS)
ENCODE_METHODS(images, VERB_IMAGES)
ENCODE_METHODS(videos, VERB_VIDEOS)
ENCODE_METHODS(audio, VERB_AUDIO)
#undef ENCODE_METHODS

/* ---- choosing the next byte ------------------------------------------------------------------- */

/* The texts' F32 states into the executor's side arena, then text_choose over them into its arena: both
 * blocking, in one release of the GIL. A text whose states failed fails the call before the choice. */
static uform_status_t choose_run(binding_model_t *self, binding_executor_t *executor,
                                 binding_tape_t const *texts, binding_tape_t const *choices,
                                 uform_progress_t const *progress, uform_encoded_t *encoded,
                                 uform_view_t *probabilities) {
    uform_encode_config_t config = {.outputs_scalar = UFORM_F32};
    uform_text_encode_args_t encode = {.model = self->model,
                                       .executor = executor->executor,
                                       .outputs = UFORM_OUTPUT_STATES,
                                       .arena = executor->side_arena,
                                       .config = &config,
                                       .encoded = encoded,
                                       .texts = texts->tape};
    uform_text_choose_args_t choose = {.model = self->model,
                                       .executor = executor->executor,
                                       .states = &encoded->states,
                                       .choices = choices->tape,
                                       .arena = executor->arena,
                                       .progress = progress,
                                       .probabilities = probabilities};
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_text_encode(&encode);
    for (size_t i = 0; status == UFORM_OK && i < encoded->items; i++)
        if (encoded->statuses[i] != UFORM_OK) status = UFORM_PENDING; /* raised per item, below */
    if (status == UFORM_OK) status = uform_text_choose(&choose);
    PyEval_RestoreThread(thread);
    return status;
}

/* The probabilities (one float32 per legal byte, every item's end to end) and the uint64 offsets that group
 * them per item, copied out; or the failure raised. */
static PyObject *choose_result(uform_status_t status, uform_encoded_t const *encoded,
                               uform_view_t const *probabilities) {
    if (status == UFORM_PENDING) {
        binding_items_check("uform_text_encode", "text", encoded->statuses, encoded->items);
        return NULL;
    }
    return status == UFORM_OK ? rows_of(probabilities, 0) : binding_raise_last(status);
}

static PyObject *model_choose(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"texts", "choices", "executor", "progress", NULL};
    static size_t const no_item[1] = {0};
    binding_model_t *self = (binding_model_t *)object;
    PyObject *texts_object = NULL, *choices_object = NULL, *executor_object = NULL, *callback = NULL;
    if (model_check(self) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OO:choose", keywords, &texts_object, &choices_object,
                                     &executor_object, &callback))
        return NULL;
    /* Refused before the texts are encoded: their states would be computed for nothing. */
    if (self->info.text.vocab > 0)
        return binding_raise_status(UFORM_UNSUPPORTED, "uform_text_choose",
                                    "text_choose reads a byte table: the model reads tokens");
    binding_tape_t texts, choices = {0};
    if (binding_tape_from(texts_object, BINDING_TEXTS, &texts) < 0) return NULL;
    PyObject *result = NULL;
    binding_executor_t *executor = NULL;
    binding_progress_t progress = {0};
    bool held = false;
    if (binding_tape_from(choices_object, BINDING_TEXTS, &choices) < 0 ||
        binding_progress_init(&progress, callback) < 0 ||
        !(executor = executor_argument(executor_object, self->executor)))
        goto done;
    if (texts.tape.count == 0 && choices.tape.count == 0) { /* no item: nothing the engine would take */
        result = rows_of(&(uform_view_t){.scalar = UFORM_F32, .columns = 1, .item_offsets = no_item}, 0);
        goto done;
    }
    if (binding_executor_acquire(executor, "uform_text_choose") < 0) goto done;
    held = true;
    if (binding_executor_side_arena(executor) < 0) goto done;
    uform_encoded_t encoded = {0};
    uform_view_t probabilities = {0};
    uform_status_t status =
        choose_run(self, executor, &texts, &choices, &progress.progress, &encoded, &probabilities);
    if (binding_progress_raise(&progress) == 0) result = choose_result(status, &encoded, &probabilities);
done:
    if (held) binding_executor_release(executor);
    binding_progress_clear(&progress);
    Py_XDECREF(executor);
    binding_tape_free(&texts);
    binding_tape_free(&choices);
    return result;
}

/* ---- prompts and the tokenizer ------------------------------------------------------------------ */

static PyObject *model_prompt(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"name", NULL};
    binding_model_t *self = (binding_model_t *)object;
    char const *name = NULL;
    if (model_check(self) < 0 || !PyArg_ParseTupleAndKeywords(args, kwargs, "|z:prompt", keywords, &name))
        return NULL;
    char small[256], *prompt = small;
    size_t length = 0;
    uform_status_t status = uform_model_prompt(self->model, name, small, sizeof small, &length);
    if (status == UFORM_INVALID_ARGUMENT && length >= sizeof small) { /* longer: asked again with room */
        if (!(prompt = PyMem_Malloc(length + 1))) return PyErr_NoMemory();
        status = uform_model_prompt(self->model, name, prompt, length + 1, &length);
    }
    PyObject *result = status == UFORM_OK ? PyUnicode_DecodeUTF8(prompt, (Py_ssize_t)length, "replace")
                                          : binding_raise_last(status);
    if (prompt != small) PyMem_Free(prompt);
    return result;
}

uform_model_t *binding_model_of(PyObject *object) {
    if (!PyObject_TypeCheck(object, &binding_model_type)) {
        PyErr_Format(PyExc_TypeError, "expected a uform.Model, not %.80s", Py_TYPE(object)->tp_name);
        return NULL;
    }
    binding_model_t *self = (binding_model_t *)object;
    return model_check(self) < 0 ? NULL : self->model;
}

static PyObject *model_executor(PyObject *object, void *closure) {
    (void)closure;
    binding_model_t *self = (binding_model_t *)object;
    if (model_check(self) < 0) return NULL;
    Py_INCREF(self->executor);
    return (PyObject *)self->executor;
}

#define KEYWORDS_CALL(function) (PyCFunction)(void (*)(void))(function), METH_VARARGS | METH_KEYWORDS

static PyMethodDef model_methods[] = {
    {"_info", model_info, METH_NOARGS, "_info() -> dict: the model's description (see Model.info)."},
    {"encode_texts", KEYWORDS_CALL(model_encode_texts),
     "encode_texts(texts, *, executor=None, dims=0, normalize=False, prompt=None, prompt_name=None,\n"
     "             progress=None, dtype='float32', outputs=None) -> numpy.ndarray\n\n"
     "Embeds texts (str, encoded as UTF-8, or bytes): a float32 array (len(texts), dims) copied out of the "
     "executor's arena. dims narrows to a matryoshka width; normalize asks for unit vectors where the "
     "model's family gives them unnormalized; prompt or prompt_name put a prompt before each text, as "
     "sentence-transformers does, for models that read tokens. progress(completed, total) is called from the "
     "executor's loop as texts are done; False cancels the call (CancelledError), and what it raises cancels "
     "it and is raised. dtype 'float16' or 'bfloat16' (its bits as uint16) gives rows of that kind, 'int8' "
     "the pair (int8 rows, float32 scales, value = q * scale). outputs names among 'embeddings', "
     "'token_vectors' and 'states' answer a dict of them."},
    {"encode_images", KEYWORDS_CALL(model_encode_images),
     "encode_images(images, *, executor=None, dims=0, normalize=False, progress=None, dtype='float32',\n"
     "              outputs=None) -> numpy.ndarray\n\n"
     "Embeds images: JPEG or PNG paths (str or os.PathLike) or encoded files (bytes), or RGB8 pixels "
     "(C-contiguous uint8 arrays of height x width x 3, as numpy.asarray(pil_image.convert('RGB'))), one "
     "kind per call. Raises UnsupportedError in a build without the image's decoder; the other arguments "
     "as encode_texts'."},
    {"encode_videos", KEYWORDS_CALL(model_encode_videos),
     "encode_videos(videos, *, executor=None, dims=0, normalize=False, progress=None, dtype='float32',\n"
     "              outputs=None) -> numpy.ndarray\n\n"
     "Embeds video clips: paths or encoded files (bytes) in any container and codec FFmpeg decodes, one "
     "kind per call; each clip's embedding is the mean of its sampled frames' (info.video_frames), its "
     "token vectors one per frame. Raises UnsupportedError in a build without FFmpeg, for a model without "
     "video and on a VRAM model; the other arguments as encode_texts'."},
    {"encode_audio", KEYWORDS_CALL(model_encode_audio),
     "encode_audio(sounds, *, rate=0, executor=None, dims=0, normalize=False, progress=None,\n"
     "             dtype='float32', outputs=None) -> numpy.ndarray\n\n"
     "Embeds sounds: paths or encoded files (bytes) in any format FFmpeg decodes, or mono samples "
     "(C-contiguous float32 arrays of one dimension) at `rate` Hz, one kind per call; rate is for samples "
     "alone. Raises UnsupportedError in a build without FFmpeg, for a model without audio and on a VRAM "
     "model; the other arguments as encode_texts'."},
    {"submit_texts", KEYWORDS_CALL(model_submit_texts),
     "submit_texts(texts, **as encode_texts) -> Call\n\n"
     "encode_texts deferred: answers once submitted; the Call's fileno() turns readable when it is final, "
     "and result() answers the array. The executor stays held until then. See Model.aencode_texts."},
    {"submit_images", KEYWORDS_CALL(model_submit_images),
     "submit_images(images, **as encode_images) -> Call\n\nencode_images deferred, as submit_texts."},
    {"submit_videos", KEYWORDS_CALL(model_submit_videos),
     "submit_videos(videos, **as encode_videos) -> Call\n\nencode_videos deferred, as submit_texts."},
    {"submit_audio", KEYWORDS_CALL(model_submit_audio),
     "submit_audio(sounds, **as encode_audio) -> Call\n\nencode_audio deferred, as submit_texts."},
    {"_choose", KEYWORDS_CALL(model_choose),
     "_choose(texts, choices, *, executor=None, progress=None) -> (probabilities, offsets): every item's "
     "float32 probabilities end to end and the uint64 offsets that group them. See Model.choose."},
    {"prompt", KEYWORDS_CALL(model_prompt),
     "prompt(name=None) -> str\n\nThe prompt a text takes before it is cut, as prompt_name picks it: the "
     "model's prompt `name`, or with None its default prompt; '' for '' or a model without a default. "
     "Raises InvalidArgumentError for a name the model lacks, UnsupportedError for a name on a model that "
     "reads bytes."},
    {NULL, NULL, 0, NULL},
};
#undef KEYWORDS_CALL

static PyGetSetDef model_getset[] = {
    {"executor", model_executor, NULL, "The executor the model loaded on, where its calls run by default.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject binding_model_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uform._uform.Model",
    .tp_basicsize = sizeof(binding_model_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc =
        "Model(path, *, executor=None, weights='stored', map=False, progress=None): a format-4 checkpoint "
        "or a pretrained model's folder, loaded into host memory on `executor` (None: a new RAM executor).",
    .tp_new = PyType_GenericNew,
    .tp_init = model_init,
    .tp_dealloc = model_dealloc,
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};
