/* The video verb on host executors, behind its front door (src/encode/verbs.c): clips through the
 * image tower, in the image call (image_encode_host, src/encode/image.h), one image per sampled frame.
 *
 * A clip's `frames` images are decoded together (src/media/video_decode.h), run through the tower as
 * images of their chunk, and pooled here: each frame's class state projected at the full dims and
 * normalized is a token vector, their normalized mean the clip's embedding, and the mean of the
 * states the clip's state. */
#include <string.h>

#include "image.h"
#include "kernels.h"
#include "loop.h"
#include "model.h"

/* The mean of `count` rows of `columns` floats, `stride` floats apart, summed in order. [columns] */
static void rows_mean(float const *rows, size_t count, size_t stride, size_t columns, float *mean) {
    memset(mean, 0, columns * sizeof(float));
    for (size_t r = 0; r < count; ++r)
        for (size_t c = 0; c < columns; ++c)
            mean[c] += rows[r * stride + c];
    for (size_t c = 0; c < columns; ++c)
        mean[c] /= (float)count;
}

/* Clips: `kept` images, `frames` per clip, in order. Each frame's class state s_k is projected at the
 * full dims and normalized: f_k [dims]. Per clip, token vectors f_k at the output width (the prefix,
 * renormalized), the embedding normalize(mean_k f_k) at the width (the same prefix rule), the state
 * mean_k s_k [hidden]. */
void clip_rows(image_call_t *image, patch_scratch_t const *scratch, size_t kept) {
    tower_t const *tower = image->encode.model->image;
    kernels_t const *kernels = tower->kernels;
    size_t const hidden = tower->hidden, dims = tower->dims, width = image->encode.width,
                 frames = image->source.frames;
    uform_encoded_t *encoded = &image->encode.encoded;
    if (kept == 0) return;
    /* The states to project [kept, hidden]: the pooled ones, in scratch->rows (tower_patches_pool). */
    bool project = image->encode.outputs & (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS);
    if (project)
        tower_project(tower, image->call.executor, scratch->rows, hidden, kept, dims, scratch->projected,
                      dims);
    uint64_t converting = loop_now_ns();
    float *pooled = scratch->pooled;
    for (size_t clip = 0; clip < kept / frames; ++clip) {
        size_t item = scratch->items[clip * frames];
        float *embedded = scratch->projected + clip * frames * dims; /* f_k [frames, dims] */
        for (size_t k = 0; k < frames && project; ++k)
            kernels->normalize(embedded + k * dims, dims);
        for (size_t k = 0; k < frames && (image->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS); ++k) {
            float const *vector = embedded + k * dims;
            if (width < dims) {
                memcpy(pooled, vector, width * sizeof(float));
                kernels->normalize(pooled, width);
                vector = pooled;
            }
            output_row(kernels, &encoded->token_vectors, item * frames + k, vector);
        }
        if (image->encode.outputs & UFORM_OUTPUT_EMBEDDINGS) {
            rows_mean(embedded, frames, dims, dims, pooled);
            kernels->normalize(pooled, dims);
            if (width < dims) kernels->normalize(pooled, width);
            output_row(kernels, &encoded->embeddings, item, pooled);
        }
        if (image->encode.outputs & UFORM_OUTPUT_STATES) {
            rows_mean(scratch->rows + clip * frames * hidden, frames, hidden, hidden, pooled);
            output_row(kernels, &encoded->states, item, pooled);
        }
    }
    image->encode.stats.convert_ns += loop_now_ns() - converting;
}
