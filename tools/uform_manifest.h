/* What `uform train` and `uform eval` share: the JSON Lines manifests `uform dataset synth` writes,
 * one item a line,
 *
 *   {"modality": "text", "text": "...", "groups": ["img-000123"]}
 *   {"modality": "image" | "video" | "audio", "path": "media/img-000123.png", "groups": ["img-000123"]}
 *
 * read whole into memory (texts and paths, not the media files), with media paths taken relative to
 * the manifest's folder; items sharing a group are related. Items of the same modality with the same
 * bytes (one caption written for two pictures drawn alike, one file listed twice) are the same item:
 * manifest_alike relates them, and each to whatever the other is related to. Internal to the `uform`
 * command; every function that prints an error answers the exit code to return, as in uform_command.h. */
#ifndef UFORM_MANIFEST_H
#define UFORM_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uform_command.h"

typedef struct manifest_item {
    uform_modality_t modality;
    char *bytes;         /* the text, or the media file's path resolved against the manifest's folder */
    size_t length;       /* bytes, without the NUL that ends them */
    size_t line;         /* 1-based, for errors */
    size_t groups_first; /* the item's groups: manifest.item_groups[groups_first .. + groups_count] */
    size_t groups_count; /* at least 1; ascending group indices without repeats */
    size_t alike_first;  /* the groups of every item of this modality and these bytes, this one's too: */
    size_t alike_count;  /* manifest.alike_groups[alike_first .. + alike_count], ascending, no repeats */
} manifest_item_t;

typedef struct manifest {
    char const *path;
    manifest_item_t *items;
    size_t count;
    size_t *item_groups;   /* every item's group indices, end to end */
    size_t groups_count;   /* distinct group names */
    char **group_names;    /* groups_count: group g's name, as the manifest spells it */
    size_t *group_offsets; /* groups_count + 1: group g holds group_items[group_offsets[g] .. [g + 1]) */
    size_t *group_items;   /* item indices, ascending within a group */
    size_t *alike_groups;  /* every item's alike groups, end to end */
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

/* Whether items `a` and `b` share a group once identical items count as one: some item with a's
 * modality and bytes shares a group with some item with b's. Implies nothing less than
 * manifest_related: related items are alike. */
bool manifest_alike(manifest_t const *manifest, size_t a, size_t b);

/* The `k` groups nearest each group, by the words of their texts (Jaccard similarity of the sets of
 * words, runs of letters and digits, case folded; exact for the first 512 distinct words of the
 * manifest, words past them share those sets' bits), among the groups that hold the same modalities
 * and share a word with it; ties are ordered by a hash of `seed` and the two groups. Manifests of more
 * than 8192 groups compare each group with 8192 others drawn with `seed`. Writes groups_count x k group
 * indices to *neighbours (malloc'ed, row g for group g, nearest first; SIZE_MAX where fewer than k
 * groups qualify). */
int manifest_neighbours(manifest_t const *manifest, size_t k, uint64_t seed, size_t **neighbours);

/* The whole file at `path` appended to *bytes (grown with realloc; *length and *capacity updated).
 * Prints nothing: answers 0, or the errno value of the failure (ENOMEM, EIO for a file that shrank). */
int manifest_read_file(char const *path, char **bytes, size_t *length, size_t *capacity);

/* The subcommands. */
int command_train(int argc, char **argv);
int command_eval(int argc, char **argv);

#endif /* UFORM_MANIFEST_H */
