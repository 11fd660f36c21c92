/* The manifests `uform train` and `uform eval` read (uform_manifest.h): every line parsed and checked
 * up front, so that a bad line fails before any work, and the groups indexed both ways, item to groups
 * and group to items; identical items' groups merged; groups' nearest neighbours by their words. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "uform_manifest.h"
#include "uform_random.h"

/* A growing array of size_t. */
typedef struct sizes {
    size_t *values;
    size_t count, capacity;
} sizes_t;

static bool sizes_push(sizes_t *sizes, size_t value) {
    if (sizes->count == sizes->capacity) {
        size_t capacity = sizes->capacity ? 2 * sizes->capacity : 64;
        size_t *grown = realloc(sizes->values, capacity * sizeof *grown);
        if (!grown) return false;
        sizes->values = grown;
        sizes->capacity = capacity;
    }
    sizes->values[sizes->count++] = value;
    return true;
}

static bool is_blank(char const *line, size_t length) {
    for (size_t i = 0; i < length; ++i)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r' && line[i] != '\n') return false;
    return true;
}

static int compare_sizes(void const *a, void const *b) {
    size_t x = *(size_t const *)a, y = *(size_t const *)b;
    return (x > y) - (x < y);
}

/* The folder of `path` with its trailing slash ("" for a bare name), malloc'ed. */
static char *folder_of(char const *path) {
    char const *slash = strrchr(path, '/');
    size_t length = slash ? (size_t)(slash - path) + 1 : 0;
    char *folder = malloc(length + 1);
    if (!folder) return NULL;
    memcpy(folder, path, length);
    folder[length] = '\0';
    return folder;
}

/* What one line holds, checked. Interns its groups in `names` (group name -> index) and appends their
 * indices to `item_groups`. */
static int parse_line(manifest_t *manifest, char const *folder, char const *line, size_t length,
                      size_t number, json_t *names, sizes_t *item_groups, manifest_item_t *item) {
    char const *path = manifest->path;
    json_error_t error;
    int code = COMMAND_OK;
    json_t *object = json_loadb(line, length, JSON_REJECT_DUPLICATES, &error);
    if (!object) /* jansson's text is empty where an allocation failed */
        return command_fail("%s line %zu: %s", path, number, error.text[0] ? error.text : "out of memory");
    if (!json_is_object(object)) {
        code = command_fail("%s line %zu: not a JSON object", path, number);
        goto done;
    }
    json_t *modality = json_object_get(object, "modality");
    if (!json_is_string(modality)) {
        code = command_fail("%s line %zu: no \"modality\" string", path, number);
        goto done;
    }
    size_t kind = 0;
    while (kind < 4 && strcmp(json_string_value(modality), command_modality_names[kind]) != 0)
        ++kind;
    if (kind == 4) {
        code = command_fail("%s line %zu: modality '%s' is not text, image, video or audio", path, number,
                            json_string_value(modality));
        goto done;
    }
    char const *key = kind == UFORM_MODALITY_TEXT ? "text" : "path";
    json_t *value = json_object_get(object, key);
    if (!json_is_string(value)) {
        code = command_fail("%s line %zu: no \"%s\" string for a%s %s item", path, number, key,
                            kind == UFORM_MODALITY_IMAGE || kind == UFORM_MODALITY_AUDIO ? "n" : "",
                            command_modality_names[kind]);
        goto done;
    }
    json_t *groups = json_object_get(object, "groups");
    if (!json_is_array(groups) || json_array_size(groups) == 0) {
        code = command_fail("%s line %zu: \"groups\" is not a non-empty array", path, number);
        goto done;
    }

    *item = (manifest_item_t){
        .modality = (uform_modality_t)kind, .line = number, .groups_first = item_groups->count};
    char const *text = json_string_value(value);
    size_t text_length = json_string_length(value);
    if (kind == UFORM_MODALITY_TEXT) {
        item->bytes = malloc(text_length + 1);
        if (!item->bytes) goto memory;
        memcpy(item->bytes, text, text_length + 1);
        item->length = text_length;
    } else {
        if (text_length == 0) {
            code = command_fail("%s line %zu: an empty \"path\"", path, number);
            goto done;
        }
        size_t prefix = text[0] == '/' ? 0 : strlen(folder);
        item->bytes = malloc(prefix + text_length + 1);
        if (!item->bytes) goto memory;
        memcpy(item->bytes, folder, prefix);
        memcpy(item->bytes + prefix, text, text_length + 1);
        item->length = prefix + text_length;
        struct stat status;
        if (stat(item->bytes, &status) != 0) {
            code = command_fail("%s line %zu: %s: %s", path, number, item->bytes, strerror(errno));
            goto done;
        }
        if (!S_ISREG(status.st_mode)) {
            code = command_fail("%s line %zu: %s: not a regular file", path, number, item->bytes);
            goto done;
        }
    }

    for (size_t i = 0; i < json_array_size(groups); ++i) {
        json_t *group = json_array_get(groups, i);
        if (!json_is_string(group) || json_string_length(group) == 0) {
            code = command_fail("%s line %zu: group %zu is not a non-empty string", path, number, i);
            goto done;
        }
        json_t *known = json_object_get(names, json_string_value(group));
        size_t index = known ? (size_t)json_integer_value(known) : json_object_size(names);
        if (!known &&
            json_object_set_new(names, json_string_value(group), json_integer((json_int_t)index)) != 0)
            goto memory;
        bool repeated = false;
        for (size_t j = item->groups_first; j < item_groups->count; ++j)
            repeated |= item_groups->values[j] == index;
        if (!repeated && !sizes_push(item_groups, index)) goto memory;
    }
    item->groups_count = item_groups->count - item->groups_first;
    qsort(item_groups->values + item->groups_first, item->groups_count, sizeof(size_t), compare_sizes);
    goto done;
memory:
    code = command_fail("out of memory reading %s", path);
done:
    json_decref(object);
    return code;
}

/* group_offsets and group_items from the items' groups (a counting sort: items ascend in each group). */
static int index_groups(manifest_t *manifest) {
    size_t groups = manifest->groups_count;
    manifest->group_offsets = calloc(groups + 1, sizeof(size_t));
    size_t memberships = 0;
    for (size_t i = 0; i < manifest->count; ++i)
        memberships += manifest->items[i].groups_count;
    manifest->group_items = malloc((memberships ? memberships : 1) * sizeof(size_t));
    if (!manifest->group_offsets || !manifest->group_items) return command_fail("out of memory");
    for (size_t i = 0; i < manifest->count; ++i) {
        manifest_item_t const *item = &manifest->items[i];
        for (size_t j = 0; j < item->groups_count; ++j)
            manifest->group_offsets[manifest->item_groups[item->groups_first + j] + 1]++;
    }
    for (size_t g = 0; g < groups; ++g)
        manifest->group_offsets[g + 1] += manifest->group_offsets[g];
    size_t *fill = calloc(groups ? groups : 1, sizeof(size_t));
    if (!fill) return command_fail("out of memory");
    for (size_t i = 0; i < manifest->count; ++i) {
        manifest_item_t const *item = &manifest->items[i];
        for (size_t j = 0; j < item->groups_count; ++j) {
            size_t g = manifest->item_groups[item->groups_first + j];
            manifest->group_items[manifest->group_offsets[g] + fill[g]++] = i;
        }
    }
    free(fill);
    return COMMAND_OK;
}

/* An item and its index, ordered by contents: modality, length, bytes, then index. */
typedef struct keyed {
    manifest_item_t const *item;
    size_t index;
} keyed_t;

static int compare_contents(keyed_t const *x, keyed_t const *y) {
    if (x->item->modality != y->item->modality) return x->item->modality < y->item->modality ? -1 : 1;
    if (x->item->length != y->item->length) return x->item->length < y->item->length ? -1 : 1;
    return memcmp(x->item->bytes, y->item->bytes, x->item->length);
}

static int compare_keyed(void const *a, void const *b) {
    keyed_t const *x = a, *y = b;
    int order = compare_contents(x, y);
    return order ? order : (x->index > y->index) - (x->index < y->index);
}

/* alike_groups: for each run of identical items (sorted by contents), the union of their groups. */
static int index_alike(manifest_t *manifest) {
    size_t const count = manifest->count;
    keyed_t *order = malloc(count * sizeof *order);
    sizes_t alike = {0};
    if (!order) return command_fail("out of memory");
    for (size_t i = 0; i < count; ++i)
        order[i] = (keyed_t){.item = &manifest->items[i], .index = i};
    qsort(order, count, sizeof *order, compare_keyed);
    for (size_t start = 0, end = 0; start < count; start = end) {
        end = start + 1;
        while (end < count && compare_contents(&order[start], &order[end]) == 0)
            ++end;
        size_t first = alike.count;
        for (size_t r = start; r < end; ++r) {
            manifest_item_t const *item = order[r].item;
            for (size_t g = 0; g < item->groups_count; ++g)
                if (!sizes_push(&alike, manifest->item_groups[item->groups_first + g])) goto memory;
        }
        qsort(alike.values + first, alike.count - first, sizeof(size_t), compare_sizes);
        size_t unique = first;
        for (size_t j = first; j < alike.count; ++j)
            if (j == first || alike.values[j] != alike.values[unique - 1])
                alike.values[unique++] = alike.values[j];
        alike.count = unique;
        for (size_t r = start; r < end; ++r) {
            manifest->items[order[r].index].alike_first = first;
            manifest->items[order[r].index].alike_count = unique - first;
        }
    }
    free(order);
    manifest->alike_groups = alike.values;
    return COMMAND_OK;
memory:
    free(order);
    free(alike.values);
    return command_fail("out of memory");
}

int manifest_read(char const *path, manifest_t *manifest) {
    *manifest = (manifest_t){.path = path};
    sizes_t item_groups = {0};
    size_t capacity = 0, line_capacity = 0, number = 0;
    char *line = NULL;
    int code = COMMAND_OK;
    json_t *names = json_object();
    char *folder = folder_of(path);
    FILE *file = fopen(path, "r");
    if (!names || !folder) {
        code = command_fail("out of memory");
        goto done;
    }
    if (!file) {
        code = command_fail("cannot open %s: %s", path, strerror(errno));
        goto done;
    }
    ssize_t length = 0;
    while ((length = getline(&line, &line_capacity, file)) >= 0) {
        ++number;
        if (is_blank(line, (size_t)length)) continue;
        if (manifest->count == capacity) {
            capacity = capacity ? 2 * capacity : 256;
            manifest_item_t *grown = realloc(manifest->items, capacity * sizeof *grown);
            if (!grown) {
                code = command_fail("out of memory reading %s", path);
                goto done;
            }
            manifest->items = grown;
        }
        manifest_item_t *item = &manifest->items[manifest->count];
        *item = (manifest_item_t){0};
        code = parse_line(manifest, folder, line, (size_t)length, number, names, &item_groups, item);
        if (code != COMMAND_OK) {
            free(item->bytes);
            goto done;
        }
        manifest->modality_counts[item->modality]++;
        manifest->count++;
    }
    if (ferror(file)) {
        code = command_fail("cannot read %s: %s", path, strerror(errno));
        goto done;
    }
    if (manifest->count == 0) {
        code = command_fail("%s holds no item", path);
        goto done;
    }
    manifest->item_groups = item_groups.values;
    item_groups.values = NULL;
    manifest->groups_count = json_object_size(names);
    manifest->group_names = calloc(manifest->groups_count ? manifest->groups_count : 1, sizeof(char *));
    if (!manifest->group_names) {
        code = command_fail("out of memory reading %s", path);
        goto done;
    }
    char const *name = NULL;
    json_t *index = NULL;
    json_object_foreach(names, name, index) {
        if (!(manifest->group_names[json_integer_value(index)] = strdup(name))) {
            code = command_fail("out of memory reading %s", path);
            goto done;
        }
    }
    code = index_groups(manifest);
    if (code == COMMAND_OK) code = index_alike(manifest);
done:
    if (file) fclose(file);
    free(line);
    free(folder);
    free(item_groups.values);
    json_decref(names);
    if (code != COMMAND_OK) manifest_free(manifest);
    return code;
}

void manifest_free(manifest_t *manifest) {
    for (size_t i = 0; i < manifest->count; ++i)
        free(manifest->items[i].bytes);
    free(manifest->items);
    for (size_t g = 0; g < manifest->groups_count && manifest->group_names; ++g)
        free(manifest->group_names[g]);
    free(manifest->group_names);
    free(manifest->item_groups);
    free(manifest->group_offsets);
    free(manifest->group_items);
    free(manifest->alike_groups);
    *manifest = (manifest_t){0};
}

/* Whether two ascending lists share a value. */
static bool intersect(size_t const *x, size_t x_count, size_t const *y, size_t y_count) {
    size_t i = 0, j = 0;
    while (i < x_count && j < y_count) {
        if (x[i] == y[j]) return true;
        if (x[i] < y[j])
            ++i;
        else
            ++j;
    }
    return false;
}

bool manifest_related(manifest_t const *manifest, size_t a, size_t b) {
    manifest_item_t const *x = &manifest->items[a], *y = &manifest->items[b];
    return intersect(manifest->item_groups + x->groups_first, x->groups_count,
                     manifest->item_groups + y->groups_first, y->groups_count);
}

bool manifest_alike(manifest_t const *manifest, size_t a, size_t b) {
    manifest_item_t const *x = &manifest->items[a], *y = &manifest->items[b];
    return intersect(manifest->alike_groups + x->alike_first, x->alike_count,
                     manifest->alike_groups + y->alike_first, y->alike_count);
}

/* ---- neighbours ---------------------------------------------------------------------------------- */

enum { WORD_BITS = 512, WORD_LANES = WORD_BITS / 64, NEIGHBOUR_POOL = 8192, WORD_CAPACITY = 64 };
enum { NEIGHBOUR_STREAM = 0x6e656967 }; /* "neig" */

/* What a group says: the modalities of its items, and the bits of the words of its texts. */
typedef struct signature {
    unsigned modalities;
    uint64_t words[WORD_LANES];
} signature_t;

/* Sets the bits of the words of `text` in `signature`, each word interned in `vocabulary` (word -> its
 * bit, the first WORD_BITS words exact, the later ones folded onto them). */
static int add_words(char const *text, size_t length, json_t *vocabulary, signature_t *signature) {
    char word[WORD_CAPACITY];
    for (size_t i = 0; i < length;) {
        unsigned char byte = (unsigned char)text[i];
        if (!isalnum(byte) && byte < 0x80) {
            ++i;
            continue;
        }
        size_t used = 0;
        for (; i < length && (isalnum((unsigned char)text[i]) || (unsigned char)text[i] >= 0x80); ++i)
            if (used + 1 < sizeof word) word[used++] = (char)tolower((unsigned char)text[i]);
        word[used] = '\0';
        json_t *known = json_object_get(vocabulary, word);
        size_t bit = known ? (size_t)json_integer_value(known) : json_object_size(vocabulary) % WORD_BITS;
        if (!known && json_object_set_new(vocabulary, word, json_integer((json_int_t)bit)) != 0)
            return command_fail("out of memory");
        signature->words[bit / 64] |= UINT64_C(1) << (bit % 64);
    }
    return COMMAND_OK;
}

/* A hash of (seed, a, b), symmetric in a and b: the order of equally near groups. */
static uint64_t tie_hash(uint64_t seed, size_t a, size_t b) {
    uint64_t x = seed ^ (uint64_t)(a < b ? a : b) * UINT64_C(0x9E3779B97F4A7C15) ^
                 (uint64_t)(a < b ? b : a) * UINT64_C(0xC2B2AE3D27D4EB4F);
    x ^= x >> 31;
    x *= UINT64_C(0xBF58476D1CE4E5B9);
    x ^= x >> 29;
    return x;
}

int manifest_neighbours(manifest_t const *manifest, size_t k, uint64_t seed, size_t **neighbours) {
    size_t const groups = manifest->groups_count;
    *neighbours = NULL;
    signature_t *signatures = calloc(groups ? groups : 1, sizeof *signatures);
    size_t cells = groups * k;
    size_t *rows = malloc((cells ? cells : 1) * sizeof(size_t));
    double *scores = malloc((k ? k : 1) * sizeof(double));
    uint64_t *ties = malloc((k ? k : 1) * sizeof(uint64_t));
    json_t *vocabulary = json_object();
    int code = COMMAND_OK;
    if (!signatures || !rows || !scores || !ties || !vocabulary) {
        code = command_fail("out of memory");
        goto done;
    }
    for (size_t g = 0; g < groups && code == COMMAND_OK; ++g)
        for (size_t m = manifest->group_offsets[g]; m < manifest->group_offsets[g + 1]; ++m) {
            manifest_item_t const *item = &manifest->items[manifest->group_items[m]];
            signatures[g].modalities |= 1u << item->modality;
            if (item->modality == UFORM_MODALITY_TEXT &&
                (code = add_words(item->bytes, item->length, vocabulary, &signatures[g])) != COMMAND_OK)
                break;
        }
    for (size_t g = 0; g < groups && code == COMMAND_OK; ++g) {
        size_t *row = rows + g * k, kept = 0;
        random_stream_t random;
        random_stream_seed(&random, seed, NEIGHBOUR_STREAM, g);
        bool sampled = groups > NEIGHBOUR_POOL;
        for (size_t c = 0; c < (sampled ? NEIGHBOUR_POOL : groups); ++c) {
            size_t h = sampled ? random_stream_below(&random, groups) : c;
            if (h == g || signatures[h].modalities != signatures[g].modalities) continue;
            size_t shared = 0, either = 0;
            for (size_t lane = 0; lane < WORD_LANES; ++lane) {
                shared += (size_t)__builtin_popcountll(signatures[g].words[lane] & signatures[h].words[lane]);
                either += (size_t)__builtin_popcountll(signatures[g].words[lane] | signatures[h].words[lane]);
            }
            if (shared == 0) continue; /* not near at all */
            double score = (double)shared / (double)either;
            uint64_t tie = tie_hash(seed, g, h);
            bool repeated = false; /* a sampled group drawn twice */
            for (size_t j = 0; j < kept && sampled; ++j)
                repeated |= row[j] == h;
            if (repeated) continue;
            /* Insertion into the row, nearest first; the farthest falls off a full row. */
            size_t at = kept;
            while (at > 0 && (scores[at - 1] < score || (scores[at - 1] == score && ties[at - 1] > tie)))
                --at;
            if (at == k) continue;
            size_t last = kept < k ? kept++ : k - 1;
            for (size_t j = last; j > at; --j) {
                row[j] = row[j - 1];
                scores[j] = scores[j - 1];
                ties[j] = ties[j - 1];
            }
            row[at] = h;
            scores[at] = score;
            ties[at] = tie;
        }
        for (size_t j = kept; j < k; ++j)
            row[j] = SIZE_MAX;
    }
done:
    json_decref(vocabulary);
    free(ties);
    free(scores);
    free(signatures);
    if (code == COMMAND_OK) {
        *neighbours = rows;
    } else {
        free(rows);
    }
    return code;
}

int manifest_read_file(char const *path, char **bytes, size_t *length, size_t *capacity) {
    FILE *file = fopen(path, "rb");
    if (!file) return errno;
    int error = 0;
    struct stat status;
    if (fstat(fileno(file), &status) != 0) {
        error = errno;
        goto done;
    }
    size_t size = (size_t)status.st_size;
    if (!command_reserve(bytes, capacity, *length + size + 1, 1 << 16)) {
        error = ENOMEM;
        goto done;
    }
    if (fread(*bytes + *length, 1, size, file) != size) {
        error = ferror(file) && errno ? errno : EIO;
        goto done;
    }
    *length += size;
done:
    fclose(file);
    return error;
}
