/* video_encode through the public interface. Clips are written here, at test time, with FFmpeg's own
 * encoders and muxers (FFV1 in Matroska, raw RGB in NUT: lossless; MPEG-4 Part 2 with B-frames in MP4,
 * MJPEG in AVI: lossy), from frames of distinct colours with a moving square, so that every sampled
 * frame can be named:
 *   - lossless clips: sample k's token vector equals, bitwise, image_encode_pixels of the frame the rule
 *     (frame shown at start + (k + 0.5) * duration / F) names, for constant and variable frame rates
 *     and for clips shorter than F frames; the embedding is the normalized mean of those, the state
 *     their mean;
 *   - lossy clips: each sample is closest to the frame the rule names (presentation order, B-frames);
 *   - files and memory, the calling thread, RAM executors and deferred calls agree bitwise, over
 *     several chunks; on RAM executors of 2 threads or more each chunk after the first is decoded
 *     ahead, while the one before computes;
 *   - bad clips fail alone: an audio-only file, a zero-length clip, a text file, a truncated MP4, an
 *     empty file, garbage, frames past the pixel limit, a file past the size limit, a missing file, a
 *     folder, an empty path;
 *   - matryoshka widths and conversions, progress and cancellation, bad arguments, a model without a
 *     video entry, and a build without FFmpeg (UNSUPPORTED). Numbers against PyTorch are checked by
 *     tests/reference/test_video_reference.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "model.h"
#include "fixtures.h"
#include "kernels.h"
#include "media_overlap.h"

#if UFORM_WITH_FFMPEG
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libswscale/swscale.h>
#endif

#define FRAME_HEIGHT  48
#define FRAME_WIDTH   64
#define CLIP_RATE     12 /* frames per second of the constant-rate clips */
#define CLIP_FRAMES   12
#define LAST_DURATION 100 /* ms, the last frame's of a variable-rate clip */

static uform_model_t *model;
static uform_model_info_t info;
static size_t samples; /* frames per clip: the model's */

#if UFORM_WITH_FFMPEG

/* ---- Frames, clips, batches ----------------------------------------------------------------------- */

typedef struct picture {
    uint8_t *rgb;
    size_t height, width;
} picture_t;

/* Frame i of a clip: a colour of its own, a square that moves, a little texture. */
static picture_t frame_picture(size_t i) {
    static uint8_t const palette[][3] = {{230, 25, 75},  {60, 180, 75},   {255, 225, 25}, {0, 130, 200},
                                         {245, 130, 48}, {145, 30, 180},  {70, 240, 240}, {240, 50, 230},
                                         {210, 245, 60}, {250, 190, 212}, {0, 128, 128},  {170, 110, 40},
                                         {128, 0, 0},    {0, 0, 128}};
    picture_t picture = {malloc(FRAME_HEIGHT * FRAME_WIDTH * 3), FRAME_HEIGHT, FRAME_WIDTH};
    assert_non_null(picture.rgb);
    uint8_t const *colour = palette[i % (sizeof palette / sizeof palette[0])];
    size_t left = (i * 4) % (FRAME_WIDTH - 12), top = 8 + (i * 3) % (FRAME_HEIGHT - 20);
    for (size_t y = 0; y < FRAME_HEIGHT; ++y)
        for (size_t x = 0; x < FRAME_WIDTH; ++x)
            for (size_t c = 0; c < 3; ++c) {
                bool square = x >= left && x < left + 12 && y >= top && y < top + 12;
                int value = square ? 255 - colour[c] : colour[c] + (int)((x + 2 * y + c) % 5) - 2;
                picture.rgb[(y * FRAME_WIDTH + x) * 3 + c] = (uint8_t)(value < 0     ? 0
                                                                       : value > 255 ? 255
                                                                                     : value);
            }
    return picture;
}

static uform_status_t video_encode(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                   uform_arena_t *arena, uform_encode_config_t const *config,
                                   uform_outcome_t *outcome, uform_encoded_t *encoded) {
    uform_video_encode_args_t args = {ENCODE_ARGS(model), .videos = batch_tape(batch),
                                      .source = batch->source};
    return uform_video_encode(&args);
}

/* ---- Comparisons ---------------------------------------------------------------------------------- */

/* image_encode_pixels of `count` pictures, at `width` (0: full dims). */
static void encode_pictures(picture_t const *pictures, size_t count, size_t width, uform_arena_t *arena,
                            uform_encoded_t *encoded) {
    batch_t *batch = batch_new(BATCH_PIXELS);
    for (size_t i = 0; i < count; ++i)
        batch_add_pixels(batch, pictures[i].rgb, pictures[i].height * pictures[i].width * 3,
                         pictures[i].height, pictures[i].width);
    uform_encode_config_t config = {.matryoshka = width};
    uform_image_encode_pixels_args_t args = {.model = model,
                                             .outputs = EVERYTHING,
                                             .arena = arena,
                                             .config = &config,
                                             .encoded = encoded,
                                             .pixels = batch_tape(batch),
                                             .heights = batch->heights,
                                             .widths = batch->widths};
    assert_int_equal(uform_image_encode_pixels(&args), UFORM_OK);
    batch_free(batch);
}

/* ---- Writing clips with FFmpeg's encoders and muxers ------------------------------------------------ */

typedef struct clip_spec {
    char const *muxer, *encoder;
    enum AVPixelFormat format;
    size_t frames;
    int64_t const *times; /* presentation times in ms, ascending; NULL: frame i at i / CLIP_RATE */
    int b_frames;
} clip_spec_t;

/* `name` in the folder, as a `muxer` file: its streams are added, then output_start opens it. */
static AVFormatContext *output_new(char const *name, char const *muxer) {
    char path[512];
    fixture_path(name, path, sizeof path);
    AVFormatContext *output = NULL;
    assert_true(avformat_alloc_output_context2(&output, NULL, muxer, path) >= 0);
    return output;
}

/* Opens `encoder` (NULL: the stream's parameters are set) for `stream`, then the file, and writes its
 * header. */
static void output_start(AVFormatContext *output, AVStream *stream, AVCodecContext *encoder,
                         AVCodec const *codec) {
    if (encoder) {
        assert_int_equal(avcodec_open2(encoder, codec, NULL), 0);
        assert_true(avcodec_parameters_from_context(stream->codecpar, encoder) >= 0);
        stream->time_base = encoder->time_base;
    }
    assert_true(avio_open(&output->pb, output->url, AVIO_FLAG_WRITE) >= 0);
    assert_true(avformat_write_header(output, NULL) >= 0);
}

/* Writes the trailer, closes the file and answers its bytes. */
static blob_t output_finish(AVFormatContext *output) {
    assert_int_equal(av_write_trailer(output), 0);
    assert_int_equal(avio_closep(&output->pb), 0);
    blob_t blob = blob_read(output->url);
    avformat_free_context(output);
    return blob;
}

static void write_packets(AVFormatContext *output, AVCodecContext *encoder, AVStream *stream,
                          clip_spec_t const *spec, AVFrame const *frame) {
    AVPacket *packet = av_packet_alloc();
    assert_non_null(packet);
    assert_int_equal(avcodec_send_frame(encoder, frame), 0);
    for (;;) {
        int error = avcodec_receive_packet(encoder, packet);
        if (error == AVERROR(EAGAIN) || error == AVERROR_EOF) break;
        assert_int_equal(error, 0);
        packet->duration = 1;
        if (spec->times) { /* intra-only codecs: the packet of the frame shown at pts lasts until the next */
            for (size_t i = 0; i < spec->frames; ++i)
                if (spec->times[i] == packet->pts)
                    packet->duration =
                        i + 1 < spec->frames ? spec->times[i + 1] - packet->pts : LAST_DURATION;
        }
        av_packet_rescale_ts(packet, encoder->time_base, stream->time_base);
        packet->stream_index = stream->index;
        assert_int_equal(av_interleaved_write_frame(output, packet), 0);
    }
    av_packet_free(&packet);
}

/* Writes `name` in the directory: the spec's frames, frame_picture(i) for frame i, through the encoder. */
static blob_t clip_write(char const *name, clip_spec_t const *spec) {
    AVFormatContext *output = output_new(name, spec->muxer);
    AVCodec const *codec = avcodec_find_encoder_by_name(spec->encoder);
    assert_non_null(codec);
    AVStream *stream = avformat_new_stream(output, NULL);
    AVCodecContext *encoder = avcodec_alloc_context3(codec);
    assert_non_null(stream);
    assert_non_null(encoder);
    encoder->width = FRAME_WIDTH;
    encoder->height = FRAME_HEIGHT;
    encoder->pix_fmt = spec->format;
    encoder->time_base = spec->times ? (AVRational){1, 1000} : (AVRational){1, CLIP_RATE};
    encoder->framerate = (AVRational){CLIP_RATE, 1};
    encoder->gop_size = 6;
    encoder->max_b_frames = spec->b_frames;
    encoder->thread_count = 1;
    if (strcmp(spec->encoder, "mjpeg") == 0) encoder->color_range = AVCOL_RANGE_JPEG;
    if (strcmp(spec->encoder, "mpeg4") == 0 || strcmp(spec->encoder, "mjpeg") == 0) {
        encoder->flags |= AV_CODEC_FLAG_QSCALE;
        encoder->global_quality = FF_QP2LAMBDA * 3;
    }
    if (output->oformat->flags & AVFMT_GLOBALHEADER) encoder->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    output_start(output, stream, encoder, codec);

    struct SwsContext *sws = sws_getContext(FRAME_WIDTH, FRAME_HEIGHT, AV_PIX_FMT_RGB24, FRAME_WIDTH,
                                            FRAME_HEIGHT, spec->format, SWS_BILINEAR, NULL, NULL, NULL);
    AVFrame *frame = av_frame_alloc();
    assert_non_null(sws);
    assert_non_null(frame);
    for (size_t i = 0; i < spec->frames; ++i) {
        frame->format = spec->format;
        frame->width = FRAME_WIDTH;
        frame->height = FRAME_HEIGHT;
        frame->color_range = encoder->color_range;
        assert_int_equal(av_frame_get_buffer(frame, 0), 0);
        picture_t picture = frame_picture(i);
        uint8_t const *source[4] = {picture.rgb};
        int strides[4] = {FRAME_WIDTH * 3};
        assert_int_equal(sws_scale(sws, source, strides, 0, FRAME_HEIGHT, frame->data, frame->linesize),
                         FRAME_HEIGHT);
        free(picture.rgb);
        frame->pts = spec->times ? spec->times[i] : (int64_t)i;
        frame->quality = encoder->global_quality;
        write_packets(output, encoder, stream, spec, frame);
        av_frame_unref(frame);
    }
    write_packets(output, encoder, stream, spec, NULL);
    av_frame_free(&frame);
    sws_freeContext(sws);
    avcodec_free_context(&encoder);
    return output_finish(output);
}

/* One second of silence in a WAV file: a container with no video stream. */
static blob_t audio_only(char const *name) {
    AVFormatContext *output = output_new(name, "wav");
    AVCodec const *codec = avcodec_find_encoder(AV_CODEC_ID_PCM_S16LE);
    AVStream *stream = avformat_new_stream(output, NULL);
    AVCodecContext *encoder = avcodec_alloc_context3(codec);
    assert_non_null(encoder);
    encoder->sample_rate = 8000;
    encoder->sample_fmt = AV_SAMPLE_FMT_S16;
    av_channel_layout_default(&encoder->ch_layout, 1);
    encoder->time_base = (AVRational){1, 8000};
    output_start(output, stream, encoder, codec);
    AVFrame *frame = av_frame_alloc();
    AVPacket *packet = av_packet_alloc();
    frame->format = AV_SAMPLE_FMT_S16;
    frame->nb_samples = 8000;
    frame->sample_rate = 8000;
    assert_int_equal(av_channel_layout_copy(&frame->ch_layout, &encoder->ch_layout), 0);
    assert_int_equal(av_frame_get_buffer(frame, 0), 0);
    memset(frame->data[0], 0, 8000 * 2);
    frame->pts = 0;
    AVFrame *frames[] = {frame, NULL};
    for (size_t f = 0; f < 2; ++f) {
        assert_int_equal(avcodec_send_frame(encoder, frames[f]), 0);
        while (avcodec_receive_packet(encoder, packet) == 0) {
            av_packet_rescale_ts(packet, encoder->time_base, stream->time_base);
            assert_int_equal(av_interleaved_write_frame(output, packet), 0);
        }
    }
    av_packet_free(&packet);
    av_frame_free(&frame);
    avcodec_free_context(&encoder);
    return output_finish(output);
}

/* Raw RGB in NUT whose stream claims 10000 x 10000 pixels (past UFORM_IMAGE_MAX_PIXELS), one short packet. */
static blob_t huge_frames(char const *name) {
    AVFormatContext *output = output_new(name, "nut");
    AVStream *stream = avformat_new_stream(output, NULL);
    assert_non_null(stream);
    stream->codecpar->codec_type = AVMEDIA_TYPE_VIDEO;
    stream->codecpar->codec_id = AV_CODEC_ID_RAWVIDEO;
    stream->codecpar->format = AV_PIX_FMT_RGB24;
    stream->codecpar->width = 10000;
    stream->codecpar->height = 10000;
    stream->time_base = (AVRational){1, CLIP_RATE};
    output_start(output, stream, NULL, NULL);
    AVPacket *packet = av_packet_alloc();
    assert_int_equal(av_new_packet(packet, 64), 0);
    memset(packet->data, 7, 64);
    packet->pts = packet->dts = 0;
    packet->duration = 1;
    packet->flags |= AV_PKT_FLAG_KEY;
    assert_int_equal(av_interleaved_write_frame(output, packet), 0);
    av_packet_free(&packet);
    return output_finish(output);
}

/* The frame the rule picks for sample k: the last whose time <= start + (k + 0.5) * duration / F. */
static size_t expected_frame(clip_spec_t const *spec, size_t k) {
    double start = 0, end = spec->times ? (double)(spec->times[spec->frames - 1] + LAST_DURATION)
                                        : (double)spec->frames * 1000.0 / CLIP_RATE;
    if (spec->times) start = (double)spec->times[0];
    double time = start + ((double)k + 0.5) * (end - start) / (double)samples;
    size_t pick = 0;
    for (size_t i = 0; i < spec->frames; ++i) {
        double shown = spec->times ? (double)spec->times[i] : (double)i * 1000.0 / CLIP_RATE;
        if (shown <= time) pick = i;
    }
    return pick;
}

static int64_t const variable_times[] = {0, 100, 150, 700, 800}; /* ms */

static clip_spec_t const lossless[] = {
    {"matroska", "ffv1", AV_PIX_FMT_0RGB32, CLIP_FRAMES, NULL, 0},
    {"nut", "rawvideo", AV_PIX_FMT_RGB24, CLIP_FRAMES, NULL, 0},
    {"matroska", "ffv1", AV_PIX_FMT_0RGB32, 5, variable_times, 0},
    {"nut", "rawvideo", AV_PIX_FMT_RGB24, 2, NULL, 0}, /* fewer frames than samples: repeats */
    {"matroska", "ffv1", AV_PIX_FMT_0RGB32, 1, NULL, 0},
};
static char const *const lossless_names[] = {"ffv1.mkv", "raw.nut", "variable.mkv", "two.nut", "one.mkv"};

static clip_spec_t const lossy[] = {
    {"mp4", "mpeg4", AV_PIX_FMT_YUV420P, CLIP_FRAMES, NULL, 2}, /* B-frames: decode order != shown order */
    {"avi", "mjpeg", AV_PIX_FMT_YUVJ420P, CLIP_FRAMES, NULL, 0},
};
static char const *const lossy_names[] = {"mpeg4.mp4", "mjpeg.avi"};

/* ---- Tests ------------------------------------------------------------------------------------------ */

static void clips_sample_the_frames_the_rule_names(void **state) {
    (void)state;
    uform_arena_t *arena = arena_on_host(), *images_arena = arena_on_host();
    size_t const dims = info.dims, hidden = info.image.transformer.hidden;
    for (size_t c = 0; c < sizeof lossless / sizeof lossless[0]; ++c) {
        clip_spec_t const *spec = &lossless[c];
        blob_t clip = clip_write(lossless_names[c], spec);
        batch_t *batch = batch_new(BATCH_MEMORY);
        batch_add(batch, clip.data, clip.size);
        uform_encoded_t encoded, images;
        uform_encode_stats_t stats;
        uform_encode_config_t config = {.stats = &stats};
        assert_int_equal(video_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &encoded), UFORM_OK);
        if (encoded.statuses[0] != UFORM_OK)
            fail_msg("%s: %s", lossless_names[c], uform_status_name(encoded.statuses[0]));
        assert_int_equal(stats.items, 1);
        assert_int_equal(stats.failed, 0);
        assert_int_equal(stats.bytes, clip.size);
        assert_int_equal(encoded.embeddings.rows, 1);
        assert_int_equal(encoded.embeddings.columns, dims);
        assert_int_equal(encoded.states.columns, hidden);
        assert_int_equal(encoded.token_vectors.rows, samples);
        assert_int_equal(encoded.token_vectors.items, 1);
        assert_int_equal(encoded.token_vectors.item_offsets[1], samples);

        picture_t expected[64];
        for (size_t k = 0; k < samples; ++k)
            expected[k] = frame_picture(expected_frame(spec, k));
        encode_pictures(expected, samples, 0, images_arena, &images);
        double mean_embedding[1024] = {0}, mean_state[1024] = {0};
        for (size_t k = 0; k < samples; ++k) {
            if (memcmp(row_of(&encoded.token_vectors, k), row_of(&images.embeddings, k),
                       encoded.token_vectors.row_stride) != 0)
                fail_msg("%s: sample %zu is not frame %zu, bitwise", lossless_names[c], k,
                         expected_frame(spec, k));
            float const *embedding = row_of(&images.embeddings, k), *image_state = row_of(&images.states, k);
            for (size_t j = 0; j < dims; ++j)
                mean_embedding[j] += embedding[j];
            for (size_t j = 0; j < hidden; ++j)
                mean_state[j] += image_state[j] / (double)samples;
            free(expected[k].rgb);
        }
        double norm = 0;
        for (size_t j = 0; j < dims; ++j)
            norm += mean_embedding[j] * mean_embedding[j];
        float const *embedding = row_of(&encoded.embeddings, 0), *clip_state = row_of(&encoded.states, 0);
        for (size_t j = 0; j < dims; ++j)
            assert_true(fabs(embedding[j] - mean_embedding[j] / sqrt(norm)) < 1e-5);
        for (size_t j = 0; j < hidden; ++j)
            assert_true(fabs(clip_state[j] - mean_state[j]) < 1e-4 * (1 + fabs(mean_state[j])));
        batch_free(batch);
        free(clip.data);
    }
    uform_arena_free(arena);
    uform_arena_free(images_arena);
}

/* Lossy clips cannot match bitwise: each sample must be closest to the frame the rule names. */
static void lossy_clips_pick_identifiable_frames(void **state) {
    (void)state;
    uform_arena_t *arena = arena_on_host(), *images_arena = arena_on_host();
    picture_t pictures[CLIP_FRAMES];
    for (size_t i = 0; i < CLIP_FRAMES; ++i)
        pictures[i] = frame_picture(i);
    uform_encoded_t images;
    encode_pictures(pictures, CLIP_FRAMES, 0, images_arena, &images);
    for (size_t c = 0; c < sizeof lossy / sizeof lossy[0]; ++c) {
        blob_t clip = clip_write(lossy_names[c], &lossy[c]);
        batch_t *batch = batch_new(BATCH_MEMORY);
        batch_add(batch, clip.data, clip.size);
        uform_encoded_t encoded;
        assert_int_equal(video_encode(batch, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
        if (encoded.statuses[0] != UFORM_OK)
            fail_msg("%s: %s", lossy_names[c], uform_status_name(encoded.statuses[0]));
        for (size_t k = 0; k < samples; ++k) {
            size_t best = 0;
            double best_cosine = -2;
            for (size_t i = 0; i < CLIP_FRAMES; ++i) {
                double cosine =
                    cosine_of(row_of(&encoded.token_vectors, k), row_of(&images.embeddings, i), info.dims);
                if (cosine > best_cosine) best = i, best_cosine = cosine;
            }
            if (best != expected_frame(&lossy[c], k))
                fail_msg("%s: sample %zu looks like frame %zu (cosine %.5f), not %zu", lossy_names[c], k,
                         best, best_cosine, expected_frame(&lossy[c], k));
        }
        batch_free(batch);
        free(clip.data);
    }
    for (size_t i = 0; i < CLIP_FRAMES; ++i)
        free(pictures[i].rgb);
    uform_arena_free(arena);
    uform_arena_free(images_arena);
}

/* Every clip of every kind, files and memory, over several chunks, on every receiver. */
static void files_memory_and_receivers_agree(void **state) {
    (void)state;
    blob_t clips[8];
    char const *names[8];
    size_t kinds = 0;
    for (size_t c = 0; c < sizeof lossless / sizeof lossless[0]; ++c, ++kinds)
        clips[kinds] = clip_write(names[kinds] = lossless_names[c], &lossless[c]);
    for (size_t c = 0; c < sizeof lossy / sizeof lossy[0]; ++c, ++kinds)
        clips[kinds] = clip_write(names[kinds] = lossy_names[c], &lossy[c]);
    batch_t *files = batch_new(BATCH_FILES), *memory = batch_new(BATCH_MEMORY);
    while (files->count < 70) { /* 68 tokens a clip for the tiny model: three chunks */
        size_t c = files->count % kinds;
        batch_add_path(files, names[c]);
        batch_add(memory, clips[c].data, clips[c].size);
    }
    assert_same_on_every_receiver(video_encode, memory, files);
    /* Within the batch, every copy of a clip equals the first. */
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    assert_int_equal(video_encode(files, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
    for (size_t i = 0; i < files->count; ++i) {
        assert_int_equal(encoded.statuses[i], UFORM_OK);
        assert_same_item(&encoded, i, &encoded, i % kinds);
    }
    uform_arena_free(arena);
    batch_free(files);
    batch_free(memory);
    for (size_t c = 0; c < kinds; ++c)
        free(clips[c].data);
}

/* ---- Decoding ahead ------------------------------------------------------------------------------ */

/* Clips over several chunks, files and memory: decoded ahead while the chunk before computes (on 2 and
 * 3 threads; not on 1); files_memory_and_receivers_agree shows the outputs bitwise the same. */
static void decoding_overlaps_compute(void **state) {
    (void)state;
    blob_t clips[2];
    clips[0] = clip_write(lossless_names[0], &lossless[0]);
    clips[1] = clip_write(lossy_names[0], &lossy[0]);
    char const *names[2] = {lossless_names[0], lossy_names[0]};
    batch_t *files = batch_new(BATCH_FILES), *memory = batch_new(BATCH_MEMORY);
    while (files->count < 70) { /* three chunks for the tiny model */
        size_t c = files->count % 2;
        batch_add_path(files, names[c]);
        batch_add(memory, clips[c].data, clips[c].size);
    }
    for (size_t threads = 1; threads <= 3; ++threads) {
        check_decoded_ahead(video_encode, memory, threads);
        check_decoded_ahead(video_encode, files, threads);
    }
    batch_free(files);
    batch_free(memory);
    for (size_t c = 0; c < 2; ++c)
        free(clips[c].data);
}

static size_t bad_cases(file_case_t *cases) {
    size_t n = 0;
    static char const text[] = "this is a text file, not a video clip\n";
    blob_t good = clip_write("good.mkv", &lossless[0]);
    blob_t mp4 = clip_write("whole.mp4", &lossy[0]);
    clip_spec_t empty = lossless[0];
    empty.frames = 0;
    uint8_t garbage[4096];
    for (size_t i = 0; i < sizeof garbage; ++i)
        garbage[i] = (uint8_t)(i * 2654435761u >> 13);
    cases[n++] = (file_case_t){"good.mkv", good, UFORM_OK};
    cases[n++] = (file_case_t){"audio.wav", audio_only("audio.wav"), UFORM_FORMAT};
    cases[n++] = (file_case_t){"zero.mkv", clip_write("zero.mkv", &empty), UFORM_FORMAT};
    cases[n++] = (file_case_t){"text.mp4", blob_copy(text, sizeof text - 1), UFORM_FORMAT};
    cases[n++] = (file_case_t){"truncated.mp4", blob_copy(mp4.data, mp4.size / 2), UFORM_FORMAT};
    cases[n++] = (file_case_t){"whole.mp4", mp4, UFORM_OK};
    cases[n++] = (file_case_t){"empty.mkv", blob_copy("", 0), UFORM_FORMAT};
    cases[n++] = (file_case_t){"garbage.avi", blob_copy(garbage, sizeof garbage), UFORM_FORMAT};
    cases[n++] = (file_case_t){"huge.nut", huge_frames("huge.nut"), UFORM_FORMAT};
    cases[n++] =
        (file_case_t){"sparse.mkv", {NULL, 0}, UFORM_FORMAT, true}; /* refused by its size, never read */
    cases_write(cases, n);
    sparse_write("sparse.mkv", (size_t)UFORM_VIDEO_MAX_BYTES + 1);
    return n;
}

static file_cases_t clip_cases = {video_encode, bad_cases};

static void matryoshka_and_conversions(void **state) {
    (void)state;
    blob_t clip = clip_write("widths.mkv", &lossless[0]);
    batch_t *batch = batch_new(BATCH_MEMORY);
    batch_add(batch, clip.data, clip.size);
    batch_add(batch, "not a clip", 10);
    assert_conversions_and_matryoshka(video_encode, batch, EVERYTHING, &info, kernels_scalar()->convert);

    /* At every width the states are the full ones, and the token vectors the frames' image embeddings at
     * that width. */
    uform_arena_t *full_arena = arena_on_host(), *arena = arena_on_host(), *images_arena = arena_on_host();
    uform_encoded_t full, narrow, images;
    assert_int_equal(video_encode(batch, NULL, EVERYTHING, full_arena, NULL, NULL, &full), UFORM_OK);
    assert_int_equal(full.statuses[1], UFORM_FORMAT);
    picture_t expected[64];
    for (size_t k = 0; k < samples; ++k)
        expected[k] = frame_picture(expected_frame(&lossless[0], k));
    for (size_t m = 0; m < info.matryoshka_count; ++m) {
        size_t width = info.matryoshka[m];
        uform_encode_config_t config = {.matryoshka = width};
        assert_int_equal(video_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &narrow), UFORM_OK);
        assert_memory_equal(narrow.states.data, full.states.data, full.states.rows * full.states.row_stride);
        encode_pictures(expected, samples, width, images_arena, &images);
        for (size_t k = 0; k < samples; ++k) {
            float const *vector = row_of(&narrow.token_vectors, k), *image = row_of(&images.embeddings, k);
            for (size_t j = 0; j < width; ++j)
                assert_true(fabs(vector[j] - image[j]) < 1e-5);
        }
        assert_zero_item(&narrow, 1);
    }
    for (size_t k = 0; k < samples; ++k)
        free(expected[k].rgb);
    uform_arena_free(full_arena);
    uform_arena_free(arena);
    uform_arena_free(images_arena);
    batch_free(batch);
    free(clip.data);
}

static void progress_and_cancel(void **state) {
    (void)state;
    blob_t clip = clip_write("progress.nut", &lossless[3]);
    batch_t *batch = batch_new(BATCH_MEMORY);
    for (size_t i = 0; i < 100; ++i)
        batch_add(batch, clip.data, clip.size);
    assert_progress_and_cancel(video_encode, batch, UFORM_OK);
    batch_free(batch);
    free(clip.data);
}

#endif /* UFORM_WITH_FFMPEG */

/* Refusals before submission, and a model whose checkpoint has no video entry. */
static void bad_arguments_and_no_video_tower(void **state) {
    (void)state;
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    char const bytes[] = "clip";
    size_t offsets[] = {0, 4}, backwards[] = {4, 0};
    uform_video_encode_args_t args = {.model = model,
                                      .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                      .arena = arena,
                                      .encoded = &encoded,
                                      .videos = {bytes, offsets, 1, 4},
                                      .source = UFORM_SOURCE_MEMORY};
    assert_int_equal(uform_video_encode(NULL), UFORM_INVALID_ARGUMENT);
    args.source = (uform_source_t)9;
    assert_int_equal(uform_video_encode(&args), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "unknown source");
    args.source = UFORM_SOURCE_MEMORY;
    args.videos.offsets = backwards;
    assert_int_equal(uform_video_encode(&args), UFORM_INVALID_ARGUMENT);
    args.videos.offsets = offsets;
    args.videos.count = 0;
    assert_int_equal(uform_video_encode(&args), UFORM_INVALID_ARGUMENT);
    args.videos.count = 1;
    args.outputs = 0;
    assert_int_equal(uform_video_encode(&args), UFORM_INVALID_ARGUMENT);
    args.outputs = UFORM_OUTPUT_EMBEDDINGS;
    uform_encode_config_t config = {.matryoshka = info.dims + 1};
    args.config = &config;
    assert_int_equal(uform_video_encode(&args), UFORM_INVALID_ARGUMENT);
    args.config = NULL;

    uform_status_t expected = UFORM_WITH_FFMPEG ? UFORM_OK : UFORM_UNSUPPORTED;
    assert_int_equal(uform_video_encode(&args), expected);
    if (expected == UFORM_OK) assert_int_equal(encoded.statuses[0], UFORM_FORMAT); /* four bytes of text */
    if (expected != UFORM_OK)
        assert_string_equal(uform_last_error().message, "video needs FFmpeg, which this build lacks");

    /* The same model without its video entry: UNSUPPORTED, through an outcome too. */
    model->header.info.has_video = false;
    assert_int_equal(uform_video_encode(&args), UFORM_UNSUPPORTED);
    assert_string_equal(uform_last_error().message, "the model has no video tower");
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    args.outcome = &outcome;
    assert_int_equal(uform_video_encode(&args), UFORM_UNSUPPORTED);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_UNSUPPORTED);
    model->header.info.has_video = true;
    assert_int_equal(uform_video_encode(&args), expected);
    assert_int_equal(uform_outcome_wait(&outcome), expected);
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
}

/* ---- Fixtures --------------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
#if UFORM_WITH_FFMPEG
    av_log_set_level(AV_LOG_FATAL); /* broken clips are the point of some tests */
#endif
    uform_tiny_checkpoint_args_t tiny = {.seed = 29, .depth = 2, .hidden = 128};
    if (fixture_setup("video", &tiny, &model, &info) != 0 || !info.has_video) return -1;
    samples = info.video.frames;
    return samples <= 64 ? 0 : -1;
}

int main(void) {
    struct CMUnitTest const tests[] = {
#if UFORM_WITH_FFMPEG
        cmocka_unit_test(clips_sample_the_frames_the_rule_names),
        cmocka_unit_test(lossy_clips_pick_identifiable_frames),
        cmocka_unit_test(files_memory_and_receivers_agree),
        cmocka_unit_test(decoding_overlaps_compute),
        FILE_CASES_TEST("bad_clips_fail_alone", test_cases_fail_alone, &clip_cases),
        cmocka_unit_test(matryoshka_and_conversions),
        cmocka_unit_test(progress_and_cancel),
#endif
        cmocka_unit_test(bad_arguments_and_no_video_tower),
    };
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
