#!/usr/bin/env python3
"""Texts and images per second on a GPU: UForm's VRAM executor beside PyTorch bf16 on the same weights.

    python3 bench/bench_gpu.py --build build-gpu [--out FILE] [--batches 1,64,1024] [--seconds 3]

Writes one base-sized checkpoint with the tiny checkpoint tool (depth 12, hidden 768, mlp 3072,
context 256 bytes, images 224 x 224 in patches of 16), runs `<build>/bench/bench_vram` on it for texts
(which also writes the texts it used, 64 to 256 printable bytes each) and for images (RGB8 240 x 320,
resized and cropped on the device; it writes the pixels), then runs the independent PyTorch reference
(tests/reference/uform_reference.py) on the GPU in bfloat16 over the same inputs, texts padded per
batch as PyTorch users do, images preprocessed on the GPU (F.interpolate with antialias) from the
same host pixels:
  - "torch eager": the reference as written (attention as matmul, mask, softmax, matmul);
  - "torch sdpa":  the same with F.scaled_dot_product_attention (flash/efficient kernels), the stronger
                   baseline a careful PyTorch user would write.
Prints a table of texts/s and p50 latency per batch size with the ratios, and the cosine between the
engine's embeddings and PyTorch's for the largest batch. Figures only: nothing passes or fails on time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY / "tests" / "reference"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import export_onnx  # noqa: E402
import uform_reference as ref  # noqa: E402


def run_engine(build: Path, checkpoint: Path, workdir: Path, batches: str, seconds: float,
               images: bool = False) -> tuple[list, list, np.ndarray | None]:
    """Answers (records, texts or pixels [N, 240, 320, 3], the embeddings of the largest batch)."""
    kind = "images" if images else "texts"
    texts_path, embeddings_path = workdir / "texts.txt", workdir / f"embeddings-{kind}.f32"
    pixels_path = workdir / "pixels.u8"
    command = [str(build / "bench" / "bench_vram"), str(checkpoint), "--batches", batches, "--seconds", str(seconds),
               "--texts-out", str(texts_path), "--embeddings-out", str(embeddings_path)]
    if images:
        command += ["--images", "--pixels-out", str(pixels_path)]
    ran = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(ran.stderr)
    if ran.returncode != 0:
        raise SystemExit(f"bench_vram failed ({ran.returncode}): {ran.stderr.strip()}")
    records = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    embeddings = np.fromfile(embeddings_path, dtype=np.float32) if embeddings_path.exists() else None
    if images:
        return records, np.fromfile(pixels_path, dtype=np.uint8).reshape(-1, 240, 320, 3), embeddings
    texts = [line.encode() for line in texts_path.read_text().splitlines()]
    return records, texts, embeddings


def sdpa_attention(q, k, v, causal, key_padding=None):
    if key_padding is not None:
        mask = ~key_padding[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@contextlib.contextmanager
def reference_attention(sdpa: bool):
    """The reference with its attention as written, or through F.scaled_dot_product_attention."""
    eager = ref.attention
    if sdpa:
        ref.attention = sdpa_attention
    try:
        yield
    finally:
        ref.attention = eager


def time_batches(batches: list, seconds: float, prepare) -> tuple[list, np.ndarray]:
    """For each batch size, `prepare(batch)` answers a call that encodes that batch on the GPU: two
    warm-up calls, then calls until `seconds` have passed (at least 5), each synchronized. Answers a
    record per batch size and the last call's output."""
    records, last = [], None
    with torch.inference_mode():
        for batch in batches:
            encode = prepare(batch)
            for _ in range(2):
                out = encode()
            torch.cuda.synchronize()
            latencies, start = [], time.perf_counter()
            while len(latencies) < 5 or time.perf_counter() - start < seconds:
                begin = time.perf_counter()
                out = encode()
                torch.cuda.synchronize()
                latencies.append(time.perf_counter() - begin)
            elapsed = time.perf_counter() - start
            records.append({"batch": batch, "items_per_second": batch * len(latencies) / elapsed,
                            "p50_us": statistics.median(latencies) * 1e6})
            last = out.float().cpu().numpy()
    return records, last


def run_torch(checkpoint: Path, texts: list, batches: list, seconds: float, sdpa: bool) -> tuple[list, np.ndarray]:
    with reference_attention(sdpa):
        model = ref.Reference(str(checkpoint), torch.bfloat16)
        embedder = export_onnx.TextEmbedder(model.text).eval().cuda()

        def prepare(batch):
            ids, index = export_onnx.make_batch(texts[:batch], model.text.context)
            ids, index = torch.from_numpy(ids).cuda(), torch.from_numpy(index).cuda()
            return lambda: embedder(ids, index)

        return time_batches(batches, seconds, prepare)


def run_torch_images(checkpoint: Path, pixels: np.ndarray, batches: list, seconds: float, sdpa: bool):
    with reference_attention(sdpa):
        model = ref.Reference(str(checkpoint), torch.bfloat16)
        tower = model.image.cuda()
        height, width = pixels.shape[1:3]
        out_height, out_width = ref.resized_size(height, width, tower.size)
        top, left = (out_height - tower.size) // 2, (out_width - tower.size) // 2
        mean, std = tower.mean.float()[:, None, None], tower.std.float()[:, None, None]

        def encode(host):
            x = host.cuda().permute(0, 3, 1, 2).float() / 255.0
            x = F.interpolate(x, size=(out_height, out_width), mode="bilinear", align_corners=False, antialias=True)
            x = ((x[:, :, top : top + tower.size, left : left + tower.size] - mean) / std).to(torch.bfloat16)
            return tower.embed_states(tower(x)[:, 0])

        def prepare(batch):
            host = torch.from_numpy(pixels[:batch])
            return lambda: encode(host)

        return time_batches(batches, seconds, prepare)


def report(kind: str, batches: list, engine: list, engine_embeddings, baselines: dict) -> list:
    """Lines of one table: the engine beside each baseline, with ratios and cosines."""
    results = {"uform": {r["batch"]: r for r in engine if "batch" in r}}
    lines, cosines = [], {}
    for name, outcome in baselines.items():
        if isinstance(outcome, str):
            lines.append(f"# {name}: failed: {outcome}")
            continue
        records, embeddings = outcome
        results[name] = {r["batch"]: r for r in records}
        if engine_embeddings is not None and embeddings is not None:
            mine = engine_embeddings.reshape(embeddings.shape)
            dots = (mine * embeddings).sum(1) / (np.linalg.norm(mine, axis=1) * np.linalg.norm(embeddings, axis=1))
            cosines[name] = (float(dots.min()), float(dots.mean()))
    header = f"{'batch':>6} | {'uform ' + kind + '/s':>15} {'p50 us':>10} |"
    for name in results:
        if name != "uform":
            header += f" {name + ' ' + kind + '/s':>24} {'p50 us':>10} {'uform/' + name.split()[1]:>12} |"
    lines.append(header)
    for batch in batches:
        mine = results["uform"].get(batch)
        if not mine:
            continue
        row = f"{batch:>6} | {mine['items_per_second']:>15.1f} {mine['p50_us']:>10.1f} |"
        for name, records in results.items():
            theirs = records.get(batch) if name != "uform" else None
            if theirs:
                ratio = mine["items_per_second"] / theirs["items_per_second"]
                row += f" {theirs['items_per_second']:>24.1f} {theirs['p50_us']:>10.1f} {ratio:>11.2f}x |"
        lines.append(row)
    for name, (worst, mean) in cosines.items():
        lines.append(f"# cosine uform vs {name} (bf16), {kind}, batch {batches[-1]}: min {worst:.5f}, mean {mean:.5f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(REPOSITORY / "build"))
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--batches", default="1,64,1024")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--mlp", type=int, default=3072)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--no-images", action="store_true", help="texts only")
    args = parser.parse_args()
    build = Path(args.build)
    workdir = build / "bench-gpu"
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / f"base-d{args.depth}-h{args.hidden}.safetensors"
    subprocess.run([str(build / "src" / "tools" / "uform_tiny_checkpoint"), str(checkpoint), "--depth", str(args.depth),
                    "--hidden", str(args.hidden), "--mlp", str(args.mlp), "--context", str(args.context), "--seed", "1",
                    "--image-size", "224", "--image-patch", "16"],
                   check=True)
    batches = [int(b) for b in args.batches.split(",")]
    lines = [f"# on {torch.cuda.get_device_name(0)}, depth {args.depth} hidden {args.hidden} mlp {args.mlp}; texts of "
             f"64..256 bytes (context {args.context}); images 240x320 RGB8 -> 224, patch 16; torch {torch.__version__}"]
    engine, texts, engine_embeddings = run_engine(build, checkpoint, workdir, args.batches, args.seconds)
    load = [r for r in engine if "load_ms" in r]
    if load:
        lines.append(f"# uform load_vram of the checkpoint: {load[0]['load_ms']:.1f} ms")
    baselines = {}
    for name, sdpa in (("torch eager", False), ("torch sdpa", True)):
        try:
            baselines[name] = run_torch(checkpoint, texts, batches, args.seconds, sdpa)
        except Exception as error:  # a baseline that cannot run is reported, not fatal
            baselines[name] = str(error)
    lines += report("texts", batches, engine, engine_embeddings, baselines)
    if not args.no_images:
        engine, pixels, engine_embeddings = run_engine(build, checkpoint, workdir, args.batches, args.seconds, images=True)
        baselines = {}
        for name, sdpa in (("torch eager", False), ("torch sdpa", True)):
            try:
                baselines[name] = run_torch_images(checkpoint, pixels, batches, args.seconds, sdpa)
            except Exception as error:
                baselines[name] = str(error)
        lines += report("images", batches, engine, engine_embeddings, baselines)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "a") as file:
            file.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
