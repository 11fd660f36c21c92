"""An independent PyTorch reference of UForm's format-4 model, written from docs/DESIGN.md alone.

It reads a format-4 safetensors checkpoint with its own parser (struct, json and numpy: BF16 is
widened to F32 by shifting, so no extra package is needed) and runs the text tower in float32 (or
float64) on the CPU. It is the yardstick the C engine is checked against
(tests/reference/test_text_reference.py) and benchmarked against (bench/bench_text.py); it is not
fast and does not try to be.

The towers share one pre-norm trunk, `Transformer`, that takes `causal` and `rotary` flags and owns
`blocks`, `norm` and `proj` exactly as the checkpoint names them under `{tower}.`: a tower is the
trunk plus its front end (the text tower adds the byte table `embed`; the image tower adds the
pixel front end, the patch layer `patch`, the class token `cls` and the learned positions `pos`, and
runs the trunk bidirectionally without rotary positions). The audio tower is not written yet.

The image front end resizes with PyTorch's `F.interpolate(mode="bilinear", align_corners=False,
antialias=True)` (the engine's convention, pinned in include/uform.h and checked here against a
direct numpy transcription of its formula); images are decoded by Pillow.

    python3 tests/reference/uform_reference.py CHECKPOINT [TEXT ...]   # prints embeddings
    python3 tests/reference/uform_reference.py CHECKPOINT --image FILE  # prints an image embedding
    python3 tests/reference/uform_reference.py --self-check           # checks the pieces
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

HEAD = 64  # head size, every tower
BOS = 256  # row of text.embed used at position 0
RMS_EPS = 1e-6
ROTARY_BASE = 10000.0
ATTENTION_SCALE = 1.0 / math.sqrt(HEAD)

# ------------------------------------------------------------------------------------------------
# The checkpoint: safetensors, parsed here
# ------------------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {  # name: (numpy storage type, bytes per scalar)
    "BF16": (np.uint16, 2),
    "F16": (np.float16, 2),
    "F32": (np.float32, 4),
    "F64": (np.float64, 8),
    "I8": (np.int8, 1),
    "U8": (np.uint8, 1),
    "I32": (np.int32, 4),
    "I64": (np.int64, 8),
}


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) to the float32 values they denote, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: str, prefixes: tuple[str, ...] | None = None):
    """Answers (tensors, metadata): float arrays by name (BF16 and F16 widened to float32) and the
    `__metadata__` dictionary of strings. Only tensors whose name starts with one of `prefixes` are
    converted (all when None). Validates the header length, every dtype, shape and offset against
    the file before reading tensor bytes, as the C reader does; raises ValueError otherwise."""
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    if blob.size < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (header_length,) = struct.unpack("<Q", bytes(blob[:8]))
    if header_length > blob.size - 8:
        raise ValueError(f"{path}: header length {header_length} past the end of the file")
    header = json.loads(bytes(blob[8 : 8 + header_length]).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + header_length
    data_length = blob.size - base
    tensors = {}
    for name, info in header.items():
        dtype = info.get("dtype")
        if dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: {name}: unsupported dtype {dtype!r}")
        storage, size = _SAFETENSORS_DTYPES[dtype]
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        count = math.prod(shape)
        if not (0 <= begin <= end <= data_length) or end - begin != count * size:
            raise ValueError(f"{path}: {name}: offsets {begin}..{end} do not fit shape {shape} of {dtype}")
        if prefixes is not None and not name.startswith(prefixes):
            continue
        raw = np.frombuffer(blob, dtype=storage, count=count, offset=base + begin)
        if dtype == "BF16":
            array = bf16_bits_to_f32(raw)
        elif dtype == "F16":
            array = raw.astype(np.float32)
        else:
            array = np.array(raw)
        tensors[name] = array.reshape(shape)
    return tensors, metadata


@dataclass
class TransformerConfig:
    depth: int
    hidden: int
    heads: int
    mlp: int

    @staticmethod
    def from_json(tower: dict) -> "TransformerConfig":
        config = TransformerConfig(int(tower["depth"]), int(tower["hidden"]), int(tower["heads"]), int(tower["mlp"]))
        if config.heads * HEAD != config.hidden:
            raise ValueError(f"heads * {HEAD} != hidden in {tower}")
        return config


# ------------------------------------------------------------------------------------------------
# The pieces, written as docs/DESIGN.md's "Numerics, pinned" states them
# ------------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + 1e-6) * w, over the last axis."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS) * weight


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def rotary_tables(positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, 32] of angle p * 10000^(-2i/64), computed in float64, then cast."""
    p = torch.arange(positions, dtype=torch.float64)[:, None]
    i = torch.arange(HEAD // 2, dtype=torch.float64)[None, :]
    angles = p * ROTARY_BASE ** (-2.0 * i / HEAD)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, 64], cos and sin [T, 32]: pairs (i, i + 32) turn by the position's angle,
    x_i' = x_i cos - x_{i+32} sin, x_{i+32}' = x_{i+32} cos + x_i sin."""
    low, high = x[..., : HEAD // 2], x[..., HEAD // 2 :]
    return torch.cat((low * cos - high * sin, high * cos + low * sin), dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              key_padding: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v [B, heads, T, 64] -> [B, heads, T, 64]; softmax(q k^T / 8 + mask) v.
    `key_padding` [B, T] is True for keys to ignore. A causal query sees keys at its position and
    before, so right padding needs no key mask for the positions that are kept."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * ATTENTION_SCALE  # [B, heads, T, T]
    length = q.shape[-2]
    if causal:
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if key_padding is not None:
        scores = scores.masked_fill(key_padding[:, None, None, :], float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The same, one query at a time in float64 loops: the check for `attention`."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    out = torch.zeros_like(q64)
    batch, heads, length, _ = q.shape
    for b in range(batch):
        for h in range(heads):
            for t in range(length):
                seen = t + 1 if causal else length
                logits = torch.stack([torch.dot(q64[b, h, t], k64[b, h, s]) / 8.0 for s in range(seen)])
                weights = torch.exp(logits - logits.max())
                weights = weights / weights.sum()
                out[b, h, t] = (weights[:, None] * v64[b, h, :seen]).sum(dim=0)
    return out


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / |x| over the last axis; a zero row stays zero."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / torch.clamp(norm, min=torch.finfo(x.dtype).tiny)


# ------------------------------------------------------------------------------------------------
# The trunk every tower shares
# ------------------------------------------------------------------------------------------------


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(hidden), requires_grad=False)

    def forward(self, x):
        return rms_norm(x, self.weight)


class BF16Inputs(torch.nn.Module):
    """A linear layer whose input may be rounded to BF16 first: set `round_inputs` to emulate an
    engine whose GEMMs read BF16 activations, to size the tolerances of the comparisons. One with I8
    weights (`quantize_blocks`) quantizes its input per row as the engine does (`quantize_activations`)."""

    round_inputs = False

    def __init__(self, inputs: int, outputs: int, bias: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(outputs, inputs), requires_grad=False)  # [out, in]
        self.bias = torch.nn.Parameter(torch.zeros(outputs), requires_grad=False) if bias else None
        self.i8 = False

    def forward(self, x):
        if self.i8:
            x = quantize_activations(x)
        elif BF16Inputs.round_inputs and x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16).to(x.dtype)
        return F.linear(x, self.weight, self.bias)  # x W^T + b


class Attention(torch.nn.Module):
    def __init__(self, config: TransformerConfig, causal: bool, rotary: bool):
        super().__init__()
        self.heads, self.causal, self.rotary = config.heads, causal, rotary
        self.qkv = BF16Inputs(config.hidden, 3 * config.hidden, bias=True)  # rows: q, then k, then v
        self.out = BF16Inputs(config.hidden, config.hidden, bias=True)

    def forward(self, x, cos=None, sin=None, key_padding=None):
        batch, length, hidden = x.shape
        qkv = self.qkv(x)  # [B, T, 3H]

        def heads(part):  # [B, T, H] -> [B, heads, T, 64]; head h owns rows h*64 .. h*64+63
            return part.reshape(batch, length, self.heads, HEAD).transpose(1, 2)

        q, k, v = heads(qkv[..., :hidden]), heads(qkv[..., hidden : 2 * hidden]), heads(qkv[..., 2 * hidden :])
        if self.rotary:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        mixed = attention(q, k, v, self.causal, key_padding)  # [B, heads, T, 64]
        return self.out(mixed.transpose(1, 2).reshape(batch, length, hidden))  # heads in order


class MLP(torch.nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.up = BF16Inputs(config.hidden, config.mlp, bias=True)
        self.down = BF16Inputs(config.mlp, config.hidden, bias=True)

    def forward(self, x):
        return self.down(gelu_tanh(self.up(x)))


class Block(torch.nn.Module):
    def __init__(self, config: TransformerConfig, causal: bool, rotary: bool):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(config.hidden), RMSNorm(config.hidden)
        self.attn = Attention(config, causal, rotary)
        self.mlp = MLP(config)

    def forward(self, x, cos=None, sin=None, key_padding=None):
        x = x + self.attn(self.norm1(x), cos, sin, key_padding)
        return x + self.mlp(self.norm2(x))


class Transformer(torch.nn.Module):
    """Pre-norm blocks, the final RMSNorm and the projection to `dims`; parameter names match the
    checkpoint's under `{tower}.`. `positions` bounds the rotary table when `rotary` is set."""

    def __init__(self, config: TransformerConfig, dims: int, causal: bool, rotary: bool, positions: int = 0):
        super().__init__()
        self.config, self.dims, self.causal, self.rotary = config, dims, causal, rotary
        self.blocks = torch.nn.ModuleList(Block(config, causal, rotary) for _ in range(config.depth))
        self.norm = RMSNorm(config.hidden)
        self.proj = BF16Inputs(config.hidden, dims, bias=False)
        if rotary:
            cos, sin = rotary_tables(positions, torch.float32)
            self.register_buffer("rotary_cos", cos, persistent=False)  # [positions, 32]
            self.register_buffer("rotary_sin", sin, persistent=False)

    def load(self, tensors: dict, prefix: str, dtype: torch.dtype):
        """Takes every `{prefix}name` tensor this module declares; raises KeyError on a missing one
        and ValueError on a shape that does not match."""
        state = {}
        for name, parameter in self.named_parameters():
            array = tensors[prefix + name]
            if tuple(array.shape) != tuple(parameter.shape):
                raise ValueError(f"{prefix}{name}: shape {array.shape}, expected {tuple(parameter.shape)}")
            state[name] = torch.from_numpy(np.ascontiguousarray(array))
        self.load_state_dict(state, strict=False)
        if self.rotary:  # recomputed in float64 for the target precision, not cast from float32
            cos, sin = rotary_tables(self.rotary_cos.shape[0], dtype)
            self.rotary_cos, self.rotary_sin = cos, sin
        return self.to(dtype)

    def trunk(self, x: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, hidden] at positions 0..T-1 -> the final-normed states [B, T, hidden]."""
        cos = sin = None
        if self.rotary:
            length = x.shape[1]
            cos, sin = self.rotary_cos[:length], self.rotary_sin[:length]
        for block in self.blocks:
            x = block(x, cos, sin, key_padding)
        return self.norm(x)

    def embed_states(self, states: torch.Tensor) -> torch.Tensor:
        """states [..., hidden] -> L2-normalized projections [..., dims]."""
        return l2_normalize(self.proj(states))


# ------------------------------------------------------------------------------------------------
# The text tower
# ------------------------------------------------------------------------------------------------


class Encoding:
    """What every tower's `encode` answers has: `embeddings` [items, dims] and `token_vectors`, per item
    (a list of [rows, dims], or an array [items, rows, dims])."""

    def matryoshka(self, width: int) -> np.ndarray:
        """The first `width` values of each normalized embedding, renormalized."""
        prefix = self.embeddings[:, :width]
        return prefix / np.maximum(np.linalg.norm(prefix, axis=1, keepdims=True), np.finfo(np.float64).tiny)

    def stacked_token_vectors(self) -> np.ndarray:
        """Every item's token vectors, one item after another: [rows, dims]."""
        dims = self.embeddings.shape[1]
        return np.concatenate(list(self.token_vectors)) if len(self.token_vectors) else np.zeros((0, dims))


@dataclass
class TextEncoding(Encoding):
    """What `TextTower.encode` answers, as float64 numpy arrays computed in the tower's dtype."""

    embeddings: np.ndarray  # [items, dims]
    states: np.ndarray  # [items, hidden], the final-normed state at the last position
    token_vectors: list  # per item, [kept bytes, dims]
    kept: list  # bytes kept per item, BOS excluded
    truncated: int  # items longer than `context`
    token_offsets: list = field(default_factory=list)  # items + 1 row offsets into the stacked token vectors


class TextTower(Transformer):
    """Bytes, no tokenizer: BOS (row 256) at position 0, byte j at position j + 1, causal attention
    with rotary positions, at most `context` bytes (BOS excluded; the rest is dropped and counted)."""

    def __init__(self, config: TransformerConfig, dims: int, context: int):
        super().__init__(config, dims, causal=True, rotary=True, positions=context + 1)
        self.context = context
        self.embed = torch.nn.Parameter(torch.zeros(BOS + 1, config.hidden), requires_grad=False)  # [257, hidden]

    def token_ids(self, text: bytes) -> tuple[list, bool]:
        """[BOS, kept bytes...] and whether bytes were dropped."""
        data = bytes(text)
        return [BOS] + list(data[: self.context]), len(data) > self.context

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] int64, BOS first, right-padded with any byte -> final-normed states [B, T, hidden].
        Causal attention keeps padding out of every kept position, so no mask is needed."""
        return self.trunk(self.embed[ids])

    @torch.no_grad()
    def encode(self, texts, batch: int = 64) -> TextEncoding:
        rows = [self.token_ids(t) for t in texts]
        embeddings, states, vectors = [], [], []
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            length = max(len(ids) for ids, _ in chunk)
            ids = torch.zeros(len(chunk), length, dtype=torch.long)
            for i, (row, _) in enumerate(chunk):
                ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            hidden = self.forward(ids)  # [B, T, hidden]
            projected = self.embed_states(hidden)  # [B, T, dims]
            for i, (row, _) in enumerate(chunk):
                last = len(row) - 1
                states.append(hidden[i, last].double().numpy())
                embeddings.append(projected[i, last].double().numpy())
                vectors.append(projected[i, 1 : last + 1].double().numpy())  # none for BOS
        kept = [len(ids) - 1 for ids, _ in rows]
        offsets = [0]
        for n in kept:
            offsets.append(offsets[-1] + n)
        return TextEncoding(
            embeddings=np.stack(embeddings) if embeddings else np.zeros((0, self.dims)),
            states=np.stack(states) if states else np.zeros((0, self.config.hidden)),
            token_vectors=vectors,
            kept=kept,
            truncated=sum(1 for _, cut in rows if cut),
            token_offsets=offsets,
        )

    @torch.no_grad()
    def choose(self, states, choices) -> list:
        """Per item, softmax over only its legal next bytes of state . embed[byte]: the byte table
        (rows 0..255) is the tied language-model head. `states` [items, hidden]; `choices` one bytes
        object per item. Answers one float64 array per item, one probability per legal byte in the
        order given."""
        states = torch.as_tensor(np.asarray(states), dtype=self.embed.dtype)
        answers = []
        for state, legal in zip(states, choices):
            legal = list(bytes(legal))
            if not legal:
                answers.append(np.zeros(0))
                continue
            logits = self.embed[torch.tensor(legal, dtype=torch.long)] @ state  # [legal]
            answers.append(torch.softmax(logits, dim=0).double().numpy())
        return answers


# ------------------------------------------------------------------------------------------------
# The image tower
# ------------------------------------------------------------------------------------------------


def resized_size(height: int, width: int, size: int) -> tuple[int, int]:
    """The short side becomes `size`, the long one floor(long * size / short), in integers."""
    if height < width:
        return size, width * size // height
    if width < height:
        return height * size // width, size
    return size, size


def resize_weights(source: int, target: int, first: int, count: int) -> np.ndarray:
    """The resampling matrix [count, source] of outputs first .. first + count - 1 from `source` to
    `target` samples, transcribed from the formula in include/uform.h (float64): scale = source /
    target, support = max(scale, 1), output o centred at c = (o + 0.5) scale reads inputs j in
    [max(trunc(c - support + 0.5), 0), min(trunc(c + support + 0.5), source)) with weights
    max(0, 1 - |j + 0.5 - c| / max(scale, 1)), normalized. The self-check compares it with
    F.interpolate(antialias=True), which the reference uses."""
    scale = source / target
    support = max(scale, 1.0)
    matrix = np.zeros((count, source))
    for row, o in enumerate(range(first, first + count)):
        center = (o + 0.5) * scale
        low, high = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), source)
        j = np.arange(low, high)
        w = np.maximum(0.0, 1.0 - np.abs(j + 0.5 - center) / support)
        matrix[row, low:high] = w / w.sum()
    return matrix


@dataclass
class ImageEncoding(Encoding):
    """What `ImageTower.encode` answers, as float64 numpy arrays computed in the tower's dtype."""

    embeddings: np.ndarray  # [items, dims], from the class token
    states: np.ndarray  # [items, hidden], the class token's final-normed state
    token_vectors: np.ndarray  # [items, patches, dims], the patches' projections, normalized


class ImageTower(Transformer):
    """RGB8 pixels: the short side resized to `size` (antialiased bilinear), a centre crop, values
    scaled to [0, 1] and normalized by `mean` / `std`, `patch` x `patch` patches flattened channel,
    row, column; `patch` embeds them, `cls` leads, `pos` is added to every token (class token
    first, patches row-major); bidirectional attention, no rotary positions."""

    def __init__(self, config: TransformerConfig, dims: int, size: int, patch: int, mean, std):
        super().__init__(config, dims, causal=False, rotary=False)
        self.size, self.patch_size = size, patch
        self.side = size // patch
        self.patch = BF16Inputs(3 * patch * patch, config.hidden, bias=True)  # [hidden, 3 patch^2]
        self.cls = torch.nn.Parameter(torch.zeros(config.hidden), requires_grad=False)  # [hidden]
        self.pos = torch.nn.Parameter(torch.zeros(1 + self.side**2, config.hidden), requires_grad=False)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32), persistent=False)

    @property
    def patches(self) -> int:
        return self.side * self.side

    def preprocess(self, rgb: np.ndarray) -> torch.Tensor:
        """uint8 [height, width, 3] -> normalized [3, size, size] in the tower's dtype (computed in
        float32, or float64 for a float64 tower: PyTorch's antialiased resize has no bfloat16)."""
        rgb = np.array(rgb, dtype=np.uint8)  # a writable copy: Pillow's arrays are read-only
        height, width = rgb.shape[:2]
        out_height, out_width = resized_size(height, width, self.size)
        wide = torch.float64 if self.cls.dtype == torch.float64 else torch.float32
        x = torch.from_numpy(rgb).permute(2, 0, 1)[None].to(wide) / 255.0
        x = F.interpolate(x, size=(out_height, out_width), mode="bilinear", align_corners=False, antialias=True)
        top, left = (out_height - self.size) // 2, (out_width - self.size) // 2
        x = x[0, :, top : top + self.size, left : left + self.size]
        mean, std = self.mean.to(x.dtype)[:, None, None], self.std.to(x.dtype)[:, None, None]
        return ((x - mean) / std).to(self.cls.dtype)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 3, size, size] -> [B, side^2, 3 patch^2]: patch (py, px) is row py * side + px, and
        within it index c * patch^2 + dy * patch + dx."""
        batch, p, side = x.shape[0], self.patch_size, self.side
        return x.reshape(batch, 3, side, p, side, p).permute(0, 2, 4, 1, 3, 5).reshape(batch, side * side, 3 * p * p)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalized pixels [B, 3, size, size] -> final-normed states [B, 1 + patches, hidden]."""
        tokens = self.patch(self.patchify(pixels))  # [B, patches, hidden]
        cls = self.cls.expand(pixels.shape[0], 1, -1)
        return self.trunk(torch.cat((cls, tokens), dim=1) + self.pos)

    @torch.no_grad()
    def encode(self, images, batch: int = 16) -> ImageEncoding:
        """`images`: uint8 arrays [height, width, 3] of any sizes."""
        embeddings, states, vectors = [], [], []
        for start in range(0, len(images), batch):
            pixels = torch.stack([self.preprocess(image) for image in images[start : start + batch]])
            hidden = self.forward(pixels)  # [B, 1 + patches, hidden]
            projected = self.embed_states(hidden)  # [B, 1 + patches, dims]
            states.append(hidden[:, 0].double().numpy())
            embeddings.append(projected[:, 0].double().numpy())
            vectors.append(projected[:, 1:].double().numpy())
        return ImageEncoding(
            embeddings=np.concatenate(embeddings) if embeddings else np.zeros((0, self.dims)),
            states=np.concatenate(states) if states else np.zeros((0, self.config.hidden)),
            token_vectors=np.concatenate(vectors) if vectors else np.zeros((0, self.patches, self.dims)),
        )


def video_samples(times, end, frames: int) -> list:
    """docs/DESIGN.md: sample k of F is the frame shown at time start + (k + 0.5) * duration / F, where
    frame i (presentation `times`, ascending) is shown until the next one's time and the last until
    `end`; a time before every frame takes the first. Answers the F frame indices."""
    start = times[0]
    picks = []
    for k in range(frames):
        time = start + (k + 0.5) * (end - start) / frames
        picks.append(max([i for i, shown in enumerate(times) if shown <= time], default=0))
    return picks


def pool_video(frames: ImageEncoding, per_clip: int) -> ImageEncoding:
    """Clips from the image encodings of their sampled frames, `per_clip` consecutive frames each: the
    embedding is the normalized mean of the frames' embeddings (at the full dims; matryoshka prefixes
    then follow the usual rule), the token vectors are the frames' embeddings, the state their mean."""
    embeddings = frames.embeddings.reshape(-1, per_clip, frames.embeddings.shape[-1])
    pooled = l2_normalize(torch.from_numpy(embeddings.mean(axis=1))).numpy()
    states = frames.states.reshape(-1, per_clip, frames.states.shape[-1]).mean(axis=1)
    return ImageEncoding(embeddings=pooled, states=states, token_vectors=embeddings)


def pillow_rgb(source) -> np.ndarray:
    """Pillow's decode of a file path or encoded bytes, as uint8 RGB [height, width, 3]."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source) as image:
        return np.asarray(image.convert("RGB"))


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------


class Reference:
    """A format-4 checkpoint in PyTorch: `text` and `image` are its towers (None when absent)."""

    def __init__(self, path: str, dtype: torch.dtype = torch.float32):
        tensors, metadata = read_safetensors(path, prefixes=("text.", "image."))
        if "uform" not in metadata:
            raise ValueError(f"{path}: no __metadata__['uform']")
        self.config = json.loads(metadata["uform"])
        if self.config.get("format") != 4:
            raise ValueError(f"{path}: format {self.config.get('format')!r}, expected 4")
        self.dims = int(self.config["dims"])
        self.matryoshka = [int(k) for k in self.config.get("matryoshka", [])]
        self.dtype = dtype
        self.text = None
        if "text" in self.config:
            text = self.config["text"]
            tower = TextTower(TransformerConfig.from_json(text), self.dims, int(text["context"]))
            self.text = tower.load(tensors, "text.", dtype).eval()
        self.image = None
        if "image" in self.config:
            image = self.config["image"]
            tower = ImageTower(TransformerConfig.from_json(image), self.dims, int(image["size"]), int(image["patch"]),
                               [float(v) for v in image["mean"]], [float(v) for v in image["std"]])
            self.image = tower.load(tensors, "image.", dtype).eval()


# ------------------------------------------------------------------------------------------------
# Output kinds: BF16, F16, I8 per row
# ------------------------------------------------------------------------------------------------


def f32_to_bf16_bits(x) -> np.ndarray:
    """float32 -> BF16 bit patterns, rounding to nearest even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def to_bf16(x) -> np.ndarray:
    """The float32 values BF16 output holds for x."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def to_f16(x) -> np.ndarray:
    """float32 -> float16, rounding to nearest even (numpy's conversion), overflow to infinity."""
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def quantize_i8_rows(x) -> tuple[np.ndarray, np.ndarray]:
    """Per row: scale = max|x| / 127, q = round(x / scale) half away from zero, in float32 as an
    engine computes it. A zero row has scale 0 and q 0. Answers (q int8 [rows, cols], scales float32 [rows])."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float32))
    scales = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float32) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))[:, None].astype(np.float32)
    ratio = np.abs(x) / safe  # float32
    whole = np.floor(ratio)
    magnitude = whole + ((ratio - whole) >= np.float32(0.5))  # half away from zero
    q = np.clip(np.sign(x) * magnitude, -127, 127)
    q = np.where(scales[:, None] > 0, q, 0).astype(np.int8)
    return q, scales


def dequantize_i8_rows(q, scales) -> np.ndarray:
    return np.asarray(q, dtype=np.float32) * np.asarray(scales, dtype=np.float32)[:, None]


# ------------------------------------------------------------------------------------------------
# I8 weights (docs/DESIGN.md, "I8 weights")
# ------------------------------------------------------------------------------------------------

I8_INPUTS_MAX = 65536  # a layer with more inputs keeps BF16 weights


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """The values the engine's I8 layers multiply for activations x [..., k], per row in float32:
    lo = min(0, min x), hi = max(0, max x), inv = 255 / (hi - lo), zero = rint(-lo inv),
    q = clamp(rint(x inv) + zero, 0, 255) (rint to nearest even), then (q - zero) (hi - lo) / 255; a row
    whose range is 0 (or too small to divide by) gives zeros."""
    x32 = x.to(torch.float32)
    lo = torch.clamp(x32.amin(dim=-1, keepdim=True), max=0.0)
    hi = torch.clamp(x32.amax(dim=-1, keepdim=True), min=0.0)
    span = hi - lo
    inv = torch.tensor(255.0, dtype=torch.float32) / span
    usable = torch.isfinite(inv)
    inv = torch.where(usable, inv, torch.zeros_like(inv))
    zero = torch.round(-lo * inv)
    q = torch.clamp(torch.round(x32 * inv) + zero, 0.0, 255.0)
    values = (q - zero) * (span / torch.tensor(255.0, dtype=torch.float32))
    return torch.where(usable, values, torch.zeros_like(values)).to(x.dtype)


def quantize_blocks(tower) -> None:
    """A tower as the engine runs it with I8 weights: each block's attn.qkv, attn.out, mlp.up and mlp.down
    weight (of at most I8_INPUTS_MAX inputs) replaced by its per-row I8 quantization (quantize_i8_rows,
    dequantized), and the layer's input quantized per row as it runs (quantize_activations)."""
    for block in tower.blocks:
        for layer in (block.attn.qkv, block.attn.out, block.mlp.up, block.mlp.down):
            if layer.weight.shape[1] > I8_INPUTS_MAX:
                continue
            q, scales = quantize_i8_rows(layer.weight.detach().to(torch.float32).numpy())
            layer.weight.data = torch.from_numpy(dequantize_i8_rows(q, scales)).to(layer.weight.dtype)
            layer.i8 = True
    tower.i8 = True


# ------------------------------------------------------------------------------------------------
# Self-checks of the pieces, independent of any engine
# ------------------------------------------------------------------------------------------------


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both_zero = (na == 0) & (nb == 0)
    cos = (a * b).sum(axis=1) / np.maximum(na * nb, 1e-300)
    return np.where(both_zero, 1.0, cos)


def random_weights(tower, prefix: str, seed: int, dtype):
    """Loads random weights of realistic scale into `tower` (as a checkpoint names them under `prefix`),
    for checks that need no checkpoint: norms near 1, biases, the class token and the positions near 0,
    the rest scaled by 1 / sqrt(fan-in); BF16-representable, like a checkpoint's."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, parameter in tower.named_parameters():
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
            value = 1.0 + 0.1 * torch.randn(parameter.shape, generator=generator)
        elif name.endswith("bias") or name in ("cls", "pos"):
            value = 0.02 * torch.randn(parameter.shape, generator=generator)
        else:
            value = torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1])
        tensors[prefix + name] = to_bf16(value.numpy())
    return tower.load(tensors, prefix, dtype).eval()


def random_text_tower(depth=2, hidden=128, mlp=256, dims=64, context=32, seed=0, dtype=torch.float32):
    """A text tower with random weights of realistic scale."""
    tower = TextTower(TransformerConfig(depth, hidden, hidden // HEAD, mlp), dims, context)
    return random_weights(tower, "text.", seed, dtype)


def random_image_tower(depth=2, hidden=128, mlp=256, dims=64, size=32, patch=8, seed=0, dtype=torch.float32):
    """An image tower with random weights of realistic scale."""
    tower = ImageTower(TransformerConfig(depth, hidden, hidden // HEAD, mlp), dims, size, patch,
                       [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
    return random_weights(tower, "image.", seed, dtype)


class Report:
    """Named checks, printed as they run (when `verbose`); `failures` lists those that failed."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.failures = []

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if self.verbose:
            print(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failures.append(f"{name}: {detail}")
        return ok


def self_check(verbose: bool = True) -> list:
    """Checks the pieces against independent formulations; answers a list of failures (empty: pass)."""
    report = Report(verbose)
    check = report.check

    generator = torch.Generator().manual_seed(7)

    # Attention: vectorized vs one-query-at-a-time float64 loops, causal and not; and vs PyTorch's
    # own kernel where this PyTorch has it (2.0 and later).
    q, k, v = (torch.randn(2, 3, 9, HEAD, generator=generator) for _ in range(3))
    for causal in (True, False):
        error = (attention(q, k, v, causal).double() - attention_naive(q, k, v, causal)).abs().max().item()
        check(f"attention {'causal' if causal else 'bidirectional'} vs naive loops", error < 1e-5, f"max abs {error:.2e}")
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        if sdpa is not None:
            error = (attention(q, k, v, causal) - sdpa(q, k, v, is_causal=causal)).abs().max().item()
            check("attention vs F.scaled_dot_product_attention", error < 1e-5, f"max abs {error:.2e}")
    if getattr(F, "scaled_dot_product_attention", None) is None and verbose:
        print(f"  --   F.scaled_dot_product_attention absent in PyTorch {torch.__version__}; naive loops only")

    # The causal mask: changing keys and values after position t leaves outputs up to t unchanged.
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] += 3.0
    v2[:, :, 5:] -= 3.0
    same = torch.equal(attention(q, k, v, True)[:, :, :5], attention(q, k2, v2, True)[:, :, :5])
    changed = not torch.allclose(attention(q, k, v, True)[:, :, 5:], attention(q, k2, v2, True)[:, :, 5:])
    check("causal mask hides the future, not the past", same and changed)

    # Key padding: padded keys carry no weight.
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[:, 6:] = True
    masked = attention(q, k, v, False, padding)
    cut = attention(q[:, :, :, :], k[:, :, :6], v[:, :, :6], False)
    error = (masked - cut).abs().max().item()
    check("key padding mask", error < 1e-5, f"max abs {error:.2e}")

    # Rotary: matches multiplication by e^{i angle} on complex pairs (x_i, x_{i+32}), and scores
    # depend only on the distance between positions.
    cos, sin = rotary_tables(40, torch.float64)
    x = torch.randn(1, 1, 40, HEAD, generator=generator, dtype=torch.float64)
    as_complex = torch.complex(x[..., :32], x[..., 32:]) * torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))
    expected = torch.cat((as_complex.real, as_complex.imag), dim=-1)
    error = (apply_rotary(x, cos, sin) - expected).abs().max().item()
    check("rotary as complex rotation of pairs (i, i+32)", error < 1e-12, f"max abs {error:.2e}")
    angle = 7 * ROTARY_BASE ** (-2 * 3 / HEAD)
    check("rotary angle p * 10000^(-2i/64) at p=7, i=3", abs(cos[7, 3].item() - math.cos(angle)) < 1e-12)
    qv, kv = torch.randn(HEAD, dtype=torch.float64), torch.randn(HEAD, dtype=torch.float64)
    rq = apply_rotary(qv.expand(1, 1, 40, HEAD), cos, sin)[0, 0]
    rk = apply_rotary(kv.expand(1, 1, 40, HEAD), cos, sin)[0, 0]
    error = abs(torch.dot(rq[12], rk[9]).item() - torch.dot(rq[30], rk[27]).item())
    check("rotary scores depend on relative position", error < 1e-9, f"diff {error:.2e}")

    # RMSNorm and GELU against the library's own versions.
    x = torch.randn(5, 64, generator=generator, dtype=torch.float64)
    w = torch.randn(64, generator=generator, dtype=torch.float64)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    check("rms_norm", (rms_norm(x, w) - expected).abs().max().item() < 1e-12)
    try:
        error = (gelu_tanh(x) - F.gelu(x, approximate="tanh")).abs().max().item()
        check("gelu_tanh vs F.gelu(approximate='tanh')", error < 1e-12, f"max abs {error:.2e}")
    except TypeError:
        pass

    # The tower: batching and padding change nothing; a text's state is the state at the same
    # position of any longer text with that prefix (causality end to end); truncation keeps the
    # first `context` bytes; float32 agrees with float64.
    tower = random_text_tower(context=32)
    tower64 = random_text_tower(context=32, dtype=torch.float64)
    texts = [b"", b"a", b"hello world", "\u041f\u0440\u0438\u0432\u0435\u0442 \U0001F30D".encode(), bytes(range(40)), b"x" * 32, b"x" * 33]
    together = tower.encode(texts, batch=64)
    alone = [tower.encode([t]) for t in texts]
    error = max(np.abs(together.embeddings[i] - a.embeddings[0]).max() for i, a in enumerate(alone))
    check("batch of padded texts == one at a time", error < 1e-5, f"max abs {error:.2e}")
    check("kept bytes and truncated count", together.kept == [0, 1, 11, len(texts[3]), 32, 32, 32] and together.truncated == 2,
          f"kept {together.kept}, truncated {together.truncated}")
    check("truncated text == its first `context` bytes",
          np.array_equal(tower.encode([bytes(range(40))]).embeddings, tower.encode([bytes(range(32))]).embeddings))
    prefix = tower.encode([b"hello"])
    longer = tower.encode([b"hello world"])
    error = np.abs(prefix.token_vectors[0] - longer.token_vectors[0][:5]).max()
    check("token vectors of a prefix == the prefix of token vectors", error < 1e-5, f"max abs {error:.2e}")
    error = np.abs(prefix.embeddings[0] - longer.token_vectors[0][4]).max()
    check("embedding == token vector of the last kept byte", error < 1e-5, f"max abs {error:.2e}")
    check("no token vectors for the empty text", together.token_vectors[0].shape == (0, tower.dims))
    wide = tower64.encode(texts)
    cosine = _cosines(together.embeddings, wide.embeddings).min()
    state_error = np.linalg.norm(together.states - wide.states, axis=1).max() / np.linalg.norm(wide.states, axis=1).min()
    check("float32 vs float64", cosine > 1 - 1e-9 and state_error < 1e-5, f"min cosine {cosine:.12f}, state rel {state_error:.1e}")
    norms = np.linalg.norm(together.embeddings, axis=1)
    check("embeddings are unit rows", np.abs(norms - 1).max() < 1e-6)
    m = together.matryoshka(32)
    check("matryoshka prefix renormalized", np.abs(np.linalg.norm(m, axis=1) - 1).max() < 1e-12
          and np.abs(_cosines(m, together.embeddings[:, :32]) - 1).max() < 1e-9)

    # What an engine with BF16 GEMM inputs should expect: the emulation's distance from float32.
    BF16Inputs.round_inputs = True
    try:
        rounded = tower.encode(texts)
    finally:
        BF16Inputs.round_inputs = False
    cosine = _cosines(rounded.embeddings, together.embeddings).min()
    state_error = (np.linalg.norm(rounded.states - together.states, axis=1) / np.linalg.norm(together.states, axis=1)).max()
    check("BF16-input emulation within the engine tolerances", cosine > 0.999 and state_error < 1e-2,
          f"min cosine {cosine:.6f}, max state rel L2 {state_error:.1e}")

    # text_choose: a softmax per item over only its legal bytes, of the tied byte table.
    states = together.states[:3]
    probabilities = tower.choose(states, [b"ab", bytes(range(256)), b"z"])
    full = torch.softmax(torch.as_tensor(states[1], dtype=torch.float32) @ tower.embed[:256].T, 0).double().numpy()
    check("choose over all 256 bytes == full softmax of the tied head", np.abs(probabilities[1] - full).max() < 1e-6)
    check("choose sums to 1, one legal byte has probability 1",
          all(abs(p.sum() - 1) < 1e-6 for p in probabilities) and abs(probabilities[2][0] - 1) < 1e-12)
    full0 = torch.softmax(torch.as_tensor(states[0], dtype=torch.float32) @ tower.embed[:256].T, 0).double().numpy()
    pair = full0[[ord("a"), ord("b")]]
    check("choose over a subset == renormalized full softmax", np.abs(probabilities[0] - pair / pair.sum()).max() < 1e-6)

    # The image front end: F.interpolate(antialias=True) is the formula of include/uform.h, shrinking
    # and growing, odd sizes, crops on either axis; patches are flattened channel, row, column.
    rng = np.random.default_rng(3)
    for height, width in [(1, 1), (3, 2), (7, 300), (300, 7), (45, 100), (97, 61), (480, 640), (32, 32)]:
        image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        size = 32
        out_height, out_width = resized_size(height, width, size)
        top, left = (out_height - size) // 2, (out_width - size) // 2
        rows, columns = resize_weights(height, out_height, top, size), resize_weights(width, out_width, left, size)
        expected = np.einsum("yh,hwc,xw->yxc", rows, image.astype(np.float64), columns)
        x = torch.from_numpy(image).permute(2, 0, 1)[None].double()
        got = F.interpolate(x, size=(out_height, out_width), mode="bilinear", align_corners=False, antialias=True)
        got = got[0, :, top : top + size, left : left + size].permute(1, 2, 0).numpy()
        error = np.abs(got - expected).max()
        check(f"resize {height}x{width} -> short side {size}, centre crop: F.interpolate == the formula", error < 1e-9,
              f"max abs {error:.2e} (of 255)")
    tower = random_image_tower()
    grid = torch.arange(3 * 32 * 32, dtype=torch.float32).reshape(1, 3, 32, 32)
    rows = tower.patchify(grid)[0]
    c, py, px, dy, dx = 2, 1, 3, 5, 6
    check("patch (py, px) is row py * side + px, index c p^2 + dy p + dx",
          rows[py * 4 + px, c * 64 + dy * 8 + dx].item() == grid[0, c, py * 8 + dy, px * 8 + dx].item())
    images = [rng.integers(0, 256, size=shape, dtype=np.uint8) for shape in [(1, 1, 3), (40, 30, 3), (32, 32, 3), (9, 70, 3)]]
    together = tower.encode(images)
    alone = [tower.encode([image]) for image in images]
    error = max(np.abs(together.embeddings[i] - a.embeddings[0]).max() for i, a in enumerate(alone))
    check("image batch == one at a time", error < 1e-5, f"max abs {error:.2e}")
    wide = random_image_tower(dtype=torch.float64).encode(images)
    cosine = _cosines(together.embeddings, wide.embeddings).min()
    check("image float32 vs float64", cosine > 1 - 1e-9, f"min cosine {cosine:.12f}")
    check("image token vectors are unit rows",
          np.abs(np.linalg.norm(together.stacked_token_vectors(), axis=1) - 1).max() < 1e-6)
    flipped = tower.encode([np.ascontiguousarray(images[1][:, ::-1])])
    check("bidirectional: a mirrored image changes the embedding",
          np.abs(flipped.embeddings[0] - together.embeddings[1]).max() > 1e-4)

    # Output kinds.
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 65504.0, 1e-40, 3.0e38], dtype=np.float32)
    expected = np.array([1.0, 1.0, 1 + 2**-6, -1.0, 65536.0], dtype=np.float32)
    got = to_bf16(values)
    check("bf16 round to nearest even", np.array_equal(got[:5], expected[:5]) and abs(got[5]) < 1e-39 and got[6] > 2.99e38,
          f"{got.tolist()}")
    check("bf16 keeps NaN", bool(np.isnan(to_bf16(np.array([np.nan], np.float32)))[0]))
    halfway = np.float32(1 + 2**-11)  # halfway between 1 and the next F16
    check("f16 round to nearest even", to_f16(np.array([halfway]))[0] == np.float16(1.0)
          and to_f16(np.array([np.float32(1 + 3 * 2**-11)]))[0] == np.float16(1 + 2**-9))
    row = np.array([[127.0, 0.5, -0.5, 1.5, -2.5, 0.49, 0.0]], dtype=np.float32)  # scale 1: exact halves
    q, scales = quantize_i8_rows(row)
    check("i8 per row, half away from zero", scales[0] == 1.0 and q.tolist() == [[127, 1, -1, 2, -3, 0, 0]], f"{q.tolist()}")
    q, scales = quantize_i8_rows(np.zeros((1, 4), np.float32))
    check("i8 of a zero row", scales[0] == 0 and not q.any())
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    q, scales = quantize_i8_rows(x)
    error = np.abs(dequantize_i8_rows(q, scales) - x).max(axis=1) / scales
    check("i8 round trip within half a step", (error <= 0.5 + 1e-5).all() and (np.abs(q).max(axis=1) == 127).all())
    return report.failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("texts", nargs="*")
    parser.add_argument("--float64", action="store_true", help="compute in float64")
    parser.add_argument("--self-check", action="store_true")
    parser.add_argument("--image", action="append", default=[], help="an image file to encode (repeatable)")
    args = parser.parse_args(argv)
    if args.self_check:
        failures = self_check()
        print("self-check:", "FAILED" if failures else "passed")
        return 1 if failures else 0
    if not args.checkpoint:
        parser.error("a checkpoint, or --self-check")
    model = Reference(args.checkpoint, torch.float64 if args.float64 else torch.float32)
    if args.image:
        if model.image is None:
            print("no image tower")
            return 1
        encoding = model.image.encode([pillow_rgb(path) for path in args.image])
        np.set_printoptions(precision=5, suppress=True, linewidth=140)
        for path, embedding in zip(args.image, encoding.embeddings):
            print(path, embedding[:8], "...")
        return 0
    if model.text is None:
        print("no text tower")
        return 1
    texts = [t.encode() for t in (args.texts or ["hello world"])]
    encoding = model.text.encode(texts)
    np.set_printoptions(precision=5, suppress=True, linewidth=140)
    for text, embedding in zip(args.texts or ["hello world"], encoding.embeddings):
        print(repr(text), embedding[:8], "...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
