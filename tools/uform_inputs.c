/* What `uform encode` reads, one item at a time so that a stream of any length needs bounded memory:
 * texts and image paths given as arguments, one text per line of standard input, or a JSONL manifest
 * of objects {"text": ...}, {"image": PATH}, {"video": PATH} or {"audio": PATH}; and the modality of a
 * file by its name, which `search` also goes by. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <jansson.h>

#include "uform_command.h"

typedef enum input_kind {
    INPUT_ARGUMENTS = 0,
    INPUT_LINES = 1,
    INPUT_MANIFEST = 2,
} input_kind_t;

struct input {
    input_kind_t kind;
    char const *const *arguments; /* INPUT_ARGUMENTS */
    size_t count, next, literal_from;
    FILE *file;       /* INPUT_LINES and INPUT_MANIFEST */
    char const *name; /* for errors: the manifest's path, or "standard input" */
    char *line;
    size_t line_capacity, line_number, total;
    json_t *object; /* the manifest line whose string the last item points into */
};

static bool is_blank(char const *line, size_t length) {
    for (size_t i = 0; i < length; ++i)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r' && line[i] != '\n') return false;
    return true;
}

/* The manifest's items, counted ahead for the progress bar when the manifest is a file that can be
 * read twice. */
static int count_manifest(input_t *input) {
    struct stat status;
    if (fstat(fileno(input->file), &status) != 0 || !S_ISREG(status.st_mode)) return COMMAND_OK;
    ssize_t length = 0;
    while ((length = getline(&input->line, &input->line_capacity, input->file)) >= 0)
        input->total += !is_blank(input->line, (size_t)length);
    if (ferror(input->file) || fseeko(input->file, 0, SEEK_SET) != 0)
        return command_fail("cannot read %s: %s", input->name, strerror(errno));
    return COMMAND_OK;
}

int input_open(char const *const *arguments, size_t count, size_t literal_from, char const *manifest,
               input_t **opened) {
    input_t *input = calloc(1, sizeof *input);
    if (!input) return command_fail("out of memory");
    int code = COMMAND_OK;
    if (count) {
        *input = (input_t){.kind = INPUT_ARGUMENTS,
                           .arguments = arguments,
                           .count = count,
                           .literal_from = literal_from,
                           .total = count};
    } else if (manifest && strcmp(manifest, "-") != 0) {
        *input = (input_t){.kind = INPUT_MANIFEST, .name = manifest, .file = fopen(manifest, "r")};
        if (!input->file) {
            code = command_fail("cannot open %s: %s", manifest, strerror(errno));
            goto fail;
        }
        if ((code = count_manifest(input)) != COMMAND_OK) goto fail;
    } else {
        *input = (input_t){
            .kind = manifest ? INPUT_MANIFEST : INPUT_LINES, .name = "standard input", .file = stdin};
    }
    *opened = input;
    return COMMAND_OK;
fail:
    input_close(input);
    return code;
}

/* One manifest line into an item, or the reason it is not one. */
static int manifest_item(input_t *input, size_t length, input_item_t *item) {
    json_error_t error;
    json_decref(input->object);
    input->object = json_loadb(input->line, length, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &error);
    if (!input->object) /* jansson's text is empty where an allocation failed */
        return command_fail("%s line %zu: %s", input->name, input->line_number,
                            error.text[0] ? error.text : "out of memory");
    if (!json_is_object(input->object))
        return command_fail("%s line %zu: not a JSON object", input->name, input->line_number);
    json_t *value = NULL;
    for (size_t modality = 0; modality < sizeof command_modality_names / sizeof command_modality_names[0];
         ++modality) {
        json_t *found = json_object_get(input->object, command_modality_names[modality]);
        if (!found) continue;
        if (value)
            return command_fail("%s line %zu: more than one of text, image, video and audio", input->name,
                                input->line_number);
        if (!json_is_string(found))
            return command_fail("%s line %zu: \"%s\" is not a string", input->name, input->line_number,
                                command_modality_names[modality]);
        value = found;
        *item =
            (input_item_t){(uform_modality_t)modality, json_string_value(found), json_string_length(found)};
    }
    if (!value)
        return command_fail("%s line %zu: none of text, image, video and audio", input->name,
                            input->line_number);
    return COMMAND_OK;
}

bool input_file_modality(char const *path, size_t length, uform_modality_t *modality) {
    static struct {
        char const *extension;
        uform_modality_t modality;
    } const kinds[] = {
        {".jpg", UFORM_MODALITY_IMAGE}, {".jpeg", UFORM_MODALITY_IMAGE}, {".png", UFORM_MODALITY_IMAGE},
        {".wav", UFORM_MODALITY_AUDIO}, {".flac", UFORM_MODALITY_AUDIO}, {".mp3", UFORM_MODALITY_AUDIO},
        {".ogg", UFORM_MODALITY_AUDIO}, {".mp4", UFORM_MODALITY_VIDEO},  {".mkv", UFORM_MODALITY_VIDEO},
        {".avi", UFORM_MODALITY_VIDEO}, {".webm", UFORM_MODALITY_VIDEO}, {".mov", UFORM_MODALITY_VIDEO},
        {".txt", UFORM_MODALITY_TEXT},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; ++i) {
        size_t extension = strlen(kinds[i].extension);
        if (length > extension &&
            strncasecmp(path + length - extension, kinds[i].extension, extension) == 0) {
            *modality = kinds[i].modality;
            return true;
        }
    }
    return false;
}

int input_next(input_t *input, input_item_t *item, bool *done) {
    *done = false;
    if (input->kind == INPUT_ARGUMENTS) {
        *done = input->next == input->count;
        if (!*done) {
            bool literal = input->next >= input->literal_from;
            char const *argument = input->arguments[input->next++];
            size_t length = strlen(argument);
            /* Arguments name images only: "notes.txt" or "song.mp3" given as an argument is a text. */
            uform_modality_t modality = UFORM_MODALITY_TEXT;
            if (literal || !input_file_modality(argument, length, &modality) ||
                modality != UFORM_MODALITY_IMAGE)
                modality = UFORM_MODALITY_TEXT;
            *item = (input_item_t){modality, argument, length};
        }
        return COMMAND_OK;
    }
    for (;;) {
        errno = 0;
        ssize_t read = getline(&input->line, &input->line_capacity, input->file);
        if (read < 0) {
            if (ferror(input->file)) return command_fail("cannot read %s: %s", input->name, strerror(errno));
            *done = true;
            return COMMAND_OK;
        }
        ++input->line_number;
        size_t length = (size_t)read;
        if (input->kind == INPUT_MANIFEST) {
            /* Blank lines carry no item in JSONL, by common use. */
            if (is_blank(input->line, length)) continue;
            return manifest_item(input, length, item);
        }
        /* A text is its line without the line's end, "\n" or "\r\n"; an empty line is an empty text. */
        if (length && input->line[length - 1] == '\n') --length;
        if (length && input->line[length - 1] == '\r') --length;
        *item = (input_item_t){UFORM_MODALITY_TEXT, input->line, length};
        return COMMAND_OK;
    }
}

size_t input_total(input_t const *input) {
    return input->total;
}

void input_close(input_t *input) {
    if (!input) return;
    if (input->file && input->file != stdin) fclose(input->file);
    json_decref(input->object);
    free(input->line);
    free(input);
}
