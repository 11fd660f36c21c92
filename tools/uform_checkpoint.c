/* uform checkpoint tiny PATH [...] and uform checkpoint quantize IN OUT: the checkpoint tools, the tiny
 * seeded writer (which the uform_tiny_checkpoint tool runs too) and the writer of I8 weights. */
#include <inttypes.h>
#include <stdio.h>

#include "uform_command.h"

static char const help[] = "usage: uform checkpoint <tool> [options]\n"
                           "\n"
                           "tools:\n"
                           "  tiny PATH          write a small, seeded, valid checkpoint with every tower\n"
                           "  quantize IN OUT    write IN again with I8 weights\n"
                           "\n"
                           "'uform checkpoint <tool> --help' describes a tool.\n";

static char const tiny_help_head[] =
    "usage: uform checkpoint tiny PATH [--seed N] [--depth N] [--hidden N] [--mlp N] [--context N]\n"
    "                        [--image-size N] [--image-patch N]\n"
    "\n"
    "Writes a small, seeded, fully valid format-4 checkpoint with every tower (text, image, video,\n"
    "audio) and the logit parameters, atomically (a temporary file, then a rename). The same seed\n"
    "writes the same bytes. Its weights are random: for tests and for trying the commands.\n"
    "\n";

/* The one positional argument: the checkpoint's path. */
static int take_path(void *context, char const *argument, bool literal) {
    (void)literal;
    char const **path = context;
    if (*path || argument[0] == '-')
        return command_usage("checkpoint tiny", "unexpected argument '%s'", argument);
    *path = argument;
    return COMMAND_OK;
}

static command_help_t const tiny_help = {
    .name = "checkpoint tiny", .head = tiny_help_head, .column = 19, .positional = take_path};

int command_checkpoint_tiny(int argc, char **argv) {
    uform_tiny_checkpoint_args_t args = {.seed = 42};
    bool help_shown = false;
    command_flag_t const flags[] = {
        {"--seed", FLAG_U64, &args.seed, .value = "N", .help = "the seed (default 42, as the default model)"},
        {"--depth", FLAG_SIZE, &args.depth, .value = "N", .help = "layers of every tower (default 2)"},
        {"--hidden", FLAG_SIZE, &args.hidden, .value = "N",
         .help = "hidden width of every tower, a multiple of 64 (default 64)"},
        {"--mlp", FLAG_SIZE, &args.mlp, .value = "N",
         .help = "MLP width of every tower (default 2 * hidden)"},
        {"--context", FLAG_SIZE, &args.context, .value = "N",
         .help = "the text tower's context, in bytes (default 64)"},
        {"--image-size", FLAG_SIZE, &args.image_size, .value = "N",
         .help = "the image tower's input side, in pixels (default 32)"},
        {"--image-patch", FLAG_SIZE, &args.image_patch, .value = "N",
         .help = "the image tower's patch side, dividing --image-size (default 8)"},
        {NULL},
    };
    command_spec_t const spec = {.help = &tiny_help,
                                 .flags = flags,
                                 .context = &args.path,
                                 .missing = "the checkpoint's PATH is missing"};
    int code = command_flags_parse(&spec, argc, argv, &help_shown);
    if (code != COMMAND_OK || help_shown) return code;
    if (uform_tiny_checkpoint(&args) != UFORM_OK) return command_fail_engine();
    printf("wrote %s (seed %" PRIu64 ")\n", args.path, args.seed);
    return COMMAND_OK;
}

static char const quantize_help_head[] =
    "usage: uform checkpoint quantize IN OUT\n"
    "\n"
    "Writes the checkpoint IN again as OUT with I8 weights: the linear layers of every transformer block\n"
    "(attn.qkv, attn.out, mlp.up, mlp.down) of at most 65536 inputs, quantized per output row to int8\n"
    "with an F32 scale each (docs/DESIGN.md), the same bytes a load with --weights i8 makes; every\n"
    "other tensor as it is. OUT is about half the size and loads as I8 (--weights stored, the default;\n"
    "--weights bf16 widens it back). OUT is written atomically (a temporary file, then a rename) and\n"
    "may be IN.\n"
    "\n";

/* The two positional arguments, IN then OUT. */
static int take_paths(void *context, char const *argument, bool literal) {
    (void)literal;
    uform_checkpoint_quantize_args_t *args = context;
    if (argument[0] == '-' || args->output)
        return command_usage("checkpoint quantize", "unexpected argument '%s'", argument);
    *(args->input ? &args->output : &args->input) = argument;
    return COMMAND_OK;
}

static command_help_t const quantize_help = {
    .name = "checkpoint quantize", .head = quantize_help_head, .column = 19, .positional = take_paths};

static int command_checkpoint_quantize(int argc, char **argv) {
    uform_checkpoint_quantize_args_t args = {0};
    bool help_shown = false;
    command_flag_t const flags[] = {{NULL}};
    command_spec_t const spec = {
        .help = &quantize_help, .flags = flags, .context = &args, .missing = "IN and OUT are missing"};
    int code = command_flags_parse(&spec, argc, argv, &help_shown);
    if (code != COMMAND_OK || help_shown) return code;
    if (!args.output) return command_usage("checkpoint quantize", "OUT is missing");
    if (uform_checkpoint_quantize(&args) != UFORM_OK) return command_fail_engine();
    printf("wrote %s (I8 weights)\n", args.output);
    return COMMAND_OK;
}

static char const convert_help_head[] =
    "usage: uform convert IN OUT [--weights stored|i8]\n"
    "\n"
    "Writes the model IN, a checkpoint or a pretrained model's folder (see 'uform info'), as one\n"
    "self-contained checkpoint OUT: its weights in BF16 in the engine's format (docs/DESIGN.md), its\n"
    "block's settings and its tokenizer in the metadata. OUT loads to the same embeddings, bit for bit,\n"
    "and faster than the folder (no conversion). OUT is written atomically and may be IN.\n"
    "\n";

typedef struct convert_flags {
    uform_checkpoint_convert_args_t args;
    int weights;
} convert_flags_t;

static int take_convert_paths(void *context, char const *argument, bool literal) {
    (void)literal;
    uform_checkpoint_convert_args_t *args = &((convert_flags_t *)context)->args;
    if (argument[0] == '-' || args->output)
        return command_usage("convert", "unexpected argument '%s'", argument);
    *(args->input ? &args->output : &args->input) = argument;
    return COMMAND_OK;
}

static command_help_t const convert_help = {
    .name = "convert", .head = convert_help_head, .column = 19, .positional = take_convert_paths};

int command_convert(int argc, char **argv) {
    static char const *const kinds[] = {"stored", "bf16", "i8"}; /* by uform_weights_t */
    convert_flags_t flags = {0};
    bool help_shown = false;
    command_flag_t const options[] = {
        {"--weights", FLAG_CHOICE, &flags.weights, .value = "KIND", .choices = kinds, .choice_count = 3,
         .help = "stored (the default: as the model loads, a folder's in BF16) or i8 (the\n"
                 "blocks' linear layers quantized, as 'uform checkpoint quantize' writes them)"},
        {NULL},
    };
    command_spec_t const spec = {
        .help = &convert_help, .flags = options, .context = &flags, .missing = "IN and OUT are missing"};
    int code = command_flags_parse(&spec, argc, argv, &help_shown);
    if (code != COMMAND_OK || help_shown) return code;
    if (!flags.args.output) return command_usage("convert", "OUT is missing");
    if (flags.weights == UFORM_WEIGHTS_BF16) return command_usage("convert", "--weights takes stored or i8");
    flags.args.weights = (uform_weights_t)flags.weights;
    if (uform_checkpoint_convert(&flags.args) != UFORM_OK) return command_fail_engine();
    printf("wrote %s%s\n", flags.args.output, flags.weights == UFORM_WEIGHTS_I8 ? " (I8 weights)" : "");
    return COMMAND_OK;
}

int command_checkpoint(int argc, char **argv) {
    static command_tool_t const tools[] = {{"tiny", command_checkpoint_tiny},
                                           {"quantize", command_checkpoint_quantize}};
    static command_tools_t const checkpoint = {
        .name = "checkpoint", .help = help, .tools = tools, .count = 2};
    return command_run_tool(&checkpoint, argc, argv);
}
