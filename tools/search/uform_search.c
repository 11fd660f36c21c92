/* uform search: `search index` embeds the media of a folder into an index file; `search query` (in
 * uform_search_query.c) ranks them against a text or a file. Files that fail are reported and left out:
 * one bad photo never costs the index. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "uform_search.h"

static char const help[] =
    "usage: uform search index FOLDER --output INDEX [options]\n"
    "       uform search query INDEX (TEXT | --file PATH) [options]\n"
    "\n"
    "Embeds the images, sounds, clips and text files of a folder into an index file, then ranks them\n"
    "against a text or a file by cosine similarity. 'uform search index --help' and 'uform search query\n"
    "--help' describe each.\n"
    "\n";

static char const index_help_head[] =
    "usage: uform search index FOLDER --output INDEX [options]\n"
    "\n"
    "Embeds every file of FOLDER that it knows by its extension, in any case:\n"
    "  images .jpg .jpeg .png; audio .wav .flac .mp3 .ogg; video .mp4 .mkv .avi .webm .mov;\n"
    "  texts .txt (the file's content without one final line end; the model reads at most its context)\n"
    "and writes their unit vectors, modalities and paths (relative to FOLDER) to INDEX. Other files, and\n"
    "names starting with '.', are passed over. Files go in byte order of their paths, in batches per\n"
    "modality as 'uform encode' makes them. A file that cannot be read or encoded is reported on one\n"
    "line of stderr with its status (io, format, unsupported, ...) and left out; the run goes on and\n"
    "ends with a count of the files indexed and skipped. INDEX is written to a temporary file beside it,\n"
    "synced and renamed into place: it is always a whole index, the old one or the new one; the\n"
    "temporary a killed run leaves (INDEX.tmp-XXXXXX) is removed by the next index of the same path.\n"
    "\n";

static char const index_help_tail[] =
    "\n"
    "The index file (version 1, little-endian): a 64-byte header (\"UFORMIDX\", u32 version, u32 dims,\n"
    "u64 items, u64 model path bytes, u64 paths bytes, 24 zero bytes); the items' F32 vectors, row-major;\n"
    "the model's path; one modality byte per item (0 text, 1 image, 2 video, 3 audio); items + 1 u64\n"
    "offsets into the paths; the paths. NumPy reads the vectors as\n"
    "np.frombuffer(data, '<f4', items * dims, 64).reshape(items, dims).\n"
    "\n"
    "A progress line is drawn on stderr when stderr is a terminal. Errors are one line on stderr:\n"
    "exit status 1 when the work failed, 2 for a wrong command line.\n"
    "\n";

typedef struct index_flags {
    char const *folder, *output, *model;
    size_t threads, dims;
    int weights; /* a uform_weights_t */
    bool recursive, help;
} index_flags_t;

/* A file the walk found: its path as the verbs open it, FOLDER/relative. */
typedef struct found {
    char *path;
    uform_modality_t modality;
} found_t;

typedef struct walk {
    found_t *found;
    size_t count, capacity;
    size_t relative; /* where the relative path starts in every found path */
    bool recursive;
} walk_t;

/* The items waiting for a call, per modality, and which found files they are. */
typedef struct bucket {
    encode_batch_t batch;
    size_t found[ENCODE_BATCH_ITEMS];
} bucket_t;

typedef struct indexer {
    command_engine_t engine;
    uform_encode_config_t config;
    search_writer_t *writer;
    walk_t walk;
    bucket_t buckets[4]; /* by uform_modality_t */
    size_t indexed, skipped;
    progress_t progress;
} indexer_t;

/* ---- flags ------------------------------------------------------------------------------------ */

/* The one positional argument: FOLDER. */
static int take_folder(void *context, char const *argument, bool literal) {
    (void)literal;
    index_flags_t *flags = context;
    if (flags->folder) return command_usage("search index", "one FOLDER at a time, not also '%s'", argument);
    flags->folder = argument;
    return COMMAND_OK;
}

static command_help_t const index_help = {.name = "search index",
                                          .head = index_help_head,
                                          .tail = index_help_tail,
                                          .column = 21,
                                          .model_help = true,
                                          .positional = take_folder};

static int parse_index_flags(int argc, char **argv, index_flags_t *flags) {
    command_flag_t const table[] = {
        {"--output", FLAG_STRING, &flags->output, .value = "INDEX", .help = "the index to write (required)",
         .required = "--output INDEX is required"},
        {"--model", FLAG_STRING, &flags->model, .value = "PATH",
         .help = "the checkpoint; default: the default model (below). The index records its\n"
                 "absolute path for 'search query'"},
        command_flag_threads(&flags->threads),
        command_flag_weights(&flags->weights),
        {"--dims", FLAG_SIZE, &flags->dims, .value = "N", .minimum = 1,
         .help = "a matryoshka width of the model (see 'uform info'); default: its full width"},
        {"--recursive", FLAG_SWITCH, &flags->recursive,
         .help = "the subfolders too (symbolic links to folders are not followed)"},
        {NULL},
    };
    command_spec_t const spec = {
        .help = &index_help, .flags = table, .context = flags, .missing = "which FOLDER?"};
    return command_flags_parse(&spec, argc, argv, &flags->help);
}

/* ---- the walk --------------------------------------------------------------------------------- */

static void warn(indexer_t *indexer, char const *format, ...) __attribute__((format(printf, 2, 3)));

/* A warning on a line of its own, under the progress line, which the next draw puts back. */
static void warn(indexer_t *indexer, char const *format, ...) {
    progress_clear(&indexer->progress);
    va_list arguments;
    va_start(arguments, format);
    fputs("uform: warning: ", stderr);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    va_end(arguments);
}

static int walk_add(walk_t *walk, char *path, uform_modality_t modality) {
    if (walk->count == walk->capacity) {
        size_t capacity = walk->capacity ? 2 * walk->capacity : 256;
        found_t *grown = realloc(walk->found, capacity * sizeof *grown);
        if (!grown) {
            free(path);
            return command_fail("out of memory for %zu files", capacity);
        }
        walk->found = grown;
        walk->capacity = capacity;
    }
    walk->found[walk->count++] = (found_t){path, modality};
    return COMMAND_OK;
}

/* The files of `folder` the index takes, and those of its subfolders when recursive. A subfolder that
 * cannot be read is reported and passed over; the top one is an error. */
static int walk_folder(indexer_t *indexer, char const *folder, bool top) {
    walk_t *walk = &indexer->walk;
    DIR *directory = opendir(folder);
    if (!directory) {
        if (top) return command_fail("cannot open %s: %s", folder, strerror(errno));
        warn(indexer, "skipping the folder '%s': %s", folder + walk->relative, strerror(errno));
        return COMMAND_OK;
    }
    int code = COMMAND_OK;
    size_t length = strlen(folder);
    bool slash = length && folder[length - 1] == '/';
    for (;;) {
        errno = 0;
        struct dirent *entry = readdir(directory);
        if (!entry) {
            if (errno && top)
                code = command_fail("cannot read %s: %s", folder, strerror(errno));
            else if (errno)
                warn(indexer, "skipping the rest of '%s': %s", folder + walk->relative, strerror(errno));
            break;
        }
        char const *name = entry->d_name;
        if (name[0] == '.') continue; /* hidden, and "." and ".." */
        struct stat status;
        if (fstatat(dirfd(directory), name, &status, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone meanwhile */
        uform_modality_t modality = UFORM_MODALITY_TEXT;
        bool folder_entry = S_ISDIR(status.st_mode);
        if (folder_entry ? !walk->recursive : !input_file_modality(name, strlen(name), &modality)) continue;
        char *path = command_join(folder, slash ? "" : "/", name);
        if (!path) {
            code = command_fail("out of memory");
            break;
        }
        if (folder_entry) {
            code = walk_folder(indexer, path, false);
            free(path);
        } else {
            code = walk_add(walk, path, modality);
        }
        if (code != COMMAND_OK) break;
    }
    closedir(directory);
    return code;
}

static int compare_found(void const *a, void const *b) {
    return strcmp(((found_t const *)a)->path, ((found_t const *)b)->path);
}

/* ---- encoding --------------------------------------------------------------------------------- */

static char const *relative_path(indexer_t const *indexer, size_t found) {
    return indexer->walk.found[found].path + indexer->walk.relative;
}

/* Encodes a bucket and adds what succeeded to the index. A verb that is not built (UNSUPPORTED for
 * the whole call) skips its files like any other failure; other failures of a call end the run. */
static int bucket_flush(indexer_t *indexer, bucket_t *bucket) {
    encode_batch_t *batch = &bucket->batch;
    uform_encoded_t encoded;
    uform_status_t status =
        encode_batch_run(&indexer->engine, UFORM_OUTPUT_EMBEDDINGS, &indexer->config, batch, &encoded);
    if (status != UFORM_OK && status != UFORM_UNSUPPORTED) return command_fail_engine();
    uform_error_t error = uform_last_error();
    for (size_t item = 0; item < batch->count; ++item) {
        size_t found = bucket->found[item];
        char const *modality = command_modality_names[batch->modality];
        if (status != UFORM_OK) {
            warn(indexer, "skipping '%s' (%s): %s [%s]: %s", relative_path(indexer, found), modality,
                 uform_status_name(error.status), error.entry, error.message);
            ++indexer->skipped;
            continue;
        }
        if (encoded.statuses[item] != UFORM_OK) {
            warn(indexer, "skipping '%s' (%s): %s", relative_path(indexer, found), modality,
                 uform_status_name(encoded.statuses[item]));
            ++indexer->skipped;
            continue;
        }
        void const *row = NULL;
        if (uform_view_row(&encoded.embeddings, item, &row) != UFORM_OK) return command_fail_engine();
        char const *path = relative_path(indexer, found);
        int code = search_writer_add(indexer->writer, batch->modality, path, strlen(path), row);
        if (code != COMMAND_OK) return code;
        ++indexer->indexed;
    }
    encode_batch_clear(batch);
    progress_draw(&indexer->progress, indexer->indexed + indexer->skipped, false);
    return COMMAND_OK;
}

/* Media go to their verb as paths; a text file goes as its text. */
static int index_found(indexer_t *indexer, size_t found) {
    found_t const *file = &indexer->walk.found[found];
    bucket_t *bucket = &indexer->buckets[file->modality];
    int code = COMMAND_OK;
    if (file->modality == UFORM_MODALITY_TEXT) {
        char *text = NULL;
        size_t length = 0;
        char const *why = NULL;
        uform_status_t status =
            search_read_text(file->path, indexer->engine.info.text.context, &text, &length, &why);
        if (status != UFORM_OK) {
            warn(indexer, "skipping '%s' (text): %s (%s)", relative_path(indexer, found),
                 uform_status_name(status), why);
            ++indexer->skipped;
            return COMMAND_OK;
        }
        code = encode_batch_add(&bucket->batch, file->modality, text, length);
        free(text);
    } else {
        code = encode_batch_add(&bucket->batch, file->modality, file->path, strlen(file->path));
    }
    if (code != COMMAND_OK) return code;
    bucket->found[bucket->batch.count - 1] = found;
    return encode_batch_full(&bucket->batch) ? bucket_flush(indexer, bucket) : COMMAND_OK;
}

static int index_all(indexer_t *indexer) {
    for (size_t found = 0; found < indexer->walk.count; ++found) {
        int code = index_found(indexer, found);
        if (code != COMMAND_OK) return code;
    }
    for (size_t modality = 0; modality < 4; ++modality) {
        bucket_t *bucket = &indexer->buckets[modality];
        int code = bucket->batch.count ? bucket_flush(indexer, bucket) : COMMAND_OK;
        if (code != COMMAND_OK) return code;
    }
    return COMMAND_OK;
}

/* ---- the commands ----------------------------------------------------------------------------- */

static int search_index(int argc, char **argv) {
    index_flags_t flags = {0};
    indexer_t *indexer = calloc(1, sizeof *indexer);
    char buffer[4096], *model = NULL;
    char const *path = NULL;
    int code = COMMAND_OK;
    if (!indexer) return command_fail("out of memory");
    if ((code = parse_index_flags(argc, argv, &flags)) != COMMAND_OK || flags.help) goto done;

    /* Every file is found before the model loads: a wrong FOLDER costs nothing. */
    size_t length = strlen(flags.folder);
    indexer->walk.relative = length + (length && flags.folder[length - 1] != '/');
    indexer->walk.recursive = flags.recursive;
    if ((code = walk_folder(indexer, flags.folder, true)) != COMMAND_OK) goto done;
    if (indexer->walk.count) qsort(indexer->walk.found, indexer->walk.count, sizeof(found_t), compare_found);

    if ((code = command_model_path(flags.model, buffer, sizeof buffer, &path)) != COMMAND_OK) goto done;
    if ((code = command_engine_open(path, flags.threads, flags.weights, &indexer->engine)) != COMMAND_OK)
        goto done;
    size_t dims = flags.dims ? flags.dims : indexer->engine.info.dims;
    indexer->config = (uform_encode_config_t){.outputs_scalar = UFORM_F32};
    if ((code = command_matryoshka(&indexer->engine, dims, "--dims", &indexer->config.matryoshka)) !=
        COMMAND_OK)
        goto done;
    /* The index names its model absolutely, so that it can be queried from anywhere. */
    if (!(model = realpath(path, NULL))) {
        code = command_fail("cannot resolve %s: %s", path, strerror(errno));
        goto done;
    }
    if ((code = search_writer_open(flags.output, model, dims, &indexer->writer)) != COMMAND_OK) goto done;

    progress_start(&indexer->progress, "index", "files", indexer->walk.count);
    code = index_all(indexer);
    progress_end(&indexer->progress, indexer->indexed + indexer->skipped, code == COMMAND_OK);
    if (code == COMMAND_OK) {
        search_writer_t *writer = indexer->writer;
        indexer->writer = NULL; /* commit frees it, whatever it answers */
        code = search_writer_commit(writer);
    }
    if (code == COMMAND_OK)
        fprintf(stderr, "uform search: indexed %zu of %zu files into %s (%zu dims); %zu skipped\n",
                indexer->indexed, indexer->walk.count, flags.output, dims, indexer->skipped);

done:
    search_writer_abort(indexer->writer);
    command_engine_close(&indexer->engine);
    for (size_t modality = 0; modality < 4; ++modality)
        encode_batch_release(&indexer->buckets[modality].batch);
    for (size_t found = 0; found < indexer->walk.count; ++found)
        free(indexer->walk.found[found].path);
    free(indexer->walk.found);
    free(indexer);
    free(model);
    return code;
}

int command_search(int argc, char **argv) {
    static command_tool_t const tools[] = {{"index", search_index}, {"query", search_query}};
    static command_tools_t const search = {
        .name = "search", .help = help, .model_help = true, .tools = tools, .count = 2};
    return command_run_tool(&search, argc, argv);
}
