/* The VRAM trainer (src/train/train_vram.c): a trainer whose steps run on a VRAM executor's first device,
 * sharing the RAM trainer's parameters on the host (train_params_t: made, loaded and saved as a RAM
 * trainer's) and its step's phases (train_step_ops_t). Built with CUDA only. */
#pragma once

#include "train_step.h"

#if UFORM_WITH_CUDA
#include "cuda/cuda_train.h"

/* Makes `trainer` (made by trainer_create, its parameters on the host) a VRAM trainer on `executor`, a VRAM
 * executor, from its loop thread: its parameters and moments copied into flat buffers on the executor's
 * first device (over a mesh of several processes, the mesh's device), its step and save the device's.
 * UFORM_OK, UFORM_OUT_OF_MEMORY, UFORM_DEVICE (a device failure, a broken mesh), or UFORM_INVALID_ARGUMENT
 * (a mesh bootstrapped over another executor), with the reason in *message; on failure trainer_destroy
 * frees what was made. */
uform_status_t train_vram_attach(uform_trainer_t *trainer, uform_executor_t *executor, char const **message);

/* The device's AdamW settings of optimizer step `step` (1-based), as train_params_update derives them. */
cuda_adamw_t train_vram_adamw(train_optimizer_t const *optimizer, size_t step);
#endif
