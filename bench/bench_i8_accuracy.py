#!/usr/bin/env python3
"""How far I8 weights (uform_weights_t) move the embeddings: the same checkpoint loaded with BF16 weights and
with I8 weights, the same items through both, the cosine of each pair of rows.

    python3 bench/bench_i8_accuracy.py --build build [--dataset shapes] [--texts 64]

  (a) base-sized random checkpoints (the tiny checkpoint tool's depth 12, hidden 768, mlp 3072, context 256,
      images 224 in patches of 16, seeds 3 and 4; its weights N(0, 0.02)): seeded texts of 64 to 256
      printable bytes (embeddings and token vectors), seeded images of 224 x 224 and seeded sounds of 2 s;
  (b) the demo model (models/demo.safetensors) on the held-out split of `uform dataset synth --seed 42`
      (--dataset, written into the work folder when not given): every caption, image, clip and sound of
      test.jsonl;
  (c) `uform eval` of the demo model on that split with --weights bf16 and --weights i8: text-to-media
      recall@1 and @5, side by side.
It prints figures (minimum, 1st percentile and mean cosine per output) and never fails on them: the
tests hold the bounds (tests/reference, tests/model/test_weights.c).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import bench_common as common

if __name__ == "__main__":
    common.python_with(["torch", "numpy"])
import numpy as np  # noqa: E402

import harness  # noqa: E402

SIZE, PATCH = 224, 16


def cosine_line(name: str, a: np.ndarray, b: np.ndarray) -> str:
    c = harness.cosines(a, b)
    return f"  {name:28s} {len(c):6d} rows   min {c.min():.5f}   1% {np.percentile(c, 1):.5f}   mean {c.mean():.5f}"


def both(engine, path: Path, encode) -> tuple:
    """`encode(model, arena)` on the checkpoint loaded with BF16 and then with I8 weights."""
    results = []
    for weights in ("bf16", "i8"):
        executor = engine.ram_executor(2)
        arena = engine.arena(executor)
        model = engine.load(str(path), executor, weights)
        try:
            results.append(encode(model, arena, executor))
        finally:
            engine.library.uform_model_free(model)
            engine.library.uform_arena_free(arena)
            engine.library.uform_executor_free(executor)
    return results


def base_checkpoints(args) -> None:
    engine = harness.Engine(args.library)
    rng = np.random.default_rng(args.seed)
    texts = [rng.integers(32, 127, size=int(rng.integers(64, 257)), dtype=np.uint8).tobytes() for _ in range(args.texts)]
    images = [rng.integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8) for _ in range(16)]
    t = np.arange(32000) / 16000.0
    sounds = [np.sin(2 * np.pi * f * t).astype(np.float32) * 0.5 for f in (220, 440, 880, 1760)]
    for seed in (3, 4):
        path = args.workdir / f"base-image-d12-h768-s{SIZE}-p{PATCH}-seed{seed}.safetensors"
        common.write_redrawn_checkpoint(args.tiny_checkpoint_tool, path, seed, "image", {"size": SIZE, "patch": PATCH},
                                        {"image.patch.weight": (768, 3 * PATCH * PATCH),
                                         "image.pos": (1 + (SIZE // PATCH) ** 2, 768)})
        print(f"\n(a) {path.name}: depth 12, hidden 768, mlp 3072 (seed {seed})")
        bf16, i8 = both(engine, path, lambda m, a, e: engine.encode(m, texts, harness.EVERYTHING, a, e))
        print(cosine_line("text embeddings", i8["embeddings"]["values"], bf16["embeddings"]["values"]))
        print(cosine_line("text token vectors", i8["token_vectors"]["values"], bf16["token_vectors"]["values"]))
        bf16, i8 = both(engine, path, lambda m, a, e: engine.encode_images(m, images, a, executor=e))
        print(cosine_line("image embeddings", i8["embeddings"]["values"], bf16["embeddings"]["values"]))
        try:
            bf16, i8 = both(engine, path, lambda m, a, e: engine.encode_sounds(m, sounds, a, rate=16000, executor=e))
            print(cosine_line("audio embeddings", i8["embeddings"]["values"], bf16["embeddings"]["values"]))
        except harness.EngineError as error:
            print(f"  audio: {error}")


def demo_model(args, dataset: Path) -> None:
    engine = harness.Engine(args.library)
    demo = common.REPOSITORY / "models" / "demo.safetensors"
    items = [json.loads(line) for line in (dataset / "test.jsonl").read_text().splitlines() if line.strip()]
    print(f"\n(b) {demo}: the held-out split of {dataset}")
    captions = [item["text"].encode() for item in items if item["modality"] == "text"]
    bf16, i8 = both(engine, demo, lambda m, a, e: engine.encode(m, captions, harness.OUTPUT_EMBEDDINGS, a, e))
    print(cosine_line("captions", i8["embeddings"]["values"], bf16["embeddings"]["values"]))
    for modality, encode in (("image", engine.encode_images), ("video", engine.encode_videos),
                             ("audio", engine.encode_sounds)):
        paths = [str(dataset / item["path"]) for item in items if item["modality"] == modality]
        try:
            bf16, i8 = both(engine, demo, lambda m, a, e: encode(m, paths, a, kind="files", executor=e))
        except harness.EngineError as error:
            print(f"  {modality}: {error}")
            continue
        print(cosine_line(f"{modality} embeddings", i8["embeddings"]["values"], bf16["embeddings"]["values"]))


def recall(args, dataset: Path) -> None:
    uform = Path(args.build) / "tools" / "uform"
    demo = common.REPOSITORY / "models" / "demo.safetensors"
    print(f"\n(c) uform eval --model {demo.name} --data {dataset / 'test.jsonl'}")
    for weights in ("bf16", "i8"):
        ran = subprocess.run([str(uform), "eval", "--model", str(demo), "--data", str(dataset / "test.jsonl"),
                              "--weights", weights], capture_output=True, text=True)
        print(f"  --weights {weights}:")
        for line in (ran.stdout or ran.stderr).splitlines():
            print(f"    {line}")


def main(argv=None) -> int:
    extra = [(("--dataset",), {"default": None, "help": "a `uform dataset synth --seed 42` folder"})]
    args = common.arguments(__doc__, "i8-accuracy", ("texts", 64), 64, argv, extra)
    dataset = Path(args.dataset) if args.dataset else args.workdir / "shapes"
    if not (dataset / "test.jsonl").exists():
        subprocess.run([str(Path(args.build) / "tools" / "uform"), "dataset", "synth", "--out", str(dataset),
                        "--seed", "42", "--force"], check=True, capture_output=True)
    base_checkpoints(args)
    demo_model(args, dataset)
    recall(args, dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
