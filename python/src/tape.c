/* Python sequences into tapes, and arena views out into NumPy arrays.
 *
 * Items are copied into one buffer of the binding's (bytes end to end, count + 1 offsets counting the tape's
 * elements: bytes, or floats for samples) while the GIL is held, so that no other thread can change them
 * while the engine reads them without the GIL. Arrays
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
    size_t height, width; /* pixels only */
} item_bytes_t;

static void item_release(item_bytes_t *item) {
    if (item->has_buffer) PyBuffer_Release(&item->buffer);
    Py_XDECREF(item->owner);
}

static char const *const media_names[] = {
    [BINDING_PATHS] = "paths (str, os.PathLike)",
    [BINDING_ENCODED] = "encoded files (bytes)",
    [BINDING_PIXELS] = "pixels (uint8 arrays of height x width x 3)",
    [BINDING_SAMPLES] = "samples (float32 arrays of one dimension)",
};

/* What each kind of call takes, for its messages. */
static char const *const items_expected[] = {
    [BINDING_TEXTS] = "str or bytes",
    [BINDING_IMAGES] = "a path, bytes or a uint8 array of height x width x 3",
    [BINDING_CLIPS] = "a path or bytes",
    [BINDING_SOUNDS] = "a path, bytes or a float32 array of one dimension",
};
static char const *const arrays_expected[] = {
    [BINDING_TEXTS] = "",
    [BINDING_IMAGES] = " nor uint8 pixels of height x width x 3",
    [BINDING_CLIPS] = "",
    [BINDING_SOUNDS] = " nor float32 samples of one dimension",
};

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

static bool format_is(Py_buffer const *buffer, char const *format) {
    return buffer->format && !strcmp(buffer->format, format);
}

/* A buffer's bytes: one dimension of bytes (text or an encoded file), C-contiguous RGB8 pixels (height,
 * width, 3) of unsigned bytes for an image verb, or one dimension of float32 samples for an audio verb. */
static int item_buffer(PyObject *object, binding_items_t kind, Py_ssize_t index, item_bytes_t *item,
                       binding_media_t *media) {
    if (!PyObject_CheckBuffer(object) ||
        PyObject_GetBuffer(object, &item->buffer, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "item %zd: expected %s, not %.80s%s", index, items_expected[kind],
                     Py_TYPE(object)->tp_name,
                     PyObject_CheckBuffer(object) ? " that is not C-contiguous (numpy.ascontiguousarray)"
                                                  : "");
        return -1;
    }
    item->has_buffer = true;
    item->data = item->buffer.buf;
    item->length = (size_t)item->buffer.len;
    Py_buffer const *b = &item->buffer;
    bool bytes =
        b->itemsize == 1 && (!b->format || format_is(b, "B") || format_is(b, "b") || format_is(b, "c"));
    if (kind == BINDING_IMAGES && b->ndim == 3 && b->shape[2] == 3 && b->itemsize == 1 && format_is(b, "B")) {
        *media = BINDING_PIXELS;
        item->height = (size_t)b->shape[0];
        item->width = (size_t)b->shape[1];
        return 0;
    }
    if (kind == BINDING_SOUNDS && b->ndim == 1 && b->itemsize == sizeof(float) && format_is(b, "f")) {
        *media = BINDING_SAMPLES;
        return 0;
    }
    if (b->ndim > 1 || !bytes) {
        PyErr_Format(PyExc_TypeError, "item %zd: a buffer of %d dimensions of format '%s' is neither bytes%s",
                     index, b->ndim, b->format ? b->format : "B", arrays_expected[kind]);
        return -1;
    }
    *media = BINDING_ENCODED;
    return 0;
}

static int item_of(PyObject *object, binding_items_t kind, Py_ssize_t index, item_bytes_t *item,
                   binding_media_t *media) {
    binding_media_t found = BINDING_ENCODED;
    if (kind == BINDING_TEXTS && PyUnicode_Check(object)) {
        Py_ssize_t length = 0;
        item->data = PyUnicode_AsUTF8AndSize(object, &length);
        if (!item->data) return -1;
        item->length = (size_t)length;
        return 0;
    }
    int path = kind != BINDING_TEXTS ? item_path(object, item) : 0;
    if (path < 0) return -1;
    if (path)
        found = BINDING_PATHS;
    else if (item_buffer(object, kind, index, item, &found) < 0)
        return -1;
    if (index > 0 && *media != found) {
        PyErr_Format(PyExc_TypeError, "item %zd: %s and %s cannot be mixed in one call", index,
                     media_names[*media], media_names[found]);
        return -1;
    }
    *media = found;
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
    binding_media_t media = BINDING_ENCODED;
    int result = -1;
    size_t total = 0;
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (item_of(PySequence_Fast_GET_ITEM(fast, i), kind, i, &items[i], &media) < 0) goto done;
        total += items[i].length;
    }
    tape->bytes = PyMem_RawMalloc(total ? total : 1);
    tape->offsets = PyMem_RawMalloc(((size_t)count + 1) * sizeof(size_t));
    if (media == BINDING_PIXELS) {
        tape->heights = PyMem_RawMalloc(((size_t)count + 1) * sizeof(size_t));
        tape->widths = PyMem_RawMalloc(((size_t)count + 1) * sizeof(size_t));
    }
    if (!tape->bytes || !tape->offsets || (media == BINDING_PIXELS && (!tape->heights || !tape->widths))) {
        PyErr_NoMemory();
        goto done;
    }
    size_t at = 0, element = media == BINDING_SAMPLES ? sizeof(float) : 1; /* offsets count elements */
    for (Py_ssize_t i = 0; i < count; i++) {
        tape->offsets[i] = at / element;
        if (items[i].length) memcpy(tape->bytes + at, items[i].data, items[i].length);
        at += items[i].length;
        if (media == BINDING_PIXELS) tape->heights[i] = items[i].height, tape->widths[i] = items[i].width;
    }
    tape->offsets[count] = at / element;
    tape->tape = (uform_tape_t){
        .data = tape->bytes, .offsets = tape->offsets, .count = (size_t)count, .length = at / element};
    tape->media = media;
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
    PyMem_RawFree(tape->heights);
    PyMem_RawFree(tape->widths);
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

PyObject *binding_offsets_array(size_t const *offsets, size_t items) {
    Py_buffer buffer;
    PyObject *array = binding_array(items + 1, 0, "uint64", &buffer);
    if (!array) return NULL;
    uint64_t *to = buffer.buf;
    for (size_t i = 0; i <= items; i++)
        to[i] = offsets[i];
    PyBuffer_Release(&buffer);
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
