/* uform info [--model PATH] [--json]: what a checkpoint holds, read from its validated header. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "uform_command.h"

static char const help_head[] =
    "usage: uform info [--model PATH] [--json]\n"
    "\n"
    "Describes a checkpoint or a pretrained model's folder: its family, embedding width (and whether\n"
    "embeddings are unit vectors), matryoshka widths, parameters and bytes of weights, whether the\n"
    "blocks' linear layers are BF16 or I8, and per tower (text, image, video, audio) the\n"
    "transformer's depth, hidden width, heads and MLP width, its block's settings (norm, activation,\n"
    "positions, mask, pooling) and the tower's own sizes (text: its context in bytes or tokens).\n"
    "Then the CPU kernel path this process computes on and why it was chosen (UFORM_KERNELS names\n"
    "one; else a fixed rule per CPU picks the fastest).\n"
    "\n";

/* ---- text ------------------------------------------------------------------------------------- */

/* The block's settings as the metadata names them. */
static char const *norm_name(uform_norm_t norm) {
    return norm == UFORM_NORM_LAYER ? "layer" : "rms";
}

static char const *activation_name(uform_activation_t activation) {
    static char const *const names[] = {"gelu_tanh", "gelu_erf", "gelu_quick"};
    return (size_t)activation < 3 ? names[activation] : "unknown";
}

static char const *pooling_name(uform_pooling_t pooling) {
    static char const *const names[] = {"last", "first", "mean", "end", "head"};
    return (size_t)pooling < 5 ? names[pooling] : "unknown";
}

static char const *resize_name(uform_image_resize_t resize) {
    static char const *const names[] = {"short_side", "short_side_round_crop", "square"};
    return (size_t)resize < 3 ? names[resize] : "unknown";
}

static char const *resample_name(uform_image_resample_t resample) {
    static char const *const names[] = {"float_bilinear", "pillow_bicubic", "pillow_bilinear"};
    return (size_t)resample < 3 ? names[resample] : "unknown";
}

static void print_transformer(char const *tower, uform_transformer_info_t const *transformer) {
    char registers[48] = "";
    if (transformer->registers)
        snprintf(registers, sizeof registers, ", %zu register tokens", transformer->registers);
    printf("%-11s depth %zu, hidden %zu, heads %zu of %zu, mlp %zu; %s norm (eps %.3g) %s each branch%s%s, "
           "%s, %s positions%s, %s attention%s, pooled %s%s;",
           tower, transformer->depth, transformer->hidden, transformer->heads, transformer->head,
           transformer->mlp, norm_name(transformer->norm), (double)transformer->norm_eps,
           transformer->post_norm ? "after" : "before", transformer->input_norm ? ", over the inputs" : "",
           transformer->final_norm ? ", final" : "", activation_name(transformer->activation),
           transformer->rotary ? "rotary" : "learned",
           transformer->relative_buckets ? " and a bias by relative position" : "",
           transformer->causal ? "causal" : "bidirectional", registers, pooling_name(transformer->pooling),
           !transformer->projection       ? ""
           : transformer->projection_tanh ? ", projected through tanh"
                                          : ", projected");
}

static void print_text(char const *path, uform_model_info_t const *info) {
    printf("%-11s %s\n%-11s %s\n%-11s %zu\n%-11s %s\n%-11s", "model", path, "family", info->family, "dims",
           info->dims, "normalized", info->normalized ? "yes (unit vectors)" : "no", "matryoshka");
    for (size_t i = 0; i < info->matryoshka_count; ++i)
        printf(" %zu", info->matryoshka[i]);
    printf("\n%-11s %zu\n%-11s %zu\n%-11s %s\n", "parameters", info->parameters, "bytes", info->bytes,
           "logit", info->has_logit ? "yes" : "no");
    printf("%-11s %s\n", "weights",
           info->weights == UFORM_WEIGHTS_I8 ? "I8 (the blocks' linear layers; BF16 elsewhere)" : "BF16");
    char const *reason = NULL, *amx = NULL, *kernels = uform_kernels(&reason, &amx);
    printf("%-11s %s (%s); %s\n", "kernels", kernels, reason, amx);
    if (info->has_text) {
        print_transformer("text", &info->text.transformer);
        if (info->text.vocab)
            printf(" context %zu tokens, vocabulary %zu\n", info->text.context, info->text.vocab);
        else
            printf(" context %zu bytes\n", info->text.context);
    }
    if (info->has_image) {
        print_transformer("image", &info->image.transformer);
        printf(" %zu px square, %zu px patches, mean %.4g %.4g %.4g, std %.4g %.4g %.4g, resized %s, %s\n",
               info->image.size, info->image.patch, info->image.mean[0], info->image.mean[1],
               info->image.mean[2], info->image.std[0], info->image.std[1], info->image.std[2],
               resize_name(info->image.resize), resample_name(info->image.resample));
    }
    if (info->has_video)
        printf("%-11s %zu frames per clip, through the image tower\n", "video", info->video.frames);
    if (info->has_audio) {
        print_transformer("audio", &info->audio.transformer);
        printf(" %zu Hz, %zu mels, window %zu, hop %zu, %zu frames per patch, at most %zu patches, %.9g s\n",
               info->audio.rate, info->audio.mels, info->audio.window, info->audio.hop,
               info->audio.patch_frames, info->audio.max_patches, info->audio.seconds);
    }
}

/* ---- JSON ------------------------------------------------------------------------------------- */

/* jansson's setters release the value when they fail, and refuse a NULL value or container, so a
 * chain of them needs one check at its end: any allocation failure shows up as a non-zero sum. */
static int set(json_t *object, char const *key, json_t *value) {
    return json_object_set_new(object, key, value) != 0;
}

static int set_size(json_t *object, char const *key, size_t value) {
    return set(object, key, json_integer((json_int_t)value));
}

/* `object` if nothing failed while filling it, else NULL with the object released. */
static json_t *checked(json_t *object, int failures) {
    if (!failures) return object;
    json_decref(object);
    return NULL;
}

static json_t *floats_json(float const *values, size_t count) {
    json_t *array = json_array();
    int failures = 0;
    for (size_t i = 0; i < count; ++i)
        failures += json_array_append_new(array, json_real(values[i])) != 0;
    return checked(array, failures);
}

static json_t *transformer_json(uform_transformer_info_t const *transformer) {
    json_t *object = json_object();
    return checked(
        object, set_size(object, "depth", transformer->depth) +
                    set_size(object, "hidden", transformer->hidden) +
                    set_size(object, "heads", transformer->heads) +
                    set_size(object, "head", transformer->head) + set_size(object, "mlp", transformer->mlp) +
                    set(object, "norm", json_string(norm_name(transformer->norm))) +
                    set(object, "norm_eps", json_real((double)transformer->norm_eps)) +
                    set(object, "post_norm", json_boolean(transformer->post_norm)) +
                    set(object, "input_norm", json_boolean(transformer->input_norm)) +
                    set(object, "final_norm", json_boolean(transformer->final_norm)) +
                    set(object, "activation", json_string(activation_name(transformer->activation))) +
                    set(object, "rotary", json_boolean(transformer->rotary)) +
                    set(object, "causal", json_boolean(transformer->causal)) +
                    set(object, "pooling", json_string(pooling_name(transformer->pooling))) +
                    set(object, "projection", json_boolean(transformer->projection)) +
                    set_size(object, "registers", transformer->registers) +
                    set_size(object, "relative_buckets", transformer->relative_buckets) +
                    set(object, "projection_tanh", json_boolean(transformer->projection_tanh)));
}

static json_t *text_json(uform_model_info_t const *info) {
    json_t *tower = transformer_json(&info->text.transformer);
    return checked(tower, set_size(tower, "context", info->text.context) +
                              set(tower, "reads", json_string(info->text.vocab ? "tokens" : "bytes")) +
                              set_size(tower, "vocab", info->text.vocab) +
                              set_size(tower, "positions", info->text.positions) +
                              set_size(tower, "position_offset", info->text.position_offset) +
                              set(tower, "token_type", json_boolean(info->text.token_type)));
}

static json_t *image_json(uform_model_info_t const *info) {
    json_t *tower = transformer_json(&info->image.transformer);
    return checked(tower, set_size(tower, "size", info->image.size) +
                              set_size(tower, "patch", info->image.patch) +
                              set(tower, "mean", floats_json(info->image.mean, 3)) +
                              set(tower, "std", floats_json(info->image.std, 3)) +
                              set(tower, "resize", json_string(resize_name(info->image.resize))) +
                              set(tower, "resample", json_string(resample_name(info->image.resample))));
}

static json_t *video_json(uform_model_info_t const *info) {
    json_t *tower = json_object();
    return checked(tower, set_size(tower, "frames", info->video.frames));
}

static json_t *audio_json(uform_model_info_t const *info) {
    json_t *tower = transformer_json(&info->audio.transformer);
    return checked(
        tower, set_size(tower, "rate", info->audio.rate) + set_size(tower, "mels", info->audio.mels) +
                   set_size(tower, "window", info->audio.window) + set_size(tower, "hop", info->audio.hop) +
                   set_size(tower, "patch_frames", info->audio.patch_frames) +
                   set_size(tower, "max_patches", info->audio.max_patches) +
                   set(tower, "seconds", json_real(info->audio.seconds)));
}

/* The kernel path this process computes on, why, and AMX's state (uform_kernels). */
static json_t *kernels_json(void) {
    char const *reason = NULL, *amx = NULL, *path = uform_kernels(&reason, &amx);
    json_t *kernels = json_object();
    return checked(kernels, set(kernels, "path", json_string(path)) +
                                set(kernels, "reason", json_string(reason)) +
                                set(kernels, "amx", json_string(amx)));
}

static json_t *info_json(char const *path, uform_model_info_t const *info) {
    json_t *root = json_object(), *towers = json_object(), *matryoshka = json_array();
    int failures = 0;
    for (size_t i = 0; i < info->matryoshka_count; ++i)
        failures += json_array_append_new(matryoshka, json_integer((json_int_t)info->matryoshka[i])) != 0;
    if (info->has_text) failures += set(towers, "text", text_json(info));
    if (info->has_image) failures += set(towers, "image", image_json(info));
    if (info->has_video) failures += set(towers, "video", video_json(info));
    if (info->has_audio) failures += set(towers, "audio", audio_json(info));
    failures += set(root, "path", json_string(path)) + set(root, "family", json_string(info->family)) +
                set(root, "normalized", json_boolean(info->normalized)) + set_size(root, "dims", info->dims) +
                set(root, "matryoshka", matryoshka) + set_size(root, "parameters", info->parameters) +
                set_size(root, "bytes", info->bytes) + set(root, "logit", json_boolean(info->has_logit)) +
                set(root, "weights", json_string(info->weights == UFORM_WEIGHTS_I8 ? "i8" : "bf16")) +
                set(root, "towers", towers) + set(root, "kernels", kernels_json());
    return checked(root, failures);
}

/* ---- the command ------------------------------------------------------------------------------ */

static command_help_t const help = {
    .name = "info", .head = help_head, .tail = "\n", .column = 16, .model_help = true};

int command_info(int argc, char **argv) {
    char const *given = NULL;
    bool json = false, help_shown = false;
    command_flag_t const flags[] = {
        {"--model", FLAG_STRING, &given, .value = "PATH",
         .help = "a checkpoint (format-4 safetensors) or a pretrained model's folder, or\n"
                 "a hub id in the local Hugging Face cache (OWNER/NAME[@REVISION]);\n"
                 "default: the default model"},
        {"--json", FLAG_SWITCH, &json, .help = "one JSON object instead of text"},
        {NULL},
    };
    command_spec_t const spec = {.help = &help, .flags = flags};
    int code = command_flags_parse(&spec, argc, argv, &help_shown);
    if (code != COMMAND_OK || help_shown) return code;

    char buffer[4096];
    char const *path = NULL;
    code = command_model_path(given, buffer, sizeof buffer, &path);
    if (code != COMMAND_OK) return code;
    /* Mapped: the header is validated in full, and no weight needs to be read to describe them. */
    uform_model_t *model = NULL;
    uform_load_config_t config = {.map = true};
    uform_model_load_args_t load = {.path = path, .config = &config, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_OK) return command_fail_engine();
    uform_model_info_t info;
    if (uform_model_info(model, &info) != UFORM_OK) {
        code = command_fail_engine();
        goto done;
    }
    if (!json) {
        print_text(path, &info);
        goto done;
    }
    json_t *root = info_json(path, &info);
    if (!root) {
        code = command_fail("cannot build the JSON: out of memory, or a path that is not UTF-8");
        goto done;
    }
    if (json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) != 0 || fputc('\n', stdout) == EOF)
        code = command_fail("cannot write the standard output");
    json_decref(root);
done:
    uform_model_free(model);
    if (fflush(stdout) != 0 && code == COMMAND_OK) code = command_fail("cannot write the standard output");
    return code;
}
