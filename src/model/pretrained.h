/* Pretrained models as their folders are published on the Hugging Face hub, read in place: the folder's
 * configuration becomes the block's settings (variant.h) and format-4 metadata, its safetensors weights
 * the tensors of the checkpoint schema (checkpoint.h) in BF16, its tokenizer the model's. What loads a
 * folder then prepares the towers as for a checkpoint, so that both run the one transformer.
 *
 * Families:
 *   - UForm 3 (config.json with text_encoder and image_encoder; text_encoder.safetensors and
 *     image_encoder.safetensors; tokenizer.json): the text tower runs the blocks outside
 *     multimodal_layers_ids, the image tower's LayerScale is folded into the layers before it (each weight
 *     rounded to BF16 again), its class token takes no position, its register tokens (large) are attended
 *     to and in no output.
 *   - CLIP (model_type "clip", transformers' CLIPModel in model.safetensors): both towers, transformers'
 *     defaults where config.json is sparse, the image processor's mean and std (preprocessor_config.json).
 *   - SigLIP (model_type "siglip", transformers' SiglipModel): no class token, the attention-pooling head,
 *     texts padded to the context and pooled at the last position through the text head; its SentencePiece
 *     model (spiece.model) where the folder has no tokenizer.json.
 *   - BERT-family sentence embedders (config.json's model_type "bert", "roberta", "xlm-roberta",
 *     "distilbert"): BertModel, (XLM-)RobertaModel or DistilBertModel (BERT's block under other names and
 *     config keys, no token types) weights in model.safetensors (with or without a "bert.", "roberta." or
 *     "distilbert." prefix),
 *     the sentence-transformers modules where the folder has them (modules.json: the Transformer module's
 *     folder, Pooling's mode (cls, mean, last token), Normalize; sentence_bert_config.json's
 *     max_seq_length as the context; config_sentence_transformers.json's prompts). A folder without
 *     modules.json pools at the class token and does not normalize, as Hugging Face's
 *     text-embeddings-inference reads such a folder.
 * A weights file may be sharded as transformers saves large models: where model.safetensors is missing, the
 * files its model.safetensors.index.json names (files of the folder only, no tensor in two of them).
 * Anything else (another model_type, a Dense module, max or weighted pooling, pickled weights, relative
 * positions) is refused with UFORM_UNSUPPORTED naming it; a damaged folder (missing files, malformed JSON,
 * shapes that disagree with the configuration) with UFORM_FORMAT or UFORM_IO naming the file and the fault.
 */
#pragma once

#include "model.h"

/* What a folder reads into: a model's header (its info, and its tensors in the schema), its data section
 * (memory of the executor given, data_size bytes) and its tokenizer. */
typedef struct pretrained_model {
    checkpoint_header_t header;
    uint8_t *data;
    size_t data_size;
    uform_tokenizer_t *tokenizer;
} pretrained_model_t;

/* Reads the folder at `path` into `model` (zeroed first), the data in memory of `executor` (NULL: plain host
 * memory). Blocks on the folder's reads. Answers UFORM_OK, or UFORM_IO, UFORM_FORMAT, UFORM_UNSUPPORTED or
 * UFORM_OUT_OF_MEMORY with `*message` (static, or the calling thread's buffer until its next call) and
 * nothing held. */
uform_status_t pretrained_read(char const *path, uform_executor_t *executor, pretrained_model_t *model,
                               char const **message);

/* Sets a model's tokenizer to cut as the families' references ask theirs: never padded (texts are packed)
 * and, with `truncate`, truncated at `context` tokens with the special ones kept (over the file's own
 * truncation); without, the file's own truncation stays and the encoder cuts the ids past the context
 * (UForm 3's processor). */
void pretrained_tokenizer_fit(uform_tokenizer_t *tokenizer, size_t context, bool truncate);
