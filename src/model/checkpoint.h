/* Checkpoints: the safetensors container and the format-4 model metadata.
 *
 * This module does no file I/O for reading: the load verb reads the file through the executor's ring
 * and hands the bytes here. Parsing validates everything before a tensor byte is read:
 *   - the 8-byte little-endian header length against the file size (and a 100 MiB cap);
 *   - the header is a JSON object (jansson); each tensor entry has a known dtype, a shape of
 *     non-negative integers whose product does not overflow, and data_offsets [begin, end] inside the
 *     data section, with end - begin == elements * dtype size; no two tensors overlap; each
 *     tensor's data starts at a file offset that is a multiple of its dtype's size (so that the mapped
 *     and the ring load read aligned elements alike);
 *   - `__metadata__["uform"]` is the format-4 metadata (a JSON object, or a string holding one, as
 *     safetensors requires metadata values to be strings), with sane values;
 *   - every tensor that each present tower needs is there with the right shape and dtype BF16 (or F32
 *     for `logit.*`; or I8 for a block's linear weight of at most CHECKPOINT_I8_INPUTS_MAX inputs, with
 *     its scales beside it: `<weight>.scale` F32 [out]), and no tensor is unknown.
 * A malformation answers UFORM_FORMAT with a static message naming it; that of misaligned data, which
 * names the tensor and its offset, lives in a buffer of the calling thread until its next parse. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uform.h"

#define CHECKPOINT_HEADER_LIMIT (100u << 20)
#define CHECKPOINT_RANK_LIMIT   4
/* The inputs an I8 weight may have: its sums must stay exact in int32 (KERNEL_I8_DEPTH_MAX, kernels.h). */
#define CHECKPOINT_I8_INPUTS_MAX 65536
/* The suffix of an I8 weight's scales: `text.blocks.0.attn.qkv.weight.scale`. */
#define CHECKPOINT_SCALE_SUFFIX ".scale"

typedef enum checkpoint_dtype {
    CHECKPOINT_BF16 = 0,
    CHECKPOINT_F16,
    CHECKPOINT_F32,
    CHECKPOINT_F64,
    CHECKPOINT_I8,
    CHECKPOINT_U8,
    CHECKPOINT_I16,
    CHECKPOINT_I32,
    CHECKPOINT_I64,
    CHECKPOINT_BOOL,
} checkpoint_dtype_t;

/* Bytes per element, and the safetensors name ("BF16", ...). */
size_t checkpoint_dtype_size(checkpoint_dtype_t dtype);
char const *checkpoint_dtype_name(checkpoint_dtype_t dtype);

typedef struct checkpoint_tensor {
    char const *name; /* points into the header's string storage */
    checkpoint_dtype_t dtype;
    size_t rank;
    uint64_t shape[CHECKPOINT_RANK_LIMIT];
    uint64_t begin, end; /* byte offsets within the data section */
} checkpoint_tensor_t;

typedef struct checkpoint_header {
    uform_model_info_t info;
    checkpoint_tensor_t *tensors; /* sorted by name */
    size_t tensors_count;
    char *names;          /* storage for every tensor name */
    char *tokenizer;      /* a text tower that reads tokens: its tokenizer.json text (metadata "tokenizer") */
    struct json_t *prompts; /* its prompts: an object of names and texts (metadata "prompts"), or NULL; read
                               only once loaded, so that calls on every thread may look names up in it */
    char *default_prompt; /* the prompt every text takes unless asked otherwise (metadata "default_prompt") */
    uint64_t data_offset; /* 8 + header length: where the data section starts in the file */
    uint64_t data_size;   /* bytes the tensors span: the largest `end` */
} checkpoint_header_t;

/* Reads the 8-byte prefix of a file of `file_size` bytes. Answers UFORM_OK with the JSON header's
 * length, or UFORM_FORMAT (file shorter than 8 bytes, header beyond the file or over the cap). */
uform_status_t checkpoint_prefix(uint8_t const *prefix, size_t prefix_length, uint64_t file_size,
                                 uint64_t *header_length, char const **message);

/* Parses and validates the JSON header (`json` of `length` bytes, not NUL-terminated) of a file of
 * `file_size` bytes. On UFORM_OK, `header` is filled and owns its memory (checkpoint_header_free);
 * on failure nothing is allocated and `*message` names the fault. Answers UFORM_OK, UFORM_FORMAT,
 * UFORM_OUT_OF_MEMORY. */
uform_status_t checkpoint_parse(char const *json, size_t length, uint64_t file_size,
                                checkpoint_header_t *header, char const **message);

/* The same for any safetensors file, whatever its metadata: the container's checks alone (JSON, dtypes,
 * shapes, offsets, overlaps, alignment); header->info holds only `parameters` and `bytes`. A file of no
 * tensor is refused. */
uform_status_t checkpoint_parse_tensors(char const *json, size_t length, uint64_t file_size,
                                        checkpoint_header_t *header, char const **message);

void checkpoint_header_free(checkpoint_header_t *header);

/* The tensor of that name, or NULL. Binary search. */
checkpoint_tensor_t const *checkpoint_find(checkpoint_header_t const *header, char const *name);

/* CLIP's image normalization, with the digits it is published with: what the tiny checkpoint and a
 * trainer starting from scratch write. */
extern double const checkpoint_clip_mean[3], checkpoint_clip_std[3];

/* The format-4 object of `info` (dims, matryoshka, and the towers it has, with docs/DESIGN.md's fields;
 * `header`'s tokenizer and prompts where it has them, or NULL) as
 * compact JSON text for checkpoint_write, malloc'ed; NULL when out of memory. Reals carry 9 significant
 * digits, which read every F32 back exactly; a mean or std equal to CLIP's as an F32 is written with
 * CLIP's own digits, so the same sizes always give the same text. */
char *checkpoint_metadata_text(uform_model_info_t const *info, checkpoint_header_t const *header);

/* ---- the tensors of format 4 ---- */

/* What a tensor is to a model that starts from scratch. */
typedef enum checkpoint_role {
    CHECKPOINT_ROLE_NORM,        /* an RMSNorm weight: starts at 1 */
    CHECKPOINT_ROLE_BIAS,        /* a linear layer's bias */
    CHECKPOINT_ROLE_WEIGHT,      /* a linear layer's weight, text.embed, a class token, positions */
    CHECKPOINT_ROLE_LOGIT_SCALE, /* logit.scale: F32 in a checkpoint, BF16 allowed */
    CHECKPOINT_ROLE_LOGIT_BIAS,  /* logit.bias: F32 in a checkpoint, BF16 allowed */
} checkpoint_role_t;

/* What a tensor is to a tower: the parts of block `block` (pre-norm, docs/DESIGN.md "Model"), the
 * tower's final norm and projection, its input (text.embed; a media tower's patch layer, class token
 * and positions), and the model's logit parameters. The forward passes bind their tensors by part. */
typedef enum checkpoint_part {
    CHECKPOINT_PART_NORM1,        /* blocks.<i>.norm1.weight [hidden] */
    CHECKPOINT_PART_NORM2,        /* blocks.<i>.norm2.weight [hidden] */
    CHECKPOINT_PART_QKV_WEIGHT,   /* blocks.<i>.attn.qkv.weight [3 hidden, hidden] */
    CHECKPOINT_PART_QKV_BIAS,     /* blocks.<i>.attn.qkv.bias [3 hidden] */
    CHECKPOINT_PART_OUT_WEIGHT,   /* blocks.<i>.attn.out.weight [hidden, hidden] */
    CHECKPOINT_PART_OUT_BIAS,     /* blocks.<i>.attn.out.bias [hidden] */
    CHECKPOINT_PART_UP_WEIGHT,    /* blocks.<i>.mlp.up.weight [mlp, hidden] */
    CHECKPOINT_PART_UP_BIAS,      /* blocks.<i>.mlp.up.bias [mlp] */
    CHECKPOINT_PART_DOWN_WEIGHT,  /* blocks.<i>.mlp.down.weight [hidden, mlp] */
    CHECKPOINT_PART_DOWN_BIAS,    /* blocks.<i>.mlp.down.bias [hidden] */
    CHECKPOINT_PART_NORM,         /* norm.weight [hidden]: the final norm */
    CHECKPOINT_PART_PROJ,         /* proj.weight [dims, hidden] */
    CHECKPOINT_PART_EMBED,        /* text.embed [257, hidden]: a row per byte and one for BOS; [vocab,
                                     hidden] for a model that reads tokens */
    CHECKPOINT_PART_PATCH_WEIGHT, /* patch.weight [hidden, inputs] */
    CHECKPOINT_PART_PATCH_BIAS,   /* patch.bias [hidden] */
    CHECKPOINT_PART_CLS,          /* cls [hidden]: the class token */
    CHECKPOINT_PART_POS,          /* pos [1 + patches, hidden]: the positions, the class token's first */
    CHECKPOINT_PART_LOGIT_SCALE,  /* logit.scale [1] */
    CHECKPOINT_PART_LOGIT_BIAS,   /* logit.bias [1] */
    /* The parts of the block's settings (variant.h) other than the engine's own: */
    CHECKPOINT_PART_NORM1_BIAS,      /* blocks.<i>.norm1.bias [hidden]: LayerNorm */
    CHECKPOINT_PART_NORM2_BIAS,      /* blocks.<i>.norm2.bias [hidden]: LayerNorm */
    CHECKPOINT_PART_NORM_BIAS,       /* norm.bias [hidden]: LayerNorm */
    CHECKPOINT_PART_INPUT_NORM,      /* input_norm.weight [hidden]: the norm over the input embeddings */
    CHECKPOINT_PART_INPUT_NORM_BIAS, /* input_norm.bias [hidden]: LayerNorm */
    CHECKPOINT_PART_TEXT_POSITIONS,  /* text.positions [positions, hidden]: learned positions */
    CHECKPOINT_PART_TOKEN_TYPE,      /* text.token_type [hidden]: the row of token type 0 */
    CHECKPOINT_PART_PROJ_BIAS,       /* proj.bias [dims]: with projection_bias */
    /* The attention-pooling head (pooling "head"): head.probe [hidden], the query; head.qkv, head.out
     * (weights and biases as a block's); head.norm (weight, and bias with LayerNorm); head.up, head.down. */
    CHECKPOINT_PART_HEAD_PROBE,
    CHECKPOINT_PART_HEAD_QKV_WEIGHT,
    CHECKPOINT_PART_HEAD_QKV_BIAS,
    CHECKPOINT_PART_HEAD_OUT_WEIGHT,
    CHECKPOINT_PART_HEAD_OUT_BIAS,
    CHECKPOINT_PART_HEAD_NORM,
    CHECKPOINT_PART_HEAD_NORM_BIAS,
    CHECKPOINT_PART_HEAD_UP_WEIGHT,
    CHECKPOINT_PART_HEAD_UP_BIAS,
    CHECKPOINT_PART_HEAD_DOWN_WEIGHT,
    CHECKPOINT_PART_HEAD_DOWN_BIAS,
    CHECKPOINT_PART_RELATIVE_BIAS, /* relative_bias [buckets, heads]: the bias by relative position, every
                                      block's (relative_buckets) */
} checkpoint_part_t;

typedef struct checkpoint_schema_tensor {
    char name[64];     /* "audio.blocks.11.attn.qkv.weight" and the like */
    char const *tower; /* "text", "image" or "audio"; NULL for logit.scale and logit.bias */
    checkpoint_part_t part;
    size_t block; /* the block of a per-block part; 0 for the others */
    size_t rank;  /* 1 or 2 */
    uint64_t shape[2];
    checkpoint_role_t role;
} checkpoint_schema_tensor_t;

/* Whether a tensor of the schema may be stored, or loaded, as I8 weights: a block's attn.qkv, attn.out,
 * mlp.up or mlp.down weight of at most CHECKPOINT_I8_INPUTS_MAX inputs. */
bool checkpoint_quantizable(checkpoint_schema_tensor_t const *tensor);

/* Calls `visit` with every tensor `info` implies (docs/DESIGN.md, "Model"), in the order the tiny checkpoint
 * and a trainer starting from scratch write them: per tower text, image, audio (those `info` has), its
 * blocks, final norm and projection, then text.embed or the patch embedding, class token and
 * positions; last logit.scale and logit.bias where info->has_logit. This walk is where the tensors' names
 * are spelled: everything that loads, trains, writes or uploads a tower walks it. Stops at the first
 * nonzero answer of `visit` and returns it; 0 when every call answered 0. */
int checkpoint_schema_each(uform_model_info_t const *info,
                           int (*visit)(checkpoint_schema_tensor_t const *tensor, void *context),
                           void *context);

/* The same walk over tower `tower` ("text", "image", "audio") of `info` alone: its blocks, final norm,
 * projection and input, in checkpoint_schema_each's order. A tower `info` lacks visits nothing. */
int checkpoint_schema_tower(uform_model_info_t const *info, char const *tower,
                            int (*visit)(checkpoint_schema_tensor_t const *tensor, void *context),
                            void *context);

/* One tensor to write. */
typedef struct checkpoint_source {
    char const *name;
    checkpoint_dtype_t dtype;
    size_t rank;
    uint64_t shape[CHECKPOINT_RANK_LIMIT];
    void const *data; /* elements * dtype size bytes */
} checkpoint_source_t;

/* Writes a safetensors file atomically: a temporary file beside `path`, fsync, rename, fsync of the
 * directory. `metadata` (may be NULL) is the format-4 object, stored as the string value of
 * `__metadata__["uform"]`. Tensors are laid out in the order given, 8-byte aligned data section.
 * Answers UFORM_OK, UFORM_IO, UFORM_OUT_OF_MEMORY, UFORM_INVALID_ARGUMENT. */
uform_status_t checkpoint_write(char const *path, char const *metadata, checkpoint_source_t const *tensors,
                                size_t count, char const **message);
