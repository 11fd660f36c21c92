/* Models: loading a checkpoint through the executor's ring, and what a model tells about itself.
 *
 * The load is a state machine of loop callbacks:
 *   open -> statx -> read the 8-byte prefix -> read the JSON header -> validate everything
 *        -> allocate the weights where the executor computes -> LOAD_READS chunked reads in flight
 *        -> progress after each chunk -> the model, or CANCELLED / IO / FORMAT once reads drain.
 * Where the weights go, and what happens to each read, is the load's target (model_load.h): the host
 * target here, the VRAM one in src/vram/vram_load.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "call.h"
#include "hub_cache.h"
#include "model.h"
#include "model_load.h"
#include "pretrained.h"
#include "variant.h"
#include "tower.h"

/* ---- Model lifetime ----------------------------------------------------------------------------- */

void model_retain(uform_model_t *model) {
    atomic_fetch_add_explicit(&model->references, 1, memory_order_relaxed);
}

static void model_destroy(uform_model_t *model) {
    if (model->device && model->device_release) model->device_release(model);
    struct tower *towers[] = {model->text, model->image, model->audio};
    for (size_t i = 0; i < 3; ++i) {
        if (towers[i]) tower_release(towers[i]);
        free(towers[i]);
    }
    if (model->mapping)
        munmap(model->mapping, model->mapping_size);
    else
        executor_deallocate(model->executor, model->data, model->data_size);
    checkpoint_header_free(&model->header);
    uform_tokenizer_free(model->tokenizer);
    if (model->executor) executor_release(model->executor);
    free(model);
}

UFORM_EXPORT void uform_model_free(uform_model_t *model) {
    if (!model) return;
    if (atomic_fetch_sub_explicit(&model->references, 1, memory_order_acq_rel) == 1) model_destroy(model);
}

void model_product_release(void *model) {
    uform_model_free(model);
}

UFORM_EXPORT uform_model_t *uform_outcome_model(uform_outcome_t *outcome) {
    return outcome_take_object(outcome, model_product_release);
}

UFORM_EXPORT uform_status_t uform_model_tokenizer(uform_model_t const *model,
                                                  uform_tokenizer_t const **tokenizer) {
    static char const entry[] = "uform_model_tokenizer";
    if (tokenizer) *tokenizer = NULL;
    if (!model || !tokenizer) return failed(UFORM_INVALID_ARGUMENT, entry, "model or tokenizer is NULL");
    if (!model->tokenizer)
        return failed(UFORM_UNSUPPORTED, entry,
                      model->header.info.has_text ? "the model reads the bytes of texts: it has no tokenizer"
                                                  : "the model has no text tower");
    *tokenizer = model->tokenizer;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_model_info(uform_model_t const *model, uform_model_info_t *info) {
    if (!model || !info) return failed(UFORM_INVALID_ARGUMENT, "uform_model_info", "model or info is NULL");
    *info = model->header.info;
    bool i8 = false;
    struct tower const *towers[] = {model->text, model->image, model->audio};
    for (size_t i = 0; i < sizeof towers / sizeof towers[0]; ++i)
        i8 |= towers[i] && towers[i]->i8_inputs > 0;
    info->weights = i8 ? UFORM_WEIGHTS_I8 : UFORM_WEIGHTS_BF16;
    return UFORM_OK;
}

/* ---- The load state machine --------------------------------------------------------------------- */

/* Packs the weights of every tower the engine runs for the active kernel path. */
static uform_status_t model_prepare_tower(uform_model_t *model, struct tower **tower, char const *name,
                                          uform_transformer_info_t const *info) {
    *tower = calloc(1, sizeof **tower);
    if (!*tower) return UFORM_OUT_OF_MEMORY;
    return tower_prepare(*tower, model, name, info);
}

/* A checkpoint's tokenizer (a converted pretrained model's), from its metadata. */
static uform_status_t model_tokenizer(uform_model_t *model) {
    checkpoint_header_t const *header = &model->header;
    if (!header->tokenizer || model->tokenizer) return UFORM_OK;
    uform_status_t status =
        uform_tokenizer_parse(header->tokenizer, strlen(header->tokenizer), &model->tokenizer);
    if (status == UFORM_OK)
        pretrained_tokenizer_fit(model->tokenizer, header->info.text.context, !header->info.text.cut_ids);
    return status;
}

static uform_status_t model_prepare(uform_model_t *model) {
    uform_model_info_t const *info = &model->header.info;
    uform_status_t status = UFORM_OK;
    if (info->has_text) status = model_prepare_tower(model, &model->text, "text", &info->text.transformer);
    if (status == UFORM_OK && info->has_image)
        status = model_prepare_tower(model, &model->image, "image", &info->image.transformer);
    if (status == UFORM_OK && info->has_audio)
        status = model_prepare_tower(model, &model->audio, "audio", &info->audio.transformer);
    return status;
}

static void load_finish(load_call_t *load) {
    /* A device target's model reads its tokenizer here (the host target's, in host_finish). */
    if (load->failure == UFORM_OK && load->target->device && model_tokenizer(load->model) != UFORM_OK)
        load_stop(load, UFORM_FORMAT, "cannot read the checkpoint's tokenizer");
    load->target->finish(load);
    uform_status_t status = load->failure;
    if (load->fd >= 0) close(load->fd);
    free(load->json);
    outcome_t *outcome = load->call.outcome;
    if (status == UFORM_OK) {
        outcome_set_object(outcome, load->model, model_product_release);
    } else if (load->model) {
        uform_model_free(load->model);
    }
    call_t *call = &load->call;
    char const *message = load->message;
    /* call_finish ends the call; the state goes first, as nothing may touch it after. */
    call_t ending = *call;
    free(load);
    call_finish(&ending, status, message);
}

void load_stop(load_call_t *load, uform_status_t status, char const *message) {
    if (load->failure == UFORM_OK) {
        load->failure = status;
        load->message = message;
    }
}

void load_fail(load_call_t *load, uform_status_t status, char const *message) {
    load_stop(load, status, message);
    load_finish(load);
}

static void load_read_done(loop_op_t *op);

void load_issue_reads(load_call_t *load) {
    uform_model_t *model = load->model;
    loop_t *loop = load->call.executor->loop;
    bool copying = load->target->pending && load->target->pending(load);
    for (size_t i = 0; i < LOAD_READS && load->failure == UFORM_OK && load->issued < model->data_size; ++i) {
        load_read_t *read = &load->reads[i];
        if (read->busy || read->copying) continue;
        size_t length = model->data_size - load->issued < LOAD_CHUNK
                            ? (size_t)(model->data_size - load->issued)
                            : LOAD_CHUNK;
        read->busy = true;
        read->load = load;
        read->at = load->issued;
        read->op.callback = load_read_done;
        load->in_flight++;
        loop_read(loop, &read->op, load->fd, load->target->buffer(load, i), length,
                  model->header.data_offset + load->issued);
        load->issued += length;
    }
    if (load->in_flight == 0 && !copying) {
        load_finish(load);
        return;
    }
    /* Only the target's use of its buffers runs: it comes back when they are free. */
    if (load->in_flight == 0) load->target->idle(load);
}

static void load_read_done(loop_op_t *op) {
    load_read_t *read = container_of(op, load_read_t, op);
    load_call_t *load = read->load;
    read->busy = false;
    load->in_flight--;
    if (op->result < 0)
        load_stop(load, UFORM_IO, "cannot read checkpoint");
    else if ((size_t)op->result < op->length)
        load_stop(load, UFORM_FORMAT, "checkpoint truncated while reading");
    else {
        if (load->target->landed && load->failure == UFORM_OK)
            load->target->landed(load, (size_t)(read - load->reads), (size_t)op->result);
        load->done += (uint64_t)op->result;
        if (load->failure == UFORM_OK &&
            progress_report(&load->progress, &load->next_step, load->done, load->model->data_size))
            load_stop(load, UFORM_CANCELLED, "cancelled by the progress handler");
    }
    load_issue_reads(load);
}

/* Whether a checkpoint stores I8 weights (uform_checkpoint_quantize's). */
static bool stores_i8(checkpoint_header_t const *header) {
    for (size_t i = 0; i < header->tensors_count; ++i)
        if (header->tensors[i].dtype == CHECKPOINT_I8) return true;
    return false;
}

/* The header is valid: make the model, then read its tensors, or map them. */
static void load_weights(load_call_t *load, checkpoint_header_t *header, void *mapping) {
    uform_executor_t *executor = load->call.executor;
    char const *refusal = load->target->refusal ? load->target->refusal(&header->info) : NULL;
    if (refusal) {
        checkpoint_header_free(header);
        if (mapping) munmap(mapping, load->statx.stx_size);
        load_fail(load, UFORM_UNSUPPORTED, refusal);
        return;
    }
    if (load->target->device && stores_i8(header)) { /* a device target never maps */
        checkpoint_header_free(header);
        load_fail(load, UFORM_UNSUPPORTED, "a checkpoint with I8 weights loads on host executors");
        return;
    }
    uform_model_t *model = calloc(1, sizeof *model);
    if (!model) {
        checkpoint_header_free(header);
        if (mapping) munmap(mapping, load->statx.stx_size);
        load_fail(load, UFORM_OUT_OF_MEMORY, "cannot allocate the model");
        return;
    }
    atomic_init(&model->references, 1);
    model->weights = load->weights;
    model->header = *header;
    model->data_size = header->data_size;
    load->model = model;
    if (mapping) {
        model->mapping = mapping;
        model->mapping_size = load->statx.stx_size;
        model->data = (uint8_t *)mapping + header->data_offset;
        progress_report(&load->progress, &load->next_step, model->data_size, model->data_size);
        load_finish(load);
        return;
    }
    model->executor = executor;
    executor_retain(executor);
    load->target->weights(load);
}

/* The load whose step `op` completed, or NULL once a step that failed (result < 0) has failed the load
 * with UFORM_IO and `message`. */
static load_call_t *load_step(loop_op_t *op, char const *message) {
    load_call_t *load = container_of(op, load_call_t, step);
    if (op->result >= 0) return load;
    load_fail(load, UFORM_IO, message);
    return NULL;
}

/* After the header's parse: the model (load_weights) when it parsed, else the load fails with the
 * parse's status and message, and the mapping goes. */
static void load_parsed(load_call_t *load, uform_status_t status, char const *message,
                        checkpoint_header_t *header, void *mapping) {
    if (status == UFORM_OK) {
        load_weights(load, header, mapping);
        return;
    }
    if (mapping) munmap(mapping, load->statx.stx_size);
    load_fail(load, status, message);
}

static void load_header_done(loop_op_t *op) {
    load_call_t *load = load_step(op, "cannot read checkpoint");
    if (!load) return;
    if ((uint64_t)op->result < load->header_length) {
        load_fail(load, UFORM_FORMAT, "checkpoint truncated in its header");
        return;
    }
    checkpoint_header_t header;
    char const *message = NULL;
    uform_status_t status =
        checkpoint_parse(load->json, load->header_length, load->statx.stx_size, &header, &message);
    free(load->json);
    load->json = NULL;
    load_parsed(load, status, message, &header, NULL);
}

static void load_prefix_done(loop_op_t *op) {
    load_call_t *load = load_step(op, "cannot read checkpoint");
    if (!load) return;
    char const *message = NULL;
    uform_status_t status = checkpoint_prefix(load->prefix, (size_t)op->result, load->statx.stx_size,
                                              &load->header_length, &message);
    if (status != UFORM_OK) {
        load_fail(load, status, message);
        return;
    }
    load->json = malloc(load->header_length);
    if (!load->json) {
        load_fail(load, UFORM_OUT_OF_MEMORY, "cannot allocate the header");
        return;
    }
    load->step.callback = load_header_done;
    loop_read(load->call.executor->loop, &load->step, load->fd, load->json, load->header_length, 8);
}

static void load_map(load_call_t *load) {
    uint64_t size = load->statx.stx_size;
    char const *message = "file too short for a checkpoint";
    uform_status_t status = UFORM_FORMAT;
    if (size < 8) {
        load_fail(load, status, message);
        return;
    }
    void *mapping = mmap(NULL, size, PROT_READ, MAP_PRIVATE, load->fd, 0);
    if (mapping == MAP_FAILED) {
        load_fail(load, UFORM_IO, "cannot map checkpoint");
        return;
    }
    uint64_t header_length = 0;
    checkpoint_header_t header;
    status = checkpoint_prefix(mapping, 8, size, &header_length, &message);
    if (status == UFORM_OK)
        status = checkpoint_parse((char const *)mapping + 8, header_length, size, &header, &message);
    load_parsed(load, status, message, &header, mapping);
}

/* A pretrained folder (pretrained.h), read on the loop thread, then prepared as a checkpoint is. */
static void load_folder(load_call_t *load) {
    char const *message = NULL;
    pretrained_model_t read;
    uform_status_t status = pretrained_read(load->path, load->call.executor, &read, &message);
    char const *refusal =
        status == UFORM_OK && load->target->refusal ? load->target->refusal(&read.header.info) : NULL;
    if (refusal) {
        executor_deallocate(load->call.executor, read.data, read.data_size);
        checkpoint_header_free(&read.header);
        uform_tokenizer_free(read.tokenizer);
        status = UFORM_UNSUPPORTED, message = refusal;
    }
    uform_model_t *model = status == UFORM_OK ? calloc(1, sizeof *model) : NULL;
    if (status == UFORM_OK && !model) {
        executor_deallocate(load->call.executor, read.data, read.data_size);
        checkpoint_header_free(&read.header);
        uform_tokenizer_free(read.tokenizer);
        status = UFORM_OUT_OF_MEMORY, message = "cannot allocate the model";
    }
    if (status != UFORM_OK) {
        load_fail(load, status, message);
        return;
    }
    atomic_init(&model->references, 1);
    model->weights = load->weights;
    model->header = read.header;
    model->data = read.data;
    model->data_size = read.data_size;
    model->tokenizer = read.tokenizer;
    model->executor = load->call.executor;
    executor_retain(model->executor);
    load->model = model;
    if (load->target->placed && (status = load->target->placed(load, &message)) != UFORM_OK)
        load_stop(load, status, message);
    progress_report(&load->progress, &load->next_step, model->data_size, model->data_size);
    load_finish(load);
}

static void load_statx_done(loop_op_t *op) {
    load_call_t *load = load_step(op, "cannot stat checkpoint");
    if (!load) return;
    if (S_ISDIR(load->statx.stx_mode)) {
        load_folder(load);
        return;
    }
    if (!S_ISREG(load->statx.stx_mode)) {
        load_fail(load, UFORM_IO, "checkpoint is not a regular file");
        return;
    }
    if (load->map) {
        load_map(load);
        return;
    }
    load->step.callback = load_prefix_done;
    size_t length = load->statx.stx_size < 8 ? (size_t)load->statx.stx_size : 8;
    loop_read(load->call.executor->loop, &load->step, load->fd, load->prefix, length, 0);
}

/* Why a checkpoint did not open, by the open's -errno: the causes a user can act on named. */
static char const *open_failure(int64_t result) {
    switch (-result) {
    case ENOENT:
        return "cannot open checkpoint: no such file or folder";
    case EACCES:
    case EPERM:
        return "cannot open checkpoint: permission denied";
    case ENOTDIR:
        return "cannot open checkpoint: a part of its path is not a folder";
    case ENAMETOOLONG:
        return "cannot open checkpoint: its path is too long";
    case ELOOP:
        return "cannot open checkpoint: too many symbolic links in its path";
    case EMFILE:
    case ENFILE:
        return "cannot open checkpoint: too many open files";
    default:
        return "cannot open checkpoint";
    }
}

static void load_open_done(loop_op_t *op) {
    load_call_t *load = load_step(op, open_failure(op->result));
    if (!load) return;
    load->fd = (int)op->result;
    load->step.callback = load_statx_done;
    loop_statx(load->call.executor->loop, &load->step, load->fd, &load->statx);
}

static void load_start(call_t *call) {
    load_call_t *load = container_of(call, load_call_t, call);
    load->step.callback = load_open_done;
    loop_open(call->executor->loop, &load->step, load->path, O_RDONLY);
}

/* ---- The host target: the weights in the executor's memory ------------------------------------ */

static void host_weights(load_call_t *load) {
    uform_model_t *model = load->model;
    model->data = executor_allocate(load->call.executor, model->data_size);
    if (!model->data) {
        load_fail(load, UFORM_OUT_OF_MEMORY, "cannot allocate the weights");
        return;
    }
    load_issue_reads(load);
}

static void *host_buffer(load_call_t *load, size_t read) {
    return load->model->data + load->reads[read].at;
}

static void host_finish(load_call_t *load) {
    if (load->failure != UFORM_OK) return;
    uform_status_t status = model_tokenizer(load->model);
    if (status != UFORM_OK) {
        load_stop(load, status, "cannot read the checkpoint's tokenizer");
        return;
    }
    if (model_prepare(load->model) != UFORM_OK)
        load_stop(load, UFORM_OUT_OF_MEMORY, "cannot allocate the prepared weights");
}

static model_load_target_t const model_load_host = {
    .weights = host_weights,
    .buffer = host_buffer,
    .finish = host_finish,
};

/* ---- The verbs ---------------------------------------------------------------------------------- */

/* call_run's keep: the model of a successful blocking load, NULL for a failed one. */
static void load_keep(uform_outcome_t *own, void *model) {
    *(uform_model_t **)model = uform_outcome_model(own);
}

uform_status_t model_load(uform_model_load_args_t const *args, model_load_target_t const *target,
                          char const *entry) {
    uform_outcome_t *outcome = args->outcome;
    if (!args->path || !args->path[0])
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry, "path is NULL or empty");
    if (!outcome && !args->model) return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry, "model is NULL");
    if (!target->device && args->executor && executor_on_device(args->executor))
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry,
                           "a VRAM executor loads with uform_model_load_vram");
    if (target->device && (!args->executor || !executor_on_device(args->executor)))
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry,
                           "uform_model_load_vram needs a VRAM executor");
    uform_weights_t weights = args->config ? args->config->weights : UFORM_WEIGHTS_STORED;
    if (weights != UFORM_WEIGHTS_STORED && weights != UFORM_WEIGHTS_BF16 && weights != UFORM_WEIGHTS_I8)
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry,
                           "config->weights is not a uform_weights_t");
    if (target->device && weights == UFORM_WEIGHTS_I8)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "I8 weights run on host executors");
    uform_executor_t *executor = call_executor(args->executor);
    if (!executor)
        return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot make the calling thread's executor");

    /* A path that names no file or folder but a hub id: the snapshot folder in the local cache, kept
     * after the load's state. */
    char hub_path[4096];
    size_t hub_bytes = 0;
    struct stat status;
    if (stat(args->path, &status) != 0 && errno == ENOENT) {
        char text[UFORM_ERROR_MESSAGE_SIZE], message[UFORM_ERROR_MESSAGE_SIZE];
        char const *why = NULL;
        uform_status_t found = hub_folder(args->path, hub_path, sizeof hub_path, &why, text);
        if (found == UFORM_IO) { /* an id, not cached: a path that is not an id fails as a path */
            snprintf(message, sizeof message, "no such file or folder; %s", why);
            return call_refuse(outcome, UFORM_IO, entry, message);
        }
        if (found == UFORM_OK) hub_bytes = strlen(hub_path) + 1;
    }
    load_call_t *load = calloc(1, sizeof *load + target->state_bytes + hub_bytes);
    if (!load) return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot allocate the load");
    load->target = target;
    load->path = args->path;
    if (hub_bytes) load->path = memcpy(load->target_state + target->state_bytes, hub_path, hub_bytes);
    load->fd = -1;
    load->next_step = 1;
    if (args->config) {
        load->progress = args->config->progress;
        load->map = args->config->map && !target->device; /* device weights are copied, never mapped */
        load->weights = args->config->weights;
    }
    call_plan_t plan = call_plan(entry, executor, NULL, outcome, sizeof *load, load_start);
    plan.state = &load->call; /* freed by call_run if the call cannot open, else by load_finish */
    plan.keep = (call_keep_t){load_keep, args->model};
    return call_run(&plan);
}

UFORM_EXPORT uform_status_t uform_model_load_ram(uform_model_load_args_t const *args) {
    static char const entry[] = "uform_model_load_ram";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    return model_load(args, &model_load_host, entry);
}

uform_status_t model_residency(uform_model_t const *model, uform_executor_t const *executor,
                               char const **message) {
    bool device_executor = executor && executor_on_device(executor);
    if (model->device && !device_executor)
        return *message = "a VRAM model runs on the VRAM executor that loaded it", UFORM_INVALID_ARGUMENT;
    if (!model->device && device_executor)
        return *message = "a host model runs on host executors", UFORM_INVALID_ARGUMENT;
    if (model->device && model->executor != executor)
        return *message = "a VRAM model runs on the VRAM executor that loaded it", UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}
