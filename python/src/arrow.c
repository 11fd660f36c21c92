/* uform.ArrowRows: embeddings' rows handed to Arrow without a copy, through the Arrow C Data Interface and
 * its PyCapsule protocol (`__arrow_c_array__`), so that pyarrow, polars or any other consumer imports them.
 *
 * Data flow: ArrowRows(rows) holds a buffer view of a C-contiguous (items, width) array of float32 (or
 * float16). `__arrow_c_array__` exports it as FixedSizeList<float32>[width]: a parent array of `items` lists
 * with no validity buffer, whose one child is the `items * width` scalars, its data buffer the array's own
 * memory. Each exported ArrowArray, parent and child, holds a reference to the ArrowRows object in its
 * private data, so the memory stays alive until the consumer releases both, from any thread (the release
 * takes the GIL). The structures are the specification's, a stable ABI: no Arrow library is linked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"

/* ---- the Arrow C Data Interface's structures (arrow/c/abi.h, as the specification gives them) --------- */

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE           2
#define ARROW_FLAG_MAP_KEYS_SORTED    4

struct ArrowSchema {
    char const *format;
    char const *name;
    char const *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    void const **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#endif

/* ---- the object ---------------------------------------------------------------------------------- */

typedef struct arrow_rows {
    PyObject ob_base;
    Py_buffer view;            /* (items, width), C-contiguous; holds the array */
    char const *scalar_format; /* Arrow's format of one scalar: "f" float32, "e" float16 */
} arrow_rows_t;

/* ---- schemas: "+w:WIDTH" over one child of the scalar's format --------------------------------------- */

typedef struct schema_private {
    char format[32]; /* "+w:64" */
    struct ArrowSchema *children[1];
} schema_private_t;

/* The child's strings are static and its struct is the parent's to free: its release only marks it. */
static void release_child_schema(struct ArrowSchema *schema) {
    schema->release = NULL;
}

static void release_list_schema(struct ArrowSchema *schema) {
    schema_private_t *private = schema->private_data;
    struct ArrowSchema *child = private->children[0];
    if (child->release) child->release(child);
    free(child);
    free(private);
    schema->release = NULL;
}

/* Fills `schema` with FixedSizeList<scalar>[width]. Answers 0, or -1 out of memory (`schema` untouched). */
static int export_schema(arrow_rows_t const *self, struct ArrowSchema *schema) {
    schema_private_t *private = calloc(1, sizeof *private);
    struct ArrowSchema *child = calloc(1, sizeof *child);
    if (!private || !child) {
        free(private);
        free(child);
        return -1;
    }
    snprintf(private->format, sizeof private->format, "+w:%lld", (long long)self->view.shape[1]);
    *child = (struct ArrowSchema){.format = self->scalar_format,
                                  .name = "item",
                                  .flags = ARROW_FLAG_NULLABLE,
                                  .release = release_child_schema};
    private->children[0] = child;
    *schema = (struct ArrowSchema){.format = private->format,
                                   .name = "",
                                   .flags = ARROW_FLAG_NULLABLE,
                                   .n_children = 1,
                                   .children = private->children,
                                   .release = release_list_schema,
                                   .private_data = private};
    return 0;
}

/* ---- arrays: each one's private data holds the rows object alive -------------------------------------- */

typedef struct array_private {
    PyObject *owner;        /* the ArrowRows (a strong reference) */
    void const *buffers[2]; /* the parent: validity; the child: validity and data */
    struct ArrowArray *children[1];
} array_private_t;

/* Drops the reference with the GIL, which a consumer may not hold (it may release from any thread); after
 * the interpreter is gone the memory is left to the process's end. */
static void drop_owner(PyObject *owner) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE state = PyGILState_Ensure();
    Py_DECREF(owner);
    PyGILState_Release(state);
}

/* A child may be moved out by the consumer and released alone: it frees its own private data, and the
 * parent frees the struct it allocated. */
static void release_child_array(struct ArrowArray *array) {
    array_private_t *private = array->private_data;
    drop_owner(private->owner);
    free(private);
    array->release = NULL;
}

static void release_list_array(struct ArrowArray *array) {
    array_private_t *private = array->private_data;
    struct ArrowArray *child = private->children[0];
    if (child->release) child->release(child);
    free(child);
    drop_owner(private->owner);
    free(private);
    array->release = NULL;
}

/* Fills `array` with the rows, two references to `self` taken. Answers 0, or -1 out of memory. */
static int export_array(arrow_rows_t *self, struct ArrowArray *array) {
    array_private_t *private = calloc(1, sizeof *private);
    array_private_t *child_private = calloc(1, sizeof *child_private);
    struct ArrowArray *child = calloc(1, sizeof *child);
    if (!private || !child_private || !child) {
        free(private);
        free(child_private);
        free(child);
        return -1;
    }
    int64_t items = (int64_t)self->view.shape[0], width = (int64_t)self->view.shape[1];
    child_private->owner = Py_NewRef((PyObject *)self);
    child_private->buffers[1] = self->view.buf;
    *child = (struct ArrowArray){.length = items * width,
                                 .n_buffers = 2,
                                 .buffers = child_private->buffers,
                                 .release = release_child_array,
                                 .private_data = child_private};
    private->owner = Py_NewRef((PyObject *)self);
    private->children[0] = child;
    *array = (struct ArrowArray){.length = items,
                                 .n_buffers = 1,
                                 .buffers = private->buffers,
                                 .n_children = 1,
                                 .children = private->children,
                                 .release = release_list_array,
                                 .private_data = private};
    return 0;
}

/* ---- the capsules ---------------------------------------------------------------------------------- */

static void schema_capsule_free(PyObject *capsule) {
    struct ArrowSchema *schema = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (!schema) return PyErr_Clear();
    if (schema->release) schema->release(schema);
    free(schema);
}

static void array_capsule_free(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (!array) return PyErr_Clear();
    if (array->release) array->release(array);
    free(array);
}

static PyObject *schema_capsule(arrow_rows_t const *self) {
    struct ArrowSchema *schema = malloc(sizeof *schema);
    if (!schema || export_schema(self, schema) < 0) {
        free(schema);
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(schema, "arrow_schema", schema_capsule_free);
    if (!capsule) {
        schema->release(schema);
        free(schema);
    }
    return capsule;
}

static PyObject *array_capsule(arrow_rows_t *self) {
    struct ArrowArray *array = malloc(sizeof *array);
    if (!array || export_array(self, array) < 0) {
        free(array);
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(array, "arrow_array", array_capsule_free);
    if (!capsule) {
        array->release(array);
        free(array);
    }
    return capsule;
}

/* ---- the type -------------------------------------------------------------------------------------- */

static PyObject *arrow_rows_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"rows", NULL};
    PyObject *rows;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:ArrowRows", keywords, &rows)) return NULL;
    arrow_rows_t *self = (arrow_rows_t *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    if (PyObject_GetBuffer(rows, &self->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        self->view.obj = NULL;
        Py_DECREF(self);
        PyErr_SetString(PyExc_TypeError, "ArrowRows: rows must be a C-contiguous array (a buffer)");
        return NULL;
    }
    char const *format = self->view.format;
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (strcmp(format, "f") == 0 && self->view.itemsize == 4) self->scalar_format = "f";
    if (strcmp(format, "e") == 0 && self->view.itemsize == 2) self->scalar_format = "e";
    if (self->view.ndim != 2 || !self->scalar_format || self->view.shape[1] < 1) {
        PyErr_Format(PyExc_TypeError,
                     "ArrowRows: rows must be float32 or float16 rows of (items, width >= 1), not %d "
                     "dimensions of format '%s'",
                     self->view.ndim, self->view.format);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void arrow_rows_dealloc(PyObject *object) {
    arrow_rows_t *self = (arrow_rows_t *)object;
    if (self->view.obj) PyBuffer_Release(&self->view);
    Py_TYPE(object)->tp_free(object);
}

/* `requested_schema` is not followed: the rows are exported as they are, which the protocol allows (the
 * consumer casts if it must). */
static PyObject *arrow_rows_c_array(PyObject *object, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"requested_schema", NULL};
    PyObject *requested = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:__arrow_c_array__", keywords, &requested)) return NULL;
    arrow_rows_t *self = (arrow_rows_t *)object;
    PyObject *schema = schema_capsule(self);
    PyObject *array = schema ? array_capsule(self) : NULL;
    PyObject *pair = array ? PyTuple_Pack(2, schema, array) : NULL;
    Py_XDECREF(schema);
    Py_XDECREF(array);
    return pair;
}

static PyObject *arrow_rows_c_schema(PyObject *object, PyObject *unused) {
    (void)unused;
    return schema_capsule((arrow_rows_t *)object);
}

static PyObject *arrow_rows_rows(PyObject *object, void *unused) {
    (void)unused;
    return Py_NewRef(((arrow_rows_t *)object)->view.obj);
}

static Py_ssize_t arrow_rows_length(PyObject *object) {
    return ((arrow_rows_t *)object)->view.shape[0];
}

static PyMethodDef arrow_rows_methods[] = {
    {"__arrow_c_array__", (PyCFunction)(void (*)(void))arrow_rows_c_array, METH_VARARGS | METH_KEYWORDS,
     "__arrow_c_array__(requested_schema=None) -> (schema capsule, array capsule)\n\nThe rows as Arrow's "
     "FixedSizeList<float32>[width] (float16: <halffloat>), through the Arrow C Data Interface, without a "
     "copy: the array holds this object, and so the rows, until the consumer releases it."},
    {"__arrow_c_schema__", arrow_rows_c_schema, METH_NOARGS,
     "__arrow_c_schema__() -> schema capsule\n\nThe type of __arrow_c_array__'s array."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef arrow_rows_getset[] = {
    {"rows", arrow_rows_rows, NULL, "The array whose memory is exported.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods arrow_rows_sequence = {.sq_length = arrow_rows_length};

PyTypeObject binding_arrow_rows_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uform.ArrowRows",
    .tp_basicsize = sizeof(arrow_rows_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "ArrowRows(rows): C-contiguous float32 (or float16) rows of (items, width) as an Arrow array "
        "of FixedSizeList<float32>[width] through the PyCapsule protocol (pyarrow.array(ArrowRows(rows)))"
        ", sharing the rows' memory.",
    .tp_new = arrow_rows_new,
    .tp_dealloc = arrow_rows_dealloc,
    .tp_methods = arrow_rows_methods,
    .tp_getset = arrow_rows_getset,
    .tp_as_sequence = &arrow_rows_sequence,
};
