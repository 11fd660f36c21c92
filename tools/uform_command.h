/* What the subcommands of the `uform` command share: exit codes, one-line errors, flag parsing, the
 * default model, and the entry point of each subcommand. Every function that prints an error answers
 * the exit code to return, so a subcommand ends with `return command_...(...)`. */
#ifndef UFORM_COMMAND_H
#define UFORM_COMMAND_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <uform.h>

enum {
    COMMAND_OK = 0,
    COMMAND_RUNTIME = 1, /* the work failed: a file, the engine, the input */
    COMMAND_USAGE = 2,   /* the command line is wrong; nothing was done */
};

/* Prints `uform: <message>` on one line of stderr and answers COMMAND_RUNTIME. */
__attribute__((format(printf, 1, 2))) int command_fail(char const *format, ...);
/* The same over a va_list. */
__attribute__((format(printf, 1, 0))) int command_vfail(char const *format, va_list arguments);

/* Prints `uform: <message> (see 'uform <command> --help')` and answers COMMAND_USAGE. */
__attribute__((format(printf, 2, 3))) int command_usage(char const *command, char const *format, ...);

/* Prints the calling thread's last engine error as the engine renders it and answers COMMAND_RUNTIME. */
int command_fail_engine(void);

/* Room for `needed` bytes in the buffer *bytes of *capacity bytes: where it is smaller, its capacity
 * doubles, from `first` when it is 0, until it holds them. Answers false where realloc fails, both left
 * as they were. */
bool command_reserve(char **bytes, size_t *capacity, size_t needed, size_t first);

/* A new string of `first`, `second` and `third` one after the other (free it); NULL when out of memory. */
char *command_join(char const *first, char const *second, char const *third);

/* A file that replaces `path` whole (uform_replace.c): written to `file`, a temporary beside it, and
 * renamed over it by replacement_commit once synced; replacement_abort removes the temporary, so a
 * failed or killed run leaves the previous file as it was. Temporaries of killed writers of the same
 * path are removed at the next open. Errors name `path` and the system's reason, printed once. */
typedef struct replacement {
    char *path, *temporary;
    FILE *file;
} replacement_t;
int replacement_open(char const *path, replacement_t *replacement);
/* Flushes, syncs, closes and renames; the replacement is released whatever the outcome. */
int replacement_commit(replacement_t *replacement);
/* Closes and removes the temporary; a released replacement is left as it is. */
void replacement_abort(replacement_t *replacement);

/* Whether argv[i] asks for help: `-h` or `--help`. */
bool command_is_help(char const *argument);

/* Parses a decimal number with no sign. Answers 0, or -1 for anything else (overflow included). */
int command_parse_u64(char const *text, uint64_t *value);

/* ---- flags: one table per command, walked by one parser (uform_flags.c) ----------------------- */

/* What a flag's value is, and so what its `target` points to. */
typedef enum command_flag_kind {
    FLAG_STRING,   /* char const *: the value as given */
    FLAG_SWITCH,   /* bool: set by the flag alone, which takes no value */
    FLAG_U64,      /* uint64_t: a decimal number in [minimum, maximum] */
    FLAG_SIZE,     /* size_t: likewise */
    FLAG_UNSIGNED, /* unsigned: likewise */
    FLAG_REAL,     /* double: a finite decimal number in [real_minimum, real_maximum] */
    FLAG_CHOICE,   /* int: the index of the value in `choices` */
    FLAG_LITERALS, /* `--` alone: every later argument is positional, whatever it looks like */
    FLAG_STRINGS,  /* command_strings_t: every value given, in order, at most `maximum` of them */
} command_flag_kind_t;

/* The values of a FLAG_STRINGS row, as given: `values` has room for the row's `maximum`. */
typedef struct command_strings {
    char const **values;
    size_t count;
} command_strings_t;

/* One row of a command's table. `value` names the value in --help ("PATH"; NULL for a switch), and
 * `help` describes it, its lines split by \n and indented to the table's column. A `maximum` of 0
 * stands for the kind's largest value; a `real_maximum` of 0 for no bound. `given`, when not NULL, is
 * set when the flag appears. `section`, when not NULL, is printed before the row in --help. `required`,
 * on a FLAG_STRING row, is the usage error said when its target is still NULL after the walk. */
typedef struct command_flag {
    char const *name;
    command_flag_kind_t kind;
    void *target;
    char const *value, *help;
    uint64_t minimum, maximum;
    double real_minimum, real_maximum;
    char const *const *choices; /* FLAG_CHOICE: the `choice_count` values it takes */
    size_t choice_count;
    bool *given;
    char const *section;
    char const *required;
} command_flag_t;

/* What a command's command line is called in usage errors ("search index"), how its --help reads (the
 * head, the table's rows with their descriptions from `column`, the tail, then the default model's
 * paragraph when `model_help`), and what takes its positional arguments. */
typedef struct command_help {
    char const *name;
    char const *head, *tail;
    int column;
    bool model_help;
    /* Takes one positional argument (one that does not start with '-', or is "-", or follows `--`,
     * marked `literal`), answering an exit code after printing its error; NULL: the command takes none. */
    int (*positional)(void *context, char const *argument, bool literal);
} command_help_t;

/* A command's whole command line: its help, its table (ended by a row whose name is NULL), the context
 * handed to its positional callback, and the usage error said when no positional argument was given
 * (`missing`; NULL: they are optional). */
typedef struct command_spec {
    command_help_t const *help;
    command_flag_t const *flags;
    void *context;
    char const *missing;
} command_spec_t;

/* Walks argv[1..argc) against the spec's table, setting each flag's target. `-h` or `--help` prints the
 * help on standard output and sets *help, ending the walk. Answers COMMAND_OK, or COMMAND_USAGE after
 * printing the usage error: an unknown flag, an unexpected argument, a missing value, a value out of
 * its kind or range (each said the same way in every command), the positional callback's code, then,
 * after the walk, a missing positional argument or required row (in table order). */
int command_flags_parse(command_spec_t const *spec, int argc, char **argv, bool *help);

/* The rows commands share, read the same in each: `--model PATH`, the checkpoint, the default model's
 * paragraph in --help saying what its absence takes; `--threads N`, the RAM executor's threads. */
command_flag_t command_flag_model(char const **model);
command_flag_t command_flag_threads(size_t *threads);
/* --weights stored|bf16|i8 into a uform_weights_t held as an int. */
command_flag_t command_flag_weights(int *weights);

/* Prints the spec's --help on `stream`. */
void command_flags_help(command_spec_t const *spec, FILE *stream);

/* A command made of tools (`uform checkpoint tiny`, `uform search index`): the tools by name, and the
 * command's own --help, followed by the default model's paragraph when `model_help`. */
typedef struct command_tool {
    char const *name;
    int (*run)(int argc, char **argv); /* argv[0] is the tool's name */
} command_tool_t;

typedef struct command_tools {
    char const *name, *help;
    bool model_help;
    command_tool_t const *tools;
    size_t count;
} command_tools_t;

/* Runs the tool argv[1] names, or prints the help for `-h` or `--help`. Answers the tool's exit code,
 * COMMAND_OK after the help, or COMMAND_USAGE after the usage error of a missing or unknown tool
 * (which names the tools). */
int command_run_tool(command_tools_t const *tools, int argc, char **argv);

/* The checkpoint a command reads: `given` when not NULL, else the default model, written on first use
 * into `buffer`. Answers COMMAND_OK with *path set, or an exit code after printing the error. */
int command_model_path(char const *given, char *buffer, size_t capacity, char const **path);

/* The snapshot folder `path` names as a hub id in the local Hugging Face cache (uform_hub_folder), into
 * `folder`, where no file or folder of that name exists, as the engine's loads read it; else NULL. */
char const *command_hub_folder(char const *path, char *folder, size_t capacity);

/* The text of the default model's paragraph in every --help. */
extern char const command_default_model_help[];

/* "text", "image", "video", "audio", by uform_modality_t. */
extern char const *const command_modality_names[4];

/* ---- the engine a command holds, and batches through it: uform_batch.c ----------------------------- */

/* A RAM executor, a model loaded on it, an arena for its outputs, and what the model is. */
typedef struct command_engine {
    uform_executor_t *executor;
    uform_model_t *model;
    uform_arena_t *arena;
    uform_model_info_t info;
} command_engine_t;

/* Loads the checkpoint at `path` on an executor of `threads` threads (0: 7/8 of the cores), with the
 * blocks' linear weights as `weights` asks (a uform_weights_t). On failure, prints the engine's error
 * and answers COMMAND_RUNTIME, having released what it made. */
int command_engine_open(char const *path, size_t threads, int weights, command_engine_t *engine);

/* Releases what command_engine_open made; a zeroed engine is ignored. */
void command_engine_close(command_engine_t *engine);

/* The matryoshka width to ask the engine for vectors `dims` wide: 0 for the model's full width, else
 * one of its matryoshka widths. Prints an error naming `what` (where the width came from: "--dims")
 * and answers COMMAND_RUNTIME when the model has no such width. */
int command_matryoshka(command_engine_t const *engine, size_t dims, char const *what, size_t *matryoshka);

/* One call of a modality's verb: the fields every verb takes, the modality choosing the verb, and the
 * tape of its items (texts as bytes; media as `source` says, which texts ignore). */
typedef struct command_encode_call {
    UFORM_ENCODE_COMMON;
    uform_modality_t modality;
    uform_tape_t tape;
    uform_source_t source;
} command_encode_call_t;

/* Runs uform_text_encode, uform_image_encode, uform_video_encode or uform_audio_encode on the call:
 * blocking, or deferred where `outcome` is set. Answers the verb's status (UFORM_INVALID_ARGUMENT for
 * an unknown modality). */
uform_status_t command_encode_verb(command_encode_call_t const *call);

/* Bounds of one engine call: enough items to keep the threads busy, and bounded memory per batch. */
enum { ENCODE_BATCH_ITEMS = 256, ENCODE_BATCH_BYTES = 1 << 20 };

/* Items of one modality end to end, texts or media paths: the tape of one engine call. */
typedef struct encode_batch {
    uform_modality_t modality;
    char *bytes;
    size_t length, capacity, count;
    size_t offsets[ENCODE_BATCH_ITEMS + 1];
} encode_batch_t;

/* Appends an item; the first item of an empty batch sets its modality, and later ones must share it.
 * Answers an exit code (out of memory). */
int encode_batch_add(encode_batch_t *batch, uform_modality_t modality, char const *bytes, size_t length);

/* Whether the batch holds as many items or bytes as one call should take. */
bool encode_batch_full(encode_batch_t const *batch);

/* Runs the verb of the batch's modality, media read from their paths, blocking, into the engine's
 * arena: the views in *encoded live until the next call. Answers the verb's status. */
uform_status_t encode_batch_run(command_engine_t *engine, uform_outputs_t outputs,
                                uform_encode_config_t const *config, encode_batch_t const *batch,
                                uform_encoded_t *encoded);

/* Empties the batch, keeping its memory; encode_batch_release frees it. */
void encode_batch_clear(encode_batch_t *batch);
void encode_batch_release(encode_batch_t *batch);

/* ---- the progress line of long work: uform_progress.c ---------------------------------------------- */

/* Drawn on stderr only when it is a terminal, at most ten times a second. */
typedef struct progress {
    char const *label, *unit; /* "encode", "items" */
    bool enabled, drawn;
    double drawn_at; /* seconds after `started` */
    size_t total;    /* 0 when unknown */
    struct timespec started;
} progress_t;

void progress_start(progress_t *progress, char const *label, char const *unit, size_t total);

/* Redraws with `done` units done; `last` draws even when the previous draw is recent. */
void progress_draw(progress_t *progress, size_t done, bool last);

/* Erases a drawn line, so that a warning printed next has a line of its own. */
void progress_clear(progress_t *progress);

/* The final count after a success; after a failure, the line ends so that the error starts its own. */
void progress_end(progress_t *progress, size_t done, bool succeeded);

/* ---- what `encode` and `search` read: uform_inputs.c --------------------------------------------- */

/* The modality of a file by its name's extension, in any case: images .jpg, .jpeg, .png; audio .wav,
 * .flac, .mp3, .ogg; video .mp4, .mkv, .avi, .webm, .mov; and UFORM_MODALITY_TEXT for .txt, a file whose
 * content is a text. Answers false for any other name. */
bool input_file_modality(char const *path, size_t length, uform_modality_t *modality);

/* One item to encode: text bytes, or the path of a media file. Valid until the next input_next. */
typedef struct input_item {
    uform_modality_t modality;
    char const *bytes;
    size_t length;
} input_item_t;

typedef struct input input_t;

/* Items from `arguments` when `count` is not 0: an argument ending in .jpg, .jpeg or .png (any case) is
 * the path of an image, any other a text, and those from index `literal_from` on (after `--`) are texts
 * whatever they end with; else from the JSONL manifest at `manifest` (`-` for standard input) when it
 * is not NULL; else one text per line of standard input. Answers an exit code. */
int input_open(char const *const *arguments, size_t count, size_t literal_from, char const *manifest,
               input_t **input);

/* The next item into *item, or *done at the end. Answers an exit code, after printing the error. */
int input_next(input_t *input, input_item_t *item, bool *done);

/* How many items the input holds when that is known before reading them (arguments, a manifest file),
 * else 0. */
size_t input_total(input_t const *input);

/* Closes and frees; NULL is ignored. */
void input_close(input_t *input);

/* ---- what `encode` writes: uform_outputs.c ------------------------------------------------------ */

typedef enum output_format {
    OUTPUT_JSONL = 0, /* {"index": i, "embedding": [...]} per line */
    OUTPUT_RAW = 1,   /* rows end to end, as the scalar lays them out (named `f32` on the command line) */
    OUTPUT_NPY = 2,   /* NumPy's .npy format 1.0, shape (rows, columns) */
} output_format_t;

typedef struct output output_t;

/* Opens `path` (NULL: standard output) for rows of `columns` scalars of `scalar`; `tokens` adds each
 * item's token vectors to JSONL rows. Answers an exit code. */
int output_open(output_format_t format, char const *path, uform_scalar_t scalar, size_t columns, bool tokens,
                output_t **output);

/* Writes the embeddings (and token vectors) of one encode, numbering its items from `first`. Answers an
 * exit code. */
int output_write(output_t *output, uform_encoded_t const *encoded, size_t first);

/* Completes the file (the .npy header, once the row count is known) when `complete`, closes it, and
 * frees `output`. A regular file (or a new one) is written beside its path and renamed over it only
 * when complete, so an incomplete or failing run leaves the previous file as it was. Answers an exit
 * code; NULL is ignored. */
int output_close(output_t *output, bool complete);

/* ---- the subcommands ---------------------------------------------------------------------------- */

int command_info(int argc, char **argv);
int command_checkpoint(int argc, char **argv);
/* uform convert IN OUT: a checkpoint or a pretrained folder as one self-contained checkpoint. */
int command_convert(int argc, char **argv);
/* `uform checkpoint tiny`, argv[0] being "tiny"; also the whole of the uform_tiny_checkpoint tool. */
int command_checkpoint_tiny(int argc, char **argv);
int command_encode(int argc, char **argv);
int command_tokenize(int argc, char **argv);
int command_serve(int argc, char **argv);
int command_search(int argc, char **argv);

#endif /* UFORM_COMMAND_H */
