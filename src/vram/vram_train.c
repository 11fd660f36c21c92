/* The device side of training: a tower's forward pass keeping its activations, and its backward pass
 * (vram_train.h). Shapes: T tokens, H hidden, M mlp; every launch on the device's stream. */
#include "vram_train.h"

#if UFORM_WITH_CUDA

#define EPS 1e-6f

/* ---- Pass buffers --------------------------------------------------------------------------------- */

/* The next piece of `bytes` at *used from `base` (0 while sizing), 256-byte aligned. */
static void *piece(uintptr_t base, size_t *used, size_t bytes) {
    void *at = (void *)(base ? base + *used : 0);
    *used += round_up_256(bytes);
    return at;
}

static size_t wide(vram_train_tower_t const *tower) {
    return 3 * tower->hidden > tower->mlp ? 3 * tower->hidden : tower->mlp;
}

/* Lays the pass out from `base` (sizing when 0): the bytes it takes. */
static size_t pass_layout(vram_train_tower_t const *tower, size_t tokens, uintptr_t base,
                          vram_saved_t *blocks, vram_train_pass_t *pass) {
    size_t t = tokens ? tokens : 1, h = tower->hidden, used = 0, f = sizeof(float), b = sizeof(uint16_t);
    for (size_t i = 0; i < tower->depth; ++i) {
        vram_saved_t s;
        s.x_in = piece(base, &used, t * h * f), s.x_mid = piece(base, &used, t * h * f);
        s.h1 = piece(base, &used, t * h * b), s.qkv = piece(base, &used, t * 3 * h * b);
        s.att = piece(base, &used, t * h * b), s.lse = piece(base, &used, t * tower->heads * f);
        s.h2 = piece(base, &used, t * h * b), s.u = piece(base, &used, t * tower->mlp * b);
        s.g = piece(base, &used, t * tower->mlp * b);
        if (blocks) blocks[i] = s;
    }
    vram_train_pass_t p = {.tokens = tokens, .depth = tower->depth, .blocks = blocks};
    p.x_final = piece(base, &used, t * h * f), p.states = piece(base, &used, t * h * f);
    p.states_bf16 = piece(base, &used, t * h * b), p.d_states = piece(base, &used, t * h * f);
    p.dx = piece(base, &used, t * h * f), p.dh = piece(base, &used, t * h * f);
    p.dy_bf16 = piece(base, &used, t * h * b), p.d_att = piece(base, &used, t * h * b);
    p.d_wide = piece(base, &used, t * wide(tower) * b), p.d_rows = piece(base, &used, t * tower->heads * f);
    p.partial = piece(base, &used, (t + CUDA_TRAIN_ROW_BLOCK - 1) / CUDA_TRAIN_ROW_BLOCK * h * f);
    p.sums = piece(base, &used, cuda_column_sums_scratch(t, wide(tower)) * f);
    if (pass) *pass = p;
    return used;
}

size_t vram_train_pass_bytes(vram_train_tower_t const *tower, size_t tokens) {
    return pass_layout(tower, tokens, 0, NULL, NULL);
}

void vram_train_pass_carve(vram_train_tower_t const *tower, size_t tokens, void *base, vram_saved_t *blocks,
                           vram_train_pass_t *pass) {
    pass_layout(tower, tokens, (uintptr_t)base, blocks, pass);
}

float *vram_train_pass_input(vram_train_pass_t const *pass) {
    return pass->depth ? pass->blocks[0].x_in : pass->x_final;
}

/* ---- Linear layers -------------------------------------------------------------------------------- */

/* One forward product of `kind` through cuBLASLt: y = x W[:n]^T + b. */
static uform_status_t product(vram_device_t *device, vram_param_t const *weight, size_t n, size_t k,
                              vram_param_t const *bias, uint16_t const *x, size_t m, void *y, size_t y_stride,
                              cuda_linear_kind_t kind, char const **message) {
    vram_linear_t layer = {.w = weight->bf16, .bias = bias ? bias->value : NULL, .n = n, .k = k};
    return vram_linear_run(device, &layer, m, x, y, y_stride, kind, message);
}

uform_status_t vram_train_linear(vram_device_t *device, vram_param_t const *weight, size_t n, size_t k,
                                 vram_param_t const *bias, uint16_t const *x, size_t m, float *y,
                                 char const **message) {
    return product(device, weight, n, k, bias, x, m, y, n, CUDA_LINEAR_F32, message);
}

uform_status_t vram_train_linear_backward(vram_device_t *device, vram_param_t const *weight, size_t n,
                                          size_t k, vram_param_t const *bias, uint16_t const *x, size_t m,
                                          uint16_t const *dy, float const *dy_f32, void *dx, bool dx_bf16,
                                          bool accumulate, float *sums, char const **message) {
    if (m == 0) return UFORM_OK;
    if (bias)
        VRAM_TRY(cuda_column_sums(bias->grad, dy_f32 ? (void const *)dy_f32 : (void const *)dy,
                                  dy_f32 == NULL, n, m, n, sums, device->stream),
                 "cannot launch a bias gradient");
    cuda_linear_backward_t job = {.m = m,
                                  .n = n,
                                  .k = k,
                                  .x = x,
                                  .x_stride = k,
                                  .w = weight->bf16,
                                  .dy = dy,
                                  .dy_stride = n,
                                  .dw = weight->grad,
                                  .dx = dx,
                                  .dx_stride = k,
                                  .dx_bf16 = dx_bf16,
                                  .dx_accumulate = accumulate};
    return cuda_linear_backward(device->gemm, &job, message) == cudaSuccess ? UFORM_OK : UFORM_DEVICE;
}

/* ---- Forward -------------------------------------------------------------------------------------- */

/* Copies the residual stream x [T, H] to y before a residual product adds into y. */
static cudaError_t residual(float *y, float const *x, size_t count, cudaStream_t stream) {
    return cudaMemcpyAsync(y, x, count * sizeof(float), cudaMemcpyDeviceToDevice, stream);
}

/* One block's forward: x_out = block(s.x_in), saving s. */
static uform_status_t block_forward(vram_device_t *device, vram_train_tower_t const *tower,
                                    vram_train_block_t const *b, vram_saved_t const *s, float *x_out,
                                    size_t t, int32_t const *offsets, size_t items, size_t max_length,
                                    bool causal, bool rotary, char const **message) {
    size_t h = tower->hidden, m = tower->mlp;
    cudaStream_t stream = device->stream;
    uform_status_t status;
    /* h1 = rms1(x_in); qkv = h1 Wqkv^T + b                                  [T, H], [T, 3H] */
    VRAM_TRY(cuda_rmsnorm(s->h1, h, NULL, 0, s->x_in, h, b->norm1.value, t, h, EPS, stream),
             "cannot launch rmsnorm");
    if ((status = product(device, &b->qkv_w, 3 * h, h, &b->qkv_b, s->h1, t, s->qkv, 3 * h, CUDA_LINEAR_BF16,
                          message)))
        return status;
    /* att = attention(qkv), its log-sum-exp kept; x_mid = x_in + att Wout^T + b [T, H] */
    VRAM_TRY(cuda_attention_lse(s->att, s->lse, s->qkv, offsets, items, tower->heads, max_length, causal,
                                rotary, 0.125f, stream),
             "cannot launch attention");
    VRAM_TRY(residual(s->x_mid, s->x_in, t * h, stream), "cannot copy the residual stream");
    if ((status = product(device, &b->out_w, h, h, &b->out_b, s->att, t, s->x_mid, h, CUDA_LINEAR_RESIDUAL,
                          message)))
        return status;
    /* h2 = rms2(x_mid); u = h2 Wup^T + b; g = gelu(u); x_out = x_mid + g Wdown^T + b  [T, M] */
    VRAM_TRY(cuda_rmsnorm(s->h2, h, NULL, 0, s->x_mid, h, b->norm2.value, t, h, EPS, stream),
             "cannot launch rmsnorm");
    if ((status = product(device, &b->up_w, m, h, &b->up_b, s->h2, t, s->u, m, CUDA_LINEAR_BF16, message)))
        return status;
    VRAM_TRY(cuda_gelu(s->g, s->u, t * m, stream), "cannot launch gelu");
    VRAM_TRY(residual(x_out, s->x_mid, t * h, stream), "cannot copy the residual stream");
    return product(device, &b->down_w, h, m, &b->down_b, s->g, t, x_out, h, CUDA_LINEAR_RESIDUAL, message);
}

uform_status_t vram_train_forward(vram_device_t *device, vram_train_tower_t const *tower,
                                  vram_train_pass_t const *pass, int32_t const *offsets, size_t items,
                                  size_t max_length, bool causal, bool rotary, char const **message) {
    size_t t = pass->tokens, h = tower->hidden;
    for (size_t i = 0; i < tower->depth; ++i) {
        float *x_out = i + 1 < tower->depth ? pass->blocks[i + 1].x_in : pass->x_final;
        uform_status_t status = block_forward(device, tower, &tower->blocks[i], &pass->blocks[i], x_out, t,
                                              offsets, items, max_length, causal, rotary, message);
        if (status != UFORM_OK) return status;
    }
    /* states = rms(x_final), F32 and BF16 */
    VRAM_TRY(cuda_rmsnorm(pass->states_bf16, h, pass->states, h, pass->x_final, h, tower->norm.value, t, h,
                          EPS, device->stream),
             "cannot launch rmsnorm");
    return UFORM_OK;
}

/* ---- Backward ------------------------------------------------------------------------------------- */

/* The gradients of a layer that adds into the residual stream (y += x W^T + b), from dx = dy, F32: its
 * weight's and bias's, and the layer input's as BF16 [T, k] into dx_bf16. */
static uform_status_t residual_backward(vram_device_t *device, vram_param_t const *weight, size_t n, size_t k,
                                        vram_param_t const *bias, uint16_t const *x,
                                        vram_train_pass_t const *pass, uint16_t *dx_bf16,
                                        char const **message) {
    VRAM_TRY(cuda_f32_to_bf16(pass->dy_bf16, pass->dx, pass->tokens * n, device->stream),
             "cannot launch a conversion");
    return vram_train_linear_backward(device, weight, n, k, bias, x, pass->tokens, pass->dy_bf16, pass->dx,
                                      dx_bf16, true, false, pass->sums, message);
}

/* The MLP's backward: from dx = d x_out to dx = d x_mid. */
static uform_status_t mlp_backward(vram_device_t *device, vram_train_tower_t const *tower,
                                   vram_train_block_t const *b, vram_saved_t const *s,
                                   vram_train_pass_t const *pass, char const **message) {
    size_t t = pass->tokens, h = tower->hidden, m = tower->mlp;
    cudaStream_t stream = device->stream;
    uform_status_t status;
    /* x_out = x_mid + g Wdown^T + b: dWdown += dx^T g, dg = dx Wdown        [T, M] */
    if ((status = residual_backward(device, &b->down_w, h, m, &b->down_b, s->g, pass, pass->d_wide, message)))
        return status;
    /* g = gelu(u): du = dg gelu'(u); u = h2 Wup^T + b: dWup += du^T h2, dh2 = du Wup   [T, H] */
    VRAM_TRY(cuda_gelu_backward(pass->d_wide, pass->d_wide, s->u, t * m, stream),
             "cannot launch gelu backward");
    if ((status = vram_train_linear_backward(device, &b->up_w, m, h, &b->up_b, s->h2, t, pass->d_wide, NULL,
                                             pass->dh, false, false, pass->sums, message)))
        return status;
    /* h2 = rms2(x_mid): dx += the norm's backward of dh2 */
    VRAM_TRY(cuda_rmsnorm_backward(pass->dx, true, b->norm2.grad, pass->partial, pass->dh, s->x_mid,
                                   b->norm2.value, t, h, EPS, stream),
             "cannot launch rmsnorm backward");
    return UFORM_OK;
}

/* The attention's backward: from dx = d x_mid to dx = d x_in. */
static uform_status_t attention_backward(vram_device_t *device, vram_train_tower_t const *tower,
                                         vram_train_block_t const *b, vram_saved_t const *s,
                                         vram_train_pass_t const *pass, int32_t const *offsets, size_t items,
                                         size_t max_length, bool causal, bool rotary, char const **message) {
    size_t t = pass->tokens, h = tower->hidden;
    cudaStream_t stream = device->stream;
    uform_status_t status;
    /* x_mid = x_in + att Wout^T + b: dWout += dx^T att, d_att = dx Wout          [T, H] */
    if ((status = residual_backward(device, &b->out_w, h, h, &b->out_b, s->att, pass, pass->d_att, message)))
        return status;
    /* att = attention(qkv): d_qkv, the rotary rotation undone                      [T, 3H] */
    VRAM_TRY(cuda_attention_backward(pass->d_wide, pass->d_rows, s->qkv, s->att, pass->d_att, s->lse, offsets,
                                     items, t, tower->heads, max_length, causal, rotary, 0.125f, stream),
             "cannot launch attention backward");
    /* qkv = h1 Wqkv^T + b: dWqkv += d_qkv^T h1, dh1 = d_qkv Wqkv; h1 = rms1(x_in): dx += its backward */
    if ((status = vram_train_linear_backward(device, &b->qkv_w, 3 * h, h, &b->qkv_b, s->h1, t, pass->d_wide,
                                             NULL, pass->dh, false, false, pass->sums, message)))
        return status;
    VRAM_TRY(cuda_rmsnorm_backward(pass->dx, true, b->norm1.grad, pass->partial, pass->dh, s->x_in,
                                   b->norm1.value, t, h, EPS, stream),
             "cannot launch rmsnorm backward");
    return UFORM_OK;
}

uform_status_t vram_train_backward(vram_device_t *device, vram_train_tower_t const *tower,
                                   vram_train_pass_t const *pass, int32_t const *offsets, size_t items,
                                   size_t max_length, bool causal, bool rotary, char const **message) {
    size_t t = pass->tokens, h = tower->hidden;
    /* states = rms(x_final): dx = its backward of d_states */
    VRAM_TRY(cuda_rmsnorm_backward(pass->dx, false, tower->norm.grad, pass->partial, pass->d_states,
                                   pass->x_final, tower->norm.value, t, h, EPS, device->stream),
             "cannot launch rmsnorm backward");
    for (size_t i = tower->depth; i-- > 0;) {
        uform_status_t status =
            mlp_backward(device, tower, &tower->blocks[i], &pass->blocks[i], pass, message);
        if (status == UFORM_OK)
            status = attention_backward(device, tower, &tower->blocks[i], &pass->blocks[i], pass, offsets,
                                        items, max_length, causal, rotary, message);
        if (status != UFORM_OK) return status;
    }
    return UFORM_OK;
}

#endif /* UFORM_WITH_CUDA */
