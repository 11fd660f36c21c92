/* uform.Tokenizer: a tokenizer.json or SentencePiece model (uform_tokenizer_open), one parsed from memory
 * (Tokenizer.parse), or a model's own (borrowed: the Tokenizer keeps the model alive, and never frees it);
 * the tokenize verb and the strings of ids. A call answers the ids (uint32, every text's end to end), the
 * spans (uint32 pairs of input bytes) and the offsets (uint64, len(texts) + 1) that group both per text;
 * the Python layer splits them. Without an executor a call runs on the calling thread into an arena of its
 * own, freed when it returns. */
#include <stdint.h>

#include "binding.h"

typedef struct binding_tokenizer {
    PyObject ob_base;
    uform_tokenizer_t const *tokenizer;
    PyObject *model; /* the model whose tokenizer this is (owned), or NULL for one of the Tokenizer's own */
} binding_tokenizer_t;

static int tokenizer_init(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"path", NULL};
    binding_tokenizer_t *self = (binding_tokenizer_t *)object;
    PyObject *path = NULL;
    if (self->tokenizer) {
        PyErr_SetString(PyExc_TypeError, "a Tokenizer is opened once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&:Tokenizer", keywords, PyUnicode_FSConverter, &path))
        return -1;
    uform_tokenizer_t *tokenizer = NULL;
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_tokenizer_open(PyBytes_AS_STRING(path), &tokenizer);
    PyEval_RestoreThread(thread);
    Py_DECREF(path);
    if (status != UFORM_OK) {
        binding_raise_last(status);
        return -1;
    }
    self->tokenizer = tokenizer;
    return 0;
}

static int tokenizer_check(binding_tokenizer_t *self) {
    if (self->tokenizer) return 0;
    PyErr_SetString(PyExc_ValueError, "the Tokenizer is not open");
    return -1;
}

static void tokenizer_dealloc(PyObject *object) {
    binding_tokenizer_t *self = (binding_tokenizer_t *)object;
    if (self->model)
        Py_DECREF(self->model);
    else
        uform_tokenizer_free((uform_tokenizer_t *)self->tokenizer); /* its own: opened or parsed */
    Py_TYPE(object)->tp_free(object);
}

/* A new Tokenizer of `type` around `tokenizer`, owned, or borrowed from `model` (NULL: owned). */
static PyObject *tokenizer_wrap(PyTypeObject *type, uform_tokenizer_t const *tokenizer, PyObject *model) {
    binding_tokenizer_t *self = (binding_tokenizer_t *)type->tp_alloc(type, 0);
    if (!self) {
        if (!model) uform_tokenizer_free((uform_tokenizer_t *)tokenizer);
        return NULL;
    }
    self->tokenizer = tokenizer;
    self->model = Py_XNewRef(model);
    return (PyObject *)self;
}

static PyObject *tokenizer_parse(PyObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"json", NULL};
    Py_buffer json;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*:parse", keywords, &json)) return NULL;
    uform_tokenizer_t *tokenizer = NULL;
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_tokenizer_parse(json.buf, (size_t)json.len, &tokenizer);
    PyEval_RestoreThread(thread);
    PyBuffer_Release(&json);
    if (status != UFORM_OK) return binding_raise_last(status);
    return tokenizer_wrap((PyTypeObject *)type, tokenizer, NULL);
}

static PyObject *tokenizer_of_model(PyObject *type, PyObject *model) {
    uform_model_t *handle = binding_model_of(model);
    if (!handle) return NULL;
    uform_tokenizer_t const *tokenizer = NULL;
    uform_status_t status = uform_model_tokenizer(handle, &tokenizer);
    if (status != UFORM_OK) return binding_raise_last(status);
    return tokenizer_wrap((PyTypeObject *)type, tokenizer, model);
}

static PyObject *tokenizer_token(PyObject *object, PyObject *id_object) {
    binding_tokenizer_t *self = (binding_tokenizer_t *)object;
    if (tokenizer_check(self) < 0) return NULL;
    unsigned long long id = PyLong_AsUnsignedLongLong(id_object);
    if (id == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL; /* not an int: TypeError */
        PyErr_Clear();
        id = UINT64_MAX;
    }
    if (id > UINT32_MAX)
        return binding_raise_status(UFORM_INVALID_ARGUMENT, "uform_tokenizer_token", "no token has this id");
    char const *string = NULL;
    size_t length = 0;
    uform_status_t status = uform_tokenizer_token(self->tokenizer, (uint32_t)id, &string, &length);
    if (status != UFORM_OK) return binding_raise_last(status);
    return PyUnicode_DecodeUTF8(string, (Py_ssize_t)length, "replace");
}

static PyObject *tokenizer_info(PyObject *object, void *closure) {
    (void)closure;
    binding_tokenizer_t *self = (binding_tokenizer_t *)object;
    if (tokenizer_check(self) < 0) return NULL;
    uform_tokenizer_info_t info;
    uform_status_t status = uform_tokenizer_info(self->tokenizer, &info);
    if (status != UFORM_OK) return binding_raise_last(status);
    return Py_BuildValue("{s:n,s:n,s:n,s:s}", "vocabulary", (Py_ssize_t)info.vocabulary, "max_length",
                         (Py_ssize_t)info.max_length, "special_added", (Py_ssize_t)info.special_added,
                         "model", info.model);
}

/* (ids, spans, offsets) copied out of the views, or the first failed text's status raised. */
static PyObject *tokenize_result(uform_tokenized_t const *tokenized) {
    if (binding_items_check("uform_text_tokenize", "text", tokenized->statuses, tokenized->items) < 0)
        return NULL;
    PyObject *offsets = binding_offsets_array(tokenized->ids.item_offsets, tokenized->items);
    if (!offsets) return NULL;
    PyObject *ids = binding_array_of_view(&tokenized->ids, 0);
    PyObject *spans = ids ? binding_array_of_view(&tokenized->spans, 2) : NULL;
    PyObject *result = spans ? PyTuple_Pack(3, ids, spans, offsets) : NULL;
    Py_XDECREF(ids);
    Py_XDECREF(spans);
    Py_DECREF(offsets);
    return result;
}

static PyObject *tokenizer_tokenize(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"texts", "special_tokens", "executor", NULL};
    binding_tokenizer_t *self = (binding_tokenizer_t *)object;
    PyObject *texts = NULL, *executor_object = Py_None;
    int special_tokens = 1;
    if (tokenizer_check(self) < 0 || !PyArg_ParseTupleAndKeywords(args, kwargs, "O|$pO:tokenize", keywords,
                                                                  &texts, &special_tokens, &executor_object))
        return NULL;
    binding_executor_t *executor = NULL;
    if (executor_object != Py_None) {
        if (!PyObject_TypeCheck(executor_object, &binding_executor_type)) {
            PyErr_Format(PyExc_TypeError, "executor must be a uform.Executor, not %.80s",
                         Py_TYPE(executor_object)->tp_name);
            return NULL;
        }
        executor = (binding_executor_t *)executor_object;
    }
    binding_tape_t tape;
    if (binding_tape_from(texts, BINDING_TEXTS, &tape) < 0) return NULL;
    PyObject *result = NULL;
    uform_arena_t *own_arena = NULL;
    bool held = false;
    if (executor && binding_executor_acquire(executor, "uform_text_tokenize") < 0) goto done;
    held = executor != NULL;
    uform_status_t status = executor ? UFORM_OK : uform_arena_create_host(&own_arena);
    if (status != UFORM_OK) {
        binding_raise_last(status);
        goto done;
    }
    uform_tokenize_config_t config = {.without_special_tokens = !special_tokens};
    uform_tokenized_t tokenized = {0};
    uform_text_tokenize_args_t call = {.tokenizer = self->tokenizer,
                                       .executor = executor ? executor->executor : NULL,
                                       .texts = tape.tape,
                                       .arena = executor ? executor->arena : own_arena,
                                       .config = &config,
                                       .tokenized = &tokenized};
    PyThreadState *thread = PyEval_SaveThread();
    status = tape.tape.count ? uform_text_tokenize(&call) : UFORM_OK;
    PyEval_RestoreThread(thread);
    if (status != UFORM_OK)
        binding_raise_last(status);
    else if (tape.tape.count)
        result = tokenize_result(&tokenized);
    else
        result = Py_BuildValue("(OOO)", Py_None, Py_None, Py_None);
done:
    if (held) binding_executor_release(executor);
    uform_arena_free(own_arena);
    binding_tape_free(&tape);
    return result;
}

static PyMethodDef tokenizer_methods[] = {
    {"_tokenize", (PyCFunction)(void (*)(void))tokenizer_tokenize, METH_VARARGS | METH_KEYWORDS,
     "_tokenize(texts, *, special_tokens=True, executor=None) -> (ids, spans, offsets), each a numpy array; "
     "(None, None, None) for no text. See Tokenizer.tokenize."},
    {"parse", (PyCFunction)(void (*)(void))tokenizer_parse, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "parse(json: bytes) -> Tokenizer\n\nA tokenizer from the bytes of a tokenizer.json in memory (never a "
     "SentencePiece model); the statuses of Tokenizer(path)."},
    {"_of_model", tokenizer_of_model, METH_O | METH_CLASS,
     "_of_model(model) -> Tokenizer: the model's own, borrowed (see Model.tokenizer)."},
    {"token", tokenizer_token, METH_O,
     "token(id: int) -> str\n\nThe string of token `id`, as tokenizers' id_to_token gives it: an added "
     "token's content, else the vocabulary's entry as the file writes it ('##ing', '\\u0120the'). Raises "
     "InvalidArgumentError for an id no token has."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tokenizer_getset[] = {
    {"info", tokenizer_info, NULL,
     "{'vocabulary': int, 'max_length': int, 'special_added': int, 'model': 'WordPiece' | 'BPE' | ...}",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject binding_tokenizer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uform._uform.Tokenizer",
    .tp_basicsize = sizeof(binding_tokenizer_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Tokenizer(path): a tokenizer.json, a SentencePiece model, or a model's folder holding one.",
    .tp_new = PyType_GenericNew,
    .tp_init = tokenizer_init,
    .tp_dealloc = tokenizer_dealloc,
    .tp_methods = tokenizer_methods,
    .tp_getset = tokenizer_getset,
};
