/* The one writer of the encode verbs' outputs on a VRAM executor (vram.h, vram_output_write): from a
 * chunk's final states on the device, by row indices, into the device arena.
 *
 *   x [tokens, hidden] -> gather the item rows [items, hidden] -> convert: states rows [first, ...)
 *                                                              -> BF16 -> project: embeddings
 *                      -> gather the token rows [tokens, hidden] -> BF16 -> project: token vectors */
#include "vram.h"

#if UFORM_WITH_CUDA

uform_status_t vram_output_write(vram_device_t *device, vram_tower_t const *tower,
                                 encode_call_t const *encode, float const *x, vram_pass_t const *pass,
                                 vram_output_rows_t const *rows, char const **message) {
    size_t hidden = tower->hidden;
    uform_encoded_t const *encoded = &encode->encoded;
    cudaStream_t stream = device->stream;
    uform_status_t status = UFORM_OK;
    if (encode->outputs & (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_STATES)) {
        VRAM_TRY(cuda_gather_rows(pass->gathered, hidden, x, hidden, rows->state_rows, rows->items, hidden,
                                  stream),
                 rows->gather_failed);
        if (encode->outputs & UFORM_OUTPUT_STATES) {
            uform_view_t const *states = &encoded->states;
            float *scales = states->scales ? (float *)states->scales + rows->first : NULL;
            VRAM_TRY(cuda_convert((unsigned char *)states->data + rows->first * states->row_stride,
                                  states->row_stride, scales, pass->gathered, hidden, rows->items, hidden,
                                  (int)states->scalar, stream),
                     rows->convert_failed);
        }
        if (encode->outputs & UFORM_OUTPUT_EMBEDDINGS) {
            VRAM_TRY(cuda_f32_to_bf16(pass->gathered_bf16, pass->gathered, rows->items * hidden, stream),
                     rows->convert_failed);
            status = vram_project(device, tower, pass->gathered_bf16, rows->items, encode->width,
                                  pass->projected, &encoded->embeddings, rows->first, message);
            if (status != UFORM_OK) return status;
        }
    }
    if ((encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS) && rows->tokens) {
        VRAM_TRY(cuda_gather_rows(pass->gathered, hidden, x, hidden, rows->token_rows, rows->tokens, hidden,
                                  stream),
                 rows->gather_failed);
        VRAM_TRY(cuda_f32_to_bf16(pass->gathered_bf16, pass->gathered, rows->tokens * hidden, stream),
                 rows->convert_failed);
        status = vram_project(device, tower, pass->gathered_bf16, rows->tokens, encode->width,
                              pass->projected, &encoded->token_vectors, rows->token_first, message);
        if (status != UFORM_OK) return status;
    }
    return UFORM_OK;
}

#endif /* UFORM_WITH_CUDA */
