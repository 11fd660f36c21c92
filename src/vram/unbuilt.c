/* The VRAM entry points of a build without CUDA: each checks its arguments as the real one does and
 * answers UFORM_UNSUPPORTED. */
#include "common.h"

UFORM_EXPORT uform_status_t uform_executor_create_vram(uform_vram_options_t const *options,
                                                       uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_vram";
    if (out) *out = NULL;
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    if (options && options->devices_count && !options->devices)
        return failed(UFORM_INVALID_ARGUMENT, entry, "devices is NULL with a non-zero count");
    return failed(UFORM_UNSUPPORTED, entry, "built without CUDA");
}
