/* Encoded clips to sampled RGB8 frames: libavformat demuxes, libavcodec decodes, libswscale converts,
 * all over bytes in memory (a custom AVIOContext; every nested open a demuxer may ask for, such as a
 * playlist's or a concat list's, is refused).
 *
 * The clip is its first video stream that is not an attached picture (cover art). Its times come from
 * that stream's packets, in the stream's time base: a packet's time is its pts, or its dts where the
 * container gives no pts, or the previous packet's time plus the frame period where it gives neither
 * (the period is 1 / avg_frame_rate, at least one tick). `start` is the smallest packet time, `end` the
 * latest end of a packet: its time plus its duration or, where the container gives none, plus the
 * frame period, else plus the gap between the two latest packet times (0 for a lone packet); and
 * `duration` = end - start. A first pass demuxes the packets to find them; the second decodes the
 * frames in presentation order.
 *
 * Sampling: frame i is shown from its time (best_effort_timestamp; the previous frame's time plus the
 * period when it has none; `start` for a first frame without one) until the next frame's time, the last
 * frame until the end. Sample k of F is the frame shown at time start + (k + 0.5) * duration / F,
 * compared exactly in integers; a time before every frame takes the first frame. Frames are decoded
 * sequentially from the start (no seeking: every container and codec gives the same answer), and
 * decoding stops once the last sample is taken. A clip with fewer frames than F repeats frames.
 *
 * Conversion: libswscale, to RGB24 at the frame's own size (no scaling): YUV with the frame's matrix
 * (BT.601 where unspecified) and range (limited unless it says full), chroma upsampled bilinearly, with
 * accurate rounding and bit-exact arithmetic. Sample aspect ratio, rotation metadata and interlacing are
 * ignored, as EXIF orientation is for images.
 *
 * Strictness: a demuxer read error other than the end of the file, a packet flagged corrupt, or a
 * decoder error (decoders run with AV_EF_EXPLODE, and frames flagged corrupt are refused) fails the
 * clip. A clip whose container simply ends early is decoded from the frames it holds.
 *
 * Limits against hostile files (uform.h): UFORM_VIDEO_MAX_BYTES per encoded clip, UFORM_VIDEO_MAX_PACKETS
 * packets demuxed per pass (every stream's) and frames decoded, and UFORM_IMAGE_MAX_PIXELS per frame
 * (checked on the stream's parameters, enforced by the decoders, and checked again on every frame). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "image_preprocess.h"
#include "uform.h"

/* One decoded frame in RGB8: `height` rows of `width` pixels (3 bytes each), `stride` bytes apart. */
typedef struct video_frame {
    uint8_t const *rgb;
    size_t height, width, stride;
} video_frame_t;

/* Takes samples [first, first + count) of the clip, all of them this frame (valid only during the
 * call). Anything but UFORM_OK stops the decode, which answers that status. */
typedef uform_status_t (*video_sink_t)(void *context, size_t first, size_t count, video_frame_t const *frame);

#define VIDEO_FRAMES_MAX ((size_t)1 << 20) /* samples per clip: times stay exact in 128-bit integers */

/* Decodes `size` bytes at `data` and hands `frames` samples to `sink`, in order, each exactly once
 * when it answers UFORM_OK. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (frames is 0 or over
 * VIDEO_FRAMES_MAX, no sink), UFORM_FORMAT (not a container FFmpeg knows, no video stream, no frames: a
 * zero-length clip, malformed, past the limits), UFORM_UNSUPPORTED (a codec or pixel format this FFmpeg
 * lacks; every clip in a build without FFmpeg), UFORM_OUT_OF_MEMORY, or the sink's failure. Thread-safe:
 * every demuxer, decoder and converter is its own; FFmpeg runs single-threaded inside (callers decode clips
 * in parallel). FFmpeg's own messages go through the engine's log callback (ffmpeg_io.c). */
uform_status_t video_decode(uint8_t const *data, size_t size, size_t frames, video_sink_t sink,
                            void *context);
