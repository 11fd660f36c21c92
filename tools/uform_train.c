/* uform train: trains a model from scratch, or continues a saved one, on a JSONL manifest, with the
 * engine's trainer on a RAM executor, or on a VRAM executor's device (--device cuda[:N]). Batches are whole
 * groups of related items, drawn in a seeded order that depends only on the seed and the step, so that a
 * resumed run draws the batches the uninterrupted one would have; each group drawn may bring its nearest
 * groups along (--neighbours), the hard negatives that teach what tells near groups apart. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "uform_manifest.h"
#include "uform_random.h"

static char const help_head[] =
    "usage: uform train --data MANIFEST --out CHECKPOINT [options]\n"
    "\n"
    "Trains a model on the items of MANIFEST, a JSON Lines file as 'uform dataset synth' writes it:\n"
    "  {\"modality\": \"text\", \"text\": \"...\", \"groups\": [\"g1\"]}\n"
    "  {\"modality\": \"image\"|\"video\"|\"audio\", \"path\": \"media/g1.png\", \"groups\": [\"g1\"]}\n"
    "(media paths relative to the manifest's folder; items sharing a group are related). Each step\n"
    "takes whole groups, in an order shuffled per pass with --seed, until the batch holds --batch\n"
    "items; every two items of the batch sharing a group are a related pair of the contrastive loss,\n"
    "and so are two items with the same modality and contents (one caption written for two pictures\n"
    "drawn alike describes both) and every item related to one of them, unless --strict.\n"
    "Media files are read for each batch; audio and video need a build with FFmpeg.\n"
    "\n";

static char const help_tail[] =
    "\n"
    "Nearest groups hold the same modalities and share the most words (Jaccard similarity of their\n"
    "texts' word sets); in a batch they are the negatives that differ in one detail, which random\n"
    "batches of a large manifest almost never hold.\n"
    "\n"
    "Each step prints its line on stderr: step/total, loss, contrastive and lm losses, learning rate and\n"
    "items per second; one line a step, or one line redrawn when stderr is a terminal. Ctrl-C stops\n"
    "after the current step and saves. A save writes the checkpoint and its .optimizer state whole\n"
    "under staging names (OUT.next, OUT.optimizer.next) before either replaces its file: a full disk or\n"
    "a kill leaves the previous pair or the new one, and --resume finishes or removes what an\n"
    "interrupted save left. Errors are one line on stderr, a file named with the system's reason: exit\n"
    "status 1 when the work failed or was interrupted, 2 for a wrong command line.\n"
    "\n"
    "Under mpirun (or a PMI launcher such as srun --mpi) the processes train as one: each steps on whole\n"
    "groups of the same batch, only the first prints and saves, and a Ctrl-C on any stops all after the\n"
    "same step; --device cuda is each process's local rank's device, cuda:N device N for all.\n";

typedef struct train_flags {
    char const *data, *out, *resume, *device;
    size_t steps, batch, save_every, threads, neighbours;
    long ordinal;      /* the CUDA device of --device, or -1 for the CPU */
    bool device_given; /* cuda:N rather than cuda */
    bool warmup_given, strict, dry_run, help;
    uform_trainer_config_t config;
} train_flags_t;

/* The batch order: a permutation of the groups per pass, drawn from (seed, pass). */
typedef struct batcher {
    manifest_t const *manifest;
    uint64_t seed;
    size_t batch;
    size_t neighbours;   /* groups brought by each group drawn */
    size_t *nearest;     /* groups_count x NEAREST: manifest_neighbours */
    size_t *taken;       /* per group: the batch it last joined, + 1 */
    size_t *taken_order; /* the current batch's groups, in the order taken */
    size_t *taken_first; /* the batch's index of each taken group's first item */
    size_t taken_count;
    size_t *order;   /* groups_count; the one block `taken`, `taken_order` and `stamp` lie in too */
    size_t position; /* the next group of `order` */
    size_t pass;     /* passes begun */
    size_t *stamp;   /* per item: the batch it last joined, + 1 */
    size_t batches;  /* batches drawn */
    size_t *items;   /* the current batch's items */
    size_t count;
    size_t capacity;
} batcher_t;

enum { BATCH_STREAM = 0x747261696e }; /* "train": the random stream of the batch order */
enum { NEAREST_STREAM = 0x6e656172 }; /* "near": the neighbours drawn for batch k */
enum { NEAREST = 8 };                 /* the nearest groups a group's neighbours are drawn from */

static volatile sig_atomic_t interrupted = 0;

/* Whether a progress line is drawn on the terminal without its newline yet. */
static bool line_drawn = false;

/* Ends a drawn progress line, so that what is printed next starts its own. */
static void end_line(void) {
    if (line_drawn) fputc('\n', stderr);
    line_drawn = false;
}

/* command_fail, below the progress line. */
__attribute__((format(printf, 1, 2))) static int fail_below(char const *format, ...) {
    end_line();
    va_list arguments;
    va_start(arguments, format);
    int code = command_vfail(format, arguments);
    va_end(arguments);
    return code;
}

static void on_interrupt(int signal_number) {
    (void)signal_number;
    interrupted = 1;
}

/* ---- devices ---------------------------------------------------------------------------------- */

#define DEVICES_PROBED 16 /* a VRAM executor spans at most 16 */

/* --device's value: -1 for cpu (or none), N for cuda:N (0 for cuda; *given says which). */
static int device_of(char const *value, long *ordinal, bool *given) {
    *ordinal = -1;
    if (!value || strcmp(value, "cpu") == 0) return COMMAND_OK;
    uint64_t number = 0;
    *given = strcmp(value, "cuda") != 0;
    if (strcmp(value, "cuda") == 0)
        number = 0;
    else if (strncmp(value, "cuda:", 5) != 0 || command_parse_u64(value + 5, &number) != 0 ||
             number >= DEVICES_PROBED)
        return command_usage("train", "--device takes cpu, cuda or cuda:N (N below %d), not '%s'",
                             DEVICES_PROBED, value);
    *ordinal = (long)number;
    return COMMAND_OK;
}

/* The paragraph of --help that says which devices this machine offers: a VRAM executor is tried on each
 * CUDA device in turn until one is refused. */
static void devices_help(void) {
    printf("\nDevices here: cpu");
    size_t found = 0;
    for (size_t d = 0; d < DEVICES_PROBED; ++d, ++found) {
        uform_executor_t *executor = NULL;
        uform_vram_options_t options = {.devices = &d, .devices_count = 1};
        if (uform_executor_create_vram(&options, &executor) != UFORM_OK) break;
        uform_executor_free(executor);
        printf(", cuda:%zu", d);
    }
    if (found == 0) printf(" (no CUDA device: %s)", uform_last_error().message);
    printf("\n");
}

/* ---- flags ------------------------------------------------------------------------------------ */

static command_help_t const help = {.name = "train", .head = help_head, .tail = help_tail, .column = 23};

static int parse_flags(int argc, char **argv, train_flags_t *flags) {
    uform_trainer_config_t *config = &flags->config;
    command_flag_t const table[] = {
        {"--data", FLAG_STRING, &flags->data, .value = "FILE", .help = "the manifest (required)",
         .required = "--data MANIFEST is required"},
        {"--out", FLAG_STRING, &flags->out, .value = "PATH",
         .help = "the checkpoint written, with its optimizer state at PATH.optimizer (required)",
         .required = "--out CHECKPOINT is required"},
        {"--steps", FLAG_SIZE, &flags->steps, .value = "N", .minimum = 1,
         .help = "train until the trainer's step count reaches N (default 1000); a fresh run's\n"
                 "learning rate decays to 0 at N"},
        {"--batch", FLAG_SIZE, &flags->batch, .value = "B", .minimum = 1,
         .help = "items per step, at least (whole groups; default 32)"},
        {"--resume", FLAG_STRING, &flags->resume, .value = "CHECKPOINT",
         .help = "continue from a checkpoint: its weights, and, where its optimizer state\n"
                 "lies beside it, the step, moments and optimizer settings it holds (which\n"
                 "then take precedence over the flags below; --steps may not pass the step\n"
                 "its learning rate reaches 0 at); the model flags are ignored. The batches\n"
                 "drawn depend on --data, --batch, --seed, --neighbours and --strict: pass\n"
                 "the ones of the run it continues to continue it bit for bit"},
        {"--save-every", FLAG_SIZE, &flags->save_every, .value = "N",
         .help = "also save every N steps (default 0: only at the end)"},
        command_flag_threads(&flags->threads),
        {"--device", FLAG_STRING, &flags->device, .value = "D",
         .help = "where the trainer runs: cpu (default), or cuda or cuda:N, device N of this\n"
                 "machine (0 when not given; under mpirun the local rank); --help lists the devices found"},
        {"--neighbours", FLAG_SIZE, &flags->neighbours, .value = "N", .maximum = NEAREST,
         .help = "each group drawn brings N more (default 0), drawn from its 8 nearest groups\n"
                 "by the words of their texts (see below)"},
        {"--strict", FLAG_SWITCH, &flags->strict,
         .help = "related pairs share a group, whatever their contents"},
        {"--dry-run", FLAG_SWITCH, &flags->dry_run,
         .help = "train nothing: print the batches the steps would take, a JSON object a\n"
                 "line on stdout: {\"step\": S, \"groups\": [names, in the order drawn],\n"
                 "\"lines\": [the items' manifest lines], \"related\": [[i, j], ...] (pairs of\n"
                 "indices into \"lines\")}"},
        {"--depth", FLAG_SIZE, &config->depth, .value = "D", .help = "blocks per tower (default 2)",
         .section =
             "\nThe model, when training from scratch (every tower; 0 or absent takes the default):\n"},
        {"--hidden", FLAG_SIZE, &config->hidden, .value = "H",
         .help = "width of every tower, a multiple of 64 (default 128)"},
        {"--dims", FLAG_SIZE, &config->dims, .value = "K", .help = "the embedding width, even (default 64)"},
        {"--context", FLAG_SIZE, &config->context, .value = "C", .help = "text bytes (default 64)"},
        {"--image-size", FLAG_SIZE, &config->image_size, .value = "S",
         .help = "image side in pixels (default 32)"},
        {"--image-patch", FLAG_SIZE, &config->image_patch, .value = "P",
         .help = "patch side, dividing S (default 8)"},
        {"--seed", FLAG_U64, &config->seed, .value = "S",
         .help = "initial weights and batch order (default 42)"},
        {"--lr", FLAG_REAL, &config->learning_rate, .value = "X",
         .help = "peak learning rate (default 0.001)",
         .section = "\nThe optimizer, AdamW with a linear warmup and a cosine decay:\n"},
        {"--warmup", FLAG_SIZE, &config->warmup_steps, .value = "N", .given = &flags->warmup_given,
         .help = "warmup steps (default: the smaller of 100 and a tenth of --steps)"},
        {"--weight-decay", FLAG_REAL, &config->weight_decay, .value = "X",
         .help = "on rank-2 weights (default 0.01)"},
        {"--lm-weight", FLAG_REAL, &config->lm_weight, .value = "X",
         .help = "weight of the text towers' next-byte loss (default 0.1)"},
        {"--clip", FLAG_REAL, &config->clip_norm, .value = "X",
         .help = "global gradient norm clip, 0 for none (default 1)"},
        {NULL},
    };
    command_spec_t const spec = {.help = &help, .flags = table};
    int code = command_flags_parse(&spec, argc, argv, &flags->help);
    if (flags->help) devices_help();
    if (code != COMMAND_OK || flags->help) return code;
    if ((code = device_of(flags->device, &flags->ordinal, &flags->device_given)) != COMMAND_OK) return code;
    if (!flags->warmup_given) {
        size_t tenth = flags->steps / 10;
        config->warmup_steps = tenth < 100 ? tenth : 100;
    }
    config->total_steps = flags->steps;
    config->resume_path = flags->resume;
    return COMMAND_OK;
}

/* ---- the step a checkpoint resumes at ---------------------------------------------------------- */

/* The step held by the optimizer state beside `checkpoint` (a safetensors file whose metadata
 * "uform" object holds "step"), and the step its learning rate schedule ends at (its "total_steps";
 * 0 where it holds none), or 0 where there is no state or it cannot be read: the trainer then starts
 * from the checkpoint's weights alone, and its first step's statistics say the truth. */
static size_t resumed_step(char const *checkpoint, size_t *schedule_end) {
    *schedule_end = 0;
    char path[4096];
    if (snprintf(path, sizeof path, "%s.optimizer", checkpoint) >= (int)sizeof path) return 0;
    FILE *file = fopen(path, "rb");
    if (!file) return 0;
    size_t step = 0;
    unsigned char prefix[8];
    char *header = NULL;
    json_t *root = NULL, *state = NULL;
    if (fread(prefix, 1, sizeof prefix, file) != sizeof prefix) goto done;
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i)
        length = length << 8 | prefix[i];
    if (length == 0 || length > (1u << 26) || !(header = malloc((size_t)length))) goto done;
    if (fread(header, 1, (size_t)length, file) != (size_t)length) goto done;
    root = json_loadb(header, (size_t)length, 0, NULL);
    json_t *metadata = json_object_get(root, "__metadata__");
    json_t *uform = json_object_get(metadata, "uform");
    if (!json_is_string(uform)) goto done;
    state = json_loads(json_string_value(uform), 0, NULL);
    json_t *saved = json_object_get(state, "step");
    if (json_is_integer(saved) && json_integer_value(saved) > 0) step = (size_t)json_integer_value(saved);
    json_t *total = json_object_get(json_object_get(state, "optimizer"), "total_steps");
    if (step && json_is_integer(total) && json_integer_value(total) > 0)
        *schedule_end = (size_t)json_integer_value(total);
done:
    json_decref(state);
    json_decref(root);
    free(header);
    fclose(file);
    return step;
}

/* ---- batches ---------------------------------------------------------------------------------- */

static int batcher_open(batcher_t *batcher, manifest_t const *manifest, uint64_t seed, size_t batch,
                        size_t neighbours) {
    *batcher = (batcher_t){.manifest = manifest, .seed = seed, .batch = batch, .neighbours = neighbours};
    size_t const groups = manifest->groups_count;
    batcher->order = calloc(4 * groups + manifest->count, sizeof(size_t)); /* taken and stamp start at 0 */
    if (!batcher->order) return command_fail("out of memory");
    batcher->taken = batcher->order + groups;
    batcher->taken_order = batcher->taken + groups;
    batcher->taken_first = batcher->taken_order + groups;
    batcher->stamp = batcher->taken_first + groups;
    batcher->position = manifest->groups_count; /* the first draw begins pass 0 */
    if (neighbours) return manifest_neighbours(manifest, NEAREST, seed, &batcher->nearest);
    return COMMAND_OK;
}

static void batcher_close(batcher_t *batcher) {
    free(batcher->order);
    free(batcher->nearest);
    free(batcher->items);
    *batcher = (batcher_t){0};
}

/* Group `group`'s items appended to the batch, an item already in it skipped. */
static int batcher_take(batcher_t *batcher, size_t group) {
    manifest_t const *manifest = batcher->manifest;
    batcher->taken[group] = batcher->batches;
    batcher->taken_first[batcher->taken_count] = batcher->count;
    batcher->taken_order[batcher->taken_count++] = group;
    for (size_t k = manifest->group_offsets[group]; k < manifest->group_offsets[group + 1]; ++k) {
        size_t item = manifest->group_items[k];
        if (batcher->stamp[item] == batcher->batches) continue;
        batcher->stamp[item] = batcher->batches;
        if (batcher->count == batcher->capacity) {
            size_t capacity = batcher->capacity ? 2 * batcher->capacity : 64;
            size_t *grown = realloc(batcher->items, capacity * sizeof *grown);
            if (!grown) return fail_below("out of memory");
            batcher->items = grown;
            batcher->capacity = capacity;
        }
        batcher->items[batcher->count++] = item;
    }
    return COMMAND_OK;
}

/* The next batch into batcher->items: whole groups in this pass's order, each followed by up to
 * `neighbours` of its nearest groups not in the batch yet (drawn from the batch's own random stream),
 * until `batch` items; an item of several groups taken once. A group the pass order reaches that a
 * neighbour draw already put in this batch is passed over. */
static int batcher_next(batcher_t *batcher) {
    manifest_t const *manifest = batcher->manifest;
    size_t const groups = manifest->groups_count;
    batcher->count = 0;
    batcher->taken_count = 0;
    batcher->batches++;
    random_stream_t near;
    random_stream_seed(&near, batcher->seed, NEAREST_STREAM, batcher->batches);
    for (size_t drawn = 0; drawn < groups && batcher->count < batcher->batch; ++drawn) {
        if (batcher->position == groups) {
            random_stream_t random;
            random_stream_seed(&random, batcher->seed, BATCH_STREAM, batcher->pass++);
            for (size_t g = 0; g < groups; ++g)
                batcher->order[g] = g;
            for (size_t g = groups - 1; g > 0; --g) { /* Fisher-Yates */
                size_t other = random_stream_below(&random, g + 1), kept = batcher->order[g];
                batcher->order[g] = batcher->order[other];
                batcher->order[other] = kept;
            }
            batcher->position = 0;
        }
        size_t group = batcher->order[batcher->position++];
        if (batcher->taken[group] == batcher->batches) continue;
        int code = batcher_take(batcher, group);
        size_t const *nearest = batcher->nearest ? batcher->nearest + group * NEAREST : NULL;
        for (size_t brought = 0; code == COMMAND_OK && nearest && brought < batcher->neighbours &&
                                 batcher->count < batcher->batch;) {
            size_t free_count = 0; /* the nearest groups not in the batch yet */
            for (size_t j = 0; j < NEAREST; ++j)
                free_count += nearest[j] != SIZE_MAX && batcher->taken[nearest[j]] != batcher->batches;
            if (free_count == 0) break;
            size_t pick = random_stream_below(&near, free_count);
            for (size_t j = 0; j < NEAREST; ++j)
                if (nearest[j] != SIZE_MAX && batcher->taken[nearest[j]] != batcher->batches && pick-- == 0) {
                    code = batcher_take(batcher, nearest[j]);
                    ++brought;
                    break;
                }
        }
        if (code != COMMAND_OK) return code;
    }
    return COMMAND_OK;
}

/* The items [*first, *last) of the batch that process `rank` of a mesh of `size` steps on: whole groups,
 * the group whose first item is item i going to process i * size / count, so that the shares follow the
 * batch's order and every process can tell every other's. */
static void batch_share(batcher_t const *batcher, size_t rank, size_t size, size_t *first, size_t *last) {
    *first = *last = batcher->count;
    for (size_t k = batcher->taken_count; k-- > 0;) {
        size_t start = batcher->taken_first[k], owner = start * size / batcher->count;
        if (owner > rank) *first = *last = start;
        if (owner == rank) *first = start;
    }
}

/* Whether every process of the mesh has items in this batch. */
static bool batch_spreads(batcher_t const *batcher, size_t size) {
    for (size_t rank = 0; rank < size; ++rank) {
        size_t first = 0, last = 0;
        batch_share(batcher, rank, size, &first, &last);
        if (first == last) return false;
    }
    return true;
}

/* What one step hands the trainer: the items' modalities and bytes, and every related pair. */
typedef struct step_inputs {
    size_t *offsets;              /* [items_capacity + 1], the block `modalities` follows in */
    uform_modality_t *modalities; /* [items_capacity] */
    char *bytes;
    size_t length, bytes_capacity, items_capacity;
    uint32_t *relations;
    size_t relations_count, relations_capacity;
} step_inputs_t;

static void step_inputs_release(step_inputs_t *inputs) {
    free(inputs->offsets);
    free(inputs->bytes);
    free(inputs->relations);
    *inputs = (step_inputs_t){0};
}

/* The related pairs of the batch's items [first, last) into inputs->relations, indices from `first`. */
static int step_relations(step_inputs_t *inputs, manifest_t const *manifest, batcher_t const *batcher,
                          bool strict, size_t first, size_t last) {
    size_t const count = last - first, *items = batcher->items + first;
    inputs->relations_count = 0;
    for (size_t i = 0; i < count; ++i)
        for (size_t j = i + 1; j < count; ++j) {
            bool related = strict ? manifest_related(manifest, items[i], items[j])
                                  : manifest_alike(manifest, items[i], items[j]);
            if (!related) continue;
            if (inputs->relations_count == inputs->relations_capacity) {
                size_t capacity = inputs->relations_capacity ? 2 * inputs->relations_capacity : 256;
                uint32_t *grown = realloc(inputs->relations, 2 * capacity * sizeof *grown);
                if (!grown) return fail_below("out of memory for a batch's relations");
                inputs->relations = grown;
                inputs->relations_capacity = capacity;
            }
            inputs->relations[2 * inputs->relations_count] = (uint32_t)i;
            inputs->relations[2 * inputs->relations_count + 1] = (uint32_t)j;
            inputs->relations_count++;
        }
    return COMMAND_OK;
}

/* The modalities, contents and related pairs of the batch's items [first, last) into `inputs`, their
 * media files read. */
static int step_inputs_fill(step_inputs_t *inputs, manifest_t const *manifest, batcher_t const *batcher,
                            bool strict, size_t first, size_t last) {
    size_t const count = last - first;
    if (count > inputs->items_capacity) {
        free(inputs->offsets);
        inputs->offsets = malloc((count + 1) * sizeof *inputs->offsets + count * sizeof *inputs->modalities);
        inputs->modalities = inputs->offsets ? (uform_modality_t *)(inputs->offsets + count + 1) : NULL;
        inputs->items_capacity = inputs->offsets ? count : 0;
        if (!inputs->items_capacity) return fail_below("out of memory for a batch of %zu items", count);
    }
    inputs->length = 0;
    inputs->offsets[0] = 0;
    for (size_t i = 0; i < count; ++i) {
        manifest_item_t const *item = &manifest->items[batcher->items[first + i]];
        inputs->modalities[i] = item->modality;
        if (item->modality == UFORM_MODALITY_TEXT) {
            if (!command_reserve(&inputs->bytes, &inputs->bytes_capacity, inputs->length + item->length + 1,
                                 1 << 16))
                return fail_below("out of memory for a batch");
            memcpy(inputs->bytes + inputs->length, item->bytes, item->length);
            inputs->length += item->length;
        } else {
            int error =
                manifest_read_file(item->bytes, &inputs->bytes, &inputs->length, &inputs->bytes_capacity);
            if (error)
                return fail_below("%s line %zu: cannot read %s: %s", manifest->path, item->line, item->bytes,
                                  strerror(error));
        }
        inputs->offsets[i + 1] = inputs->length;
    }
    return step_relations(inputs, manifest, batcher, strict, first, last);
}

/* The trainer's view of the `count` items that step_inputs_fill put in `inputs`. */
static void step_inputs_hand(step_inputs_t const *inputs, size_t count, uform_trainer_step_args_t *args) {
    args->modalities = inputs->modalities;
    args->contents = (uform_tape_t){
        .data = inputs->bytes, .offsets = inputs->offsets, .count = count, .length = inputs->length};
    args->relations = inputs->relations;
    args->relations_count = inputs->relations_count;
}

/* --dry-run: the batches of steps (step, total], one JSON line each on stdout. */
static int print_batches(manifest_t const *manifest, batcher_t *batcher, step_inputs_t *inputs, size_t step,
                         size_t total, bool strict) {
    int code = COMMAND_OK;
    for (; step < total && code == COMMAND_OK; ++step) {
        if ((code = batcher_next(batcher)) != COMMAND_OK) break;
        /* Relations only: the texts and files are not read. */
        if ((code = step_relations(inputs, manifest, batcher, strict, 0, batcher->count)) != COMMAND_OK)
            break;
        json_t *line = json_pack("{s:I, s:[], s:[], s:[]}", "step", (json_int_t)(step + 1), "groups", "lines",
                                 "related");
        bool built = line != NULL;
        json_t *names = json_object_get(line, "groups"), *lines = json_object_get(line, "lines"),
               *related = json_object_get(line, "related");
        for (size_t i = 0; i < batcher->count && built; ++i) {
            manifest_item_t const *item = &manifest->items[batcher->items[i]];
            built = json_array_append_new(lines, json_integer((json_int_t)item->line)) == 0;
        }
        for (size_t k = 0; k < batcher->taken_count && built; ++k)
            built = json_array_append_new(names,
                                          json_string(manifest->group_names[batcher->taken_order[k]])) == 0;
        for (size_t r = 0; r < inputs->relations_count && built; ++r)
            built = json_array_append_new(related, json_pack("[I, I]", (json_int_t)inputs->relations[2 * r],
                                                             (json_int_t)inputs->relations[2 * r + 1])) == 0;
        char *text = built ? json_dumps(line, JSON_COMPACT) : NULL;
        if (text) {
            printf("%s\n", text);
        } else {
            code = command_fail("out of memory");
        }
        free(text);
        json_decref(line);
    }
    if (code == COMMAND_OK && fflush(stdout) != 0) code = command_fail("cannot write the batches");
    return code;
}

/* ---- the command ------------------------------------------------------------------------------ */

static double seconds_between(struct timespec const *from, struct timespec const *to) {
    return (double)(to->tv_sec - from->tv_sec) + (double)(to->tv_nsec - from->tv_nsec) * 1e-9;
}

static int save(uform_trainer_t *trainer, uform_executor_t *executor, char const *path) {
    uform_trainer_save_args_t args = {.trainer = trainer, .executor = executor, .path = path};
    if (uform_trainer_save(&args) == UFORM_OK) return COMMAND_OK;
    end_line();
    return command_fail_engine();
}

/* ---- meshes ----------------------------------------------------------------------------------- */

/* Whether a launcher started this process as one of several (Open MPI's mpirun, or a PMI/PMIx one such
 * as Slurm's srun --mpi). */
static bool launched(void) {
    char const *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; ++i)
        if (getenv(sizes[i])) return true;
    return false;
}

/* This process's rank on its node, as the launcher says (0 when none does). */
static size_t local_rank(void) {
    char const *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) {
        uint64_t rank = 0;
        char const *value = getenv(names[i]);
        if (value && command_parse_u64(value, &rank) == 0 && rank < DEVICES_PROBED) return (size_t)rank;
    }
    return 0;
}

/* The executor --device names (under a launcher, plain `cuda` is device `local rank`), the mesh of the
 * run when launched as one of several processes, and a trainer on them. */
static int trainer_make(train_flags_t *flags, uform_executor_t **executor, uform_mesh_t **mesh,
                        uform_trainer_t **trainer) {
    uform_trainer_init_args_t init = {.config = &flags->config, .trainer = trainer};
    uform_status_t status;
    if (flags->ordinal >= 0) {
        size_t device = (size_t)flags->ordinal + (flags->device_given ? 0 : local_rank());
        uform_vram_options_t options = {.devices = &device, .devices_count = 1};
        status = uform_executor_create_vram(&options, executor);
    } else {
        uform_ram_options_t options = uform_ram_options_default();
        options.threads = flags->threads;
        status = uform_executor_create_ram(&options, executor);
    }
    init.executor = *executor;
    if (status == UFORM_OK && launched()) {
        uform_mesh_bootstrap_args_t bootstrap = {.executor = *executor, .mesh = mesh};
        status = uform_mesh_bootstrap(&bootstrap);
        flags->config.mesh = *mesh;
    }
    if (status == UFORM_OK)
        status = flags->ordinal >= 0 ? uform_trainer_init_vram(&init) : uform_trainer_init_ram(&init);
    return status == UFORM_OK ? COMMAND_OK : command_fail_engine();
}

/* Under a mesh, a Ctrl-C cancels the next step on the process that saw it, which cancels it on every
 * other: all stop after the same step. */
static uform_continuation_t cancel_when_interrupted(void *state, size_t completed, size_t total) {
    (void)state, (void)completed, (void)total;
    return interrupted ? UFORM_CANCEL : UFORM_CONTINUE;
}

int command_train(int argc, char **argv) {
    train_flags_t flags = {.steps = 1000, .batch = 32};
    uform_trainer_config_default(&flags.config);
    manifest_t manifest = {0};
    batcher_t batcher = {0};
    step_inputs_t inputs = {0};
    uform_executor_t *executor = NULL;
    uform_mesh_t *mesh = NULL;
    uform_trainer_t *trainer = NULL;
    bool terminal = isatty(STDERR_FILENO);
    struct sigaction previous, handler = {.sa_handler = on_interrupt};
    bool handling = false;
    int code = COMMAND_OK;

    if ((code = parse_flags(argc, argv, &flags)) != COMMAND_OK || flags.help) return code;
    if ((code = manifest_read(flags.data, &manifest)) != COMMAND_OK) return code;
    if (manifest.count > UINT32_MAX) {
        code = command_fail("%s holds more than 2^32 items", flags.data);
        goto done;
    }
    size_t schedule_end = 0, step = flags.resume ? resumed_step(flags.resume, &schedule_end) : 0;
    if (step >= flags.steps) {
        code = command_fail("%s is at step %zu already: pass a --steps above it", flags.resume, step);
        goto done;
    }
    if (schedule_end && flags.steps > schedule_end) { /* its steps past the end would change nothing */
        code = command_fail("%s's learning rate decays to 0 at step %zu, where the run it continues ends: "
                            "pass a --steps of at most %zu, or start a new run",
                            flags.resume, schedule_end, schedule_end);
        goto done;
    }
    if ((code = batcher_open(&batcher, &manifest, flags.config.seed, flags.batch, flags.neighbours)) !=
        COMMAND_OK)
        goto done;
    for (size_t skipped = 0; skipped < step; ++skipped) /* the batches the resumed run already took */
        if ((code = batcher_next(&batcher)) != COMMAND_OK) goto done;
    if (flags.dry_run) {
        code = print_batches(&manifest, &batcher, &inputs, step, flags.steps, flags.strict);
        goto done;
    }

    if ((code = trainer_make(&flags, &executor, &mesh, &trainer)) != COMMAND_OK) goto done;
    size_t const rank = uform_mesh_rank(mesh), size = uform_mesh_size(mesh);
    bool const meshed = size > 1, speaks = rank == 0; /* one progress line for the run: the first's */
    uform_progress_t const cancelling = {.handler = cancel_when_interrupted};

    sigemptyset(&handler.sa_mask);
    handler.sa_flags = SA_RESTART;
    handling = sigaction(SIGINT, &handler, &previous) == 0;
    size_t saved_at = step;
    bool save_failed = false; /* reported once: the same save is not tried again at the end */
    /* Under a mesh an interruption is seen through the next step, cancelled on every process alike. */
    while (step < flags.steps && (meshed || !interrupted)) {
        if ((code = batcher_next(&batcher)) != COMMAND_OK) break;
        size_t first = 0, last = batcher.count;
        if (meshed && !batch_spreads(&batcher, size)) { /* every process finds it so */
            code = fail_below("a batch of %zu groups has fewer than one for each of the %zu processes: raise "
                              "--batch",
                              batcher.taken_count, size);
            break;
        }
        if (meshed) batch_share(&batcher, rank, size, &first, &last);
        if ((code = step_inputs_fill(&inputs, &manifest, &batcher, flags.strict, first, last)) != COMMAND_OK)
            break;
        uform_trainer_step_stats_t stats = {0};
        uform_trainer_step_args_t args = {.trainer = trainer, .executor = executor, .stats = &stats};
        if (meshed) args.progress = &cancelling;
        step_inputs_hand(&inputs, last - first, &args);
        struct timespec started, finished;
        clock_gettime(CLOCK_MONOTONIC, &started);
        if (uform_trainer_step(&args) != UFORM_OK) {
            if (meshed && uform_last_error().status == UFORM_CANCELLED) {
                interrupted = 1; /* here or on another process: the run stops after the last step */
                break;
            }
            end_line();
            code = command_fail_engine();
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &finished);
        double seconds = seconds_between(&started, &finished);
        step = stats.step;
        if (speaks) {
            fprintf(stderr, "%sstep %zu/%zu loss %.4f contrastive %.4f lm %.4f lr %.3g %.1f items/s%s",
                    terminal ? "\r\033[K" : "", step, flags.steps, stats.loss, stats.contrastive_loss,
                    stats.lm_loss, stats.learning_rate, seconds > 0 ? (double)batcher.count / seconds : 0.0,
                    terminal ? "" : "\n");
            fflush(stderr);
            line_drawn = terminal;
        }
        if (flags.save_every && step % flags.save_every == 0 && step < flags.steps) {
            save_failed = (code = save(trainer, executor, flags.out)) != COMMAND_OK;
            if (save_failed) break;
            saved_at = step;
        }
    }
    end_line();
    /* Whatever stopped the loop, steps taken since the last save are kept: an engine error leaves the
     * trainer as it was before the failed step. */
    if (!save_failed && (step > saved_at || (code == COMMAND_OK && saved_at == step))) {
        int saved = save(trainer, executor, flags.out);
        if (code == COMMAND_OK) code = saved;
    }
    if (code == COMMAND_OK && interrupted)
        code = command_fail("interrupted after step %zu of %zu; saved %s", step, flags.steps, flags.out);
    else if (code == COMMAND_OK && speaks)
        fprintf(stderr, "uform: saved %s at step %zu\n", flags.out, step);

done:
    if (handling) sigaction(SIGINT, &previous, NULL);
    uform_trainer_free(trainer);
    uform_mesh_free(mesh);
    uform_executor_free(executor);
    step_inputs_release(&inputs);
    batcher_close(&batcher);
    manifest_free(&manifest);
    return code;
}
