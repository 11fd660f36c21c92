/* What the library reports about itself: its version, the features this build has and the CPU kernels it
 * computes with. */
#include "common.h"
#include "kernels.h"
#include "loop.h"

UFORM_EXPORT uint32_t uform_features(void) {
    /* A feature is reported when its verbs use it, not merely when the build found it: NCCL, which the
     * build detects, is not reported, as no verb uses it; the server is the `uform` command's, not the
     * library's. */
    uint32_t features = 0;
    if (UFORM_WITH_URING && loop_uring_available()) features |= UFORM_FEATURE_URING;
    if (UFORM_WITH_HWLOC) features |= UFORM_FEATURE_HWLOC;
    if (UFORM_WITH_FORK_UNION) features |= UFORM_FEATURE_FORK_UNION;
    if (UFORM_WITH_TOKENIZERS) features |= UFORM_FEATURE_TOKENIZERS;
    if (UFORM_WITH_SENTENCEPIECE) features |= UFORM_FEATURE_SENTENCEPIECE;
    if (UFORM_WITH_JPEG) features |= UFORM_FEATURE_JPEG;
    if (UFORM_WITH_SPNG) features |= UFORM_FEATURE_SPNG;
    if (UFORM_WITH_FFMPEG) features |= UFORM_FEATURE_FFMPEG;
    if (UFORM_WITH_CUDA) features |= UFORM_FEATURE_CUDA;
    if (UFORM_WITH_MPI) features |= UFORM_FEATURE_MPI;
    return features;
}

UFORM_EXPORT void uform_version(int *major, int *minor, int *patch) {
    if (major) *major = UFORM_VERSION_MAJOR;
    if (minor) *minor = UFORM_VERSION_MINOR;
    if (patch) *patch = UFORM_VERSION_PATCH;
}

UFORM_EXPORT char const *uform_kernels(char const **reason, char const **amx) {
    if (reason) *reason = kernels_reason();
    if (amx) *amx = kernels_amx_state();
    return kernels_active()->name;
}
