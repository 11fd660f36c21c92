/* Statuses and errors: the calling thread's last failure, status names, rendering. */
#include <stdio.h>
#include <string.h>

#include "common.h"

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
