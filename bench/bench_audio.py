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
      in float32 (PyTorch's default; on the BLAS the header line names) and in bfloat16, eager
      (torch.set_num_threads(threads) and as many OpenBLAS threads), in the same batches.
torchaudio is not in Debian 12's PyTorch, hence the hand-made pipeline. (a) and (c) run again on the model
loaded with I8 weights (uform_weights_t). It prints figures and ratios and never fails on time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import bench_common as common

if __name__ == "__main__":
    common.python_with(["torch", "numpy"])
import numpy as np  # noqa: E402
import torch  # noqa: E402

import audio_reference as audio_ref  # noqa: E402
import harness  # noqa: E402

FRONT_END = {"rate": 16000, "mels": 64, "window": 400, "hop": 160, "patch_frames": 8, "seconds": 10.0}
FRONT_END["max_patches"] = (1 + (int(FRONT_END["rate"] * FRONT_END["seconds"]) - FRONT_END["window"])
                            // FRONT_END["hop"]) // FRONT_END["patch_frames"]


def write_checkpoint(tool: str, path: Path, seed: int) -> None:
    """The tool's base checkpoint with the audio front end of FRONT_END, its patch layer and positions
    redrawn to match, and its metadata to match."""
    hidden = 768
    common.write_redrawn_checkpoint(tool, path, seed, "audio", FRONT_END,
                                    {"audio.patch.weight": (hidden, FRONT_END["mels"] * FRONT_END["patch_frames"]),
                                     "audio.pos": (1 + FRONT_END["max_patches"], hidden)})


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


def resample_fft(x: np.ndarray, source: int, target: int) -> np.ndarray:
    """Band-limited resampling through the FFT (what scipy.signal.resample does), float32."""
    count = len(x) * target // source
    spectrum = np.fft.rfft(x)
    keep = min(len(spectrum), count // 2 + 1)
    out = np.zeros(count // 2 + 1, dtype=np.complex128)
    out[:keep] = spectrum[:keep]
    return (np.fft.irfft(out, n=count) * (count / len(x))).astype(np.float32)


def bench_torch(checkpoint, paths, batch, threads, min_seconds, dtype):
    common.torch_threads(threads)
    tower = audio_ref.load_audio_tower(str(checkpoint), dtype)
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

    def embed(group):
        rows = torch.stack([rows_of(path) for path in group]).to(dtype)
        tokens = tower.patch(rows)
        cls = tower.cls.expand(rows.shape[0], 1, -1)
        states = tower.trunk(torch.cat((cls, tokens), dim=1) + tower.pos[: 1 + patches])
        return tower.embed_states(states[:, 0])

    return common.torch_rate(paths, batch, min_seconds, embed)


def encode_files(engine, model, group, arena, executor):
    return engine.encode_sounds(model, group, arena, kind="files", outputs=harness.OUTPUT_EMBEDDINGS, executor=executor)


def encode_samples(engine, model, group, arena, executor):
    return engine.encode_sounds(model, group, arena, rate=FRONT_END["rate"], outputs=harness.OUTPUT_EMBEDDINGS,
                                executor=executor)


def main(argv=None) -> int:
    args = common.arguments(__doc__, "audio", ("clips", 16), 8, argv,
                            extra=[(("--seconds",), {"type": float, "default": 12.0,
                                                     "help": "length of each clip (the model reads 10 s)"}),
                                   (("--rate",), {"type": int, "default": 44100, "help": "of the WAV files"})])
    checkpoint = args.workdir / f"base-audio-d12-h768-m{FRONT_END['mels']}-p{FRONT_END['patch_frames']}-seed{args.seed}.safetensors"
    write_checkpoint(args.tiny_checkpoint_tool, checkpoint, args.seed)
    paths = write_clips(args.workdir / f"wav-{args.rate}-{args.seconds:g}s", args.clips, args.seconds, args.rate,
                        args.seed)
    samples = [resample_fft(audio_ref.wav_samples(p.read_bytes())[0], args.rate, FRONT_END["rate"])
               [: int(FRONT_END["rate"] * FRONT_END["seconds"])] for p in paths]
    print(f"checkpoint {checkpoint.name}: audio depth 12, hidden 768, mlp 3072, {FRONT_END['rate']} Hz, "
          f"{FRONT_END['mels']} mels, window {FRONT_END['window']}, hop {FRONT_END['hop']}, "
          f"{FRONT_END['patch_frames']} frames per patch, {FRONT_END['max_patches']} patches")
    print(f"{len(paths)} stereo PCM16 WAV files of {args.seconds:g} s at {args.rate} Hz, batches of {args.batch}, "
          f"{args.threads} threads, PyTorch {torch.__version__} (float32 GEMMs on {common.torch_blas()})")
    common.compare_stages(args, checkpoint, paths, samples, encode_files, encode_samples,
                          common.stage_labels(("resample", "log-mel"), "samples at 16 kHz: log-mel and tower"),
                          "clips", "numpy + PyTorch", bench_torch, "PyTorch in {dtype}, FFT resampling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
