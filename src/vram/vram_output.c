/* The one writer of the encode verbs' outputs on a VRAM executor (vram.h, vram_output_write and
 * vram_output_clips): from a chunk's final states on the device, by row indices, into the chunk's views,
 * which are the device arena's or, for a chunk on another device, a shadow over that device's scratch
 * that vram_views_land copies to the arena after.
 *
 *   x [tokens, hidden] -> gather the item rows [items, hidden] (-1: zeros) -> convert: states
 *                                                                        -> BF16 -> project: embeddings
 *                      -> gather the token rows [tokens, hidden] -> BF16 -> project: token vectors
 *   clips: x -> gather the frames' class rows [clips * frames, hidden] -> mean per clip: states
 *            -> BF16 -> project at dims, normalize: f [clips * frames, dims] -> mean per clip, normalize,
 *               prefix renormalized: embeddings; f's prefixes renormalized: token vectors */
#include "vram.h"

#if UFORM_WITH_CUDA

/* ---- Views -------------------------------------------------------------------------------------- */

/* The pieces of a shadow, in order: embeddings, their scales, states, their scales, token vectors, their
 * scales; each 256-byte aligned, 0 for an output not asked for (or scales of a scalar other than I8). */
static void views_pieces(encode_call_t const *encode, size_t items, size_t tokens, size_t hidden,
                         size_t pieces[6]) {
    size_t size = uform_scalar_size(encode->scalar), scales = encode->scalar == UFORM_I8;
    bool embeddings = encode->outputs & UFORM_OUTPUT_EMBEDDINGS,
         states = encode->outputs & UFORM_OUTPUT_STATES;
    bool vectors = encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS;
    pieces[0] = embeddings ? round_up_256(items * encode->width * size + 1) : 0;
    pieces[1] = embeddings && scales ? round_up_256(items * sizeof(float) + 1) : 0;
    pieces[2] = states ? round_up_256(items * hidden * size + 1) : 0;
    pieces[3] = states && scales ? round_up_256(items * sizeof(float) + 1) : 0;
    pieces[4] = vectors ? round_up_256(tokens * encode->width * size + 1) : 0;
    pieces[5] = vectors && scales ? round_up_256(tokens * sizeof(float) + 1) : 0;
}

size_t vram_views_bytes(encode_call_t const *encode, size_t items, size_t tokens, size_t hidden) {
    size_t pieces[6], total = 0;
    views_pieces(encode, items, tokens, hidden, pieces);
    for (size_t i = 0; i < 6; ++i)
        total += pieces[i];
    return total;
}

/* A shadow of `view` over `data` (and `scales`), `rows` rows from 0, or nothing for a view not asked. */
static uform_view_t view_shadow(uform_view_t const *view, char *data, char *scales, size_t rows) {
    if (!view->data) return (uform_view_t){0};
    uform_view_t shadow = *view;
    shadow.data = data;
    shadow.scales = view->scales ? (float const *)(void *)scales : NULL;
    shadow.rows = shadow.items = rows;
    shadow.item_offsets = NULL;
    return shadow;
}

vram_views_t vram_views_make(encode_call_t const *encode, void *scratch, size_t first, size_t items,
                             size_t token_first, size_t tokens, size_t hidden) {
    vram_views_t views = {
        .out = encode->encoded, .arena = &encode->encoded, .items = items, .tokens = tokens};
    views.first = views.arena_first = first;
    views.token_first = views.arena_token_first = token_first;
    if (!scratch) return views;
    size_t pieces[6];
    views_pieces(encode, items, tokens, hidden, pieces);
    char *at[6], *base = scratch;
    for (size_t i = 0; i < 6; base += pieces[i++])
        at[i] = base;
    uform_encoded_t const *arena = &encode->encoded;
    views.out.embeddings = view_shadow(&arena->embeddings, at[0], at[1], items);
    views.out.states = view_shadow(&arena->states, at[2], at[3], items);
    views.out.token_vectors = view_shadow(&arena->token_vectors, at[4], at[5], tokens);
    views.first = views.token_first = 0;
    views.shadow = true;
    return views;
}

/* Enqueues the copy of `rows` rows of `shadow` (and their scales) to rows from `first` of `arena`. */
static bool view_land(vram_t const *vram, vram_device_t *device, uform_view_t const *shadow,
                      uform_view_t const *arena, size_t first, size_t rows) {
    int to = vram->devices[0].ordinal, from = device->ordinal;
    if (!arena->data || rows == 0) return true;
    if (cudaMemcpyPeerAsync((char *)arena->data + first * arena->row_stride, to, shadow->data, from,
                            rows * arena->row_stride, device->stream) != cudaSuccess)
        return false;
    return !arena->scales || cudaMemcpyPeerAsync((float *)arena->scales + first, to, shadow->scales, from,
                                                 rows * sizeof(float), device->stream) == cudaSuccess;
}

uform_status_t vram_views_land(vram_t const *vram, vram_device_t *device, vram_views_t const *views,
                               char const **message) {
    if (!views->shadow) return UFORM_OK;
    uform_encoded_t const *arena = views->arena, *shadow = &views->out;
    bool ok =
        view_land(vram, device, &shadow->embeddings, &arena->embeddings, views->arena_first, views->items) &&
        view_land(vram, device, &shadow->states, &arena->states, views->arena_first, views->items) &&
        view_land(vram, device, &shadow->token_vectors, &arena->token_vectors, views->arena_token_first,
                  views->tokens);
    if (ok) return UFORM_OK;
    cudaGetLastError();
    return *message = "cannot copy a chunk's outputs to the arena's device", UFORM_DEVICE;
}

bool vram_output_view_zeroed(uform_arena_t *arena, size_t rows, size_t columns, uform_scalar_t scalar,
                             uform_view_t *view) {
    if (!output_view(arena, rows, columns, scalar, view)) return false;
    size_t bytes = rows * columns * uform_scalar_size(scalar) + 1; /* as output_view allocated them */
    if (cudaMemsetAsync(view->data, 0, bytes, 0) != cudaSuccess) return false;
    return !view->scales ||
           cudaMemsetAsync((void *)view->scales, 0, rows * sizeof(float) + 1, 0) == cudaSuccess;
}

/* ---- Rows --------------------------------------------------------------------------------------- */

uform_status_t vram_output_write(vram_device_t *device, vram_tower_t const *tower,
                                 encode_call_t const *encode, vram_views_t const *views, float const *x,
                                 vram_pass_t const *pass, vram_output_rows_t const *rows,
                                 char const **message) {
    size_t hidden = tower->hidden;
    uform_encoded_t const *out = &views->out;
    cudaStream_t stream = device->stream;
    uform_status_t status = UFORM_OK;
    if (encode->outputs & (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_STATES)) {
        if (rows->mean_offsets)
            VRAM_TRY(cuda_mean_segments(pass->gathered, hidden, x, hidden, rows->mean_offsets, rows->items,
                                        hidden, stream),
                     rows->gather_failed);
        else
            VRAM_TRY(cuda_gather_rows(pass->gathered, hidden, rows->state_source ? rows->state_source : x,
                                      hidden, rows->state_rows, rows->items, hidden, stream),
                     rows->gather_failed);
        if (encode->outputs & UFORM_OUTPUT_STATES)
            VRAM_TRY(vram_convert_rows(device, &out->states, views->first, pass->gathered, hidden,
                                       rows->items, hidden),
                     rows->convert_failed);
        if (encode->outputs & UFORM_OUTPUT_EMBEDDINGS) {
            VRAM_TRY(cuda_f32_to_bf16(pass->gathered_bf16, pass->gathered, rows->items * hidden, stream),
                     rows->convert_failed);
            status = vram_project(device, tower, pass->gathered, pass->gathered_bf16, rows->items,
                                  encode->width, encode->normalize, pass->projected, rows->state_rows,
                                  &out->embeddings, views->first, message);
            if (status != UFORM_OK) return status;
        }
    }
    if ((encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS) && rows->tokens) {
        VRAM_TRY(cuda_gather_rows(pass->gathered, hidden, x, hidden, rows->token_rows, rows->tokens, hidden,
                                  stream),
                 rows->gather_failed);
        VRAM_TRY(cuda_f32_to_bf16(pass->gathered_bf16, pass->gathered, rows->tokens * hidden, stream),
                 rows->convert_failed);
        status = vram_project(device, tower, pass->gathered, pass->gathered_bf16, rows->tokens, encode->width,
                              encode->normalize, pass->projected, rows->token_rows, &out->token_vectors,
                              views->token_first, message);
        if (status != UFORM_OK) return status;
    }
    return UFORM_OK;
}

/* ---- Clips ------------------------------------------------------------------------------------- */

/* States: the mean of each clip's frame states [clips, hidden], converted. false when a launch failed. */
static bool clip_states(vram_device_t *device, encode_call_t const *encode, vram_views_t const *views,
                        vram_pass_t const *pass, size_t hidden, size_t clips, size_t frames) {
    if (!(encode->outputs & UFORM_OUTPUT_STATES)) return true;
    return !cuda_mean_rows(pass->pooled, hidden, pass->gathered, hidden, clips, frames, hidden,
                           device->stream) &&
           !vram_convert_rows(device, &views->out.states, views->first, pass->pooled, hidden, clips, hidden);
}

/* Embeddings from f [clips * frames, dims]: each clip's mean, normalized, its prefix renormalized. */
static bool clip_embeddings(vram_device_t *device, encode_call_t const *encode, vram_views_t const *views,
                            vram_pass_t const *pass, size_t dims, size_t clips, size_t frames) {
    size_t width = encode->width;
    cudaStream_t stream = device->stream;
    if (!(encode->outputs & UFORM_OUTPUT_EMBEDDINGS)) return true;
    return !cuda_mean_rows(pass->pooled, dims, pass->projected, dims, clips, frames, dims, stream) &&
           !cuda_normalize(pass->pooled, dims, clips, dims, stream) &&
           !(width < dims && cuda_normalize(pass->pooled, dims, clips, width, stream)) &&
           !vram_convert_rows(device, &views->out.embeddings, views->first, pass->pooled, dims, clips, width);
}

/* Token vectors: f's prefixes renormalized in place (after the embeddings read f whole). */
static bool clip_vectors(vram_device_t *device, encode_call_t const *encode, vram_views_t const *views,
                         vram_pass_t const *pass, size_t dims, size_t count) {
    size_t width = encode->width;
    if (!(encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS)) return true;
    return !(width < dims && cuda_normalize(pass->projected, dims, count, width, device->stream)) &&
           !vram_convert_rows(device, &views->out.token_vectors, views->token_first, pass->projected, dims,
                              count, width);
}

/* A launch that failed: its error cleared from the thread, `what` the message. */
static uform_status_t launch_failed(char const *what, char const **message) {
    cudaGetLastError();
    *message = what;
    return UFORM_DEVICE;
}

uform_status_t vram_output_clips(vram_device_t *device, vram_tower_t const *tower,
                                 encode_call_t const *encode, vram_views_t const *views, float const *x,
                                 vram_pass_t const *pass, int32_t const *frame_rows, size_t clips,
                                 size_t frames, char const **message) {
    size_t hidden = tower->hidden, dims = tower->dims, count = clips * frames;
    cudaStream_t stream = device->stream;
    if (cuda_gather_rows(pass->gathered, hidden, x, hidden, frame_rows, count, hidden, stream))
        return launch_failed("cannot gather the frames' states", message);
    if (!clip_states(device, encode, views, pass, hidden, clips, frames))
        return launch_failed("cannot pool the clips' states", message);
    if (!(encode->outputs & (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS))) return UFORM_OK;
    if (cuda_f32_to_bf16(pass->gathered_bf16, pass->gathered, count * hidden, stream))
        return launch_failed("cannot convert the frames' states", message);
    uform_status_t status = vram_project_rows(device, tower, pass->gathered, pass->gathered_bf16, count, dims,
                                              true, pass->projected, message);
    if (status != UFORM_OK) return status;
    if (!clip_embeddings(device, encode, views, pass, dims, clips, frames))
        return launch_failed("cannot pool the clips' embeddings", message);
    if (!clip_vectors(device, encode, views, pass, dims, count))
        return launch_failed("cannot convert the frames' token vectors", message);
    return UFORM_OK;
}

#endif /* UFORM_WITH_CUDA */
