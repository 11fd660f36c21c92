/* The readers of a pretrained folder's files (pretrained_internal.h): its JSON files, their sizes, reals and
 * strings, Hugging Face's activation names, and faults with their messages. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_fault.h"
#include "pretrained_internal.h"

/* A JSON file of a folder larger than this is refused: configurations are a few KiB, tokenizers a few MiB. */
#define PRETRAINED_JSON_LIMIT (64u << 20)

static _Thread_local char pretrained_message[PATH_MAX + 160];

uform_status_t pretrained_fault(char const **message, uform_status_t status, char const *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(pretrained_message, sizeof pretrained_message, format, args);
    va_end(args);
    *message = pretrained_message;
    return status;
}

/* `folder`/`name` into `path`; false when it does not fit. */
bool pretrained_join(char *path, char const *folder, char const *name) {
    int written = snprintf(path, PATH_MAX, "%s/%s", folder, name);
    return written > 0 && written < PATH_MAX;
}

/* Reads `folder`/`name` as JSON into `*value`; a missing file is *value NULL when `optional`. */
uform_status_t pretrained_json(char const *folder, char const *name, bool optional, json_t **value,
                               char const **message) {
    char path[PATH_MAX];
    *value = NULL;
    if (!pretrained_join(path, folder, name))
        return pretrained_fault(message, UFORM_IO, "%s: path too long", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && optional) return UFORM_OK;
    if (fd < 0) return pretrained_fault(message, UFORM_IO, "%s: cannot open it in %s", name, folder);
    struct stat about;
    if (fstat(fd, &about) != 0 || !S_ISREG(about.st_mode)) {
        close(fd);
        return pretrained_fault(message, UFORM_IO, "%s: not a regular file", name);
    }
    if ((uint64_t)about.st_size > PRETRAINED_JSON_LIMIT) {
        close(fd);
        return pretrained_fault(message, UFORM_FORMAT, "%s: larger than %u bytes", name,
                                PRETRAINED_JSON_LIMIT);
    }
    size_t size = (size_t)about.st_size, done = 0;
    char *text = malloc(size + 1);
    if (!text) {
        close(fd);
        return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    while (done < size) {
        ssize_t got = read(fd, text + done, size - done);
        if (got <= 0) break;
        done += (size_t)got;
    }
    close(fd);
    if (done < size) {
        free(text);
        return pretrained_fault(message, UFORM_IO, "%s: cannot read it", name);
    }
    json_error_t error;
    *value = json_loadb(text, size, JSON_REJECT_DUPLICATES, &error);
    free(text);
    if (!*value && json_fault_memory(&error))
        return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "%s: out of memory", name);
    if (!*value)
        return pretrained_fault(message, UFORM_FORMAT, "%s: not JSON (line %d: %.80s)", name, error.line,
                                error.text);
    if (!json_is_object(*value) && !json_is_array(*value)) {
        json_decref(*value);
        *value = NULL;
        return pretrained_fault(message, UFORM_FORMAT, "%s: neither an object nor an array", name);
    }
    return UFORM_OK;
}

/* A size of an object: `fallback` where absent (SIZE_MAX: required), else an integer in [low, high]. */
uform_status_t pretrained_size(json_t const *object, char const *file, char const *key, size_t low,
                               size_t high, size_t fallback, size_t *value, char const **message) {
    json_t const *found = json_object_get(object, key);
    if (!found && fallback != SIZE_MAX) {
        *value = fallback;
        return UFORM_OK;
    }
    if (!json_is_integer(found) || json_integer_value(found) < (json_int_t)low ||
        (uint64_t)json_integer_value(found) > high)
        return pretrained_fault(message, UFORM_FORMAT, "%s: \"%s\" missing or out of [%zu, %zu]", file, key,
                                low, high);
    *value = (size_t)json_integer_value(found);
    return UFORM_OK;
}

char const *pretrained_string(json_t const *object, char const *key) {
    json_t const *found = json_object_get(object, key);
    return json_is_string(found) ? json_string_value(found) : NULL;
}

uform_status_t pretrained_real(json_t const *object, char const *file, char const *key, double low,
                               double high, double fallback, double *value, char const **message) {
    json_t const *found = json_object_get(object, key);
    *value = found ? (json_is_number(found) ? json_number_value(found) : low) : fallback;
    if (!(*value > low && *value <= high))
        return pretrained_fault(message, UFORM_FORMAT, "%s: \"%s\" not a number in (%g, %g]", file, key, low,
                                high);
    return UFORM_OK;
}

uform_status_t pretrained_activation(json_t const *config, char const *file, char const *key,
                                     uform_activation_t fallback, uform_activation_t *activation,
                                     char const **message) {
    char const *act = pretrained_string(config, key);
    if (!act && json_object_get(config, key))
        return pretrained_fault(message, UFORM_FORMAT, "%s: %s is not a string", file, key);
    if (!act)
        *activation = fallback;
    else if (strcmp(act, "gelu") == 0)
        *activation = UFORM_ACTIVATION_GELU_ERF;
    else if (strcmp(act, "gelu_new") == 0 || strcmp(act, "gelu_pytorch_tanh") == 0)
        *activation = UFORM_ACTIVATION_GELU_TANH;
    else if (strcmp(act, "quick_gelu") == 0)
        *activation = UFORM_ACTIVATION_GELU_QUICK;
    else
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: %s \"%.40s\"", file, key, act);
    return UFORM_OK;
}
