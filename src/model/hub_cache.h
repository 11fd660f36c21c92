/* Models in the local cache of the Hugging Face hub (hub_cache.c): a repository id, and the snapshot
 * folder it names there. */
#pragma once

#include <stddef.h>

#include "uform.h"

/* The snapshot folder `id` names in the cache (NUL-terminated, into `folder` of `capacity` bytes): `id` is
 * [OWNER/]NAME[@REVISION], each part of letters, digits, '-', '_' and '.', without "--" or "..", neither
 * starting nor ending with '-' or '.', at most 96 bytes, a revision of such parts between slashes. Answers
 * UFORM_OK, UFORM_INVALID_ARGUMENT (not an id; a path too long) or UFORM_IO (an id not cached, or no cache
 * folder), with *message (static, or built in `text`). Blocking: a few stat(2) calls and one small read. */
uform_status_t hub_folder(char const *id, char *folder, size_t capacity, char const **message,
                          char text[UFORM_ERROR_MESSAGE_SIZE]);
