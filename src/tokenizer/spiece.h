/* SentencePiece model files cut as transformers' slow tokenizers (4.44) cut with them (spiece.c, over
 * SentencePiece's own encoder, sentencepiece.h), for the folders and files that have no tokenizer.json:
 *
 *   - XLMRobertaTokenizer: fairseq's ids (<s> 0, <pad> 1, </s> 2, <unk> 3, every other piece its
 *     SentencePiece id + 1, <mask> the vocabulary's size + 1), <s> ... </s> around the text;
 *   - SiglipTokenizer: the text lowercased, its ASCII punctuation removed and its whitespace collapsed,
 *     cut without SentencePiece's dummy prefix, </s> after it;
 *   - a bare .model file: SentencePieceProcessor.encode, no special tokens.
 *
 * Without libsentencepiece (spiece_unbuilt.c) spiece_read answers UFORM_UNSUPPORTED and nothing else is
 * ever called. */
#pragma once

#include "components.h"

typedef struct spiece spiece_t;

/* A tokenizer from the `length` bytes of a .model file (read only during the call). `config`: the path of
 * the folder's tokenizer_config.json, whose "tokenizer_class" picks the class (SiglipTokenizer,
 * XLMRobertaTokenizer; any other is UFORM_UNSUPPORTED naming it), or NULL for a bare model file. Answers
 * UFORM_OK, UFORM_IO (the config cannot be read), UFORM_FORMAT (not a SentencePiece model, or a malformed
 * config: `fault` names it), UFORM_UNSUPPORTED, UFORM_OUT_OF_MEMORY. */
uform_status_t spiece_read(void const *model, size_t length, char const *config, spiece_t **out,
                           tokenizer_fault_t *fault);
void spiece_free(spiece_t *spiece);

/* Cuts one text into `out` (cleared first): its ids and the original bytes each covers, the class's
 * special tokens with `add_special` ([0, 0) spans). UFORM_OK; UFORM_FORMAT with `*message` for a text that
 * is not UTF-8 or longer than 4 GiB; UFORM_OUT_OF_MEMORY; UFORM_INTERNAL when SentencePiece fails. */
uform_status_t spiece_cut(spiece_t const *spiece, uint8_t const *text, size_t length, bool add_special,
                          tokenizer_work_t *work, tokens_t *out, char const **message);

/* Its vocabulary (ids are below it), the special tokens added to one text, and the model's name. */
void spiece_info(spiece_t const *spiece, uform_tokenizer_info_t *info);

/* The string of token `id` (the class's special token of that id, else SentencePiece's piece, XLM-R's
 * ids shifted back by fairseq's offset), `*length` bytes held by the tokenizer; NULL for an id past the
 * vocabulary. */
char const *spiece_token(spiece_t const *spiece, uint32_t id, size_t *length);

/* Frees what spiece_cut kept in work->spiece. */
void spiece_work_free(tokenizer_work_t *work);
