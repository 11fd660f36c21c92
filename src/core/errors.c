/* Statuses, errors and what the library reports about itself. */
#include <stdio.h>
#include <string.h>

#include "engine.h"

/* The calling thread's last failure; its message is always a copy in last_message. */
static _Thread_local char last_message[UFORM_ERROR_MESSAGE_SIZE];
static _Thread_local uform_error_t last_error = {UFORM_OK, "", ""};

void error_keep(uform_error_t *error, char storage[UFORM_ERROR_MESSAGE_SIZE], uform_status_t status,
                char const *entry, char const *message) {
    if (!message) message = "";
    size_t length = strnlen(message, UFORM_ERROR_MESSAGE_SIZE - 1);
    memmove(storage, message, length); /* `message` may be `storage` itself: a failure passed on */
    storage[length] = '\0';
    *error = (uform_error_t){status, entry ? entry : "", storage};
}

uform_status_t failed(uform_status_t status, char const *entry, char const *message) {
    error_keep(&last_error, last_message, status, entry, message);
    return status;
}

UFORM_EXPORT char const *uform_status_name(uform_status_t status) {
    switch (status) {
    case UFORM_OK:
        return "ok";
    case UFORM_PENDING:
        return "pending";
    case UFORM_CANCELLED:
        return "cancelled";
    case UFORM_CONTENDED:
        return "contended";
    case UFORM_INVALID_ARGUMENT:
        return "invalid_argument";
    case UFORM_IO:
        return "io";
    case UFORM_FORMAT:
        return "format";
    case UFORM_OUT_OF_MEMORY:
        return "out_of_memory";
    case UFORM_DEVICE:
        return "device";
    case UFORM_UNSUPPORTED:
        return "unsupported";
    case UFORM_INTERNAL:
        return "internal";
    case UFORM_MISSING_SYMBOL:
        return "missing_symbol";
    }
    return "unknown";
}

UFORM_EXPORT uform_error_t uform_last_error(void) {
    return last_error;
}

UFORM_EXPORT size_t uform_error_render(uform_error_t const *error, char *buffer, size_t capacity) {
    static uform_error_t const none = {UFORM_OK, "", ""};
    if (!error) error = &none;
    int length =
        snprintf(buffer, buffer ? capacity : 0, "UForm: %s [%s]: %s", uform_status_name(error->status),
                 error->entry ? error->entry : "", error->message ? error->message : "");
    return length < 0 ? 0 : (size_t)length;
}

UFORM_EXPORT uint32_t uform_features(void) {
    /* A feature is reported when its verbs use it, not merely when the build found it: NCCL, which the
     * build detects, is not reported, as no verb uses it; the server is the `uform` command's, not the
     * library's. */
    uint32_t features = 0;
    if (UFORM_WITH_URING && loop_uring_available()) features |= UFORM_FEATURE_URING;
    if (UFORM_WITH_HWLOC) features |= UFORM_FEATURE_HWLOC;
    if (UFORM_WITH_FORK_UNION) features |= UFORM_FEATURE_FORK_UNION;
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
