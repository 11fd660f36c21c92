"""An independent PyTorch autograd reference of UForm training (docs/DESIGN.md, "Training"), against which the
C trainer's gradients, losses and AdamW steps are checked (tests/reference/test_train_reference.py).

It reuses the towers of uform_reference.py and audio_reference.py unchanged (the same forward passes
the inference tests hold the engine to), makes every checkpoint tensor a float64 leaf (BF16 widened
exactly), and lets autograd differentiate the loss:

  - items: `text` (bytes truncated to `context`, [BOS, bytes...], causal, rotary; the state is the
    final-normed state at the last position, BOS's for an empty text), `image` (Pillow's decode, the
    reference's resize / crop / normalization, class token), `audio` (a PCM16 WAV at the model's rate,
    no resampling; log-mel front end, class token) and `video` (the model's `frames` frames sampled by
    docs/DESIGN.md's rule, through the image tower; clip embedding = L2-normalize(mean of the frames'
    L2-normalized embeddings)). Embedding = L2-normalize(proj(state)).
    Video: this reference has no general decoder; it reads uncompressed AVI (24-bit BI_RGB frames,
    what test_video_reference.avi_rgb writes and FFmpeg decodes to the exact pixels) and refuses any
    other container with a clear error.
  - contrastive: t = exp(logit.scale), b = logit.bias; for each matryoshka width k (the checkpoint's
    list as given, [dims] when it is empty), x_i = renormalized first k values of item i's embedding;
    L_k = sum over ordered pairs i != j of -log sigmoid(z_ij (t <x_i, x_j> + b)) / B, z_ij = +1 when
    (i, j) or (j, i) is in `relations`, else -1; contrastive = sum_k L_k (0 when B < 2).
  - lm: per text of L kept bytes, logits at positions p = 0 .. L-1 are state_p . text.embed[0:256]^T
    (final-normed states; rows 0..255, never the BOS row) and predict kept byte p; the last kept byte
    predicts nothing (nor does a truncated text predict its first dropped byte). lm = mean
    cross-entropy over all predicted positions of the batch (0 when there are none).
  - loss = contrastive + lm_weight * lm.
  - steps s = 1 .. `steps` on the same batch: forward and backward at the current weights; lr_s =
    learning_rate * s / warmup_steps while s <= warmup_steps, else learning_rate * 0.5 * (1 + cos(pi
    * min(1, (s - warmup_steps) / max(1, total_steps - warmup_steps)))); global L2 clipping (when
    clip_norm > 0 and norm > clip_norm, g *= clip_norm / norm); AdamW as torch.optim.AdamW (p *= 1 -
    lr wd first, then bias-corrected moments, eps added to sqrt(v_hat)), decay only on rank-2 tensors
    named `*.weight`. Every tensor is stepped every step, a zero gradient included (the weights of a
    tower the batch does not use still decay; torch.optim.AdamW would skip a tensor whose .grad is
    None). The optimizer is written here and checked against torch.optim.AdamW.

Output: a safetensors file (written by the small writer below; F64 by default) with `grad.<name>` for
every checkpoint tensor (the unclipped gradient of the loss at the initial weights) and, when steps >
0, `param.<name>` after the last step; `__metadata__` holds JSON lists, one entry per step (one entry,
the initial weights, when steps is 0), of `loss`, `contrastive`, `lm`, and also `lr` and `grad_norm`
(the unclipped global norm) for diagnosis.

    /usr/bin/python3 tests/reference/train_reference.py BATCH.json OUT.safetensors [--dtype float32]
    /usr/bin/python3 tests/reference/train_reference.py --self-check

`--dtype float32` computes everything (weights, gradients, moments) in float32: an emulation of an F32
engine, used by test_train_reference.py --self-test to show its tolerances hold for F32 arithmetic.

The batch JSON:
    {"checkpoint": "model.safetensors",
     "items": [{"modality": "text", "text": "..."}, {"modality": "image", "path": "x.png"},
               {"modality": "audio", "path": "x.wav"}, {"modality": "video", "path": "x.avi"}],
     "relations": [[0, 1]], "lm_weight": 0.5, "steps": 2,
     "optimizer": {"learning_rate": 1e-3, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999,
                   "epsilon": 1e-8, "warmup_steps": 2, "total_steps": 10, "clip_norm": 1.0}}
Paths are relative to the JSON file's folder. `checkpoint`, `items`, `relations`, `lm_weight` and
`steps` are required; `optimizer` (all eight keys) when steps > 0. A relation names two different
items in range; an item of a tower the checkpoint lacks, an audio clip at another rate or shorter than
one patch, or an unreadable file is an error (exit status 2, the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interpreter import optional_import, run_under_python_with  # noqa: E402  (standard library only)

if __name__ == "__main__":
    run_under_python_with(["torch", "numpy", "PIL"])

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import audio_reference as audio_ref  # noqa: E402
import uform_reference as ref  # noqa: E402

OPTIMIZER_KEYS = ("learning_rate", "weight_decay", "beta1", "beta2", "epsilon", "warmup_steps", "total_steps",
                  "clip_norm")
MODALITIES = ("text", "image", "audio", "video")


class BatchError(ValueError):
    """A batch or checkpoint this reference refuses; the message says why."""


# ------------------------------------------------------------------------------------------------
# The batch
# ------------------------------------------------------------------------------------------------


@dataclass
class OptimizerConfig:
    learning_rate: float
    weight_decay: float
    beta1: float
    beta2: float
    epsilon: float
    warmup_steps: int
    total_steps: int
    clip_norm: float

    @staticmethod
    def from_json(value: dict) -> "OptimizerConfig":
        if not isinstance(value, dict):
            raise BatchError("`optimizer` is not an object")
        missing = [k for k in OPTIMIZER_KEYS if k not in value]
        if missing:
            raise BatchError(f"`optimizer` lacks {', '.join(missing)}")
        config = OptimizerConfig(*(float(value[k]) for k in OPTIMIZER_KEYS[:5]), int(value["warmup_steps"]),
                                 int(value["total_steps"]), float(value["clip_norm"]))
        if config.warmup_steps < 0 or config.total_steps < 0 or config.clip_norm < 0:
            raise BatchError(f"negative warmup_steps, total_steps or clip_norm in {value}")
        return config


@dataclass
class Batch:
    checkpoint: Path
    items: list  # dicts: modality, and text (bytes) or path (Path)
    relations: list  # (i, j) pairs
    lm_weight: float
    steps: int
    optimizer: OptimizerConfig | None


def load_batch(path) -> Batch:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BatchError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise BatchError(f"{path}: not a JSON object")
    missing = [k for k in ("checkpoint", "items", "relations", "lm_weight", "steps") if k not in data]
    if missing:
        raise BatchError(f"{path}: lacks {', '.join(missing)}")
    folder = path.resolve().parent
    items = []
    for index, item in enumerate(data["items"]):
        modality = item.get("modality") if isinstance(item, dict) else None
        if modality not in MODALITIES:
            raise BatchError(f"item {index}: modality {modality!r}, expected one of {MODALITIES}")
        if modality == "text":
            if not isinstance(item.get("text"), str):
                raise BatchError(f"item {index}: a text item needs a string `text`")
            items.append({"modality": "text", "text": item["text"].encode("utf-8")})
        else:
            if not isinstance(item.get("path"), str):
                raise BatchError(f"item {index}: a {modality} item needs a string `path`")
            items.append({"modality": modality, "path": folder / item["path"]})
    relations = []
    for pair in data["relations"]:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, int) for v in pair)):
            raise BatchError(f"relation {pair!r} is not a pair of item indices")
        i, j = pair
        if not (0 <= i < len(items) and 0 <= j < len(items)) or i == j:
            raise BatchError(f"relation {pair!r}: indices must be two different items of {len(items)}")
        relations.append((i, j))
    steps = int(data["steps"])
    if steps < 0:
        raise BatchError("`steps` is negative")
    optimizer = None
    if steps > 0:
        if "optimizer" not in data:
            raise BatchError("`steps` > 0 needs `optimizer`")
        optimizer = OptimizerConfig.from_json(data["optimizer"])
    return Batch(folder / data["checkpoint"], items, relations, float(data["lm_weight"]), steps, optimizer)


# ------------------------------------------------------------------------------------------------
# Uncompressed AVI (24-bit BI_RGB), the only video this reference decodes
# ------------------------------------------------------------------------------------------------


def _riff_chunks(blob: bytes, begin: int, end: int):
    """(fourcc, data begin, data end) of the chunks in blob[begin:end]; LIST chunks answer their kind
    as fourcc 'LIST:kind' and their body (after the kind)."""
    at = begin
    while at + 8 <= end:
        fourcc = blob[at : at + 4]
        (size,) = struct.unpack_from("<I", blob, at + 4)
        body = at + 8
        if body + size > end:
            raise BatchError(f"AVI chunk {fourcc!r} at {at} runs past its parent")
        if fourcc in (b"LIST", b"RIFF"):
            yield fourcc + b":" + blob[body : body + 4], body + 4, body + size
        else:
            yield fourcc, body, body + size
        at = body + size + (size & 1)


def read_avi_rgb(blob: bytes) -> tuple[list, list, float]:
    """Frames (uint8 [height, width, 3] RGB), their presentation times and the clip's end time of an
    uncompressed AVI of 24-bit BI_RGB frames (rows bottom-up unless the height is negative, BGR, rows
    padded to 4 bytes). Frame i is shown at i * scale / rate and the clip ends at frames * scale / rate
    (the video stream's strh). Raises BatchError on anything else."""
    if len(blob) < 12 or blob[:4] != b"RIFF" or blob[8:12] != b"AVI ":
        raise BatchError("not an AVI file: this reference decodes only uncompressed AVI (24-bit BI_RGB); "
                         "write the clip as test_video_reference.avi_rgb does")
    state = {"streams": 0, "kind": None, "video": None, "scale": None, "rate": None, "width": None, "height": None}
    chunks = []  # (stream number, data) of every movi chunk

    def walk(begin, end):
        for fourcc, body, stop in _riff_chunks(blob, begin, end):
            if fourcc.startswith(b"LIST:"):
                if fourcc[5:] in (b"hdrl", b"strl", b"movi", b"rec "):
                    walk(body, stop)
            elif fourcc == b"strh":
                state["kind"] = blob[body : body + 4]
                if state["kind"] == b"vids" and state["video"] is None:
                    state["video"] = state["streams"]
                    state["scale"], state["rate"] = struct.unpack_from("<II", blob, body + 20)
                state["streams"] += 1
            elif fourcc == b"strf" and state["kind"] == b"vids" and state["width"] is None:
                _, width, height, _, bits, compression = struct.unpack_from("<IiiHHI", blob, body)
                if bits != 24 or compression != 0:
                    raise BatchError(f"AVI frames of {bits} bits, compression {compression}: only 24-bit BI_RGB "
                                     "is decoded by this reference")
                state["width"], state["height"] = width, height
            elif fourcc[2:] in (b"db", b"dc") and fourcc[:2].isdigit():
                chunks.append((int(fourcc[:2]), blob[body:stop]))

    _, body, stop = next(_riff_chunks(blob, 0, len(blob)))
    walk(body, stop)
    scale, rate, width, height = state["scale"], state["rate"], state["width"], state["height"]
    if state["video"] is None or width is None or not rate:
        raise BatchError("AVI without a video stream header (strh 'vids' and strf)")
    frames_data = [data for stream, data in chunks if stream == state["video"]]
    if not frames_data:
        raise BatchError("AVI without frames")
    rows, bottom_up = abs(height), height > 0
    stride = (width * 3 + 3) & ~3
    frames = []
    for data in frames_data:
        if len(data) < stride * rows:
            raise BatchError(f"AVI frame of {len(data)} bytes, expected {stride * rows}")
        image = np.frombuffer(data[: stride * rows], np.uint8).reshape(rows, stride)[:, : width * 3]
        image = image.reshape(rows, width, 3)[:, :, ::-1]  # BGR -> RGB
        frames.append(np.ascontiguousarray(image[::-1] if bottom_up else image))
    times = [i * scale / rate for i in range(len(frames))]
    return frames, times, len(frames) * scale / rate


def avi_rgb(frames: list, rate: int) -> bytes:
    """An AVI of 24-bit BI_RGB frames at `rate` frames per second (test_video_reference.avi_rgb's layout)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_video_reference  # noqa: E402  (importing it runs nothing)

    return test_video_reference.avi_rgb(frames, rate)


# ------------------------------------------------------------------------------------------------
# The model: every checkpoint tensor a leaf
# ------------------------------------------------------------------------------------------------


class TrainModel:
    """The towers of a format-4 checkpoint with every tensor a trainable leaf in `dtype`.
    `parameters` maps each checkpoint name to its leaf, in the checkpoint's order."""

    def __init__(self, path, dtype: torch.dtype = torch.float64):
        try:
            tensors, metadata = ref.read_safetensors(str(path))
        except (OSError, ValueError) as error:
            raise BatchError(f"checkpoint {path}: {error}") from None
        if "uform" not in metadata:
            raise BatchError(f"{path}: no __metadata__['uform']")
        self.config = config = json.loads(metadata["uform"])
        if config.get("format") != 4:
            raise BatchError(f"{path}: format {config.get('format')!r}, expected 4")
        self.dtype = dtype
        self.dims = int(config["dims"])
        self.matryoshka = [int(k) for k in config.get("matryoshka", [])] or [self.dims]
        self.towers = {}
        if "text" in config:
            text = config["text"]
            self.towers["text"] = ref.TextTower(ref.TransformerConfig.from_json(text), self.dims, int(text["context"]))
        if "image" in config:
            image = config["image"]
            self.towers["image"] = ref.ImageTower(ref.TransformerConfig.from_json(image), self.dims, int(image["size"]),
                                                  int(image["patch"]), [float(v) for v in image["mean"]],
                                                  [float(v) for v in image["std"]])
        if "audio" in config:
            audio = config["audio"]
            self.towers["audio"] = audio_ref.AudioTower(
                ref.TransformerConfig.from_json(audio), self.dims, int(audio["rate"]), int(audio["mels"]),
                int(audio["window"]), int(audio["hop"]), int(audio["patch_frames"]), float(audio["seconds"]),
                int(audio["max_patches"]))
        self.frames = int(config["video"]["frames"]) if "video" in config and "image" in config else 0
        claimed = {}
        for name, tower in self.towers.items():
            try:
                tower.load(tensors, f"{name}.", dtype)
            except KeyError as error:
                raise BatchError(f"{path}: missing tensor {error}") from None
            except ValueError as error:
                raise BatchError(f"{path}: {error}") from None
            tower.eval()
            for local, parameter in tower.named_parameters():
                parameter.requires_grad_(True)
                claimed[f"{name}.{local}"] = parameter
        for name in ("logit.scale", "logit.bias"):
            if name not in tensors:
                raise BatchError(f"{path}: training needs {name}")
            if tuple(tensors[name].shape) != (1,):
                raise BatchError(f"{path}: {name} has shape {tensors[name].shape}, expected [1]")
            claimed[name] = torch.nn.Parameter(torch.from_numpy(np.array(tensors[name])).to(dtype))
        unknown = [name for name in tensors if name not in claimed]
        if unknown:
            raise BatchError(f"{path}: tensors no tower declares: {', '.join(unknown[:5])}")
        self.parameters = {name: claimed[name] for name in tensors}  # the checkpoint's order
        self.logit_scale, self.logit_bias = claimed["logit.scale"], claimed["logit.bias"]

    # -- inputs, decoded once -------------------------------------------------------------------

    def prepare(self, items: list) -> list:
        """Each item's model input: ("text", ids), ("image", pixels [3, size, size]), ("audio", patch
        rows [patches, patch_frames mels]) or ("video", pixels [frames, 3, size, size])."""
        prepared = []
        for index, item in enumerate(items):
            modality = item["modality"]
            tower = self.towers.get("image" if modality == "video" else modality)
            if tower is None or (modality == "video" and not self.frames):
                raise BatchError(f"item {index}: the checkpoint has no {modality} tower")
            try:
                prepared.append(self._prepare(modality, item, tower))
            except (OSError, ValueError) as error:
                raise BatchError(f"item {index} ({modality}): {error}") from None
        return prepared

    def _prepare(self, modality, item, tower):
        if modality == "text":
            ids, _ = tower.token_ids(item["text"])
            return ("text", torch.tensor(ids, dtype=torch.long))
        if modality == "image":
            return ("image", tower.preprocess(ref.pillow_rgb(str(item["path"]))))
        if modality == "audio":
            samples, rate = audio_ref.wav_samples(Path(item["path"]).read_bytes())
            if rate != tower.rate:
                raise BatchError(f"{item['path']} is at {rate} Hz; the model reads {tower.rate} Hz (no resampling here)")
            rows, _ = tower.patch_rows(samples)
            if rows.shape[0] == 0:
                raise BatchError(f"{item['path']}: {len(samples)} samples, shorter than one patch")
            return ("audio", torch.as_tensor(rows, dtype=self.dtype))
        frames, times, end = read_avi_rgb(Path(item["path"]).read_bytes())
        picks = ref.video_samples(times, end, self.frames)
        return ("video", torch.stack([tower.preprocess(frames[i]) for i in picks]))

    # -- the loss -------------------------------------------------------------------------------

    def embed_images(self, prepared: list, embeddings: list) -> None:
        """The embeddings of the items of kind "image" into `embeddings` (a list as long as `prepared`), the
        images through the image tower as one batch."""
        images = [i for i, (kind, _) in enumerate(prepared) if kind == "image"]
        if images:
            tower = self.towers["image"]
            states = tower.forward(torch.stack([prepared[i][1] for i in images]))  # [n, 1 + patches, hidden]
            for row, i in enumerate(images):
                embeddings[i] = tower.embed_states(states[row, 0])

    def embed(self, prepared: list):
        """Answers (embeddings [B, dims], LM cross-entropy summed over every predicted position, the
        count of those positions)."""
        embeddings = [None] * len(prepared)
        lm_sum = torch.zeros((), dtype=self.dtype)
        lm_count = 0
        self.embed_images(prepared, embeddings)
        for i, (kind, data) in enumerate(prepared):
            if kind == "text":
                tower = self.towers["text"]
                states = tower.forward(data[None])[0]  # [1 + kept, hidden], final-normed
                embeddings[i] = tower.embed_states(states[-1])
                kept = data.shape[0] - 1
                if kept:
                    logits = states[:kept] @ tower.embed[:ref.BOS].T  # [kept, 256]
                    lm_sum = lm_sum + F.cross_entropy(logits, data[1:], reduction="sum")
                    lm_count += kept
            elif kind == "audio":
                tower = self.towers["audio"]
                embeddings[i] = tower.embed_states(tower.forward(data)[0])
            elif kind == "video":
                tower = self.towers["image"]
                frames = tower.embed_states(tower.forward(data)[:, 0])  # [frames, dims], each normalized
                embeddings[i] = ref.l2_normalize(frames.mean(dim=0))
        if not embeddings:
            return torch.zeros(0, self.dims, dtype=self.dtype), lm_sum, lm_count
        return torch.stack(embeddings), lm_sum, lm_count

    def losses(self, prepared: list, relations: list, lm_weight: float):
        """(loss, contrastive, lm) as 0-d tensors."""
        embeddings, lm_sum, lm_count = self.embed(prepared)
        contrastive = contrastive_loss(embeddings, relations, self.matryoshka, self.logit_scale, self.logit_bias)
        lm = lm_sum / lm_count if lm_count else torch.zeros((), dtype=self.dtype)
        return contrastive + lm_weight * lm, contrastive, lm

    def gradients(self, prepared, relations, lm_weight):
        """(losses as floats, {name: gradient}) at the current weights."""
        for parameter in self.parameters.values():
            parameter.grad = None
        loss, contrastive, lm = self.losses(prepared, relations, lm_weight)
        loss.backward()
        grads = {name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p.detach()))
                 for name, p in self.parameters.items()}
        return (loss.item(), contrastive.item(), lm.item()), grads


def relation_signs(count: int, relations: list, dtype=torch.float64, device=None) -> torch.Tensor:
    """z [B, B]: +1 where (i, j) or (j, i) is related, -1 elsewhere (the diagonal is never used)."""
    z = -torch.ones(count, count, dtype=dtype, device=device)
    for i, j in relations:
        z[i, j] = z[j, i] = 1.0
    return z


def contrastive_loss(embeddings, relations, widths, scale, bias) -> torch.Tensor:
    """sum over widths k of sum_{i != j} -log sigmoid(z_ij (exp(scale) <x_i, x_j> + bias)) / B, x the
    renormalized first k values of each embedding; 0 for fewer than two items."""
    count = embeddings.shape[0]
    if count < 2:
        return torch.zeros((), dtype=embeddings.dtype) + 0 * (scale.sum() + bias.sum())
    z = relation_signs(count, relations, embeddings.dtype, embeddings.device)
    pairs = ~torch.eye(count, dtype=torch.bool, device=embeddings.device)
    t = torch.exp(scale[0])
    total = torch.zeros((), dtype=embeddings.dtype)
    for width in widths:
        x = ref.l2_normalize(embeddings[:, :width])
        logits = t * (x @ x.T) + bias[0]
        total = total + (-F.logsigmoid(z * logits))[pairs].sum() / count
    return total


# ------------------------------------------------------------------------------------------------
# The optimizer
# ------------------------------------------------------------------------------------------------


def learning_rate(config: OptimizerConfig, step: int) -> float:
    """The rate of step `step` (1-based): linear warmup, then cosine to 0 at total_steps."""
    if step <= config.warmup_steps:
        return config.learning_rate * step / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, config.total_steps - config.warmup_steps))
    return config.learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))


def decays(name: str, tensor: torch.Tensor) -> bool:
    """Weight decay applies to rank-2 tensors named `*.weight` only (qkv, out, up, down, proj, patch)."""
    return tensor.dim() == 2 and name.endswith(".weight")


class AdamW:
    """torch.optim.AdamW's update, written out, with the schedule and global-norm clipping."""

    def __init__(self, parameters: dict, config: OptimizerConfig):
        self.parameters, self.config = parameters, config
        self.m = {name: torch.zeros_like(p.detach()) for name, p in parameters.items()}
        self.v = {name: torch.zeros_like(p.detach()) for name, p in parameters.items()}
        self.step_count = 0

    @torch.no_grad()
    def step(self, grads: dict) -> tuple[float, float]:
        """One step with `grads` (by name; not modified); answers (learning rate, unclipped global norm)."""
        c = self.config
        self.step_count += 1
        s = self.step_count
        lr = learning_rate(c, s)
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        factor = c.clip_norm / norm if c.clip_norm > 0 and norm > c.clip_norm else 1.0
        correction1, correction2 = 1.0 - c.beta1**s, 1.0 - c.beta2**s
        for name, p in self.parameters.items():
            g = grads[name] * factor if factor != 1.0 else grads[name]
            if decays(name, p) and c.weight_decay:
                p.mul_(1.0 - lr * c.weight_decay)
            self.m[name].mul_(c.beta1).add_(g, alpha=1.0 - c.beta1)
            self.v[name].mul_(c.beta2).add_(g * g, alpha=1.0 - c.beta2)
            m_hat = self.m[name] / correction1
            v_hat = self.v[name] / correction2
            p.sub_(lr * m_hat / (torch.sqrt(v_hat) + c.epsilon))
        return lr, norm


# ------------------------------------------------------------------------------------------------
# A run, and its file
# ------------------------------------------------------------------------------------------------


def run(batch: Batch, dtype: torch.dtype = torch.float64) -> dict:
    """Answers {"grads": {name: array}, "params": {name: array} or None, "history": {key: [per step]}}."""
    model = TrainModel(batch.checkpoint, dtype)
    prepared = model.prepare(batch.items)
    history = {"loss": [], "contrastive": [], "lm": [], "lr": [], "grad_norm": []}
    optimizer = AdamW(model.parameters, batch.optimizer) if batch.steps else None
    first = None
    for _ in range(max(1, batch.steps)):
        (loss, contrastive, lm), grads = model.gradients(prepared, batch.relations, batch.lm_weight)
        if first is None:
            first = {name: g.double().numpy() for name, g in grads.items()}
        history["loss"].append(loss)
        history["contrastive"].append(contrastive)
        history["lm"].append(lm)
        if optimizer is not None:
            lr, norm = optimizer.step(grads)
        else:
            lr, norm = 0.0, math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        history["lr"].append(lr)
        history["grad_norm"].append(norm)
    params = None
    if batch.steps:
        params = {name: p.detach().double().numpy().copy() for name, p in model.parameters.items()}
    return {"grads": first, "params": params, "history": history}


def write_safetensors(path, tensors: dict, metadata: dict, dtype: str = "F64") -> None:
    """A safetensors file of `tensors` (numpy arrays, stored as F64 or F32, in the given order) and
    `metadata` (strings); the header is padded with spaces to a multiple of 8 bytes."""
    storage = {"F64": "<f8", "F32": "<f4"}[dtype]
    header, blobs, offset = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(np.asarray(array, dtype=np.float64).astype(storage)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for data in blobs:
            f.write(data)


def write_result(path, result: dict, dtype: str = "F64") -> None:
    tensors = {f"grad.{name}": g for name, g in result["grads"].items()}
    if result["params"] is not None:
        tensors.update({f"param.{name}": p for name, p in result["params"].items()})
    metadata = {key: json.dumps(values) for key, values in result["history"].items()}
    write_safetensors(path, tensors, metadata, dtype)


# ------------------------------------------------------------------------------------------------
# Self-check: autograd vs finite differences, the optimizer vs torch.optim.AdamW
# ------------------------------------------------------------------------------------------------


def tiny_checkpoint(path, seed: int = 5, sharp: float = 4.0) -> None:
    """A small F32 format-4 checkpoint with every tower, random weights of realistic scale (q and k
    rows x `sharp`, so attention is far from uniform) and logit scale log(10), bias -2."""
    config = {"format": 4, "dims": 32, "matryoshka": [8, 16, 32],
              "text": {"depth": 1, "hidden": 64, "heads": 1, "mlp": 96, "context": 8},
              "image": {"depth": 1, "hidden": 64, "heads": 1, "mlp": 96, "size": 16, "patch": 8,
                        "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
              "video": {"frames": 2},
              "audio": {"depth": 1, "hidden": 64, "heads": 1, "mlp": 96, "rate": 8000, "mels": 8, "window": 64,
                        "hop": 32, "patch_frames": 2, "seconds": 0.1, "max_patches": 6}}
    model_config = ref.TransformerConfig(1, 64, 1, 96)
    towers = {"text": ref.TextTower(model_config, 32, 8),
              "image": ref.ImageTower(model_config, 32, 16, 8, config["image"]["mean"], config["image"]["std"]),
              "audio": audio_ref.AudioTower(model_config, 32, 8000, 8, 64, 32, 2, 0.1, 6)}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for tower_name, tower in towers.items():
        for name, parameter in tower.named_parameters():
            shape = parameter.shape
            if "norm" in name:
                value = 1.0 + 0.2 * torch.randn(shape, generator=generator)
            elif name.endswith("bias") or name in ("cls", "pos"):
                value = 0.1 * torch.randn(shape, generator=generator)
            elif name == "embed":
                value = torch.randn(shape, generator=generator)
            else:
                value = torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
                if name.endswith("attn.qkv.weight"):
                    value[: 2 * 64] *= sharp
            tensors[f"{tower_name}.{name}"] = value.numpy()
    tensors["logit.scale"] = np.array([math.log(10.0)])
    tensors["logit.bias"] = np.array([-2.0])
    write_safetensors(path, tensors, {"uform": json.dumps(config)}, "F32")


def write_self_check_batch(folder: Path, checkpoint: str, steps: int = 0, optimizer=None) -> Path:
    """Inputs for the tiny checkpoint: 3 texts (empty, short, past the context), 2 images, 1 WAV, 1 AVI."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(11)
    for index in range(2):
        image = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
        ImageDraw.Draw(image).ellipse((2 + index, 3, 12, 13 - index), fill=(200, 40 * index, 90))
        image.save(folder / f"image{index}.png")
    t = np.arange(700) / 8000
    (folder / "clip.wav").write_bytes(audio_ref.wav_bytes(0.4 * np.sin(2 * np.pi * 600 * t) + 0.05 * rng.standard_normal(t.size), 8000))
    frames = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(3)]
    (folder / "clip.avi").write_bytes(avi_rgb(frames, 5))
    batch = {"checkpoint": checkpoint,
             "items": [{"modality": "text", "text": ""}, {"modality": "text", "text": "hi"},
                       {"modality": "text", "text": "a text past the context"},
                       {"modality": "image", "path": "image0.png"}, {"modality": "image", "path": "image1.png"},
                       {"modality": "audio", "path": "clip.wav"}, {"modality": "video", "path": "clip.avi"}],
             "relations": [[1, 3], [2, 5], [4, 6], [0, 2]], "lm_weight": 0.5, "steps": steps}
    if optimizer is not None:
        batch["optimizer"] = optimizer
    path = folder / f"batch-{steps}.json"
    path.write_text(json.dumps(batch, indent=1))
    return path


def self_check(verbose: bool = True) -> list:
    report = ref.Report(verbose)
    check = report.check
    with tempfile.TemporaryDirectory(prefix="uform-train-reference-") as tmp:
        folder = Path(tmp)
        tiny_checkpoint(folder / "tiny.safetensors")
        batch = load_batch(write_self_check_batch(folder, "tiny.safetensors"))
        model = TrainModel(batch.checkpoint, torch.float64)
        prepared = model.prepare(batch.items)

        # The training forward is the inference reference's: embeddings equal each tower's encode().
        with torch.no_grad():
            embeddings, lm_sum, lm_count = model.embed(prepared)
            text = model.towers["text"].encode([item["text"] for item in batch.items[:3]])
            image = model.towers["image"].encode([ref.pillow_rgb(str(item["path"])) for item in batch.items[3:5]])
            samples, _ = audio_ref.wav_samples(batch.items[5]["path"].read_bytes())
            audio = model.towers["audio"].encode([samples])
            frames, times, end = read_avi_rgb(batch.items[6]["path"].read_bytes())
            picks = ref.video_samples(times, end, model.frames)
            video = ref.pool_video(model.towers["image"].encode([frames[i] for i in picks]), model.frames)
        expected = np.concatenate([text.embeddings, image.embeddings, audio.embeddings, video.embeddings])
        error = np.abs(embeddings.numpy() - expected).max()
        check("training forward == the towers' encode() (text, image, audio, video)", error < 1e-12, f"max abs {error:.1e}")
        check("video picks 2 of 3 frames by the (k + 0.5) / F rule", picks == [0, 2], f"{picks}")
        check("AVI reader: frames, times", len(frames) == 3 and times == [0.0, 0.2, 0.4] and abs(end - 0.6) < 1e-12)
        check("texts truncated to context; LM positions = kept bytes", lm_count == 0 + 2 + 8, f"{lm_count}")
        try:
            read_avi_rgb(b"\x00\x00\x00\x18ftypisom" + bytes(32))
            check("an MP4 is refused with a clear error", False)
        except BatchError as error:
            check("an MP4 is refused with a clear error", "uncompressed AVI" in str(error))

        # The loss against loops written out in Python floats.
        with torch.no_grad():
            loss, contrastive, lm = model.losses(prepared, batch.relations, batch.lm_weight)
        e = embeddings.numpy()
        t, b = math.exp(model.logit_scale.item()), model.logit_bias.item()
        related = {(i, j) for i, j in batch.relations} | {(j, i) for i, j in batch.relations}
        total = 0.0
        for k in model.matryoshka:
            x = e[:, :k] / np.linalg.norm(e[:, :k], axis=1, keepdims=True)
            for i in range(len(e)):
                for j in range(len(e)):
                    if i != j:
                        z = 1.0 if (i, j) in related else -1.0
                        total += math.log1p(math.exp(-z * (t * float(x[i] @ x[j]) + b))) / len(e)
        check("contrastive == loops over ordered pairs and widths", abs(total - contrastive.item()) < 1e-12 * max(1, total),
              f"{contrastive.item():.15f} vs {total:.15f}")
        embed = model.towers["text"].embed.detach().numpy()
        nll, count = 0.0, 0
        for kind, ids in prepared[:3]:
            states = model.towers["text"].forward(ids[None])[0].detach().numpy()
            for p in range(ids.shape[0] - 1):
                logits = embed[:256] @ states[p]
                top = logits.max()
                nll += top + math.log(np.exp(logits - top).sum()) - logits[int(ids[p + 1])]
                count += 1
        check("lm == mean next-byte cross-entropy written out (BOS predicts byte 0)",
              abs(nll / count - lm.item()) < 1e-12 * max(1, lm.item()), f"{lm.item():.15f} vs {nll / count:.15f}")
        check("loss == contrastive + lm_weight lm", abs(loss.item() - contrastive.item() - 0.5 * lm.item()) < 1e-12)
        one = contrastive_loss(embeddings[:1], [], model.matryoshka, model.logit_scale, model.logit_bias)
        check("contrastive of one item is 0", one.item() == 0.0)

        # Autograd against central differences: single elements of every kind, and one random direction
        # over every parameter at once.
        (_, _, _), grads = model.gradients(prepared, batch.relations, batch.lm_weight)

        def loss_at() -> float:
            with torch.no_grad():
                return model.losses(prepared, batch.relations, batch.lm_weight)[0].item()

        h = 1e-5
        probes = [("text.embed", (ref.BOS, 3)), ("text.embed", (ord("h"), 5)), ("text.embed", (ord("z"), 0)),
                  ("text.blocks.0.attn.qkv.weight", (2, 7)), ("text.blocks.0.attn.qkv.weight", (70, 1)),
                  ("text.blocks.0.attn.qkv.bias", (130,)), ("text.blocks.0.attn.out.weight", (5, 9)),
                  ("text.blocks.0.mlp.up.weight", (3, 4)), ("text.blocks.0.mlp.down.bias", (6,)),
                  ("text.blocks.0.norm1.weight", (11,)), ("text.norm.weight", (1,)), ("text.proj.weight", (0, 0)),
                  ("image.patch.weight", (4, 100)), ("image.patch.bias", (2,)), ("image.cls", (7,)),
                  ("image.pos", (3, 8)), ("image.blocks.0.attn.qkv.weight", (65, 2)), ("image.proj.weight", (31, 63)),
                  ("audio.patch.weight", (1, 15)), ("audio.cls", (0,)), ("audio.pos", (2, 9)),
                  ("audio.blocks.0.mlp.up.weight", (50, 20)), ("audio.norm.weight", (12,)),
                  ("logit.scale", (0,)), ("logit.bias", (0,))]
        scale = max(float(g.abs().max()) for g in grads.values())
        worst = (0.0, "")
        for name, index in probes:
            p = model.parameters[name]
            with torch.no_grad():
                original = p[index].item()
                p[index] = original + h
                up = loss_at()
                p[index] = original - h
                down = loss_at()
                p[index] = original
            numeric, analytic = (up - down) / (2 * h), grads[name][index].item()
            error = abs(numeric - analytic) / max(abs(analytic), 1e-3 * scale)
            worst = max(worst, (error, f"{name}{list(index)}: autograd {analytic:.10e}, differences {numeric:.10e}"))
        check(f"autograd == central differences at {len(probes)} single elements", worst[0] < 1e-6,
              f"worst relative {worst[0]:.1e} ({worst[1]})")
        generator = torch.Generator().manual_seed(3)
        direction = {name: torch.randn(p.shape, generator=generator, dtype=torch.float64) for name, p in model.parameters.items()}
        originals = {name: p.detach().clone() for name, p in model.parameters.items()}

        def shifted(step: float) -> float:
            with torch.no_grad():
                for name, p in model.parameters.items():
                    p.copy_(originals[name] + step * direction[name])
            return loss_at()

        h = 1e-6
        numeric = (shifted(h) - shifted(-h)) / (2 * h)
        shifted(0.0)
        analytic = sum(float((grads[name] * direction[name]).sum()) for name in grads)
        error = abs(numeric - analytic) / abs(analytic)
        check("autograd == central differences along a random direction over every tensor", error < 1e-6,
              f"{analytic:.10e} vs {numeric:.10e}, relative {error:.1e}")
        check("every tensor gets a nonzero gradient from the mixed batch",
              all(float(g.abs().max()) > 0 for g in grads.values()),
              ", ".join(name for name, g in grads.items() if float(g.abs().max()) == 0))

        # A run end to end, written and read back.
        optimizer = {"learning_rate": 1e-2, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8,
                     "warmup_steps": 1, "total_steps": 3, "clip_norm": 0.5}
        stepped = load_batch(write_self_check_batch(folder, "tiny.safetensors", steps=3, optimizer=optimizer))
        result = run(stepped)
        write_result(folder / "out.safetensors", result)
        back, metadata = ref.read_safetensors(str(folder / "out.safetensors"))
        check("output holds grad.* and param.* of every tensor and the per-step history",
              len(back) == 2 * len(model.parameters) and len(json.loads(metadata["loss"])) == 3
              and all(np.array_equal(back[f"grad.{n}"], g) for n, g in result["grads"].items()))
        check("step 1's gradient == the gradient at the initial weights",
              all(np.array_equal(result["grads"][n], g.numpy()) for n, g in grads.items()))
        history = result["history"]
        check("the loss falls over 3 steps on the same batch", history["loss"][2] < history["loss"][0],
              f"{history['loss']}")
        check("the schedule: warmup 1, cosine to 0 at step 3",
              np.allclose(history["lr"], [1e-2, 1e-2 * 0.5 * (1 + math.cos(math.pi * 0.5)), 0.0]), f"{history['lr']}")
        safetensors_numpy = optional_import("safetensors.numpy", "the writer is checked by this reader only")
        if safetensors_numpy:
            loaded = safetensors_numpy.load_file(str(folder / "out.safetensors"))
            check("the safetensors package reads the output", all(np.array_equal(loaded[k], back[k]) for k in back))

    # The optimizer against torch.optim.AdamW: the same schedule fed as lr per step, clipping applied
    # to the gradients first, decay only on rank-2 `.weight` tensors.
    for clip in (0.0, 0.3):
        config = OptimizerConfig(3e-2, 0.05, 0.8, 0.95, 1e-6, 2, 6, clip)
        generator = torch.Generator().manual_seed(4)
        shapes = {"a.weight": (4, 3), "a.bias": (4,), "embed": (5, 3), "norm.weight": (3,), "b.weight": (2, 4)}
        start = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
        mine = {n: v.clone() for n, v in start.items()}
        theirs = {n: torch.nn.Parameter(v.clone()) for n, v in start.items()}
        ours = AdamW(mine, config)
        groups = [{"params": [theirs[n] for n in shapes if decays(n, start[n])], "weight_decay": config.weight_decay},
                  {"params": [theirs[n] for n in shapes if not decays(n, start[n])], "weight_decay": 0.0}]
        torch_adamw = torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.beta1, config.beta2),
                                        eps=config.epsilon)
        for s in range(1, 8):
            grads = {n: torch.randn(shapes[n], generator=generator, dtype=torch.float64) * (0.5 if s % 2 else 2.0)
                     for n in shapes}
            grads["a.bias"][0] = 0.0  # a zero gradient element
            lr, norm = ours.step(grads)
            factor = min(1.0, clip / norm) if clip else 1.0
            for group in torch_adamw.param_groups:
                group["lr"] = lr
            for n in shapes:
                theirs[n].grad = grads[n] * factor
            torch_adamw.step()
        error = max(float((mine[n] - theirs[n].detach()).abs().max()) for n in shapes)
        check(f"AdamW == torch.optim.AdamW over 7 steps (warmup, cosine past total, clip {clip})", error < 1e-14,
              f"max abs {error:.1e}")
    check("schedule at warmup 0, total 0 (cosine already at its end)",
          learning_rate(OptimizerConfig(1.0, 0, 0.9, 0.999, 1e-8, 0, 0, 0), 1) == 0.0)
    return report.failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("batch", nargs="?", help="the batch JSON")
    parser.add_argument("output", nargs="?", help="the safetensors file to write")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="compute dtype (float32 emulates an F32 engine); output tensors are F64 either way")
    parser.add_argument("--self-check", action="store_true")
    args = parser.parse_args(argv)
    if args.self_check:
        failures = self_check()
        print("self-check:", "FAILED" if failures else "passed")
        return 1 if failures else 0
    if not args.batch or not args.output:
        parser.error("BATCH.json OUT.safetensors, or --self-check")
    torch.set_num_threads(max(1, min(8, torch.get_num_threads())))
    try:
        result = run(load_batch(args.batch), torch.float64 if args.dtype == "float64" else torch.float32)
    except BatchError as error:
        print(f"train_reference: {error}", file=sys.stderr)
        return 2
    write_result(args.output, result)
    history = result["history"]
    print(f"loss {history['loss']}, contrastive {history['contrastive']}, lm {history['lm']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
