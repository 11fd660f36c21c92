/* uform.Executor: where calls run. Executor.inline() runs every call on the calling thread;
 * Executor.ram(threads=...) on worker threads of its own; Executor.vram(devices=...) on CUDA devices, one
 * host thread and a stream per device. Each holds the arena its calls write into, made at its first call
 * and reused (the engine rewinds it per call), and is held by one Python call at a time, from submission
 * until its outputs are copied out of the arena.
 *
 * Executors over a caller's thread pool (uform_executor_create_pool, _fork_union) are not bound: a pool of
 * Python threads would run the engine's fork-join work one thread at a time under the GIL, where a RAM
 * executor runs it on threads of its own. */
#include "binding.h"

static binding_executor_t *executor_wrap(PyTypeObject *type, uform_executor_t *executor) {
    binding_executor_t *self = (binding_executor_t *)type->tp_alloc(type, 0);
    if (!self) {
        uform_executor_free(executor);
        return NULL;
    }
    self->executor = executor;
    return self;
}

static PyObject *executor_inline(PyObject *type, PyObject *unused) {
    (void)unused;
    uform_executor_t *executor = NULL;
    uform_status_t status = uform_executor_create_inline(&executor);
    if (status != UFORM_OK) return binding_raise_last(status);
    return (PyObject *)executor_wrap((PyTypeObject *)type, executor);
}

static PyObject *executor_ram(PyObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"threads", "pin", NULL};
    Py_ssize_t threads = 0;
    int pin = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$np:ram", keywords, &threads, &pin)) return NULL;
    if (threads < 0) {
        PyErr_SetString(PyExc_ValueError, "ram(): threads must be 0 (7/8 of the cores) or more");
        return NULL;
    }
    uform_ram_options_t options;
    uform_ram_options_init(&options);
    options.threads = (size_t)threads;
    options.pin = pin != 0;
    uform_executor_t *executor = NULL;
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_executor_create_ram(&options, &executor);
    PyEval_RestoreThread(thread);
    if (status != UFORM_OK) return binding_raise_last(status);
    return (PyObject *)executor_wrap((PyTypeObject *)type, executor);
}

/* The devices keyword: None for device 0, else a sequence of CUDA device ordinals into `devices` (a
 * PyMem_Malloc'd array the caller frees). Answers 0, or -1 with an exception. */
static int devices_of(PyObject *sequence, size_t **devices, size_t *count) {
    *devices = NULL, *count = 0;
    if (!sequence || sequence == Py_None) return 0;
    PyObject *fast = PySequence_Fast(sequence, "vram(): devices must be a sequence of device ordinals");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *devices = PyMem_Malloc(((size_t)n + 1) * sizeof(size_t));
    if (!*devices) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t ordinal = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (ordinal == (size_t)-1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "vram(): devices[%zd] is not a device ordinal (an int >= 0)", i);
            Py_DECREF(fast);
            PyMem_Free(*devices);
            *devices = NULL;
            return -1;
        }
        (*devices)[i] = ordinal;
    }
    *count = (size_t)n;
    Py_DECREF(fast);
    return 0;
}

static PyObject *executor_vram(PyObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"devices", NULL};
    PyObject *sequence = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$O:vram", keywords, &sequence)) return NULL;
    uform_vram_options_t options = {0};
    size_t *devices = NULL;
    if (devices_of(sequence, &devices, &options.devices_count) < 0) return NULL;
    options.devices = devices;
    uform_executor_t *executor = NULL;
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_executor_create_vram(&options, &executor);
    PyEval_RestoreThread(thread);
    PyMem_Free(devices);
    if (status != UFORM_OK) return binding_raise_last(status);
    return (PyObject *)executor_wrap((PyTypeObject *)type, executor);
}

static PyObject *executor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)type, (void)args, (void)kwargs;
    PyErr_SetString(PyExc_TypeError, "make an Executor with Executor.inline(), Executor.ram(threads=...) or "
                                     "Executor.vram(devices=...)");
    return NULL;
}

/* Freeing waits for a call in flight (there is none: a Python call holds a reference) and, once no
 * model or arena refers to the executor, joins its threads: done without the GIL. */
static void executor_dealloc(PyObject *object) {
    binding_executor_t *self = (binding_executor_t *)object;
    PyThreadState *thread = PyEval_SaveThread();
    uform_arena_free(self->arena);
    uform_arena_free(self->side_arena);
    uform_executor_free(self->executor);
    PyEval_RestoreThread(thread);
    Py_TYPE(object)->tp_free(object);
}

int binding_executor_acquire(binding_executor_t *executor, char const *entry) {
    if (executor->busy) {
        binding_raise_status(UFORM_CONTENDED, entry, "the executor is running another Python thread's call");
        return -1;
    }
    if (!executor->arena) {
        uform_status_t status = uform_arena_create(executor->executor, &executor->arena);
        if (status != UFORM_OK) {
            binding_raise_last(status);
            return -1;
        }
    }
    executor->busy = true;
    return 0;
}

void binding_executor_release(binding_executor_t *executor) {
    executor->busy = false;
}

int binding_executor_side_arena(binding_executor_t *executor) {
    if (executor->side_arena) return 0;
    uform_status_t status = uform_arena_create(executor->executor, &executor->side_arena);
    if (status == UFORM_OK) return 0;
    binding_raise_last(status);
    return -1;
}

bool binding_executor_is_vram(binding_executor_t *executor) {
    uform_executor_info_t info;
    return uform_executor_info(executor->executor, &info) == UFORM_OK && info.kind == UFORM_EXECUTOR_VRAM;
}

static char const *const kind_names[] = {"inline", "ram", "pool", "vram"};

static PyObject *executor_info(PyObject *object, void *closure) {
    (void)closure;
    binding_executor_t *self = (binding_executor_t *)object;
    uform_executor_info_t info;
    uform_status_t status = uform_executor_info(self->executor, &info);
    if (status != UFORM_OK) return binding_raise_last(status);
    char const *kind = (size_t)info.kind < 4 ? kind_names[info.kind] : "unknown";
    return Py_BuildValue("{s:s,s:n,s:n,s:O}", "kind", kind, "threads", (Py_ssize_t)info.threads, "domains",
                         (Py_ssize_t)info.domains_count, "uring", info.uring ? Py_True : Py_False);
}

static PyObject *executor_drain(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"spinning", NULL};
    int spinning = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$p:drain", keywords, &spinning)) return NULL;
    binding_executor_t *self = (binding_executor_t *)object;
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_executor_drain(self->executor, spinning ? UFORM_SPINNING : UFORM_SLEEPING);
    PyEval_RestoreThread(thread);
    if (status != UFORM_OK) return binding_raise_last(status);
    Py_RETURN_NONE;
}

static PyMethodDef executor_methods[] = {
    {"inline", executor_inline, METH_NOARGS | METH_CLASS,
     "inline() -> Executor\n\nAn executor with no threads: every call runs on the calling thread."},
    {"ram", (PyCFunction)(void (*)(void))executor_ram, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "ram(*, threads=0, pin=True) -> Executor\n\nAn executor of `threads` worker threads of its own (0: 7/8 "
     "of "
     "the cores), each pinned to a core where the build has hwloc."},
    {"vram", (PyCFunction)(void (*)(void))executor_vram, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "vram(*, devices=None) -> Executor\n\nAn executor of one host thread and one CUDA stream per device "
     "(devices: CUDA ordinals; None: device 0). Models loaded on it go into device memory; its calls' "
     "outputs are copied to the host. Raises UnsupportedError in a build without CUDA, DeviceError where "
     "the driver, the runtime or the device is missing, InvalidArgumentError for a device listed twice or "
     "more than 16."},
    {"drain", (PyCFunction)(void (*)(void))executor_drain, METH_VARARGS | METH_KEYWORDS,
     "drain(*, spinning=False) -> None\n\nWaits until no call holds the executor; its idle workers then "
     "sleep, "
     "or poll with spinning=True (one busy core per thread) so that the next call starts without a wake-up."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef executor_getset[] = {
    {"info", executor_info, NULL,
     "{'kind': 'inline' | 'ram' | 'vram', 'threads': int, 'domains': int, 'uring': bool}", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject binding_executor_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uform.Executor",
    .tp_basicsize = sizeof(binding_executor_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Where calls run: Executor.inline(), Executor.ram(threads=...) or Executor.vram(devices=...). One "
        "call at a time; a second "
        "one, from another thread, raises ContendedError. Use one executor per thread to encode at once.",
    .tp_new = executor_new,
    .tp_dealloc = executor_dealloc,
    .tp_methods = executor_methods,
    .tp_getset = executor_getset,
};
