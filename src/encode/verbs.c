/* Where a model may run: host models on host executors, VRAM models on the VRAM executor that loaded
 * them. */
#include "executor.h"
#include "model.h"

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
