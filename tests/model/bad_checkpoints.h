/* Malformed checkpoints for tests: each variant is a tiny checkpoint (uform_tiny_checkpoint) with one
 * fault, written as a file, and described with the status a reader must answer. The checkpoint parser's
 * test reads them directly; the load verb's test loads them through the public interface. */
#pragma once

#include <stddef.h>

#include "uform.h"

#define BAD_CHECKPOINTS_MAX 64

typedef struct bad_checkpoint {
    char path[512];
    char const *what;        /* the fault, in words: "header length 0" */
    uform_status_t expected; /* UFORM_FORMAT, or UFORM_OK for the few valid variants */
    char const *message;     /* the message checkpoint_prefix or checkpoint_parse answers (NULL when OK) */
} bad_checkpoint_t;

/* Writes every variant into `directory` (which must exist), describing the first `capacity` of them
 * in `out` (files beyond `capacity` are not written). Answers how many variants there are, or 0 when
 * one could not be made (its cause is printed on stderr). Files are named `bad-NN-*.safetensors`;
 * the caller removes them (bad_checkpoints_remove). */
size_t bad_checkpoints_write(char const *directory, bad_checkpoint_t *out, size_t capacity);

/* Removes the files of the first `count` variants bad_checkpoints_write described. */
void bad_checkpoints_remove(bad_checkpoint_t const *bad, size_t count);
