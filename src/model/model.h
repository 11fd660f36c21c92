/* Models: a checkpoint loaded onto an executor, its towers prepared for the kernels (tower.h) or its
 * weights on devices (src/vram), kept alive by references (model.c). */
#pragma once

#include "checkpoint.h"
#include "common.h"

struct tower;
struct encode_verbs;

struct uform_model {
    _Atomic size_t references;
    struct tower *text;  /* prepared for the kernels when the model has a text tower */
    struct tower *image; /* the image tower (video uses it too), when present */
    struct tower *audio; /* the audio tower, when present */
    uform_tokenizer_t
        *tokenizer;            /* a text tower that reads tokens: its tokenizer, truncating at the context */
    struct vram_model *device; /* VRAM models: the weights on each device (src/vram/vram.h); NULL on host */
    void (*device_release)(uform_model_t *model); /* frees `device`; set with it by the VRAM load */
    struct encode_verbs const *verbs; /* the verbs of the model's residency; NULL: the host's (verbs.h) */
    uform_executor_t *executor;       /* owns the placement of `data`; NULL: plain host memory */
    uform_weights_t weights;          /* what the load asked of the blocks' linear layers (tower_prepare) */
    checkpoint_header_t header;
    uint8_t *data; /* the data section: tensor t spans data + begin .. data + end */
    size_t data_size;
    void *mapping; /* when mapped: the whole file */
    size_t mapping_size;
};

void model_retain(uform_model_t *model);

/* A loaded model as an outcome's product: released (uform_model_free) unless the caller takes it
 * (uform_outcome_model). */
void model_product_release(void *model);

/* The bytes of a tensor, or NULL when absent. */
static inline void const *model_tensor(uform_model_t const *model, char const *name,
                                       checkpoint_tensor_t const **tensor) {
    checkpoint_tensor_t const *found = checkpoint_find(&model->header, name);
    if (tensor) *tensor = found;
    return found ? model->data + found->begin : NULL;
}

/* A VRAM model runs on the VRAM executor that loaded it; a host model on host executors.
 * UFORM_OK, or UFORM_INVALID_ARGUMENT with a message. */
uform_status_t model_residency(uform_model_t const *model, uform_executor_t const *executor,
                               char const **message);
