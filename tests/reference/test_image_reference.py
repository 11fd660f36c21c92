#!/usr/bin/env python3
"""The C engine's image tower against the independent PyTorch reference (uform_reference.py), and its
JPEG and PNG decoding against Pillow's.

    test_image_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/src/tools/uform_tiny_checkpoint --workdir build/reference-image

Writes two seeded checkpoints with the tool (the tiny default: size 32, patch 8; and depth 4 hidden
256) and a third derived from the second with sharper attention (the image tower's q and k rows x4,
exact in BF16), then, through ctypes (the text test's mirror, extended with the image verbs and
checked against uform.h by the same compiled probe):

  - pixels: images of varied shapes (1x1, thin either way, exactly `size`, larger, not square) through
    uform_image_encode_pixels against the reference's resize (F.interpolate, antialiased bilinear),
    centre crop, normalization, patches and tower: embeddings, token vectors, states, matryoshka
    widths, BF16 output; on the calling thread, RAM executors of 1 and 2 threads and deferred, which
    must agree bitwise; a bad span in the batch fails alone;
  - decoding: files written by Pillow (PNG RGB, greyscale, RGBA, palette; JPEG 4:2:0, 4:4:4, greyscale,
    progressive; one of each at exactly `size`, where resizing is the identity) through uform_image_encode from files and from memory, against
    uform_image_encode_pixels on Pillow's decode of the same files: PNG must agree bitwise (lossless,
    one right answer), JPEG at cosine >= 0.999 (and is reported when bitwise equal, as it is when
    Pillow and the engine link the same libjpeg-turbo); and against the reference end to end;
  - broken files (truncated, not an image, missing) answer their per-item status in a good batch.

Exit status: 0 pass, 1 fail, 77 skip (no PyTorch or no Pillow in any interpreter found).

Tolerances, as the text test's: embeddings and token vectors cosine >= 0.999 per row; states relative
L2 <= 1e-2 per row (the engine may round GEMM inputs, normalized pixels included, to BF16).
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


def _interpreter_with_torch_and_pillow() -> None:
    """Meson may find a python3 without PyTorch or Pillow: re-run this script under one that has
    both (the project's .venv, Debian's /usr/bin/python3), else skip. Done before importing the text
    test's module, which imports the reference and so PyTorch."""
    try:
        import PIL  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("UFORM_REFERENCE_REEXEC"):
        print(f"SKIP: PyTorch or Pillow cannot be imported by {sys.executable}")
        sys.exit(77)
    here = os.path.realpath(sys.executable)
    for candidate in (HERE.parents[1] / ".venv" / "bin" / "python3", Path("/usr/bin/python3")):
        if not candidate.exists() or os.path.realpath(candidate) == here:
            continue
        if subprocess.run([str(candidate), "-c", "import torch, numpy, PIL"], capture_output=True).returncode == 0:
            print(f"note: {sys.executable} lacks PyTorch or Pillow; running under {candidate}", flush=True)
            os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, "UFORM_REFERENCE_REEXEC": "1"})
    print(f"SKIP: PyTorch or Pillow cannot be imported by {sys.executable}, the .venv or /usr/bin/python3")
    sys.exit(77)


if __name__ == "__main__":
    _interpreter_with_torch_and_pillow()

sys.path.insert(0, str(HERE))
import numpy as np  # noqa: E402

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


class uform_image_encode_args_t(text_test.Struct):
    c_name = "uform_image_encode_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
                ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(text_test.uform_encode_config_t)),
                ("encoded", ctypes.POINTER(text_test.uform_encoded_t)), ("outcome", ctypes.c_void_p),
                ("images", text_test.uform_tape_t), ("source", c_status)]


class uform_image_encode_pixels_args_t(text_test.Struct):
    c_name = "uform_image_encode_pixels_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
                ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(text_test.uform_encode_config_t)),
                ("encoded", ctypes.POINTER(text_test.uform_encoded_t)), ("outcome", ctypes.c_void_p),
                ("pixels", text_test.uform_tape_t), ("heights", ctypes.POINTER(c_size)),
                ("widths", ctypes.POINTER(c_size))]


class ImageEngine:
    """The image verbs over the text test's Engine."""

    def __init__(self, engine):
        self.engine = engine
        library = engine.library
        library.uform_image_encode.restype = c_status
        library.uform_image_encode.argtypes = [ctypes.POINTER(uform_image_encode_args_t)]
        library.uform_image_encode_pixels.restype = c_status
        library.uform_image_encode_pixels.argtypes = [ctypes.POINTER(uform_image_encode_pixels_args_t)]

    def encode(self, model, items, arena, kind="pixels", outputs=EVERYTHING, executor=None, scalar=F32,
               matryoshka=0, deferred=False) -> dict:
        """`kind` "pixels": items are uint8 arrays [height, width, 3] (or (bytes, height, width) for a
        deliberately wrong span); "files": paths; "memory": encoded bytes. Copies every view out."""
        engine = self.engine
        heights = widths = None
        if kind == "pixels":
            blobs, shape = [], []
            for item in items:
                if isinstance(item, tuple):
                    blobs.append(item[0])
                    shape.append(item[1:])
                else:
                    blobs.append(np.ascontiguousarray(item, dtype=np.uint8).tobytes())
                    shape.append(item.shape[:2])
            heights = (c_size * len(items))(*[h for h, _ in shape])
            widths = (c_size * len(items))(*[w for _, w in shape])
        elif kind == "files":
            blobs = [str(path).encode() for path in items]
        else:
            blobs = [bytes(item) for item in items]
        tape, keep = text_test._tape(blobs)
        stats = text_test.uform_encode_stats_t()
        config = text_test.uform_encode_config_t(scalar, matryoshka, text_test.uform_progress_t(), ctypes.pointer(stats))
        encoded = text_test.uform_encoded_t()
        outcome = text_test.Outcome(engine.library) if deferred else None
        common = (model, executor, outputs, arena, ctypes.pointer(config), None if deferred else ctypes.pointer(encoded),
                  outcome.pointer if outcome else None, tape)
        if kind == "pixels":
            args = uform_image_encode_pixels_args_t(*common, heights, widths)
            verb = engine.library.uform_image_encode_pixels
        else:
            args = uform_image_encode_args_t(*common, SOURCE_FILES if kind == "files" else SOURCE_MEMORY)
            verb = engine.library.uform_image_encode
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
            del keep, heights, widths
            if outcome is not None:
                outcome.destroy()


# ------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------


def test_images(seed: int) -> list:
    """Smooth pictures with texture, of varied shapes."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 1), (3, 2), (7, 300), (300, 7), (32, 32), (31, 33), (64, 48), (45, 100), (200, 200), (480, 640),
              (17, 1000)]
    images = []
    for height, width in shapes:
        y, x = np.mgrid[0:height, 0:width]
        phases = rng.uniform(0, 6.28, 3)
        channels = [128 + 100 * np.sin(0.05 * x * (c + 1) + 0.08 * y + phases[c]) for c in range(3)]
        noise = rng.normal(0, 12, (height, width, 3))
        images.append(np.clip(np.stack(channels, axis=-1) + noise, 0, 255).astype(np.uint8))
    return images


def compare_encodings(report, label, result, expected, hidden):
    """Engine views (F32) against a reference ImageEncoding."""
    compare = text_test.compare_rows
    compare(report, f"{label}: embeddings vs reference", result["embeddings"]["values"], expected.embeddings)
    compare(report, f"{label}: token vectors vs reference", result["token_vectors"]["values"],
            expected.stacked_token_vectors())
    states = result["states"]["values"]
    relative = np.linalg.norm(states - expected.states, axis=1) / np.linalg.norm(expected.states, axis=1)
    report.check(f"{label}: states vs reference, relative L2", relative.max() <= STATE_RELATIVE_L2_MAX,
                 f"max {relative.max():.2e} (item {int(np.argmax(relative))}, <= {STATE_RELATIVE_L2_MAX})")


def check_pixels(images_engine, report, model, tower, arenas, executors):
    engine = images_engine.engine
    images = test_images(seed=17)
    expected = tower.encode(images)
    receivers = [("calling thread", None, arenas["host"], False),
                 ("RAM executor, 1 thread", executors[1], arenas[1], False),
                 ("RAM executor, 2 threads", executors[2], arenas[2], False),
                 ("RAM executor, 2 threads, deferred", executors[2], arenas[2], True)]
    results = {}
    for name, executor, arena, deferred in receivers:
        try:
            results[name] = images_engine.encode(model, images, arena, executor=executor, deferred=deferred)
        except text_test.EngineError as error:
            report.check(f"uform_image_encode_pixels on the {name}", False, str(error))
            return
    first_name, first = receivers[0][0], results[receivers[0][0]]
    for name, _, _, _ in receivers[1:]:
        report.check(f"pixels: {name} == {first_name}, bitwise",
                     all(first[k]["raw"] == results[name][k]["raw"] for k in ("embeddings", "token_vectors", "states")))
    report.check("pixels: one status per item, all OK", first["statuses"] == [OK] * len(images), f"{first['statuses']}")
    stats = first["stats"]
    report.check("pixels: stats items, failed, bytes",
                 (stats.items, stats.failed, stats.bytes) == (len(images), 0, sum(i.size for i in images)),
                 f"{stats.items}, {stats.failed}, {stats.bytes}")
    vectors = first["token_vectors"]
    report.check("pixels: token vectors grouped per item, one per patch",
                 vectors["offsets"] is not None and np.array_equal(vectors["offsets"] - vectors["offsets"][0],
                                                                  np.arange(len(images) + 1) * tower.patches),
                 f"{None if vectors['offsets'] is None else vectors['offsets'].tolist()}")
    compare_encodings(report, "pixels", first, expected, tower.config.hidden)

    info = engine.info(model)
    for width in info.matryoshka[: info.matryoshka_count]:
        narrow = images_engine.encode(model, images, arenas["host"], outputs=OUTPUT_EMBEDDINGS, matryoshka=width)
        text_test.compare_rows(report, f"pixels: matryoshka {width} vs reference", narrow["embeddings"]["values"],
                               expected.matryoshka(width))
    converted = images_engine.encode(model, images, arenas["host"], scalar=BF16)
    for output in ("embeddings", "token_vectors", "states"):
        got = converted[output]["values"].astype(np.float32)
        want = ref.to_bf16(first[output]["values"].astype(np.float32))
        report.check(f"pixels: BF16 {output} == F32 rounded", np.array_equal(got, want),
                     f"{100 * np.mean(got == want):.2f}% equal")

    # A bad span among good items: it fails alone, its rows zero, the others as before.
    bad = list(images[:3]) + [(images[3].tobytes()[:-1],) + images[3].shape[:2]] + list(images[4:6])
    result = images_engine.encode(model, bad, arenas["host"])
    report.check("pixels: a short span answers INVALID_ARGUMENT, the rest OK",
                 result["statuses"] == [OK, OK, OK, INVALID_ARGUMENT, OK, OK], f"{result['statuses']}")
    rows = result["embeddings"]["values"]
    good = [0, 1, 2, 4, 5]
    report.check("pixels: the failed item's rows are zero, the others equal their batch-free values",
                 not rows[3].any() and not result["states"]["values"][3].any()
                 and np.array_equal(rows[good], first["embeddings"]["values"][[0, 1, 2, 4, 5]])
                 and result["stats"].failed == 1)


def pillow_files(workdir: Path) -> list:
    """(label, path, lossless) of images written by Pillow."""
    from PIL import Image

    rng = np.random.default_rng(23)
    y, x = np.mgrid[0:60, 0:80]
    base = np.stack([128 + 100 * np.sin(0.09 * x + 0.05 * y * (c + 1)) for c in range(3)], axis=-1)
    rgb = np.clip(base + rng.normal(0, 15, base.shape), 0, 255).astype(np.uint8)
    exact = np.clip(rng.normal(128, 60, (32, 32, 3)), 0, 255).astype(np.uint8)  # the tiny size: no resizing
    files = []

    def save(name, image, lossless, **options):
        path = workdir / name
        image.save(path, **options)
        files.append((name, path, lossless))

    save("rgb.png", Image.fromarray(rgb), True)
    save("exact.png", Image.fromarray(exact), True)
    save("grey.png", Image.fromarray(rgb[..., 1]), True)
    rgba = np.concatenate([rgb, rng.integers(0, 256, rgb.shape[:2] + (1,), dtype=np.uint8)], axis=-1)
    save("rgba.png", Image.fromarray(rgba, "RGBA"), True)
    save("palette.png", Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=64), True)
    save("q90-420.jpg", Image.fromarray(rgb), False, quality=90, subsampling=2)
    save("q95-444.jpg", Image.fromarray(rgb), False, quality=95, subsampling=0)
    save("exact.jpg", Image.fromarray(exact), False, quality=92)
    save("grey.jpg", Image.fromarray(rgb[..., 0]), False, quality=90)
    save("progressive.jpg", Image.fromarray(rgb), False, quality=85, progressive=True)
    return files


def check_decoding(images_engine, report, model, tower, arena, workdir: Path):
    files = pillow_files(workdir)
    decoded = [ref.pillow_rgb(path) for _, path, _ in files]
    try:
        from_files = images_engine.encode(model, [path for _, path, _ in files], arena, kind="files")
        from_memory = images_engine.encode(model, [path.read_bytes() for _, path, _ in files], arena, kind="memory")
        from_pixels = images_engine.encode(model, decoded, arena)
    except text_test.EngineError as error:
        report.check("uform_image_encode over Pillow's files", False, str(error))
        return
    report.check("decoding: every file decodes", from_files["statuses"] == [OK] * len(files),
                 f"{from_files['statuses']}")
    report.check("decoding: stats bytes are the files' bytes",
                 from_files["stats"].bytes == sum(path.stat().st_size for _, path, _ in files),
                 f"{from_files['stats'].bytes}")
    report.check("decoding: files == the same bytes in memory, bitwise",
                 all(from_files[k]["raw"] == from_memory[k]["raw"] for k in ("embeddings", "token_vectors", "states")))
    for index, (name, _, lossless) in enumerate(files):
        same = all(np.array_equal(from_files[k]["values"][rows], from_pixels[k]["values"][rows])
                   for k, rows in (("embeddings", [index]), ("states", [index]),
                                   ("token_vectors", slice(index * tower.patches, (index + 1) * tower.patches))))
        if lossless:
            report.check(f"decoding {name}: engine == pixels of Pillow's decode, bitwise", same)
        else:
            cosine = text_test.cosines(from_files["embeddings"]["values"][[index]],
                                       from_pixels["embeddings"]["values"][[index]]).min()
            report.check(f"decoding {name}: engine vs pixels of Pillow's decode", same or cosine >= COSINE_MIN,
                         "bitwise equal" if same else f"cosine {cosine:.6f} (libjpeg-turbo builds differ)")
    expected = tower.encode(decoded)
    compare_encodings(report, "decoding, end to end", from_files, expected, tower.config.hidden)

    # Broken files in a good batch answer their own statuses.
    jpeg_index = next(i for i, (name, _, _) in enumerate(files) if name.endswith(".jpg"))
    good = files[0][1].read_bytes()
    jpeg = files[jpeg_index][1].read_bytes()
    broken = {"truncated.png": good[: len(good) // 2], "truncated.jpg": jpeg[: len(jpeg) // 2],
              "text.jpg": b"not an image at all\n"}
    for name, blob in broken.items():
        (workdir / name).write_bytes(blob)
    batch = [files[0][1], workdir / "truncated.png", workdir / "truncated.jpg", workdir / "text.jpg",
             workdir / "absent.png", files[jpeg_index][1]]
    result = images_engine.encode(model, batch, arena, kind="files")
    report.check("broken files: FORMAT, FORMAT, FORMAT, IO among good ones",
                 result["statuses"] == [OK, FORMAT, FORMAT, FORMAT, IO, OK] and result["stats"].failed == 4,
                 f"{result['statuses']}")
    rows = result["embeddings"]["values"]
    report.check("broken files: the good ones equal their batch-free values",
                 np.array_equal(rows[0], from_files["embeddings"]["values"][0])
                 and np.array_equal(rows[5], from_files["embeddings"]["values"][jpeg_index]) and not rows[1:5].any())


FEATURE_JPEG, FEATURE_SPNG = 1 << 2, 1 << 3  # uform_feature_t


def check_checkpoint(engine, report, label: str, path: Path, workdir: Path) -> None:
    print(f"\n== {label}: {path}", flush=True)
    model = engine.load(str(path))
    reference = ref.Reference(str(path))
    tower = reference.image
    info = engine.info(model)
    image = reference.config["image"]
    report.check("model info matches the image metadata",
                 info.has_image and (info.image.size, info.image.patch, info.image.transformer.hidden)
                 == (image["size"], image["patch"], image["hidden"]),
                 f"size {info.image.size} patch {info.image.patch} hidden {info.image.transformer.hidden}")
    images_engine = ImageEngine(engine)
    executors, arenas = {}, {"host": engine.arena()}
    try:
        for threads in (1, 2):
            executors[threads] = engine.ram_executor(threads)
            arenas[threads] = engine.arena(executors[threads])
        check_pixels(images_engine, report, model, tower, arenas, executors)
        features = engine.library.uform_features()
        if features & FEATURE_JPEG and features & FEATURE_SPNG:
            check_decoding(images_engine, report, model, tower, arenas["host"], workdir)
        else:  # a build without the codecs answers UNSUPPORTED per item: tests/test_image.c checks that
            print("  skip decoding: this build has no libjpeg-turbo or no libspng", flush=True)
    finally:
        for arena in arenas.values():
            engine.library.uform_arena_free(arena)
        for executor in executors.values():
            engine.library.uform_executor_free(executor)
        engine.library.uform_model_free(model)


def sharpen_image_checkpoint(source: Path, target: Path, factor: int = 4) -> None:
    """Copies a checkpoint with the image tower's q and k rows (weights and biases) multiplied by
    `factor`, a power of two, so exact in BF16: the tool's small weights leave attention nearly
    uniform, which would hide attention that leaks between items or masks causally."""
    import json
    import re

    blob = bytearray(source.read_bytes())
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(bytes(blob[8 : 8 + length]))
    base = 8 + length
    hidden = int(json.loads(header["__metadata__"]["uform"])["image"]["hidden"])
    for name, info in header.items():
        if not re.fullmatch(r"image\.blocks\.\d+\.attn\.qkv\.(weight|bias)", name):
            continue
        begin, end = info["data_offsets"]
        values = ref.bf16_bits_to_f32(np.frombuffer(bytes(blob[base + begin : base + end]), np.uint16))
        values = values.reshape(info["shape"]).copy()
        values[: 2 * hidden] *= factor
        blob[base + begin : base + end] = ref.f32_to_bf16_bits(values.reshape(-1)).tobytes()
    target.write_bytes(bytes(blob))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", required=True, help="libuform.so")
    parser.add_argument("--tiny-checkpoint-tool", required=True, help="the uform_tiny_checkpoint executable")
    parser.add_argument("--workdir", default=None, help="where checkpoints and images go (default: a temporary folder)")
    parser.add_argument("--header", default=str(REPOSITORY / "include" / "uform.h"), help="uform.h, for the layout probe")
    args = parser.parse_args(argv)

    text_test._preload_sanitizer(args.library)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="uform-image-reference-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = text_test.Report()

    print("== ctypes layouts", flush=True)
    text_test.MIRRORED.extend([uform_image_encode_args_t, uform_image_encode_pixels_args_t])
    differences = text_test.probe_layouts(Path(args.header), workdir)
    if differences is None:
        print("  --   no C compiler: struct layouts are not checked against the header")
    else:
        report.check(f"every mirrored struct's size, alignment and offsets match {Path(args.header).name}",
                     not differences, "\n       ".join([""] + differences))

    checkpoints = [("tiny default", workdir / "image-reference-tiny.safetensors", ["--seed", "1"]),
                   ("depth 4, hidden 256", workdir / "image-reference-256.safetensors",
                    ["--seed", "2", "--depth", "4", "--hidden", "256"])]
    for label, path, flags in checkpoints:
        written = subprocess.run([args.tiny_checkpoint_tool, str(path), *flags], capture_output=True, text=True)
        if written.returncode != 0:
            print(f"FAIL: {args.tiny_checkpoint_tool} {path} {' '.join(flags)}: {written.stdout}{written.stderr}")
            return 1
    sharp = workdir / "image-reference-256-sharp.safetensors"
    sharpen_image_checkpoint(checkpoints[1][1], sharp)
    checkpoints.append(("depth 4, hidden 256, image q and k x4 (sharp attention)", sharp, []))

    try:
        engine = text_test.Engine(args.library)
    except (OSError, AttributeError) as error:
        print(f"FAIL: cannot load {args.library} through ctypes: {error}")
        return 1
    if differences:
        print("\nthe ctypes mirror does not match uform.h: the engine is not called")
    else:
        for label, path, _ in checkpoints:
            try:
                check_checkpoint(engine, report, label, path, workdir)
            except text_test.EngineError as error:
                hint = " (the image tower is not built: this test fails until it works)" if error.status == UNSUPPORTED else ""
                report.check(label, False, f"{error}{hint}")

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
