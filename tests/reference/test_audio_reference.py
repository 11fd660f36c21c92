#!/usr/bin/env python3
"""The C engine's audio tower against the independent PyTorch reference (audio_reference.py).

    test_audio_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/tools/uform_tiny_checkpoint \
        [--log-mel-tool build/tests/audio_log_mel] --workdir build/reference-audio

Writes two seeded checkpoints with the tool (the tiny default: rate 16000, 32 mels, window 400, hop
160, 4 frames per patch, 2 seconds; and depth 4 hidden 256) and a third derived from the second with
sharper attention (the audio tower's q and k rows x4, exact in BF16), then, through ctypes (harness.py's
mirror of uform.h, checked against it by a compiled probe):

  - front end: the engine's log-mel (through the --log-mel-tool filter, which runs the engine's own
    front end) against numpy's rfft and the HTK filters written again, for the model's shape and
    windows of 2 mod 4, odd and power-of-two length, within 1e-3 in log10 units;
  - samples at the model's rate (so no resampling): clips of varied lengths (shorter than one patch,
    exactly one patch, a few, the reach, longer than `seconds`) through uform_audio_encode_samples
    against the reference: embeddings, token vectors (packed per clip), states, matryoshka widths,
    BF16 output; on the calling thread, RAM executors of 1 and 2 threads and deferred, which must
    agree bitwise; items that fail (NaN, too short) fail alone;
  - WAV files (PCM16 at the model's rate, mono and stereo) through uform_audio_encode from files and
    from memory against the reference on the samples they hold.

Exit status: 0 pass, 1 fail, 77 skip (no PyTorch in any interpreter found, or a build without FFmpeg).

Tolerances, as the text and image tests': embeddings and token vectors cosine >= 0.999 per row;
states relative L2 <= 1e-2 per row (the engine may round GEMM inputs, log-mel values included, to BF16).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from interpreter import SKIP, run_under_python_with  # noqa: E402

if __name__ == "__main__":
    run_under_python_with(["torch", "numpy"])

import numpy as np  # noqa: E402

import audio_reference as audio_ref  # noqa: E402
import harness  # noqa: E402  (the ctypes mirror, Engine, Report)
import uform_reference as ref  # noqa: E402
from harness import BF16, INVALID_ARGUMENT, OK, OUTPUT_EMBEDDINGS, UNSUPPORTED  # noqa: E402

LOG_MEL_ABS_MAX = 1e-3


def test_clips(tower: audio_ref.AudioTower, seed: int) -> list:
    """Tones, glides and noise at the model's rate, of lengths around the edges."""
    rng = np.random.default_rng(seed)
    one_patch = tower.window + (tower.patch_frames - 1) * tower.hop
    lengths = [one_patch - 1, one_patch, one_patch + tower.hop * 3 + 7, 5000, tower.rate, tower.reach,
               int(3.3 * tower.rate)]
    clips = []
    for n in lengths:
        t = np.arange(n) / tower.rate
        f1, f2 = rng.uniform(100, 800), rng.uniform(1000, 6000)
        clip = (0.3 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * (f2 * t + 300 * t * t))
                + 0.05 * rng.standard_normal(n)) * rng.uniform(0.2, 1.0)
        clips.append(clip.astype(np.float32))
    clips.append(np.zeros(tower.rate // 2, np.float32))  # silence
    return clips


def check_log_mel(report, tool: str | None, tower: audio_ref.AudioTower):
    if tool is None:
        print("  --   no --log-mel-tool: the front end is checked only through the tower")
        return
    rng = np.random.default_rng(5)
    shapes = [(tower.rate, tower.mels, tower.window, tower.hop), (16000, 40, 398, 100), (8000, 20, 201, 80),
              (22050, 64, 512, 256), (44100, 80, 1102, 441)]
    for rate, mels, window, hop in shapes:
        t = np.arange(window + 20 * hop + 3) / rate
        x = (0.4 * np.sin(2 * np.pi * 330 * t) + 0.2 * np.sin(2 * np.pi * (2500 * t + 900 * t * t))
             + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
        run = subprocess.run([tool, str(rate), str(mels), str(window), str(hop)], input=x.tobytes(), capture_output=True)
        if run.returncode != 0:
            report.check(f"log-mel, window {window}: the tool runs", False, run.stderr.decode(errors="replace"))
            continue
        got = np.frombuffer(run.stdout, np.float32).reshape(-1, mels)
        want = audio_ref.log_mel(x, rate, mels, window, hop)
        if got.shape != want.shape:
            report.check(f"log-mel, window {window}: frames", False, f"{got.shape} vs {want.shape}")
            continue
        worst = np.abs(got - want).max()
        report.check(f"log-mel {rate} Hz, {mels} mels, window {window}, hop {hop}: engine vs numpy rfft",
                     worst <= LOG_MEL_ABS_MAX, f"max {worst:.2e} log10 units (<= {LOG_MEL_ABS_MAX})")


def check_samples(engine, report, model, tower, arenas, executors):
    clips = test_clips(tower, seed=17)
    expected = tower.encode([c.astype(np.float64) for c in clips])
    first = harness.encode_on_receivers(
        report, "samples",
        lambda executor, arena, deferred: engine.encode_sounds(model, clips, arena, rate=tower.rate, executor=executor,
                                                               deferred=deferred),
        harness.receivers(arenas["host"], executors, arenas))
    if first is None:
        return
    want_statuses = [OK if ok else INVALID_ARGUMENT for ok in expected.ok]
    report.check("samples: statuses (a clip shorter than a patch fails)", first["statuses"] == want_statuses,
                 f"{first['statuses']}")
    stats = first["stats"]
    report.check("samples: stats items, failed, truncated, bytes",
                 (stats.items, stats.failed, stats.truncated, stats.bytes)
                 == (len(clips), expected.ok.count(False), expected.truncated, 4 * sum(len(c) for c in clips)),
                 f"{stats.items}, {stats.failed}, {stats.truncated}, {stats.bytes}")
    vectors = first["token_vectors"]
    report.check("samples: token vectors packed per clip, one per patch",
                 vectors["offsets"] is not None and list(vectors["offsets"] - vectors["offsets"][0]) == expected.token_offsets,
                 f"{None if vectors['offsets'] is None else vectors['offsets'].tolist()} vs {expected.token_offsets}")
    keep = [i for i, ok in enumerate(expected.ok) if ok]
    harness.compare_encodings(report, "samples", first, expected, keep, states_maximum=harness.states_max(tower))
    failed = [i for i, ok in enumerate(expected.ok) if not ok]
    report.check("samples: failed items have zero rows",
                 not first["embeddings"]["values"][failed].any() and not first["states"]["values"][failed].any())

    info = engine.info(model)
    for width in info.matryoshka[: info.matryoshka_count]:
        narrow = engine.encode_sounds(model, clips, arenas["host"], rate=tower.rate, outputs=OUTPUT_EMBEDDINGS,
                                      matryoshka=width)
        harness.compare_rows(report, f"samples: matryoshka {width} vs reference", narrow["embeddings"]["values"][keep],
                             expected.matryoshka(width)[keep])
    harness.check_bf16_outputs(report, "samples",
                               engine.encode_sounds(model, clips, arenas["host"], rate=tower.rate, scalar=BF16), first)

    # NaN and infinity among good clips: they fail alone, the others as before.
    bad = [clips[1], clips[2].copy(), clips[3], clips[4].copy()]
    bad[1][10] = np.nan
    bad[3][-1] = np.inf
    result = engine.encode_sounds(model, bad, arenas["host"], rate=tower.rate)
    report.check("samples: NaN and infinity answer INVALID_ARGUMENT, the rest OK",
                 result["statuses"] == [OK, INVALID_ARGUMENT, OK, INVALID_ARGUMENT], f"{result['statuses']}")
    report.check("samples: the good ones equal their values in the first batch, bitwise",
                 np.array_equal(result["embeddings"]["values"][[0, 2]], first["embeddings"]["values"][[1, 3]])
                 and not result["embeddings"]["values"][[1, 3]].any())


def check_wav(engine, report, model, tower, arena, workdir: Path):
    rng = np.random.default_rng(29)
    n = int(1.3 * tower.rate)
    t = np.arange(n) / tower.rate
    left = 0.4 * np.sin(2 * np.pi * 523 * t) + 0.05 * rng.standard_normal(n)
    right = 0.3 * np.sin(2 * np.pi * 1760 * t + 1) + 0.05 * rng.standard_normal(n)
    blobs = {"mono.wav": audio_ref.wav_bytes(left, tower.rate),
             "stereo.wav": audio_ref.wav_bytes(np.stack([left, right], axis=1), tower.rate, channels=2)}
    paths = []
    for name, blob in blobs.items():
        (workdir / name).write_bytes(blob)
        paths.append(workdir / name)
    try:
        from_files = engine.encode_sounds(model, paths, arena, kind="files")
        from_memory = engine.encode_sounds(model, list(blobs.values()), arena, kind="memory")
    except harness.EngineError as error:
        report.check("uform_audio_encode over WAV files", False, str(error))
        return
    report.check("wav: every file decodes", from_files["statuses"] == [OK, OK], f"{from_files['statuses']}")
    report.check("wav: files == the same bytes in memory, bitwise", harness.same_bitwise(from_files, from_memory))
    report.check("wav: stats bytes are the files' bytes",
                 from_files["stats"].bytes == sum(len(b) for b in blobs.values()), f"{from_files['stats'].bytes}")
    expected = tower.encode([audio_ref.wav_samples(blob)[0] for blob in blobs.values()])
    harness.compare_encodings(report, "wav (mono, and stereo as the mean of its channels), end to end", from_files,
                              expected, states_maximum=harness.states_max(tower))


def check_checkpoint(engine, report, label: str, path: Path, workdir: Path, log_mel_tool: str | None,
                     weights: str = "stored") -> None:
    print(f"\n== {label}: {path}", flush=True)
    tower = audio_ref.load_audio_tower(str(path))
    if weights == "i8":
        ref.quantize_blocks(tower)
    with harness.loaded(engine, path, weights=weights) as model:
        info = engine.info(model)
        report.check("model info matches the audio metadata",
                     info.has_audio and (info.audio.rate, info.audio.mels, info.audio.window, info.audio.hop,
                                         info.audio.patch_frames, info.audio.max_patches, info.audio.transformer.hidden)
                     == (tower.rate, tower.mels, tower.window, tower.hop, tower.patch_frames, tower.max_patches,
                         tower.config.hidden),
                     f"rate {info.audio.rate} mels {info.audio.mels} window {info.audio.window} hop {info.audio.hop}")
        check_log_mel(report, log_mel_tool, tower)
        with harness.executors_and_arenas(engine) as (executors, arenas):
            check_samples(engine, report, model, tower, arenas, executors)
            check_wav(engine, report, model, tower, arenas["host"], workdir)


def built_with_ffmpeg(engine, path: Path) -> bool:
    """uform_features() reports FFmpeg only once every verb it serves is wired: ask the verb itself."""
    with harness.loaded(engine, path) as model:
        arena = engine.arena()
        try:
            engine.encode_sounds(model, [np.zeros(16000, np.float32)], arena, rate=16000)
            return True
        except harness.EngineError as error:
            if error.status != UNSUPPORTED:
                raise
            return False
        finally:
            engine.library.uform_arena_free(arena)


def main(argv=None) -> int:
    log_mel_tool = (("--log-mel-tool",), {"default": None, "help": "tests/audio_log_mel: the engine's front end as a filter"})
    args = harness.parse_arguments(__doc__, argv, extra=[log_mel_tool])
    workdir = harness.open_workdir(args, "audio")
    report = harness.Report()

    print("== the reference alone", flush=True)
    for failure in audio_ref.self_check(verbose=True):
        report.failures.append(f"reference self-check: {failure}")

    callable_engine = harness.check_layouts(report, args.header, workdir)
    engine = harness.open_engine(args.library)
    checkpoints = harness.write_standard_checkpoints(args.tiny_checkpoint_tool, workdir, "audio", "audio")
    if engine is None or checkpoints is None:
        return 1
    if not callable_engine:
        return harness.summary(report)
    if not built_with_ffmpeg(engine, checkpoints[0][1]):
        print("SKIP: the library is built without FFmpeg: its audio verbs answer UNSUPPORTED")
        return SKIP
    harness.check_each(report, checkpoints,
                       lambda label, path: check_checkpoint(engine, report, label, path, workdir, args.log_mel_tool))
    harness.check_each(report, harness.with_i8_weights(checkpoints),
                       lambda label, path: check_checkpoint(engine, report, label, path, workdir, args.log_mel_tool, "i8"))
    return harness.summary(report)


if __name__ == "__main__":
    sys.exit(main())
