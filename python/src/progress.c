/* Progress callbacks: a Python callable called as callback(completed, total) from the thread that runs
 * the executor's loop (the calling thread on an inline executor, the loop thread of a RAM executor), with
 * the GIL taken for the call. It answers False to cancel the call (which then raises CancelledError once
 * in-flight work drains); anything else continues. An exception it raises cancels the call too and is
 * raised in place of CancelledError; the callback is not called again after it. */
#include "binding.h"

static uform_continuation_t progress_handler(void *state, size_t completed, size_t total) {
    binding_progress_t *self = state;
    PyGILState_STATE gil = PyGILState_Ensure();
    uform_continuation_t answer = UFORM_CANCEL;
    if (!self->raised) {
        PyObject *result =
            PyObject_CallFunction(self->callback, "nn", (Py_ssize_t)completed, (Py_ssize_t)total);
        if (result)
            answer = result == Py_False ? UFORM_CANCEL : UFORM_CONTINUE;
        else
            self->raised = binding_exception_take();
        Py_XDECREF(result);
    }
    PyGILState_Release(gil);
    return answer;
}

int binding_progress_init(binding_progress_t *self, PyObject *callback) {
    *self = (binding_progress_t){0};
    if (!callback || callback == Py_None) return 0;
    if (!PyCallable_Check(callback)) {
        PyErr_Format(PyExc_TypeError, "progress must be a callable (completed, total) or None, not %.80s",
                     Py_TYPE(callback)->tp_name);
        return -1;
    }
    self->callback = Py_NewRef(callback);
    self->progress = (uform_progress_t){.handler = progress_handler, .state = self};
    return 0;
}

int binding_progress_raise(binding_progress_t *self) {
    if (!self->raised) return 0;
    binding_exception_restore(self->raised);
    self->raised = NULL;
    return -1;
}

void binding_progress_clear(binding_progress_t *self) {
    Py_CLEAR(self->callback);
    Py_CLEAR(self->raised);
}

PyObject *binding_exception_take(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback) PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
#endif
}

void binding_exception_restore(PyObject *exception) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exception);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exception)), exception, PyException_GetTraceback(exception));
#endif
}
