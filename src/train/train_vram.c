/* The VRAM trainer: a trainer whose step runs on its executor's first device (uform_trainer_init_vram).
 *
 *   init    the trainer made as a RAM trainer is (trainer_create: seeded, or from resume_path with its
 *           optimizer state), its parameters then copied into the device's flat buffers (train_device.h):
 *           F32 masters, moments, zero gradients, the masters' BF16 copy, a decay byte per chunk;
 *   step    the phases of train_step_ops_t, each enqueued on the device's stream without waiting:
 *           forward   the batch planned on the executor's host team (decoded, patch rows), staged in pinned
 *                     memory, copied in; gradients zeroed; each tower's forward pass (vram_train.c), the
 *                     selected states projected, the items' embeddings (cuda_embeddings);
 *           backward  the contrastive loss over the batch (cuda_contrastive), the next-byte loss, the way
 *                     back to the projections, each tower's backward pass and its inputs' gradients;
 *           update    the loss's total, the gradient norm and AdamW (cuda_adamw_update, which skips itself
 *                     when the loss or the norm is not finite: no host synchronization), the results
 *                     copied to pinned memory, an event recorded;
 *           test      the event, polled by the loop: then the results are read, and the step counted
 *                     unless the device skipped it;
 *           over a mesh of several processes (mesh.h), after forward every process's embeddings gathered
 *           into the loss's buffer of the whole batch, and after backward the gradients and the loss
 *           shares summed in place, both posted on the mesh's road (NCCL or staged) and tested by the loop
 *           with the mesh's timeout; the trainer then lives on the mesh's device of the executor;
 *   save    the masters and moments copied back into the host's parameters, then saved as a RAM
 *           trainer saves them (train_params_save): the same files, which either residency resumes from.
 *
 * Shapes: T tokens of a tower, H hidden, D dims, U units (the rows projected: texts, images and clip frames,
 * sounds), B items. Built with CUDA only; train_verbs.c makes a VRAM trainer through train_vram_attach. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "mesh.h"
#include "train_device.h"
#include "train_step.h"
#include "train_vram.h"

#if UFORM_WITH_CUDA
#include "vram_train.h"

_Static_assert(TRAIN_DEVICE_CHUNK == CUDA_TRAIN_CHUNK, "the host's layout is the optimizer kernels' chunks");

/* What the update leaves for the host, copied back in one piece. */
typedef struct step_results {
    double shares[2]; /* contrastive, next-byte: this process's, then (over a mesh) their sums */
    double loss;
    double norm_squared;
    uint32_t skipped;
} step_results_t;

/* One trunk's device buffers of a step (texts, the image trunk, sounds). */
typedef struct trunk_step {
    vram_train_tower_t *tower;
    train_device_trunk_t const *arrays;
    size_t first_unit; /* its units' first row of the projections */
    vram_train_pass_t pass;
    vram_saved_t *saved;     /* host [depth] */
    uint16_t *selected_bf16; /* [items, H]: the states projected */
    float *selected;         /* [items, H] F32, then their gradient */
    float *embedded;         /* patch trunks: [rows, H], the patch projections, then their gradient */
} trunk_step_t;

typedef struct vram_trainer {
    vram_device_t *device;
    uform_executor_t *executor;
    train_device_layout_t layout;
    size_t scalars, dims;
    void *flat; /* one allocation: the five flat buffers, the decay bytes, chunk sums and the results */
    float *value, *grad, *m, *v;
    uint16_t *bf16;
    uint8_t *decay;
    double *chunk_sums;
    step_results_t *results;      /* device */
    step_results_t *results_host; /* pinned */
    vram_train_tower_t towers[3]; /* text, image, audio */
    vram_param_t logit_scale, logit_bias;
    void *loss; /* the loss's buffers over the whole batch, grown */
    size_t loss_bytes;
    cudaEvent_t done;
} vram_trainer_t;

/* A step's state on the device side. */
typedef struct vram_step {
    batch_plan_t plan;
    train_device_batch_t arrays;
    char *staged; /* pinned host: the batch's arrays */
    char *batch;  /* device: the same */
    trunk_step_t trunks[3];
    float *projected, *d_projected; /* [U, D] */
    uint16_t *d_projected_bf16;     /* [U, D] */
    double *unit, *unit_norms;      /* [U, D], [U] */
    double *e, *item_norms, *de;    /* [B, D], [B], [B, D] */
    float *logits;                  /* [T text, 256] */
    uint16_t *d_logits;             /* [T text, 256] */
    double *row_losses;             /* [T text] */
    size_t *gathered;               /* over a mesh: [size] each process's embeddings' scalars */
    bool update_enqueued;
} vram_step_t;

/* ---- Binding -------------------------------------------------------------------------------------- */

static vram_param_t param_of(vram_trainer_t const *vram, train_params_t const *params,
                             train_tensor_t const *tensor) {
    if (!tensor) return (vram_param_t){0};
    size_t at = vram->layout.offsets[tensor - params->tensors];
    return (vram_param_t){vram->value + at, vram->bf16 + at, vram->grad + at};
}

/* The device tower of a host tower the trainer bound (train_tower_bind): the same tensors, by offset. */
static bool tower_bind(vram_trainer_t const *vram, train_params_t const *params, train_tower_t const *host,
                       vram_train_tower_t *tower) {
    *tower = (vram_train_tower_t){.depth = host->depth,
                                  .hidden = host->hidden,
                                  .heads = host->heads,
                                  .mlp = host->mlp,
                                  .dims = host->dims};
    if (!(tower->blocks = calloc(host->depth ? host->depth : 1, sizeof *tower->blocks))) return false;
    for (size_t i = 0; i < host->depth; ++i)
        for (size_t p = 0; p < sizeof tower->blocks[i].parts / sizeof tower->blocks[i].parts[0]; ++p)
            tower->blocks[i].parts[p] = param_of(vram, params, host->blocks[i].parts[p]);
    tower->norm = param_of(vram, params, host->norm);
    tower->proj = param_of(vram, params, host->proj);
    tower->embed = param_of(vram, params, host->embed);
    for (size_t p = 0; p < 4; ++p)
        tower->patches[p] = param_of(vram, params, host->patches[p]);
    return true;
}

/* ---- Init and release ----------------------------------------------------------------------------- */

static void vram_trainer_release(uform_trainer_t *trainer) {
    vram_trainer_t *vram = trainer->device;
    if (!vram) return;
    vram_use(vram->device);
    cudaStreamSynchronize(vram->device->stream);
    for (size_t t = 0; t < 3; ++t)
        free(vram->towers[t].blocks);
    cudaFree(vram->flat);
    cudaFree(vram->loss);
    cudaFreeHost(vram->results_host);
    if (vram->done) cudaEventDestroy(vram->done);
    cudaGetLastError();
    train_device_layout_free(&vram->layout);
    uform_executor_t *executor = vram->executor;
    free(vram);
    trainer->device = NULL;
    executor_release(executor); /* its devices outlive the trainer's memory on them */
}

/* Carves the flat allocation (sizing it when base is 0): its bytes. */
static size_t flat_carve(vram_trainer_t *vram, uintptr_t base) {
    size_t used = 0, n = vram->scalars;
    void **pieces[] = {(void **)&vram->value,      (void **)&vram->grad,   (void **)&vram->m,
                       (void **)&vram->v,          (void **)&vram->bf16,   (void **)&vram->decay,
                       (void **)&vram->chunk_sums, (void **)&vram->results};
    size_t const sizes[] = {n * 4,
                            n * 4,
                            n * 4,
                            n * 4,
                            n * 2,
                            vram->layout.chunks + 1,
                            (vram->layout.chunks + 1) * sizeof(double),
                            sizeof(step_results_t)};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        *pieces[i] = (void *)(base ? base + used : 0);
        used += round_up_256(sizes[i]);
    }
    return used;
}

/* One field of the host's parameters into its flat buffer on the device, through `host` (scalars floats). */
static bool upload(vram_trainer_t *vram, train_params_t const *params, train_device_field_t field,
                   float *target, float *host) {
    train_device_pack(&vram->layout, params, field, host);
    return cudaMemcpy(target, host, vram->scalars * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
}

/* The parameters, moments, BF16 copies and decay bytes on the device; gradients zero. */
static uform_status_t flat_upload(vram_trainer_t *vram, train_params_t const *params, char const **message) {
    float *host = malloc(vram->scalars * sizeof(float));
    if (!host) return *message = "cannot allocate the parameters' staging", UFORM_OUT_OF_MEMORY;
    cudaStream_t stream = vram->device->stream;
    bool ok = upload(vram, params, TRAIN_DEVICE_VALUE, vram->value, host) &&
              upload(vram, params, TRAIN_DEVICE_M, vram->m, host) &&
              upload(vram, params, TRAIN_DEVICE_V, vram->v, host) &&
              cudaMemcpy(vram->decay, vram->layout.decay, vram->layout.chunks, cudaMemcpyHostToDevice) ==
                  cudaSuccess &&
              cudaMemsetAsync(vram->grad, 0, vram->scalars * sizeof(float), stream) == cudaSuccess &&
              cuda_f32_to_bf16(vram->bf16, vram->value, vram->scalars, stream) == cudaSuccess &&
              cudaStreamSynchronize(stream) == cudaSuccess;
    free(host);
    if (!ok) cudaGetLastError();
    return ok ? UFORM_OK : (*message = "cannot copy the parameters to the device", UFORM_DEVICE);
}

static uform_status_t vram_trainer_make(vram_trainer_t *vram, uform_trainer_t *trainer,
                                        char const **message) {
    train_params_t const *params = &trainer->params;
    if (vram_use(vram->device) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
    vram->dims = params->info.dims;
    if (!train_device_layout(&vram->layout, params))
        return *message = "cannot lay the parameters out", UFORM_OUT_OF_MEMORY;
    vram->scalars = vram->layout.chunks * TRAIN_DEVICE_CHUNK;
    if (cudaMalloc(&vram->flat, flat_carve(vram, 0)) != cudaSuccess ||
        cudaHostAlloc((void **)&vram->results_host, sizeof(step_results_t), cudaHostAllocDefault) !=
            cudaSuccess) {
        cudaGetLastError();
        return *message = "cannot allocate the parameters on the device", UFORM_OUT_OF_MEMORY;
    }
    flat_carve(vram, (uintptr_t)vram->flat);
    VRAM_TRY(cudaEventCreateWithFlags(&vram->done, cudaEventDisableTiming), "cannot create an event");
    train_tower_t const *hosts[3] = {&trainer->text, &trainer->image, &trainer->audio};
    bool const present[3] = {params->info.has_text, params->info.has_image, params->info.has_audio};
    for (size_t t = 0; t < 3; ++t)
        if (present[t] && !tower_bind(vram, params, hosts[t], &vram->towers[t]))
            return *message = "cannot bind the towers", UFORM_OUT_OF_MEMORY;
    vram->logit_scale = param_of(vram, params, trainer->logit_scale);
    vram->logit_bias = param_of(vram, params, trainer->logit_bias);
    return flat_upload(vram, params, message);
}

/* ---- The loss's buffers --------------------------------------------------------------------------- */

/* The growable buffer of the loss over the whole batch: at least `bytes` (contents not kept). */
static void *loss_buffer(vram_trainer_t *vram, size_t bytes) {
    if (vram->loss_bytes >= bytes) return vram->loss;
    cudaStreamSynchronize(vram->device->stream); /* the last step may still read it */
    cudaFree(vram->loss);
    vram->loss = NULL, vram->loss_bytes = 0;
    if (cudaMalloc(&vram->loss, bytes + bytes / 4) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    vram->loss_bytes = bytes + bytes / 4;
    return vram->loss;
}

/* ---- Forward -------------------------------------------------------------------------------------- */

static uform_status_t answer(uform_trainer_t *trainer, uform_status_t status, char const *what) {
    snprintf(trainer->message, sizeof trainer->message, "%s", what);
    return status;
}

/* The step's device scratch: the batch's arrays, each trunk's pass, selected rows and patch projections,
 * and the per-unit and per-item buffers of the loss. Sized when base is 0: the bytes. */
static size_t step_carve(vram_trainer_t *vram, vram_step_t *step, uintptr_t base) {
    size_t used = 0, units = step->arrays.units, items = step->arrays.items, dims = vram->dims;
    size_t text_tokens = step->arrays.text.tokens + 1;
#define TAKE(pointer, bytes) (pointer = (void *)(base ? base + used : 0), used += round_up_256(bytes))
    TAKE(step->batch, step->arrays.bytes);
    for (size_t t = 0; t < 3; ++t) {
        trunk_step_t *trunk = &step->trunks[t];
        if (!trunk->tower || trunk->arrays->items == 0) continue;
        size_t h = trunk->tower->hidden, bytes = vram_train_pass_bytes(trunk->tower, trunk->arrays->tokens);
        char *pass = NULL;
        TAKE(pass, bytes);
        if (base)
            vram_train_pass_carve(trunk->tower, trunk->arrays->tokens, pass, trunk->saved, &trunk->pass);
        TAKE(trunk->selected_bf16, trunk->arrays->items * h * 2);
        TAKE(trunk->selected, trunk->arrays->items * h * 4);
        TAKE(trunk->embedded, (trunk->arrays->rows + 1) * h * 4);
    }
    TAKE(step->projected, (units + 1) * dims * 4);
    TAKE(step->d_projected, (units + 1) * dims * 4);
    TAKE(step->d_projected_bf16, (units + 1) * dims * 2);
    TAKE(step->unit, (units + 1) * dims * 8);
    TAKE(step->unit_norms, (units + 1) * 8);
    TAKE(step->e, (items + 1) * dims * 8);
    TAKE(step->item_norms, (items + 1) * 8);
    TAKE(step->de, (items + 1) * dims * 8);
    TAKE(step->logits, text_tokens * 256 * 4);
    TAKE(step->d_logits, text_tokens * 256 * 2);
    TAKE(step->row_losses, text_tokens * 8);
#undef TAKE
    return used;
}

/* The trunks of the step and their host arrays of saved blocks. */
static bool step_trunks(vram_trainer_t *vram, vram_step_t *step) {
    train_device_trunk_t const *arrays[3] = {&step->arrays.text, &step->arrays.image, &step->arrays.audio};
    size_t first = 0;
    for (size_t t = 0; t < 3; ++t) {
        trunk_step_t *trunk = &step->trunks[t];
        trunk->arrays = arrays[t];
        trunk->first_unit = first;
        first += arrays[t]->items;
        if (!vram->towers[t].blocks || arrays[t]->items == 0) continue;
        trunk->tower = &vram->towers[t];
        if (!(trunk->saved = calloc(trunk->tower->depth + 1, sizeof *trunk->saved))) return false;
    }
    return true;
}

/* The device pointer of a piece of the batch. */
static void *batch_at(vram_step_t const *step, size_t offset) {
    return step->batch + offset;
}

/* A trunk's input rows: the text's byte embeddings, or each item's class token and patch projections. */
static uform_status_t trunk_input(vram_device_t *device, vram_step_t const *step, trunk_step_t const *trunk,
                                  char const **message) {
    vram_train_tower_t const *tower = trunk->tower;
    size_t h = tower->hidden;
    float *x = vram_train_pass_input(&trunk->pass);
    if (tower->embed.value) {
        VRAM_TRY(cuda_gather_rows(x, h, tower->embed.value, h, batch_at(step, step->arrays.tokens),
                                  trunk->arrays->tokens, h, device->stream),
                 "cannot launch the byte embedding");
        return UFORM_OK;
    }
    uform_status_t status = vram_train_linear(device, &tower->patches[0], h, trunk->arrays->inputs,
                                              &tower->patches[1], batch_at(step, trunk->arrays->patches),
                                              trunk->arrays->rows, trunk->embedded, message);
    if (status != UFORM_OK) return status;
    VRAM_TRY(cuda_assemble_tokens(x, trunk->embedded, tower->patches[2].value, tower->patches[3].value,
                                  batch_at(step, trunk->arrays->patch_offsets), trunk->arrays->items,
                                  trunk->arrays->longest - 1, h, device->stream),
             "cannot launch the token assembly");
    return UFORM_OK;
}

/* A trunk's forward pass and its selected states' projections into rows [first_unit, ..) of projected. */
static uform_status_t trunk_forward(vram_device_t *device, vram_step_t *step, trunk_step_t *trunk,
                                    char const **message) {
    vram_train_tower_t const *tower = trunk->tower;
    size_t h = tower->hidden, items = trunk->arrays->items;
    bool text = tower->embed.value != NULL;
    uform_status_t status = trunk_input(device, step, trunk, message);
    if (status == UFORM_OK)
        status = vram_train_forward(device, tower, &trunk->pass, batch_at(step, trunk->arrays->token_offsets),
                                    items, trunk->arrays->longest, text, text, message);
    if (status != UFORM_OK) return status;
    VRAM_TRY(cuda_gather_rows(trunk->selected, h, trunk->pass.states, h,
                              batch_at(step, trunk->arrays->selected), items, h, device->stream),
             "cannot launch a gather");
    VRAM_TRY(cuda_f32_to_bf16(trunk->selected_bf16, trunk->selected, items * h, device->stream),
             "cannot launch a conversion");
    return vram_train_linear(device, &tower->proj, tower->dims, h, NULL, trunk->selected_bf16, items,
                             step->projected + trunk->first_unit * tower->dims, message);
}

static void vram_step_free(vram_step_t *step) {
    if (!step) return;
    plan_free(&step->plan);
    for (size_t t = 0; t < 3; ++t)
        free(step->trunks[t].saved);
    free(step->gathered);
    free(step);
}

/* Plans, stages and enqueues the forward half of a step. */
static uform_status_t forward_enqueue(uform_trainer_t *trainer, vram_trainer_t *vram, vram_step_t *step,
                                      train_step_t *shared) {
    char const *message = "a device operation failed";
    vram_device_t *device = vram->device;
    uform_model_info_t const *info = &trainer->params.info;
    step->arrays = train_device_batch_plan(&step->plan, info, shared->batch.relations,
                                           shared->batch.relations_count, NULL);
    if (!step_trunks(vram, step)) return answer(trainer, UFORM_OUT_OF_MEMORY, "cannot allocate the step");
    step->staged = vram_staging(&device->slots[0], step->arrays.bytes);
    char *scratch = vram_scratch(device, step_carve(vram, step, 0));
    if (!step->staged || !scratch)
        return answer(trainer, UFORM_OUT_OF_MEMORY, "cannot allocate the step's buffers");
    step_carve(vram, step, (uintptr_t)scratch);
    train_device_batch_plan(&step->plan, info, shared->batch.relations, shared->batch.relations_count,
                            step->staged);
    uform_status_t status = UFORM_DEVICE;
    if (cudaMemcpyAsync(step->batch, step->staged, step->arrays.bytes, cudaMemcpyHostToDevice,
                        device->stream) ||
        cudaMemsetAsync(vram->grad, 0, vram->scalars * sizeof(float), device->stream))
        return cudaGetLastError(), answer(trainer, status, "cannot copy the batch to the device");
    for (size_t t = 0; t < 3; ++t)
        if (step->trunks[t].tower &&
            (status = trunk_forward(device, step, &step->trunks[t], &message)) != UFORM_OK)
            return answer(trainer, status, message);
    if (cuda_embeddings(step->e, step->item_norms, step->unit, step->unit_norms, step->projected,
                        batch_at(step, step->arrays.unit_first), batch_at(step, step->arrays.unit_count),
                        step->arrays.items, info->dims, device->stream))
        return cudaGetLastError(), answer(trainer, UFORM_DEVICE, "cannot launch the embeddings");
    return UFORM_OK;
}

static bool cancelled(train_step_t *shared, size_t phase) {
    if (!progress_report(shared->tracker.progress, &shared->tracker.next_step, phase, TRAIN_PHASES))
        return false;
    snprintf(shared->trainer->message, sizeof shared->trainer->message,
             "the progress handler cancelled the step");
    return true;
}

static uform_status_t device_forward(train_step_t *shared) {
    uform_trainer_t *trainer = shared->trainer;
    vram_trainer_t *vram = trainer->device;
    uform_status_t status =
        train_validate(trainer, &shared->batch, trainer->message, sizeof trainer->message);
    if (status != UFORM_OK) return status;
    vram_step_t *step = calloc(1, sizeof *step);
    if (!step) return answer(trainer, UFORM_OUT_OF_MEMORY, "cannot allocate the step");
    shared->work = step;
    char const *ignored = NULL;
    status = plan_batch(trainer, &shared->batch, vram_workers(vram->executor, &ignored), &step->plan,
                        trainer->message, sizeof trainer->message);
    if (status != UFORM_OK) return status;
    if (cancelled(shared, 1)) return UFORM_CANCELLED;
    if (vram_use(vram->device) != UFORM_OK) return answer(trainer, UFORM_DEVICE, "cannot use the device");
    if ((status = forward_enqueue(trainer, vram, step, shared)) != UFORM_OK) return status;
    shared->local_items = step->plan.items;
    shared->local_predicted = step->plan.predicted;
    return cancelled(shared, 2) ? UFORM_CANCELLED : UFORM_OK;
}

/* ---- Backward ------------------------------------------------------------------------------------- */

/* The loss's buffers over the whole batch, carved from the trainer's growable one. */
typedef struct loss_buffers {
    double *e; /* [global, D]: every process's embeddings (this process's own when alone) */
    double *x, *norms, *rows, *losses; /* cuda_contrastive's scratch */
} loss_buffers_t;

static bool loss_carve(vram_trainer_t *vram, train_step_t const *shared, size_t prefixes,
                       loss_buffers_t *buffers) {
    size_t g = shared->global_items, l = shared->local_items, d = vram->dims, sizes[5];
    sizes[0] = (g + 1) * d * 8, sizes[1] = (prefixes * g + 1) * d * 8, sizes[2] = (prefixes * g + 1) * 8;
    sizes[3] = (l * (g + d) + 1) * 8, sizes[4] = (3 * l + 1) * 8;
    size_t total = 0;
    for (size_t i = 0; i < 5; ++i)
        total += round_up_256(sizes[i]);
    char *base = loss_buffer(vram, total);
    if (!base) return false;
    double **pieces[] = {&buffers->e, &buffers->x, &buffers->norms, &buffers->rows, &buffers->losses};
    for (size_t i = 0; i < 5; base += round_up_256(sizes[i]), ++i)
        *pieces[i] = (double *)(void *)base;
    return true;
}

/* The contrastive loss of this process's items over the batch: share[0], de, the logit gradients. */
static uform_status_t contrastive_enqueue(uform_trainer_t *trainer, vram_trainer_t *vram, vram_step_t *step,
                                          train_step_t const *shared) {
    uform_model_info_t const *info = &trainer->params.info;
    cuda_contrastive_t loss = {.dims = info->dims,
                               .prefixes = info->matryoshka_count ? info->matryoshka_count : 1,
                               .global = shared->global_items,
                               .first = shared->first,
                               .local = shared->local_items,
                               .logit_scale = vram->logit_scale.value,
                               .logit_bias = vram->logit_bias.value,
                               .d_logit_scale = vram->logit_scale.grad,
                               .d_logit_bias = vram->logit_bias.grad};
    for (size_t p = 0; p < loss.prefixes; ++p)
        loss.widths[p] = (uint32_t)(info->matryoshka_count ? info->matryoshka[p] : info->dims);
    loss_buffers_t buffers;
    if (!loss_carve(vram, shared, loss.prefixes, &buffers))
        return answer(trainer, UFORM_OUT_OF_MEMORY, "cannot allocate the loss's buffers");
    double const *e = shared->meshed ? buffers.e : step->e;
    if (cuda_contrastive(&loss, e, batch_at(step, step->arrays.related), step->de, &vram->results->shares[0],
                         buffers.x, buffers.norms, buffers.rows, buffers.losses, vram->device->stream))
        return cudaGetLastError(), answer(trainer, UFORM_DEVICE, "cannot launch the contrastive loss");
    return UFORM_OK;
}

/* The next-byte loss of the texts: share[1] (0 without texts), and the texts' states' gradient d_states
 * (written). */
static uform_status_t lm_enqueue(uform_trainer_t *trainer, vram_trainer_t *vram, vram_step_t *step,
                                 train_step_t const *shared, trunk_step_t *text) {
    vram_device_t *device = vram->device;
    cudaStream_t stream = device->stream;
    char const *message = "cannot launch the next-byte loss";
    if (!text->tower ||
        shared->local_predicted == 0) { /* no share; the texts' states' gradient starts at 0 */
        if ((text->tower &&
             cudaMemsetAsync(text->pass.d_states, 0,
                             text->arrays->tokens * text->tower->hidden * sizeof(float), stream)) ||
            cudaMemsetAsync(&vram->results->shares[1], 0, sizeof(double), stream))
            return cudaGetLastError(), answer(trainer, UFORM_DEVICE, message);
        return UFORM_OK;
    }
    size_t t = text->arrays->tokens, h = text->tower->hidden;
    /* logits [T, 256] = states embed[0:256]^T; their loss and gradient; embed.grad[0:256] += dlogits^T
     * states, d_states = dlogits embed[0:256] */
    uform_status_t status = vram_train_linear(device, &text->tower->embed, 256, h, NULL,
                                              text->pass.states_bf16, t, step->logits, &message);
    if (status != UFORM_OK) return answer(trainer, status, message);
    if (cuda_cross_entropy(step->logits, step->d_logits, step->row_losses,
                           batch_at(step, step->arrays.targets), t,
                           trainer->lm_weight / (double)shared->predicted, stream) ||
        cuda_sum_doubles(&vram->results->shares[1], step->row_losses, t, (double)shared->predicted, stream))
        return cudaGetLastError(), answer(trainer, UFORM_DEVICE, message);
    status = vram_train_linear_backward(device, &text->tower->embed, 256, h, NULL, text->pass.states_bf16, t,
                                        step->d_logits, NULL, text->pass.d_states, false, false,
                                        text->pass.sums, &message);
    return status == UFORM_OK ? UFORM_OK : answer(trainer, status, message);
}

/* From the projections' gradient to the trunk's states' (added into d_states, zeroed first for patch
 * trunks), its backward pass, and its inputs' gradients. */
static uform_status_t trunk_backward(vram_device_t *device, vram_step_t *step, trunk_step_t *trunk,
                                     char const **message) {
    vram_train_tower_t const *tower = trunk->tower;
    vram_train_pass_t const *pass = &trunk->pass;
    size_t h = tower->hidden, items = trunk->arrays->items, d = tower->dims;
    cudaStream_t stream = device->stream;
    bool text = tower->embed.value != NULL;
    if (!text)
        VRAM_TRY(cudaMemsetAsync(pass->d_states, 0, pass->tokens * h * sizeof(float), stream),
                 "cannot clear");
    uform_status_t status =
        vram_train_linear_backward(device, &tower->proj, d, h, NULL, trunk->selected_bf16, items,
                                   step->d_projected_bf16 + trunk->first_unit * d, NULL, trunk->selected,
                                   false, false, pass->sums, message);
    if (status != UFORM_OK) return status;
    VRAM_TRY(cuda_scatter_add_rows(pass->d_states, h, trunk->selected, h,
                                   batch_at(step, trunk->arrays->selected), items, h, stream),
             "cannot launch a scatter");
    int32_t const *offsets = batch_at(step, trunk->arrays->token_offsets);
    if ((status = vram_train_backward(device, tower, pass, offsets, items, trunk->arrays->longest, text, text,
                                      message)))
        return status;
    if (text) {
        VRAM_TRY(cuda_embed_backward(tower->embed.grad, pass->dx, batch_at(step, step->arrays.token_starts),
                                     batch_at(step, step->arrays.token_order), 257, h, stream),
                 "cannot launch the embedding's gradient");
        return UFORM_OK;
    }
    VRAM_TRY(cuda_assemble_tokens_backward(trunk->embedded, tower->patches[2].grad, tower->patches[3].grad,
                                           pass->dx, batch_at(step, trunk->arrays->patch_offsets), items,
                                           trunk->arrays->longest - 1, h, stream),
             "cannot launch the tokens' gradient");
    size_t rows = trunk->arrays->rows;
    VRAM_TRY(cuda_f32_to_bf16(pass->d_wide, trunk->embedded, rows * h, stream), "cannot launch a conversion");
    return vram_train_linear_backward(device, &tower->patches[0], h, trunk->arrays->inputs,
                                      &tower->patches[1], batch_at(step, trunk->arrays->patches), rows,
                                      pass->d_wide, trunk->embedded, NULL, false, false, pass->sums, message);
}

static uform_status_t device_backward(train_step_t *shared) {
    uform_trainer_t *trainer = shared->trainer;
    vram_trainer_t *vram = trainer->device;
    vram_step_t *step = shared->work;
    vram_device_t *device = vram->device;
    size_t dims = trainer->params.info.dims;
    char const *message = "a device operation failed";
    uform_status_t status = contrastive_enqueue(trainer, vram, step, shared);
    if (status == UFORM_OK) status = lm_enqueue(trainer, vram, step, shared, &step->trunks[0]);
    if (status != UFORM_OK) return status;
    if (cuda_embeddings_backward(step->d_projected, step->de, step->e, step->item_norms, step->unit,
                                 step->unit_norms, batch_at(step, step->arrays.unit_first),
                                 batch_at(step, step->arrays.unit_count), step->arrays.items, dims,
                                 device->stream) ||
        cuda_f32_to_bf16(step->d_projected_bf16, step->d_projected, step->arrays.units * dims,
                         device->stream))
        return cudaGetLastError(), answer(trainer, UFORM_DEVICE, "cannot launch the embeddings' gradient");
    for (size_t t = 0; t < 3; ++t) {
        if (step->trunks[t].tower &&
            (status = trunk_backward(device, step, &step->trunks[t], &message)) != UFORM_OK)
            return answer(trainer, status, message);
        if (t == 0 && !shared->meshed && cancelled(shared, 3)) return UFORM_CANCELLED;
    }
    return UFORM_OK;
}

/* ---- Update --------------------------------------------------------------------------------------- */

cuda_adamw_t train_vram_adamw(train_optimizer_t const *optimizer, size_t step) {
    double rate = train_learning_rate(optimizer, step);
    return (cuda_adamw_t){.learning_rate = rate,
                          .decay = 1 - rate * optimizer->weight_decay,
                          .beta1 = optimizer->beta1,
                          .beta2 = optimizer->beta2,
                          .correction1 = 1 - pow(optimizer->beta1, (double)step),
                          .correction2 = 1 - pow(optimizer->beta2, (double)step),
                          .epsilon = optimizer->epsilon,
                          .clip_norm = optimizer->clip_norm};
}

static uform_status_t device_update(train_step_t *shared) {
    uform_trainer_t *trainer = shared->trainer;
    vram_trainer_t *vram = trainer->device;
    vram_step_t *step = shared->work;
    cuda_adamw_t adamw = train_vram_adamw(&trainer->params.optimizer, trainer->params.step + 1);
    cudaStream_t stream = vram->device->stream;
    step_results_t *results = vram->results;
    if (cuda_total_loss(&results->loss, results->shares, trainer->lm_weight, stream) ||
        cuda_gradient_norm(&results->norm_squared, vram->chunk_sums, vram->grad, vram->layout.chunks,
                           stream) ||
        cuda_adamw_update(vram->value, vram->bf16, vram->m, vram->v, vram->grad, vram->decay,
                          vram->layout.chunks, &results->norm_squared, &results->loss, &results->skipped,
                          &adamw, stream) ||
        cudaMemcpyAsync(vram->results_host, results, sizeof *results, cudaMemcpyDeviceToHost, stream) ||
        cudaEventRecord(vram->done, stream))
        return cudaGetLastError(), answer(trainer, UFORM_DEVICE, "cannot launch the update");
    step->update_enqueued = true;
    return UFORM_OK;
}

/* The step's device work is done: its results read, and the step counted unless the device skipped it. */
static void results_read(uform_trainer_t *trainer, train_step_t *shared) {
    step_results_t const *results = ((vram_trainer_t *)trainer->device)->results_host;
    shared->losses =
        (train_losses_t){.loss = results->loss, .contrastive = results->shares[0], .lm = results->shares[1]};
    if (results->skipped)
        shared->skipped = isfinite(results->loss) ? TRAIN_SKIP_NORM : TRAIN_SKIP_LOSS;
    else
        trainer->params.step++;
}

static uform_status_t device_test(train_step_t *shared, bool *done) {
    uform_trainer_t *trainer = shared->trainer;
    vram_trainer_t *vram = trainer->device;
    vram_step_t *step = shared->work;
    char const *message = NULL;
    *done = true;
    if (shared->meshed && !step->update_enqueued) {
        uform_status_t status = mesh_device_test(trainer->mesh, done, &message);
        return status == UFORM_OK ? UFORM_OK : answer(trainer, status, message);
    }
    if (!step->update_enqueued) return UFORM_OK;
    if (vram_event_done(vram->done, done) != UFORM_OK)
        return answer(trainer, UFORM_DEVICE, "a device operation of the step failed");
    if (*done) results_read(trainer, shared);
    return UFORM_OK;
}

static void device_end(train_step_t *shared, uform_status_t status) {
    vram_trainer_t *vram = shared->trainer->device;
    /* A failed or cancelled step may leave work in flight that reads the step's staging: let it finish. The
     * next step zeroes the gradients before anything reads them. */
    if (status != UFORM_OK && vram_use(vram->device) == UFORM_OK) cudaStreamSynchronize(vram->device->stream);
    cudaGetLastError();
    vram_step_free(shared->work);
    shared->work = NULL;
}

/* ---- Exchanges over a mesh ------------------------------------------------------------------------ */

/* Every process's embeddings into the loss's buffer of the whole batch (mesh.h: NCCL or staged). */
static uform_status_t device_embeddings(train_step_t *shared) {
    uform_trainer_t *trainer = shared->trainer;
    vram_trainer_t *vram = trainer->device;
    vram_step_t *step = shared->work;
    uform_model_info_t const *info = &trainer->params.info;
    size_t prefixes = info->matryoshka_count ? info->matryoshka_count : 1, size = trainer->mesh->size;
    loss_buffers_t buffers;
    if (!(step->gathered = malloc(size * sizeof(size_t))) || !loss_carve(vram, shared, prefixes, &buffers))
        return answer(trainer, UFORM_OUT_OF_MEMORY, "cannot allocate the embeddings' exchange");
    for (size_t p = 0; p < size; ++p)
        step->gathered[p] = shared->process_items[p] * vram->dims;
    mesh_collective_t gather = {.operation = MESH_ALLGATHERV,
                                .scalar = MESH_F64,
                                .device = buffers.e,
                                .local = step->e,
                                .counts = step->gathered};
    char const *message = NULL;
    uform_status_t status = mesh_device_post(trainer->mesh, &gather, 1, &message);
    return status == UFORM_OK ? UFORM_OK : answer(trainer, status, message);
}

/* The gradients' and the loss shares' sums over the mesh, in place on the device. */
static uform_status_t device_reduce(train_step_t *shared) {
    uform_trainer_t *trainer = shared->trainer;
    vram_trainer_t *vram = trainer->device;
    mesh_collective_t const sums[2] = {
        {.operation = MESH_ALLREDUCE, .scalar = MESH_F32, .device = vram->grad, .count = vram->scalars},
        {.operation = MESH_ALLREDUCE, .scalar = MESH_F64, .device = vram->results->shares, .count = 2},
    };
    char const *message = NULL;
    uform_status_t status = mesh_device_post(trainer->mesh, sums, 2, &message);
    return status == UFORM_OK ? UFORM_OK : answer(trainer, status, message);
}

static train_step_ops_t const vram_ops = {
    .forward = device_forward,
    .embeddings = device_embeddings,
    .backward = device_backward,
    .reduce = device_reduce,
    .update = device_update,
    .test = device_test,
    .end = device_end,
};

/* ---- Save ----------------------------------------------------------------------------------------- */

/* One field of the flat buffers back into the host's parameters, through `host`. */
static bool download(vram_trainer_t *vram, train_params_t *params, train_device_field_t field,
                     float const *source, float *host) {
    if (cudaMemcpy(host, source, vram->scalars * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        return false;
    train_device_unpack(&vram->layout, params, field, host);
    return true;
}

static uform_status_t vram_trainer_sync(uform_trainer_t *trainer, char const **message) {
    vram_trainer_t *vram = trainer->device;
    float *host = malloc(vram->scalars * sizeof(float));
    if (!host) return *message = "cannot allocate the parameters' staging", UFORM_OUT_OF_MEMORY;
    bool ok = vram_use(vram->device) == UFORM_OK &&
              cudaStreamSynchronize(vram->device->stream) == cudaSuccess &&
              download(vram, &trainer->params, TRAIN_DEVICE_VALUE, vram->value, host) &&
              download(vram, &trainer->params, TRAIN_DEVICE_M, vram->m, host) &&
              download(vram, &trainer->params, TRAIN_DEVICE_V, vram->v, host);
    free(host);
    if (!ok) cudaGetLastError();
    return ok ? UFORM_OK : (*message = "cannot copy the parameters from the device", UFORM_DEVICE);
}

/* ---- The trainer ---------------------------------------------------------------------------------- */

uform_status_t train_vram_attach(uform_trainer_t *trainer, uform_executor_t *executor, char const **message) {
    uform_mesh_t const *mesh = trainer->mesh && trainer->mesh->size > 1 ? trainer->mesh : NULL;
    if (mesh && mesh->executor != executor)
        return *message = "the mesh was bootstrapped over another executor than the trainer's",
               UFORM_INVALID_ARGUMENT;
    if (mesh_usable(mesh, message) != UFORM_OK) return UFORM_DEVICE;
    vram_trainer_t *vram = calloc(1, sizeof *vram);
    if (!vram) return *message = "cannot allocate the trainer", UFORM_OUT_OF_MEMORY;
    executor_retain(executor);
    vram->executor = executor;
    vram->device =
        &vram_of(executor)->devices[mesh ? mesh->device_index : 0]; /* a mesh's: its local rank's */
    trainer->device = vram;
    trainer->device_release = vram_trainer_release;
    trainer->device_sync = vram_trainer_sync;
    trainer->ops = &vram_ops;
    return vram_trainer_make(vram, trainer, message);
}

#endif /* UFORM_WITH_CUDA */
