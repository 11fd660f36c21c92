/* uform.Model: a checkpoint or a pretrained folder loaded into host memory (uform_model_load_ram) on an
 * executor, its description, and the encode verbs. Each encode call runs on an executor (the model's own
 * by default), without the GIL: blocking, answering a NumPy float32 array (items, width) copied out of
 * that executor's arena, or deferred (submit_*), answering a Call (call.c). A failed item fails the call
 * with its status, naming the item. */
#include <string.h>

#include "binding.h"

typedef struct binding_model {
    PyObject ob_base;
    uform_model_t *model;
    binding_executor_t *executor; /* where it loaded, and where its calls run by default */
    uform_model_info_t info;
} binding_model_t;

/* ---- loading ---------------------------------------------------------------------------------- */

static int weights_of(char const *name, uform_weights_t *weights) {
    static char const *const names[] = {"stored", "bf16", "i8"}; /* by uform_weights_t */
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) return *weights = (uform_weights_t)i, 0;
    PyErr_Format(PyExc_ValueError, "weights must be 'stored', 'bf16' or 'i8', not %.40s", name);
    return -1;
}

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
    if (weights_of(weights_name, &config.weights) < 0) goto done;
    executor = executor_argument(executor_object, NULL);
    if (!executor || binding_executor_acquire(executor, "uform_model_load_ram") < 0) goto done;
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {
        .executor = executor->executor, .path = PyBytes_AS_STRING(path), .config = &config, .model = &model};
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_model_load_ram(&load);
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

typedef enum verb { VERB_TEXTS = 0, VERB_IMAGES = 1 } verb_t;

static char const *const verb_entries[] = {"uform_text_encode", "uform_image_encode"};

/* The encode config from the keywords the verbs share; the prompt strings borrowed from `args`. */
typedef struct encode_options {
    PyObject *texts, *executor, *progress, *outputs;
    char const *dtype;
    Py_ssize_t dims;
    int normalize;
    char const *prompt, *prompt_name;
} encode_options_t;

static int options_parse(PyObject *args, PyObject *kwargs, verb_t verb, encode_options_t *options) {
    static char *text_keywords[] = {"texts",       "executor", "dims",  "normalize", "prompt",
                                    "prompt_name", "progress", "dtype", "outputs",   NULL};
    static char *image_keywords[] = {"images",   "executor", "dims",    "normalize",
                                     "progress", "dtype",    "outputs", NULL};
    *options = (encode_options_t){.dtype = "float32"};
    int parsed = verb == VERB_TEXTS
                     ? PyArg_ParseTupleAndKeywords(
                           args, kwargs, "O|$OnpzzOsO:encode_texts", text_keywords, &options->texts,
                           &options->executor, &options->dims, &options->normalize, &options->prompt,
                           &options->prompt_name, &options->progress, &options->dtype, &options->outputs)
                     : PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OnpOsO:encode_images", image_keywords,
                                                   &options->texts, &options->executor, &options->dims,
                                                   &options->normalize, &options->progress, &options->dtype,
                                                   &options->outputs);
    return parsed ? 0 : -1;
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
 * `encoded`) or deferred. */
static uform_status_t encode_run(verb_t verb, binding_model_t *self, binding_executor_t *executor,
                                 uform_outputs_t outputs, binding_tape_t const *tape,
                                 uform_encode_config_t const *config, uform_encoded_t *encoded,
                                 uform_outcome_t *outcome) {
    if (verb == VERB_TEXTS) {
        uform_text_encode_args_t args = {.model = self->model,
                                         .executor = executor->executor,
                                         .outputs = outputs,
                                         .arena = executor->arena,
                                         .config = config,
                                         .encoded = encoded,
                                         .outcome = outcome,
                                         .texts = tape->tape};
        return uform_text_encode(&args);
    }
    if (tape->media == BINDING_PIXELS) {
        uform_image_encode_pixels_args_t args = {.model = self->model,
                                                 .executor = executor->executor,
                                                 .outputs = outputs,
                                                 .arena = executor->arena,
                                                 .config = config,
                                                 .encoded = encoded,
                                                 .outcome = outcome,
                                                 .pixels = tape->tape,
                                                 .heights = tape->heights,
                                                 .widths = tape->widths};
        return uform_image_encode_pixels(&args);
    }
    uform_image_encode_args_t args = {.model = self->model,
                                      .executor = executor->executor,
                                      .outputs = outputs,
                                      .arena = executor->arena,
                                      .config = config,
                                      .encoded = encoded,
                                      .outcome = outcome,
                                      .images = tape->tape,
                                      .source = tape->media == BINDING_PATHS ? UFORM_SOURCE_FILES
                                                                             : UFORM_SOURCE_MEMORY};
    return uform_image_encode(&args);
}

/* A view's rows, and for one grouped per item the pair of them and their offsets. */
static PyObject *output_of(uform_view_t const *view) {
    PyObject *rows = binding_array_of_view(view, view->columns);
    if (!rows || !view->item_offsets) return rows;
    PyObject *offsets = binding_offsets_array(view->item_offsets, view->items);
    PyObject *pair = offsets ? PyTuple_Pack(2, rows, offsets) : NULL;
    Py_DECREF(rows);
    Py_XDECREF(offsets);
    return pair;
}

PyObject *binding_encoded_result(char const *entry, uform_encoded_t const *encoded,
                                 binding_request_t request) {
    for (size_t i = 0; i < encoded->items; i++) {
        if (encoded->statuses[i] == UFORM_OK) continue;
        char message[UFORM_ERROR_MESSAGE_SIZE];
        PyOS_snprintf(message, sizeof message, "item %zu failed: %s", i,
                      uform_status_name(encoded->statuses[i]));
        return binding_raise_status(encoded->statuses[i], entry, message);
    }
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

/* What a call of no item answers: the outputs asked, each of no row. */
static PyObject *encode_nothing(binding_model_t *self, verb_t verb, size_t width, uform_scalar_t scalar,
                                binding_request_t request) {
    static size_t const no_item[1] = {0};
    size_t hidden =
        verb == VERB_TEXTS ? self->info.text.transformer.hidden : self->info.image.transformer.hidden;
    uform_encoded_t none = {
        .embeddings = {.columns = width, .scalar = scalar},
        .token_vectors = {.columns = width, .scalar = scalar, .item_offsets = no_item},
        .states = {.columns = hidden, .scalar = scalar},
    };
    return binding_encoded_result(verb_entries[verb], &none, request);
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
        result = status == UFORM_OK ? binding_encoded_result(verb_entries[verb], &encoded, request)
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
        binding_call_new(executor, (PyObject *)self, verb_entries[verb], request, tape, config, progress);
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

static PyObject *model_encode(binding_model_t *self, PyObject *args, PyObject *kwargs, verb_t verb,
                              bool deferred) {
    encode_options_t options;
    if (model_check(self) < 0 || options_parse(args, kwargs, verb, &options) < 0) return NULL;
    if (options.dims < 0) {
        PyErr_SetString(PyExc_ValueError, "dims must be 0 (the model's full width) or a matryoshka width");
        return NULL;
    }
    uform_scalar_t scalar;
    binding_request_t request;
    if (scalar_of(options.dtype, &scalar) < 0 || request_of(options.outputs, &request) < 0) return NULL;
    binding_tape_t tape;
    if (binding_tape_from(options.texts, verb == VERB_TEXTS ? BINDING_TEXTS : BINDING_MEDIA, &tape) < 0)
        return NULL;
    PyObject *result = NULL;
    binding_executor_t *executor = executor_argument(options.executor, self->executor);
    if (!executor) goto done;
    if (tape.tape.count == 0 && !deferred) {
        result = encode_nothing(self, verb, options.dims ? (size_t)options.dims : self->info.dims, scalar,
                                request);
        goto done;
    }
    if (binding_executor_acquire(executor, verb_entries[verb]) < 0) goto done;
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

static PyObject *model_encode_texts(PyObject *self, PyObject *args, PyObject *kwargs) {
    return model_encode((binding_model_t *)self, args, kwargs, VERB_TEXTS, false);
}

static PyObject *model_encode_images(PyObject *self, PyObject *args, PyObject *kwargs) {
    return model_encode((binding_model_t *)self, args, kwargs, VERB_IMAGES, false);
}

static PyObject *model_submit_texts(PyObject *self, PyObject *args, PyObject *kwargs) {
    return model_encode((binding_model_t *)self, args, kwargs, VERB_TEXTS, true);
}

static PyObject *model_submit_images(PyObject *self, PyObject *args, PyObject *kwargs) {
    return model_encode((binding_model_t *)self, args, kwargs, VERB_IMAGES, true);
}

static PyObject *model_executor(PyObject *object, void *closure) {
    (void)closure;
    binding_model_t *self = (binding_model_t *)object;
    if (model_check(self) < 0) return NULL;
    Py_INCREF(self->executor);
    return (PyObject *)self->executor;
}

static PyMethodDef model_methods[] = {
    {"_info", model_info, METH_NOARGS, "_info() -> dict: the model's description (see Model.info)."},
    {"encode_texts", (PyCFunction)(void (*)(void))model_encode_texts, METH_VARARGS | METH_KEYWORDS,
     "encode_texts(texts, *, executor=None, dims=0, normalize=False, prompt=None, prompt_name=None,\n"
     "             progress=None, dtype='float32') -> numpy.ndarray\n\n"
     "Embeds texts (str, encoded as UTF-8, or bytes): a float32 array (len(texts), dims) copied out of the "
     "executor's arena. dims narrows to a matryoshka width; normalize asks for unit vectors where the "
     "model's family gives them unnormalized; prompt or prompt_name put a prompt before each text, as "
     "sentence-transformers does, for models that read tokens. progress(completed, total) is called from the "
     "executor's loop as texts are done; False cancels the call (CancelledError), and what it raises cancels "
     "it and is raised. dtype 'float16' or 'bfloat16' (its bits as "
     "uint16) gives rows of that kind, 'int8' the pair (int8 rows, float32 scales, value = q * scale)."},
    {"encode_images", (PyCFunction)(void (*)(void))model_encode_images, METH_VARARGS | METH_KEYWORDS,
     "encode_images(images, *, executor=None, dims=0, normalize=False, progress=None, dtype='float32')\n"
     "-> numpy.ndarray\n\n"
     "Embeds images: JPEG or PNG paths (str or os.PathLike) or encoded files (bytes), or RGB8 pixels "
     "(C-contiguous uint8 arrays of height x width x 3, as numpy.asarray(pil_image.convert('RGB'))), one "
     "kind "
     "per call. Raises "
     "UnsupportedError in a build without the image's decoder; the other arguments as encode_texts'."},
    {"submit_texts", (PyCFunction)(void (*)(void))model_submit_texts, METH_VARARGS | METH_KEYWORDS,
     "submit_texts(texts, **as encode_texts) -> Call\n\n"
     "encode_texts deferred: answers once submitted; the Call's fileno() turns readable when it is final, "
     "and result() answers the array. The executor stays held until then. See Model.aencode_texts."},
    {"submit_images", (PyCFunction)(void (*)(void))model_submit_images, METH_VARARGS | METH_KEYWORDS,
     "submit_images(images, **as encode_images) -> Call\n\nencode_images deferred, as submit_texts."},
    {NULL, NULL, 0, NULL},
};

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
