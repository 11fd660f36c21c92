/* Tapes: the public header's packed sequences of byte strings (texts, encoded images, file paths). */
#pragma once

#include "common.h"

/* UFORM_OK, or UFORM_INVALID_ARGUMENT with a message (NULL offsets with count > 0, NULL data with a
 * non-empty span, offsets out of order). */
uform_status_t tape_validate(uform_tape_t const *tape, char const **message);
