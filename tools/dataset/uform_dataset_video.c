/* The clips of `uform dataset synth`: RGB8 frames as MPEG-4 Part 2 (FFmpeg's native `mpeg4` encoder,
 * in every FFmpeg build) in MP4, where the build has FFmpeg. The RGB to YUV 4:2:0 conversion is done
 * here, in integers, so that the bytes do not depend on libswscale's CPU paths; the encoder and muxer
 * run bit-exact on one thread. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#if UFORM_DATASET_WITH_FFMPEG
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#endif

#include "uform_command.h"
#include "uform_dataset.h"

char const dataset_video_codec[] = "mpeg4", dataset_video_container[] = "mp4";

#if UFORM_DATASET_WITH_FFMPEG

char const *dataset_video_unbuilt(void) {
    return NULL;
}

/* BT.601, limited range, as FFmpeg reads a YUV stream that names no colour space. The offsets keep
 * every sum positive before the shift. */
static uint8_t luma(int r, int g, int b) {
    return (uint8_t)(((66 * r + 129 * g + 25 * b + 128) >> 8) + 16);
}

static uint8_t chroma_blue(int r, int g, int b) {
    return (uint8_t)((-38 * r - 74 * g + 112 * b + 128 + (128 << 8)) >> 8);
}

static uint8_t chroma_red(int r, int g, int b) {
    return (uint8_t)((112 * r - 94 * g - 18 * b + 128 + (128 << 8)) >> 8);
}

/* side x side RGB8 rows into the planes of a YUV420P frame; side is even. Chroma of each 2x2 block
 * from its mean colour. */
static void to_yuv420(uint8_t const *rgb, size_t side, AVFrame *frame) {
    for (size_t y = 0; y < side; ++y)
        for (size_t x = 0; x < side; ++x) {
            uint8_t const *p = rgb + (y * side + x) * 3;
            frame->data[0][y * (size_t)frame->linesize[0] + x] = luma(p[0], p[1], p[2]);
        }
    for (size_t y = 0; y < side / 2; ++y)
        for (size_t x = 0; x < side / 2; ++x) {
            int sum[3] = {0, 0, 0};
            for (size_t dy = 0; dy < 2; ++dy)
                for (size_t dx = 0; dx < 2; ++dx)
                    for (size_t c = 0; c < 3; ++c)
                        sum[c] += rgb[((2 * y + dy) * side + 2 * x + dx) * 3 + c];
            int r = (sum[0] + 2) / 4, g = (sum[1] + 2) / 4, b = (sum[2] + 2) / 4;
            frame->data[1][y * (size_t)frame->linesize[1] + x] = chroma_blue(r, g, b);
            frame->data[2][y * (size_t)frame->linesize[2] + x] = chroma_red(r, g, b);
        }
}

/* Sends `frame` (NULL: the end) and writes every packet the encoder has ready. */
static int encode_frame(AVFormatContext *output, AVStream *stream, AVCodecContext *encoder, AVFrame *frame,
                        AVPacket *packet) {
    int error = avcodec_send_frame(encoder, frame);
    if (error < 0) return error;
    for (;;) {
        error = avcodec_receive_packet(encoder, packet);
        if (error == AVERROR(EAGAIN) || error == AVERROR_EOF) return 0;
        if (error < 0) return error;
        if (packet->duration == 0) packet->duration = 1; /* one frame, in the encoder's time base */
        av_packet_rescale_ts(packet, encoder->time_base, stream->time_base);
        packet->stream_index = stream->index;
        if ((error = av_interleaved_write_frame(output, packet)) < 0) return error;
    }
}

int dataset_video_write(char const *path, uint8_t const *frames, size_t count, size_t side, size_t fps) {
    AVFormatContext *output = NULL;
    AVStream *stream = NULL;
    AVCodecContext *encoder = NULL;
    AVFrame *frame = NULL;
    AVPacket *packet = NULL;
    int error = 0, code = COMMAND_RUNTIME;
    AVCodec const *codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
    if (!codec) return command_fail("cannot write %s: this FFmpeg has no MPEG-4 encoder", path);
    if ((error = avformat_alloc_output_context2(&output, NULL, dataset_video_container, path)) < 0) goto fail;
    output->flags |= AVFMT_FLAG_BITEXACT;
    stream = avformat_new_stream(output, NULL);
    encoder = avcodec_alloc_context3(codec);
    frame = av_frame_alloc();
    packet = av_packet_alloc();
    if (!stream || !encoder || !frame || !packet) {
        error = AVERROR(ENOMEM);
        goto fail;
    }
    encoder->width = encoder->height = (int)side;
    encoder->pix_fmt = AV_PIX_FMT_YUV420P;
    encoder->color_range = AVCOL_RANGE_MPEG;
    encoder->time_base = (AVRational){1, (int)fps};
    encoder->framerate = (AVRational){(int)fps, 1};
    encoder->gop_size = (int)count; /* one key frame: the clips are short */
    encoder->max_b_frames = 0;
    encoder->thread_count = 1;
    encoder->flags |= AV_CODEC_FLAG_QSCALE | AV_CODEC_FLAG_BITEXACT;
    encoder->global_quality = FF_QP2LAMBDA * 3; /* near transparent at these sizes */
    if (output->oformat->flags & AVFMT_GLOBALHEADER) encoder->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    if ((error = avcodec_open2(encoder, codec, NULL)) < 0 ||
        (error = avcodec_parameters_from_context(stream->codecpar, encoder)) < 0)
        goto fail;
    stream->time_base = encoder->time_base;
    if ((error = avio_open(&output->pb, path, AVIO_FLAG_WRITE)) < 0) goto fail;
    if ((error = avformat_write_header(output, NULL)) < 0) goto fail;

    frame->format = AV_PIX_FMT_YUV420P;
    frame->width = frame->height = (int)side;
    frame->color_range = AVCOL_RANGE_MPEG;
    if ((error = av_frame_get_buffer(frame, 0)) < 0) goto fail;
    for (size_t i = 0; i < count; ++i) {
        if ((error = av_frame_make_writable(frame)) < 0) goto fail;
        to_yuv420(frames + i * side * side * 3, side, frame);
        frame->pts = (int64_t)i;
        frame->quality = encoder->global_quality;
        if ((error = encode_frame(output, stream, encoder, frame, packet)) < 0) goto fail;
    }
    if ((error = encode_frame(output, stream, encoder, NULL, packet)) < 0) goto fail;
    if ((error = av_write_trailer(output)) < 0) goto fail;
    if ((error = avio_closep(&output->pb)) < 0) goto fail;
    code = COMMAND_OK;
fail:
    if (code != COMMAND_OK) {
        char reason[AV_ERROR_MAX_STRING_SIZE] = "";
        av_strerror(error, reason, sizeof reason);
        code = command_fail("cannot write %s: FFmpeg: %s", path, reason);
        if (output && output->pb) avio_closep(&output->pb);
        remove(path);
    }
    av_packet_free(&packet);
    av_frame_free(&frame);
    avcodec_free_context(&encoder);
    avformat_free_context(output);
    return code;
}

#else

char const *dataset_video_unbuilt(void) {
    return "this build has no FFmpeg";
}

int dataset_video_write(char const *path, uint8_t const *frames, size_t count, size_t side, size_t fps) {
    (void)frames;
    (void)count;
    (void)side;
    (void)fps;
    return command_fail("cannot write %s: %s", path, dataset_video_unbuilt());
}

#endif
