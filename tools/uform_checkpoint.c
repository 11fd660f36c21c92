/* uform checkpoint tiny PATH [...]: checkpoint tools. One for now: the tiny seeded writer, the same as
 * the uform_tiny_checkpoint tool. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "uform_command.h"

static char const help[] = "usage: uform checkpoint <tool> [options]\n"
                           "\n"
                           "tools:\n"
                           "  tiny PATH   write a small, seeded, valid checkpoint with every tower\n"
                           "\n"
                           "'uform checkpoint <tool> --help' describes a tool.\n";

static char const tiny_help[] =
    "usage: uform checkpoint tiny PATH [--seed N] [--depth N] [--hidden N] [--mlp N] [--context N]\n                        [--image-size N] [--image-patch N]\n"
    "\n"
    "Writes a small, seeded, fully valid format-4 checkpoint with every tower (text, image, video,\n"
    "audio) and the logit parameters, atomically (a temporary file, then a rename). The same seed\n"
    "writes the same bytes. Its weights are random: for tests and for trying the commands.\n"
    "\n"
    "  --seed N     the seed (default 42, as the default model)\n"
    "  --depth N    layers of every tower (default 2)\n"
    "  --hidden N   hidden width of every tower, a multiple of 64 (default 64)\n"
    "  --mlp N      MLP width of every tower (default 2 * hidden)\n"
    "  --context N  the text tower's context, in bytes (default 64)\n"
    "  --image-size N   the image tower's input side, in pixels (default 32)\n"
    "  --image-patch N  the image tower's patch side, dividing --image-size (default 8)\n";

static int checkpoint_tiny(int argc, char **argv) {
    static char const command[] = "checkpoint tiny";
    static char const *const names[] = {"--seed", "--depth", "--hidden", "--mlp", "--context", "--image-size",
                                        "--image-patch"};
    uform_tiny_checkpoint_args_t args = {.seed = 42};
    for (int i = 1; i < argc; ++i) {
        if (command_is_help(argv[i])) {
            fputs(tiny_help, stdout);
            return COMMAND_OK;
        }
        size_t name = 0, names_count = sizeof names / sizeof names[0];
        char const *value = NULL;
        int matched = 0;
        while (name < names_count &&
               (matched = command_option(argc, argv, &i, command, names[name], &value)) == 0)
            ++name;
        if (matched < 0) return COMMAND_USAGE;
        if (matched) {
            uint64_t number = 0;
            if (command_parse_u64(value, &number) != 0 || number > SIZE_MAX)
                return command_usage(command, "%s takes a number, not '%s'", names[name], value);
            size_t *sizes[] = {NULL,          &args.depth,      &args.hidden,     &args.mlp,
                               &args.context, &args.image_size, &args.image_patch}; /* as names */
            if (name == 0)
                args.seed = number;
            else
                *sizes[name] = (size_t)number;
        } else if (argv[i][0] == '-' || args.path) {
            return command_usage(command, "unexpected argument '%s'", argv[i]);
        } else {
            args.path = argv[i];
        }
    }
    if (!args.path) return command_usage(command, "the checkpoint's PATH is missing");
    if (uform_tiny_checkpoint(&args) != UFORM_OK) return command_fail_engine();
    printf("wrote %s (seed %" PRIu64 ")\n", args.path, args.seed);
    return COMMAND_OK;
}

int command_checkpoint(int argc, char **argv) {
    if (argc < 2) return command_usage("checkpoint", "a tool is missing");
    if (command_is_help(argv[1])) {
        fputs(help, stdout);
        return COMMAND_OK;
    }
    if (!strcmp(argv[1], "tiny")) return checkpoint_tiny(argc - 1, argv + 1);
    return command_usage("checkpoint", "unknown tool '%s'", argv[1]);
}
