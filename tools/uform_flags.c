/* One parser for every command's flags: argv is walked left to right against the command's table
 * (uform_command.h). An argument is, in this order: positional after `--`; positional when it does not
 * start with '-' or is "-"; help; a row of the table (`--name VALUE`, `--name=VALUE`, or a switch
 * alone); else an error. Values are checked by their row's kind and range, what the table requires
 * once the walk is over, and every error is said the same way in every command. --help is printed
 * from the same table. A command made of tools dispatches on its first argument through one table too. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "uform_command.h"

/* ---- values ------------------------------------------------------------------------------------ */

/* The largest value a row's target holds. */
static uint64_t kind_maximum(command_flag_kind_t kind) {
    if (kind == FLAG_SIZE) return SIZE_MAX;
    if (kind == FLAG_UNSIGNED) return UINT_MAX;
    return UINT64_MAX;
}

/* "a number", "a positive number", "a number up to 8" or "a number from 16 to 1024". */
static int number_error(command_spec_t const *spec, command_flag_t const *flag, char const *value) {
    uint64_t maximum = flag->maximum ? flag->maximum : kind_maximum(flag->kind);
    if (maximum == kind_maximum(flag->kind) && flag->minimum <= 1)
        return command_usage(spec->help->name, "%s takes a %snumber, not '%s'", flag->name,
                             flag->minimum ? "positive " : "", value);
    if (flag->minimum == 0)
        return command_usage(spec->help->name, "%s takes a number up to %" PRIu64 ", not '%s'", flag->name,
                             maximum, value);
    return command_usage(spec->help->name, "%s takes a number from %" PRIu64 " to %" PRIu64 ", not '%s'",
                         flag->name, flag->minimum, maximum, value);
}

static int set_number(command_spec_t const *spec, command_flag_t const *flag, char const *value) {
    uint64_t number = 0, maximum = flag->maximum ? flag->maximum : kind_maximum(flag->kind);
    if (command_parse_u64(value, &number) != 0 || number < flag->minimum || number > maximum)
        return number_error(spec, flag, value);
    if (flag->kind == FLAG_SIZE)
        *(size_t *)flag->target = (size_t)number;
    else if (flag->kind == FLAG_UNSIGNED)
        *(unsigned *)flag->target = (unsigned)number;
    else
        *(uint64_t *)flag->target = number;
    return COMMAND_OK;
}

/* A decimal number with no sign or space before it (strtod would take both), finite and in range. */
static int set_real(command_spec_t const *spec, command_flag_t const *flag, char const *value) {
    char *end = NULL;
    errno = 0;
    double parsed = strtod(value, &end);
    bool bounded = flag->real_maximum != 0;
    bool leading = (value[0] >= '0' && value[0] <= '9') || value[0] == '.';
    if (!leading || errno || end == value || *end || !isfinite(parsed) || parsed < flag->real_minimum ||
        (bounded && parsed > flag->real_maximum)) {
        if (bounded)
            return command_usage(spec->help->name, "%s takes a number from %g to %g, not '%s'", flag->name,
                                 flag->real_minimum, flag->real_maximum, value);
        return command_usage(spec->help->name, "%s takes a number of at least %g, not '%s'", flag->name,
                             flag->real_minimum, value);
    }
    *(double *)flag->target = parsed;
    return COMMAND_OK;
}

/* Appends name `i` of `count` to `names` ("a, b or c"), answering the new length (kept below
 * `capacity`). */
static size_t join_name(char *names, size_t capacity, size_t length, size_t i, size_t count,
                        char const *name) {
    char const *separator = i == 0 ? "" : i + 1 == count ? " or " : ", ";
    int written = snprintf(names + length, capacity - length, "%s%s", separator, name);
    if (written < 0 || (size_t)written >= capacity - length) return capacity - 1;
    return length + (size_t)written;
}

static int choice_error(command_spec_t const *spec, command_flag_t const *flag, char const *value) {
    char names[256] = "";
    for (size_t i = 0, length = 0; i < flag->choice_count; ++i)
        length = join_name(names, sizeof names, length, i, flag->choice_count, flag->choices[i]);
    return command_usage(spec->help->name, "%s takes %s, not '%s'", flag->name, names, value);
}

static int set_value(command_spec_t const *spec, command_flag_t const *flag, char const *value) {
    switch (flag->kind) {
    case FLAG_STRING:
        *(char const **)flag->target = value;
        return COMMAND_OK;
    case FLAG_U64:
    case FLAG_SIZE:
    case FLAG_UNSIGNED:
        return set_number(spec, flag, value);
    case FLAG_REAL:
        return set_real(spec, flag, value);
    case FLAG_CHOICE:
        for (size_t i = 0; i < flag->choice_count; ++i) {
            if (strcmp(value, flag->choices[i]) != 0) continue;
            *(int *)flag->target = (int)i;
            return COMMAND_OK;
        }
        return choice_error(spec, flag, value);
    case FLAG_STRINGS: {
        command_strings_t *strings = flag->target;
        if (strings->count >= flag->maximum)
            return command_usage(spec->help->name, "%s is given more than %llu times", flag->name,
                                 (unsigned long long)flag->maximum);
        strings->values[strings->count++] = value;
        return COMMAND_OK;
    }
    case FLAG_SWITCH:
    case FLAG_LITERALS:
        break;
    }
    return COMMAND_OK;
}

/* ---- the walk ---------------------------------------------------------------------------------- */

/* The row `argument` names, alone or as `--name=VALUE` (*inline_value then points past the '='). */
static command_flag_t const *find_flag(command_spec_t const *spec, char const *argument,
                                       char const **inline_value) {
    *inline_value = NULL;
    for (command_flag_t const *flag = spec->flags; flag->name; ++flag) {
        size_t length = strlen(flag->name);
        if (strncmp(argument, flag->name, length) != 0) continue;
        if (argument[length] == '\0') return flag;
        if (argument[length] != '=' || flag->kind == FLAG_LITERALS) continue;
        *inline_value = argument + length + 1;
        return flag;
    }
    return NULL;
}

static int unexpected(command_spec_t const *spec, char const *argument) {
    return command_usage(spec->help->name, "%s '%s'",
                         argument[0] == '-' ? "unknown flag" : "unexpected argument", argument);
}

static int take_positional(command_spec_t const *spec, char const *argument, bool literal) {
    if (!spec->help->positional) return unexpected(spec, argument);
    return spec->help->positional(spec->context, argument, literal);
}

/* The usage error of what the walk left out: the positional arguments, then each required row. */
static int missing(command_spec_t const *spec, size_t positionals) {
    if (spec->missing && !positionals) return command_usage(spec->help->name, "%s", spec->missing);
    for (command_flag_t const *flag = spec->flags; flag->name; ++flag)
        if (flag->required && !*(char const **)flag->target)
            return command_usage(spec->help->name, "%s", flag->required);
    return COMMAND_OK;
}

int command_flags_parse(command_spec_t const *spec, int argc, char **argv, bool *help) {
    bool literal = false;
    size_t positionals = 0;
    *help = false;
    for (int i = 1; i < argc; ++i) {
        char const *argument = argv[i];
        int code = COMMAND_OK;
        if (literal || argument[0] != '-' || argument[1] == '\0') {
            code = take_positional(spec, argument, literal);
            if (code != COMMAND_OK) return code;
            positionals++;
            continue;
        }
        if (command_is_help(argument)) {
            command_flags_help(spec, stdout);
            *help = true;
            return COMMAND_OK;
        }
        char const *value = NULL;
        command_flag_t const *flag = find_flag(spec, argument, &value);
        if (!flag) return unexpected(spec, argument);
        if (flag->given) *flag->given = true;
        if (flag->kind == FLAG_LITERALS) {
            literal = true;
            continue;
        }
        if (flag->kind == FLAG_SWITCH) {
            if (value) return command_usage(spec->help->name, "%s takes no value", flag->name);
            *(bool *)flag->target = true;
            continue;
        }
        if (!value) {
            if (i + 1 >= argc) return command_usage(spec->help->name, "%s needs a value", flag->name);
            value = argv[++i];
        }
        if ((code = set_value(spec, flag, value)) != COMMAND_OK) return code;
    }
    return missing(spec, positionals);
}

command_flag_t command_flag_model(char const **model) {
    return (command_flag_t){"--model", FLAG_STRING, model, .value = "PATH",
                            .help = "the checkpoint, a pretrained folder, or a hub id in the local\n"
                                    "Hugging Face cache; default: the default model (below)"};
}

command_flag_t command_flag_threads(size_t *threads) {
    return (command_flag_t){"--threads", FLAG_SIZE, threads, .value = "N",
                            .help = "worker threads; 0 (the default) takes 7/8 of the cores"};
}

command_flag_t command_flag_weights(int *weights) {
    static char const *const kinds[] = {"stored", "bf16", "i8"}; /* by uform_weights_t */
    return (command_flag_t){"--weights",
                            FLAG_CHOICE,
                            weights,
                            .value = "KIND",
                            .choices = kinds,
                            .choice_count = 3,
                            .help = "the blocks' linear layers: stored (the default: as the checkpoint\n"
                                    "stores them), bf16, or i8 (quantized as the model loads: half\n"
                                    "the memory and, on CPUs with 8-bit dot products, about twice\n"
                                    "the speed; embeddings at a cosine of about 0.999 to bf16's)"};
}

/* ---- help -------------------------------------------------------------------------------------- */

/* `  --name VALUE` padded to the column, then the description, its later lines indented to it. */
static void print_row(command_flag_t const *flag, int column, FILE *stream) {
    int width =
        fprintf(stream, "  %s%s%s", flag->name, flag->value ? " " : "", flag->value ? flag->value : "");
    fprintf(stream, "%*s", width < column ? column - width : 1, "");
    for (char const *line = flag->help;;) {
        char const *end = strchr(line, '\n');
        if (!end) {
            fprintf(stream, "%s\n", line);
            return;
        }
        fprintf(stream, "%.*s\n%*s", (int)(end - line), line, column, "");
        line = end + 1;
    }
}

void command_flags_help(command_spec_t const *spec, FILE *stream) {
    fputs(spec->help->head, stream);
    for (command_flag_t const *flag = spec->flags; flag->name; ++flag) {
        if (flag->section) fputs(flag->section, stream);
        print_row(flag, spec->help->column, stream);
    }
    if (spec->help->tail) fputs(spec->help->tail, stream);
    if (spec->help->model_help) fputs(command_default_model_help, stream);
}

/* ---- tools ------------------------------------------------------------------------------------- */

int command_run_tool(command_tools_t const *tools, int argc, char **argv) {
    char names[256] = "";
    for (size_t i = 0, length = 0; i < tools->count; ++i)
        length = join_name(names, sizeof names, length, i, tools->count, tools->tools[i].name);
    if (argc < 2) return command_usage(tools->name, "a tool is missing: %s", names);
    if (command_is_help(argv[1])) {
        fputs(tools->help, stdout);
        if (tools->model_help) fputs(command_default_model_help, stdout);
        return COMMAND_OK;
    }
    for (size_t i = 0; i < tools->count; ++i)
        if (!strcmp(argv[1], tools->tools[i].name)) return tools->tools[i].run(argc - 1, argv + 1);
    return command_usage(tools->name, "unknown tool '%s': %s", argv[1], names);
}
