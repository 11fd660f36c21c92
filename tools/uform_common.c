/* Errors, numbers, growing buffers and the default model, shared by every subcommand of `uform`. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "uform_command.h"

static char const default_model_name[] = "tiny-42.safetensors";

char const command_default_model_help[] =
    "Without --model, the default model is the demo model (models/demo.safetensors: trained by 'uform\n"
    "train' on 'uform dataset synth' shapes, clips and sounds; models/README.md says how), found where\n"
    "'meson install' puts it, else in the source tree this uform was built from. UFORM_DEFAULT_MODEL\n"
    "overrides it: a checkpoint's path, or 'tiny' for the tiny seeded checkpoint (uform_tiny_checkpoint,\n"
    "seed 42: random weights, for tests), written once to $XDG_CACHE_HOME/uform/tiny-42.safetensors\n"
    "(or $HOME/.cache/uform/) and reused; the tiny one is also the fallback where the demo is missing.\n";

int command_vfail(char const *format, va_list arguments) {
    fputs("uform: ", stderr);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    return COMMAND_RUNTIME;
}

int command_fail(char const *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    int code = command_vfail(format, arguments);
    va_end(arguments);
    return code;
}

int command_usage(char const *command, char const *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    fputs("uform: ", stderr);
    vfprintf(stderr, format, arguments);
    fprintf(stderr, " (see 'uform %s%s--help')\n", command ? command : "", command ? " " : "");
    va_end(arguments);
    return COMMAND_USAGE;
}

int command_fail_engine(void) {
    uform_error_t error = uform_last_error();
    char text[512];
    uform_error_render(&error, text, sizeof text);
    fprintf(stderr, "%s\n", text);
    return COMMAND_RUNTIME;
}

bool command_reserve(char **bytes, size_t *capacity, size_t needed, size_t first) {
    if (needed <= *capacity) return true;
    size_t grown_capacity = *capacity ? *capacity : first;
    while (grown_capacity < needed)
        grown_capacity *= 2;
    char *grown = realloc(*bytes, grown_capacity);
    if (!grown) return false;
    *bytes = grown;
    *capacity = grown_capacity;
    return true;
}

bool command_is_help(char const *argument) {
    return !strcmp(argument, "-h") || !strcmp(argument, "--help");
}

char *command_join(char const *first, char const *second, char const *third) {
    size_t lengths[3] = {strlen(first), strlen(second), strlen(third)};
    char *joined = malloc(lengths[0] + lengths[1] + lengths[2] + 1);
    if (!joined) return NULL;
    memcpy(joined, first, lengths[0]);
    memcpy(joined + lengths[0], second, lengths[1]);
    memcpy(joined + lengths[0] + lengths[1], third, lengths[2] + 1);
    return joined;
}

int command_parse_u64(char const *text, uint64_t *value) {
    if (text[0] < '0' || text[0] > '9') return -1; /* strtoull would take a sign or spaces */
    char *end = NULL;
    errno = 0;
    unsigned long long parsed = strtoull(text, &end, 10);
    if (errno || *end) return -1;
    *value = parsed;
    return 0;
}

/* `mkdir -p`: every missing directory of `path`, which is modified in place and restored. */
static int make_directories(char *path) {
    for (char *slash = path + 1;; ++slash) {
        bool last = *slash == '\0';
        if (*slash != '/' && !last) continue;
        *slash = '\0';
        int made = mkdir(path, 0755);
        int error = errno;
        if (!last) *slash = '/';
        if (made != 0 && error != EEXIST) return command_fail("cannot create %s: %s", path, strerror(error));
        if (last) return COMMAND_OK;
    }
}

/* The demo model where `meson install` puts it, then in the source tree, when either is a file. */
static char const *demo_model(void) {
    static char const *const places[] = {UFORM_DEMO_MODEL_INSTALLED, UFORM_DEMO_MODEL_SOURCE};
    struct stat status;
    for (size_t i = 0; i < sizeof places / sizeof places[0]; ++i)
        if (stat(places[i], &status) == 0 && S_ISREG(status.st_mode)) return places[i];
    return NULL;
}

char const *command_hub_folder(char const *path, char *folder, size_t capacity) {
    struct stat status;
    size_t length = 0;
    if (stat(path, &status) == 0 || errno != ENOENT) return NULL;
    return uform_hub_folder(path, folder, capacity, &length) == UFORM_OK ? folder : NULL;
}

int command_model_path(char const *given, char *buffer, size_t capacity, char const **path) {
    if (given) {
        *path = given;
        return COMMAND_OK;
    }
    char const *chosen = getenv("UFORM_DEFAULT_MODEL");
    if (chosen && *chosen && strcmp(chosen, "tiny") != 0) {
        *path = chosen;
        return COMMAND_OK;
    }
    if (!chosen || !*chosen) {
        char const *demo = demo_model();
        if (demo) {
            *path = demo;
            return COMMAND_OK;
        }
    }
    /* The XDG base directory specification ignores relative paths in its variables. */
    char const *cache = getenv("XDG_CACHE_HOME");
    char const *home = getenv("HOME");
    int length = 0;
    if (cache && cache[0] == '/')
        length = snprintf(buffer, capacity, "%s/uform", cache);
    else if (home && home[0] == '/')
        length = snprintf(buffer, capacity, "%s/.cache/uform", home);
    else
        return command_fail("neither XDG_CACHE_HOME nor HOME is an absolute path: pass --model");
    if (length < 0 || (size_t)length + sizeof default_model_name + 1 > capacity)
        return command_fail("the cache directory's path is too long: pass --model");
    int code = make_directories(buffer);
    if (code != COMMAND_OK) return code;
    snprintf(buffer + length, capacity - (size_t)length, "/%s", default_model_name);
    *path = buffer;

    struct stat status;
    if (stat(buffer, &status) == 0) return COMMAND_OK;
    /* The writer renames a complete file into place, so concurrent first uses cannot see half of one. */
    uform_tiny_checkpoint_args_t tiny = {.path = buffer, .seed = 42};
    if (uform_tiny_checkpoint(&tiny) != UFORM_OK) return command_fail_engine();
    if (isatty(STDERR_FILENO)) fprintf(stderr, "uform: wrote the default model to %s\n", buffer);
    return COMMAND_OK;
}
