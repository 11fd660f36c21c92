#!/usr/bin/env python3
"""The C engine's audio tower against the independent PyTorch reference (audio_reference.py).

    test_audio_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/src/tools/uform_tiny_checkpoint \
        [--log-mel-tool build/tests/audio_log_mel] --workdir build/reference-audio

Writes two seeded checkpoints with the tool (the tiny default: rate 16000, 32 mels, window 400, hop
160, 4 frames per patch, 2 seconds; and depth 4 hidden 256) and a third derived from the second with
sharper attention (the audio tower's q and k rows x4, exact in BF16), then, through ctypes (the text
test's mirror, extended with the audio verbs and checked against uform.h by the same compiled probe):

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

import argparse
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))



def _interpreter_with_torch() -> None:
    """Meson may find a python3 without PyTorch: re-run this script under one that has it (the
    project's .venv, Debian's /usr/bin/python3), else skip. Done before importing the text test's
    module, which imports the reference and so PyTorch."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("UFORM_REFERENCE_REEXEC"):
        print(f"SKIP: PyTorch cannot be imported by {sys.executable}")
        sys.exit(77)
    here = os.path.realpath(sys.executable)
    for candidate in (HERE.parents[1] / ".venv" / "bin" / "python3", Path("/usr/bin/python3")):
        if not candidate.exists() or os.path.realpath(candidate) == here:
            continue
        if subprocess.run([str(candidate), "-c", "import torch, numpy"], capture_output=True).returncode == 0:
            print(f"note: {sys.executable} lacks PyTorch; running under {candidate}", flush=True)
            os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, "UFORM_REFERENCE_REEXEC": "1"})
    print(f"SKIP: PyTorch cannot be imported by {sys.executable}, the .venv or /usr/bin/python3")
    sys.exit(77)


if __name__ == "__main__":
    _interpreter_with_torch()

import numpy as np  # noqa: E402

import audio_reference as audio_ref  # noqa: E402
import test_text_reference as text_test  # noqa: E402  (the ctypes mirror, Engine, Report)
import uform_reference as ref  # noqa: E402

SKIP = text_test.SKIP
REPOSITORY = text_test.REPOSITORY
c_size, c_status = text_test.c_size, text_test.c_status
OK, UNSUPPORTED = text_test.OK, text_test.UNSUPPORTED
INVALID_ARGUMENT, IO, FORMAT = 4, 5, 6
OUTPUT_EMBEDDINGS, OUTPUT_TOKEN_VECTORS, OUTPUT_STATES = 1, 2, 4
EVERYTHING = OUTPUT_EMBEDDINGS | OUTPUT_TOKEN_VECTORS | OUTPUT_STATES
F32, BF16 = text_test.F32, text_test.BF16
SOURCE_FILES, SOURCE_MEMORY = 0, 1
COSINE_MIN = text_test.COSINE_MIN
STATE_RELATIVE_L2_MAX = text_test.STATE_RELATIVE_L2_MAX
LOG_MEL_ABS_MAX = 1e-3


class uform_audio_encode_args_t(text_test.Struct):
    c_name = "uform_audio_encode_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
                ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(text_test.uform_encode_config_t)),
                ("encoded", ctypes.POINTER(text_test.uform_encoded_t)), ("outcome", ctypes.c_void_p),
                ("sounds", text_test.uform_tape_t), ("source", c_status)]


class uform_audio_encode_samples_args_t(text_test.Struct):
    c_name = "uform_audio_encode_samples_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
                ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(text_test.uform_encode_config_t)),
                ("encoded", ctypes.POINTER(text_test.uform_encoded_t)), ("outcome", ctypes.c_void_p),
                ("samples", text_test.uform_tape_t), ("rate", c_size)]


def _samples_tape(clips: list) -> tuple:
    """A uform_tape_t of float32 samples (offsets in samples), and the buffers that must outlive it."""
    joined = np.ascontiguousarray(np.concatenate([np.asarray(c, np.float32) for c in clips] + [np.zeros(1, np.float32)]))
    offsets = (c_size * (len(clips) + 1))()
    position = 0
    for i, clip in enumerate(clips):
        offsets[i] = position
        position += len(clip)
    offsets[len(clips)] = position
    data = joined.ctypes.data_as(ctypes.c_void_p)
    return text_test.uform_tape_t(data, offsets, len(clips), position), (joined, offsets)


class AudioEngine:
    """The audio verbs over the text test's Engine."""

    def __init__(self, engine):
        self.engine = engine
        library = engine.library
        library.uform_audio_encode.restype = c_status
        library.uform_audio_encode.argtypes = [ctypes.POINTER(uform_audio_encode_args_t)]
        library.uform_audio_encode_samples.restype = c_status
        library.uform_audio_encode_samples.argtypes = [ctypes.POINTER(uform_audio_encode_samples_args_t)]

    def encode(self, model, items, arena, kind="samples", rate=0, outputs=EVERYTHING, executor=None, scalar=F32,
               matryoshka=0, deferred=False) -> dict:
        """`kind` "samples": items are float arrays at `rate`; "files": paths; "memory": encoded bytes.
        Copies every view out."""
        engine = self.engine
        if kind == "samples":
            tape, keep = _samples_tape(items)
        elif kind == "files":
            tape, keep = text_test._tape([str(path).encode() for path in items])
        else:
            tape, keep = text_test._tape([bytes(item) for item in items])
        stats = text_test.uform_encode_stats_t()
        config = text_test.uform_encode_config_t(scalar, matryoshka, text_test.uform_progress_t(), ctypes.pointer(stats))
        encoded = text_test.uform_encoded_t()
        outcome = text_test.Outcome(engine.library) if deferred else None
        common = (model, executor, outputs, arena, ctypes.pointer(config), None if deferred else ctypes.pointer(encoded),
                  outcome.pointer if outcome else None, tape)
        if kind == "samples":
            args = uform_audio_encode_samples_args_t(*common, rate)
            verb = engine.library.uform_audio_encode_samples
        else:
            args = uform_audio_encode_args_t(*common, SOURCE_FILES if kind == "files" else SOURCE_MEMORY)
            verb = engine.library.uform_audio_encode
        try:
            engine._submit(verb, args, outcome)
            if outcome is not None:
                engine.check(engine.library.uform_outcome_encoded(outcome.pointer, ctypes.byref(encoded)), outcome)
            result = {"stats": stats, "items": encoded.items,
                      "statuses": [encoded.statuses[i] for i in range(encoded.items)] if encoded.statuses else None}
            for name in ("embeddings", "token_vectors", "states"):
                view = getattr(encoded, name)
                result[name] = engine.read_view(view, arena) if view.data or view.rows else None
            return result
        finally:
            del keep
            if outcome is not None:
                outcome.destroy()


# ------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------


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


def compare_encodings(report, label, result, expected: audio_ref.AudioEncoding):
    """Engine views (F32) against a reference AudioEncoding, on the items that encode."""
    keep = [i for i, ok in enumerate(expected.ok) if ok]
    compare = text_test.compare_rows
    compare(report, f"{label}: embeddings vs reference", result["embeddings"]["values"][keep], expected.embeddings[keep])
    compare(report, f"{label}: token vectors vs reference", result["token_vectors"]["values"],
            expected.stacked_token_vectors())
    states = result["states"]["values"][keep]
    want = expected.states[keep]
    relative = np.linalg.norm(states - want, axis=1) / np.linalg.norm(want, axis=1)
    report.check(f"{label}: states vs reference, relative L2", relative.max() <= STATE_RELATIVE_L2_MAX,
                 f"max {relative.max():.2e} (<= {STATE_RELATIVE_L2_MAX})")


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


def check_samples(audio_engine, report, model, tower, arenas, executors):
    engine = audio_engine.engine
    clips = test_clips(tower, seed=17)
    expected = tower.encode([c.astype(np.float64) for c in clips])
    receivers = [("calling thread", None, arenas["host"], False),
                 ("RAM executor, 1 thread", executors[1], arenas[1], False),
                 ("RAM executor, 2 threads", executors[2], arenas[2], False),
                 ("RAM executor, 2 threads, deferred", executors[2], arenas[2], True)]
    results = {}
    for name, executor, arena, deferred in receivers:
        try:
            results[name] = audio_engine.encode(model, clips, arena, rate=tower.rate, executor=executor, deferred=deferred)
        except text_test.EngineError as error:
            report.check(f"uform_audio_encode_samples on the {name}", False, str(error))
            return
    first_name, first = receivers[0][0], results[receivers[0][0]]
    for name, _, _, _ in receivers[1:]:
        report.check(f"samples: {name} == {first_name}, bitwise",
                     all(first[k]["raw"] == results[name][k]["raw"] for k in ("embeddings", "token_vectors", "states")))
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
    compare_encodings(report, "samples", first, expected)
    failed = [i for i, ok in enumerate(expected.ok) if not ok]
    report.check("samples: failed items have zero rows",
                 not first["embeddings"]["values"][failed].any() and not first["states"]["values"][failed].any())

    info = engine.info(model)
    for width in info.matryoshka[: info.matryoshka_count]:
        narrow = audio_engine.encode(model, clips, arenas["host"], rate=tower.rate, outputs=OUTPUT_EMBEDDINGS,
                                     matryoshka=width)
        keep = [i for i, ok in enumerate(expected.ok) if ok]
        text_test.compare_rows(report, f"samples: matryoshka {width} vs reference", narrow["embeddings"]["values"][keep],
                               expected.matryoshka(width)[keep])
    converted = audio_engine.encode(model, clips, arenas["host"], rate=tower.rate, scalar=BF16)
    for output in ("embeddings", "token_vectors", "states"):
        got = converted[output]["values"].astype(np.float32)
        want = ref.to_bf16(first[output]["values"].astype(np.float32))
        report.check(f"samples: BF16 {output} == F32 rounded", np.array_equal(got, want),
                     f"{100 * np.mean(got == want):.2f}% equal")

    # NaN and infinity among good clips: they fail alone, the others as before.
    bad = [clips[1], clips[2].copy(), clips[3], clips[4].copy()]
    bad[1][10] = np.nan
    bad[3][-1] = np.inf
    result = audio_engine.encode(model, bad, arenas["host"], rate=tower.rate)
    report.check("samples: NaN and infinity answer INVALID_ARGUMENT, the rest OK",
                 result["statuses"] == [OK, INVALID_ARGUMENT, OK, INVALID_ARGUMENT], f"{result['statuses']}")
    report.check("samples: the good ones equal their values in the first batch, bitwise",
                 np.array_equal(result["embeddings"]["values"][[0, 2]], first["embeddings"]["values"][[1, 3]])
                 and not result["embeddings"]["values"][[1, 3]].any())


def check_wav(audio_engine, report, model, tower, arena, workdir: Path):
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
        from_files = audio_engine.encode(model, paths, arena, kind="files")
        from_memory = audio_engine.encode(model, list(blobs.values()), arena, kind="memory")
    except text_test.EngineError as error:
        report.check("uform_audio_encode over WAV files", False, str(error))
        return
    report.check("wav: every file decodes", from_files["statuses"] == [OK, OK], f"{from_files['statuses']}")
    report.check("wav: files == the same bytes in memory, bitwise",
                 all(from_files[k]["raw"] == from_memory[k]["raw"] for k in ("embeddings", "token_vectors", "states")))
    report.check("wav: stats bytes are the files' bytes",
                 from_files["stats"].bytes == sum(len(b) for b in blobs.values()), f"{from_files['stats'].bytes}")
    expected = tower.encode([audio_ref.wav_samples(blob)[0] for blob in blobs.values()])
    compare_encodings(report, "wav (mono, and stereo as the mean of its channels), end to end", from_files, expected)


def check_checkpoint(engine, report, label: str, path: Path, workdir: Path, log_mel_tool: str | None) -> None:
    print(f"\n== {label}: {path}", flush=True)
    model = engine.load(str(path))
    tower = audio_ref.load_audio_tower(str(path))
    info = engine.info(model)
    report.check("model info matches the audio metadata",
                 info.has_audio and (info.audio.rate, info.audio.mels, info.audio.window, info.audio.hop,
                                     info.audio.patch_frames, info.audio.max_patches, info.audio.transformer.hidden)
                 == (tower.rate, tower.mels, tower.window, tower.hop, tower.patch_frames, tower.max_patches,
                     tower.config.hidden),
                 f"rate {info.audio.rate} mels {info.audio.mels} window {info.audio.window} hop {info.audio.hop}")
    audio_engine = AudioEngine(engine)
    executors, arenas = {}, {"host": engine.arena()}
    try:
        check_log_mel(report, log_mel_tool, tower)
        for threads in (1, 2):
            executors[threads] = engine.ram_executor(threads)
            arenas[threads] = engine.arena(executors[threads])
        check_samples(audio_engine, report, model, tower, arenas, executors)
        check_wav(audio_engine, report, model, tower, arenas["host"], workdir)
    finally:
        for arena in arenas.values():
            engine.library.uform_arena_free(arena)
        for executor in executors.values():
            engine.library.uform_executor_free(executor)
        engine.library.uform_model_free(model)


def sharpen_audio_checkpoint(source: Path, target: Path, factor: int = 4) -> None:
    """Copies a checkpoint with the audio tower's q and k rows (weights and biases) multiplied by
    `factor`, a power of two, so exact in BF16: the tool's small weights leave attention nearly
    uniform, which would hide attention that leaks between clips."""
    blob = bytearray(source.read_bytes())
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(bytes(blob[8 : 8 + length]))
    base = 8 + length
    hidden = int(json.loads(header["__metadata__"]["uform"])["audio"]["hidden"])
    for name, tensor in header.items():
        if not re.fullmatch(r"audio\.blocks\.\d+\.attn\.qkv\.(weight|bias)", name):
            continue
        begin, end = tensor["data_offsets"]
        values = ref.bf16_bits_to_f32(np.frombuffer(bytes(blob[base + begin : base + end]), np.uint16))
        values = values.reshape(tensor["shape"]).copy()
        values[: 2 * hidden] *= factor
        blob[base + begin : base + end] = ref.f32_to_bf16_bits(values.reshape(-1)).tobytes()
    target.write_bytes(bytes(blob))


def built_with_ffmpeg(engine, path: Path) -> bool:
    """uform_features() reports FFmpeg only once every verb it serves is wired: ask the verb itself."""
    model = engine.load(str(path))
    arena = engine.arena()
    try:
        AudioEngine(engine).encode(model, [np.zeros(16000, np.float32)], arena, rate=16000)
        return True
    except text_test.EngineError as error:
        if error.status != UNSUPPORTED:
            raise
        return False
    finally:
        engine.library.uform_arena_free(arena)
        engine.library.uform_model_free(model)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", required=True, help="libuform.so")
    parser.add_argument("--tiny-checkpoint-tool", required=True, help="the uform_tiny_checkpoint executable")
    parser.add_argument("--log-mel-tool", default=None, help="tests/audio_log_mel: the engine's front end as a filter")
    parser.add_argument("--workdir", default=None, help="where checkpoints and sounds go (default: a temporary folder)")
    parser.add_argument("--header", default=str(REPOSITORY / "include" / "uform.h"), help="uform.h, for the layout probe")
    args = parser.parse_args(argv)

    text_test._preload_sanitizer(args.library)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="uform-audio-reference-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = text_test.Report()

    print("== the reference alone", flush=True)
    for failure in audio_ref.self_check(verbose=True):
        report.failures.append(f"reference self-check: {failure}")

    print("== ctypes layouts", flush=True)
    text_test.MIRRORED.extend([uform_audio_encode_args_t, uform_audio_encode_samples_args_t])
    differences = text_test.probe_layouts(Path(args.header), workdir)
    if differences is None:
        print("  --   no C compiler: struct layouts are not checked against the header")
    else:
        report.check(f"every mirrored struct's size, alignment and offsets match {Path(args.header).name}",
                     not differences, "\n       ".join([""] + differences))

    try:
        engine = text_test.Engine(args.library)
        AudioEngine(engine)
    except (OSError, AttributeError) as error:
        print(f"FAIL: cannot load {args.library} through ctypes: {error}")
        return 1
    checkpoints = [("tiny default", workdir / "audio-reference-tiny.safetensors", ["--seed", "1"]),
                   ("depth 4, hidden 256", workdir / "audio-reference-256.safetensors",
                    ["--seed", "2", "--depth", "4", "--hidden", "256"])]
    for label, path, flags in checkpoints:
        written = subprocess.run([args.tiny_checkpoint_tool, str(path), *flags], capture_output=True, text=True)
        if written.returncode != 0:
            print(f"FAIL: {args.tiny_checkpoint_tool} {path} {' '.join(flags)}: {written.stdout}{written.stderr}")
            return 1
    sharp = workdir / "audio-reference-256-sharp.safetensors"
    sharpen_audio_checkpoint(checkpoints[1][1], sharp)
    checkpoints.append(("depth 4, hidden 256, audio q and k x4 (sharp attention)", sharp, []))

    if differences:
        print("\nthe ctypes mirror does not match uform.h: the engine is not called")
    elif not built_with_ffmpeg(engine, checkpoints[0][1]):
        print("SKIP: the library is built without FFmpeg: its audio verbs answer UNSUPPORTED")
        return SKIP
    else:
        for label, path, _ in checkpoints:
            try:
                check_checkpoint(engine, report, label, path, workdir, args.log_mel_tool)
            except text_test.EngineError as error:
                report.check(label, False, str(error))

    print()
    if report.failures:
        print(f"FAILED: {len(report.failures)} check(s):")
        for failure in report.failures:
            print(f"  - {failure}")
        return 1
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
