#!/usr/bin/env python3
"""Images per second of the C engine, end to end and by stage, beside Pillow plus PyTorch.

    python3 bench/bench_image.py --build build [--threads 2] [--images 48] [--width 640 --height 480]

On one base-sized image checkpoint (depth 12, hidden 768, mlp 3072, size 224, patch 16: the tiny
checkpoint tool's base tower, seed 3, with its patch layer and positions redrawn for 224 / 16), with the
same weights and threads everywhere, over a folder of seeded JPEG files written by Pillow (quality 90,
4:2:0), each engine over whole passes for at least --min-seconds after one warm-up pass:
  (a) end to end: uform_image_encode over the files' paths (read through the ring, JPEG decode,
      resize, crop, normalize, the tower), embeddings, F32;
  (b) decode only: the same calls' own stage timings, images / (read_ns + decode_ns): the engine's
      reading, decoding and resizing, on all threads;
  (c) encode only: uform_image_encode_pixels on pixels already at 224 x 224 (resizing is then the
      identity), the tower alone, in the same batches;
  (d) Pillow plus PyTorch: Image.open + convert("RGB"), the reference's preprocessing (F.interpolate,
      antialiased) and its tower in bfloat16 eager (torch.set_num_threads(threads)), in the same batches.
It prints figures and ratios (end to end / encode only, end to end / Pillow plus PyTorch) and never
fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
REFERENCE = REPOSITORY / "tests" / "reference"


def _interpreter_with_torch_and_pillow() -> None:
    try:
        import PIL  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    if not os.environ.get("UFORM_REFERENCE_REEXEC"):
        here = os.path.realpath(sys.executable)
        for candidate in (REPOSITORY / ".venv" / "bin" / "python3", Path("/usr/bin/python3")):
            if candidate.exists() and os.path.realpath(candidate) != here and \
                    subprocess.run([str(candidate), "-c", "import torch, PIL"], capture_output=True).returncode == 0:
                os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, "UFORM_REFERENCE_REEXEC": "1"})
    print("PyTorch or Pillow cannot be imported: nothing to compare with")
    sys.exit(0)


if __name__ == "__main__":
    _interpreter_with_torch_and_pillow()
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(REFERENCE))
import test_image_reference as image_harness  # noqa: E402
import test_text_reference as harness  # noqa: E402
import uform_reference as ref  # noqa: E402

SIZE, PATCH = 224, 16


def measure(run, min_seconds: float) -> float:
    """Seconds per call of `run` after one warm-up call, over at least `min_seconds`."""
    run()
    calls, start = 0, time.perf_counter()
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def write_checkpoint(tool: str, path: Path, seed: int) -> None:
    """The tool's base checkpoint with the image tower's patch layer and positions redrawn for
    size 224, patch 16 (std 0.02, BF16), and its metadata to match."""
    base = path.with_suffix(".tool.safetensors")
    subprocess.run([tool, str(base), "--depth", "12", "--hidden", "768", "--mlp", "3072", "--seed", str(seed)],
                   check=True, capture_output=True)
    blob = base.read_bytes()
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8 : 8 + length])
    metadata = header.pop("__metadata__")
    config = json.loads(metadata["uform"])
    config["image"]["size"], config["image"]["patch"] = SIZE, PATCH
    metadata["uform"] = json.dumps(config)
    hidden = int(config["image"]["hidden"])
    rng = np.random.default_rng(seed)
    redrawn = {"image.patch.weight": (hidden, 3 * PATCH * PATCH), "image.pos": (1 + (SIZE // PATCH) ** 2, hidden)}
    tensors, data = {}, bytearray()
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        if name in redrawn:
            values = (0.02 * rng.standard_normal(redrawn[name])).astype(np.float32)
            raw, shape = ref.f32_to_bf16_bits(values.reshape(-1)).tobytes(), list(redrawn[name])
        else:
            begin, end = info["data_offsets"]
            raw, shape = blob[8 + length + begin : 8 + length + end], info["shape"]
        tensors[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps({"__metadata__": metadata, **tensors}).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(data))
    base.unlink()


def write_images(folder: Path, count: int, height: int, width: int, seed: int) -> list:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    paths = []
    for i in range(count):
        path = folder / f"image-{i:04d}.jpg"
        paths.append(path)
        if path.exists():
            continue
        phases = rng.uniform(0, 6.28, 3)
        rgb = np.stack([128 + 90 * np.sin(0.02 * x * (c + 1) + 0.03 * y + phases[c]) for c in range(3)], axis=-1)
        rgb = np.clip(rgb + rng.normal(0, 20, rgb.shape), 0, 255).astype(np.uint8)
        Image.fromarray(rgb).save(path, quality=90, subsampling=2)
    return paths


def groups(items: list, size: int) -> list:
    return [items[i : i + size] for i in range(0, len(items), size)]


def bench_uform(library, checkpoint, paths, pixels, batch, threads, min_seconds):
    engine = harness.Engine(library)
    images = image_harness.ImageEngine(engine)
    executor = engine.ram_executor(threads)
    arena = engine.arena(executor)
    model = engine.load(str(checkpoint), executor)
    stages = {"read_ns": 0, "decode_ns": 0, "compute_ns": 0, "items": 0}
    try:
        def end_to_end():
            for group in groups(paths, batch):
                result = images.encode(model, group, arena, kind="files", outputs=image_harness.OUTPUT_EMBEDDINGS,
                                       executor=executor)
                stats = result["stats"]
                for key in ("read_ns", "decode_ns", "compute_ns"):
                    stages[key] += getattr(stats, key)
                stages["items"] += stats.items - stats.failed

        def encode_only():
            for group in groups(pixels, batch):
                images.encode(model, group, arena, outputs=image_harness.OUTPUT_EMBEDDINGS, executor=executor)

        first = images.encode(model, paths[:batch], arena, kind="files", outputs=image_harness.OUTPUT_EMBEDDINGS,
                              executor=executor)["embeddings"]["values"]
        e2e = len(paths) / measure(end_to_end, min_seconds)
        decode = stages["items"] / ((stages["read_ns"] + stages["decode_ns"]) * 1e-9)
        compute = stages["items"] / (stages["compute_ns"] * 1e-9)
        encode = len(pixels) / measure(encode_only, min_seconds)
        return e2e, decode, compute, encode, first
    finally:
        engine.library.uform_model_free(model)
        engine.library.uform_arena_free(arena)
        engine.library.uform_executor_free(executor)


def bench_torch(checkpoint, paths, batch, threads, min_seconds):
    torch.set_num_threads(threads)
    tower = ref.Reference(str(checkpoint), torch.bfloat16).image

    def run():
        embeddings = []
        with torch.inference_mode():
            for group in groups(paths, batch):
                pixels = torch.stack([tower.preprocess(ref.pillow_rgb(path)) for path in group])
                embeddings.append(tower.embed_states(tower(pixels)[:, 0]).float().numpy())
        return np.concatenate(embeddings)

    first = run()[:batch]
    return len(paths) / measure(run, min_seconds), first


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--workdir", help="checkpoint and images (default: <build>/bench-image)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--batch", type=int, default=16, help="images per call, for every engine")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    build = Path(args.build)
    library, tool = str(build / "libuform.so"), str(build / "src" / "tools" / "uform_tiny_checkpoint")
    workdir = Path(args.workdir or build / "bench-image")
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / f"base-image-d12-h768-s{SIZE}-p{PATCH}-seed{args.seed}.safetensors"
    if not checkpoint.exists():
        write_checkpoint(tool, checkpoint, args.seed)
    paths = write_images(workdir / f"jpeg-{args.width}x{args.height}", args.images, args.height, args.width, args.seed)
    from PIL import Image

    pixels = [np.asarray(Image.open(path).convert("RGB").resize((SIZE, SIZE))) for path in paths]
    print(f"checkpoint {checkpoint.name}: image depth 12, hidden 768, mlp 3072, size {SIZE}, patch {PATCH}")
    print(f"{len(paths)} JPEG files of {args.width}x{args.height} (quality 90, 4:2:0), batches of {args.batch}, "
          f"{args.threads} threads, PyTorch {torch.__version__}")
    e2e, decode, compute, encode, first = bench_uform(library, checkpoint, [str(p) for p in paths], pixels,
                                                      args.batch, args.threads, args.min_seconds)
    rows = [("uform end to end (files: read, decode, resize, tower)", e2e),
            ("uform decode only (read + decode + resize stages)", decode),
            ("uform tower stage of the end-to-end calls", compute),
            ("uform encode only (pixels at 224 x 224)", encode)]
    torch_rate = None
    if not args.no_torch:
        torch_rate, torch_first = bench_torch(checkpoint, [str(p) for p in paths], args.batch, args.threads,
                                              args.min_seconds)
        rows.append(("Pillow + PyTorch eager bfloat16", torch_rate))
        cosine = harness.cosines(first, torch_first)
        print(f"agreement, first batch: min cosine {cosine.min():.5f} (PyTorch in bfloat16)")
    print()
    for name, rate in rows:
        print(f"  {name:<58} {rate:8.2f} images/s")
    print()
    print(f"  end to end / encode only:            {e2e / encode:.2f}")
    if torch_rate:
        print(f"  end to end / Pillow + PyTorch:       {e2e / torch_rate:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
