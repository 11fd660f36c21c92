#!/usr/bin/env python3
"""Texts, images, clips and sounds per second on a GPU: UForm's VRAM executor beside PyTorch bf16 on the same
weights.

    python3 bench/bench_gpu.py --build build-gpu [--out FILE] [--batches 1,64,1024] [--seconds 3]

Writes one base-sized checkpoint with the tiny checkpoint tool (depth 12, hidden 768, mlp 3072 in every
tower, context 256 bytes, images 224 x 224 in patches of 16; clips of the tool's 4 frames, sounds at 16 kHz
of its 2 seconds), runs `<build>/bench/bench_vram` on it for each kind, then the independent PyTorch
reference (tests/reference/uform_reference.py, audio_reference.py) on the GPU in bfloat16 over the same
inputs:
  - texts (64 to 256 printable bytes each), padded per batch as PyTorch users do;
  - images from pixels (RGB8 240 x 320, resized and cropped on the device by uform; PyTorch preprocesses on
    the GPU with F.interpolate and antialias from the same host pixels);
  - images from JPEG files end to end (the same pixels written by Pillow at quality 95; read, decoded and
    encoded by uform): beside PyTorch on the decoded pixels, and as a share of uform's own pixels rate;
  - clips (MP4 written by `uform dataset synth`, decoded by uform end to end): PyTorch runs the image tower
    on the clips' sampled frames already decoded (by OpenCV, where it is there) and pools them;
  - sounds (F32 samples at the model's rate): PyTorch computes the log-mel front end on the GPU (torch.stft)
    and runs the audio tower; uform computes it on the host, overlapped with the device.
Each with its attention as the reference writes it ("torch eager": matmul, mask, softmax, matmul) and
through F.scaled_dot_product_attention ("torch sdpa", the stronger baseline). Prints a table per kind of
items/s and p50 latency per batch size with the ratios, and the cosine between the engine's embeddings and
PyTorch's for the largest batch where both had the same inputs. Figures only: nothing passes or fails on
time.
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


def run_engine(build: Path, checkpoint: Path, workdir: Path, batches: str, seconds: float, kind: str,
               extra: list) -> tuple[list, np.ndarray | None]:
    """bench_vram over one kind of items: its records, and the embeddings of the largest batch."""
    embeddings_path = workdir / f"embeddings-{kind}.f32"
    command = [str(build / "bench" / "bench_vram"), str(checkpoint), "--batches", batches, "--seconds", str(seconds),
               "--embeddings-out", str(embeddings_path)] + extra
    ran = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(ran.stderr)
    if ran.returncode != 0:
        raise RuntimeError(f"bench_vram {kind} failed ({ran.returncode}): {ran.stderr.strip()[-300:]}")
    records = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    embeddings = np.fromfile(embeddings_path, dtype=np.float32) if embeddings_path.exists() else None
    return records, embeddings


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
        tower = ref.Reference(str(checkpoint), torch.bfloat16).image.cuda()

        def prepare(batch):
            host = torch.from_numpy(pixels[:batch])
            return lambda: tower.embed_states(tower(preprocess_images(tower, host))[:, 0])

        return time_batches(batches, seconds, prepare)


def preprocess_images(tower, host: torch.Tensor) -> torch.Tensor:
    """uint8 [N, H, W, 3] on the host -> the tower's input on the GPU, as the engine's convention does it."""
    height, width = host.shape[1:3]
    out_height, out_width = ref.resized_size(height, width, tower.size)
    top, left = (out_height - tower.size) // 2, (out_width - tower.size) // 2
    mean, std = tower.mean.float()[:, None, None], tower.std.float()[:, None, None]
    x = host.cuda().permute(0, 3, 1, 2).float() / 255.0
    x = F.interpolate(x, size=(out_height, out_width), mode="bilinear", align_corners=False, antialias=True)
    return ((x[:, :, top : top + tower.size, left : left + tower.size] - mean) / std).to(torch.bfloat16)


def run_torch_clips(checkpoint: Path, frames: np.ndarray, per_clip: int, batches: list, seconds: float, sdpa: bool):
    """`frames` uint8 [clips * per_clip, H, W, 3], each clip's sampled frames in order: the image tower on
    every frame, then each clip's embedding the normalized mean of its frames'."""
    with reference_attention(sdpa):
        tower = ref.Reference(str(checkpoint), torch.bfloat16).image.cuda()
        clips = frames.shape[0] // per_clip

        def prepare(batch):
            picks = np.arange(batch) % clips
            host = torch.from_numpy(frames.reshape(clips, per_clip, *frames.shape[1:])[picks].reshape(-1, *frames.shape[1:]))

            def encode():
                embedded = tower.embed_states(tower(preprocess_images(tower, host))[:, 0]).float()
                return ref.l2_normalize(embedded.reshape(batch, per_clip, -1).mean(dim=1))

            return encode

        return time_batches(batches, seconds, prepare)


def run_torch_sounds(checkpoint: Path, samples: np.ndarray, batches: list, seconds: float, sdpa: bool):
    """`samples` float32 [N, length] at the model's rate: the log-mel front end on the GPU (torch.stft in
    float32), patches, the audio tower, the class token's projection."""
    import audio_reference

    with reference_attention(sdpa):
        tower = audio_reference.load_audio_tower(str(checkpoint), torch.bfloat16).cuda()
        filters = torch.from_numpy(audio_reference.mel_filters(tower.rate, tower.mels, tower.window)).float().cuda()
        window = torch.hann_window(tower.window, periodic=True, device="cuda")
        reach = min(samples.shape[1], tower.reach)
        patches = min(audio_reference.frame_count(reach, tower.window, tower.hop) // tower.patch_frames, tower.max_patches)
        frames = patches * tower.patch_frames

        def prepare(batch):
            host = torch.from_numpy(samples[:batch, :reach])

            def encode():
                x = host.cuda()
                spectrum = torch.stft(x, n_fft=tower.window, hop_length=tower.hop, win_length=tower.window, window=window,
                                      center=False, onesided=True, return_complex=True)[:, :, :frames]
                mel = (spectrum.abs() ** 2).transpose(1, 2) @ filters.T  # [B, frames, mels]
                rows = torch.log10(torch.clamp(mel, min=audio_reference.LOG_FLOOR))
                rows = rows.reshape(batch, patches, tower.patch_frames * tower.mels).to(torch.bfloat16)
                tokens = tower.patch(rows)
                cls = tower.cls[None, None].expand(batch, 1, -1)
                x = torch.cat((cls, tokens), dim=1) + tower.pos[: 1 + patches]
                return tower.embed_states(tower.trunk(x)[:, 0])

            return encode

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


def baselines_of(run, *arguments) -> dict:
    """Each PyTorch baseline's records and embeddings, or the reason it could not run."""
    outcome = {}
    for name, sdpa in (("torch eager", False), ("torch sdpa", True)):
        try:
            outcome[name] = run(*arguments, sdpa)
        except Exception as error:  # a baseline that cannot run is reported, not fatal
            outcome[name] = f"{type(error).__name__}: {error}"
    return outcome


def write_jpegs(pixels: np.ndarray, folder: Path, count: int) -> Path:
    """The first `count` images as JPEG files (Pillow, quality 95); answers the list of their paths."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(min(count, pixels.shape[0])):
        path = folder / f"image-{i:05d}.jpg"
        Image.fromarray(pixels[i]).save(path, quality=95)
        paths.append(str(path))
    listing = folder / "list.txt"
    listing.write_text("\n".join(paths) + "\n")
    return listing


def write_clips(build: Path, folder: Path, count: int, size: int, frames: int) -> tuple[Path, list]:
    """`count` MP4 clips by `uform dataset synth`; answers the list of their paths and the paths."""
    subprocess.run([str(build / "tools" / "uform"), "dataset", "synth", "--out", str(folder), "--force", "--images", "0",
                    "--videos", str(count), "--sounds", "0", "--seed", "3", "--image-size", str(size),
                    "--video-frames", str(frames)], check=True, capture_output=True)
    paths = sorted(str(path) for path in (folder / "media").glob("*.mp4"))
    listing = folder / "list.txt"
    listing.write_text("\n".join(paths) + "\n")
    return listing, paths


def sampled_frames(paths: list, per_clip: int, size: int) -> np.ndarray:
    """Each clip's sampled frames (docs/DESIGN.md's times), decoded by OpenCV: uint8 [clips * per_clip, H, W, 3];
    random frames of size x size where OpenCV is not there (the figures stand; the cosine does not)."""
    try:
        import cv2
    except ImportError:
        return np.random.default_rng(0).integers(0, 256, (len(paths) * per_clip, size, size, 3), dtype=np.uint8)
    out = []
    for path in paths:
        capture = cv2.VideoCapture(path)
        decoded = []
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            decoded.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        fps = capture.get(cv2.CAP_PROP_FPS) or 8.0
        times = [i / fps for i in range(len(decoded))]
        out += [decoded[i] for i in ref.video_samples(times, len(decoded) / fps, per_clip)]
    return np.stack(out)


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
    parser.add_argument("--kinds", default="texts,pixels,jpeg,clips,sounds", help="which kinds of items to run")
    args = parser.parse_args()
    build = Path(args.build)
    workdir = build / "bench-gpu"
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / f"base-d{args.depth}-h{args.hidden}.safetensors"
    subprocess.run([str(build / "tools" / "uform_tiny_checkpoint"), str(checkpoint), "--depth", str(args.depth),
                    "--hidden", str(args.hidden), "--mlp", str(args.mlp), "--context", str(args.context), "--seed", "1",
                    "--image-size", "224", "--image-patch", "16"],
                   check=True)
    config = json.loads(ref.read_safetensors(str(checkpoint), prefixes=("text.",))[1]["uform"])
    batches = [int(b) for b in args.batches.split(",")]
    kinds = args.kinds.split(",")
    per_clip, rate = int(config["video"]["frames"]), int(config["audio"]["rate"])
    lines = [f"# on {torch.cuda.get_device_name(0)}, depth {args.depth} hidden {args.hidden} mlp {args.mlp}; texts of "
             f"64..256 bytes (context {args.context}); images 240x320 RGB8 -> 224, patch 16; clips of {per_clip} frames "
             f"of 256x256; sounds of 2 s at {rate} Hz; torch {torch.__version__}"]

    def measure(kind, extra, baseline=None, inputs=None, compare=True):
        """bench_vram over `kind`, then each PyTorch baseline over inputs() (read after the engine wrote
        them), and the table; answers the engine's records (None when it could not run)."""
        try:
            records, embeddings = run_engine(build, checkpoint, workdir, args.batches, args.seconds, kind, extra)
        except RuntimeError as error:
            lines.append(f"# {kind}: {error}")
            return None
        baselines = baselines_of(baseline, *inputs(), batches, args.seconds) if baseline else {}
        lines.extend(report(kind, batches, records, embeddings if compare else None, baselines))
        return records

    texts_path, pixels_path, samples_path = workdir / "texts.txt", workdir / "pixels.u8", workdir / "samples.f32"
    if "texts" in kinds:
        measure("texts", ["--texts-out", str(texts_path)], run_torch,
                lambda: (checkpoint, [line.encode() for line in texts_path.read_text().splitlines()]))
    pixel_rates = {}
    if "pixels" in kinds or "jpeg" in kinds:
        records = measure("pixels", ["--images", "--pixels-out", str(pixels_path)], run_torch_images,
                          lambda: (checkpoint, np.fromfile(pixels_path, dtype=np.uint8).reshape(-1, 240, 320, 3)))
        pixel_rates = {r["batch"]: r["items_per_second"] for r in records or [] if "batch" in r}
    if "jpeg" in kinds and pixel_rates:
        pixels = np.fromfile(pixels_path, dtype=np.uint8).reshape(-1, 240, 320, 3)
        listing = write_jpegs(pixels, workdir / "jpeg", 256)
        records = measure("image files", ["--files", str(listing), "--kind", "images"], run_torch_images,
                          lambda: (checkpoint, pixels), compare=False)
        for record in records or []:
            if record.get("batch") in pixel_rates:
                lines.append(f"# JPEG files end to end at batch {record['batch']}: "
                             f"{record['items_per_second'] / pixel_rates[record['batch']]:.0%} of the rate of pixels "
                             f"already decoded")
    if "clips" in kinds:
        listing, paths = write_clips(build, workdir / "clips", 64, 256, 2 * per_clip)
        measure("clips", ["--files", str(listing), "--kind", "clips"], run_torch_clips,
                lambda: (checkpoint, sampled_frames(paths, per_clip, 256), per_clip))
    if "sounds" in kinds:
        extra = ["--samples", "--samples-out", str(samples_path), "--sample-rate", str(rate), "--sample-seconds", "2"]
        measure("sounds", extra, run_torch_sounds,
                lambda: (checkpoint, np.fromfile(samples_path, dtype=np.float32).reshape(max(batches), -1)))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "a") as file:
            file.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
