#!/usr/bin/env python3
"""The C engine's video_encode against the independent PyTorch reference (uform_reference.py): frame
sampling and pooling over the image tower.

    test_video_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/src/tools/uform_tiny_checkpoint --workdir build/reference-video

Clips are written here as uncompressed AVI files (24-bit BI_RGB frames, which FFmpeg decodes to the
exact pixels), so that the reference knows every frame without a decoder of its own: clips of 12, 7, 2
and 1 frames of textured, differently coloured pictures (fewer frames than the model samples repeat
frames). For each of two seeded checkpoints (the tool's tiny default; depth 4 hidden 256 with the image
tower's q and k rows x4, exact in BF16, for sharp attention), through ctypes (the text test's mirror
plus the video verb, checked against uform.h by the same compiled probe):

  - the reference picks each clip's frames by DESIGN.md's rule (ref.video_samples: frame shown at
    (k + 0.5) * duration / F), runs them through its image tower, and pools them (ref.pool_video:
    normalized mean of the frame embeddings, mean of the states); the engine's embeddings, token vectors
    and states, from memory and from files, must agree, and so must every matryoshka width;
  - the engine's token vectors equal, bitwise, its own image_encode_pixels of the frames the rule picks;
  - a RAM executor of 2 threads, deferred, agrees bitwise with the calling thread;
  - a text file in the batch answers FORMAT alone.

Exit status: 0 pass, 1 fail, 77 skip (no PyTorch in any interpreter found, or a library without FFmpeg).

Tolerances, as the text and image tests': embeddings and token vectors cosine >= 0.999 per row; states
relative L2 <= 1e-2 per row (the engine may round GEMM inputs to BF16).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _interpreter_with_torch() -> None:
    """Meson may find a python3 without PyTorch: re-run this script under one that has it (the
    project's .venv, Debian's /usr/bin/python3), else skip. Done before importing the text test's
    module, which imports the reference and so PyTorch."""
    try:
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

sys.path.insert(0, str(HERE))
import numpy as np  # noqa: E402

import test_image_reference as image_test  # noqa: E402  (the image verbs' mirror, sharpened checkpoints)
import test_text_reference as text_test  # noqa: E402  (the ctypes mirror, Engine, Report)
import uform_reference as ref  # noqa: E402

REPOSITORY = text_test.REPOSITORY
c_size, c_status = text_test.c_size, text_test.c_status
OK, FORMAT = text_test.OK, 6
EVERYTHING = image_test.EVERYTHING
OUTPUT_EMBEDDINGS = image_test.OUTPUT_EMBEDDINGS
F32 = text_test.F32
SOURCE_FILES, SOURCE_MEMORY = image_test.SOURCE_FILES, image_test.SOURCE_MEMORY
STATE_RELATIVE_L2_MAX = text_test.STATE_RELATIVE_L2_MAX


class uform_video_encode_args_t(text_test.Struct):
    c_name = "uform_video_encode_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
                ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(text_test.uform_encode_config_t)),
                ("encoded", ctypes.POINTER(text_test.uform_encoded_t)), ("outcome", ctypes.c_void_p),
                ("videos", text_test.uform_tape_t), ("source", c_status)]


def video_encode(engine, model, items, arena, files=False, outputs=EVERYTHING, executor=None, matryoshka=0,
                 deferred=False) -> dict:
    """`items`: encoded clips (bytes), or paths with `files`. Copies every view out."""
    blobs = [str(item).encode() for item in items] if files else [bytes(item) for item in items]
    tape, keep = text_test._tape(blobs)
    stats = text_test.uform_encode_stats_t()
    config = text_test.uform_encode_config_t(F32, matryoshka, text_test.uform_progress_t(), ctypes.pointer(stats))
    encoded = text_test.uform_encoded_t()
    outcome = text_test.Outcome(engine.library) if deferred else None
    args = uform_video_encode_args_t(model, executor, outputs, arena, ctypes.pointer(config),
                                     None if deferred else ctypes.pointer(encoded),
                                     outcome.pointer if outcome else None, tape,
                                     SOURCE_FILES if files else SOURCE_MEMORY)
    try:
        engine._submit(engine.library.uform_video_encode, args, outcome)
        if outcome is not None:
            engine.check(engine.library.uform_outcome_encoded(outcome.pointer, ctypes.byref(encoded)), outcome)
        result = {"stats": stats, "statuses": [encoded.statuses[i] for i in range(encoded.items)]}
        for name in ("embeddings", "token_vectors", "states"):
            view = getattr(encoded, name)
            result[name] = engine.read_view(view, arena) if view.data or view.rows else None
        return result
    finally:
        del keep
        if outcome is not None:
            outcome.destroy()


# ------------------------------------------------------------------------------------------------
# Clips: uncompressed AVI, written by hand
# ------------------------------------------------------------------------------------------------


def avi_rgb(frames: list, rate: int) -> bytes:
    """An AVI file of 24-bit BI_RGB frames (rows bottom-up, BGR, padded to 4 bytes), `rate` frames per
    second, with an idx1 index: FFmpeg's avi demuxer and rawvideo decoder give back the exact pixels."""
    height, width = frames[0].shape[:2]
    stride = (width * 3 + 3) & ~3
    size = stride * height

    def chunk(fourcc: bytes, data: bytes) -> bytes:
        return fourcc + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")

    def riff_list(kind: bytes, data: bytes) -> bytes:
        return chunk(b"LIST", kind + data)

    avih = struct.pack("<14I", 1_000_000 // rate, size * rate, 0, 0x10, len(frames), 0, 1, size, width, height,
                       0, 0, 0, 0)
    strh = struct.pack("<4s4sIHHIIIIIIiI4h", b"vids", b"DIB ", 0, 0, 0, 0, 1, rate, 0, len(frames), size, -1, 0,
                       0, 0, width, height)
    strf = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, size, 0, 0, 0, 0)
    header = riff_list(b"hdrl", chunk(b"avih", avih) + riff_list(b"strl", chunk(b"strh", strh) + chunk(b"strf", strf)))
    movi, index, offset = b"", b"", 4  # idx1 offsets count from the 'movi' fourcc
    for frame in frames:
        rows = np.zeros((height, stride), np.uint8)
        rows[:, : width * 3] = frame[::-1, :, ::-1].reshape(height, width * 3)
        data = chunk(b"00db", rows.tobytes())
        index += struct.pack("<4sIII", b"00db", 0x10, offset, size)
        movi += data
        offset += len(data)
    body = b"AVI " + header + riff_list(b"movi", movi) + chunk(b"idx1", index)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def clip_frames(count: int, seed: int, height=40, width=52) -> list:
    """Textured pictures, each of its own colour: the sampled ones are told apart by the tower."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    frames = []
    for i in range(count):
        colour = rng.uniform(20, 235, 3)
        phase = rng.uniform(0, 6.28)
        channels = [colour[c] + 40 * np.sin(0.2 * x + 0.1 * y * (c + 1) + phase + i) for c in range(3)]
        noise = rng.normal(0, 10, (height, width, 3))
        frames.append(np.clip(np.stack(channels, axis=-1) + noise, 0, 255).astype(np.uint8))
    return frames


# (frames, frames per second): more frames than the tiny model samples, an odd count, fewer, one.
CLIPS = [(12, 12), (7, 10), (2, 5), (1, 8)]


def check_checkpoint(engine, report, label: str, path: Path, workdir: Path) -> None:
    print(f"\n== {label}: {path}", flush=True)
    model = engine.load(str(path))
    tower = ref.Reference(str(path)).image
    info = engine.info(model)
    per_clip = info.video.frames
    report.check("model info has a video entry", info.has_video and per_clip > 0, f"frames {per_clip}")
    images_engine = image_test.ImageEngine(engine)
    arena = engine.arena()
    executor = engine.ram_executor(2)
    side_arena = engine.arena(executor)
    try:
        clips, sampled = [], []
        for index, (count, rate) in enumerate(CLIPS):
            frames = clip_frames(count, seed=31 + index)
            blob = avi_rgb(frames, rate)
            clips.append(blob)
            (workdir / f"clip{index}.avi").write_bytes(blob)
            picks = ref.video_samples([i / rate for i in range(count)], count / rate, per_clip)
            sampled += [frames[i] for i in picks]
        expected = ref.pool_video(tower.encode(sampled), per_clip)

        from_memory = video_encode(engine, model, clips, arena)
        report.check("every clip encodes", from_memory["statuses"] == [OK] * len(clips), f"{from_memory['statuses']}")
        image_test.compare_encodings(report, "clips", from_memory, expected, tower.config.hidden)
        vectors = from_memory["token_vectors"]
        report.check("token vectors grouped per clip, one per sampled frame",
                     vectors["offsets"] is not None
                     and np.array_equal(vectors["offsets"], np.arange(len(clips) + 1) * per_clip),
                     f"{None if vectors['offsets'] is None else vectors['offsets'].tolist()}")

        frames_engine = images_engine.encode(model, sampled, arena)
        report.check("token vectors == image_encode_pixels of the frames the rule picks, bitwise",
                     vectors["raw"][: vectors["rows"] * vectors["columns"] * 4]
                     == frames_engine["embeddings"]["raw"][: vectors["rows"] * vectors["columns"] * 4])

        paths = [workdir / f"clip{index}.avi" for index in range(len(clips))]
        from_files = video_encode(engine, model, paths, arena, files=True)
        report.check("files == the same bytes in memory, bitwise",
                     all(from_files[k]["raw"] == from_memory[k]["raw"] for k in ("embeddings", "token_vectors", "states")))
        report.check("stats: items, failed, bytes",
                     (from_files["stats"].items, from_files["stats"].failed, from_files["stats"].bytes)
                     == (len(clips), 0, sum(len(blob) for blob in clips)))
        deferred = video_encode(engine, model, clips, side_arena, executor=executor, deferred=True)
        report.check("RAM executor of 2 threads, deferred == calling thread, bitwise",
                     all(deferred[k]["raw"] == from_memory[k]["raw"] for k in ("embeddings", "token_vectors", "states")))

        for width in info.matryoshka[: info.matryoshka_count]:
            narrow = video_encode(engine, model, clips, arena, outputs=OUTPUT_EMBEDDINGS, matryoshka=width)
            text_test.compare_rows(report, f"matryoshka {width} vs reference", narrow["embeddings"]["values"],
                                   expected.matryoshka(width))

        batch = clips[:2] + [b"a text file, not a clip\n"] + clips[2:]
        mixed = video_encode(engine, model, batch, arena)
        good = [0, 1, 3, 4]
        report.check("a text file answers FORMAT alone, the others as before",
                     mixed["statuses"] == [OK, OK, FORMAT, OK, OK]
                     and not mixed["embeddings"]["values"][2].any()
                     and np.array_equal(mixed["embeddings"]["values"][good], from_memory["embeddings"]["values"]),
                     f"{mixed['statuses']}")
    finally:
        engine.library.uform_arena_free(arena)
        engine.library.uform_arena_free(side_arena)
        engine.library.uform_executor_free(executor)
        engine.library.uform_model_free(model)


def built_with_ffmpeg(engine, path: Path) -> bool:
    """A build without FFmpeg answers UNSUPPORTED for every call (and says why)."""
    model = engine.load(str(path))
    arena = engine.arena()
    try:
        video_encode(engine, model, [b"not a clip"], arena)
        return True
    except text_test.EngineError as error:
        if error.status == text_test.UNSUPPORTED and "FFmpeg" in str(error):
            return False
        raise
    finally:
        engine.library.uform_arena_free(arena)
        engine.library.uform_model_free(model)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", required=True, help="libuform.so")
    parser.add_argument("--tiny-checkpoint-tool", required=True, help="the uform_tiny_checkpoint executable")
    parser.add_argument("--workdir", default=None, help="where checkpoints and clips go (default: a temporary folder)")
    parser.add_argument("--header", default=str(REPOSITORY / "include" / "uform.h"), help="uform.h, for the layout probe")
    args = parser.parse_args(argv)

    text_test._preload_sanitizer(args.library)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="uform-video-reference-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = text_test.Report()

    try:
        engine = text_test.Engine(args.library)
    except (OSError, AttributeError) as error:
        print(f"FAIL: cannot load {args.library} through ctypes: {error}")
        return 1
    engine.library.uform_video_encode.restype = c_status
    engine.library.uform_video_encode.argtypes = [ctypes.POINTER(uform_video_encode_args_t)]

    print("== ctypes layouts", flush=True)
    text_test.MIRRORED.extend([image_test.uform_image_encode_args_t, image_test.uform_image_encode_pixels_args_t,
                               uform_video_encode_args_t])
    differences = text_test.probe_layouts(Path(args.header), workdir)
    if differences is None:
        print("  --   no C compiler: struct layouts are not checked against the header")
    else:
        report.check(f"every mirrored struct's size, alignment and offsets match {Path(args.header).name}",
                     not differences, "\n       ".join([""] + differences))

    tiny = workdir / "video-reference-tiny.safetensors"
    wide = workdir / "video-reference-256.safetensors"
    for path, flags in ((tiny, ["--seed", "3"]), (wide, ["--seed", "4", "--depth", "4", "--hidden", "256"])):
        written = subprocess.run([args.tiny_checkpoint_tool, str(path), *flags], capture_output=True, text=True)
        if written.returncode != 0:
            print(f"FAIL: {args.tiny_checkpoint_tool} {path} {' '.join(flags)}: {written.stdout}{written.stderr}")
            return 1
    sharp = workdir / "video-reference-256-sharp.safetensors"
    image_test.sharpen_image_checkpoint(wide, sharp)
    checkpoints = [("tiny default", tiny), ("depth 4, hidden 256, image q and k x4 (sharp attention)", sharp)]

    if differences:
        print("\nthe ctypes mirror does not match uform.h: the engine is not called")
    elif not built_with_ffmpeg(engine, tiny):
        print(f"SKIP: {args.library} is built without FFmpeg: uform_video_encode answers UNSUPPORTED")
        return 77
    else:
        for label, path in checkpoints:
            try:
                check_checkpoint(engine, report, label, path, workdir)
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
