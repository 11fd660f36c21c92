/* The small model the trainer's suites train (test_train.c, test_train_params.c, mesh_train.c): the
 * default config with one block of 64 in every tower, embeddings of `dims` over `context` text bytes. Each
 * suite sets its towers and optimizer on top. */
#pragma once

#include <stddef.h>

#include "uform.h"

static inline uform_trainer_config_t small_config_of(size_t dims, size_t context) {
    uform_trainer_config_t config;
    uform_trainer_config_default(&config);
    config.depth = 1;
    config.hidden = 64;
    config.dims = dims;
    config.context = context;
    return config;
}
