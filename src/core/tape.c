/* Tapes (tape.h): the checks every verb that reads one makes first. */
#include "tape.h"

uform_status_t tape_validate(uform_tape_t const *tape, char const **message) {
    if (tape->count == 0) return UFORM_OK;
    if (!tape->offsets) return *message = "tape offsets are NULL", UFORM_INVALID_ARGUMENT;
    for (size_t i = 0; i < tape->count; ++i)
        if (tape->offsets[i + 1] < tape->offsets[i])
            return *message = "tape offsets out of order", UFORM_INVALID_ARGUMENT;
    if (tape->offsets[tape->count] > tape->length)
        return *message = "tape offsets past the end of the tape", UFORM_INVALID_ARGUMENT;
    if (!tape->data && tape->offsets[tape->count] != tape->offsets[0])
        return *message = "tape data is NULL", UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}
