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

#define AUDIO_IO_BUFFER ((size_t)1 << 16)

/* ---- Bytes in memory as an AVIOContext ---------------------------------------------------------- */

typedef struct memory_io {
    uint8_t const *data;
    size_t size, position;
} memory_io_t;

static int memory_read(void *opaque, uint8_t *buffer, int size) {
    memory_io_t *io = opaque;
    size_t left = io->size - io->position;
    if (left == 0) return AVERROR_EOF;
    size_t count = (size_t)size < left ? (size_t)size : left;
    memcpy(buffer, io->data + io->position, count);
    io->position += count;
    return (int)count;
}

static int64_t memory_seek(void *opaque, int64_t offset, int whence) {
    memory_io_t *io = opaque;
    int64_t base;
    switch (whence & ~AVSEEK_FORCE) {
    case AVSEEK_SIZE:
        return (int64_t)io->size;
    case SEEK_SET:
        base = 0;
        break;
    case SEEK_CUR:
        base = (int64_t)io->position;
        break;
    case SEEK_END:
        base = (int64_t)io->size;
        break;
    default:
        return AVERROR(EINVAL);
    }
    if (offset < -base || offset > (int64_t)io->size - base) return AVERROR(EINVAL);
    io->position = (size_t)(base + offset);
    return (int64_t)io->position;
}

/* Demuxers that reach for other files or URLs (playlists, concat lists, image sequences) get none. */
static int refuse_open(AVFormatContext *format, AVIOContext **io, char const *url, int flags,
                       AVDictionary **options) {
    (void)format, (void)io, (void)url, (void)flags, (void)options;
    return AVERROR(EPERM);
}

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

static uform_status_t from_av(int error) {
    return error == AVERROR(ENOMEM) ? UFORM_OUT_OF_MEMORY : UFORM_FORMAT;
}

/* The first frame fixes the rate, format and channels; a converter to mono F32 at that rate, the
 * mean of every channel. */
static uform_status_t decoder_start(decoder_t *decoder, AVFrame const *frame) {
    int channels = frame->ch_layout.nb_channels;
    if (frame->sample_rate <= 0 || (size_t)frame->sample_rate > UFORM_AUDIO_MAX_RATE || channels <= 0 ||
        channels > AUDIO_CHANNELS_MAX)
        return UFORM_FORMAT;
    AVChannelLayout layout;
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
    if (error < 0) return from_av(error);
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
    if (count < 0) return from_av(count);
    if (count == 0) return UFORM_OK;
    if (!pcm_reserve(pcm, (size_t)count)) return UFORM_OUT_OF_MEMORY;
    uint8_t *target = (uint8_t *)(pcm->samples + pcm->length);
    int made =
        swr_convert(decoder->swr, &target, count, frame ? (uint8_t const **)frame->extended_data : NULL,
                    frame ? frame->nb_samples : 0);
    if (made < 0) return from_av(made);
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
    if (error < 0) return from_av(error);
    for (;;) {
        error = avcodec_receive_frame(decoder->codec, decoder->frame);
        if (error == AVERROR(EAGAIN) || error == AVERROR_EOF) return UFORM_OK;
        if (error < 0) return from_av(error);
        uform_status_t status = decoder_take(decoder, decoder->frame);
        av_frame_unref(decoder->frame);
        if (status != UFORM_OK || decoder->pcm->more) return status;
    }
}

/* Probes the streams, with the decoders it opens on one thread each. */
static uform_status_t find_streams(AVFormatContext *format) {
    unsigned streams = format->nb_streams;
    AVDictionary **options = streams ? calloc(streams, sizeof *options) : NULL;
    if (streams && !options) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_OK;
    for (unsigned i = 0; i < streams && status == UFORM_OK; ++i)
        if (av_dict_set(&options[i], "threads", "1", 0) < 0) status = UFORM_OUT_OF_MEMORY;
    if (status == UFORM_OK) {
        int error = avformat_find_stream_info(format, options);
        if (error < 0) status = from_av(error);
    }
    for (unsigned i = 0; i < streams; ++i)
        av_dict_free(&options[i]);
    free(options);
    return status;
}

uform_status_t audio_decode(uint8_t const *data, size_t size, audio_frontend_t const *frontend,
                            audio_pcm_t *pcm) {
    pcm->length = 0;
    pcm->rate = 0;
    pcm->more = false;
    if (!data || size == 0) return UFORM_FORMAT;
    memory_io_t io = {.data = data, .size = size};
    decoder_t decoder = {.frontend = frontend, .pcm = pcm};
    AVFormatContext *format = NULL;
    AVStream *stream = NULL;
    AVCodec const *codec = NULL;
    AVPacket *packet = NULL;
    int error = 0;
    uform_status_t status = UFORM_OUT_OF_MEMORY;
    uint8_t *buffer = av_malloc(AUDIO_IO_BUFFER);
    AVIOContext *avio =
        buffer ? avio_alloc_context(buffer, (int)AUDIO_IO_BUFFER, 0, &io, memory_read, NULL, memory_seek)
               : NULL;
    if (!avio) {
        av_free(buffer);
        return UFORM_OUT_OF_MEMORY;
    }
    format = avformat_alloc_context();
    if (!format) goto done;
    format->pb = avio;
    format->flags |= AVFMT_FLAG_CUSTOM_IO;
    format->io_open = refuse_open;
    error = avformat_open_input(&format, NULL, NULL, NULL); /* frees `format` on failure */
    if (error < 0) {
        status = from_av(error);
        goto done;
    }
    status = find_streams(format);
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
        status = from_av(error);
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
            status = from_av(error);
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
    avformat_close_input(&format);
    av_freep(&avio->buffer); /* FFmpeg may have swapped the buffer for one of its own */
    avio_context_free(&avio);
    return status;
}
