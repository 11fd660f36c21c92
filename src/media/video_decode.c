/* Clips to sampled RGB8 frames through FFmpeg: the convention is spelled out in video_decode.h. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "uform_config.h"
#include "video_decode.h"

#if UFORM_WITH_FFMPEG
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>

#include "ffmpeg_io.h"

#define VIDEO_IO_BUFFER 32768
#define VIDEO_SWS_FLAGS                                                                                      \
    (SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP | SWS_BITEXACT)

/* ---- Demuxing -------------------------------------------------------------------------------------- */

typedef struct demuxer {
    ffmpeg_memory_t memory;
    AVStream *stream; /* the clip's */
    size_t packets;   /* read so far, every stream's */
} demuxer_t;

/* Opens the bytes, probes the streams and picks the first video stream that is not cover art. */
static uform_status_t demuxer_open(demuxer_t *demuxer, uint8_t const *data, size_t size) {
    *demuxer = (demuxer_t){0};
    uform_status_t status = ffmpeg_memory_open(&demuxer->memory, data, size, VIDEO_IO_BUFFER);
    if (status != UFORM_OK) return status;
    AVFormatContext *format = demuxer->memory.format;
    /* The decoders avformat_find_stream_info opens get the same pixel limit. */
    status = ffmpeg_find_streams(format, (int64_t)UFORM_IMAGE_MAX_PIXELS);
    if (status != UFORM_OK) return status;
    for (unsigned i = 0; i < format->nb_streams && !demuxer->stream; ++i) {
        AVStream *stream = format->streams[i];
        if (stream->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
            !(stream->disposition & AV_DISPOSITION_ATTACHED_PIC))
            demuxer->stream = stream;
    }
    if (!demuxer->stream) return UFORM_FORMAT;
    AVCodecParameters const *parameters = demuxer->stream->codecpar;
    if (parameters->width < 0 || parameters->height < 0 ||
        (parameters->width > 0 &&
         (size_t)parameters->height > UFORM_IMAGE_MAX_PIXELS / (size_t)parameters->width))
        return UFORM_FORMAT;
    return UFORM_OK;
}

/* The next packet of the clip's stream, or `*end` at the end of the file. */
static uform_status_t demuxer_next(demuxer_t *demuxer, AVPacket *packet, bool *end) {
    for (;;) {
        if (demuxer->packets >= UFORM_VIDEO_MAX_PACKETS) return UFORM_FORMAT;
        int error = av_read_frame(demuxer->memory.format, packet);
        if (error == AVERROR_EOF) {
            *end = true;
            return UFORM_OK;
        }
        if (error < 0) return ffmpeg_status(error);
        demuxer->packets++;
        if (packet->stream_index == demuxer->stream->index) {
            if (!(packet->flags & AV_PKT_FLAG_CORRUPT)) return UFORM_OK;
            av_packet_unref(packet);
            return UFORM_FORMAT;
        }
        av_packet_unref(packet);
    }
}

/* ---- The clip's span: the first pass ------------------------------------------------------------------ */

typedef struct span {
    int64_t start, end; /* in the stream's time base */
    int64_t step;       /* the frame period, at least 1: the time a frame without one takes after the last */
} span_t;

/* 1 / avg_frame_rate in the stream's time base, 0 when unknown. */
static int64_t stream_period(AVStream const *stream) {
    AVRational rate = stream->avg_frame_rate;
    if (rate.num <= 0 || rate.den <= 0 || stream->time_base.num <= 0 || stream->time_base.den <= 0) return 0;
    int64_t period = av_rescale_q(1, av_inv_q(rate), stream->time_base);
    return period > 0 ? period : 0;
}

/* What the first pass gathers: the smallest time; the latest end of a packet with a duration and the
 * latest time of one without; the two latest distinct times. */
typedef struct times {
    bool any, timed, untimed, gap;
    int64_t start, timed_end, untimed_latest, latest, previous, last;
} times_t;

static uform_status_t times_add(times_t *times, AVPacket const *packet, int64_t step) {
    int64_t time = packet->pts != AV_NOPTS_VALUE ? packet->pts : packet->dts;
    if (time == AV_NOPTS_VALUE && __builtin_add_overflow(times->last, times->any ? step : 0, &time))
        return UFORM_FORMAT;
    if (packet->duration > 0) {
        int64_t stop = 0;
        if (__builtin_add_overflow(time, packet->duration, &stop)) return UFORM_FORMAT;
        times->timed_end = times->timed && times->timed_end > stop ? times->timed_end : stop;
        times->timed = true;
    } else {
        times->untimed_latest = times->untimed && times->untimed_latest > time ? times->untimed_latest : time;
        times->untimed = true;
    }
    if (!times->any || time > times->latest) {
        if (times->any) times->previous = times->latest, times->gap = true;
        times->latest = time;
    } else if (time < times->latest && (!times->gap || time > times->previous)) {
        times->previous = time;
        times->gap = true;
    }
    times->start = times->any && times->start < time ? times->start : time;
    times->last = time;
    times->any = true;
    return UFORM_OK;
}

/* Demuxes every packet of the clip's stream for its start and end: the latest end of a packet, a packet
 * without a duration lasting the frame period, else the gap between the two latest packet times. */
static uform_status_t clip_span(demuxer_t *demuxer, span_t *span) {
    int64_t period = stream_period(demuxer->stream);
    span->step = period > 0 ? period : 1;
    AVPacket *packet = av_packet_alloc();
    if (!packet) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_OK;
    times_t times = {0};
    bool end = false;
    while (status == UFORM_OK) {
        status = demuxer_next(demuxer, packet, &end);
        if (status != UFORM_OK || end) break;
        status = times_add(&times, packet, span->step);
        av_packet_unref(packet);
    }
    av_packet_free(&packet);
    if (status != UFORM_OK) return status;
    if (!times.any) return UFORM_FORMAT; /* a zero-length clip */
    span->start = times.start;
    span->end = times.timed_end;
    if (times.untimed) {
        int64_t length = period, stop = 0;
        if (length == 0 && times.gap && __builtin_sub_overflow(times.latest, times.previous, &length))
            return UFORM_FORMAT;
        if (__builtin_add_overflow(times.untimed_latest, length, &stop)) return UFORM_FORMAT;
        span->end = times.timed && span->end > stop ? span->end : stop;
    }
    return UFORM_OK;
}

/* ---- Converting to RGB8 ----------------------------------------------------------------------------- */

typedef struct converter {
    struct SwsContext *sws;
    uint8_t *rgb;
    size_t capacity;
} converter_t;

/* The matrix libswscale knows by the frame's colour space; BT.601 where unspecified. */
static int sws_matrix(enum AVColorSpace space) {
    switch (space) {
    case AVCOL_SPC_BT709:
        return SWS_CS_ITU709;
    case AVCOL_SPC_FCC:
        return SWS_CS_FCC;
    case AVCOL_SPC_SMPTE240M:
        return SWS_CS_SMPTE240M;
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL:
        return SWS_CS_BT2020;
    default:
        return SWS_CS_ITU601;
    }
}

/* The deprecated full-range "J" formats as the plain ones plus the range they imply. */
static enum AVPixelFormat plain_format(enum AVPixelFormat format, bool *full) {
    switch (format) {
    case AV_PIX_FMT_YUVJ420P:
        return *full = true, AV_PIX_FMT_YUV420P;
    case AV_PIX_FMT_YUVJ422P:
        return *full = true, AV_PIX_FMT_YUV422P;
    case AV_PIX_FMT_YUVJ444P:
        return *full = true, AV_PIX_FMT_YUV444P;
    case AV_PIX_FMT_YUVJ440P:
        return *full = true, AV_PIX_FMT_YUV440P;
    case AV_PIX_FMT_YUVJ411P:
        return *full = true, AV_PIX_FMT_YUV411P;
    default:
        return format;
    }
}

static uform_status_t convert(converter_t *converter, AVFrame const *frame, video_frame_t *out) {
    if (frame->width <= 0 || frame->height <= 0 ||
        (size_t)frame->height > UFORM_IMAGE_MAX_PIXELS / (size_t)frame->width)
        return UFORM_FORMAT;
    size_t width = (size_t)frame->width, height = (size_t)frame->height;
    bool full = frame->color_range == AVCOL_RANGE_JPEG;
    enum AVPixelFormat format = plain_format((enum AVPixelFormat)frame->format, &full);
    AVPixFmtDescriptor const *descriptor = av_pix_fmt_desc_get(format);
    if (!descriptor || !sws_isSupportedInput(format)) return UFORM_UNSUPPORTED;
    /* Rows 64-byte aligned, and slack after the last: libswscale's SIMD may write whole vectors. */
    size_t stride = (width * 3 + 63) & ~(size_t)63, bytes = stride * height + 64;
    if (bytes > converter->capacity) {
        av_free(converter->rgb);
        converter->rgb = av_malloc(bytes);
        converter->capacity = converter->rgb ? bytes : 0;
        if (!converter->rgb) return UFORM_OUT_OF_MEMORY;
    }
    converter->sws = sws_getCachedContext(converter->sws, frame->width, frame->height, format, frame->width,
                                          frame->height, AV_PIX_FMT_RGB24, VIDEO_SWS_FLAGS, NULL, NULL, NULL);
    if (!converter->sws) return UFORM_OUT_OF_MEMORY;
    bool yuv = descriptor->nb_components >= 3 &&
               !(descriptor->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL)) &&
               format != AV_PIX_FMT_XYZ12LE && format != AV_PIX_FMT_XYZ12BE;
    if (yuv &&
        sws_setColorspaceDetails(converter->sws, sws_getCoefficients(sws_matrix(frame->colorspace)), full,
                                 sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16) < 0)
        return UFORM_UNSUPPORTED;
    uint8_t *planes[4] = {converter->rgb};
    int strides[4] = {(int)stride};
    int rows = sws_scale(converter->sws, (uint8_t const *const *)frame->data, frame->linesize, 0,
                         frame->height, planes, strides);
    if (rows != frame->height) return UFORM_FORMAT;
    *out = (video_frame_t){converter->rgb, height, width, stride};
    return UFORM_OK;
}

/* ---- Sampling while decoding: the second pass ------------------------------------------------------- */

typedef struct sampler {
    span_t span;
    size_t frames, next; /* samples asked; the first not handed out yet */
    video_sink_t sink;
    void *context;
    converter_t converter;
    AVFrame *held; /* the latest frame: shown until a later one's time */
    bool holding;
    int64_t held_time;
    size_t decoded;
} sampler_t;

/* Hands samples [next, next + count) to the sink, all of them `frame`. */
static uform_status_t sampler_emit(sampler_t *sampler, AVFrame const *frame, size_t count) {
    video_frame_t rgb;
    uform_status_t status = convert(&sampler->converter, frame, &rgb);
    if (status == UFORM_OK) status = sampler->sink(sampler->context, sampler->next, count, &rgb);
    sampler->next += count;
    return status;
}

/* A decoded frame at `time`: the samples shown before it take the frame held so far (this one when it
 * is the first), then it is held. Sample k is before time T when start + (2k + 1) * duration / 2F < T. */
static uform_status_t sampler_offer(sampler_t *sampler, AVFrame *frame) {
    int64_t time = frame->best_effort_timestamp;
    if (time == AV_NOPTS_VALUE &&
        __builtin_add_overflow(sampler->holding ? sampler->held_time : sampler->span.start,
                               sampler->holding ? sampler->span.step : 0, &time))
        return UFORM_FORMAT;
    __int128 duration = (__int128)sampler->span.end - sampler->span.start;
    __int128 position = ((__int128)time - sampler->span.start) * 2 * (__int128)sampler->frames;
    size_t count = 0;
    while (sampler->next + count < sampler->frames &&
           (__int128)(2 * (sampler->next + count) + 1) * duration < position)
        ++count;
    uform_status_t status = UFORM_OK;
    if (count) status = sampler_emit(sampler, sampler->holding ? sampler->held : frame, count);
    av_frame_unref(sampler->held);
    av_frame_move_ref(sampler->held, frame);
    sampler->holding = true;
    sampler->held_time = time;
    return status;
}

/* One frame out of the decoder, checked and offered to the sampler; `*more` when there was one. */
static uform_status_t decoder_take(AVCodecContext *decoder, sampler_t *sampler, AVFrame *frame, bool *more) {
    *more = false;
    int error = avcodec_receive_frame(decoder, frame);
    if (error == AVERROR(EAGAIN) || error == AVERROR_EOF) return UFORM_OK;
    if (error < 0) return ffmpeg_status(error);
    *more = true;
    if (++sampler->decoded > UFORM_VIDEO_MAX_PACKETS || (frame->flags & AV_FRAME_FLAG_CORRUPT) ||
        frame->decode_error_flags) {
        av_frame_unref(frame);
        return UFORM_FORMAT;
    }
    return sampler_offer(sampler, frame);
}

static uform_status_t decoder_open(AVStream const *stream, AVCodecContext **decoder) {
    AVCodec const *codec = avcodec_find_decoder(stream->codecpar->codec_id);
    if (!codec) return UFORM_UNSUPPORTED;
    *decoder = avcodec_alloc_context3(codec);
    if (!*decoder) return UFORM_OUT_OF_MEMORY;
    int error = avcodec_parameters_to_context(*decoder, stream->codecpar);
    if (error < 0) return ffmpeg_status(error);
    (*decoder)->thread_count = 1;
    (*decoder)->max_pixels = (int64_t)UFORM_IMAGE_MAX_PIXELS;
    (*decoder)->err_recognition |= AV_EF_EXPLODE;
    (*decoder)->pkt_timebase = stream->time_base;
    error = avcodec_open2(*decoder, codec, NULL);
    return error < 0 ? ffmpeg_status(error) : UFORM_OK;
}

static uform_status_t clip_decode(demuxer_t *demuxer, span_t const *span, size_t frames, video_sink_t sink,
                                  void *context) {
    sampler_t sampler = {.span = *span, .frames = frames, .sink = sink, .context = context};
    AVCodecContext *decoder = NULL;
    AVPacket *packet = av_packet_alloc();
    AVFrame *frame = av_frame_alloc();
    sampler.held = av_frame_alloc();
    uform_status_t status = packet && frame && sampler.held ? UFORM_OK : UFORM_OUT_OF_MEMORY;
    if (status == UFORM_OK) status = decoder_open(demuxer->stream, &decoder);
    bool end = false, more = false;
    while (status == UFORM_OK && sampler.next < frames && !end) {
        status = demuxer_next(demuxer, packet, &end);
        if (status != UFORM_OK) break;
        int error = avcodec_send_packet(decoder, end ? NULL : packet); /* NULL: drain at the end */
        av_packet_unref(packet);
        if (error < 0) {
            status = ffmpeg_status(error);
            break;
        }
        do
            status = decoder_take(decoder, &sampler, frame, &more);
        while (status == UFORM_OK && more && sampler.next < frames);
    }
    if (status == UFORM_OK && sampler.next < frames)
        status = sampler.holding ? sampler_emit(&sampler, sampler.held, frames - sampler.next) : UFORM_FORMAT;
    avcodec_free_context(&decoder);
    av_packet_free(&packet);
    av_frame_free(&frame);
    av_frame_free(&sampler.held);
    sws_freeContext(sampler.converter.sws);
    av_free(sampler.converter.rgb);
    return status;
}

uform_status_t video_decode(uint8_t const *data, size_t size, size_t frames, video_sink_t sink,
                            void *context) {
    if (frames == 0 || frames > VIDEO_FRAMES_MAX || !sink) return UFORM_INVALID_ARGUMENT;
    if (size == 0 || !data || size > UFORM_VIDEO_MAX_BYTES) return UFORM_FORMAT;
    demuxer_t demuxer;
    span_t span = {0};
    uform_status_t status = demuxer_open(&demuxer, data, size);
    if (status == UFORM_OK) status = clip_span(&demuxer, &span);
    ffmpeg_memory_close(&demuxer.memory);
    if (status != UFORM_OK) return status;
    status = demuxer_open(&demuxer, data, size); /* the same bytes pick the same stream */
    if (status == UFORM_OK) status = clip_decode(&demuxer, &span, frames, sink, context);
    ffmpeg_memory_close(&demuxer.memory);
    return status;
}

#else

uform_status_t video_decode(uint8_t const *data, size_t size, size_t frames, video_sink_t sink,
                            void *context) {
    (void)data, (void)size, (void)context;
    return frames == 0 || frames > VIDEO_FRAMES_MAX || !sink ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED;
}

#endif
