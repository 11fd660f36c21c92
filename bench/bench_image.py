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
      reading, decoding and resizing; a call's first chunk is decoded on all threads, each later chunk
      (with 2 threads or more) by one lent worker while the chunk before runs through the tower, and
      decode_ns counts that worker's time, so this figure understates decoding on all threads and
      end to end may exceed 1 / (1 / decode + 1 / tower);
  (c) encode only: uform_image_encode_pixels on pixels already at 224 x 224 (resizing is then the
      identity), the tower alone, in the same batches;
  (d) Pillow plus PyTorch: Image.open + convert("RGB"), the reference's preprocessing (F.interpolate,
      antialiased) and its tower eager in float32 (PyTorch's default on a CPU: the BF16 weights widened;
      Debian's PyTorch runs its GEMMs on the BLAS libblas.so.3 names, which the header line reports: install
      libopenblas0-pthread, as .ci/run does, or the reference BLAS makes this baseline ~10x slower) and in
      bfloat16 (oneDNN's AVX-512 BF16 GEMMs where the CPU has them), torch.set_num_threads(threads) and as
      many OpenBLAS threads, in the same batches.
(a) and (c) run again on the model loaded with I8 weights (uform_weights_t). It prints figures and ratios
(end to end / encode only, end to end / Pillow plus PyTorch, and with I8 weights end to end / BF16
weights') and never fails on time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import bench_common as common

if __name__ == "__main__":
    common.python_with(["torch", "numpy", "PIL"])
import numpy as np  # noqa: E402
import torch  # noqa: E402

import harness  # noqa: E402
import uform_reference as ref  # noqa: E402

SIZE, PATCH = 224, 16


def write_checkpoint(tool: str, path: Path, seed: int) -> None:
    """The tool's base checkpoint with the image tower's patch layer and positions redrawn for
    size 224, patch 16, and its metadata to match."""
    hidden = 768
    common.write_redrawn_checkpoint(tool, path, seed, "image", {"size": SIZE, "patch": PATCH},
                                    {"image.patch.weight": (hidden, 3 * PATCH * PATCH),
                                     "image.pos": (1 + (SIZE // PATCH) ** 2, hidden)})


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


def bench_torch(checkpoint, paths, batch, threads, min_seconds, dtype):
    common.torch_threads(threads)
    tower = ref.Reference(str(checkpoint), dtype).image

    def embed(group):
        pixels = torch.stack([tower.preprocess(ref.pillow_rgb(path)) for path in group])
        return tower.embed_states(tower(pixels)[:, 0])

    return common.torch_rate(paths, batch, min_seconds, embed)


def encode_files(engine, model, group, arena, executor):
    return engine.encode_images(model, group, arena, kind="files", outputs=harness.OUTPUT_EMBEDDINGS, executor=executor)


def encode_pixels(engine, model, group, arena, executor):
    return engine.encode_images(model, group, arena, outputs=harness.OUTPUT_EMBEDDINGS, executor=executor)


def main(argv=None) -> int:
    args = common.arguments(__doc__, "image", ("images", 48), 16, argv,
                            extra=[(("--height",), {"type": int, "default": 480}),
                                   (("--width",), {"type": int, "default": 640})])
    checkpoint = args.workdir / f"base-image-d12-h768-s{SIZE}-p{PATCH}-seed{args.seed}.safetensors"
    write_checkpoint(args.tiny_checkpoint_tool, checkpoint, args.seed)
    paths = write_images(args.workdir / f"jpeg-{args.width}x{args.height}", args.images, args.height, args.width,
                         args.seed)
    from PIL import Image

    pixels = [np.asarray(Image.open(path).convert("RGB").resize((SIZE, SIZE))) for path in paths]
    print(f"checkpoint {checkpoint.name}: image depth 12, hidden 768, mlp 3072, size {SIZE}, patch {PATCH}")
    print(f"{len(paths)} JPEG files of {args.width}x{args.height} (quality 90, 4:2:0), batches of {args.batch}, "
          f"{args.threads} threads, PyTorch {torch.__version__} (float32 GEMMs on {common.torch_blas()})")
    common.compare_stages(args, checkpoint, paths, pixels, encode_files, encode_pixels,
                          common.stage_labels(("resize",), "pixels at 224 x 224"),
                          "images", "Pillow + PyTorch", bench_torch, "PyTorch in {dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
