/*
 * Stand-in for miniaudio.h, which Go strips from the ollama module (vendor/
 * directories are not part of module zips). llama.cpp's mtmd helper only uses
 * it to decode audio input for multimodal models; apiary serves text, so every
 * decoder call here reports failure and the helper rejects audio input.
 */
#ifndef APIARY_MINIAUDIO_STUB_H
#define APIARY_MINIAUDIO_STUB_H

#include <stddef.h>
#include <stdint.h>

typedef int ma_result;
typedef uint64_t ma_uint64;
typedef uint32_t ma_uint32;

#define MA_SUCCESS 0
#define MA_NOT_IMPLEMENTED (-29)

typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
typedef enum { ma_encoding_format_wav = 1 } ma_encoding_format;

typedef struct { ma_format format; ma_uint32 channels; ma_uint32 sampleRate; } ma_decoder_config;
typedef struct { int unused; } ma_decoder;
typedef struct { int unused; } ma_encoder_config;
typedef struct { int unused; } ma_encoder;

static inline ma_decoder_config ma_decoder_config_init(ma_format format, ma_uint32 channels, ma_uint32 rate) {
    ma_decoder_config c; c.format = format; c.channels = channels; c.sampleRate = rate; return c;
}
static inline ma_result ma_decoder_init_memory(const void *data, size_t size, const ma_decoder_config *cfg, ma_decoder *dec) {
    (void)data; (void)size; (void)cfg; (void)dec; return MA_NOT_IMPLEMENTED;
}
static inline ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *dec, ma_uint64 *n) {
    (void)dec; *n = 0; return MA_NOT_IMPLEMENTED;
}
static inline ma_result ma_decoder_read_pcm_frames(ma_decoder *dec, void *out, ma_uint64 n, ma_uint64 *read) {
    (void)dec; (void)out; (void)n; *read = 0; return MA_NOT_IMPLEMENTED;
}
static inline ma_result ma_decoder_uninit(ma_decoder *dec) { (void)dec; return MA_SUCCESS; }

#endif
