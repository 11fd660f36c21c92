#!/usr/bin/env python3
"""Clips per second of the C engine's audio tower, end to end and by stage, beside a numpy plus PyTorch
pipeline on the same weights.

    python3 bench/bench_audio.py --build build [--threads 2] [--clips 16] [--seconds 12] [--rate 44100]

On one base-sized audio checkpoint (depth 12, hidden 768, mlp 3072: the tiny checkpoint tool's base
tower, seed 3, with its front end set to 16 kHz, 64 mels, window 400, hop 160, 8 frames per patch, 10
seconds, 124 patches, and its patch layer and positions redrawn to match), with the same weights and
threads everywhere, over a folder of seeded stereo PCM16 WAV files at --rate, each engine over whole
passes for at least --min-seconds after one warm-up pass:
  (a) end to end: uform_audio_encode over the files' paths (read through the ring, demux, decode,
      downmix, resample to 16 kHz, cut at 10 s, log-mel, the tower), embeddings, F32;
  (b) decode only: the same calls' own stage timings, clips / (read_ns + decode_ns): reading,
      decoding, resampling and the log-mel front end, on all threads;
  (c) encode only: uform_audio_encode_samples on mono samples already at 16 kHz and 10 s (front end
      and tower, no decoding or resampling), in the same batches;
  (d) numpy plus PyTorch: the WAV parsed by numpy, the channels averaged, resampled by an FFT
      (numpy.fft, band-limited), torch.stft and the mel filters in float32, and the reference's tower
      in bfloat16 eager (torch.set_num_threads(threads)), in the same batches.
torchaudio is not in Debian 12's PyTorch, hence the hand-made pipeline. It prints figures and ratios and
never fails on time.
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


def _interpreter_with_torch() -> None:
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    if not os.environ.get("UFORM_REFERENCE_REEXEC"):
        here = os.path.realpath(sys.executable)
        for candidate in (REPOSITORY / ".venv" / "bin" / "python3", Path("/usr/bin/python3")):
            if candidate.exists() and os.path.realpath(candidate) != here and \
                    subprocess.run([str(candidate), "-c", "import torch, numpy"], capture_output=True).returncode == 0:
                os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, "UFORM_REFERENCE_REEXEC": "1"})
    print("PyTorch cannot be imported: nothing to compare with")
    sys.exit(0)


if __name__ == "__main__":
    _interpreter_with_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(REFERENCE))
import audio_reference as audio_ref  # noqa: E402
import test_audio_reference as audio_harness  # noqa: E402
import test_text_reference as harness  # noqa: E402
import uform_reference as ref  # noqa: E402

FRONT_END = {"rate": 16000, "mels": 64, "window": 400, "hop": 160, "patch_frames": 8, "seconds": 10.0}
FRONT_END["max_patches"] = (1 + (int(FRONT_END["rate"] * FRONT_END["seconds"]) - FRONT_END["window"])
                            // FRONT_END["hop"]) // FRONT_END["patch_frames"]


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
    """The tool's base checkpoint with the audio front end of FRONT_END, its patch layer and positions
    redrawn to match (std 0.02, BF16), and its metadata to match."""
    base = path.with_suffix(".tool.safetensors")
    subprocess.run([tool, str(base), "--depth", "12", "--hidden", "768", "--mlp", "3072", "--seed", str(seed)],
                   check=True, capture_output=True)
    blob = base.read_bytes()
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8 : 8 + length])
    metadata = header.pop("__metadata__")
    config = json.loads(metadata["uform"])
    config["audio"].update(FRONT_END)
    metadata["uform"] = json.dumps(config)
    hidden = int(config["audio"]["hidden"])
    rng = np.random.default_rng(seed)
    redrawn = {"audio.patch.weight": (hidden, FRONT_END["mels"] * FRONT_END["patch_frames"]),
               "audio.pos": (1 + FRONT_END["max_patches"], hidden)}
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


def write_clips(folder: Path, count: int, seconds: float, rate: int, seed: int) -> list:
    """Stereo PCM16 WAV files: tones, glides and noise, different per clip."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    n = int(seconds * rate)
    t = np.arange(n) / rate
    for i in range(count):
        path = folder / f"clip-{i:04d}.wav"
        paths.append(path)
        if path.exists():
            continue
        f1, f2 = rng.uniform(100, 900), rng.uniform(1000, 6000)
        left = 0.3 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * (f2 * t + 50 * t * t))
        right = 0.3 * np.sin(2 * np.pi * f1 * 1.5 * t) + 0.05 * rng.standard_normal(n)
        path.write_bytes(audio_ref.wav_bytes(np.stack([left, right], axis=1), rate, channels=2))
    return paths


def groups(items: list, size: int) -> list:
    return [items[i : i + size] for i in range(0, len(items), size)]


def bench_uform(library, checkpoint, paths, samples, batch, threads, min_seconds):
    engine = harness.Engine(library)
    audio = audio_harness.AudioEngine(engine)
    executor = engine.ram_executor(threads)
    arena = engine.arena(executor)
    model = engine.load(str(checkpoint), executor)
    stages = {"read_ns": 0, "decode_ns": 0, "compute_ns": 0, "items": 0}
    embeddings = audio_harness.OUTPUT_EMBEDDINGS
    try:
        def end_to_end():
            for group in groups(paths, batch):
                result = audio.encode(model, group, arena, kind="files", outputs=embeddings, executor=executor)
                stats = result["stats"]
                for key in ("read_ns", "decode_ns", "compute_ns"):
                    stages[key] += getattr(stats, key)
                stages["items"] += stats.items - stats.failed

        def encode_only():
            for group in groups(samples, batch):
                audio.encode(model, group, arena, rate=FRONT_END["rate"], outputs=embeddings, executor=executor)

        first = audio.encode(model, paths[:batch], arena, kind="files", outputs=embeddings,
                             executor=executor)["embeddings"]["values"]
        e2e = len(paths) / measure(end_to_end, min_seconds)
        decode = stages["items"] / ((stages["read_ns"] + stages["decode_ns"]) * 1e-9)
        compute = stages["items"] / (stages["compute_ns"] * 1e-9)
        encode = len(samples) / measure(encode_only, min_seconds)
        return e2e, decode, compute, encode, first
    finally:
        engine.library.uform_model_free(model)
        engine.library.uform_arena_free(arena)
        engine.library.uform_executor_free(executor)


def resample_fft(x: np.ndarray, source: int, target: int) -> np.ndarray:
    """Band-limited resampling through the FFT (what scipy.signal.resample does), float32."""
    count = len(x) * target // source
    spectrum = np.fft.rfft(x)
    keep = min(len(spectrum), count // 2 + 1)
    out = np.zeros(count // 2 + 1, dtype=np.complex128)
    out[:keep] = spectrum[:keep]
    return (np.fft.irfft(out, n=count) * (count / len(x))).astype(np.float32)


def bench_torch(checkpoint, paths, batch, threads, min_seconds):
    torch.set_num_threads(threads)
    tower = audio_ref.load_audio_tower(str(checkpoint), torch.bfloat16)
    filters = torch.from_numpy(audio_ref.mel_filters(tower.rate, tower.mels, tower.window).T.astype(np.float32))
    window = torch.hann_window(tower.window, periodic=True)
    patches = tower.max_patches
    frames = patches * tower.patch_frames

    def rows_of(path):
        samples, rate = audio_ref.wav_samples(Path(path).read_bytes())
        clip = torch.from_numpy(resample_fft(samples, rate, tower.rate)[: tower.reach])
        spectrum = torch.stft(clip, n_fft=tower.window, hop_length=tower.hop, win_length=tower.window, window=window,
                              center=False, return_complex=True)[:, :frames]
        log_mel = torch.log10(torch.clamp((spectrum.abs() ** 2).T @ filters, min=audio_ref.LOG_FLOOR))
        return log_mel.reshape(patches, tower.patch_frames * tower.mels)

    def run():
        embeddings = []
        with torch.inference_mode():
            for group in groups(paths, batch):
                rows = torch.stack([rows_of(path) for path in group]).to(torch.bfloat16)
                tokens = tower.patch(rows)
                cls = tower.cls.expand(rows.shape[0], 1, -1)
                states = tower.trunk(torch.cat((cls, tokens), dim=1) + tower.pos[: 1 + patches])
                embeddings.append(tower.embed_states(states[:, 0]).float().numpy())
        return np.concatenate(embeddings)

    first = run()[:batch]
    return len(paths) / measure(run, min_seconds), first


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--workdir", help="checkpoint and clips (default: <build>/bench-audio)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="clips per call, for every engine")
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each clip (the model reads 10 s)")
    parser.add_argument("--rate", type=int, default=44100, help="of the WAV files")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    build = Path(args.build)
    library, tool = str(build / "libuform.so"), str(build / "src" / "tools" / "uform_tiny_checkpoint")
    workdir = Path(args.workdir or build / "bench-audio")
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / f"base-audio-d12-h768-m{FRONT_END['mels']}-p{FRONT_END['patch_frames']}-seed{args.seed}.safetensors"
    if not checkpoint.exists():
        write_checkpoint(tool, checkpoint, args.seed)
    paths = write_clips(workdir / f"wav-{args.rate}-{args.seconds:g}s", args.clips, args.seconds, args.rate, args.seed)
    samples = [resample_fft(audio_ref.wav_samples(p.read_bytes())[0], args.rate, FRONT_END["rate"])
               [: int(FRONT_END["rate"] * FRONT_END["seconds"])] for p in paths]
    print(f"checkpoint {checkpoint.name}: audio depth 12, hidden 768, mlp 3072, {FRONT_END['rate']} Hz, "
          f"{FRONT_END['mels']} mels, window {FRONT_END['window']}, hop {FRONT_END['hop']}, "
          f"{FRONT_END['patch_frames']} frames per patch, {FRONT_END['max_patches']} patches")
    print(f"{len(paths)} stereo PCM16 WAV files of {args.seconds:g} s at {args.rate} Hz, batches of {args.batch}, "
          f"{args.threads} threads, PyTorch {torch.__version__}")
    e2e, decode, compute, encode, first = bench_uform(library, checkpoint, [str(p) for p in paths], samples,
                                                      args.batch, args.threads, args.min_seconds)
    rows = [("uform end to end (files: read, decode, resample, log-mel, tower)", e2e),
            ("uform decode only (read + decode + resample + log-mel stages)", decode),
            ("uform tower stage of the end-to-end calls", compute),
            ("uform encode only (samples at 16 kHz: log-mel and tower)", encode)]
    torch_rate = None
    if not args.no_torch:
        torch_rate, torch_first = bench_torch(checkpoint, [str(p) for p in paths], args.batch, args.threads,
                                              args.min_seconds)
        rows.append(("numpy + PyTorch eager bfloat16", torch_rate))
        cosine = harness.cosines(first, torch_first)
        print(f"agreement, first batch: min cosine {cosine.min():.5f} (PyTorch in bfloat16, FFT resampling)")
    print()
    for name, rate in rows:
        print(f"  {name:<66} {rate:8.2f} clips/s")
    print()
    print(f"  end to end / encode only:             {e2e / encode:.2f}")
    if torch_rate:
        print(f"  end to end / numpy + PyTorch:         {e2e / torch_rate:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
