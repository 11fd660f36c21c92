/* uform_checkpoint_convert and uform_checkpoint_quantize: a model (a checkpoint, or a pretrained folder)
 * written again as one self-contained format-4 checkpoint, its weights as they loaded or with I8 weights
 * (docs/DESIGN.md, "I8 weights"), its tokenizer in the metadata.
 *
 *   the input loaded on the calling thread (uform_model_load_ram: every check a load makes)
 *     -> its tensors in the schema's order (checkpoint_schema_each): each block's linear weight that may be
 *        I8 (checkpoint_quantizable) and is BF16 becomes `<name>` I8 [out, in] and `<name>.scale` F32 [out],
 *        quantized per output row by the active kernels' quantize_weights, as a load asking for I8
 *        weights quantizes them (every path's bitwise kernel_quantize_weights): both hold the same bytes;
 *        every other tensor, and weights already I8 with their
 *        scales, are written as they are
 *     -> checkpoint_write of the F32 tensors first, then the BF16 ones, then the I8 ones, each kind in that
 *        order: the data section is contiguous (as the safetensors package requires) and every tensor's
 *        data starts at a multiple of its dtype's size (as the reader requires), whatever the counts;
 *        a temporary file beside the output, fsync, rename. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "errors.h"
#include "kernels.h"
#include "model.h"

#define QUANTIZE_ENTRY "uform_checkpoint_quantize"
#define CONVERT_ENTRY  "uform_checkpoint_convert"

typedef struct quantize_walk {
    uform_model_t const *model;
    checkpoint_source_t *sources; /* two per tensor at most */
    char (*names)[sizeof(((checkpoint_schema_tensor_t *)0)->name) + sizeof CHECKPOINT_SCALE_SUFFIX];
    int8_t **quantized; /* one per tensor: what this call made */
    size_t count, tensors;
    bool i8; /* quantize the layers that may be I8 */
} quantize_walk_t;

static int count_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    (void)tensor;
    ++*(size_t *)context;
    return 0;
}

/* The next source: a stored tensor as it is. */
static checkpoint_source_t *add_stored(quantize_walk_t *walk, char const *name) {
    checkpoint_tensor_t const *stored = NULL;
    void const *data = model_tensor(walk->model, name, &stored);
    checkpoint_source_t *source = &walk->sources[walk->count++];
    *source = (checkpoint_source_t){
        .name = stored->name, .dtype = stored->dtype, .rank = stored->rank, .data = data};
    memcpy(source->shape, stored->shape, sizeof source->shape);
    return source;
}

/* One tensor of the schema, and the scales of an I8 weight after it. Answers nonzero when out of memory. */
static int quantize_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    quantize_walk_t *walk = context;
    checkpoint_source_t *weight = add_stored(walk, tensor->name);
    bool quantize = walk->i8 && weight->dtype == CHECKPOINT_BF16 && checkpoint_quantizable(tensor);
    if (weight->dtype != CHECKPOINT_I8 && !quantize) return 0;
    char *scales_name = walk->names[walk->tensors];
    snprintf(scales_name, sizeof walk->names[0], "%s%s", tensor->name, CHECKPOINT_SCALE_SUFFIX);
    if (!quantize) {
        add_stored(walk, scales_name);
        return 0;
    }
    size_t const n = (size_t)tensor->shape[0], k = (size_t)tensor->shape[1];
    int8_t *q = walk->quantized[walk->tensors++] = malloc(n * k + n * sizeof(float));
    if (!q) return 1;
    float *scales = (float *)(void *)(q + n * k);
    void (*quantize_row)(int8_t *, float *, uint16_t const *, size_t) = kernels_active()->quantize_weights;
    for (size_t row = 0; row < n; ++row)
        quantize_row(q + row * k, &scales[row], (uint16_t const *)weight->data + row * k, k);
    weight->dtype = CHECKPOINT_I8;
    weight->data = q;
    walk->sources[walk->count++] = (checkpoint_source_t){
        .name = scales_name, .dtype = CHECKPOINT_F32, .rank = 1, .shape = {n}, .data = scales};
    return 0;
}

/* Sources [count] reordered into `ordered`: 4-byte dtypes first, then 2-byte, then 1-byte, each kind in
 * the order it came. */
static void order_by_size(checkpoint_source_t const *sources, size_t count, checkpoint_source_t *ordered) {
    size_t at = 0;
    for (size_t size = 4; size > 0; size /= 2)
        for (size_t i = 0; i < count; ++i)
            if (checkpoint_dtype_size(sources[i].dtype) == size) ordered[at++] = sources[i];
}

/* The walk over `model`'s tensors, then the file. */
static uform_status_t quantize_write(uform_model_t const *model, char const *output, bool i8,
                                     char const *entry) {
    uform_model_info_t const *info = &model->header.info;
    size_t tensors = 0;
    checkpoint_schema_each(info, count_visit, &tensors);
    checkpoint_source_t *ordered = calloc(2 * tensors, sizeof *ordered);
    quantize_walk_t walk = {.model = model,
                            .sources = calloc(2 * tensors, sizeof *walk.sources),
                            .names = calloc(tensors, sizeof *walk.names),
                            .quantized = calloc(tensors, sizeof *walk.quantized),
                            .i8 = i8};
    char *metadata = checkpoint_metadata_text(info, &model->header);
    uform_status_t status = UFORM_OUT_OF_MEMORY;
    char const *message = "out of memory";
    if (ordered && walk.sources && walk.names && walk.quantized && metadata &&
        !checkpoint_schema_each(info, quantize_visit, &walk)) {
        order_by_size(walk.sources, walk.count, ordered);
        status = checkpoint_write(output, metadata, ordered, walk.count, &message);
    }
    for (size_t i = 0; walk.quantized && i < walk.tensors; ++i)
        free(walk.quantized[i]);
    free(ordered);
    free(walk.sources);
    free(walk.names);
    free(walk.quantized);
    free(metadata);
    return status == UFORM_OK ? UFORM_OK : failed(status, entry, message);
}

/* Loads `input` and writes it to `output`. */
static uform_status_t convert(char const *input, char const *output, bool i8, char const *entry) {
    if (!input || !input[0] || !output || !output[0])
        return failed(UFORM_INVALID_ARGUMENT, entry, "args, input or output is NULL or empty");
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.path = input, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_OK) {
        uform_error_t error = uform_last_error();
        return failed(error.status, entry, error.message);
    }
    uform_status_t status = UFORM_OK;
    if (model->tokenizer && !model->header.tokenizer)
        status =
            failed(UFORM_UNSUPPORTED, entry, "a SentencePiece tokenizer does not travel in a checkpoint yet");
    if (status == UFORM_OK) status = quantize_write(model, output, i8, entry);
    uform_model_free(model);
    return status;
}

UFORM_EXPORT uform_status_t uform_checkpoint_quantize(uform_checkpoint_quantize_args_t const *args) {
    if (!args)
        return failed(UFORM_INVALID_ARGUMENT, QUANTIZE_ENTRY, "args, input or output is NULL or empty");
    return convert(args->input, args->output, true, QUANTIZE_ENTRY);
}

UFORM_EXPORT uform_status_t uform_checkpoint_convert(uform_checkpoint_convert_args_t const *args) {
    if (!args) return failed(UFORM_INVALID_ARGUMENT, CONVERT_ENTRY, "args is NULL");
    if (args->weights != UFORM_WEIGHTS_STORED && args->weights != UFORM_WEIGHTS_I8)
        return failed(UFORM_INVALID_ARGUMENT, CONVERT_ENTRY,
                      "weights is not UFORM_WEIGHTS_STORED or UFORM_WEIGHTS_I8");
    return convert(args->input, args->output, args->weights == UFORM_WEIGHTS_I8, CONVERT_ENTRY);
}
