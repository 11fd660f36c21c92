/* uform._uform.Call: an encode submitted deferred, for event loops (asyncio). The call owns what the
 * engine reads until it is final (the tape, the config and its prompt strings), the outcome (at one
 * address while pending), the executor it holds, and a pipe the engine writes 8 bytes to when the outcome
 * turns final (uform_outcome_notify_eventfd): the loop watches the read end, fileno(). result() then
 * copies the embeddings out of the arena and hands the executor back.
 *
 *     submitted --(engine: final, 8 bytes on the pipe)--> final --result()--> taken
 *
 * A call dropped before its result is taken waits for the engine (uform_outcome_destroy) without the
 * GIL, then frees what it owns. The engine writes the notification just after the outcome turns final, so
 * the pipe is closed only once those 8 bytes have arrived (call_close_pipe). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "binding.h"

struct binding_call {
    PyObject ob_base;
    uform_outcome_t *outcome;
    binding_tape_t tape;
    uform_encode_config_t config;
    char *prompt, *prompt_name;   /* the config's strings, owned */
    binding_progress_t progress;  /* the state of the config's progress handler */
    binding_executor_t *executor; /* held from submission until the result is taken */
    PyObject *model;              /* kept alive while the engine runs it */
    char const *entry;
    binding_request_t request;
    int notify[2];  /* the pipe: read end for the loop, write end (non-blocking) for the engine */
    bool submitted; /* handed to the engine, which then notifies exactly once */
    bool taken;
};

static char *string_copy(char const *text) {
    if (!text) return NULL;
    size_t size = strlen(text) + 1;
    char *copy = PyMem_RawMalloc(size);
    if (copy) memcpy(copy, text, size);
    return copy;
}

static int pipe_open(int fds[2]) {
    if (pipe(fds) < 0) return -1;
    for (int i = 0; i < 2; i++)
        if (fcntl(fds[i], F_SETFD, FD_CLOEXEC) < 0) return -1;
    int flags = fcntl(fds[1], F_GETFL);
    return flags < 0 || fcntl(fds[1], F_SETFL, flags | O_NONBLOCK) < 0 ? -1 : 0;
}

binding_call_t *binding_call_new(binding_executor_t *executor, PyObject *model, char const *entry,
                                 binding_request_t request, binding_tape_t *tape,
                                 uform_encode_config_t const *config, PyObject *progress) {
    binding_call_t *call = PyObject_New(binding_call_t, &binding_call_type);
    if (!call) return NULL;
    call->progress = (binding_progress_t){0};
    call->outcome = aligned_alloc(UFORM_OUTCOME_ALIGNMENT, sizeof(uform_outcome_t));
    if (call->outcome) uform_outcome_init(call->outcome); /* before any failure: dealloc destroys it */
    call->tape = *tape;
    *tape = (binding_tape_t){0};
    call->config = *config;
    call->prompt = string_copy(config->prompt);
    call->prompt_name = string_copy(config->prompt_name);
    call->config.prompt = call->prompt;
    call->config.prompt_name = call->prompt_name;
    call->executor = NULL;
    call->model = Py_NewRef(model);
    call->entry = entry;
    call->request = request;
    call->notify[0] = call->notify[1] = -1;
    call->submitted = call->taken = false;
    if (binding_progress_init(&call->progress, progress) < 0) {
        Py_DECREF(call);
        return NULL;
    }
    call->config.progress = call->progress.progress;
    if (!call->outcome || (config->prompt && !call->prompt) || (config->prompt_name && !call->prompt_name)) {
        Py_DECREF(call);
        PyErr_NoMemory();
        return NULL;
    }
    if (pipe_open(call->notify) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(call);
        return NULL;
    }
    uform_outcome_notify_eventfd(call->outcome, call->notify[1]);
    Py_INCREF(executor);
    call->executor = executor;
    call->submitted = true; /* the caller submits it next, whatever the engine then answers */
    return call;
}

uform_outcome_t *binding_call_outcome(binding_call_t *call) {
    return call->outcome;
}
binding_tape_t const *binding_call_tape(binding_call_t *call) {
    return &call->tape;
}
uform_encode_config_t const *binding_call_config(binding_call_t *call) {
    return &call->config;
}

/* Hands the executor back once the engine is done with the call. */
static void call_release(binding_call_t *call) {
    if (call->taken || !call->executor) return;
    call->taken = true;
    binding_executor_release(call->executor);
}

/* How long a final call waits for its notification before leaving the pipe open instead: every path of
 * the engine that ends an initialized outcome notifies it, so this bounds only an engine fault. */
#define NOTIFY_GRACE_MS 10000

/* Closes the pipe of a final call once the engine's notification is in it (a submitted call), so that a
 * late write never lands in a descriptor whose number was reused meanwhile; left open if it never comes. */
static void call_close_pipe(binding_call_t *call) {
    if (call->submitted) {
        struct pollfd readable = {.fd = call->notify[0], .events = POLLIN};
        int ready;
        do
            ready = poll(&readable, 1, NOTIFY_GRACE_MS);
        while (ready < 0 && errno == EINTR);
        if (ready != 1) return;
    }
    for (int i = 0; i < 2; i++)
        if (call->notify[i] >= 0) close(call->notify[i]);
}

static void call_dealloc(PyObject *object) {
    binding_call_t *self = (binding_call_t *)object;
    PyThreadState *thread = PyEval_SaveThread();
    if (self->outcome) uform_outcome_destroy(self->outcome);
    call_close_pipe(self);
    PyEval_RestoreThread(thread);
    free(self->outcome);
    call_release(self);
    binding_tape_free(&self->tape);
    binding_progress_clear(&self->progress);
    PyMem_RawFree(self->prompt);
    PyMem_RawFree(self->prompt_name);
    Py_XDECREF(self->executor);
    Py_XDECREF(self->model);
    PyObject_Free(object);
}

static PyObject *call_fileno(PyObject *object, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(((binding_call_t *)object)->notify[0]);
}

static PyObject *call_done(PyObject *object, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(uform_outcome_status(((binding_call_t *)object)->outcome) != UFORM_PENDING);
}

static PyObject *call_result(PyObject *object, PyObject *unused) {
    (void)unused;
    binding_call_t *self = (binding_call_t *)object;
    if (self->taken) {
        PyErr_SetString(PyExc_ValueError, "the call's result was taken already");
        return NULL;
    }
    PyThreadState *thread = PyEval_SaveThread();
    uform_status_t status = uform_outcome_wait(self->outcome);
    PyEval_RestoreThread(thread);
    PyObject *result = NULL;
    uform_encoded_t encoded;
    if (status == UFORM_OK) status = uform_outcome_encoded(self->outcome, &encoded);
    if (binding_progress_raise(&self->progress) < 0)
        result = NULL;
    else if (status == UFORM_OK)
        result = binding_encoded_result(self->entry, &encoded, self->request);
    else
        binding_raise(uform_outcome_error(self->outcome));
    call_release(self);
    return result;
}

static PyMethodDef call_methods[] = {
    {"fileno", call_fileno, METH_NOARGS,
     "fileno() -> int\n\nA descriptor that turns readable once the call is final, for loop.add_reader."},
    {"done", call_done, METH_NOARGS, "done() -> bool\n\nWhether the call is final. Never blocks."},
    {"result", call_result, METH_NOARGS,
     "result() -> numpy.ndarray\n\nWaits (without the GIL) until the call is final, then answers what the "
     "encode answers "
     "or raises its failure (what the progress callback raised, if it did); once."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject binding_call_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uform._uform.Call",
    .tp_basicsize = sizeof(binding_call_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An encode submitted deferred: fileno() for an event loop, done(), result().",
    .tp_dealloc = call_dealloc,
    .tp_methods = call_methods,
};
