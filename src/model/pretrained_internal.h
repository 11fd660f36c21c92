/* What the folder reader (pretrained.c) and the families (pretrained_families.c) share: the folder being
 * read, where each tower's weights are and how they are named, and the readers of the folder's JSON files. */
#pragma once

#include <jansson.h>
#include <limits.h>

#include "checkpoint.h"
#include "pretrained.h"

/* The longest name of a weight the reader looks for, prefix included. */
#define PRETRAINED_NAME_LIMIT 128
/* Weights files a folder may have: one (model.safetensors), or one per tower (UForm 3), and after them a
 * sentence-transformers Dense module's; each may be sharded over the files its index
 * ("model.safetensors.index.json") names, as transformers saves large models. */
#define PRETRAINED_FILES 3
/* The most files one weights file may be sharded over. */
#define PRETRAINED_SHARDS_MAX 256

/* How a family names a tower's weights: `layer` (a printf format of the block's index) before each of the
 * block's names, the others whole; a name NULL is a part the family's tower does not have (then the part
 * takes zeros where the schema still has it: CLIP's patch layer has no bias). The norms and linear layers
 * are named without their ".weight" and ".bias". */
/* Frames a clip is sampled at through a pretrained family's image tower. */
#define PRETRAINED_VIDEO_FRAMES 8

typedef struct pretrained_names {
    char const *layer;
    char const *norm1, *norm2, *q, *k, *v, *out, *up, *down;
    char const *final_norm, *input_norm, *proj; /* proj: the whole name of the weight */
    char const *embed, *positions, *token_type; /* text: whole names; token_type's first row */
    char const *patch, *patch_bias, *cls;       /* patch towers: whole names (patch [H, 3, P, P]) */
    char const *scale1, *scale2; /* LayerScale: the block's vectors (after `layer`) scaling the attention's
                                    and the MLP's output, folded into attn.out's and mlp.down's rows */
    bool class_unplaced;         /* the class token takes no position: `positions` holds the patches' only */
    char const *registers;       /* register tokens [1, R, H], whole name (read where the tower has some) */
    char const *proj_bias;       /* the projection's bias: its whole name */
    char const *relative_bias;   /* the bias by relative position [buckets, heads], whole name (MPNet's) */
    /* The attention-pooling head: the probe and qkv's weight and bias whole, the others without their
     * ".weight" and ".bias". */
    char const *head_probe, *head_qkv_weight, *head_qkv_bias, *head_out, *head_norm, *head_up, *head_down;
} pretrained_names_t;

typedef struct pretrained_tower {
    pretrained_names_t const *names;
    char prefix[24];     /* tried before a name the file does not hold as it is: "bert." */
    size_t file;         /* its weights file */
    bool registers;      /* it has register tokens (names->registers) */
    bool dense;          /* its projection is a sentence-transformers Dense module's ("linear.weight" and
                            "linear.bias" in weights file dense_file), not a name of `names` */
    size_t dense_file;
    size_t blocks[1024]; /* the stored block of each of the tower's blocks (UForm 3 skips some) */
} pretrained_tower_t;

/* One safetensors file of the folder, mapped, and its header. */
typedef struct pretrained_shard {
    char name[128];
    int fd;
    uint8_t *mapping;
    size_t size;
    checkpoint_header_t header;
} pretrained_shard_t;

/* A tower's weights: the file `name`, or the shards its index names where the folder has no such file. */
typedef struct pretrained_weights {
    char name[64];              /* "model.safetensors"; its index's name where that shards it */
    pretrained_shard_t *shards; /* [shard_count], malloc'ed: the file alone where it is whole */
    size_t shard_count;
    bool in_root; /* `name` is in the folder given (a module's: "2_Dense/model.safetensors"), else in the
                     Transformer module's folder */
} pretrained_weights_t;

typedef struct pretrained {
    char root[PATH_MAX];        /* the folder given */
    char transformer[PATH_MAX]; /* the folder of config.json, the weights and the tokenizer */
    uform_model_info_t info;
    pretrained_tower_t text, image;
    pretrained_weights_t weights[PRETRAINED_FILES];
    size_t files;
} pretrained_t;

/* A fault with its message in the calling thread's buffer: answers `status`. */
uform_status_t pretrained_fault(char const **message, uform_status_t status, char const *format, ...)
    __attribute__((format(printf, 3, 4)));

/* Reads `folder`/`name` as JSON (an object or an array) into `*value`; a missing file leaves *value NULL
 * when `optional`. */
uform_status_t pretrained_json(char const *folder, char const *name, bool optional, json_t **value,
                               char const **message);

/* A size of `object`: `fallback` where absent (SIZE_MAX: required), else an integer in [low, high]; faults
 * name `file` and the key. */
uform_status_t pretrained_size(json_t const *object, char const *file, char const *key, size_t low,
                               size_t high, size_t fallback, size_t *value, char const **message);

/* A real of `object` in (low, high]: `fallback` where absent. */
uform_status_t pretrained_real(json_t const *object, char const *file, char const *key, double low,
                               double high, double fallback, double *value, char const **message);

/* `folder`/`name` into `path` [PATH_MAX]; false when it does not fit. */
bool pretrained_join(char *path, char const *folder, char const *name);

/* The string of `key`, or NULL. */
char const *pretrained_string(json_t const *object, char const *key);

/* Hugging Face's activation under `key` ("hidden_act"; DistilBERT's "activation"), `fallback` where absent:
 * "gelu" exact, "gelu_new" and "gelu_pytorch_tanh" tanh, "quick_gelu"; another is UFORM_UNSUPPORTED. */
uform_status_t pretrained_activation(json_t const *config, char const *file, char const *key,
                                     uform_activation_t fallback, uform_activation_t *activation,
                                     char const **message);

/* The family of the folder's config.json (`config`, an object): fills folder->info (towers, sizes, settings,
 * context, family), the towers' names, and the weights files' names. UFORM_UNSUPPORTED for a family or
 * setting outside pretrained.h's list. */
uform_status_t pretrained_family(pretrained_t *folder, json_t const *config, char const **message);
