"""The audio tower of UForm's format-4 model in PyTorch and numpy, written from docs/DESIGN.md and the audio
verbs' contract in include/uform.h, beside the text and image towers of uform_reference.py (whose
`Transformer` trunk, checkpoint reader and BF16 helpers it uses unchanged).

The front end takes samples already at the model's `rate` (resampling is libswresample's business
and is not modelled here):

  - cut to the reach: min(floor(seconds * rate), window + (max_patches * patch_frames - 1) * hop) samples;
  - frames of `window` samples every `hop` samples, no centre padding (1 + (n - window) // hop), each
    times a periodic Hann window 0.5 - 0.5 cos(2 pi t / window);
  - the DFT of `window` points (numpy.fft.rfft, in float64), the unscaled power |X_k|^2 of bins
    0 .. window // 2; `log_mel_torch` computes the same with torch.stft, and the self-check holds the
    two together;
  - `mels` triangular filters of peak 1 whose mels + 2 edges are spaced evenly in HTK mel,
    2595 log10(1 + hz / 700), over 0 .. rate / 2, bin k sitting at k * rate / window Hz;
  - log10(max(mel, 1e-10));
  - patches of `patch_frames` frames flattened frame-major (frame * mels + band), trailing frames
    dropped, at most max_patches.

The tower: `patch` embeds each patch, the class token `cls` leads, row j of `pos` is added to token j
(the class token first), the trunk runs bidirectionally without rotary positions; the embedding is
the class token's projection, the token vectors the patches'.

    python3 tests/reference/audio_reference.py CHECKPOINT --wav FILE   # prints an embedding (PCM16 mono WAV at `rate`)
    python3 tests/reference/audio_reference.py --self-check            # checks the pieces
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import uform_reference as ref  # noqa: E402

LOG_FLOOR = 1e-10

# ------------------------------------------------------------------------------------------------
# The front end
# ------------------------------------------------------------------------------------------------


def hann_periodic(window: int) -> np.ndarray:
    t = np.arange(window, dtype=np.float64)
    return 0.5 - 0.5 * np.cos(2 * np.pi * t / window)


def hz_to_mel(hz):
    return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def mel_to_hz(mel):
    return 700.0 * (10.0 ** (np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)


def mel_filters(rate: int, mels: int, window: int) -> np.ndarray:
    """[mels, window // 2 + 1]: HTK triangles of peak 1 over 0 .. rate / 2, bin k at k * rate / window."""
    edges = mel_to_hz(np.linspace(0.0, hz_to_mel(rate / 2.0), mels + 2))
    hz = np.arange(window // 2 + 1, dtype=np.float64) * rate / window
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (hz[None, :] - low) / (centre - low)
    down = (high - hz[None, :]) / (high - centre)
    return np.maximum(0.0, np.minimum(up, down))


def frame_count(samples: int, window: int, hop: int) -> int:
    return 0 if samples < window else 1 + (samples - window) // hop


def log_mel(samples, rate: int, mels: int, window: int, hop: int, frames: int | None = None) -> np.ndarray:
    """[frames, mels] float64 log-mel of the first `frames` frames (all of them when None)."""
    x = np.asarray(samples, dtype=np.float64)
    available = frame_count(x.size, window, hop)
    frames = available if frames is None else min(frames, available)
    if frames == 0:
        return np.zeros((0, mels))
    index = np.arange(frames)[:, None] * hop + np.arange(window)[None, :]
    spectrum = np.fft.rfft(x[index] * hann_periodic(window)[None, :], n=window, axis=1)
    power = spectrum.real**2 + spectrum.imag**2  # [frames, window // 2 + 1]
    mel = power @ mel_filters(rate, mels, window).T
    return np.log10(np.maximum(mel, LOG_FLOOR))


def log_mel_torch(samples, rate: int, mels: int, window: int, hop: int) -> np.ndarray:
    """The same through torch.stft (float64, center=False, a periodic Hann window, onesided)."""
    x = torch.as_tensor(np.asarray(samples, dtype=np.float64))
    if x.numel() < window:
        return np.zeros((0, mels))
    spectrum = torch.stft(x, n_fft=window, hop_length=hop, win_length=window,
                          window=torch.hann_window(window, periodic=True, dtype=torch.float64), center=False,
                          onesided=True, return_complex=True)  # [bins, frames]
    power = (spectrum.abs() ** 2).T.numpy()
    mel = power @ mel_filters(rate, mels, window).T
    return np.log10(np.maximum(mel, LOG_FLOOR))


# ------------------------------------------------------------------------------------------------
# The tower
# ------------------------------------------------------------------------------------------------


@dataclass
class AudioEncoding(ref.Encoding):
    """What `AudioTower.encode` answers, as float64 numpy arrays computed in the tower's dtype; items
    with fewer samples than one patch spans have no rows (`ok` False, zero embedding and state)."""

    embeddings: np.ndarray  # [items, dims]
    states: np.ndarray  # [items, hidden]
    token_vectors: list  # per item, [patches, dims]
    patches: list  # per item
    ok: list  # per item
    truncated: int  # items longer than the reach
    token_offsets: list = field(default_factory=list)


class AudioTower(ref.Transformer):
    def __init__(self, config: ref.TransformerConfig, dims: int, rate: int, mels: int, window: int, hop: int,
                 patch_frames: int, seconds: float, max_patches: int):
        super().__init__(config, dims, causal=False, rotary=False)
        self.rate, self.mels, self.window, self.hop = rate, mels, window, hop
        self.patch_frames, self.seconds, self.max_patches = patch_frames, seconds, max_patches
        self.patch = ref.BF16Inputs(patch_frames * mels, config.hidden, bias=True)  # [hidden, patch_frames mels]
        self.cls = torch.nn.Parameter(torch.zeros(config.hidden), requires_grad=False)
        self.pos = torch.nn.Parameter(torch.zeros(1 + max_patches, config.hidden), requires_grad=False)

    @property
    def reach(self) -> int:
        limit = math.floor(self.seconds * self.rate)
        return min(limit, self.window + (self.max_patches * self.patch_frames - 1) * self.hop)

    def patch_rows(self, samples) -> tuple[np.ndarray, bool]:
        """[patches, patch_frames * mels] float64, and whether the clip was cut."""
        x = np.asarray(samples, dtype=np.float64)
        truncated = x.size > self.reach
        x = x[: self.reach]
        patches = min(frame_count(x.size, self.window, self.hop) // self.patch_frames, self.max_patches)
        frames = log_mel(x, self.rate, self.mels, self.window, self.hop, patches * self.patch_frames)
        return frames.reshape(patches, self.patch_frames * self.mels), truncated

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """Patch rows [patches, patch_frames * mels] -> final-normed states [1 + patches, hidden]."""
        tokens = self.patch(rows)  # [patches, hidden]
        x = torch.cat((self.cls[None], tokens), dim=0) + self.pos[: 1 + rows.shape[0]]
        return self.trunk(x[None])[0]

    @torch.no_grad()
    def encode(self, clips) -> AudioEncoding:
        """`clips`: float sequences of samples at `rate`."""
        hidden, dims = self.config.hidden, self.dims
        embeddings, states, vectors, counts, ok, truncated = [], [], [], [], [], 0
        for clip in clips:
            rows, cut = self.patch_rows(clip)
            truncated += cut
            if rows.shape[0] == 0:
                embeddings.append(np.zeros(dims))
                states.append(np.zeros(hidden))
                vectors.append(np.zeros((0, dims)))
                counts.append(0)
                ok.append(False)
                continue
            final = self.forward(torch.as_tensor(rows, dtype=self.cls.dtype))
            projected = self.embed_states(final)
            states.append(final[0].double().numpy())
            embeddings.append(projected[0].double().numpy())
            vectors.append(projected[1:].double().numpy())
            counts.append(rows.shape[0])
            ok.append(True)
        offsets = [0]
        for n in counts:
            offsets.append(offsets[-1] + n)
        return AudioEncoding(
            embeddings=np.stack(embeddings) if embeddings else np.zeros((0, dims)),
            states=np.stack(states) if states else np.zeros((0, hidden)),
            token_vectors=vectors, patches=counts, ok=ok, truncated=truncated, token_offsets=offsets)


def load_audio_tower(path: str, dtype: torch.dtype = torch.float32) -> AudioTower:
    """The audio tower of a format-4 checkpoint; raises ValueError when it has none."""
    tensors, metadata = ref.read_safetensors(path, prefixes=("audio.",))
    config = json.loads(metadata["uform"]) if "uform" in metadata else {}
    if config.get("format") != 4 or "audio" not in config:
        raise ValueError(f"{path}: not a format-4 checkpoint with an audio tower")
    audio = config["audio"]
    tower = AudioTower(ref.TransformerConfig.from_json(audio), int(config["dims"]), int(audio["rate"]),
                       int(audio["mels"]), int(audio["window"]), int(audio["hop"]), int(audio["patch_frames"]),
                       float(audio["seconds"]), int(audio["max_patches"]))
    return tower.load(tensors, "audio.", dtype).eval()


def random_audio_tower(depth=2, hidden=128, mlp=256, dims=64, rate=16000, mels=32, window=400, hop=160,
                       patch_frames=4, seconds=2.0, max_patches=49, seed=0, dtype=torch.float32) -> AudioTower:
    tower = AudioTower(ref.TransformerConfig(depth, hidden, hidden // ref.HEAD, mlp), dims, rate, mels, window, hop,
                       patch_frames, seconds, max_patches)
    return ref.random_weights(tower, "audio.", seed, dtype)


# ------------------------------------------------------------------------------------------------
# WAV files (plain RIFF PCM16), for tests and benchmarks
# ------------------------------------------------------------------------------------------------


def pcm16(samples) -> np.ndarray:
    """round(x * 32767), clipped: the PCM16 a WAV writer stores."""
    return np.clip(np.round(np.asarray(samples, dtype=np.float64) * 32767), -32768, 32767).astype("<i2")


def wav_bytes(samples, rate: int, channels: int = 1) -> bytes:
    """A RIFF WAVE of PCM16 `samples` ([n] or [n, channels] floats in [-1, 1])."""
    data = pcm16(samples).reshape(-1).tobytes()
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * channels * 2, channels * 2, 16)
    return header + b"data" + struct.pack("<I", len(data)) + data


def wav_samples(blob: bytes) -> tuple[np.ndarray, int]:
    """Mono float samples (x / 32768, the mean of the channels) and the rate of a plain PCM16 WAV."""
    channels, rate = struct.unpack_from("<HI", blob, 22)
    (size,) = struct.unpack_from("<I", blob, 40)
    values = np.frombuffer(blob[44 : 44 + size], dtype="<i2").astype(np.float64) / 32768.0
    return values.reshape(-1, channels).mean(axis=1), rate


# ------------------------------------------------------------------------------------------------
# Self-checks
# ------------------------------------------------------------------------------------------------


def self_check(verbose: bool = True) -> list:
    """Checks the front end and the tower against independent formulations; answers the failures."""
    report = ref.Report(verbose)
    check = report.check

    rng = np.random.default_rng(0)
    for rate, mels, window, hop in ((16000, 32, 400, 160), (22050, 64, 512, 256), (8000, 20, 201, 80)):
        t = np.arange(window + 7 * hop) / rate
        x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)
        a, b = log_mel(x, rate, mels, window, hop), log_mel_torch(x, rate, mels, window, hop)
        check(f"log-mel, window {window}: numpy rfft == torch.stft", a.shape == b.shape and np.abs(a - b).max() < 1e-9,
              f"max {np.abs(a - b).max():.1e}")
        # The DFT written out, for one frame.
        frame = x[:window] * hann_periodic(window)
        k = np.arange(window // 2 + 1)[:, None]
        direct = (frame[None, :] * np.exp(-2j * np.pi * k * np.arange(window)[None, :] / window)).sum(axis=1)
        mel = np.log10(np.maximum(np.abs(direct) ** 2 @ mel_filters(rate, mels, window).T, LOG_FLOOR))
        check(f"log-mel, window {window}: first frame == the DFT written out", np.abs(mel - a[0]).max() < 1e-9)
    filters = mel_filters(16000, 32, 400)
    check("mel filters: peak at most 1, every band has a bin", filters.max() <= 1 + 1e-12 and (filters.max(axis=1) > 0).all())
    check("silence: log-mel is the floor", np.all(log_mel(np.zeros(1000), 16000, 32, 400, 160) == math.log10(LOG_FLOOR)))
    tower = random_audio_tower()
    clips = [rng.standard_normal(n) * 0.1 for n in (879, 880, 5000, 40000)]
    encoding = tower.encode(clips)
    check("tower: patch counts", encoding.patches == [0, 1, 7, 49], f"{encoding.patches}")
    check("tower: clips past the reach are counted", encoding.truncated == 1)
    alone = tower.encode(clips[2:3])
    check("tower: a clip does not depend on its batch",
          np.allclose(alone.embeddings[0], encoding.embeddings[2], atol=1e-6))
    blob = wav_bytes(np.stack([clips[2], clips[2] * 0.5], axis=1), 16000, channels=2)
    back, rate = wav_samples(blob)
    check("wav: round trip", rate == 16000 and np.abs(back - (pcm16(clips[2]) + pcm16(clips[2] * 0.5)) / 65536).max() < 1e-12)
    return report.failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("--wav", help="a PCM16 WAV at the model's rate")
    parser.add_argument("--self-check", action="store_true")
    args = parser.parse_args(argv)
    if args.self_check:
        failures = self_check()
        print("passed" if not failures else f"FAILED: {failures}")
        return 1 if failures else 0
    if not args.checkpoint or not args.wav:
        parser.error("CHECKPOINT and --wav, or --self-check")
    tower = load_audio_tower(args.checkpoint)
    samples, rate = wav_samples(Path(args.wav).read_bytes())
    if rate != tower.rate:
        parser.error(f"{args.wav} is at {rate} Hz; the model reads {tower.rate} Hz (resample it first)")
    encoding = tower.encode([samples])
    np.set_printoptions(precision=6, suppress=True, linewidth=120)
    print(encoding.embeddings[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
