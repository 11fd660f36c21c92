/* What the subcommands of the `uform` command share: exit codes, one-line errors, flag parsing, the
 * default model, and the entry point of each subcommand. Every function that prints an error answers
 * the exit code to return, so a subcommand ends with `return command_...(...)`. */
#ifndef UFORM_COMMAND_H
#define UFORM_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uform.h>

enum {
    COMMAND_OK = 0,
    COMMAND_RUNTIME = 1, /* the work failed: a file, the engine, the input */
    COMMAND_USAGE = 2,   /* the command line is wrong; nothing was done */
};

/* Prints `uform: <message>` on one line of stderr and answers COMMAND_RUNTIME. */
__attribute__((format(printf, 1, 2))) int command_fail(char const *format, ...);

/* Prints `uform: <message> (see 'uform <command> --help')` and answers COMMAND_USAGE. */
__attribute__((format(printf, 2, 3))) int command_usage(char const *command, char const *format, ...);

/* Prints the calling thread's last engine error as the engine renders it and answers COMMAND_RUNTIME. */
int command_fail_engine(void);

/* Whether argv[i] asks for help: `-h` or `--help`. */
bool command_is_help(char const *argument);

/* Matches `--name VALUE` or `--name=VALUE` at argv[*i]. Answers 1 and sets *value (advancing *i past a
 * separate value) on a match, 0 when argv[*i] is something else, and -1 when the value is missing,
 * after printing the usage error. */
int command_option(int argc, char **argv, int *i, char const *command, char const *name, char const **value);

/* Parses a decimal number with no sign. Answers 0, or -1 for anything else (overflow included). */
int command_parse_u64(char const *text, uint64_t *value);
int command_parse_size(char const *text, size_t *value);

/* The checkpoint a command reads: `given` when not NULL, else the default model, written on first use
 * into `buffer`. Answers COMMAND_OK with *path set, or an exit code after printing the error. */
int command_model_path(char const *given, char *buffer, size_t capacity, char const **path);

/* The text of the default model's paragraph in every --help. */
extern char const command_default_model_help[];

/* ---- what `encode` reads: uform_inputs.c -------------------------------------------------------- */

/* One item to encode: text bytes, or the path of a media file. Valid until the next input_next. */
typedef struct input_item {
    uform_modality_t modality;
    char const *bytes;
    size_t length;
} input_item_t;

typedef struct input input_t;

/* Items from `texts` when `count` is not 0; else from the JSONL manifest at `manifest` (`-` for standard
 * input) when it is not NULL; else one text per line of standard input. Answers an exit code. */
int input_open(char **texts, size_t count, char const *manifest, input_t **input);

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
 * frees `output`. A regular file it opened is removed when incomplete or failing, so a file left
 * behind is whole. Answers an exit code; NULL is ignored. */
int output_close(output_t *output, bool complete);

/* ---- the subcommands ---------------------------------------------------------------------------- */

int command_info(int argc, char **argv);
int command_checkpoint(int argc, char **argv);
int command_encode(int argc, char **argv);

#endif /* UFORM_COMMAND_H */
