#!/usr/bin/env python3
"""The C engine's image tower against the independent PyTorch reference (uform_reference.py), and its
JPEG and PNG decoding against Pillow's.

    test_image_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/tools/uform_tiny_checkpoint --workdir build/reference-image

Writes two seeded checkpoints with the tool (the tiny default: size 32, patch 8; and depth 4 hidden
256) and a third derived from the second with sharper attention (the image tower's q and k rows x4,
exact in BF16), then, through ctypes (harness.py's mirror of uform.h, checked against it by a
compiled probe):

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

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from interpreter import run_under_python_with  # noqa: E402

if __name__ == "__main__":
    run_under_python_with(["torch", "numpy", "PIL"])

import numpy as np  # noqa: E402

import harness  # noqa: E402  (the ctypes mirror, Engine, Report)
import uform_reference as ref  # noqa: E402
from harness import BF16, COSINE_MIN, FORMAT, INVALID_ARGUMENT, IO, OK, OUTPUT_EMBEDDINGS  # noqa: E402


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


def check_pixels(engine, report, model, tower, arenas, executors):
    images = test_images(seed=17)
    expected = tower.encode(images)
    first = harness.encode_on_receivers(
        report, "pixels",
        lambda executor, arena, deferred: engine.encode_images(model, images, arena, executor=executor, deferred=deferred),
        harness.receivers(arenas["host"], executors, arenas))
    if first is None:
        return
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
    harness.compare_encodings(report, "pixels", first, expected, states_maximum=harness.states_max(tower))

    info = engine.info(model)
    for width in info.matryoshka[: info.matryoshka_count]:
        narrow = engine.encode_images(model, images, arenas["host"], outputs=OUTPUT_EMBEDDINGS, matryoshka=width)
        harness.compare_rows(report, f"pixels: matryoshka {width} vs reference", narrow["embeddings"]["values"],
                             expected.matryoshka(width))
    harness.check_bf16_outputs(report, "pixels", engine.encode_images(model, images, arenas["host"], scalar=BF16), first)

    # A bad span among good items: it fails alone, its rows zero, the others as before.
    bad = list(images[:3]) + [(images[3].tobytes()[:-1],) + images[3].shape[:2]] + list(images[4:6])
    result = engine.encode_images(model, bad, arenas["host"])
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


def check_decoding(engine, report, model, tower, arena, workdir: Path):
    files = pillow_files(workdir)
    decoded = [ref.pillow_rgb(path) for _, path, _ in files]
    try:
        from_files = engine.encode_images(model, [path for _, path, _ in files], arena, kind="files")
        from_memory = engine.encode_images(model, [path.read_bytes() for _, path, _ in files], arena, kind="memory")
        from_pixels = engine.encode_images(model, decoded, arena)
    except harness.EngineError as error:
        report.check("uform_image_encode over Pillow's files", False, str(error))
        return
    report.check("decoding: every file decodes", from_files["statuses"] == [OK] * len(files),
                 f"{from_files['statuses']}")
    report.check("decoding: stats bytes are the files' bytes",
                 from_files["stats"].bytes == sum(path.stat().st_size for _, path, _ in files),
                 f"{from_files['stats'].bytes}")
    report.check("decoding: files == the same bytes in memory, bitwise", harness.same_bitwise(from_files, from_memory))
    for index, (name, _, lossless) in enumerate(files):
        same = all(np.array_equal(from_files[k]["values"][rows], from_pixels[k]["values"][rows])
                   for k, rows in (("embeddings", [index]), ("states", [index]),
                                   ("token_vectors", slice(index * tower.patches, (index + 1) * tower.patches))))
        if lossless:
            report.check(f"decoding {name}: engine == pixels of Pillow's decode, bitwise", same)
        else:
            cosine = harness.cosines(from_files["embeddings"]["values"][[index]],
                                       from_pixels["embeddings"]["values"][[index]]).min()
            report.check(f"decoding {name}: engine vs pixels of Pillow's decode", same or cosine >= COSINE_MIN,
                         "bitwise equal" if same else f"cosine {cosine:.6f} (libjpeg-turbo builds differ)")
    expected = tower.encode(decoded)
    harness.compare_encodings(report, "decoding, end to end", from_files, expected,
                              states_maximum=harness.states_max(tower))

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
    result = engine.encode_images(model, batch, arena, kind="files")
    report.check("broken files: FORMAT, FORMAT, FORMAT, IO among good ones",
                 result["statuses"] == [OK, FORMAT, FORMAT, FORMAT, IO, OK] and result["stats"].failed == 4,
                 f"{result['statuses']}")
    rows = result["embeddings"]["values"]
    report.check("broken files: the good ones equal their batch-free values",
                 np.array_equal(rows[0], from_files["embeddings"]["values"][0])
                 and np.array_equal(rows[5], from_files["embeddings"]["values"][jpeg_index]) and not rows[1:5].any())


FEATURE_JPEG, FEATURE_SPNG = 1 << 2, 1 << 3  # uform_feature_t


def check_checkpoint(engine, report, label: str, path: Path, workdir: Path, weights: str = "stored") -> None:
    print(f"\n== {label}: {path}", flush=True)
    reference = ref.Reference(str(path))
    tower = reference.image
    if weights == "i8":
        ref.quantize_blocks(tower)
    image = reference.config["image"]
    with harness.loaded(engine, path, weights=weights) as model, harness.executors_and_arenas(engine) as (executors, arenas):
        info = engine.info(model)
        report.check("model info matches the image metadata",
                     info.has_image and (info.image.size, info.image.patch, info.image.transformer.hidden)
                     == (image["size"], image["patch"], image["hidden"]),
                     f"size {info.image.size} patch {info.image.patch} hidden {info.image.transformer.hidden}")
        check_pixels(engine, report, model, tower, arenas, executors)
        features = engine.library.uform_features()
        if features & FEATURE_JPEG and features & FEATURE_SPNG:
            check_decoding(engine, report, model, tower, arenas["host"], workdir)
        else:  # a build without the codecs answers UNSUPPORTED per item: tests/encode/test_image.c checks that
            print("  skip decoding: this build has no libjpeg-turbo or no libspng", flush=True)


def main(argv=None) -> int:
    args = harness.parse_arguments(__doc__, argv)
    workdir = harness.open_workdir(args, "image")
    report = harness.Report()
    callable_engine = harness.check_layouts(report, args.header, workdir)
    checkpoints = harness.write_standard_checkpoints(args.tiny_checkpoint_tool, workdir, "image", "image")
    engine = harness.open_engine(args.library)
    if checkpoints is None or engine is None:
        return 1
    if callable_engine:
        harness.check_each(report, checkpoints,
                           lambda label, path: check_checkpoint(engine, report, label, path, workdir),
                           hint=" (the image tower is not built: this test fails until it works)")
        harness.check_each(report, harness.with_i8_weights(checkpoints),
                           lambda label, path: check_checkpoint(engine, report, label, path, workdir, "i8"))
    return harness.summary(report)


if __name__ == "__main__":
    sys.exit(main())
