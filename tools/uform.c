/* uform <command> [options]: the shell's way into the engine. This file only dispatches; each
 * subcommand lives in its own uform_<command>.c. */
#include <stdio.h>
#include <string.h>

#include "uform_command.h"
#include "uform_dataset.h"
#include "uform_manifest.h"

typedef struct command {
    char const *name;
    int (*run)(int argc, char **argv);
    char const *summary;
} command_t;

static command_t const commands[] = {
    {"encode", command_encode, "embed texts from arguments, standard input or a JSONL manifest"},
    {"tokenize", command_tokenize, "token ids and byte spans of texts, as a model's tokenizer.json cuts them"},
    {"info", command_info, "describe a checkpoint or a pretrained folder: family, towers, sizes, settings"},
    {"convert", command_convert, "write a pretrained folder (or a checkpoint) as one self-contained checkpoint"},
    {"checkpoint", command_checkpoint, "checkpoint tools: 'checkpoint tiny' writes a small seeded model"},
    {"search", command_search, "index a folder of media into a file, then query it by a text or a file"},
    {"serve", command_serve, "an OpenAI-compatible embedding server over HTTP"},
    {"dataset", command_dataset, "dataset tools: 'dataset synth' writes a seeded synthetic dataset"},
    {"train", command_train, "train a model on a JSONL manifest of related texts and media"},
    {"eval", command_eval, "text-to-media recall@1 and recall@5 of a model on a JSONL manifest"},
};

static void print_help(FILE *stream) {
    int major = 0, minor = 0, patch = 0;
    uform_version(&major, &minor, &patch);
    fprintf(stream,
            "usage: uform <command> [options]\n"
            "\n"
            "UForm %d.%d.%d maps texts, images, video clips and sounds into one embedding space.\n"
            "\n"
            "commands:\n",
            major, minor, patch);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i)
        fprintf(stream, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(stream,
            "\n"
            "'uform <command> --help' describes a command. Errors are one line on stderr; the exit status\n"
            "is 0 on success, 1 when the work failed and 2 for a wrong command line.\n"
            "\n"
            "%s",
            command_default_model_help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_help(stderr);
        return COMMAND_USAGE;
    }
    if (command_is_help(argv[1]) || !strcmp(argv[1], "help")) {
        print_help(stdout);
        return COMMAND_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        int major = 0, minor = 0, patch = 0;
        uform_version(&major, &minor, &patch);
        printf("uform %d.%d.%d\n", major, minor, patch);
        return COMMAND_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        /* Each subcommand sees itself as argv[0]. */
        return commands[i].run(argc - 1, argv + 1);
    }
    return command_usage(NULL, "unknown command '%s'", argv[1]);
}
