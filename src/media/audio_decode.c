/* Encoded sounds to mono F32 through FFmpeg (audio_decode.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/mem.h>
#include <libswresample/swresample.h>

#include "audio_decode.h"
#include "ffmpeg_io.h"

#define AUDIO_IO_BUFFER ((size_t)1 << 16)

/* ---- Decoding ----------------------------------------------------------------------------------- */

typedef struct decoder {
    audio_frontend_t const *frontend;
    audio_pcm_t *pcm;
    AVCodecContext *codec;
    SwrContext *swr;
    AVFrame *frame;
    size_t wanted; /* samples the front end reads at most, once the rate is known */
    int format, channels;
} decoder_t;

/* The first frame fixes the rate, format and channels; a converter to mono F32 at that rate, the
 * mean of every channel. */
static uform_status_t decoder_start(decoder_t *decoder, AVFrame const *frame) {
    int channels = frame->ch_layout.nb_channels;
    if (frame->sample_rate <= 0 || (size_t)frame->sample_rate > UFORM_AUDIO_MAX_RATE || channels <= 0 ||
        channels > AUDIO_CHANNELS_MAX)
        return UFORM_FORMAT;
    AVChannelLayout layout = {0}; /* av_channel_layout_copy frees what its target holds first */
    if (frame->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC)
        av_channel_layout_default(&layout, channels);
    else if (av_channel_layout_copy(&layout, &frame->ch_layout) < 0)
        return UFORM_OUT_OF_MEMORY;
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    int error = swr_alloc_set_opts2(&decoder->swr, &mono, AV_SAMPLE_FMT_FLT, frame->sample_rate, &layout,
                                    (enum AVSampleFormat)frame->format, frame->sample_rate, 0, NULL);
    av_channel_layout_uninit(&layout);
    double matrix[AUDIO_CHANNELS_MAX];
    for (int c = 0; c < channels; ++c)
        matrix[c] = 1.0 / channels;
    if (error >= 0) error = swr_set_matrix(decoder->swr, matrix, channels);
    if (error >= 0) error = swr_init(decoder->swr);
    if (error < 0) return ffmpeg_status(error);
    decoder->format = frame->format;
    decoder->channels = channels;
    decoder->pcm->rate = (size_t)frame->sample_rate;
    decoder->wanted = audio_input_needed(decoder->frontend, decoder->pcm->rate);
    return UFORM_OK;
}

/* Room for `count` more samples, at most up to `wanted`. */
static bool pcm_reserve(audio_pcm_t *pcm, size_t count) {
    if (pcm->length + count <= pcm->capacity) return true;
    size_t capacity = pcm->capacity ? pcm->capacity : 4096;
    while (capacity < pcm->length + count)
        capacity = capacity > SIZE_MAX / 2 ? pcm->length + count : 2 * capacity;
    if (capacity > SIZE_MAX / sizeof(float)) return false;
    float *grown = realloc(pcm->samples, capacity * sizeof(float));
    if (!grown) return false;
    pcm->samples = grown;
    pcm->capacity = capacity;
    return true;
}

/* Converts one decoded frame (NULL: what the converter still holds) and appends it, up to `wanted`. */
static uform_status_t decoder_take(decoder_t *decoder, AVFrame const *frame) {
    audio_pcm_t *pcm = decoder->pcm;
    if (frame && !decoder->swr) {
        uform_status_t status = decoder_start(decoder, frame);
        if (status != UFORM_OK) return status;
    }
    if (!decoder->swr) return UFORM_OK;
    if (frame && (frame->sample_rate != (int)pcm->rate || frame->format != decoder->format ||
                  frame->ch_layout.nb_channels != decoder->channels))
        return UFORM_FORMAT;
    int count = swr_get_out_samples(decoder->swr, frame ? frame->nb_samples : 0);
    if (count < 0) return ffmpeg_status(count);
    if (count == 0) return UFORM_OK;
    if (!pcm_reserve(pcm, (size_t)count)) return UFORM_OUT_OF_MEMORY;
    uint8_t *target = (uint8_t *)(pcm->samples + pcm->length);
    int made =
        swr_convert(decoder->swr, &target, count, frame ? (uint8_t const **)frame->extended_data : NULL,
                    frame ? frame->nb_samples : 0);
    if (made < 0) return ffmpeg_status(made);
    float const *appended = pcm->samples + pcm->length;
    for (int i = 0; i < made; ++i)
        if (!isfinite(appended[i])) return UFORM_FORMAT;
    pcm->length += (size_t)made;
    if (pcm->length > decoder->wanted) {
        pcm->length = decoder->wanted;
        pcm->more = true;
    }
    return UFORM_OK;
}

/* Hands a packet (NULL: the end) to the decoder and takes every frame it gives back. */
static uform_status_t decoder_feed(decoder_t *decoder, AVPacket const *packet) {
    if (packet && (packet->flags & AV_PKT_FLAG_CORRUPT)) return UFORM_FORMAT;
    int error = avcodec_send_packet(decoder->codec, packet);
    if (error < 0) return ffmpeg_status(error);
    for (;;) {
        error = avcodec_receive_frame(decoder->codec, decoder->frame);
        if (error == AVERROR(EAGAIN) || error == AVERROR_EOF) return UFORM_OK;
        if (error < 0) return ffmpeg_status(error);
        uform_status_t status = decoder_take(decoder, decoder->frame);
        av_frame_unref(decoder->frame);
        if (status != UFORM_OK || decoder->pcm->more) return status;
    }
}

uform_status_t audio_decode(uint8_t const *data, size_t size, audio_frontend_t const *frontend,
                            audio_pcm_t *pcm) {
    pcm->length = 0;
    pcm->rate = 0;
    pcm->more = false;
    if (!data || size == 0) return UFORM_FORMAT;
    ffmpeg_memory_t memory;
    decoder_t decoder = {.frontend = frontend, .pcm = pcm};
    AVFormatContext *format = NULL;
    AVStream *stream = NULL;
    AVCodec const *codec = NULL;
    AVPacket *packet = NULL;
    int error = 0;
    uform_status_t status = ffmpeg_memory_open(&memory, data, size, AUDIO_IO_BUFFER);
    if (status != UFORM_OK) goto done;
    format = memory.format;
    status = ffmpeg_find_streams(format, 0);
    if (status != UFORM_OK) goto done;
    for (unsigned i = 0; i < format->nb_streams; ++i) {
        if (!stream && format->streams[i]->codecpar->codec_type == AVMEDIA_TYPE_AUDIO)
            stream = format->streams[i];
        else
            format->streams[i]->discard = AVDISCARD_ALL;
    }
    status = UFORM_FORMAT;
    if (!stream) goto done;
    codec = avcodec_find_decoder(stream->codecpar->codec_id);
    status = UFORM_UNSUPPORTED;
    if (!codec) goto done;
    status = UFORM_OUT_OF_MEMORY;
    decoder.codec = avcodec_alloc_context3(codec);
    decoder.frame = av_frame_alloc();
    packet = av_packet_alloc();
    if (!decoder.codec || !decoder.frame || !packet) goto done;
    error = avcodec_parameters_to_context(decoder.codec, stream->codecpar);
    decoder.codec->thread_count = 1; /* the engine runs items in parallel, each on one thread */
    if (error >= 0) error = avcodec_open2(decoder.codec, codec, NULL);
    if (error < 0) {
        status = ffmpeg_status(error);
        goto done;
    }
    status = UFORM_OK;
    for (size_t packets = 0; status == UFORM_OK && !pcm->more; ++packets) {
        if (packets == AUDIO_PACKETS_MAX) {
            status = UFORM_FORMAT;
            break;
        }
        error = av_read_frame(format, packet);
        if (error == AVERROR_EOF) break;
        if (error < 0) {
            status = ffmpeg_status(error);
            break;
        }
        if (packet->stream_index == stream->index) status = decoder_feed(&decoder, packet);
        av_packet_unref(packet);
    }
    if (status == UFORM_OK && !pcm->more) status = decoder_feed(&decoder, NULL);
    if (status == UFORM_OK && !pcm->more) status = decoder_take(&decoder, NULL);
done:
    if (status != UFORM_OK) pcm->length = 0;
    av_packet_free(&packet);
    av_frame_free(&decoder.frame);
    avcodec_free_context(&decoder.codec);
    swr_free(&decoder.swr);
    ffmpeg_memory_close(&memory);
    return status;
}
