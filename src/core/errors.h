/* Recording failures: every public entry point that fails calls `failed` (or `call_refuse`) once, with
 * its own name and a message, so that the thread (and the outcome) can say what went wrong. A message
 * may be built in a buffer of the caller's (a trainer's "item 3: ..."): it is copied where it is kept,
 * into the thread's buffer here and into the outcome's own (error_keep), never kept by address. */
#pragma once

#include "uform.h"

/* Writes {status, entry, a copy of message} into `error`, the copy in `storage` (truncated to
 * UFORM_ERROR_MESSAGE_SIZE - 1 bytes; `message` may already lie in `storage`). `entry` must have static
 * storage; NULL strings read as empty. */
void error_keep(uform_error_t *error, char storage[UFORM_ERROR_MESSAGE_SIZE], uform_status_t status,
                char const *entry, char const *message);

/* Records {status, entry, message} as the calling thread's last error and answers `status`. `entry` must
 * have static storage; `message` is copied into the thread's buffer. */
uform_status_t failed(uform_status_t status, char const *entry, char const *message);
