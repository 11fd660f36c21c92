/* What `uform train` and `uform eval` share: the JSON Lines manifests `uform dataset synth` writes,
 * one item a line,
 *
 *   {"modality": "text", "text": "...", "groups": ["img-000123"]}
 *   {"modality": "image" | "video" | "audio", "path": "media/img-000123.png", "groups": ["img-000123"]}
 *
 * read whole into memory (texts and paths, not the media files), with media paths taken relative to
 * the manifest's folder; items sharing a group are related. Internal to the `uform` command; every
 * function that prints an error answers the exit code to return, as in uform_command.h. */
#ifndef UFORM_MANIFEST_H
#define UFORM_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>

#include "uform_command.h"

typedef struct manifest_item {
    uform_modality_t modality;
    char *bytes;         /* the text, or the media file's path resolved against the manifest's folder */
    size_t length;       /* bytes, without the NUL that ends them */
    size_t line;         /* 1-based, for errors */
    size_t groups_first; /* the item's groups: manifest.item_groups[groups_first .. + groups_count] */
    size_t groups_count; /* at least 1; ascending group indices without repeats */
} manifest_item_t;

typedef struct manifest {
    char const *path;
    manifest_item_t *items;
    size_t count;
    size_t *item_groups;   /* every item's group indices, end to end */
    size_t groups_count;   /* distinct group names */
    size_t *group_offsets; /* groups_count + 1: group g holds group_items[group_offsets[g] .. [g + 1]) */
    size_t *group_items;   /* item indices, ascending within a group */
    size_t modality_counts[4];
} manifest_t;

/* Reads the manifest at `path` (kept, not copied), checking every line: valid JSON, an object, a known
 * "modality", a string "text" or "path", a non-empty array of string "groups", and each media path a
 * regular file. An error names the manifest, the line and the reason. Blank lines are skipped; a
 * manifest without items is an error. Answers an exit code; on failure *manifest holds nothing. */
int manifest_read(char const *path, manifest_t *manifest);

/* Releases what manifest_read made; a zeroed manifest is ignored. */
void manifest_free(manifest_t *manifest);

/* Whether items `a` and `b` share a group. */
bool manifest_related(manifest_t const *manifest, size_t a, size_t b);

/* The whole file at `path` appended to *bytes (grown with realloc; *length and *capacity updated).
 * Prints nothing: answers 0, or the errno value of the failure (ENOMEM, EIO for a file that shrank). */
int manifest_read_file(char const *path, char **bytes, size_t *length, size_t *capacity);

/* The subcommands. */
int command_train(int argc, char **argv);
int command_eval(int argc, char **argv);

#endif /* UFORM_MANIFEST_H */
