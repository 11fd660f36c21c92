/* The device side of training (src/vram/vram_train.c): a tower's training forward pass, keeping what its
 * backward pass needs, and that backward pass, on one device, through kernels/cuda. Written beside each
 * other in the order of the model, as src/train/train_tower.c writes the host's:
 *   h1 = rms1(x_in); qkv = h1 Wqkv^T + b; att = attention(qkv) (rotary inside); x_mid = x_in + att Wout^T +
 * b; h2 = rms2(x_mid); u = h2 Wup^T + b; g = gelu(u); x_out = x_mid + g Wdown^T + b; states = rms(x_final).
 * The residual stream, the states and every gradient flowing back are F32; what feeds a GEMM is BF16 (the
 * norms' outputs, qkv, att, u and g, the gradients' copies); the weights' F32 masters and BF16 copies, and
 * their F32 gradients, are the trainer's (src/train/train_vram.c), which binds a tower's parameters here.
 *
 * Everything is enqueued on the device's stream and nothing waits: a step is one stream of work that the
 * loop polls an event of. Built with CUDA only. */
#pragma once

#include "vram.h"

#if UFORM_WITH_CUDA
#include "cuda/cuda_train.h"

/* One trained tensor on the device: its F32 master, its BF16 copy and its F32 gradient. */
typedef struct vram_param {
    float *value;
    uint16_t *bf16;
    float *grad;
} vram_param_t;

/* A block's parameters in the checkpoint's part order (checkpoint.h: norm1 .. down.bias). */
typedef union vram_train_block {
    struct {
        vram_param_t norm1, norm2, qkv_w, qkv_b, out_w, out_b, up_w, up_b, down_w, down_b;
    };
    vram_param_t parts[10];
} vram_train_block_t;

typedef struct vram_train_tower {
    size_t depth, hidden, heads, mlp, dims;
    vram_train_block_t *blocks; /* host array [depth] */
    vram_param_t norm, proj;
    vram_param_t embed;      /* text: [257, hidden] */
    vram_param_t patches[4]; /* image and audio: patch.weight, patch.bias, cls, pos */
} vram_train_tower_t;

/* A block's saved activations over the pass's tokens. */
typedef struct vram_saved {
    float *x_in, *x_mid; /* [tokens, hidden] */
    uint16_t *h1, *qkv, *att, *h2, *u,
        *g;     /* [tokens, hidden], [.., 3 hidden], [.., hidden] x 2, [.., mlp] x 2 */
    float *lse; /* [tokens, heads] */
} vram_saved_t;

/* What a pass over `tokens` tokens holds on the device, carved from one allocation. */
typedef struct vram_train_pass {
    size_t tokens, depth;
    vram_saved_t *blocks;  /* host array [depth] */
    float *x_final;        /* [tokens, hidden]: the input, when depth is 0, and block depth - 1's output */
    float *states;         /* [tokens, hidden]: the final-normed states */
    uint16_t *states_bf16; /* [tokens, hidden] */
    float *d_states, *dx,
        *dh; /* [tokens, hidden]: the loss's gradient of the states; the residual's; scratch */
    uint16_t *dy_bf16, *d_att; /* [tokens, hidden] */
    uint16_t *d_wide;          /* [tokens, max(3 hidden, mlp)] */
    float *d_rows;             /* [tokens, heads] */
    float *partial;            /* [ceil(tokens / CUDA_TRAIN_ROW_BLOCK), hidden] */
    float *sums;               /* cuda_column_sums' scratch for tokens rows of max(3 hidden, mlp) */
} vram_train_pass_t;

/* Device bytes a pass of `tower` over `tokens` tokens takes. */
size_t vram_train_pass_bytes(vram_train_tower_t const *tower, size_t tokens);

/* Carves `base` (vram_train_pass_bytes of device memory, 256-byte aligned) into *pass; blocks is the
 * caller's host array of tower->depth entries, kept by the pass. */
void vram_train_pass_carve(vram_train_tower_t const *tower, size_t tokens, void *base, vram_saved_t *blocks,
                           vram_train_pass_t *pass);

/* The input x of the pass: block 0's x_in (x_final for a tower without blocks). */
float *vram_train_pass_input(vram_train_pass_t const *pass);

/* Enqueues the forward pass over the pass's input (F32 [tokens, hidden], written there first), items at
 * `offsets` (device int32 [items + 1], the longest `max_length`): every block's activations saved, the
 * states in F32 and BF16. UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_train_forward(vram_device_t *device, vram_train_tower_t const *tower,
                                  vram_train_pass_t const *pass, int32_t const *offsets, size_t items,
                                  size_t max_length, bool causal, bool rotary, char const **message);

/* Enqueues the backward pass of the last forward over the same items, from pass->d_states: every
 * parameter's gradient of the tower's transformer accumulated, and the input's gradient into pass->dx.
 * UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_train_backward(vram_device_t *device, vram_train_tower_t const *tower,
                                   vram_train_pass_t const *pass, int32_t const *offsets, size_t items,
                                   size_t max_length, bool causal, bool rotary, char const **message);

/* Enqueues y [m, n] = x_bf16 [m, k] . W^T (+ b) in F32, W a [n', k] parameter (its first n rows). */
uform_status_t vram_train_linear(vram_device_t *device, vram_param_t const *weight, size_t n, size_t k,
                                 vram_param_t const *bias, uint16_t const *x, size_t m, float *y,
                                 char const **message);

/* Enqueues the gradients of vram_train_linear from dy (BF16 [m, n]): W.grad[:n] += dy^T x; b.grad +=
 * colsum(dy), summed from dy_f32 (F32 [m, n]) where given, when there is a bias; and, when dx is not NULL,
 * dx [m, k] = dy W[:n]: BF16 when dx_bf16, else F32, added to when accumulate. `sums`: cuda_column_sums's
 * scratch for m rows of n. */
uform_status_t vram_train_linear_backward(vram_device_t *device, vram_param_t const *weight, size_t n,
                                          size_t k, vram_param_t const *bias, uint16_t const *x, size_t m,
                                          uint16_t const *dy, float const *dy_f32, void *dx, bool dx_bf16,
                                          bool accumulate, float *sums, char const **message);

#endif /* UFORM_WITH_CUDA */
