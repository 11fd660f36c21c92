/* Loading onto a VRAM executor in a build without CUDA: UFORM_UNSUPPORTED once the arguments pass, so
 * no model is ever on a device there (and the VRAM verbs, src/vram/vram_verbs.c, are not built). */
#include "call.h"

static char const no_cuda[] = "built without CUDA";

UFORM_EXPORT uform_status_t uform_model_load_vram(uform_model_load_args_t const *args) {
    static char const entry[] = "uform_model_load_vram";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->path || !args->path[0])
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "path is NULL or empty");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, no_cuda);
}
