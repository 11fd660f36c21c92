/* Which towers the VRAM path runs (src/vram/vram_support.h), without a device: the engine's own model, the
 * text towers of the pretrained families (BERT's post-norm with heads of 32, XLM-RoBERTa's offset
 * positions, MPNet's bias by relative position, CLIP's causal end-of-text pooling, SigLIP's padded
 * last-position pooling through a projection with bias, UForm 3's), CLIP's, UForm 3's (register tokens
 * included) and SigLIP's (the attention-pooling head) image towers, and the refusals that name what is
 * missing: mean pooling of image tokens, the head over a class token, pixels with Pillow's geometry,
 * registers or the head, text towers read as bytes with other settings, a model none of whose towers runs. */
#include <string.h>

#include "fixtures.h"
#include "variant.h"
#include "vram_support.h"

/* A model of the engine's own with both towers, sizes as the tiny checkpoint's. */
static uform_model_info_t engine_model(void) {
    uform_model_info_t info;
    memset(&info, 0, sizeof info);
    info.dims = 64;
    info.has_text = info.has_image = true;
    info.text.context = 64;
    info.text.transformer = (uform_transformer_info_t){.depth = 2, .hidden = 128, .heads = 2, .mlp = 512};
    info.image.transformer = info.text.transformer;
    variant_engine_model(&info);
    return info;
}

/* A text tower that reads tokens with LayerNorm, learned positions, no rotary, `pooling`, `heads` heads. */
static void tokens_text(uform_model_info_t *info, size_t hidden, size_t heads, uform_pooling_t pooling) {
    uform_transformer_info_t *text = &info->text.transformer;
    text->hidden = hidden;
    text->heads = heads;
    text->head = hidden / heads;
    text->norm = UFORM_NORM_LAYER;
    text->rotary = false;
    text->pooling = pooling;
    info->text.vocab = 30522;
    info->text.positions = 512;
}

/* A pretrained patch tower: LayerNorm, erf GELU, Pillow's bicubic resampling. */
static void pretrained_image(uform_model_info_t *info) {
    uform_transformer_info_t *image = &info->image.transformer;
    image->norm = UFORM_NORM_LAYER;
    image->activation = UFORM_ACTIVATION_GELU_ERF;
    info->image.resample = UFORM_RESAMPLE_PILLOW_BICUBIC;
    info->image.resize = UFORM_RESIZE_SHORT_SIDE_ROUND_CROP;
}

static void assert_mentions(char const *message, char const *what) {
    assert_non_null(message);
    if (!strstr(message, what)) fail_msg("\"%s\" does not mention \"%s\"", message, what);
}

static void engine_towers_run(void **state) {
    (void)state;
    uform_model_info_t info = engine_model();
    info.has_audio = true;
    info.audio.transformer = info.image.transformer;
    assert_null(vram_tower_refusal(&info, "text"));
    assert_null(vram_tower_refusal(&info, "image"));
    assert_null(vram_tower_refusal(&info, "audio"));
    assert_null(vram_model_refusal(&info));
}

static void bert_family_text_runs(void **state) {
    (void)state;
    uform_model_info_t info = engine_model();
    info.has_image = false;
    strcpy(info.family, "bert");
    info.normalized = true;
    tokens_text(&info, 384, 12, UFORM_POOLING_MEAN); /* all-MiniLM-L6-v2: heads of 32 */
    uform_transformer_info_t *text = &info.text.transformer;
    text->post_norm = text->input_norm = true;
    text->final_norm = text->causal = text->projection = false;
    text->activation = UFORM_ACTIVATION_GELU_ERF;
    text->norm_eps = 1e-12f;
    info.text.token_type = true;
    assert_null(vram_tower_refusal(&info, "text"));
    assert_null(vram_model_refusal(&info));
    /* XLM-RoBERTa's offset positions, CLS and last-token pooling, heads of 64, 80, 96 and 128. */
    info.text.position_offset = 2;
    info.text.pad_id = 1;
    uform_pooling_t const poolings[] = {UFORM_POOLING_FIRST, UFORM_POOLING_LAST, UFORM_POOLING_MEAN};
    size_t const heads[][2] = {{768, 12}, {640, 8}, {768, 8}, {1024, 8}, {256, 1}};
    for (size_t p = 0; p < 3; ++p)
        for (size_t h = 0; h < 5; ++h) {
            tokens_text(&info, heads[h][0], heads[h][1], poolings[p]);
            assert_null(vram_tower_refusal(&info, "text"));
        }
    /* MPNet: no token type, a bias by relative position on every block's attention (heads of 64, both
     * kernels' widths); a text tower read as bytes with one is not the engine's own. */
    strcpy(info.family, "mpnet");
    info.text.token_type = false;
    for (size_t h = 0; h < 5; ++h) {
        tokens_text(&info, heads[h][0], heads[h][1], UFORM_POOLING_MEAN);
        text->relative_buckets = 32;
        assert_null(vram_tower_refusal(&info, "text"));
        assert_null(vram_model_refusal(&info));
    }
    uform_model_info_t bytes = engine_model();
    bytes.text.transformer.relative_buckets = 32;
    assert_mentions(vram_tower_refusal(&bytes, "text"), "engine's own settings");
    /* A Dense module after the pooling (LaBSE's): a projection with bias, then tanh, or without activation.
     */
    strcpy(info.family, "bert");
    text->relative_buckets = 0;
    text->projection = text->projection_bias = text->projection_tanh = true;
    assert_null(vram_tower_refusal(&info, "text"));
    text->projection_tanh = false;
    assert_null(vram_tower_refusal(&info, "text"));
}

static void clip_siglip_uform3_text_run(void **state) {
    (void)state;
    /* CLIP: pre-norm LayerNorm, causal, end-of-text pooling, quick GELU, a projection. */
    uform_model_info_t clip = engine_model();
    strcpy(clip.family, "clip");
    clip.normalized = false;
    tokens_text(&clip, 512, 8, UFORM_POOLING_END);
    clip.text.transformer.activation = UFORM_ACTIVATION_GELU_QUICK;
    clip.text.transformer.causal = true;
    assert_null(vram_tower_refusal(&clip, "text"));
    /* SigLIP: padded to the context, the last position through a projection with bias. */
    uform_model_info_t siglip = clip;
    strcpy(siglip.family, "siglip");
    siglip.text.transformer.causal = false;
    siglip.text.transformer.pooling = UFORM_POOLING_LAST;
    siglip.text.transformer.projection_bias = true;
    siglip.text.padded = true;
    assert_null(vram_tower_refusal(&siglip, "text"));
    /* UForm 3: post-norm, ids cut at the context, class-token pooling. */
    uform_model_info_t uform3 = clip;
    strcpy(uform3.family, "uform3");
    uform3.text.transformer.post_norm = uform3.text.transformer.input_norm = true;
    uform3.text.transformer.final_norm = uform3.text.transformer.causal = false;
    uform3.text.transformer.pooling = UFORM_POOLING_FIRST;
    uform3.text.cut_ids = true;
    assert_null(vram_tower_refusal(&uform3, "text"));
}

static void image_towers_run_or_name_what_they_lack(void **state) {
    (void)state;
    uform_model_info_t info = engine_model();
    tokens_text(&info, 512, 8, UFORM_POOLING_END);
    uform_transformer_info_t *image = &info.image.transformer;

    pretrained_image(&info); /* CLIP's: pre_layrnorm, class token, quick GELU, Pillow's bicubic */
    image->input_norm = true;
    image->activation = UFORM_ACTIVATION_GELU_QUICK;
    assert_null(vram_tower_refusal(&info, "image"));
    assert_null(vram_model_refusal(&info));
    assert_mentions(vram_pixels_refusal(&info), "Pillow"); /* files run; pixels resize on the device */

    image->input_norm =
        false; /* UForm 3's small and base: LayerNorm and erf GELU; the large one's registers */
    image->activation = UFORM_ACTIVATION_GELU_ERF;
    assert_null(vram_tower_refusal(&info, "image"));
    image->registers = 4; /* files and encoded images run; pixels assemble no registers */
    assert_null(vram_tower_refusal(&info, "image"));
    assert_mentions(vram_pixels_refusal(&info), "register tokens");
    info.image.resample = UFORM_RESAMPLE_FLOAT_BILINEAR;
    info.image.resize = UFORM_RESIZE_SHORT_SIDE;
    assert_mentions(vram_pixels_refusal(&info), "register tokens");
    image->registers = 0;
    assert_null(vram_pixels_refusal(&info));
    image->pooling = UFORM_POOLING_MEAN; /* UForm 3's mean pooling */
    assert_mentions(vram_tower_refusal(&info, "image"), "not by the mean");

    image->class_token = false; /* SigLIP's: no class token, the attention-pooling head */
    image->pooling = UFORM_POOLING_HEAD;
    assert_null(vram_tower_refusal(&info, "image"));
    assert_mentions(vram_pixels_refusal(&info), "attention-pooling head");
    image->pooling = UFORM_POOLING_MEAN;
    assert_mentions(vram_tower_refusal(&info, "image"), "not by the mean");
    image->class_token = true; /* the head over a class token */
    image->pooling = UFORM_POOLING_HEAD;
    assert_mentions(vram_tower_refusal(&info, "image"), "without a class token or registers");

    uform_model_info_t engine = engine_model(); /* the engine's own front end resizes on the device */
    assert_null(vram_pixels_refusal(&engine));
    engine.image.resample = UFORM_RESAMPLE_PILLOW_BILINEAR;
    assert_mentions(vram_pixels_refusal(&engine), "float bilinear");
}

static void models_nothing_runs_of_are_refused(void **state) {
    (void)state;
    uform_model_info_t info = engine_model(); /* an image tower alone, pooled by the mean: its reason */
    info.has_text = false;
    pretrained_image(&info);
    info.image.transformer.pooling = UFORM_POOLING_MEAN;
    assert_mentions(vram_model_refusal(&info), "not by the mean");

    uform_model_info_t bytes = engine_model();
    bytes.has_image = false;
    bytes.text.transformer.norm = UFORM_NORM_LAYER;
    assert_mentions(vram_tower_refusal(&bytes, "text"), "read bytes");
    assert_mentions(vram_model_refusal(&bytes), "read bytes");

    uform_model_info_t audio = engine_model();
    audio.has_text = audio.has_image = false;
    audio.has_audio = true;
    audio.audio.transformer = engine_model().image.transformer;
    audio.audio.transformer.norm = UFORM_NORM_LAYER;
    assert_mentions(vram_model_refusal(&audio), "audio towers");

    uform_model_info_t none = engine_model();
    none.has_text = none.has_image = false;
    assert_mentions(vram_model_refusal(&none), "no tower");
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(engine_towers_run),
        cmocka_unit_test(bert_family_text_runs),
        cmocka_unit_test(clip_siglip_uform3_text_run),
        cmocka_unit_test(image_towers_run_or_name_what_they_lack),
        cmocka_unit_test(models_nothing_runs_of_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
