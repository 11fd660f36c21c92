#!/usr/bin/env python3
"""The C trainer's gradients, losses and AdamW steps against the independent PyTorch autograd reference
(train_reference.py).

    test_train_reference.py --engine-tool build/tools/uform_train_batch \
        --checkpoint-tool build/tools/uform_tiny_checkpoint [--workdir build/reference-train]
    test_train_reference.py --self-test --checkpoint-tool build/tools/uform_tiny_checkpoint

Writes two seeded checkpoints with the tiny checkpoint tool (its default, and depth 2 hidden 128 with
the q and k rows of every tower x4, exact in BF16, so attention is far from uniform), and for each two
batches (train_reference.py's docstring has the JSON):

  - "mixed": 3 texts (empty, short, longer than `context` and cut inside a 4-byte UTF-8 character), 2
    PNG images of the image tower's size drawn with Pillow, 2 WAV clips at the audio rate (a tone, and
    a glide longer than `seconds`), 1 uncompressed AVI clip of 6 size x size frames; relations across
    modalities; lm_weight 0.5; 3 steps of warmup 2, total 10, clip_norm 1.0 (active: the norm is
    ~200), weight decay 0.01 (below the parameter tolerance: see "text-image"), epsilon 1e-3;
  - "text-image": the texts and images only (audio tower gradients exactly 0), lm_weight 1, 2 steps
    without warmup or clipping (the cosine branch), weight decay 0.1 (large enough that a wrong decay
    mask fails), epsilon 1e-2;

runs the reference (`train_reference.py BATCH OUT`) and the engine's tool (`ENGINE_TOOL BATCH OUT`,
the same output format), and compares every tensor and the per-step history, printing the worst.

Tolerances (the engine computes in F32, the reference in F64):
  - grad.<name>: max |engine - reference| / max |reference| <= 2e-3 and cosine >= 0.9999 over the
    flattened tensor. F32 rounding through a few layers and the pairwise sum leaves ~1e-5 relative;
    2e-3 leaves room for a different summation order and long reductions, while a wrong term (a missed
    pair, BOS predicting, row 256 in the head, a matryoshka width left out) moves a tensor by far more.
  - param.<name> after the steps: max |engine - reference| / max |reference| <= 1e-4. Adam moves an
    element by about lr whatever its gradient's size, so a wrong schedule, bias correction, clip, eps
    placement or decay mask moves elements by a sizeable fraction of lr (measured: 2e-4 to 2e-3 of
    max |param|), while F32 arithmetic stays below 5e-6. The batches' epsilon (1e-3, 1e-2) is chosen
    for this: with epsilon 1e-8, elements whose gradient is at the level of F32 rounding (the key
    biases' gradient is exactly 0 in exact arithmetic, softmax ignoring a per-query constant) get
    update m / (sqrt(v) + eps) of either sign and size up to 1 in F32 and ~0 in F64, and the float32
    reference then differs from the float64 one by up to 9e-3 relative: no tolerance tells that
    from a bug. A larger epsilon keeps each update a smooth function of the gradient.
  - a reference tensor that is all zeros (a tower the batch does not use) needs |engine| <= 1e-12.
  - loss, contrastive, lm per step: |engine - reference| <= 1e-4 max(1, |reference|); and, when the
    engine writes them, lr within 1e-6 relative and grad_norm within 2e-3 relative.
`--self-test` runs the reference in float32 (`--dtype float32`, an emulation of an F32 engine) against
float64 to show these hold for F32 arithmetic, and checks that the comparison fails on perturbed copies
(one element of a gradient, a gradient scaled by 1.003, one parameter element, a missing tensor, a loss).

`--no-media` leaves the WAV and AVI items out of the "mixed" batches (an engine built without FFmpeg).

Exit status: 0 pass, 1 fail, 77 skip (no --engine-tool, or not an executable; no PyTorch or Pillow in
any interpreter found).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from interpreter import SKIP, run_under_python_with  # noqa: E402

if __name__ == "__main__":
    run_under_python_with(["torch", "numpy", "PIL"])

import numpy as np  # noqa: E402

import audio_reference as audio_ref  # noqa: E402
import harness  # noqa: E402  (checkpoints: the tool, sharpening)
import train_reference as train  # noqa: E402
import uform_reference as ref  # noqa: E402

GRAD_REL_MAX = 2e-3
GRAD_COSINE_MIN = 0.9999
PARAM_REL_MAX = 1e-4
ZERO_ABS_MAX = 1e-12
LOSS_REL_MAX = 1e-4
LR_REL_MAX = 1e-6
NORM_REL_MAX = 2e-3
WORST_SHOWN = 12


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def checkpoints(tool: str, workdir: Path) -> list:
    """(label, path) of the tool's tiny default and of depth 2 hidden 128 with sharp attention."""
    tiny = workdir / "train-tiny.safetensors"
    wide = workdir / "train-128.safetensors"
    if not harness.write_checkpoints(tool, [("tiny", tiny, ["--seed", "7"]),
                                            ("128", wide, ["--seed", "8", "--depth", "2", "--hidden", "128"])]):
        return None
    sharp = workdir / "train-128-sharp.safetensors"
    source = wide
    config = json.loads(ref.read_safetensors(str(wide), prefixes=("none.",))[1]["uform"])
    for tower in ("text", "image", "audio"):
        if tower in config:
            harness.sharpen_checkpoint(source, sharp, tower)
            source = sharp
    return [("tiny default", tiny), ("depth 2, hidden 128, q and k x4", sharp)]


def write_inputs(folder: Path, config: dict) -> None:
    """The media files of the batches, for the checkpoint's `config` (its uform metadata)."""
    from PIL import Image, ImageDraw

    size = int(config["image"]["size"])
    rng = np.random.default_rng(29)
    for index, (ground, ink) in enumerate([((30, 90, 160), (250, 210, 40)), ((200, 200, 190), (120, 20, 60))]):
        image = Image.new("RGB", (size, size), ground)
        draw = ImageDraw.Draw(image)
        draw.ellipse((size // 8, size // 6, size * 5 // 8 + index * 3, size * 3 // 4), fill=ink)
        draw.rectangle((size // 2, size // 2 - index * 4, size - 3, size - 2), outline=(10, 10, 10), width=2)
        draw.line((0, size - 1, size - 1, index * 5), fill=(255, 255, 255), width=1)
        pixels = np.asarray(image).astype(np.int16) + rng.integers(-12, 13, (size, size, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"image{index}.png")
    rate = int(config["audio"]["rate"])
    seconds = float(config["audio"]["seconds"])
    t = np.arange(int(0.4 * rate)) / rate
    tone = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.02 * rng.standard_normal(t.size)
    (folder / "tone.wav").write_bytes(audio_ref.wav_bytes(tone, rate))
    t = np.arange(int((seconds + 0.3) * rate)) / rate  # longer than `seconds`: cut
    glide = 0.4 * np.sin(2 * np.pi * (200 * t + 900 * t * t)) * np.exp(-t)
    (folder / "glide.wav").write_bytes(audio_ref.wav_bytes(glide, rate))
    frames = []
    y, x = np.mgrid[0:size, 0:size]
    for i in range(6):
        channels = [128 + 90 * np.sin(0.3 * x * (c + 1) + 0.2 * y + i) for c in range(3)]
        frames.append(np.clip(np.stack(channels, -1) + rng.normal(0, 8, (size, size, 3)), 0, 255).astype(np.uint8))
    (folder / "clip.avi").write_bytes(train.avi_rgb(frames, 6))


# The long text passes `context` (64 by the tool's default), and its 64th byte falls inside the 4-byte fox:
# truncation counts bytes, not characters.
TEXTS = ["", "a red circle", "a long caption \u2014 past the context here: the quick brown fox " + "\U0001F98A the quick brown fox " * 5]


def batches(folder: Path, checkpoint: Path, media: bool = True) -> list:
    """(label, path) of the batch JSON files for `checkpoint`, media written beside them."""
    config = json.loads(ref.read_safetensors(str(checkpoint), prefixes=("none.",))[1]["uform"])
    folder.mkdir(parents=True, exist_ok=True)
    write_inputs(folder, config)
    context = int(config["text"]["context"])
    assert len(TEXTS[2].encode()) > context, "the long text must pass the context"
    texts = [{"modality": "text", "text": text} for text in TEXTS]
    images = [{"modality": "image", "path": f"image{i}.png"} for i in range(2)]
    mixed = {"checkpoint": os.path.relpath(checkpoint, folder),
             "items": texts + images + [{"modality": "audio", "path": "tone.wav"},
                                        {"modality": "audio", "path": "glide.wav"},
                                        {"modality": "video", "path": "clip.avi"}],
             "relations": [[1, 3], [2, 4], [5, 6], [3, 7], [0, 6]], "lm_weight": 0.5, "steps": 3,
             "optimizer": {"learning_rate": 1e-3, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999,
                           "epsilon": 1e-3, "warmup_steps": 2, "total_steps": 10, "clip_norm": 1.0}}
    text_image = {"checkpoint": os.path.relpath(checkpoint, folder), "items": texts + images,
                  "relations": [[1, 3], [4, 2]], "lm_weight": 1.0, "steps": 2,
                  "optimizer": {"learning_rate": 2e-3, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
                                "epsilon": 1e-2, "warmup_steps": 0, "total_steps": 4, "clip_norm": 0.0}}
    if not media:  # an engine built without FFmpeg: no WAV or AVI items
        keep = [i for i, item in enumerate(mixed["items"]) if item["modality"] in ("text", "image")]
        where = {old: new for new, old in enumerate(keep)}
        mixed["items"] = [mixed["items"][i] for i in keep]
        mixed["relations"] = [[where[i], where[j]] for i, j in mixed["relations"] if i in where and j in where]
    answer = []
    for label, batch in (("mixed", mixed), ("text-image", text_image)):
        path = folder / f"{label}.json"
        path.write_text(json.dumps(batch, indent=1, ensure_ascii=False), encoding="utf-8")
        answer.append((label, path))
    return answer


# ------------------------------------------------------------------------------------------------
# Running both sides
# ------------------------------------------------------------------------------------------------


def run_tool(command: list, what: str) -> bool:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"FAIL: {what} exited {done.returncode}: {' '.join(str(c) for c in command)}\n{done.stdout}{done.stderr}")
        return False
    return True


def run_reference(batch: Path, output: Path, dtype: str = "float64") -> bool:
    return run_tool([sys.executable, HERE / "train_reference.py", batch, output, "--dtype", dtype], "the reference")


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------


def compare_files(engine_path: Path, reference_path: Path) -> tuple[list, list]:
    """Answers (rows, failures): a row per reference tensor (name, shape, max |ref|, max abs error,
    relative error, cosine, limit, ok) and a failure line per problem (tensors and history)."""
    engine, engine_meta = ref.read_safetensors(str(engine_path))
    expected, expected_meta = ref.read_safetensors(str(reference_path))
    rows, failures = [], []
    for name, want in expected.items():
        want = np.asarray(want, np.float64)
        got = engine.get(name)
        if got is None:
            failures.append(f"{name}: missing from the engine's file")
            rows.append((name, want.shape, float(np.abs(want).max(initial=0)), math.inf, math.inf, 0.0, "", False))
            continue
        got = np.asarray(got, np.float64)
        if got.shape != want.shape:
            failures.append(f"{name}: shape {list(got.shape)}, reference {list(want.shape)}")
            rows.append((name, want.shape, float(np.abs(want).max(initial=0)), math.inf, math.inf, 0.0, "", False))
            continue
        scale = float(np.abs(want).max(initial=0))
        error = float(np.abs(got - want).max(initial=0)) if np.isfinite(got).all() else math.inf
        grad = name.startswith("grad.")
        if scale == 0:
            ok = error <= ZERO_ABS_MAX
            relative, cosine, limit = (0.0 if error == 0 else math.inf), (1.0 if error == 0 else 0.0), f"abs<={ZERO_ABS_MAX:g}"
        else:
            relative = error / scale
            norms = float(np.linalg.norm(got) * np.linalg.norm(want))
            cosine = float((got * want).sum()) / norms if norms > 0 else 0.0
            if grad:
                ok = relative <= GRAD_REL_MAX and cosine >= GRAD_COSINE_MIN
                limit = f"rel<={GRAD_REL_MAX:g},cos>={GRAD_COSINE_MIN:g}"
            else:
                ok = relative <= PARAM_REL_MAX
                limit = f"rel<={PARAM_REL_MAX:g}"
        rows.append((name, want.shape, scale, error, relative, cosine, limit, ok))
        if not ok:
            failures.append(f"{name}: max abs error {error:.3e} of max |ref| {scale:.3e} (relative {relative:.2e}), "
                            f"cosine {cosine:.7f}; limit {limit}")
    for name in engine:
        if name not in expected and name.startswith(("grad.", "param.")):
            failures.append(f"{name}: in the engine's file, not the reference's")
    for key, limit, required in (("loss", LOSS_REL_MAX, True), ("contrastive", LOSS_REL_MAX, True),
                                 ("lm", LOSS_REL_MAX, True), ("lr", LR_REL_MAX, False),
                                 ("grad_norm", NORM_REL_MAX, False)):
        if key not in engine_meta:
            if required:
                failures.append(f"__metadata__[{key!r}]: missing from the engine's file")
            continue
        try:
            got, want = json.loads(engine_meta[key]), json.loads(expected_meta[key])
        except ValueError as error:
            failures.append(f"__metadata__[{key!r}]: not JSON ({error})")
            continue
        if not isinstance(got, list) or len(got) != len(want):
            failures.append(f"__metadata__[{key!r}]: {got!r}, reference {len(want)} entries {want}")
            continue
        for step, (g, w) in enumerate(zip(got, want)):
            floor = 1.0 if key in ("loss", "contrastive", "lm") else abs(w)
            if not isinstance(g, (int, float)) or not abs(g - w) <= limit * max(floor, abs(w)):
                failures.append(f"__metadata__[{key!r}] step {step + 1}: {g!r}, reference {w!r} (limit {limit:g})")
        print(f"  {key:12s} engine {['%.8g' % v for v in got]}  reference {['%.8g' % v for v in want]}")
    return rows, failures


def print_table(rows: list) -> None:
    """The worst tensors: by the ratio of the error to its limit, failures first."""

    def badness(row):
        name, _, _, _, relative, cosine, _, ok = row
        limit = GRAD_REL_MAX if name.startswith("grad.") else PARAM_REL_MAX
        ratio = relative / limit
        if name.startswith("grad."):
            ratio = max(ratio, (1 - cosine) / (1 - GRAD_COSINE_MIN))
        return (not ok, ratio)

    shown = sorted(rows, key=badness, reverse=True)[:WORST_SHOWN]
    print(f"  {'tensor':46s} {'shape':>12s} {'max|ref|':>10s} {'max err':>10s} {'rel':>9s} {'cosine':>12s}  ")
    for name, shape, scale, error, relative, cosine, limit, ok in shown:
        print(f"  {name:46s} {str(list(shape)):>12s} {scale:10.3e} {error:10.3e} {relative:9.2e} {cosine:12.9f}  "
              f"{'ok  ' if ok else 'FAIL'} {limit}")
    grads = [r for r in rows if r[0].startswith("grad.")]
    params = [r for r in rows if r[0].startswith("param.")]
    print(f"  {len(rows)} tensors ({len(grads)} gradients, {len(params)} parameters); "
          f"worst gradient rel {max((r[4] for r in grads), default=0):.2e}, min cosine "
          f"{min((r[5] for r in grads), default=1):.9f}; worst parameter rel {max((r[4] for r in params), default=0):.2e}")


def compare(report, label: str, engine_path: Path, reference_path: Path) -> bool:
    print(f"\n== {label}", flush=True)
    rows, failures = compare_files(engine_path, reference_path)
    print_table(rows)
    return report.check(label, not failures, "\n       ".join([""] + failures[:20]) if failures else "")


# ------------------------------------------------------------------------------------------------
# --self-test: the comparison fails where it must
# ------------------------------------------------------------------------------------------------


def perturbed(source: Path, target: Path, change) -> None:
    tensors, metadata = ref.read_safetensors(str(source))
    tensors = {name: np.array(value, np.float64) for name, value in tensors.items()}
    change(tensors, metadata)
    train.write_safetensors(target, tensors, metadata)


def self_test(report, workdir: Path, every: list) -> None:
    """Each (label, batch): float32 reference vs float64 passes; each perturbation fails, on its own tensor."""
    for label, batch in every:
        out64 = batch.with_suffix(".reference.safetensors")
        out32 = batch.with_suffix(".reference-f32.safetensors")
        if not (run_reference(batch, out64) and run_reference(batch, out32, "float32")):
            report.check(f"{label}: the reference runs", False)
            continue
        rows, failures = compare_files(out64, out64)
        report.check(f"{label}: the reference against itself passes", not failures, "; ".join(failures[:3]))
        compare(report, f"{label}: reference in float32 (an F32 engine) vs float64, within the tolerances", out32, out64)
        expected, _ = ref.read_safetensors(str(out64))
        grad = next(n for n in expected if n.startswith("grad.") and "blocks.0.attn.qkv.weight" in n
                    and np.abs(expected[n]).max() > 0)
        param = next(n for n in expected if n.startswith("param.") and "proj.weight" in n)

        def bump(name, fraction):
            def change(tensors, metadata):
                index = np.unravel_index(np.argmax(np.abs(tensors[name])), tensors[name].shape)
                tensors[name][index] += fraction * np.abs(tensors[name]).max()
            return change

        def scale(name, factor):
            def change(tensors, metadata):
                tensors[name] *= factor
            return change

        def drop(name):
            def change(tensors, metadata):
                del tensors[name]
            return change

        def loss(tensors, metadata):
            values = json.loads(metadata["loss"])
            values[-1] *= 1 + 1e-3
            metadata["loss"] = json.dumps(values)

        cases = [(f"{grad} + 1% of its max at one element", bump(grad, 1e-2), grad),
                 (f"{grad} x 1.003", scale(grad, 1.003), grad),
                 (f"{param} + 2e-4 of its max at one element", bump(param, 2e-4), param),
                 (f"{grad} missing", drop(grad), grad),
                 ("the last step's loss x (1 + 1e-3)", loss, "'loss'")]
        for what, change, culprit in cases:
            target = batch.with_suffix(".perturbed.safetensors")
            perturbed(out64, target, change)
            _, failures = compare_files(target, out64)
            report.check(f"{label}: caught: {what}", len(failures) == 1 and culprit in failures[0],
                         "; ".join(failures[:3]) or "not caught")


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-tool", help="the engine's training tool: TOOL BATCH.json OUT.safetensors")
    parser.add_argument("--checkpoint-tool", required=True, help="the uform_tiny_checkpoint executable")
    parser.add_argument("--workdir", default=None, help="where checkpoints, batches and outputs go (default: temporary)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the comparison (float32 reference within the tolerances, perturbations caught); "
                             "needs no engine tool")
    parser.add_argument("--no-media", action="store_true",
                        help="leave the WAV and AVI items out (an engine built without FFmpeg)")
    args = parser.parse_args(argv)
    if not args.self_test:
        if not args.engine_tool:
            print("SKIP: no --engine-tool given (the engine's training tool: TOOL BATCH.json OUT.safetensors)")
            return SKIP
        if not (os.path.isfile(args.engine_tool) and os.access(args.engine_tool, os.X_OK)):
            print(f"SKIP: the engine's training tool {args.engine_tool} is missing or not executable")
            return SKIP
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="uform-train-reference-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = ref.Report()
    written = checkpoints(args.checkpoint_tool, workdir)
    if written is None:
        return 1
    every = []
    for index, (label, path) in enumerate(written):
        print(f"checkpoint {index}: {label}: {path}")
        for batch_label, batch in batches(workdir / f"checkpoint{index}", path, media=not args.no_media):
            every.append((f"checkpoint {index} ({label}), {batch_label}", batch))
    if args.self_test:
        self_test(report, workdir, every)
        return harness.summary(report)
    for label, batch in every:
        reference_out = batch.with_suffix(".reference.safetensors")
        engine_out = batch.with_suffix(".engine.safetensors")
        engine_out.unlink(missing_ok=True)
        if not run_reference(batch, reference_out):
            report.check(f"{label}: the reference runs", False)
            continue
        if not run_tool([args.engine_tool, batch, engine_out], "the engine's training tool"):
            report.check(f"{label}: the engine's tool runs", False)
            continue
        compare(report, label, engine_out, reference_out)
    return harness.summary(report)


if __name__ == "__main__":
    sys.exit(main())
