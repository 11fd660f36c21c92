/* uform._uform: the module, the library's version and features, and the engine's statuses as
 * exceptions. Every failure of the engine raises a subclass of uform.Error chosen by its status, with
 * the engine's status, entry point and message as attributes; where a builtin exception means the same
 * (ValueError, OSError, MemoryError, NotImplementedError) the class derives from it too. */
#include <string.h>

#include "binding.h"

/* ---- the exception classes -------------------------------------------------------------------- */

typedef struct status_class {
    uform_status_t status;
    char const *name; /* "uform.FormatError" */
    char const *doc;
    PyObject **builtin; /* a second base, or NULL */
} status_class_t;

static status_class_t const status_classes[] = {
    {UFORM_CANCELLED, "uform.CancelledError", "A progress handler cancelled the call.", NULL},
    {UFORM_CONTENDED, "uform.ContendedError", "The executor or its arena is held by another call.", NULL},
    {UFORM_INVALID_ARGUMENT, "uform.InvalidArgumentError", "The engine refused an argument.",
     &PyExc_ValueError},
    {UFORM_IO, "uform.InputOutputError", "A file could not be opened, read or written.", &PyExc_OSError},
    {UFORM_FORMAT, "uform.FormatError", "A checkpoint, folder, image or text is malformed.", NULL},
    {UFORM_OUT_OF_MEMORY, "uform.OutOfMemoryError", "Memory or threads could not be had.",
     &PyExc_MemoryError},
    {UFORM_DEVICE, "uform.DeviceError", "No such device, or a device fault.", NULL},
    {UFORM_UNSUPPORTED, "uform.UnsupportedError", "Not built in, or a tower the model lacks.",
     &PyExc_NotImplementedError},
    {UFORM_INTERNAL, "uform.InternalError", "An invariant of the engine broke: please report it.", NULL},
};
#define STATUS_CLASSES (sizeof(status_classes) / sizeof(status_classes[0]))

static PyObject *error_base;
static PyObject *error_classes[STATUS_CLASSES];

static PyObject *class_of(uform_status_t status) {
    for (size_t i = 0; i < STATUS_CLASSES; i++)
        if (status_classes[i].status == status) return error_classes[i];
    return error_base;
}

PyObject *binding_raise(uform_error_t error) {
    char rendered[UFORM_ERROR_MESSAGE_SIZE + 96];
    uform_error_render(&error, rendered, sizeof rendered);
    PyObject *type = class_of(error.status);
    PyObject *exception = PyObject_CallFunction(type, "s", rendered);
    if (!exception) return NULL;
    PyObject *status = PyLong_FromLong((long)error.status);
    PyObject *function = PyUnicode_FromString(error.entry);
    PyObject *message = PyUnicode_DecodeUTF8(error.message, (Py_ssize_t)strlen(error.message), "replace");
    int failed = !status || !function || !message ||
                 PyObject_SetAttrString(exception, "status", status) < 0 ||
                 PyObject_SetAttrString(exception, "function", function) < 0 ||
                 PyObject_SetAttrString(exception, "message", message) < 0;
    Py_XDECREF(status);
    Py_XDECREF(function);
    Py_XDECREF(message);
    if (!failed) PyErr_SetObject(type, exception);
    Py_DECREF(exception);
    return NULL;
}

PyObject *binding_raise_last(uform_status_t status) {
    uform_error_t error = uform_last_error();
    if (error.status != status) error = (uform_error_t){.status = status, .entry = "uform", .message = ""};
    return binding_raise(error);
}

PyObject *binding_raise_status(uform_status_t status, char const *entry, char const *message) {
    return binding_raise((uform_error_t){.status = status, .entry = entry, .message = message});
}

/* uform.Error, and one subclass per failing status, each with its status as a class attribute. */
static int add_error_classes(PyObject *module) {
    error_base = PyErr_NewExceptionWithDoc(
        "uform.Error",
        "A failure of the engine: `status` (an int, uform_status_t), `function` (the C entry point that "
        "failed) and `message` (the engine's own words).",
        NULL, NULL);
    if (!error_base || PyModule_AddObjectRef(module, "Error", error_base) < 0) return -1;
    for (size_t i = 0; i < STATUS_CLASSES; i++) {
        status_class_t const *c = &status_classes[i];
        PyObject *bases = c->builtin ? PyTuple_Pack(2, error_base, *c->builtin) : PyTuple_Pack(1, error_base);
        if (!bases) return -1;
        error_classes[i] = PyErr_NewExceptionWithDoc(c->name, c->doc, bases, NULL);
        Py_DECREF(bases);
        if (!error_classes[i] ||
            PyModule_AddObjectRef(module, strchr(c->name, '.') + 1, error_classes[i]) < 0)
            return -1;
        PyObject *status = PyLong_FromLong((long)c->status);
        int failed = !status || PyObject_SetAttrString(error_classes[i], "status", status) < 0;
        Py_XDECREF(status);
        if (failed) return -1;
    }
    return 0;
}

/* ---- module functions ------------------------------------------------------------------------- */

static PyObject *module_features(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    static char const *const names[] = {"uring",      "hwloc",      "jpeg",       "spng",
                                        "ffmpeg",     "cuda",       "nccl",       "mpi",
                                        "microhttpd", "fork_union", "tokenizers", "sentencepiece"};
    uint32_t features = uform_features();
    PyObject *set = PyFrozenSet_New(NULL);
    for (size_t bit = 0; set && bit < sizeof(names) / sizeof(names[0]); bit++) {
        if (!(features & (1u << bit))) continue;
        PyObject *name = PyUnicode_FromString(names[bit]);
        if (!name || PySet_Add(set, name) < 0) Py_CLEAR(set);
        Py_XDECREF(name);
    }
    return set;
}

static PyObject *module_kernels(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    char const *reason = NULL, *amx = NULL, *path = uform_kernels(&reason, &amx);
    return Py_BuildValue("{s:s,s:s,s:s}", "path", path, "reason", reason, "amx", amx);
}

static PyObject *module_hub_folder(PyObject *self, PyObject *id) {
    (void)self;
    char const *text = PyUnicode_AsUTF8(id);
    if (!text) return NULL;
    char folder[4096];
    size_t length = 0;
    uform_status_t status = uform_hub_folder(text, folder, sizeof folder, &length);
    if (status != UFORM_OK) return binding_raise_last(status);
    return PyUnicode_DecodeFSDefaultAndSize(folder, (Py_ssize_t)length);
}

static PyObject *module_status_name(PyObject *self, PyObject *status) {
    (void)self;
    long value = PyLong_AsLong(status);
    if (value == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(uform_status_name((uform_status_t)value));
}

static PyMethodDef module_methods[] = {
    {"features", module_features, METH_NOARGS,
     "features() -> frozenset[str]\n\nThe optional features this build of the engine has: 'jpeg', 'spng', "
     "'tokenizers', 'uring', ..."},
    {"kernels", module_kernels, METH_NOARGS,
     "kernels() -> dict[str, str]\n\nThe CPU kernel path this process computes on, chosen once for it: "
     "'path' ('avx512bf16', 'avx2', 'neon', ...), 'reason' (why it was chosen: the dispatcher's rule, or "
     "UFORM_KERNELS), 'amx' (whether Intel AMX's tiles are used, and why not)."},
    {"hub_folder", module_hub_folder, METH_O,
     "hub_folder(id: str) -> str\n\nThe folder of hub model `id` ('OWNER/NAME', then '@REVISION' if not "
     "main) in the local Hugging Face cache, as huggingface_hub finds it offline (HF_HUB_CACHE, HF_HOME, "
     "...); raises InputOutputError when it is not cached. Model() takes such an id where no file or folder "
     "of that name exists."},
    {"status_name", module_status_name, METH_O,
     "status_name(status: int) -> str\n\nThe engine's short name of a status: 'ok', 'io', 'format', ..."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "uform._uform",
    .m_doc = "The UForm engine (include/uform.h) through the CPython C API. Import `uform` instead.",
    .m_size = -1,
    .m_methods = module_methods,
};

static int add_type(PyObject *module, PyTypeObject *type, char const *name) {
    if (PyType_Ready(type) < 0) return -1;
    return PyModule_AddObjectRef(module, name, (PyObject *)type);
}

PyMODINIT_FUNC PyInit__uform(void) {
    PyObject *module = PyModule_Create(&module_definition);
    if (!module) return NULL;
    int major, minor, patch;
    uform_version(&major, &minor, &patch);
    PyObject *version = Py_BuildValue("(iii)", major, minor, patch);
    int failed = !version || PyModule_AddObjectRef(module, "version", version) < 0;
    Py_XDECREF(version);
    if (failed || add_error_classes(module) < 0 ||
        PyModule_AddFunctions(module, binding_checkpoint_methods) < 0 ||
        add_type(module, &binding_executor_type, "Executor") < 0 ||
        add_type(module, &binding_model_type, "Model") < 0 ||
        add_type(module, &binding_tokenizer_type, "Tokenizer") < 0 ||
        add_type(module, &binding_call_type, "Call") < 0 ||
        add_type(module, &binding_arrow_rows_type, "ArrowRows") < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
