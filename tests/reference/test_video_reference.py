#!/usr/bin/env python3
"""The C engine's video_encode against the independent PyTorch reference (uform_reference.py): frame
sampling and pooling over the image tower.

    test_video_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/tools/uform_tiny_checkpoint --workdir build/reference-video

Clips are written here as uncompressed AVI files (24-bit BI_RGB frames, which FFmpeg decodes to the
exact pixels), so that the reference knows every frame without a decoder of its own: clips of 12, 7, 2
and 1 frames of textured, differently coloured pictures (fewer frames than the model samples repeat
frames). For each of two seeded checkpoints (the tool's tiny default; depth 4 hidden 256 with the image
tower's q and k rows x4, exact in BF16, for sharp attention), through ctypes (harness.py's mirror of
uform.h, checked against it by a compiled probe):

  - the reference picks each clip's frames by docs/DESIGN.md's rule (ref.video_samples: frame shown at
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

import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from interpreter import SKIP, run_under_python_with  # noqa: E402

if __name__ == "__main__":
    run_under_python_with(["torch", "numpy"])

import numpy as np  # noqa: E402

import harness  # noqa: E402  (the ctypes mirror, Engine, Report)
import uform_reference as ref  # noqa: E402
from harness import FORMAT, OK, OUTPUT_EMBEDDINGS, UNSUPPORTED  # noqa: E402


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


def check_checkpoint(engine, report, label: str, path: Path, workdir: Path, weights: str = "stored") -> None:
    print(f"\n== {label}: {path}", flush=True)
    tower = ref.Reference(str(path)).image
    if weights == "i8":
        ref.quantize_blocks(tower)
    with harness.loaded(engine, path, weights=weights) as model, harness.executors_and_arenas(engine) as (executors, arenas):
        check_clips(engine, report, model, tower, arenas["host"], executors[2], arenas[2], workdir)


def check_clips(engine, report, model, tower, arena, executor, side_arena, workdir: Path) -> None:
    info = engine.info(model)
    per_clip = info.video.frames
    report.check("model info has a video entry", info.has_video and per_clip > 0, f"frames {per_clip}")
    clips, sampled = [], []
    for index, (count, rate) in enumerate(CLIPS):
        frames = clip_frames(count, seed=31 + index)
        blob = avi_rgb(frames, rate)
        clips.append(blob)
        (workdir / f"clip{index}.avi").write_bytes(blob)
        picks = ref.video_samples([i / rate for i in range(count)], count / rate, per_clip)
        sampled += [frames[i] for i in picks]
    expected = ref.pool_video(tower.encode(sampled), per_clip)

    from_memory = engine.encode_videos(model, clips, arena)
    report.check("every clip encodes", from_memory["statuses"] == [OK] * len(clips), f"{from_memory['statuses']}")
    harness.compare_encodings(report, "clips", from_memory, expected, states_maximum=harness.states_max(tower))
    vectors = from_memory["token_vectors"]
    report.check("token vectors grouped per clip, one per sampled frame",
                 vectors["offsets"] is not None
                 and np.array_equal(vectors["offsets"], np.arange(len(clips) + 1) * per_clip),
                 f"{None if vectors['offsets'] is None else vectors['offsets'].tolist()}")

    frames_engine = engine.encode_images(model, sampled, arena)
    report.check("token vectors == image_encode_pixels of the frames the rule picks, bitwise",
                 vectors["raw"][: vectors["rows"] * vectors["columns"] * 4]
                 == frames_engine["embeddings"]["raw"][: vectors["rows"] * vectors["columns"] * 4])

    paths = [workdir / f"clip{index}.avi" for index in range(len(clips))]
    from_files = engine.encode_videos(model, paths, arena, kind="files")
    report.check("files == the same bytes in memory, bitwise", harness.same_bitwise(from_files, from_memory))
    report.check("stats: items, failed, bytes",
                 (from_files["stats"].items, from_files["stats"].failed, from_files["stats"].bytes)
                 == (len(clips), 0, sum(len(blob) for blob in clips)))
    deferred = engine.encode_videos(model, clips, side_arena, executor=executor, deferred=True)
    report.check("RAM executor of 2 threads, deferred == calling thread, bitwise", harness.same_bitwise(deferred, from_memory))

    for width in info.matryoshka[: info.matryoshka_count]:
        narrow = engine.encode_videos(model, clips, arena, outputs=OUTPUT_EMBEDDINGS, matryoshka=width)
        harness.compare_rows(report, f"matryoshka {width} vs reference", narrow["embeddings"]["values"],
                             expected.matryoshka(width))

    batch = clips[:2] + [b"a text file, not a clip\n"] + clips[2:]
    mixed = engine.encode_videos(model, batch, arena)
    good = [0, 1, 3, 4]
    report.check("a text file answers FORMAT alone, the others as before",
                 mixed["statuses"] == [OK, OK, FORMAT, OK, OK]
                 and not mixed["embeddings"]["values"][2].any()
                 and np.array_equal(mixed["embeddings"]["values"][good], from_memory["embeddings"]["values"]),
                 f"{mixed['statuses']}")


def built_with_ffmpeg(engine, path: Path) -> bool:
    """A build without FFmpeg answers UNSUPPORTED for every call (and says why)."""
    with harness.loaded(engine, path) as model:
        arena = engine.arena()
        try:
            engine.encode_videos(model, [b"not a clip"], arena)
            return True
        except harness.EngineError as error:
            if error.status == UNSUPPORTED and "FFmpeg" in str(error):
                return False
            raise
        finally:
            engine.library.uform_arena_free(arena)


def main(argv=None) -> int:
    args = harness.parse_arguments(__doc__, argv)
    workdir = harness.open_workdir(args, "video")
    report = harness.Report()
    engine = harness.open_engine(args.library)
    if engine is None:
        return 1
    callable_engine = harness.check_layouts(report, args.header, workdir)
    checkpoints = harness.write_standard_checkpoints(args.tiny_checkpoint_tool, workdir, "video", "image", seeds=(3, 4))
    if checkpoints is None:
        return 1
    checkpoints = [checkpoints[0], checkpoints[2]]  # the tiny default, and the sharp one
    if not callable_engine:
        return harness.summary(report)
    if not built_with_ffmpeg(engine, checkpoints[0][1]):
        print(f"SKIP: {args.library} is built without FFmpeg: uform_video_encode answers UNSUPPORTED")
        return SKIP
    harness.check_each(report, checkpoints, lambda label, path: check_checkpoint(engine, report, label, path, workdir))
    harness.check_each(report, harness.with_i8_weights(checkpoints),
                       lambda label, path: check_checkpoint(engine, report, label, path, workdir, "i8"))
    return harness.summary(report)


if __name__ == "__main__":
    sys.exit(main())
