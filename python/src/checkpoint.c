/* The checkpoint tools as module functions: uform.convert_checkpoint (a pretrained folder or a checkpoint
 * written as one format-4 checkpoint), uform.quantize_checkpoint (its layers as I8) and
 * uform.tiny_checkpoint (a small seeded checkpoint with every tower). Each blocks on the calling thread,
 * without the GIL, reading and writing files. */
#include <string.h>

#include "binding.h"

int binding_weights_of(char const *name, uform_weights_t *weights) {
    static char const *const names[] = {"stored", "bf16", "i8"}; /* by uform_weights_t */
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) return *weights = (uform_weights_t)i, 0;
    PyErr_Format(PyExc_ValueError, "weights must be 'stored', 'bf16' or 'i8', not %.40s", name);
    return -1;
}

/* What a tool answered, once it ran without the GIL: None, or its failure raised. */
static PyObject *tool_answer(uform_status_t status) {
    if (status != UFORM_OK) return binding_raise_last(status);
    Py_RETURN_NONE;
}

#define WITHOUT_GIL(call)                                                                                    \
    do {                                                                                                     \
        PyThreadState *thread = PyEval_SaveThread();                                                         \
        status = call;                                                                                       \
        PyEval_RestoreThread(thread);                                                                        \
    } while (0)

static PyObject *convert_checkpoint(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *keywords[] = {"input", "output", "weights", NULL};
    PyObject *input = NULL, *output = NULL;
    char const *weights = "stored";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&|$s:convert_checkpoint", keywords,
                                     PyUnicode_FSConverter, &input, PyUnicode_FSConverter, &output, &weights))
        return NULL;
    uform_checkpoint_convert_args_t convert_args = {.input = PyBytes_AS_STRING(input),
                                                    .output = PyBytes_AS_STRING(output)};
    PyObject *result = NULL;
    if (binding_weights_of(weights, &convert_args.weights) == 0) {
        uform_status_t status;
        WITHOUT_GIL(uform_checkpoint_convert(&convert_args));
        result = tool_answer(status);
    }
    Py_DECREF(input);
    Py_DECREF(output);
    return result;
}

static PyObject *quantize_checkpoint(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *keywords[] = {"input", "output", NULL};
    PyObject *input = NULL, *output = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&:quantize_checkpoint", keywords,
                                     PyUnicode_FSConverter, &input, PyUnicode_FSConverter, &output))
        return NULL;
    uform_checkpoint_quantize_args_t quantize_args = {.input = PyBytes_AS_STRING(input),
                                                      .output = PyBytes_AS_STRING(output)};
    uform_status_t status;
    WITHOUT_GIL(uform_checkpoint_quantize(&quantize_args));
    PyObject *result = tool_answer(status);
    Py_DECREF(input);
    Py_DECREF(output);
    return result;
}

static PyObject *tiny_checkpoint(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *keywords[] = {"path",    "seed",       "depth",       "hidden", "mlp",
                               "context", "image_size", "image_patch", NULL};
    PyObject *path = NULL;
    unsigned long long seed = 0;
    Py_ssize_t sizes[6] = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|$Knnnnnn:tiny_checkpoint", keywords,
                                     PyUnicode_FSConverter, &path, &seed, &sizes[0], &sizes[1], &sizes[2],
                                     &sizes[3], &sizes[4], &sizes[5]))
        return NULL;
    for (int i = 0; i < 6; i++)
        if (sizes[i] < 0) {
            Py_DECREF(path);
            PyErr_Format(PyExc_ValueError, "tiny_checkpoint(): %s must be 0 (its default) or more",
                         keywords[i + 2]);
            return NULL;
        }
    uform_tiny_checkpoint_args_t tiny_args = {.path = PyBytes_AS_STRING(path),
                                              .seed = seed,
                                              .depth = (size_t)sizes[0],
                                              .hidden = (size_t)sizes[1],
                                              .mlp = (size_t)sizes[2],
                                              .context = (size_t)sizes[3],
                                              .image_size = (size_t)sizes[4],
                                              .image_patch = (size_t)sizes[5]};
    uform_status_t status;
    WITHOUT_GIL(uform_tiny_checkpoint(&tiny_args));
    PyObject *result = tool_answer(status);
    Py_DECREF(path);
    return result;
}

PyMethodDef binding_checkpoint_methods[] = {
    {"convert_checkpoint", (PyCFunction)(void (*)(void))convert_checkpoint, METH_VARARGS | METH_KEYWORDS,
     "convert_checkpoint(input, output, *, weights='stored') -> None\n\n"
     "Writes the model at `input` (a format-4 checkpoint or a pretrained model's folder) as one "
     "self-contained format-4 checkpoint at `output` (atomically), which loads to the same embeddings bit "
     "for bit; weights 'i8' writes the layers as quantize_checkpoint does. Raises the load's errors for the "
     "input, UnsupportedError for a model cut by a SentencePiece file, InputOutputError when the output "
     "cannot be written."},
    {"quantize_checkpoint", (PyCFunction)(void (*)(void))quantize_checkpoint, METH_VARARGS | METH_KEYWORDS,
     "quantize_checkpoint(input, output) -> None\n\n"
     "Writes `input` again at `output` (atomically; may be the input) with its blocks' BF16 linear layers "
     "as I8 and their per-row scales: the bytes a load with weights='i8' makes."},
    {"tiny_checkpoint", (PyCFunction)(void (*)(void))tiny_checkpoint, METH_VARARGS | METH_KEYWORDS,
     "tiny_checkpoint(path, *, seed=0, depth=0, hidden=0, mlp=0, context=0, image_size=0, image_patch=0)\n"
     "-> None\n\n"
     "Writes a small, seeded, valid format-4 checkpoint with every tower (the same seed, the same bytes); "
     "0 takes each size's default (depth 2, hidden 64, mlp 2 * hidden, context 64, image 32 in patches of "
     "8)."},
    {NULL, NULL, 0, NULL},
};
