/* `uform dataset`: seeded procedural multimodal datasets. What its files share: the drawing of shapes,
 * the writers of PNG images, clips and WAV sounds, and the synthesis of sounds (the seeded generator is
 * uform_random.h).
 * Internal to the `uform` command. Every function that prints an error answers the exit code to return,
 * as in uform_command.h. Nothing here is thread-safe: the command runs on one thread. */
#ifndef UFORM_DATASET_H
#define UFORM_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uform_random.h"

/* `uform dataset <tool> ...`; the entry point the command table of uform.c names. */
int command_dataset(int argc, char **argv);

/* ---- pictures: uform_dataset_image.c --------------------------------------------------------------- */

typedef enum dataset_shape_kind {
    DATASET_CIRCLE = 0,
    DATASET_SQUARE,
    DATASET_TRIANGLE,
    DATASET_DIAMOND,
    DATASET_STAR,
    DATASET_CROSS,
    DATASET_RING,
    DATASET_HEXAGON,
    DATASET_SHAPES,
} dataset_shape_kind_t;

/* "circle", ..., by dataset_shape_kind_t. */
extern char const *const dataset_shape_names[DATASET_SHAPES];

/* One shape in pixel units: its centre, the radius of the circle it fits in, its turn in radians. */
typedef struct dataset_shape {
    dataset_shape_kind_t kind;
    double x, y, radius, angle;
    uint8_t rgb[3];
} dataset_shape_t;

/* A grey background, `noise` the amplitude of the uniform noise added to every channel (0: plain). */
typedef struct dataset_background {
    uint8_t level;
    double noise;
} dataset_background_t;

/* Draws `shape` over `background` into `rgb`, side x side RGB8 rows: coverage by 4x4 supersampling, noise
 * from `random`. */
void dataset_draw(uint8_t *rgb, size_t side, dataset_background_t const *background,
                  dataset_shape_t const *shape, random_stream_t *random);

/* NULL when this build writes PNG images, else why it cannot ("this build has no libspng"). */
char const *dataset_png_unbuilt(void);

/* Writes side x side RGB8 rows as an 8-bit RGB PNG at `path` (libspng's encoder). */
int dataset_png_write(char const *path, uint8_t const *rgb, size_t side);

/* ---- clips: uform_dataset_video.c ------------------------------------------------------------------ */

/* NULL when this build writes clips, else why it cannot ("this build has no FFmpeg"). */
char const *dataset_video_unbuilt(void);

/* The codec and container of the clips, for dataset.json: "mpeg4", "mp4". */
extern char const dataset_video_codec[], dataset_video_container[];

/* Writes `count` frames, each side x side RGB8 rows end to end in `frames`, as an MPEG-4 Part 2 clip in
 * MP4 at `fps` frames a second; `side` is even. The bytes depend only on the frames (bit-exact flags, one
 * thread). A failed write removes the file. */
int dataset_video_write(char const *path, uint8_t const *frames, size_t count, size_t side, size_t fps);

/* ---- sounds: uform_dataset_sound.c ----------------------------------------------------------------- */

typedef enum dataset_sound_kind {
    DATASET_TONE = 0,
    DATASET_CHORD,
    DATASET_NOISE,
    DATASET_RHYTHM,
    DATASET_SPEECH,
    DATASET_SOUND_KINDS,
} dataset_sound_kind_t;

/* "tone", "chord", "noise", "rhythm", "speech", by dataset_sound_kind_t. */
extern char const *const dataset_sound_kind_names[DATASET_SOUND_KINDS];

/* "low", "middle", "high": the register of a note, the colour of noise, the voice of a word. */
enum { DATASET_PITCHES = 3 };
extern char const *const dataset_pitch_names[DATASET_PITCHES];

/* The words the speech kind says. */
enum { DATASET_WORDS = 24 };
extern char const *const dataset_words[DATASET_WORDS];

/* One sound. `note` is a MIDI note (tone, chord root, beeps); `variant` picks minor chords, long bursts
 * and fast rhythms; `word` indexes dataset_words. */
typedef struct dataset_sound {
    dataset_sound_kind_t kind;
    size_t pitch, note, word;
    bool variant;
} dataset_sound_t;

/* The MIDI note a sound of `kind` in register `pitch` draws from `random` (a natural note of the
 * register); 0, drawing nothing, for kinds without a note. */
size_t dataset_sound_note(dataset_sound_kind_t kind, size_t pitch, random_stream_t *random);

/* The name of a MIDI note without its octave ("C", "F sharp"), and with it ("F#4"). */
char const *dataset_note_name(size_t note);
void dataset_note_label(size_t note, char *label, size_t capacity);

/* The sound's samples into `samples`, `count` of them at `rate`, in [-1, 1]; speech through
 * dataset_speech_say. Random parts (noise, timing, gain) from `random`. */
int dataset_sound_render(dataset_sound_t const *sound, float *samples, size_t count, size_t rate,
                         random_stream_t *random);

/* Starts the speech synthesizer (espeak-ng): NULL when words can be spoken, else why not (not built,
 * or its data not found). dataset_speech_stop ends it. */
char const *dataset_speech_start(void);
void dataset_speech_stop(void);

/* A short description of the synthesizer for dataset.json ("espeak-ng 1.51"), or NULL. */
char const *dataset_speech_version(void);

/* Writes `count` samples in [-1, 1] at `rate` as 16-bit PCM mono WAV at `path`. */
int dataset_wav_write(char const *path, float const *samples, size_t count, size_t rate);

#endif /* UFORM_DATASET_H */
