/* VRAM executors: the kind whose calls run on one loop thread that drives the devices (vram.h), whose
 * arenas hold device memory. A build without CUDA answers UFORM_UNSUPPORTED once the arguments pass,
 * here for both VRAM entry points: uform_executor_create_vram, and uform_model_load_vram (with CUDA in
 * src/vram/vram_load.c), so that no model is ever on a device there. */
#include "call.h"
#include "executor.h"
#include "vram.h"

#if UFORM_WITH_CUDA
static void vram_executor_destroy(uform_executor_t *executor) {
    if (executor->state) vram_close(executor);
}

static executor_ops_t const vram_ops = {
    .kind = UFORM_EXECUTOR_VRAM,
    .destroy = vram_executor_destroy,
    .allocate = vram_host_allocate,
    .deallocate = vram_host_deallocate,
    .device = {vram_allocate, vram_deallocate, vram_copy_to_host},
};

/* An executor on the devices `options` name, its loop thread started. */
static uform_status_t vram_executor_create(uform_vram_options_t const *options, uform_executor_t **out,
                                           char const *entry) {
    uform_executor_t *executor = executor_new(&vram_ops);
    if (!executor) return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
    char const *message = NULL;
    uform_status_t status = vram_open(executor, options, &message);
    if (status == UFORM_OK) status = executor_start_loop(executor, &message);
    if (status != UFORM_OK) {
        executor_destroy(executor);
        return failed(status, entry, message);
    }
    *out = executor;
    return UFORM_OK;
}
#else
static char const no_cuda[] = "built without CUDA";

UFORM_EXPORT uform_status_t uform_model_load_vram(uform_model_load_args_t const *args) {
    static char const entry[] = "uform_model_load_vram";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->path || !args->path[0])
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "path is NULL or empty");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, no_cuda);
}

static uform_status_t vram_executor_create(uform_vram_options_t const *options, uform_executor_t **out,
                                           char const *entry) {
    (void)options, (void)out;
    return failed(UFORM_UNSUPPORTED, entry, no_cuda);
}
#endif

UFORM_EXPORT uform_status_t uform_executor_create_vram(uform_vram_options_t const *options,
                                                       uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_vram";
    if (out) *out = NULL;
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    if (options && options->devices_count && !options->devices)
        return failed(UFORM_INVALID_ARGUMENT, entry, "devices is NULL with a non-zero count");
    /* What the options say that needs no device, in every build: at most VRAM_MAX_DEVICES, none twice. */
    if (options && options->devices_count > VRAM_MAX_DEVICES)
        return failed(UFORM_INVALID_ARGUMENT, entry, "more than 16 devices");
    for (size_t i = 0; options && i < options->devices_count; ++i)
        for (size_t j = 0; j < i; ++j)
            if (options->devices[j] == options->devices[i])
                return failed(UFORM_INVALID_ARGUMENT, entry, "a device is listed twice");
    return vram_executor_create(options, out, entry);
}
