/* Python sequences into tapes, and arena views out into NumPy arrays.
 *
 * Items are copied into one buffer of the binding's (bytes end to end, count + 1 offsets) while the GIL
 * is held, so that no other thread can change them while the engine reads them without the GIL. Arrays
 * are made by numpy.empty and filled through the buffer protocol: the extension compiles against no
 * NumPy header and runs with any NumPy. */
#include <string.h>

#include "binding.h"

/* One item's bytes, borrowed from a Python object kept alive by `owner`. */
typedef struct item_bytes {
    PyObject *owner; /* a new reference (an encoded path), or NULL when the buffer holds it */
    Py_buffer buffer;
    bool has_buffer;
    char const *data;
    size_t length;
} item_bytes_t;

static void item_release(item_bytes_t *item) {
    if (item->has_buffer) PyBuffer_Release(&item->buffer);
    Py_XDECREF(item->owner);
}

/* A path: str or os.PathLike, encoded as the file system encodes names. Answers 1 if it was a path, 0
 * if not, -1 with an exception. */
static int item_path(PyObject *object, item_bytes_t *item) {
    if (!PyUnicode_Check(object) && !PyObject_HasAttrString(object, "__fspath__")) return 0;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(object, &path)) return -1;
    item->owner = path;
    item->data = PyBytes_AS_STRING(path);
    item->length = (size_t)PyBytes_GET_SIZE(path);
    return 1;
}

static int item_of(PyObject *object, binding_items_t kind, Py_ssize_t index, item_bytes_t *item, int *paths) {
    if (kind == BINDING_MEDIA) {
        int path = item_path(object, item);
        if (path < 0) return -1;
        if (*paths >= 0 && *paths != path) {
            PyErr_Format(PyExc_TypeError,
                         "item %zd: paths (str, os.PathLike) and encoded files (bytes) "
                         "cannot be mixed in one call",
                         index);
            return -1;
        }
        *paths = path;
        if (path) return 0;
    } else if (PyUnicode_Check(object)) {
        Py_ssize_t length = 0;
        item->data = PyUnicode_AsUTF8AndSize(object, &length);
        if (!item->data) return -1;
        item->length = (size_t)length;
        return 0;
    }
    if (!PyObject_CheckBuffer(object) || PyObject_GetBuffer(object, &item->buffer, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "item %zd: expected %s, not %.80s", index,
                     kind == BINDING_TEXTS ? "str or bytes" : "a path (str, os.PathLike) or bytes",
                     Py_TYPE(object)->tp_name);
        return -1;
    }
    item->has_buffer = true;
    item->data = item->buffer.buf;
    item->length = (size_t)item->buffer.len;
    return 0;
}

int binding_tape_from(PyObject *sequence, binding_items_t kind, binding_tape_t *tape) {
    *tape = (binding_tape_t){0};
    if (PyUnicode_Check(sequence) || PyBytes_Check(sequence)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of items, not one str or bytes: wrap it in a list");
        return -1;
    }
    PyObject *fast = PySequence_Fast(sequence, "expected a sequence of items");
    if (!fast) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    item_bytes_t *items = PyMem_Calloc((size_t)count + 1, sizeof(item_bytes_t));
    int paths = -1, result = -1;
    size_t total = 0;
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (item_of(PySequence_Fast_GET_ITEM(fast, i), kind, i, &items[i], &paths) < 0) goto done;
        total += items[i].length;
    }
    tape->bytes = PyMem_RawMalloc(total ? total : 1);
    tape->offsets = PyMem_RawMalloc(((size_t)count + 1) * sizeof(size_t));
    if (!tape->bytes || !tape->offsets) {
        PyErr_NoMemory();
        goto done;
    }
    size_t at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        tape->offsets[i] = at;
        if (items[i].length) memcpy(tape->bytes + at, items[i].data, items[i].length);
        at += items[i].length;
    }
    tape->offsets[count] = at;
    tape->tape =
        (uform_tape_t){.data = tape->bytes, .offsets = tape->offsets, .count = (size_t)count, .length = at};
    tape->paths = paths == 1;
    result = 0;
done:
    for (Py_ssize_t i = 0; items && i < count; i++)
        item_release(&items[i]);
    PyMem_Free(items);
    Py_DECREF(fast);
    if (result < 0) binding_tape_free(tape);
    return result;
}

void binding_tape_free(binding_tape_t *tape) {
    PyMem_RawFree(tape->bytes);
    PyMem_RawFree(tape->offsets);
    *tape = (binding_tape_t){0};
}

PyObject *binding_array(size_t rows, size_t columns, char const *dtype, Py_buffer *buffer) {
    static PyObject *empty; /* numpy.empty, imported once */
    if (!empty) {
        PyObject *numpy = PyImport_ImportModule("numpy");
        if (!numpy) return NULL;
        empty = PyObject_GetAttrString(numpy, "empty");
        Py_DECREF(numpy);
        if (!empty) return NULL;
    }
    PyObject *shape = columns ? Py_BuildValue("(nn)", (Py_ssize_t)rows, (Py_ssize_t)columns)
                              : Py_BuildValue("(n)", (Py_ssize_t)rows);
    PyObject *array = shape ? PyObject_CallFunction(empty, "Os", shape, dtype) : NULL;
    Py_XDECREF(shape);
    if (array && PyObject_GetBuffer(array, buffer, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) Py_CLEAR(array);
    return array;
}

char const *binding_dtype_of(uform_scalar_t scalar) {
    static char const *const dtypes[] = {"float32", "uint16", "float16", "int8",
                                         "uint32"}; /* by uform_scalar_t */
    return (size_t)scalar < sizeof(dtypes) / sizeof(dtypes[0]) ? dtypes[scalar] : NULL;
}

PyObject *binding_array_of_view(uform_view_t const *view, size_t columns_as) {
    char const *dtype = binding_dtype_of(view->scalar);
    if (!dtype) return binding_raise_status(UFORM_INTERNAL, "uform_view_copy", "a view of an unknown scalar");
    Py_buffer buffer, scales_buffer = {0};
    PyObject *array = binding_array(view->rows, columns_as, dtype, &buffer);
    if (!array) return NULL;
    PyObject *scales = NULL;
    if (view->scalar == UFORM_I8 && !(scales = binding_array(view->rows, 0, "float32", &scales_buffer))) {
        PyBuffer_Release(&buffer);
        Py_DECREF(array);
        return NULL;
    }
    uform_status_t status = UFORM_OK;
    if (view->rows) { /* no rows: nothing to copy, and a view of none may have no data */
        PyThreadState *thread = PyEval_SaveThread();
        status = uform_view_copy(view, buffer.buf, (size_t)buffer.len, scales_buffer.buf);
        PyEval_RestoreThread(thread);
    }
    PyBuffer_Release(&buffer);
    if (scales) PyBuffer_Release(&scales_buffer);
    if (status != UFORM_OK) {
        Py_DECREF(array);
        Py_XDECREF(scales);
        return binding_raise_last(status);
    }
    if (!scales) return array;
    PyObject *pair = PyTuple_Pack(2, array, scales);
    Py_DECREF(array);
    Py_DECREF(scales);
    return pair;
}
