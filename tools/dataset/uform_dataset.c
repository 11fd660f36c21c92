/* uform dataset synth --out DIR [...]: a seeded procedural multimodal dataset for training the demo
 * model. Images of one shape, clips of a moving shape and sounds, each a group with two captions, in
 * JSONL manifests split so that the test part holds only attribute combinations never seen in training.
 * What one sample draws depends only on the seed, its modality and its index, so a run is byte for byte
 * the same for a seed. The drawing, the clips and the sounds are in uform_dataset_{image,video,sound}.c. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "uform_command.h"
#include "uform_dataset.h"

static char const help[] =
    "usage: uform dataset <tool> [options]\n"
    "\n"
    "tools:\n"
    "  synth --out DIR   write a seeded procedural dataset of images, clips and sounds with\n"
    "                    their captions, split into train and test manifests\n"
    "\n"
    "'uform dataset <tool> --help' describes a tool.\n";

static char const synth_help_head[] =
    "usage: uform dataset synth --out DIR [--seed N] [--images N] [--videos N] [--sounds N]\n"
    "                           [--image-size N] [--video-frames N] [--audio-rate N]\n"
    "                           [--test-fraction F] [--force]\n"
    "\n"
    "Writes a seeded procedural multimodal dataset for training: images of one shape, clips of a moving\n"
    "shape and short sounds, each with two captions. The same seed and options write the same bytes.\n"
    "\n";

static char const synth_help_tail[] =
    "\n"
    "DIR/train.jsonl and DIR/test.jsonl hold one item a line:\n"
    "  {\"modality\": \"text\", \"text\": \"a dark picture of a small red circle at the top left\",\n"
    "   \"groups\": [\"img-000123\"]}\n"
    "  {\"modality\": \"image\", \"path\": \"media/img-000123.png\", \"groups\": [\"img-000123\"],\n"
    "   \"attributes\": {...}}\n"
    "(\"video\" and \"audio\" items alike), paths relative to DIR. Each sample is one group: its media item\n"
    "and two captions, the second a paraphrase; items that share a group are related. \"attributes\" names\n"
    "what a media item shows. DIR/media/ holds the files; DIR/dataset.json the options, the counts, the\n"
    "attributes and the held-out combinations.\n"
    "\n"
    "The test part holds only attribute combinations never seen in training: a seeded eighth of the\n"
    "(colour, shape) pairs of images, of the (colour, motion) pairs of clips and of the (kind, pitch)\n"
    "pairs of sounds, chosen so that every colour, shape, motion, kind and pitch alone still occurs in\n"
    "training.\n"
    "\n"
    "A build without libspng writes no images, one without FFmpeg no clips, one without espeak-ng no\n"
    "spoken words: each says so on stderr and in dataset.json, and the rest is written. The manifests are\n"
    "written under temporary names and renamed at the end, dataset.json last: a folder with a\n"
    "dataset.json is complete. A progress line is drawn on stderr when it is a terminal.\n";

/* ---- what samples show ---------------------------------------------------------------------------- */

enum { IMAGES = 0, VIDEOS = 1, SOUNDS = 2, MODALITIES = 3 };
enum { TRAIN = 0, TEST = 1 };

static uform_modality_t const engine_modalities[MODALITIES] = {UFORM_MODALITY_IMAGE, UFORM_MODALITY_VIDEO,
                                                               UFORM_MODALITY_AUDIO};
static char const *const count_names[MODALITIES] = {"images", "videos", "sounds"};
static char const *const group_prefixes[MODALITIES] = {"img", "vid", "snd"};
static char const *const extensions[MODALITIES] = {"png", "mp4", "wav"};
static char const *const split_names[2] = {"train", "test"};

/* Streams of the generator: one per modality's samples, one per modality's held-out choice. */
enum { STREAM_SAMPLES = 1, STREAM_HELD_OUT = 16 };

typedef struct colour {
    char const *name;
    uint8_t rgb[3];
} colour_t;

enum { COLOURS = 8, SIZES = 3, POSITIONS = 9, BACKGROUNDS = 3, MOTIONS = 6 };

static colour_t const colours[COLOURS] = {
    {"red", {220, 40, 40}},     {"orange", {245, 140, 30}}, {"yellow", {240, 220, 40}},
    {"green", {50, 180, 60}},   {"cyan", {40, 200, 210}},   {"blue", {40, 80, 225}},
    {"purple", {140, 60, 200}}, {"pink", {245, 125, 185}},
};

static struct {
    char const *name;
    double radius; /* of the side */
} const sizes[SIZES] = {{"small", 0.10}, {"medium", 0.16}, {"large", 0.23}};

/* A position as the first caption says it, its name (the "position" attribute), and its column and row
 * as the second caption says them (a word each, both always there: "centre" and "middle" differ). */
static struct {
    char const *phrase, *name, *column, *row;
    double x, y; /* of the side */
} const positions[POSITIONS] = {
    {"at the top left", "top left", "left", "top", 0.28, 0.28},
    {"at the top", "top centre", "centre", "top", 0.5, 0.28},
    {"at the top right", "top right", "right", "top", 0.72, 0.28},
    {"on the left", "centre left", "left", "middle", 0.28, 0.5},
    {"in the centre", "centre", "centre", "middle", 0.5, 0.5},
    {"on the right", "centre right", "right", "middle", 0.72, 0.5},
    {"at the bottom left", "bottom left", "left", "bottom", 0.28, 0.72},
    {"at the bottom", "bottom centre", "centre", "bottom", 0.5, 0.72},
    {"at the bottom right", "bottom right", "right", "bottom", 0.72, 0.72},
};

static struct {
    char const *name;
    uint8_t level;
} const backgrounds[BACKGROUNDS] = {{"dark", 30}, {"grey", 128}, {"light", 225}};

static struct {
    char const *name, *paraphrase;
} const motions[MOTIONS] = {
    {"moving left", "slides to the left"}, {"moving right", "slides to the right"},
    {"moving up", "slides upwards"},       {"moving down", "slides downwards"},
    {"growing", "getting bigger"},         {"shrinking", "getting smaller"},
};

/* "a" or "an", by the word that follows. */
static char const *article(char const *word) {
    return strchr("aeiou", word[0]) ? "an" : "a";
}

/* How a register reads in a caption: "a low tone", "a mid-range tone", "a high tone". */
static char const *const pitch_adjectives[DATASET_PITCHES] = {"low", "mid-range", "high"};

/* ---- held-out combinations -------------------------------------------------------------------------- */

enum { MAX_COMBINATIONS = 64 };

/* Pairs of two attributes, rows by columns (colour by shape, colour by motion, kind by pitch), and which
 * of them are held out for test. */
typedef struct combinations {
    size_t rows, columns, held_count;
    bool held[MAX_COMBINATIONS];
} combinations_t;

static void shuffle(size_t *order, size_t count, random_stream_t *random) {
    for (size_t i = 0; i < count; ++i)
        order[i] = i;
    for (size_t i = count; i > 1; --i) {
        size_t j = random_stream_below(random, i), swap = order[i - 1];
        order[i - 1] = order[j];
        order[j] = swap;
    }
}

/* An eighth of the pairs (at least one), along a seeded diagonal: pair k is (row order[k mod rows],
 * column order[k mod columns]) in shuffled orders. While the count is at most the larger side, no row
 * and no column is held out twice, so every attribute alone keeps pairs in training. */
static void choose_held_out(uint64_t seed, size_t modality, size_t rows, size_t columns,
                            combinations_t *pairs) {
    *pairs = (combinations_t){.rows = rows, .columns = columns};
    random_stream_t random;
    random_stream_seed(&random, seed, STREAM_HELD_OUT + modality, 0);
    size_t row_order[MAX_COMBINATIONS], column_order[MAX_COMBINATIONS];
    shuffle(row_order, rows, &random);
    shuffle(column_order, columns, &random);
    size_t count = (rows * columns + 4) / 8;
    for (size_t k = 0; k < (count ? count : 1); ++k)
        pairs->held[row_order[k % rows] * columns + column_order[k % columns]] = true;
    for (size_t i = 0; i < rows * columns; ++i)
        pairs->held_count += pairs->held[i];
}

/* A pair drawn uniformly from the held-out ones (test) or the others (train). */
static size_t draw_pair(combinations_t const *pairs, bool test, random_stream_t *random) {
    size_t total = pairs->rows * pairs->columns;
    size_t skip = random_stream_below(random, test ? pairs->held_count : total - pairs->held_count);
    for (size_t i = 0; i < total; ++i)
        if (pairs->held[i] == test && skip-- == 0) return i;
    return 0; /* not reached: the counts above are exact */
}

/* Whether sample `index` of `count` goes to test, `tests` of them spread evenly. */
static bool goes_to_test(size_t index, size_t count, size_t tests) {
    return (uint64_t)(index + 1) * tests / count > (uint64_t)index * tests / count;
}

/* ---- the run ------------------------------------------------------------------------------------------ */

typedef struct synth_flags {
    char const *out;
    uint64_t seed;
    size_t counts[MODALITIES];
    size_t image_size, video_frames, audio_rate;
    double test_fraction;
    bool force, help;
} synth_flags_t;

enum { VIDEO_FPS = 8, CAPTION_CAPACITY = 192, PATH_CAPACITY = 4096 };

/* One sample as the manifest lists it. */
typedef struct sample {
    char group[32], path[64]; /* path relative to the folder */
    char captions[2][CAPTION_CAPACITY];
    json_t *attributes; /* owned */
} sample_t;

typedef struct synth {
    synth_flags_t flags;
    char const *unwritten[MODALITIES]; /* why a modality asked for is not written, or NULL */
    char const *speech_unbuilt;
    dataset_sound_kind_t kinds[DATASET_SOUND_KINDS]; /* the kinds of sound written */
    size_t kind_count;
    combinations_t pairs[MODALITIES];
    size_t written[MODALITIES][2], items[2]; /* samples by modality and split; manifest lines */
    char folder[PATH_CAPACITY];
    char manifests[2][PATH_CAPACITY], partial[2][PATH_CAPACITY];
    FILE *files[2];
    uint8_t *pixels; /* video_frames frames of image_size^2 RGB8 */
    float *samples;  /* audio_rate samples */
    progress_t progress;
} synth_t;

/* `folder/name` into `path`, or an error when it does not fit. */
static int join_path(char *path, char const *folder, char const *name) {
    int length = snprintf(path, PATH_CAPACITY, "%s/%s", folder, name);
    if (length < 0 || length >= PATH_CAPACITY)
        return command_fail("the path %s/%s is too long", folder, name);
    return COMMAND_OK;
}

static command_help_t const synth_help = {
    .name = "dataset synth", .head = synth_help_head, .tail = synth_help_tail, .column = 22};

static int parse_flags(int argc, char **argv, synth_flags_t *flags) {
    *flags = (synth_flags_t){.seed = 42,
                             .counts = {4000, 1000, 1000},
                             .image_size = 64,
                             .video_frames = 8,
                             .audio_rate = 16000,
                             .test_fraction = 0.1};
    command_flag_t const table[] = {
        {"--out", FLAG_STRING, &flags->out, .value = "DIR",
         .help = "the folder to write, created (its parent must exist); an existing one must\n"
                 "be empty, unless --force",
         .required = "--out DIR is missing"},
        {"--force", FLAG_SWITCH, &flags->force,
         .help = "write into a folder that is not empty: its manifests and dataset.json are\n"
                 "replaced, and the media a previous run wrote there (media/img-*.png,\n"
                 "media/vid-*.mp4, media/snd-*.wav) are removed first; other files stay"},
        {"--seed", FLAG_U64, &flags->seed, .value = "N", .maximum = INT64_MAX,
         .help = "the seed, below 2^63 (default 42)"},
        {"--images", FLAG_SIZE, &flags->counts[IMAGES], .value = "N", .maximum = 100000000,
         .help = "PNG images (default 4000): one shape (circle, square, triangle, diamond,\n"
                 "star, cross, ring, hexagon) in one of 8 colours, small, medium or large, at\n"
                 "one of 9 positions, over a plain or lightly noised dark, grey or light ground\n"
                 "(the captions name the ground, not the noise)"},
        {"--videos", FLAG_SIZE, &flags->counts[VIDEOS], .value = "N", .maximum = 100000000,
         .help = "clips (default 1000), MPEG-4 Part 2 in MP4 at 8 frames a second: a shape of\n"
                 "a colour moving left, right, up or down, growing or shrinking"},
        {"--sounds", FLAG_SIZE, &flags->counts[SOUNDS], .value = "N", .maximum = 100000000,
         .help = "sounds (default 1000), 1 s of 16-bit PCM mono WAV: a tone, a major or minor\n"
                 "chord, a burst of noise, a slow or fast rhythm of beeps, each low, middle or\n"
                 "high; and spoken words (a low, middle or high voice) where the build has\n"
                 "espeak-ng"},
        {"--image-size", FLAG_SIZE, &flags->image_size, .value = "N", .minimum = 16, .maximum = 1024,
         .help = "the side of images and frames in pixels, even, 16 to 1024 (default 64)"},
        {"--video-frames", FLAG_SIZE, &flags->video_frames, .value = "N", .minimum = 2, .maximum = 240,
         .help = "frames of a clip, 2 to 240 (default 8)"},
        {"--audio-rate", FLAG_SIZE, &flags->audio_rate, .value = "N", .minimum = 8000, .maximum = 96000,
         .help = "the sample rate of sounds, 8000 to 96000 (default 16000)"},
        {"--test-fraction", FLAG_REAL, &flags->test_fraction, .value = "F", .real_maximum = 0.9,
         .help = "the part of each modality's samples that goes to test, 0 to 0.9 (default 0.1)"},
        {NULL},
    };
    command_spec_t const spec = {.help = &synth_help, .flags = table};
    int code = command_flags_parse(&spec, argc, argv, &flags->help);
    if (code != COMMAND_OK || flags->help) return code;
    if (flags->image_size % 2)
        return command_usage(synth_help.name, "--image-size takes an even number, not %zu",
                             flags->image_size);
    if (!flags->counts[IMAGES] && !flags->counts[VIDEOS] && !flags->counts[SOUNDS])
        return command_usage(synth_help.name, "--images, --videos and --sounds are all 0: nothing to write");
    return COMMAND_OK;
}

/* ---- the folder ---------------------------------------------------------------------------------------- */

/* Whether `name` is one a run writes in media/: img-N.png, vid-N.mp4 or snd-N.wav. */
static bool is_sample_name(char const *name) {
    for (size_t m = 0; m < MODALITIES; ++m) {
        if (strncmp(name, group_prefixes[m], 3) != 0 || name[3] != '-') continue;
        char const *digits = name + 4, *at = digits;
        while (*at >= '0' && *at <= '9')
            ++at;
        if (at > digits && at[0] == '.' && !strcmp(at + 1, extensions[m])) return true;
    }
    return false;
}

/* Whether the folder holds anything; -1 when it cannot be read. */
static int folder_is_empty(char const *folder) {
    DIR *directory = opendir(folder);
    if (!directory) return -1;
    struct dirent *entry = NULL;
    int empty = 1;
    while (empty && (entry = readdir(directory)) != NULL)
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) empty = 0;
    closedir(directory);
    return empty;
}

/* Removes the media a previous run left in `media`. */
static int remove_previous_media(char const *media) {
    DIR *directory = opendir(media);
    if (!directory) return command_fail("cannot read %s: %s", media, strerror(errno));
    int code = COMMAND_OK;
    struct dirent *entry = NULL;
    char path[PATH_CAPACITY];
    while (code == COMMAND_OK && (entry = readdir(directory)) != NULL) {
        if (!is_sample_name(entry->d_name)) continue;
        if ((code = join_path(path, media, entry->d_name)) != COMMAND_OK) break;
        if (unlink(path) != 0) code = command_fail("cannot remove %s: %s", path, strerror(errno));
    }
    closedir(directory);
    return code;
}

/* Makes DIR and DIR/media, or checks that DIR is empty (or clears the previous media with --force). */
static int prepare_folder(synth_t *synth) {
    char const *out = synth->flags.out;
    struct stat status;
    if (stat(out, &status) == 0) {
        if (!S_ISDIR(status.st_mode)) return command_fail("%s exists and is not a folder", out);
        int empty = folder_is_empty(out);
        if (empty < 0) return command_fail("cannot read %s: %s", out, strerror(errno));
        if (!empty && !synth->flags.force)
            return command_fail("%s is not empty: choose another --out, or pass --force to write into it",
                                out);
    } else if (errno != ENOENT) {
        return command_fail("cannot use %s: %s", out, strerror(errno));
    } else if (mkdir(out, 0755) != 0) {
        return command_fail("cannot create %s: %s", out, strerror(errno));
    }
    int code = join_path(synth->folder, out, "media");
    if (code != COMMAND_OK) return code;
    if (mkdir(synth->folder, 0755) != 0) {
        if (errno != EEXIST || stat(synth->folder, &status) != 0 || !S_ISDIR(status.st_mode))
            return command_fail("cannot create %s: %s", synth->folder,
                                strerror(errno == EEXIST ? ENOTDIR : errno));
        if ((code = remove_previous_media(synth->folder)) != COMMAND_OK) return code;
    }
    for (size_t split = 0; split < 2; ++split) {
        char name[32];
        snprintf(name, sizeof name, "%s.jsonl", split_names[split]);
        if ((code = join_path(synth->manifests[split], out, name)) != COMMAND_OK) return code;
        snprintf(name, sizeof name, "%s.jsonl.partial", split_names[split]);
        if ((code = join_path(synth->partial[split], out, name)) != COMMAND_OK) return code;
        synth->files[split] = fopen(synth->partial[split], "w");
        if (!synth->files[split])
            return command_fail("cannot create %s: %s", synth->partial[split], strerror(errno));
    }
    return COMMAND_OK;
}

/* ---- the manifests --------------------------------------------------------------------------------------
 */

static int write_line(synth_t *synth, size_t split, json_t *item) {
    if (!item) return command_fail("out of memory");
    FILE *file = synth->files[split];
    bool failed = json_dumpf(item, file, JSON_PRESERVE_ORDER) != 0 || fputc('\n', file) == EOF;
    json_decref(item);
    if (failed) return command_fail("cannot write %s: %s", synth->partial[split], strerror(errno));
    ++synth->items[split];
    return COMMAND_OK;
}

/* The sample's media item, then its captions, each a line of the split's manifest. */
static int write_sample(synth_t *synth, size_t modality, size_t split, sample_t *sample) {
    json_t *item =
        json_pack("{s:s, s:s, s:[s], s:O}", "modality", command_modality_names[engine_modalities[modality]],
                  "path", sample->path, "groups", sample->group, "attributes", sample->attributes);
    int code = write_line(synth, split, item);
    for (size_t i = 0; i < 2 && code == COMMAND_OK; ++i)
        code = write_line(synth, split,
                          json_pack("{s:s, s:s, s:[s]}", "modality", "text", "text", sample->captions[i],
                                    "groups", sample->group));
    return code;
}

/* ---- the samples ------------------------------------------------------------------------------------------
 */

static void jitter_colour(colour_t const *colour, random_stream_t *random, uint8_t rgb[3]) {
    for (size_t c = 0; c < 3; ++c) {
        double value = colour->rgb[c] + random_stream_between(random, -12, 12);
        rgb[c] = (uint8_t)(value < 0 ? 0 : value > 255 ? 255 : lround(value));
    }
}

/* The background of a sample: one of three greys, plain or with noise of amplitude 5 to 12. The captions
 * name the grey, not the noise: grain of a few levels is a nuisance the towers should ignore (at the
 * half size they see it is about 1 to 2 levels deep), not something a caption can ask them to find. */
static size_t draw_background(random_stream_t *random, dataset_background_t *background, bool *noisy) {
    size_t which = random_stream_below(random, BACKGROUNDS);
    *noisy = random_stream_below(random, 2);
    *background = (dataset_background_t){.level = backgrounds[which].level,
                                         .noise = *noisy ? random_stream_between(random, 5, 12) : 0};
    return which;
}

static int synth_image(synth_t *synth, random_stream_t *random, bool test, char const *path,
                       sample_t *sample) {
    size_t side = synth->flags.image_size;
    size_t pair = draw_pair(&synth->pairs[IMAGES], test, random);
    size_t colour = pair / DATASET_SHAPES, shape = pair % DATASET_SHAPES;
    size_t size = random_stream_below(random, SIZES), position = random_stream_below(random, POSITIONS);
    dataset_background_t background;
    bool noisy = false;
    size_t ground = draw_background(random, &background, &noisy);
    dataset_shape_t drawn = {
        .kind = (dataset_shape_kind_t)shape,
        .radius = sizes[size].radius * (double)side * random_stream_between(random, 0.92, 1.08),
        .x = (positions[position].x + random_stream_between(random, -0.02, 0.02)) * (double)side,
        .y = (positions[position].y + random_stream_between(random, -0.02, 0.02)) * (double)side,
        .angle = random_stream_between(random, -0.2, 0.2),
    };
    jitter_colour(&colours[colour], random, drawn.rgb);
    dataset_draw(synth->pixels, side, &background, &drawn, random);

    /* Both captions name the ground: the loss relates the two captions of a sample as well as each to
     * the image, so a caption silent on the ground would pull the other's ground out of its embedding.
     * Each half of the position ends one caption, the column the first ("at the top left") and the row
     * the second ("left, top"): a text's embedding is its last byte's state, and a two-block byte model
     * learns the word there long before one in the middle or the first of two words at the end. */
    snprintf(sample->captions[0], CAPTION_CAPACITY, "a %s picture of a %s %s %s %s", backgrounds[ground].name,
             sizes[size].name, colours[colour].name, dataset_shape_names[shape], positions[position].phrase);
    snprintf(sample->captions[1], CAPTION_CAPACITY, "%s %s %s, %s, %s background, %s, %s",
             article(colours[colour].name), colours[colour].name, dataset_shape_names[shape],
             sizes[size].name, backgrounds[ground].name, positions[position].column, positions[position].row);
    sample->attributes =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:b}", "colour", colours[colour].name, "shape",
                  dataset_shape_names[shape], "size", sizes[size].name, "position", positions[position].name,
                  "background", backgrounds[ground].name, "noise", noisy);
    if (!sample->attributes) return command_fail("out of memory");
    return dataset_png_write(path, synth->pixels, side);
}

static int synth_video(synth_t *synth, random_stream_t *random, bool test, char const *path,
                       sample_t *sample) {
    size_t side = synth->flags.image_size, frames = synth->flags.video_frames;
    size_t pair = draw_pair(&synth->pairs[VIDEOS], test, random);
    size_t colour = pair / MOTIONS, motion = pair % MOTIONS,
           shape = random_stream_below(random, DATASET_SHAPES);
    dataset_background_t background;
    bool noisy = false;
    draw_background(random, &background, &noisy);
    /* Where the shape starts and ends, in parts of the side, and its radius at both ends. */
    double from = random_stream_between(random, 0.72, 0.78), to = random_stream_between(random, 0.22, 0.28);
    double across = random_stream_between(random, 0.3, 0.7),
           radius = random_stream_between(random, 0.1, 0.16);
    double x[2] = {across, across}, y[2] = {across, across}, radii[2] = {radius, radius};
    if (motion < 4) { /* left and right along x, up and down along y: the second of each pair reversed */
        double *axis = motion < 2 ? x : y;
        bool reversed = motion % 2 == 1;
        axis[0] = reversed ? to : from;
        axis[1] = reversed ? from : to;
    } else { /* growing, shrinking: near the centre */
        double small = random_stream_between(random, 0.06, 0.09),
               large = random_stream_between(random, 0.25, 0.3);
        x[0] = x[1] = random_stream_between(random, 0.42, 0.58);
        y[0] = y[1] = random_stream_between(random, 0.42, 0.58);
        radii[0] = motion == 4 ? small : large;
        radii[1] = motion == 4 ? large : small;
    }
    dataset_shape_t drawn = {.kind = (dataset_shape_kind_t)shape,
                             .angle = random_stream_between(random, -0.2, 0.2)};
    jitter_colour(&colours[colour], random, drawn.rgb);
    for (size_t f = 0; f < frames; ++f) {
        double t = (double)f / (double)(frames - 1);
        drawn.x = (x[0] + (x[1] - x[0]) * t) * (double)side;
        drawn.y = (y[0] + (y[1] - y[0]) * t) * (double)side;
        drawn.radius = (radii[0] + (radii[1] - radii[0]) * t) * (double)side;
        dataset_draw(synth->pixels + f * side * side * 3, side, &background, &drawn, random);
    }
    snprintf(sample->captions[0], CAPTION_CAPACITY, "%s %s %s %s", article(colours[colour].name),
             colours[colour].name, dataset_shape_names[shape], motions[motion].name);
    snprintf(sample->captions[1], CAPTION_CAPACITY, "%s %s %s %s", article(colours[colour].name),
             colours[colour].name, dataset_shape_names[shape], motions[motion].paraphrase);
    sample->attributes = json_pack("{s:s, s:s, s:s}", "colour", colours[colour].name, "shape",
                                   dataset_shape_names[shape], "motion", motions[motion].name);
    if (!sample->attributes) return command_fail("out of memory");
    return dataset_video_write(path, synth->pixels, frames, side, VIDEO_FPS);
}

/* The two captions of a sound. */
static void caption_sound(dataset_sound_t const *sound, sample_t *sample) {
    char const *adjective = pitch_adjectives[sound->pitch], *pitch = dataset_pitch_names[sound->pitch];
    char *first = sample->captions[0], *second = sample->captions[1];
    char label[16];
    dataset_note_label(sound->note, label, sizeof label);
    switch (sound->kind) {
    case DATASET_TONE:
        snprintf(first, CAPTION_CAPACITY, "a %s tone", adjective);
        snprintf(second, CAPTION_CAPACITY, "a pure tone at the note %s", label);
        break;
    case DATASET_CHORD: {
        char const *quality = sound->variant ? "minor" : "major", *root = dataset_note_name(sound->note);
        snprintf(first, CAPTION_CAPACITY, "a %s %s %s chord", adjective, root, quality);
        snprintf(second, CAPTION_CAPACITY, "%s %s %s chord in a %s register", article(root), root, quality,
                 pitch);
        break;
    }
    case DATASET_NOISE: {
        static char const *const colours_of_noise[DATASET_PITCHES] = {"low rumbling ", "", "high hissing "};
        static char const *const names[DATASET_PITCHES] = {"rumble", "burst of white noise", "hiss"};
        char const *length = sound->variant ? "long" : "short";
        snprintf(first, CAPTION_CAPACITY, "a %s burst of %snoise", length, colours_of_noise[sound->pitch]);
        snprintf(second, CAPTION_CAPACITY, "a %s %s", length, names[sound->pitch]);
        break;
    }
    case DATASET_RHYTHM:
        snprintf(first, CAPTION_CAPACITY, "a %s rhythm of %s beeps", sound->variant ? "fast" : "slow",
                 adjective);
        snprintf(second, CAPTION_CAPACITY, "%s repeated %s beeps", sound->variant ? "quick" : "slow",
                 adjective);
        break;
    case DATASET_SPEECH:
    case DATASET_SOUND_KINDS:
        snprintf(first, CAPTION_CAPACITY, "the spoken word %s", dataset_words[sound->word]);
        snprintf(second, CAPTION_CAPACITY, "a %svoice saying %s",
                 sound->pitch == 1   ? ""
                 : sound->pitch == 0 ? "low "
                                     : "high ",
                 dataset_words[sound->word]);
        break;
    }
}

static int synth_sound(synth_t *synth, random_stream_t *random, bool test, char const *path,
                       sample_t *sample) {
    size_t pair = draw_pair(&synth->pairs[SOUNDS], test, random);
    dataset_sound_t sound = {.kind = synth->kinds[pair / DATASET_PITCHES], .pitch = pair % DATASET_PITCHES};
    sound.note = dataset_sound_note(sound.kind, sound.pitch, random);
    sound.variant = random_stream_below(random, 2);
    sound.word = random_stream_below(random, DATASET_WORDS);
    caption_sound(&sound, sample);
    sample->attributes = json_pack("{s:s, s:s}", "kind", dataset_sound_kind_names[sound.kind], "pitch",
                                   dataset_pitch_names[sound.pitch]);
    if (!sample->attributes) return command_fail("out of memory");
    json_t *detail = NULL;
    char label[16];
    dataset_note_label(sound.note, label, sizeof label);
    switch (sound.kind) {
    case DATASET_TONE:
        detail = json_pack("{s:s}", "note", label);
        break;
    case DATASET_CHORD:
        detail = json_pack("{s:s, s:s}", "note", label, "chord", sound.variant ? "minor" : "major");
        break;
    case DATASET_NOISE:
        detail = json_pack("{s:s}", "length", sound.variant ? "long" : "short");
        break;
    case DATASET_RHYTHM:
        detail = json_pack("{s:s, s:s}", "note", label, "tempo", sound.variant ? "fast" : "slow");
        break;
    case DATASET_SPEECH:
    case DATASET_SOUND_KINDS:
        detail = json_pack("{s:s}", "word", dataset_words[sound.word]);
        break;
    }
    if (!detail || json_object_update(sample->attributes, detail) != 0) {
        json_decref(detail);
        return command_fail("out of memory");
    }
    json_decref(detail);
    size_t count = synth->flags.audio_rate; /* one second */
    int code = dataset_sound_render(&sound, synth->samples, count, synth->flags.audio_rate, random);
    if (code != COMMAND_OK) return code;
    return dataset_wav_write(path, synth->samples, count, synth->flags.audio_rate);
}

typedef int (*synth_sample_t)(synth_t *, random_stream_t *, bool, char const *, sample_t *);

/* Writes every sample of one modality and lists it in its split's manifest. */
static int synth_modality(synth_t *synth, size_t modality, size_t *done) {
    static synth_sample_t const makers[MODALITIES] = {synth_image, synth_video, synth_sound};
    size_t count = synth->flags.counts[modality];
    size_t tests = (size_t)floor((double)count * synth->flags.test_fraction + 0.5);
    char path[PATH_CAPACITY];
    int code = COMMAND_OK;
    for (size_t i = 0; i < count && code == COMMAND_OK; ++i) {
        sample_t sample = {0};
        bool test = goes_to_test(i, count, tests);
        snprintf(sample.group, sizeof sample.group, "%s-%06zu", group_prefixes[modality], i);
        snprintf(sample.path, sizeof sample.path, "media/%s.%s", sample.group, extensions[modality]);
        random_stream_t random;
        random_stream_seed(&random, synth->flags.seed, STREAM_SAMPLES + modality, i);
        if ((code = join_path(path, synth->flags.out, sample.path)) == COMMAND_OK &&
            (code = makers[modality](synth, &random, test, path, &sample)) == COMMAND_OK &&
            (code = write_sample(synth, modality, test, &sample)) == COMMAND_OK) {
            ++synth->written[modality][test];
            progress_draw(&synth->progress, ++*done, false);
        }
        json_decref(sample.attributes);
        if (code != COMMAND_OK) progress_clear(&synth->progress);
    }
    return code;
}

/* ---- dataset.json ----------------------------------------------------------------------------------------
 */

static json_t *string_array(char const *const *strings, size_t count) {
    json_t *array = json_array();
    for (size_t i = 0; array && i < count; ++i)
        if (json_array_append_new(array, json_string(strings[i])) != 0) {
            json_decref(array);
            return NULL;
        }
    return array;
}

/* {"attributes": [row, column], "combinations": [[a, b], ...]} of the held-out pairs. */
static json_t *held_out_json(combinations_t const *pairs, char const *row, char const *column,
                             char const *const *row_names, char const *const *column_names) {
    json_t *combinations = json_array();
    for (size_t i = 0; combinations && i < pairs->rows * pairs->columns; ++i) {
        if (!pairs->held[i]) continue;
        if (json_array_append_new(combinations, json_pack("[s, s]", row_names[i / pairs->columns],
                                                          column_names[i % pairs->columns])) != 0) {
            json_decref(combinations);
            return NULL;
        }
    }
    return json_pack("{s:[s, s], s:o}", "attributes", row, column, "combinations", combinations);
}

static int write_description(synth_t *synth) {
    char const *colour_names[COLOURS], *size_names[SIZES], *position_names[POSITIONS],
        *ground_names[BACKGROUNDS], *motion_names[MOTIONS], *kind_names[DATASET_SOUND_KINDS];
    for (size_t i = 0; i < COLOURS; ++i)
        colour_names[i] = colours[i].name;
    for (size_t i = 0; i < SIZES; ++i)
        size_names[i] = sizes[i].name;
    for (size_t i = 0; i < POSITIONS; ++i)
        position_names[i] = positions[i].name;
    for (size_t i = 0; i < BACKGROUNDS; ++i)
        ground_names[i] = backgrounds[i].name;
    for (size_t i = 0; i < MOTIONS; ++i)
        motion_names[i] = motions[i].name;
    for (size_t i = 0; i < synth->kind_count; ++i)
        kind_names[i] = dataset_sound_kind_names[synth->kinds[i]];
    int major = 0, minor = 0, patch = 0;
    uform_version(&major, &minor, &patch);
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", major, minor, patch);

    json_t *counts = json_object(), *unwritten = json_object();
    for (size_t m = 0; counts && unwritten && m < MODALITIES; ++m) {
        json_object_set_new(counts, count_names[m],
                            json_pack("{s:I, s:I, s:I}", "asked", (json_int_t)synth->flags.counts[m], "train",
                                      (json_int_t)synth->written[m][TRAIN], "test",
                                      (json_int_t)synth->written[m][TEST]));
        if (synth->unwritten[m])
            json_object_set_new(unwritten, count_names[m], json_string(synth->unwritten[m]));
    }
    json_t *speech = synth->speech_unbuilt
                         ? json_pack("{s:b, s:s}", "available", 0, "reason", synth->speech_unbuilt)
                         : json_pack("{s:b, s:s}", "available", 1, "synthesizer", dataset_speech_version());
    json_t *attributes = json_pack(
        "{s:{s:o, s:o, s:o, s:o, s:o}, s:{s:o, s:o, s:o}, s:{s:o, s:o, s:o}}", "image", "colours",
        string_array(colour_names, COLOURS), "shapes", string_array(dataset_shape_names, DATASET_SHAPES),
        "sizes", string_array(size_names, SIZES), "positions", string_array(position_names, POSITIONS),
        "backgrounds", string_array(ground_names, BACKGROUNDS), "video", "colours",
        string_array(colour_names, COLOURS), "shapes", string_array(dataset_shape_names, DATASET_SHAPES),
        "motions", string_array(motion_names, MOTIONS), "audio", "kinds",
        string_array(kind_names, synth->kind_count), "pitches",
        string_array(dataset_pitch_names, DATASET_PITCHES), "words",
        string_array(dataset_words, DATASET_WORDS));
    json_t *held_out = json_pack(
        "{s:o, s:o, s:o}", "image",
        held_out_json(&synth->pairs[IMAGES], "colour", "shape", colour_names, dataset_shape_names), "video",
        held_out_json(&synth->pairs[VIDEOS], "colour", "motion", colour_names, motion_names), "audio",
        held_out_json(&synth->pairs[SOUNDS], "kind", "pitch", kind_names, dataset_pitch_names));
    json_t *root =
        json_pack("{s:s, s:s, s:I, s:f, s:o, s:{s:I, s:I}, s:o, s:o, s:{s:I}, s:{s:I, s:I, s:i, s:s, s:s}, "
                  "s:{s:I, s:i, s:s}, s:o, s:o, s:{s:s, s:s, s:s}}",
                  "generator", "uform dataset synth", "uform", version, "seed", (json_int_t)synth->flags.seed,
                  "test_fraction", synth->flags.test_fraction, "counts", counts, "items", "train",
                  (json_int_t)synth->items[TRAIN], "test", (json_int_t)synth->items[TEST], "unwritten",
                  unwritten, "speech", speech, "image", "size", (json_int_t)synth->flags.image_size, "video",
                  "size", (json_int_t)synth->flags.image_size, "frames",
                  (json_int_t)synth->flags.video_frames, "fps", VIDEO_FPS, "codec", dataset_video_codec,
                  "container", dataset_video_container, "audio", "rate", (json_int_t)synth->flags.audio_rate,
                  "seconds", 1, "format", "wav pcm_s16le mono", "attributes", attributes, "held_out",
                  held_out, "files", "train", "train.jsonl", "test", "test.jsonl", "media", "media");
    if (!root) return command_fail("out of memory");

    char path[PATH_CAPACITY], partial[PATH_CAPACITY];
    int code = join_path(path, synth->flags.out, "dataset.json");
    if (code == COMMAND_OK) code = join_path(partial, synth->flags.out, "dataset.json.partial");
    if (code == COMMAND_OK) {
        FILE *file = fopen(partial, "w");
        bool written =
            file &&
            json_dumpf(root, file, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) == 0 &&
            fputc('\n', file) != EOF;
        if (file && fclose(file) != 0) written = false;
        if (!written || rename(partial, path) != 0) {
            code = command_fail("cannot write %s: %s", path, strerror(errno));
            remove(partial);
        }
    }
    json_decref(root);
    return code;
}

/* ---- the tool ------------------------------------------------------------------------------------------ */

/* Closes the manifests; on success renames them into place, else removes them. */
static int finish_manifests(synth_t *synth, bool succeeded) {
    int code = COMMAND_OK;
    for (size_t split = 0; split < 2; ++split) {
        if (!synth->files[split]) continue;
        if (fclose(synth->files[split]) != 0 && succeeded && code == COMMAND_OK)
            code = command_fail("cannot write %s: %s", synth->partial[split], strerror(errno));
        synth->files[split] = NULL;
    }
    for (size_t split = 0; split < 2; ++split) {
        if (!synth->partial[split][0]) continue;
        if (!succeeded || code != COMMAND_OK) {
            remove(synth->partial[split]);
        } else if (rename(synth->partial[split], synth->manifests[split]) != 0) {
            code = command_fail("cannot write %s: %s", synth->manifests[split], strerror(errno));
            remove(synth->partial[split]);
        }
        synth->partial[split][0] = '\0';
    }
    return code;
}

static int dataset_synth(int argc, char **argv) {
    synth_t *synth = calloc(1, sizeof *synth);
    if (!synth) return command_fail("out of memory");
    int code = parse_flags(argc, argv, &synth->flags);
    if (code != COMMAND_OK || synth->flags.help) goto done;
    synth_flags_t *flags = &synth->flags;

    /* What this build writes; sounds need nothing but speech needs espeak-ng. */
    char const *unbuilt[MODALITIES] = {dataset_png_unbuilt(), dataset_video_unbuilt(), NULL};
    size_t writable = 0;
    for (size_t m = 0; m < MODALITIES; ++m) {
        if (flags->counts[m] && unbuilt[m]) synth->unwritten[m] = unbuilt[m];
        writable += flags->counts[m] && !unbuilt[m];
    }
    if (!writable) {
        code = command_fail("nothing can be written: %s%s%s%s%s", synth->unwritten[IMAGES] ? "images: " : "",
                            synth->unwritten[IMAGES] ? synth->unwritten[IMAGES] : "",
                            synth->unwritten[IMAGES] && synth->unwritten[VIDEOS] ? "; " : "",
                            synth->unwritten[VIDEOS] ? "videos: " : "",
                            synth->unwritten[VIDEOS] ? synth->unwritten[VIDEOS] : "");
        goto done;
    }
    for (size_t m = 0; m < MODALITIES; ++m)
        if (synth->unwritten[m])
            fprintf(stderr, "uform: warning: no %s are written: %s\n", count_names[m], synth->unwritten[m]);
    synth->speech_unbuilt = flags->counts[SOUNDS] ? dataset_speech_start() : "no sounds were asked for";
    if (synth->speech_unbuilt && flags->counts[SOUNDS])
        fprintf(stderr, "uform: warning: no spoken words among the sounds: %s\n", synth->speech_unbuilt);
    for (size_t kind = 0; kind < DATASET_SOUND_KINDS; ++kind)
        if (kind != DATASET_SPEECH || !synth->speech_unbuilt) synth->kinds[synth->kind_count++] = kind;

    choose_held_out(flags->seed, IMAGES, COLOURS, DATASET_SHAPES, &synth->pairs[IMAGES]);
    choose_held_out(flags->seed, VIDEOS, COLOURS, MOTIONS, &synth->pairs[VIDEOS]);
    choose_held_out(flags->seed, SOUNDS, synth->kind_count, DATASET_PITCHES, &synth->pairs[SOUNDS]);

    size_t side = flags->image_size;
    synth->pixels = malloc(flags->video_frames * side * side * 3);
    synth->samples = malloc(flags->audio_rate * sizeof *synth->samples);
    if (!synth->pixels || !synth->samples) {
        code = command_fail("out of memory");
        goto done;
    }
    if ((code = prepare_folder(synth)) != COMMAND_OK) goto done;

    size_t total = 0, done = 0;
    for (size_t m = 0; m < MODALITIES; ++m)
        total += synth->unwritten[m] ? 0 : flags->counts[m];
    progress_start(&synth->progress, "dataset synth", "samples", total);
    for (size_t m = 0; m < MODALITIES && code == COMMAND_OK; ++m)
        if (!synth->unwritten[m]) code = synth_modality(synth, m, &done);
    progress_end(&synth->progress, done, code == COMMAND_OK);
    code = finish_manifests(synth, code == COMMAND_OK) != COMMAND_OK ? COMMAND_RUNTIME : code;
    if (code == COMMAND_OK) code = write_description(synth);
    if (code == COMMAND_OK)
        printf("wrote %s: %zu images, %zu videos, %zu sounds (%zu train and %zu test items), seed %" PRIu64
               "\n",
               flags->out, synth->written[IMAGES][TRAIN] + synth->written[IMAGES][TEST],
               synth->written[VIDEOS][TRAIN] + synth->written[VIDEOS][TEST],
               synth->written[SOUNDS][TRAIN] + synth->written[SOUNDS][TEST], synth->items[TRAIN],
               synth->items[TEST], flags->seed);
done:
    finish_manifests(synth, false);
    dataset_speech_stop();
    free(synth->pixels);
    free(synth->samples);
    free(synth);
    return code;
}

int command_dataset(int argc, char **argv) {
    static command_tool_t const tools[] = {{"synth", dataset_synth}};
    static command_tools_t const dataset = {.name = "dataset", .help = help, .tools = tools, .count = 1};
    return command_run_tool(&dataset, argc, argv);
}
