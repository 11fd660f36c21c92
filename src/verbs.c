/* The verbs that later issues build, and where a model may run. Each stub validates its
 * arguments exactly as the built verb will, so that callers see the final behaviour for bad input today, then
 * answers UFORM_UNSUPPORTED (through its outcome too, when one is given). */
#include "engine.h"

uform_status_t model_residency(uform_model_t const *model, uform_executor_t const *executor,
                               char const **message) {
    bool device_executor = executor && executor->kind == UFORM_EXECUTOR_VRAM;
    if (model->device && !device_executor)
        return *message = "a VRAM model runs on the VRAM executor that loaded it", UFORM_INVALID_ARGUMENT;
    if (!model->device && device_executor)
        return *message = "a host model runs on host executors", UFORM_INVALID_ARGUMENT;
    if (model->device && model->executor != executor)
        return *message = "a VRAM model runs on the VRAM executor that loaded it", UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}

/* ---- Mesh and trainer --------------------------------------------------------------------------- */

UFORM_EXPORT uform_status_t uform_mesh_bootstrap(uform_mesh_bootstrap_args_t const *args) {
    static char const entry[] = "uform_mesh_bootstrap";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || (!args->outcome && !args->mesh))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "executor or mesh is NULL");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "meshes are not built yet");
}

UFORM_EXPORT void uform_mesh_free(uform_mesh_t *mesh) {
    (void)mesh; /* no mesh can exist in this build */
}

UFORM_EXPORT size_t uform_mesh_rank(uform_mesh_t const *mesh) {
    (void)mesh;
    return 0;
}

UFORM_EXPORT size_t uform_mesh_size(uform_mesh_t const *mesh) {
    (void)mesh;
    return 1;
}

static uform_status_t trainer_init_refuse(uform_trainer_init_args_t const *args, char const *entry) {
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->config || (!args->outcome && !args->trainer))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "executor, config or trainer is NULL");
    if (args->config->hidden % 64)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "hidden is not a multiple of 64");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "trainers are not built yet");
}

UFORM_EXPORT uform_status_t uform_trainer_init_ram(uform_trainer_init_args_t const *args) {
    return trainer_init_refuse(args, "uform_trainer_init_ram");
}

UFORM_EXPORT uform_status_t uform_trainer_init_vram(uform_trainer_init_args_t const *args) {
    return trainer_init_refuse(args, "uform_trainer_init_vram");
}

UFORM_EXPORT void uform_trainer_free(uform_trainer_t *trainer) {
    (void)trainer; /* no trainer can exist in this build */
}

UFORM_EXPORT uform_status_t uform_trainer_step(uform_trainer_step_args_t const *args) {
    static char const entry[] = "uform_trainer_step";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->trainer || !args->executor)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "trainer or executor is NULL");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "trainers are not built yet");
}

UFORM_EXPORT uform_status_t uform_trainer_save(uform_trainer_save_args_t const *args) {
    static char const entry[] = "uform_trainer_save";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->trainer || !args->executor || !args->path)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "trainer, executor or path is NULL");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "trainers are not built yet");
}
