#!/usr/bin/env python3
"""Images per second of a CLIP ViT-B/16 image tower, end to end from JPEG files, in the engine beside
transformers on PyTorch (float32 and bfloat16) and ONNX Runtime (float32, and int8 weights by
quantize_dynamic), at 1 and 2 threads, on the same weights and files, in one run.

    python3 bench/bench_clip_image.py --build build [--images 64] [--threads 1,2] [--workdir DIR]

The model: a CLIPModel folder written by transformers 4.44.2 (save_pretrained, safetensors) at
openai/clip-vit-base-patch16's image shapes (12 blocks, hidden 768, MLP 3072, 12 heads, 224 pixels,
patches of 16, quick GELU, projection to 512), random weights rounded to BF16 values, with a small text
tower (the bench embeds images only) and CLIPImageProcessor's configuration. The files: --images JPEG
files (quality 90) of scikit-image's photos at their own sizes (300x451 to 512x512), cycled. Every engine
embeds every file through CLIP's own preprocessing (shortest side to 224 by Pillow's bicubic, center crop,
rescale, normalize):
  (a) the engine through its Python package (uform.Model(FOLDER, executor=Executor.ram(threads=N),
      weights="bf16"|"i8").encode_images over the files' paths in one call, decoding included), loaded and
      after a warm-up call, as the others are measured, in a process of its own, the best of two passes;
      and `uform encode --model FOLDER --threads N --weights bf16|i8 --manifest FILE --format f32` with its
      rows sent to /dev/null, timed by the wall clock as a whole (the folder's load, reading and decoding
      the files included: end to end), the best of two runs; a one-image run's time is printed beside it
      as the start-up's share;
  (b) transformers: Image.open + CLIPImageProcessor + CLIPModel.get_image_features in batches of 32, on
      PyTorch with torch.set_num_threads(N) (and as many OpenBLAS threads), in float32 and in bfloat16
      (`model.to(torch.bfloat16)`), after a warm-up batch;
  (c) ONNX Runtime: the image tower and its projection exported by torch.onnx.export (opset 14, dynamic
      batch), the same processor's batches; intra-op threads N, sequential; float32, and the same model
      quantized by onnxruntime.quantization.quantize_dynamic (int8 weights; it needs the onnx package).
Agreement with transformers in float32 is printed as the minimum cosine over the images. It prints figures
and ratios and never fails on time; a missing piece is printed as such and the rest still runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import bench_common as common

BATCH = 32

REPOSITORY = common.REPOSITORY
sys.path.insert(0, str(REPOSITORY / "tests" / "model"))
sys.path.insert(0, str(REPOSITORY / "tests" / "tokenizer"))

if __name__ == "__main__":
    common.python_with(["torch", "numpy", "PIL", "transformers", "safetensors", "skimage"])
import numpy as np  # noqa: E402
import torch  # noqa: E402

import pretrained_support as support  # noqa: E402
from bench_pretrained import cpu_name, measure_and_print, ort_int8, ort_session  # noqa: E402


def clip_folder(workdir: Path) -> Path:
    """The CLIPModel folder, written once into the work folder."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizerFast

    import fixtures

    folder = workdir / "clip-vit-b-16"
    if (folder / "model.safetensors").exists():
        return folder
    tokenizer_folder = workdir / "clip-tokenizer"
    if not (tokenizer_folder / "tokenizer.json").exists():
        tokenizer_folder.mkdir(parents=True, exist_ok=True)
        fixtures.clip_bpe(tokenizer_folder, [])
    tokenizer = CLIPTokenizerFast.from_pretrained(str(tokenizer_folder))
    config = CLIPConfig(text_config=dict(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=2048,
                                         num_hidden_layers=1, num_attention_heads=8,
                                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id),
                        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                           num_attention_heads=12, image_size=224, patch_size=16,
                                           hidden_act="quick_gelu"),
                        projection_dim=512)
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_((parameter + 0.05 * torch.randn_like(parameter)).to(torch.bfloat16).float())
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def jpeg_files(workdir: Path, count: int) -> list:
    from PIL import Image
    from skimage import data

    folder = workdir / "images"
    folder.mkdir(parents=True, exist_ok=True)
    photos = [getattr(data, name)() for name in ("astronaut", "chelsea", "coffee", "rocket")]
    paths = []
    for index in range(count):
        path = folder / f"{index:04d}.jpg"
        if not path.exists():
            Image.fromarray(photos[index % len(photos)]).convert("RGB").save(path, quality=90)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------------
# The engines: each answers (images per second or None, note, embeddings of every image or None)


def write_manifest(path: Path, images: list) -> Path:
    import json

    path.write_text("".join(json.dumps({"image": str(image)}) + "\n" for image in images), encoding="utf-8")
    return path


def bench_uform(uform: Path, folder: Path, workdir: Path, images: list, threads: int, weights: str):
    import json

    manifest = write_manifest(workdir / "images.jsonl", images)
    one = write_manifest(workdir / "one.jsonl", images[:1])
    flags = ["--threads", str(threads), "--weights", weights]
    try:
        _, start_up = support.engine_run(str(uform), folder, one, [*flags, "--format", "f32"],
                                         stdout=subprocess.DEVNULL)
        best = min(support.engine_run(str(uform), folder, manifest, [*flags, "--format", "f32"],
                                      stdout=subprocess.DEVNULL)[1] for _ in range(2))
        done = subprocess.run([str(uform), "encode", "--model", str(folder), "--manifest", str(manifest), *flags],
                              capture_output=True, timeout=900)
        if done.returncode != 0:
            raise support.EngineRefused(done.stderr.decode(errors="replace"))
    except support.EngineRefused as error:
        return None, str(error).splitlines()[0][:160], None
    vectors = np.array([json.loads(line)["embedding"] for line in done.stdout.decode().splitlines()])
    return len(images) / best, f"one image: {start_up:.2f} s", vectors


def bench_package(build: Path, folder: Path, workdir: Path, images: list, threads: int, weights: str):
    """The engine's Python package from `build`, loaded, after a warm-up call, as the others are measured,
    in a process of its own (bench_common.package_rate)."""
    manifest = write_manifest(workdir / "images.jsonl", images)
    return common.package_rate("images", build, folder, manifest, threads, weights, workdir / "package.npy")


def processed(processor, paths: list):
    from PIL import Image

    return processor(images=[Image.open(path) for path in paths], return_tensors="pt")["pixel_values"]


def bench_torch(folder: Path, images: list, threads: int, dtype):
    from transformers import CLIPImageProcessor, CLIPModel

    common.torch_threads(threads)
    model = CLIPModel.from_pretrained(folder).eval()
    processor = CLIPImageProcessor.from_pretrained(folder)
    model.to(dtype)

    def embed(paths):
        with torch.no_grad():
            return model.get_image_features(pixel_values=processed(processor, paths).to(dtype)).float().numpy()

    try:
        embed(images[:BATCH])  # the warm-up
    except RuntimeError as error:
        return None, f"PyTorch {torch.__version__} cannot: {str(error).splitlines()[0][:120]}", None
    began = time.perf_counter()
    vectors = np.concatenate([embed(images[i : i + BATCH]) for i in range(0, len(images), BATCH)])
    return len(images) / (time.perf_counter() - began), "", vectors.astype(np.float64)


class ImageFeatures(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model.get_image_features(pixel_values=pixel_values)


def bench_ort(folder: Path, workdir: Path, images: list, threads: int, kind: str):
    from transformers import CLIPImageProcessor, CLIPModel

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None, "onnxruntime is not installed (pip install onnxruntime)", None
    path = workdir / "clip-vit-b-16-image.onnx"
    if not path.exists():
        model = ImageFeatures(CLIPModel.from_pretrained(folder).eval())
        with torch.no_grad():
            torch.onnx.export(model, (torch.zeros(2, 3, 224, 224),), str(path), input_names=["pixel_values"],
                              output_names=["image_embeds"], opset_version=14,
                              dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}})
    if kind == "int8":
        path, note = ort_int8(path)
        if path is None:
            return None, note, None
    processor = CLIPImageProcessor.from_pretrained(folder)
    session = ort_session(path, threads)

    def embed(paths):
        return session.run(None, {"pixel_values": processed(processor, paths).numpy()})[0]

    embed(images[:BATCH])  # the warm-up
    began = time.perf_counter()
    vectors = np.concatenate([embed(images[i : i + BATCH]) for i in range(0, len(images), BATCH)])
    return len(images) / (time.perf_counter() - began), "", vectors.astype(np.float64)


# ---------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--uform", help="the uform command (default: <build>/tools/uform)")
    parser.add_argument("--workdir", help="the model, the files and ONNX models (default: <build>/bench-clip-image)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    args = parser.parse_args()
    blas = common.torch_blas()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    uform = Path(args.uform or Path(args.build) / "tools" / "uform").absolute()
    workdir = Path(args.workdir or Path(args.build) / "bench-clip-image").absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    threads = [int(n) for n in args.threads.split(",")]
    folder = clip_folder(workdir)
    images = jpeg_files(workdir, args.images)
    try:
        import onnxruntime
        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "not installed"
    print(f"CPU: {cpu_name()} ({len(os.sched_getaffinity(0))} cores available); PyTorch {torch.__version__} "
          f"(float32 GEMMs on {blas}), ONNX Runtime {ort_version}")
    print(f"{folder}: CLIP ViT-B/16 image tower, random BF16-valued weights\n{len(images)} JPEG files "
          f"(scikit-image's photos, 300x451 to 512x512); batches of {BATCH} for PyTorch and ONNX Runtime")

    build = Path(args.build).absolute()
    # In bench_pretrained's order (measure_and_print's ratios and cosines read runs 0, 1 and 4).
    runs = [("uform, BF16 weights", lambda n: bench_package(build, folder, workdir, images, n, "bf16")),
            ("uform, I8 weights", lambda n: bench_package(build, folder, workdir, images, n, "i8")),
            ("uform encode, BF16 weights (end to end)",
             lambda n: bench_uform(uform, folder, workdir, images, n, "bf16")),
            ("uform encode, I8 weights (end to end)", lambda n: bench_uform(uform, folder, workdir, images, n, "i8")),
            ("transformers, PyTorch float32", lambda n: bench_torch(folder, images, n, torch.float32)),
            ("transformers, PyTorch bfloat16", lambda n: bench_torch(folder, images, n, torch.bfloat16)),
            ("ONNX Runtime float32", lambda n: bench_ort(folder, workdir, images, n, "float32")),
            ("ONNX Runtime int8 (quantize_dynamic)", lambda n: bench_ort(folder, workdir, images, n, "int8"))]
    measure_and_print(runs, threads, "images per second")
    print("\n'uform': the Python package, the model loaded and warmed up, as the others (in a process of its own; "
          "reading and decoding the files included); 'uform encode': end to end (a process per run: the folder's "
          "load included). The others exclude loading the model but include Pillow's decoding and the processor. "
          "The ratios are the package's. 'min cosine': against transformers in float32.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
