/* What `uform search index` and `uform search query` share: the index file and how a text file is read.
 *
 * The index file, version 1. Every integer is little-endian; the file holds exactly these parts, with
 * nothing between or after them:
 *
 *   offset  size                 what
 *   0       8                    magic "UFORMIDX"
 *   8       4                    u32 version: 1
 *   12      4                    u32 dims: the width of every vector
 *   16      8                    u64 items
 *   24      8                    u64 model_bytes
 *   32      8                    u64 paths_bytes
 *   40      24                   zeros
 *   64      items * dims * 4     the vectors: F32, unit-norm, one row per item, row-major
 *   ...     model_bytes          the model's checkpoint, an absolute path (no NUL)
 *   ...     items                each item's modality: 0 text, 1 image, 2 video, 3 audio (uform_modality_t)
 *   ...     (items + 1) * 8      u64 offsets into the paths: 0, non-decreasing, the last paths_bytes
 *   ...     paths_bytes          item i's path relative to the indexed folder spans [offsets[i],
 * offsets[i+1])
 *
 * With NumPy: np.frombuffer(data, '<f4', items * dims, 64).reshape(items, dims). */
#ifndef UFORM_SEARCH_H
#define UFORM_SEARCH_H

#include "uform_command.h"

#define SEARCH_MAGIC "UFORMIDX"
enum { SEARCH_VERSION = 1, SEARCH_HEADER_SIZE = 64 };

/* ---- writing: uform_search_file.c --------------------------------------------------------------- */

typedef struct search_writer search_writer_t;

/* Starts an index of `dims`-wide vectors made with the checkpoint at `model`, in a new temporary file
 * beside `path`. Answers an exit code, after printing the error. */
int search_writer_open(char const *path, char const *model, size_t dims, search_writer_t **writer);

/* Appends an item: its modality, its path relative to the folder, and its unit vector of `dims` F32. */
int search_writer_add(search_writer_t *writer, uform_modality_t modality, char const *path, size_t length,
                      float const *vector);

/* Completes the file, syncs it and renames it over `path`; frees the writer either way. */
int search_writer_commit(search_writer_t *writer);

/* Removes the temporary file and frees the writer; NULL is ignored. */
void search_writer_abort(search_writer_t *writer);

/* ---- reading: uform_search_file.c --------------------------------------------------------------- */

/* An index read whole into memory and checked part by part. */
typedef struct search_index {
    unsigned char *data; /* the file's bytes */
    size_t size, dims, items;
    float const *vectors;                 /* items * dims */
    char *model;                          /* NUL-terminated copy */
    unsigned char const *modalities;      /* items */
    unsigned char const *offsets, *paths; /* items + 1 little-endian u64, and the bytes they index */
} search_index_t;

/* Reads and checks the index at `path`. Answers an exit code, after printing what is wrong. */
int search_index_read(char const *path, search_index_t *index);

/* Item i's relative path: its bytes (not NUL-terminated) and length. */
char const *search_index_path(search_index_t const *index, size_t item, size_t *length);

void search_index_free(search_index_t *index);

/* ---- text files --------------------------------------------------------------------------------- */

/* A .txt file's text: its bytes without one final "\n" or "\r\n", read no further than the `context`
 * the model reads (plus the line end), into a buffer of the caller's to free. Answers UFORM_OK, or
 * UFORM_IO or UFORM_OUT_OF_MEMORY with *why set (strerror's text, "not a regular file"). A longer text
 * gives the same vector cut there, as the model reads no further. */
uform_status_t search_read_text(char const *path, size_t context, char **text, size_t *length,
                                char const **why);

/* ---- the subcommands: uform_search_query.c ----------------------------------------------------- */

int search_query(int argc, char **argv);

#endif /* UFORM_SEARCH_H */
