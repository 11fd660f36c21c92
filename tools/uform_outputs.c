/* What `uform encode` writes: JSONL rows, raw rows, or a .npy array. Raw and .npy rows are the bytes
 * the engine produced, so these writers assume a little-endian host, as the formats they promise. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "uform_command.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "raw and .npy rows are written as the host lays them out");

/* Format 1.0: magic, version, a 16-bit header length, then a Python dict padded with spaces and ended by
 * a newline. Its size is fixed and large enough for any shape, so that a file can be patched in place
 * once the row count is known; NumPy aligns the data to 64 bytes, as this size does. */
enum { NPY_HEADER_SIZE = 128 };

struct output {
    output_format_t format;
    uform_scalar_t scalar;
    size_t columns, rows;
    bool tokens;
    FILE *file;
    char const *path; /* NULL: standard output */
    /* A regular file (or a new one) is written as a replacement: renamed over `path` once complete, so
     * that a failed or killed run leaves the previous file as it was; anything else (a pipe, a device)
     * is written in place. */
    bool replaces;
    replacement_t replacement;
    /* .npy: the header is patched at `header_at` when the file allows it, else the rows are held in
     * memory until the count is known. */
    bool patch;
    off_t header_at;
    unsigned char *held;
    size_t held_size, held_capacity;
};

static char const *output_name(output_t const *output) {
    return output->path ? output->path : "the standard output";
}

static int write_failed(output_t const *output) {
    return command_fail("cannot write %s: %s", output_name(output), strerror(errno ? errno : EIO));
}

/* ---- JSONL ------------------------------------------------------------------------------------ */

static float half_to_float(uint16_t half) {
    uint32_t sign = (uint32_t)(half >> 15) << 31, exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
    if (exponent == 0) { /* zero and subnormals: mantissa * 2^-24, exact in F32 */
        float magnitude = (float)mantissa * 0x1p-24f;
        return sign ? -magnitude : magnitude;
    }
    uint32_t bits = exponent == 0x1f ? sign | 0x7f800000u | mantissa << 13 /* infinities and NaNs */
                                     : sign | (exponent + 112) << 23 | mantissa << 13;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Scalar `column` of a row, as the float it stands for (I8: the quantized integer). */
static float scalar_value(void const *row, size_t column, uform_scalar_t scalar) {
    uint16_t half = 0;
    float value = 0;
    switch (scalar) {
    case UFORM_F32:
        memcpy(&value, (float const *)row + column, sizeof value);
        return value;
    case UFORM_BF16: {
        memcpy(&half, (uint16_t const *)row + column, sizeof half);
        uint32_t bits = (uint32_t)half << 16;
        memcpy(&value, &bits, sizeof value);
        return value;
    }
    case UFORM_F16:
        memcpy(&half, (uint16_t const *)row + column, sizeof half);
        return half_to_float(half);
    case UFORM_I8:
        return (float)((int8_t const *)row)[column];
    case UFORM_U32:
        return (float)((uint32_t const *)row)[column];
    }
    return value;
}

/* %.9g prints every float so that it reads back to the same float; JSON has no NaN or infinity. */
static void write_float(FILE *file, float value) {
    if (value - value == 0)
        fprintf(file, "%.9g", (double)value);
    else
        fputs("null", file);
}

static int write_row(FILE *file, uform_view_t const *view, size_t row) {
    void const *data = NULL;
    if (uform_view_row(view, row, &data) != UFORM_OK) return command_fail_engine();
    fputc('[', file);
    for (size_t column = 0; column < view->columns; ++column) {
        if (column) fputc(',', file);
        float value = scalar_value(data, column, view->scalar);
        if (view->scalar == UFORM_I8)
            fprintf(file, "%d", (int)value);
        else
            write_float(file, value);
    }
    fputc(']', file);
    return COMMAND_OK;
}

static int write_jsonl(output_t *output, uform_encoded_t const *encoded, size_t first) {
    FILE *file = output->file;
    uform_view_t const *embeddings = &encoded->embeddings, *tokens = &encoded->token_vectors;
    bool scaled = output->scalar == UFORM_I8;
    for (size_t item = 0; item < encoded->items; ++item) {
        if (encoded->statuses[item] != UFORM_OK) { /* kept going past it: its row says why */
            fprintf(file, "{\"index\":%zu,\"error\":\"%s\"}\n", first + item,
                    uform_status_name(encoded->statuses[item]));
            continue;
        }
        fprintf(file, "{\"index\":%zu,\"embedding\":", first + item);
        int code = write_row(file, embeddings, item);
        if (code != COMMAND_OK) return code;
        if (scaled) {
            fputs(",\"scale\":", file);
            write_float(file, embeddings->scales[item]);
        }
        if (output->tokens) {
            size_t begin = tokens->item_offsets[item], end = tokens->item_offsets[item + 1];
            fputs(",\"tokens\":[", file);
            for (size_t row = begin; row < end; ++row) {
                if (row > begin) fputc(',', file);
                if ((code = write_row(file, tokens, row)) != COMMAND_OK) return code;
            }
            fputc(']', file);
            if (scaled) {
                fputs(",\"token_scales\":[", file);
                for (size_t row = begin; row < end; ++row) {
                    if (row > begin) fputc(',', file);
                    write_float(file, tokens->scales[row]);
                }
                fputc(']', file);
            }
            uform_view_t const *spans = &encoded->token_spans;
            if (spans->rows) { /* a model that reads tokens: the bytes each covers */
                fputs(",\"spans\":[", file);
                for (size_t row = begin; row < end; ++row) {
                    uint32_t const *span =
                        (uint32_t const *)(void const *)((char const *)spans->data + row * spans->row_stride);
                    fprintf(file, "%s[%" PRIu32 ",%" PRIu32 "]", row > begin ? "," : "", span[0], span[1]);
                }
                fputc(']', file);
            }
        }
        fputs("}\n", file);
    }
    /* stdio errors are sticky: one check per batch finds any of them. */
    return ferror(file) ? write_failed(output) : COMMAND_OK;
}

/* ---- raw rows and .npy ------------------------------------------------------------------------ */

static int hold(output_t *output, void const *data, size_t size) {
    if (output->held_size + size > output->held_capacity) {
        size_t capacity = output->held_capacity ? output->held_capacity : 1u << 20;
        while (capacity < output->held_size + size)
            capacity *= 2;
        unsigned char *grown = realloc(output->held, capacity);
        if (!grown) return command_fail("out of memory holding the rows for %s", output_name(output));
        output->held = grown;
        output->held_capacity = capacity;
    }
    memcpy(output->held + output->held_size, data, size);
    output->held_size += size;
    return COMMAND_OK;
}

static int write_rows(output_t *output, uform_view_t const *view) {
    size_t size = view->columns * uform_scalar_size(view->scalar);
    bool holding = output->format == OUTPUT_NPY && !output->patch;
    for (size_t row = 0; row < view->rows; ++row) {
        void const *data = NULL;
        if (uform_view_row(view, row, &data) != UFORM_OK) return command_fail_engine();
        if (holding) {
            int code = hold(output, data, size);
            if (code != COMMAND_OK) return code;
        } else if (fwrite(data, 1, size, output->file) != size) {
            return write_failed(output);
        }
    }
    return COMMAND_OK;
}

static void npy_header(output_t const *output, char header[NPY_HEADER_SIZE]) {
    static char const *const descriptions[] = {"<f4", "<u2", "<f2", "|i1"}; /* by uform_scalar_t */
    memset(header, ' ', NPY_HEADER_SIZE);
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    header[8] = (char)((NPY_HEADER_SIZE - 10) & 0xff);
    header[9] = (char)((NPY_HEADER_SIZE - 10) >> 8);
    int length = snprintf(header + 10, NPY_HEADER_SIZE - 10,
                          "{'descr': '%s', 'fortran_order': False, 'shape': (%zu, %zu), }",
                          descriptions[output->scalar], output->rows, output->columns);
    header[10 + length] = ' '; /* snprintf's NUL becomes padding */
    header[NPY_HEADER_SIZE - 1] = '\n';
}

static int npy_finish(output_t *output) {
    char header[NPY_HEADER_SIZE];
    npy_header(output, header);
    if (output->patch) {
        if (fseeko(output->file, output->header_at, SEEK_SET) != 0) return write_failed(output);
        if (fwrite(header, 1, sizeof header, output->file) != sizeof header) return write_failed(output);
        return COMMAND_OK;
    }
    if (fwrite(header, 1, sizeof header, output->file) != sizeof header ||
        fwrite(output->held, 1, output->held_size, output->file) != output->held_size)
        return write_failed(output);
    return COMMAND_OK;
}

/* ---- the interface ---------------------------------------------------------------------------- */

int output_open(output_format_t format, char const *path, uform_scalar_t scalar, size_t columns, bool tokens,
                output_t **opened) {
    output_t *output = calloc(1, sizeof *output);
    if (!output) return command_fail("out of memory");
    *output =
        (output_t){.format = format, .scalar = scalar, .columns = columns, .tokens = tokens, .path = path};
    struct stat status;
    bool const in_place = path && stat(path, &status) == 0 && !S_ISREG(status.st_mode);
    output->replaces = path && !in_place;
    int code = output->replaces ? replacement_open(path, &output->replacement) : COMMAND_OK;
    if (code != COMMAND_OK) {
        free(output);
        return code;
    }
    output->file = output->replaces ? output->replacement.file : path ? fopen(path, "wb") : stdout;
    if (!output->file) {
        code = command_fail("cannot open %s: %s", path, strerror(errno));
        free(output);
        return code;
    }
    bool regular = fstat(fileno(output->file), &status) == 0 && S_ISREG(status.st_mode);
    if (format == OUTPUT_NPY) {
        /* A file opened for appending writes every byte at its end, so its header cannot be patched. */
        int flags = fcntl(fileno(output->file), F_GETFL);
        output->header_at = regular && flags >= 0 && !(flags & O_APPEND) ? ftello(output->file) : -1;
        output->patch = output->header_at >= 0;
    }
    if (output->patch) { /* a header of the final size now; npy_finish rewrites it with the row count */
        char header[NPY_HEADER_SIZE];
        npy_header(output, header);
        if (fwrite(header, 1, sizeof header, output->file) != sizeof header) {
            code = write_failed(output);
            output_close(output, false);
            return code;
        }
    }
    *opened = output;
    return COMMAND_OK;
}

int output_write(output_t *output, uform_encoded_t const *encoded, size_t first) {
    int code = output->format == OUTPUT_JSONL ? write_jsonl(output, encoded, first)
                                              : write_rows(output, &encoded->embeddings);
    output->rows += encoded->items;
    return code;
}

int output_close(output_t *output, bool complete) {
    if (!output) return COMMAND_OK;
    int code = COMMAND_OK;
    if (complete && output->format == OUTPUT_NPY) code = npy_finish(output);
    if (output->replaces) {
        if (complete && code == COMMAND_OK) code = replacement_commit(&output->replacement);
        replacement_abort(&output->replacement);
    } else {
        if (fflush(output->file) != 0 && code == COMMAND_OK) code = write_failed(output);
        if (output->file != stdout && fclose(output->file) != 0 && code == COMMAND_OK)
            code = write_failed(output);
    }
    free(output->held);
    free(output);
    return code;
}
