/* The search index file (its layout is in uform_search.h): written as a replacement (uform_replace.c: a
 * temporary beside it, synced and renamed into place; killed writers' temporaries removed at the next
 * write), read back whole and checked before a byte of it is trusted; and the text of a .txt file. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "uform_search.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the vectors are written as the host lays them out");

struct search_writer {
    replacement_t replacement;
    FILE *file; /* the replacement's */
    char const *model;
    size_t dims, items;
    /* What follows the vectors, held until they are all written. */
    unsigned char *modalities;
    uint64_t *offsets; /* items + 1 */
    char *paths;
    size_t paths_bytes, capacity, paths_capacity;
};

static void put_u32(unsigned char *at, uint32_t value) {
    for (size_t i = 0; i < 4; ++i)
        at[i] = (unsigned char)(value >> (8 * i));
}

static void put_u64(unsigned char *at, uint64_t value) {
    for (size_t i = 0; i < 8; ++i)
        at[i] = (unsigned char)(value >> (8 * i));
}

static uint32_t get_u32(unsigned char const *at) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i)
        value |= (uint32_t)at[i] << (8 * i);
    return value;
}

static uint64_t get_u64(unsigned char const *at) {
    uint64_t value = 0;
    for (size_t i = 0; i < 8; ++i)
        value |= (uint64_t)at[i] << (8 * i);
    return value;
}

/* ---- writing ---------------------------------------------------------------------------------- */

static int writer_failed(search_writer_t const *writer) {
    return command_fail("cannot write %s: %s", writer->replacement.path, strerror(errno ? errno : EIO));
}

int search_writer_open(char const *path, char const *model, size_t dims, search_writer_t **opened) {
    search_writer_t *writer = calloc(1, sizeof *writer);
    if (!writer) return command_fail("out of memory");
    writer->model = model;
    writer->dims = dims;
    writer->offsets = calloc(1, sizeof *writer->offsets);
    if (!writer->offsets) {
        search_writer_abort(writer);
        return command_fail("out of memory");
    }
    int code = replacement_open(path, &writer->replacement);
    if (code != COMMAND_OK) {
        search_writer_abort(writer);
        return code;
    }
    writer->file = writer->replacement.file;
    unsigned char header[SEARCH_HEADER_SIZE] = {0}; /* written again, complete, at the end */
    errno = 0;
    if (fwrite(header, 1, sizeof header, writer->file) != sizeof header) {
        code = writer_failed(writer);
        search_writer_abort(writer);
        return code;
    }
    *opened = writer;
    return COMMAND_OK;
}

int search_writer_add(search_writer_t *writer, uform_modality_t modality, char const *path, size_t length,
                      float const *vector) {
    if (writer->items == writer->capacity) {
        size_t capacity = writer->capacity ? 2 * writer->capacity : 256;
        unsigned char *modalities = realloc(writer->modalities, capacity);
        if (modalities) writer->modalities = modalities;
        uint64_t *offsets = realloc(writer->offsets, (capacity + 1) * sizeof *offsets);
        if (offsets) writer->offsets = offsets;
        if (!modalities || !offsets) return command_fail("out of memory for %zu items", capacity);
        writer->capacity = capacity;
    }
    if (writer->paths_bytes + length > writer->paths_capacity) {
        size_t capacity = writer->paths_capacity ? writer->paths_capacity : 1 << 16;
        while (capacity < writer->paths_bytes + length)
            capacity *= 2;
        char *paths = realloc(writer->paths, capacity);
        if (!paths) return command_fail("out of memory for %zu bytes of paths", capacity);
        writer->paths = paths;
        writer->paths_capacity = capacity;
    }
    errno = 0;
    if (fwrite(vector, sizeof *vector, writer->dims, writer->file) != writer->dims)
        return writer_failed(writer);
    memcpy(writer->paths + writer->paths_bytes, path, length);
    writer->paths_bytes += length;
    writer->modalities[writer->items] = (unsigned char)modality;
    writer->offsets[++writer->items] = writer->paths_bytes;
    return COMMAND_OK;
}

int search_writer_commit(search_writer_t *writer) {
    size_t model_bytes = strlen(writer->model);
    unsigned char header[SEARCH_HEADER_SIZE] = {0};
    memcpy(header, SEARCH_MAGIC, 8);
    put_u32(header + 8, SEARCH_VERSION);
    put_u32(header + 12, (uint32_t)writer->dims);
    put_u64(header + 16, writer->items);
    put_u64(header + 24, model_bytes);
    put_u64(header + 32, writer->paths_bytes);
    FILE *file = writer->file;
    errno = 0;
    bool written = fwrite(writer->model, 1, model_bytes, file) == model_bytes &&
                   fwrite(writer->modalities, 1, writer->items, file) == writer->items;
    for (size_t i = 0; written && i <= writer->items; ++i) {
        unsigned char offset[8];
        put_u64(offset, writer->offsets[i]);
        written = fwrite(offset, 1, sizeof offset, file) == sizeof offset;
    }
    written = written && fwrite(writer->paths, 1, writer->paths_bytes, file) == writer->paths_bytes &&
              fseeko(file, 0, SEEK_SET) == 0 && fwrite(header, 1, sizeof header, file) == sizeof header;
    int code = written ? replacement_commit(&writer->replacement) : writer_failed(writer);
    search_writer_abort(writer);
    return code;
}

void search_writer_abort(search_writer_t *writer) {
    if (!writer) return;
    replacement_abort(&writer->replacement);
    free(writer->modalities);
    free(writer->offsets);
    free(writer->paths);
    free(writer);
}

/* ---- reading ---------------------------------------------------------------------------------- */

static int read_whole(char const *path, search_index_t *index) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return command_fail("cannot open %s: %s", path, strerror(errno));
    struct stat status;
    int code = COMMAND_OK;
    if (fstat(fd, &status) != 0) {
        code = command_fail("cannot read %s: %s", path, strerror(errno));
    } else if (!S_ISREG(status.st_mode)) {
        code = command_fail("%s: not a uform search index (not a regular file)", path);
    } else if (!(index->data = malloc((size_t)status.st_size + 1))) {
        code = command_fail("out of memory for %s, %lld bytes", path, (long long)status.st_size);
    } else {
        index->size = (size_t)status.st_size;
        for (size_t done = 0; done < index->size && code == COMMAND_OK;) {
            ssize_t got = read(fd, index->data + done, index->size - done);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0)
                code = command_fail("cannot read %s: %s", path, strerror(errno));
            else if (got == 0)
                code = command_fail("cannot read %s: it shrank while read", path);
            else
                done += (size_t)got;
        }
    }
    close(fd);
    return code;
}

int search_index_read(char const *path, search_index_t *index) {
    *index = (search_index_t){0};
    int code = read_whole(path, index);
    if (code != COMMAND_OK) goto fail;
    unsigned char const *data = index->data;
    if (index->size < SEARCH_HEADER_SIZE || memcmp(data, SEARCH_MAGIC, 8) != 0) {
        code = command_fail("%s: not a uform search index", path);
        goto fail;
    }
    uint32_t version = get_u32(data + 8);
    if (version != SEARCH_VERSION) {
        code = command_fail("%s: an index of version %u; this uform reads version %d", path, version,
                            SEARCH_VERSION);
        goto fail;
    }
    uint64_t dims = get_u32(data + 12), items = get_u64(data + 16), model_bytes = get_u64(data + 24),
             paths_bytes = get_u64(data + 32);
    char const *damage = NULL;
    for (size_t i = 40; i < SEARCH_HEADER_SIZE && !damage; ++i)
        if (data[i]) damage = "reserved header bytes are not zero";
    /* Each part is bounded by the file's size before it is added, so no sum overflows. */
    uint64_t rest = index->size - SEARCH_HEADER_SIZE;
    if (!damage && !dims) damage = "zero dims";
    if (!damage && (items > rest / 4 / dims || model_bytes > rest || paths_bytes > rest))
        damage = "sizes past the end of the file";
    if (!damage && items * dims * 4 + model_bytes + items + (items + 1) * 8 + paths_bytes != rest)
        damage = "sizes that do not add up to the file's";
    if (damage) {
        code = command_fail("%s: a damaged index: %s", path, damage);
        goto fail;
    }
    index->dims = (size_t)dims;
    index->items = (size_t)items;
    index->vectors = (float const *)(data + SEARCH_HEADER_SIZE);
    unsigned char const *model = data + SEARCH_HEADER_SIZE + items * dims * 4;
    index->modalities = model + model_bytes;
    index->offsets = index->modalities + items;
    index->paths = index->offsets + (items + 1) * 8;
    if (!model_bytes || memchr(model, '\0', model_bytes)) damage = "no model path";
    for (size_t i = 0; i < items && !damage; ++i)
        if (index->modalities[i] > UFORM_MODALITY_AUDIO) damage = "an unknown modality";
    if (!damage && get_u64(index->offsets) != 0) damage = "paths that do not start at 0";
    for (size_t i = 0; i < items && !damage; ++i)
        if (get_u64(index->offsets + 8 * i) > get_u64(index->offsets + 8 * (i + 1)))
            damage = "paths out of order";
    if (!damage && get_u64(index->offsets + 8 * items) != paths_bytes)
        damage = "paths that do not end at their end";
    for (size_t i = 0; i < items * dims && !damage; ++i)
        if (!isfinite(index->vectors[i])) damage = "a vector that is not finite";
    if (damage) {
        code = command_fail("%s: a damaged index: %s", path, damage);
        goto fail;
    }
    if (!(index->model = strndup((char const *)model, model_bytes))) {
        code = command_fail("out of memory");
        goto fail;
    }
    return COMMAND_OK;
fail:
    search_index_free(index);
    return code;
}

char const *search_index_path(search_index_t const *index, size_t item, size_t *length) {
    uint64_t begin = get_u64(index->offsets + 8 * item), end = get_u64(index->offsets + 8 * (item + 1));
    *length = (size_t)(end - begin);
    return (char const *)index->paths + begin;
}

void search_index_free(search_index_t *index) {
    free(index->data);
    free(index->model);
    *index = (search_index_t){0};
}

/* ---- text files ------------------------------------------------------------------------------- */

uform_status_t search_read_text(char const *path, size_t context, char **text, size_t *length,
                                char const **why) {
    *text = NULL;
    *length = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        *why = strerror(errno);
        return UFORM_IO;
    }
    struct stat status;
    uform_status_t result = UFORM_OK;
    size_t limit = context + 2, size = 0;
    char *buffer = NULL;
    if (fstat(fd, &status) != 0) {
        *why = strerror(errno);
        result = UFORM_IO;
    } else if (!S_ISREG(status.st_mode)) {
        *why = "not a regular file";
        result = UFORM_IO;
    } else if (!(buffer = malloc(limit))) {
        *why = "out of memory";
        result = UFORM_OUT_OF_MEMORY;
    }
    while (result == UFORM_OK && size < limit) {
        ssize_t got = read(fd, buffer + size, limit - size);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            *why = strerror(errno);
            result = UFORM_IO;
        }
        if (got <= 0) break;
        size += (size_t)got;
    }
    close(fd);
    if (result != UFORM_OK) {
        free(buffer);
        return result;
    }
    /* Short of the limit, the file was read to its end, so its final line end is its last bytes. */
    if (size < limit && size && buffer[size - 1] == '\n') {
        --size;
        if (size && buffer[size - 1] == '\r') --size;
    }
    *text = buffer;
    *length = size;
    return UFORM_OK;
}
