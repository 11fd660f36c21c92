/* Recording failures: every public entry point that fails calls `failed` (or `call_refuse`) once, with
 * its own name and a static message, so that the thread (and the outcome) can say what went wrong. */
#pragma once

#include "uform.h"

/* Records {status, entry, message} as the calling thread's last error and answers `status`.
 * Both strings must have static storage. */
uform_status_t failed(uform_status_t status, char const *entry, char const *message);
