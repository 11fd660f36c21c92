#!/usr/bin/env python3
"""The Python package `uform` (python/) against the engine's own command and the references.

    test_uform.py --uform build/tools/uform --workdir DIR [pytest arguments]

Run by `meson test --suite python` with the package built in the tree (PYTHONPATH=build/python). Numbers
are asserted bit for bit: the demo model's embeddings of texts, images, clips and sounds against `uform
encode` (clips and sounds through --manifest), float32 samples against the same samples in a WAV, a
pretrained folder's embeddings too (a tiny sentence-transformers BERT, tests/model/pretrained_folders.py)
and that folder converted to a checkpoint, and the tokenizer's ids, spans and token strings against Hugging
Face's tokenizers; text_choose's probabilities against the softmax of the states through the checkpoint's
byte table (within 1e-6: the command has no choice verb). Run by pytest (Debian's python3-pytest), or by
unittest where pytest does not import (outside CI: under CI=true that fails), so that it needs nothing beyond
NumPy; the pretrained folder needs transformers and tokenizers, the Arrow export pyarrow, and each is skipped
without them (under CI=true it fails instead).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

try:
    import numpy as np
except ImportError:  # the package needs NumPy at run time; meson counts exit status 77 as skipped
    print("numpy does not import: the package's tests are skipped (pip install numpy, or python3-numpy)")
    sys.exit(1 if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes") else 77)

SOURCE = Path(__file__).resolve().parents[2]
DEMO = SOURCE / "models" / "demo.safetensors"
IMAGES = SOURCE / "tests" / "fuzz-corpus" / "image_decode"
TEXTS = ["a photo of a cat", "", "Ünïcödé text, with accents", "x" * 300, "  padded  "]
# Set by main(), and through the environment for the copy of this module that pytest imports.
options = argparse.Namespace(uform=os.environ.get("UFORM_TEST_COMMAND", ""),
                             workdir=os.environ.get("UFORM_TEST_WORKDIR", ""))


def preload_sanitizer() -> None:
    """An extension built with -fsanitize=address needs the ASan runtime first in the process: run again
    with it preloaded (and leak checking off, for the interpreter's own allocations)."""
    # Found on the path by name: importing the package to find it would load it already.
    extensions = [path for folder in sys.path for path in Path(folder or ".").glob("uform/_uform*.so")]
    found = extensions and re.search(rb"libasan\.so\.\d+", extensions[0].read_bytes())
    if not found or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    environment = dict(os.environ)
    environment["LD_PRELOAD"] = " ".join(filter(None, [found.group().decode(), environment.get("LD_PRELOAD", "")]))
    environment["ASAN_OPTIONS"] = ":".join(filter(None, [environment.get("ASAN_OPTIONS", ""), "detect_leaks=0"]))
    os.execve(sys.executable, [sys.executable, *sys.argv], environment)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def engine_encode(model: Path, items: list, *extra: str, dtype: str = "<f4", format: str = "f32"):
    """`uform encode`'s rows of `items` (texts, or image paths before `--`): raw rows of `dtype`, or with
    format="jsonl" the parsed lines."""
    out = Path(options.workdir) / "encoded.out"
    texts = [item for item in items if isinstance(item, str)]
    images = [str(item) for item in items if isinstance(item, Path)]
    command = [options.uform, "encode", "--model", str(model), "--format", format, "--output", str(out), *extra,
               *images, "--", *texts]
    subprocess.run(command, check=True)
    if format == "jsonl":
        return [json.loads(line) for line in out.read_text().splitlines()]
    return np.fromfile(out, dtype=dtype)


def engine_encode_media(model: Path, kind: str, paths: list, *extra: str, dtype: str = "<f4", format: str = "f32"):
    """`uform encode --manifest` of `paths`, each a {kind: path} line ("video" or "audio"): raw rows of
    `dtype`, or with format="jsonl" the parsed lines."""
    manifest = Path(options.workdir) / "media.jsonl"
    manifest.write_text("".join(json.dumps({kind: str(path)}) + "\n" for path in paths))
    out = Path(options.workdir) / "encoded.out"
    subprocess.run([options.uform, "encode", "--model", str(model), "--format", format, "--output", str(out),
                    "--manifest", str(manifest), *extra], check=True)
    if format == "jsonl":
        return [json.loads(line) for line in out.read_text().splitlines()]
    return np.fromfile(out, dtype=dtype)


def write_wav(path: Path, samples: np.ndarray, rate: int, *, channels: int = 1, float32: bool = True) -> Path:
    """A WAV of `samples` (frames x channels, interleaved when flattened): IEEE float, or 16-bit PCM of
    round(sample * 32767)."""
    if float32:
        data, tag, width = np.asarray(samples, dtype="<f4").tobytes(), 3, 4
    else:
        data, tag, width = np.round(np.asarray(samples) * 32767).astype("<i2").tobytes(), 1, 2
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + len(data), b"WAVE", b"fmt ", 16, tag, channels, rate,
                         rate * channels * width, channels * width, width * 8, b"data", len(data))
    path.write_bytes(header + data)
    return path


def thread_cpu(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


if __name__ == "__main__":
    preload_sanitizer()
import uform  # noqa: E402  (after the sanitizer's runtime, where the extension needs it)


class Package(unittest.TestCase):
    def test_version_is_the_engines(self):
        project = re.search(r"version: '([0-9.]+)'", (SOURCE / "meson.build").read_text()).group(1)
        header = (SOURCE / "include" / "uform.h").read_text()
        macros = [re.search(rf"#define UFORM_VERSION_{part} (\d+)", header).group(1) for part in
                  ("MAJOR", "MINOR", "PATCH")]
        self.assertEqual(uform.__version__, project)
        self.assertEqual(uform.__version__, ".".join(macros))

    def test_features_and_statuses(self):
        self.assertIsInstance(uform.features(), frozenset)
        self.assertEqual(uform.status_name(5), "io")
        self.assertTrue(issubclass(uform.InputOutputError, OSError))
        self.assertTrue(issubclass(uform.InvalidArgumentError, ValueError))
        self.assertEqual(uform.FormatError.status, 6)

    def test_kernels_as_uform_info_names_them(self):
        kernels = uform.kernels()
        info = json.loads(subprocess.run([options.uform, "info", "--model", str(DEMO), "--json"], check=True,
                                         capture_output=True).stdout)["kernels"]
        self.assertEqual(kernels, info)
        self.assertTrue(kernels["reason"].startswith(kernels["path"] + ": ") or kernels["reason"] == "UFORM_KERNELS")
        self.assertTrue(kernels["amx"].startswith("amx: "))

    def test_executor_info(self):
        self.assertEqual(uform.Executor.inline().info["kind"], "inline")
        ram = uform.Executor.ram(threads=2)
        self.assertEqual((ram.info["kind"], ram.info["threads"]), ("ram", 2))
        ram.drain()
        with self.assertRaises(TypeError):
            uform.Executor()


class Demo(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())

    def test_info(self):
        info = self.model.info
        self.assertEqual((info.family, info.dims, info.normalized, info.vocab), ("uform", 64, True, 0))
        self.assertIn("text", info.towers)
        self.assertEqual(info.matryoshka[-1], info.dims)

    def test_texts_equal_the_command_bit_for_bit(self):
        vectors = self.model.encode_texts(TEXTS)
        self.assertEqual((vectors.shape, vectors.dtype), ((len(TEXTS), 64), np.float32))
        expected = engine_encode(DEMO, TEXTS).reshape(len(TEXTS), 64)
        self.assertEqual(vectors.tobytes(), expected.tobytes())
        as_bytes = self.model.encode_texts([text.encode() for text in TEXTS], executor=uform.Executor.ram(threads=2))
        self.assertEqual(as_bytes.tobytes(), vectors.tobytes())

    def test_matryoshka_width_equals_the_command(self):
        width = self.model.info.matryoshka[0]
        vectors = self.model.encode_texts(TEXTS, dims=width)
        expected = engine_encode(DEMO, TEXTS, "--dims", str(width)).reshape(len(TEXTS), width)
        self.assertEqual(vectors.tobytes(), expected.tobytes())

    def test_output_dtypes_equal_the_command(self):
        for dtype, scalar, raw in (("bfloat16", "bf16", "<u2"), ("float16", "f16", "<f2"), ("int8", "i8", "i1")):
            rows = self.model.encode_texts(TEXTS, dtype=dtype)
            if dtype == "int8":
                rows, scales = rows
                lines = engine_encode(DEMO, TEXTS, "--scalar", "i8", format="jsonl")
                written = np.array([line["scale"] for line in lines], dtype=np.float32)  # %.9g: exact
                self.assertEqual(scales.tobytes(), written.tobytes())
            self.assertEqual(rows.dtype, np.dtype(raw))
            self.assertEqual(rows.shape, (len(TEXTS), 64))
            self.assertEqual(rows.tobytes(), engine_encode(DEMO, TEXTS, "--scalar", scalar, dtype=raw).tobytes())
        self.assertEqual(self.model.encode_texts([], dtype="float16").dtype, np.float16)
        with self.assertRaises(ValueError):
            self.model.encode_texts(TEXTS, dtype="float64")

    def test_images_equal_the_command_bit_for_bit(self):
        wanted = {"jpg": "jpeg", "png": "spng"}
        paths = [path for path in sorted(IMAGES.iterdir()) if wanted.get(path.suffix[1:]) in uform.features()][:4]
        if not paths:
            self.skipTest("this build decodes neither JPEG nor PNG")
        vectors = self.model.encode_images(paths)
        expected = engine_encode(DEMO, paths).reshape(len(paths), 64)
        self.assertEqual(vectors.tobytes(), expected.tobytes())
        in_memory = self.model.encode_images([path.read_bytes() for path in paths])
        self.assertEqual(in_memory.tobytes(), vectors.tobytes())

    def test_pixels_equal_their_png(self):
        if "spng" not in uform.features():
            self.skipTest("this build decodes no PNG")
        try:
            from PIL import Image
        except ImportError:
            if in_ci():
                raise
            self.skipTest("the PNG of the pixels is written with Pillow (python3-pil)")
        pixels = [np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
                  for seed, (h, w) in enumerate([(40, 56), (33, 33), (64, 20)])]
        paths = []
        for i, array in enumerate(pixels):
            paths.append(Path(options.workdir) / f"pixels-{i}.png")
            Image.fromarray(array).save(paths[-1])
        vectors = self.model.encode_images(pixels)
        self.assertEqual(vectors.tobytes(), self.model.encode_images(paths).tobytes())
        self.assertEqual(vectors.tobytes(), engine_encode(DEMO, paths).tobytes())
        with self.assertRaises(TypeError):
            self.model.encode_images([pixels[0][:, ::2]])  # not contiguous
        with self.assertRaises(TypeError):
            self.model.encode_images([pixels[0], paths[0].read_bytes()])
        with self.assertRaises(TypeError):
            self.model.encode_images([pixels[0].astype(np.float32)])

    def test_outputs_equal_the_command(self):
        encoded = self.model.encode_texts(TEXTS, outputs=("embeddings", "token_vectors", "states"))
        self.assertIsInstance(encoded, uform.Encoded)
        self.assertEqual(encoded.embeddings.tobytes(), self.model.encode_texts(TEXTS).tobytes())
        lines = engine_encode(DEMO, TEXTS, "--tokens", format="jsonl")
        self.assertEqual(len(encoded.token_vectors), len(TEXTS))
        for rows, line, text in zip(encoded.token_vectors, lines, TEXTS):
            written = np.array(line["tokens"], dtype=np.float32).reshape(-1, 64)  # %.9g: exact
            self.assertEqual(rows.shape, (min(len(text.encode()), self.model.info.context), 64))
            self.assertEqual(rows.tobytes(), written.tobytes())
        self.assertEqual(encoded.states.shape[0], len(TEXTS))
        self.assertTrue(np.all(np.isfinite(encoded.states)))
        states = self.model.encode_texts(TEXTS, outputs=["states"])
        self.assertEqual((states.embeddings, states.token_vectors), (None, None))
        self.assertEqual(states.states.tobytes(), encoded.states.tobytes())
        deferred = asyncio.run(self.model.aencode_texts(TEXTS, outputs={"token_vectors"}, dtype="int8",
                                                        executor=uform.Executor.ram(threads=1)))
        self.assertEqual([len(q) for q, scales in deferred.token_vectors], [len(r) for r in encoded.token_vectors])
        nothing = self.model.encode_texts([], outputs=("embeddings", "token_vectors", "states"))
        self.assertEqual((nothing.embeddings.shape, nothing.token_vectors, nothing.states.shape[0]), ((0, 64), [], 0))
        for bad in ("embeddings", ["logits"], []):
            with self.assertRaises(ValueError):
                self.model.encode_texts(TEXTS, outputs=bad)

    def test_no_items_give_no_rows(self):
        self.assertEqual(self.model.encode_texts([]).shape, (0, 64))


class Arrow(unittest.TestCase):
    """Embeddings to pyarrow through the Arrow PyCapsule protocol: FixedSizeList<float32>, the rows' own memory."""

    @classmethod
    def setUpClass(cls):
        try:
            import pyarrow
        except ImportError:
            if in_ci():
                raise
            raise unittest.SkipTest("the Arrow checks import pyarrow (pip install pyarrow)")
        cls.pa = pyarrow
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())

    def test_no_copy_and_the_same_values(self):
        rows = self.model.encode_texts(TEXTS)
        column = self.pa.array(uform.arrow(rows))
        self.assertEqual(column.type, self.pa.list_(self.pa.float32(), 64))
        self.assertEqual((len(column), column.null_count), (len(TEXTS), 0))
        self.assertEqual(column.buffers()[2].address, rows.ctypes.data)
        self.assertEqual(column.flatten().to_numpy().tobytes(), rows.tobytes())
        answered = self.model.encode_texts(TEXTS, arrow=True)
        self.assertIsInstance(answered, uform.ArrowRows)
        self.assertEqual((len(answered), answered.rows.tobytes()), (len(TEXTS), rows.tobytes()))
        batch = self.pa.record_batch([answered, self.pa.array(range(len(TEXTS)))], names=["vector", "id"])
        self.assertEqual(batch.column(0).buffers()[2].address, answered.rows.ctypes.data)
        self.assertEqual(batch.column(0).flatten().to_numpy().tobytes(), rows.tobytes())

    def test_the_array_keeps_the_rows_alive_until_released(self):
        rows = self.model.encode_texts(TEXTS)
        expected = rows.tobytes()
        exported = uform.arrow(rows)
        before = sys.getrefcount(exported)
        column = self.pa.array(exported)
        self.assertEqual(sys.getrefcount(exported), before + 2)  # the parent's and the child's
        del rows, exported
        self.assertEqual(column.flatten().to_numpy().tobytes(), expected)
        exported = uform.arrow(self.model.encode_texts(TEXTS))
        schema, array = exported.__arrow_c_array__()
        del schema, array  # capsules never imported release what they hold
        self.assertEqual(sys.getrefcount(exported), before)
        values = self.pa.array(exported).values  # the scalars outlive the lists
        self.assertGreater(sys.getrefcount(exported), before)
        del values
        self.assertEqual(sys.getrefcount(exported), before)

    def test_float16_and_refusals(self):
        halves = self.model.encode_texts(TEXTS, arrow=True, dtype="float16")
        column = self.pa.array(halves)
        self.assertEqual(column.type, self.pa.list_(self.pa.float16(), 64))
        self.assertEqual(column.buffers()[2].address, halves.rows.ctypes.data)
        self.assertEqual(self.pa.DataType._import_from_c_capsule(halves.__arrow_c_schema__()), column.type)
        self.assertEqual(len(self.pa.array(self.model.encode_texts([], arrow=True))), 0)
        rows = self.model.encode_texts(TEXTS)
        for bad in (rows.astype(np.float64), rows[:, ::2], rows[0], np.zeros((2, 0), np.float32)):
            with self.assertRaises(TypeError):
                uform.arrow(bad)
        for options in ({"dtype": "int8"}, {"dtype": "bfloat16"}, {"outputs": ("embeddings",)}):
            with self.assertRaises(ValueError):
                self.model.encode_texts(TEXTS, arrow=True, **options)
        deferred = asyncio.run(self.model.aencode_texts(TEXTS, arrow=True, executor=uform.Executor.ram(threads=1)))
        self.assertEqual(deferred.rows.tobytes(), rows.tobytes())


class Errors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())
        cls.expected = cls.model.encode_texts(TEXTS)

    def assert_still_usable(self):
        self.assertEqual(self.model.encode_texts(TEXTS).tobytes(), self.expected.tobytes())

    def test_missing_checkpoint(self):
        with self.assertRaises(uform.InputOutputError) as caught:
            uform.Model(Path(options.workdir) / "absent.safetensors", executor=uform.Executor.inline())
        error = caught.exception
        self.assertEqual((error.status, error.function), (5, "uform_model_load_ram"))
        self.assertTrue(error.message)
        self.assertIn(error.message, str(error))

    def test_malformed_checkpoint(self):
        path = Path(options.workdir) / "malformed.safetensors"
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
        with self.assertRaises(uform.FormatError) as caught:
            uform.Model(path, executor=uform.Executor.inline())
        self.assertEqual(caught.exception.status, 6)

    def test_bad_width_then_usable(self):
        with self.assertRaises(uform.InvalidArgumentError) as caught:
            self.model.encode_texts(TEXTS, dims=7)
        self.assertEqual(caught.exception.function, "uform_text_encode")
        self.assert_still_usable()

    def test_bad_items_then_usable(self):
        with self.assertRaises(TypeError):
            self.model.encode_texts(["fine", 3])
        with self.assertRaises(TypeError):
            self.model.encode_texts("one string")
        with self.assertRaises(TypeError):
            self.model.encode_images(["a.jpg", b"\xff\xd8\xff"])
        with self.assertRaises(ValueError):
            uform.Model(DEMO, weights="f64")
        self.assert_still_usable()

    def test_undecodable_image_names_the_item(self):
        with self.assertRaises(uform.Error) as caught:
            self.model.encode_images([b"not an image"])
        self.assertIn("item 0", caught.exception.message)
        self.assert_still_usable()

    def test_i8_weights_load(self):
        model = uform.Model(DEMO, executor=uform.Executor.inline(), weights="i8")
        self.assertEqual(model.info.weights, "i8")
        cosines = np.sum(model.encode_texts(TEXTS) * self.expected, axis=1)
        self.assertTrue(np.all(cosines > 0.99), cosines)


class Media(unittest.TestCase):
    """Video clips and sounds, against `uform encode --manifest` bit for bit; samples against the same sound in
    a file."""

    VIDEOS = SOURCE / "tests" / "fuzz-corpus" / "video_decode"

    @classmethod
    def setUpClass(cls):
        if "ffmpeg" not in uform.features():
            raise unittest.SkipTest("this build decodes no video or audio (FFmpeg)")
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())
        cls.expected = cls.model.encode_texts(TEXTS)
        cls.clips = [cls.VIDEOS / name for name in ("mpeg4.mp4", "mjpeg.avi", "vp8.webm", "ffv1.mkv", "mpeg2.ts")]
        rng = np.random.default_rng(7)
        cls.samples = {}  # rate: (mono float32 samples of 1.3 s, its float WAV, its 16-bit WAV)
        for rate in (16000, 8000, 44100):
            t = np.arange(int(rate * 1.3)) / rate
            mono = (0.4 * np.sin(2 * np.pi * 330 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
            folder = Path(options.workdir)
            cls.samples[rate] = (mono, write_wav(folder / f"sound-{rate}.wav", mono, rate),
                                 write_wav(folder / f"sound-{rate}-s16.wav", mono, rate, float32=False))
        stereo = (0.3 * rng.standard_normal((16000, 2))).astype(np.float32)
        cls.stereo = (stereo, write_wav(Path(options.workdir) / "stereo.wav", stereo, 16000, channels=2))
        cls.sounds = [files[1] for files in cls.samples.values()] + [files[2] for files in cls.samples.values()]

    def assert_still_usable(self):
        self.assertEqual(self.model.encode_texts(TEXTS).tobytes(), self.expected.tobytes())

    def test_videos_equal_the_command_bit_for_bit(self):
        vectors = self.model.encode_videos(self.clips)
        self.assertEqual((vectors.shape, vectors.dtype), ((len(self.clips), 64), np.float32))
        self.assertEqual(vectors.tobytes(), engine_encode_media(DEMO, "video", self.clips).tobytes())
        in_memory = self.model.encode_videos([path.read_bytes() for path in self.clips],
                                             executor=uform.Executor.ram(threads=2))
        self.assertEqual(in_memory.tobytes(), vectors.tobytes())
        width = self.model.info.matryoshka[0]
        self.assertEqual(self.model.encode_videos(self.clips, dims=width).tobytes(),
                         engine_encode_media(DEMO, "video", self.clips, "--dims", str(width)).tobytes())

    def test_video_outputs_and_dtypes_equal_the_command(self):
        encoded = self.model.encode_videos(self.clips, outputs=("embeddings", "token_vectors", "states"))
        frames = self.model.info.video_frames
        lines = engine_encode_media(DEMO, "video", self.clips, "--tokens", format="jsonl")
        for rows, line in zip(encoded.token_vectors, lines):  # one per sampled frame
            self.assertEqual(rows.tobytes(), np.array(line["tokens"], dtype=np.float32).reshape(frames, 64).tobytes())
        self.assertEqual(encoded.states.shape, (len(self.clips), 128))
        for dtype, scalar, raw in (("bfloat16", "bf16", "<u2"), ("float16", "f16", "<f2")):
            rows = self.model.encode_videos(self.clips, dtype=dtype)
            self.assertEqual(rows.dtype, np.dtype(raw))
            self.assertEqual(rows.tobytes(),
                             engine_encode_media(DEMO, "video", self.clips, "--scalar", scalar, dtype=raw).tobytes())
        rows, scales = self.model.encode_videos(self.clips, dtype="int8")
        lines = engine_encode_media(DEMO, "video", self.clips, "--scalar", "i8", format="jsonl")
        self.assertEqual(scales.tobytes(), np.array([line["scale"] for line in lines], dtype=np.float32).tobytes())
        self.assertEqual(rows.tobytes(), np.array([line["embedding"] for line in lines], dtype=np.int8).tobytes())
        self.assertEqual(self.model.encode_videos([]).shape, (0, 64))

    def test_sounds_equal_the_command_bit_for_bit(self):
        vectors = self.model.encode_audio(self.sounds)
        self.assertEqual((vectors.shape, vectors.dtype), ((len(self.sounds), 64), np.float32))
        self.assertEqual(vectors.tobytes(), engine_encode_media(DEMO, "audio", self.sounds).tobytes())
        in_memory = self.model.encode_audio([path.read_bytes() for path in self.sounds],
                                            executor=uform.Executor.ram(threads=2))
        self.assertEqual(in_memory.tobytes(), vectors.tobytes())
        width = self.model.info.matryoshka[0]
        self.assertEqual(self.model.encode_audio(self.sounds, dims=width).tobytes(),
                         engine_encode_media(DEMO, "audio", self.sounds, "--dims", str(width)).tobytes())
        encoded = self.model.encode_audio(self.sounds[:2], outputs=("token_vectors", "states"), dtype="float16")
        lines = engine_encode_media(DEMO, "audio", self.sounds[:2], "--tokens", "--scalar", "f16", format="jsonl")
        for rows, line in zip(encoded.token_vectors, lines):  # one per patch of the clip
            self.assertEqual(rows.tobytes(), np.array(line["tokens"], dtype=np.float16).reshape(-1, 64).tobytes())
        self.assertEqual(encoded.states.shape, (2, 128))

    def test_samples_equal_their_file(self):
        """Samples give what the same samples in a file give: a float WAV (decoded to the same floats), a 16-bit
        one (each sample q / 32768), at the model's rate and resampled from others, a stereo file downmixed to
        the mean of its channels."""
        for rate, (mono, as_float, as_s16) in self.samples.items():
            from_samples = self.model.encode_audio([mono], rate=rate)
            self.assertEqual(from_samples.tobytes(), self.model.encode_audio([as_float]).tobytes(), rate)
            quantized = (np.round(mono * 32767).astype(np.int16) / np.float32(32768)).astype(np.float32)
            self.assertEqual(self.model.encode_audio([quantized], rate=rate).tobytes(),
                             self.model.encode_audio([as_s16]).tobytes(), rate)
        stereo, path = self.stereo
        self.assertEqual(self.model.encode_audio([stereo.mean(axis=1)], rate=16000).tobytes(),
                         self.model.encode_audio([path]).tobytes())
        mixed = [self.samples[rate][0] for rate in (16000, 16000)]
        self.assertEqual(self.model.encode_audio(mixed, rate=16000, executor=uform.Executor.ram(threads=2)).tobytes(),
                         self.model.encode_audio([self.samples[16000][1]] * 2).tobytes())

    def test_awaited_equals_blocking(self):
        executor = uform.Executor.ram(threads=1)
        mono = self.samples[8000][0]

        async def run():
            return await asyncio.gather(self.model.aencode_videos(self.clips, executor=executor),
                                        self.model.aencode_audio([mono], rate=8000, executor=uform.Executor.ram(threads=1)),
                                        self.model.aencode_audio(self.sounds, dtype="int8"))

        clips, sound, (rows, scales) = asyncio.run(run())
        self.assertEqual(clips.tobytes(), self.model.encode_videos(self.clips).tobytes())
        self.assertEqual(sound.tobytes(), self.model.encode_audio([mono], rate=8000).tobytes())
        expected_rows, expected_scales = self.model.encode_audio(self.sounds, dtype="int8")
        self.assertEqual((rows.tobytes(), scales.tobytes()), (expected_rows.tobytes(), expected_scales.tobytes()))
        self.assertEqual(asyncio.run(self.model.aencode_audio([])).shape, (0, 64))

    def test_progress_reports_and_cancels(self):
        reports = []
        self.model.encode_videos(self.clips, progress=lambda *r: reports.append(r))
        self.assertEqual(reports[-1], (len(self.clips), len(self.clips)))
        with self.assertRaises(uform.CancelledError):
            self.model.encode_audio(self.sounds * 20, progress=lambda *r: False)
        self.assert_still_usable()

    def test_failed_items_name_their_status(self):
        absent = Path(options.workdir) / "absent.wav"
        cases = [(self.model.encode_audio, [self.sounds[0], absent], uform.InputOutputError, "item 1"),
                 (self.model.encode_videos, [self.clips[0], Path(options.workdir) / "absent.mp4"],
                  uform.InputOutputError, "item 1"),
                 (self.model.encode_videos, [self.VIDEOS / "audio.wav"], uform.FormatError, "item 0"),
                 (self.model.encode_audio, [b"not a sound"], uform.FormatError, "item 0")]
        for encode, items, error, named in cases:
            with self.assertRaises(error) as caught:
                encode(items)
            self.assertIn(named, caught.exception.message)
            self.assertIn(caught.exception.function, ("uform_audio_encode", "uform_video_encode"))
            self.assert_still_usable()
        with self.assertRaises(uform.InvalidArgumentError) as caught:  # shorter than one patch
            self.model.encode_audio([np.zeros(100, np.float32)], rate=16000)
        self.assertIn("item 0", caught.exception.message)
        self.assert_still_usable()

    def test_bad_samples_and_rates(self):
        mono = self.samples[16000][0]
        for bad in ([mono.astype(np.float64)], [np.stack([mono, mono])], [mono[::2]], [mono, self.sounds[0]],
                    [np.zeros((10, 10, 3), np.uint8)]):
            with self.assertRaises(TypeError):
                self.model.encode_audio(bad, rate=16000)
        with self.assertRaises(TypeError):
            self.model.encode_videos([mono])
        for rate in (0, 1 << 21):
            with self.assertRaises(uform.InvalidArgumentError) as caught:
                self.model.encode_audio([mono], rate=rate)
            self.assertEqual((caught.exception.status, caught.exception.function),
                             (uform.InvalidArgumentError.status, "uform_audio_encode_samples"))
        with self.assertRaises(ValueError):
            self.model.encode_audio([mono], rate=-1)
        with self.assertRaises(ValueError):  # files carry their own rate
            self.model.encode_audio(self.sounds[:1], rate=16000)
        with self.assertRaises(uform.InvalidArgumentError):
            asyncio.run(self.model.aencode_audio([mono], executor=uform.Executor.ram(threads=1)))
        self.assertEqual(self.model.encode_audio([mono], rate=16000).tobytes(),
                         self.model.encode_audio([self.samples[16000][1]]).tobytes())
        self.assert_still_usable()


class Choose(unittest.TestCase):
    """text_choose on the demo model: each text's next byte among its legal ones, against the softmax of its
    states through the checkpoint's byte table."""

    @classmethod
    def setUpClass(cls):
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())
        cls.expected = cls.model.encode_texts(TEXTS)
        rng = np.random.default_rng(5)
        cls.choices = [bytes(rng.permutation(256)[:size].astype(np.uint8)) for size in (1, 2, 5, 17, 256)]

    @staticmethod
    def byte_table() -> np.ndarray:
        """text.embed of the demo checkpoint, BF16 widened: row b is byte b's."""
        data = DEMO.read_bytes()
        size = struct.unpack("<Q", data[:8])[0]
        tensor = json.loads(data[8:8 + size])["text.embed"]
        begin, end = (8 + size + offset for offset in tensor["data_offsets"])
        bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(tensor["shape"])

    def test_probabilities_against_the_states(self):
        chosen = self.model.choose(TEXTS, self.choices)
        states = self.model.encode_texts(TEXTS, outputs=("states",)).states
        table = self.byte_table().astype(np.float64)
        self.assertEqual(len(chosen), len(TEXTS))
        for probabilities, state, legal in zip(chosen, states, self.choices):
            self.assertEqual((probabilities.dtype, probabilities.shape), (np.float32, (len(legal),)))
            logits = table[list(legal)] @ state.astype(np.float64)
            reference = np.exp(logits - logits.max())
            reference /= reference.sum()
            self.assertLess(np.abs(probabilities - reference).max(), 1e-6)
            self.assertAlmostEqual(float(probabilities.sum(dtype=np.float64)), 1.0, delta=1e-5)

    def test_receivers_agree_and_str_is_its_bytes(self):
        first = self.model.choose(TEXTS, self.choices)
        for executor in (uform.Executor.ram(threads=2), uform.Executor.inline()):
            again = self.model.choose(TEXTS, self.choices, executor=executor)
            self.assertEqual([p.tobytes() for p in again], [p.tobytes() for p in first])
        as_str = self.model.choose(["a photo of a ca", "hello"], ["tbr", "!, "])
        as_bytes = self.model.choose([b"a photo of a ca", b"hello"], [b"tbr", b"!, "])
        self.assertEqual([p.tobytes() for p in as_str], [p.tobytes() for p in as_bytes])
        reports = []
        self.model.choose(TEXTS, self.choices, progress=lambda *r: reports.append(r))
        self.assertEqual(reports[-1], (len(TEXTS), len(TEXTS)))
        self.assertEqual(self.model.choose([], []), [])

    def test_refusals_leave_the_model_usable(self):
        for choices, text_count in (([b"aa"], 1), ([b""], 1), ([b"a", b"b"], 1)):
            with self.assertRaises(uform.InvalidArgumentError) as caught:
                self.model.choose(TEXTS[:text_count], choices)
            self.assertEqual(caught.exception.function, "uform_text_choose")
            self.assertEqual(self.model.encode_texts(TEXTS).tobytes(), self.expected.tobytes())
        with self.assertRaises(uform.CancelledError):
            self.model.choose(TEXTS, self.choices, progress=lambda *r: False)
        with self.assertRaises(TypeError):
            self.model.choose(TEXTS, [3] * len(TEXTS))
        self.assertEqual(self.model.choose(TEXTS[:1], [b"xy"])[0].shape, (2,))


class Devices(unittest.TestCase):
    """VRAM executors: made where CUDA and a device are, else refused with the engine's status, leaving every
    other executor and model as they were."""

    def test_vram_executor_or_its_refusal(self):
        model = uform.Model(DEMO, executor=uform.Executor.inline())
        expected = model.encode_texts(TEXTS)
        try:
            executor = uform.Executor.vram()
        except uform.Error as error:
            refusal = uform.DeviceError if "cuda" in uform.features() else uform.UnsupportedError
            self.assertIsInstance(error, refusal)
            self.assertEqual((error.status, error.function), (refusal.status, "uform_executor_create_vram"))
            self.assertTrue(error.message)
            executor = None
        self.assertEqual(model.encode_texts(TEXTS, executor=uform.Executor.ram(threads=1)).tobytes(),
                         expected.tobytes())
        with self.assertRaises(ValueError):
            uform.Executor.vram(devices=[-1])
        # Checked before any device is looked for, in every build (with CUDA or without).
        with self.assertRaises(uform.InvalidArgumentError):
            uform.Executor.vram(devices=[0, 0])
        with self.assertRaises(uform.InvalidArgumentError):
            uform.Executor.vram(devices=list(range(17)))
        if executor is None:
            return
        self.assertEqual(executor.info["kind"], "vram")
        on_device = uform.Model(DEMO, executor=executor)
        cosines = np.sum(on_device.encode_texts(TEXTS) * expected, axis=1)
        self.assertTrue(np.all(cosines > 0.999), cosines)
        with self.assertRaises(uform.UnsupportedError):
            uform.Model(DEMO, executor=executor, weights="i8")
        with self.assertRaises(uform.UnsupportedError):
            on_device.encode_audio([np.zeros(32000, np.float32)], rate=16000)


class Tools(unittest.TestCase):
    """The checkpoint tools: a tiny checkpoint, and a checkpoint quantized or converted, loading as the engine
    documents."""

    def test_tiny_checkpoint_is_seeded_and_whole(self):
        paths = [Path(options.workdir) / f"tiny-{i}.safetensors" for i in range(3)]
        for path, seed in zip(paths, (3, 3, 4)):
            uform.tiny_checkpoint(path, seed=seed, hidden=128)
        self.assertEqual(paths[0].read_bytes(), paths[1].read_bytes())
        self.assertNotEqual(paths[0].read_bytes(), paths[2].read_bytes())
        info = uform.Model(paths[0], executor=uform.Executor.inline()).info
        self.assertEqual((sorted(info.towers), info.context), (["audio", "image", "text", "video"], 64))
        with self.assertRaises(ValueError):
            uform.tiny_checkpoint(paths[0], depth=-1)
        with self.assertRaises(uform.InvalidArgumentError):
            uform.tiny_checkpoint(paths[0], hidden=65)

    def test_quantized_and_converted_load_as_documented(self):
        quantized, converted = (Path(options.workdir) / name for name in ("q.safetensors", "c.safetensors"))
        uform.quantize_checkpoint(DEMO, quantized)
        uform.convert_checkpoint(DEMO, converted, weights="i8")
        as_loaded = uform.Model(DEMO, executor=uform.Executor.inline(), weights="i8").encode_texts(TEXTS)
        for path in (quantized, converted):
            model = uform.Model(path, executor=uform.Executor.inline())
            self.assertEqual(model.info.weights, "i8")
            self.assertEqual(model.encode_texts(TEXTS).tobytes(), as_loaded.tobytes())
        uform.convert_checkpoint(DEMO, converted)
        self.assertEqual(uform.Model(converted, executor=uform.Executor.inline()).encode_texts(TEXTS).tobytes(),
                         uform.Model(DEMO, executor=uform.Executor.inline()).encode_texts(TEXTS).tobytes())
        with self.assertRaises(uform.InputOutputError) as caught:
            uform.convert_checkpoint(Path(options.workdir) / "absent.safetensors", converted)
        self.assertEqual(caught.exception.function, "uform_checkpoint_convert")
        with self.assertRaises(uform.InputOutputError):
            uform.quantize_checkpoint(DEMO, Path(options.workdir) / "absent-folder" / "q.safetensors")
        with self.assertRaises(ValueError):
            uform.convert_checkpoint(DEMO, converted, weights="f64")


class Threads(unittest.TestCase):
    def test_two_threads_encode_at_once(self):
        """Two Python threads, each with its own inline executor (so that each call's work is on its own
        thread's CPU clock), encode the shared model. The main thread, running Python meanwhile, sees both
        threads' CPU clocks advance within one interval while each is inside one and the same call:
        both calls ran at once, neither holding the GIL."""
        if not hasattr(time, "pthread_getcpuclockid"):
            self.skipTest("this system gives no thread's CPU clock (time.pthread_getcpuclockid)")
        model = uform.Model(DEMO, executor=uform.Executor.inline())
        batch = ["a fairly long text to keep the encoder busy for a while " * 4] * 512
        stop = threading.Event()
        calls = [0, 0]
        inside = [False, False]

        def work(index: int) -> None:
            executor = uform.Executor.inline()
            while not stop.is_set():
                inside[index] = True
                model.encode_texts(batch, executor=executor)
                inside[index] = False
                calls[index] += 1

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        overlapped = 0
        try:
            for _ in range(2000):
                before = [thread_cpu(t) for t in threads], list(calls), list(inside)
                deadline = time.thread_time() + 0.002  # the main thread's own CPU, not the wall clock
                while time.thread_time() < deadline:
                    pass
                after = [thread_cpu(t) for t in threads], list(calls), list(inside)
                same_calls = before[1] == after[1] and all(before[2]) and all(after[2])
                if same_calls and all(b < a for b, a in zip(before[0], after[0])):
                    overlapped += 1
                    if overlapped >= 3:
                        break
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        self.assertGreaterEqual(overlapped, 3, "the two calls never ran at the same time")

    def test_one_executor_from_two_threads_is_contended_or_serial(self):
        model = uform.Model(DEMO, executor=uform.Executor.ram(threads=1))
        results = []

        def work() -> None:
            for _ in range(20):
                try:
                    results.append(model.encode_texts(TEXTS).tobytes())
                except uform.ContendedError:
                    results.append("contended")

        threads = [threading.Thread(target=work) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        expected = model.encode_texts(TEXTS).tobytes()
        self.assertTrue(all(result in (expected, "contended") for result in results))


class Deferred(unittest.TestCase):
    """Deferred encodes awaited on asyncio: the loop watches each call's descriptor and runs meanwhile."""

    @classmethod
    def setUpClass(cls):
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())
        cls.expected = cls.model.encode_texts(TEXTS)

    def test_awaited_equals_blocking(self):
        executor = uform.Executor.ram(threads=1)
        vectors = asyncio.run(self.model.aencode_texts(TEXTS, executor=executor))
        self.assertEqual(vectors.tobytes(), self.expected.tobytes())
        inline = asyncio.run(self.model.aencode_texts(TEXTS))
        self.assertEqual(inline.tobytes(), self.expected.tobytes())
        self.assertEqual(asyncio.run(self.model.aencode_texts([])).shape, (0, 64))

    def test_gather_of_32_deferred_encodes(self):
        """32 deferred encodes on one loop, each on an executor of its own (an executor runs one call at a
        time), awaited by asyncio.gather: each equals its blocking call, bit for bit."""
        batches = [[f"text {i}: {TEXTS[i % len(TEXTS)]}", TEXTS[(i * 7) % len(TEXTS)]] for i in range(32)]
        executors = [uform.Executor.ram(threads=1) for _ in batches]

        async def run():
            return await asyncio.gather(*(self.model.aencode_texts(batch, executor=executor)
                                          for batch, executor in zip(batches, executors)))

        results = asyncio.run(run())
        self.assertEqual(len(results), 32)
        for batch, vectors in zip(batches, results):
            self.assertEqual(vectors.tobytes(), self.model.encode_texts(batch).tobytes())

    def test_the_loop_runs_while_two_calls_are_pending(self):
        batch = ["a fairly long text to keep the encoder busy for a while " * 4] * 256
        expected = self.model.encode_texts(batch)
        executors = [uform.Executor.ram(threads=1) for _ in range(2)]

        async def run():
            calls = [self.model.submit_texts(batch, executor=executor) for executor in executors]
            seen_pending = 0

            async def ticker():
                nonlocal seen_pending
                while not all(call.done() for call in calls):
                    seen_pending += not any(call.done() for call in calls)
                    await asyncio.sleep(0)

            results = await asyncio.gather(uform._awaited(calls[0]), uform._awaited(calls[1]), ticker())
            return results[:2], seen_pending

        results, seen_pending = asyncio.run(run())
        for vectors in results:
            self.assertEqual(vectors.tobytes(), expected.tobytes())
        self.assertGreater(seen_pending, 0, "the loop never ran while both calls were pending")

    def test_failures_and_a_held_executor(self):
        executor = uform.Executor.ram(threads=1)
        with self.assertRaises(uform.InvalidArgumentError):
            asyncio.run(self.model.aencode_texts(TEXTS, executor=executor, dims=7))
        call = self.model.submit_texts(TEXTS * 50, executor=executor)
        if not call.done():
            with self.assertRaises(uform.ContendedError):
                self.model.encode_texts(TEXTS, executor=executor)
        self.assertEqual(call.result()[:len(TEXTS)].tobytes(), self.expected.tobytes())
        with self.assertRaises(ValueError):
            call.result()
        dropped = self.model.submit_texts(TEXTS, executor=executor)
        del dropped  # waits for the engine, then hands the executor back
        self.assertEqual(self.model.encode_texts(TEXTS, executor=executor).tobytes(), self.expected.tobytes())
        with self.assertRaises(uform.Error) as caught:
            asyncio.run(self.model.aencode_images([b"not an image"], executor=executor))
        self.assertIn("item 0", caught.exception.message)


class Progress(unittest.TestCase):
    """Progress callbacks: called with (completed, total) from the executor's loop, False cancels, and an
    exception raised there cancels too and comes out of the call."""

    @classmethod
    def setUpClass(cls):
        cls.model = uform.Model(DEMO, executor=uform.Executor.inline())
        cls.expected = cls.model.encode_texts(TEXTS)
        cls.batch = ["a text of some length, " * 8] * 3000  # several chunks of 2048 tokens

    def assert_still_usable(self):
        self.assertEqual(self.model.encode_texts(TEXTS).tobytes(), self.expected.tobytes())

    def test_reports_until_done(self):
        for executor in (uform.Executor.inline(), uform.Executor.ram(threads=2)):
            reports = []
            vectors = self.model.encode_texts(TEXTS, executor=executor, progress=lambda *r: reports.append(r))
            self.assertEqual(vectors.tobytes(), self.expected.tobytes())
            self.assertTrue(reports)
            self.assertEqual(reports[-1], (len(TEXTS), len(TEXTS)))

    def test_false_cancels(self):
        reports = []

        def cancel(completed, total):
            reports.append(completed)
            return False

        with self.assertRaises(uform.CancelledError) as caught:
            self.model.encode_texts(self.batch, progress=cancel)
        self.assertEqual(caught.exception.status, 2)
        self.assertEqual(len(reports), 1)
        self.assert_still_usable()

    def test_an_exception_cancels_and_comes_out(self):
        class Stop(Exception):
            pass

        def stop(completed, total):
            raise Stop(completed)

        for executor in (uform.Executor.inline(), uform.Executor.ram(threads=2)):
            with self.assertRaises(Stop):
                self.model.encode_texts(self.batch, executor=executor, progress=stop)
        with self.assertRaises(TypeError):
            self.model.encode_texts(TEXTS, progress=3)
        self.assert_still_usable()

    def test_loads_report_bytes_and_cancel(self):
        reports = []
        model = uform.Model(DEMO, executor=uform.Executor.ram(threads=1), progress=lambda *r: reports.append(r))
        self.assertEqual(reports[-1][0], reports[-1][1])
        self.assertGreaterEqual(reports[-1][1], model.info.bytes)
        with self.assertRaises(uform.CancelledError):
            uform.Model(DEMO, executor=uform.Executor.inline(), progress=lambda *r: False)

    def test_deferred_cancels(self):
        executor = uform.Executor.ram(threads=1)
        with self.assertRaises(uform.CancelledError):
            asyncio.run(self.model.aencode_texts(self.batch, executor=executor, progress=lambda *r: False))
        self.assertEqual(self.model.encode_texts(TEXTS, executor=executor).tobytes(), self.expected.tobytes())


class Pretrained(unittest.TestCase):
    """A tiny sentence-transformers BERT with a default prompt, written by tests/model/pretrained_folders.py."""

    @classmethod
    def setUpClass(cls):
        if "tokenizers" not in uform.features():
            raise unittest.SkipTest("this build has no tokenizers (utf8proc and Oniguruma)")
        cls.folder = Path(options.workdir) / "default-prompt"
        if not (cls.folder / "folder.stamp").exists():
            try:
                import tokenizers  # noqa: F401
                import transformers  # noqa: F401
            except ImportError as missing:
                if in_ci():
                    raise
                raise unittest.SkipTest(f"the pretrained folder needs {missing.name}")
            # PyTorch writes it, without the sanitizer's runtime this process may have preloaded.
            environment = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
            subprocess.run([sys.executable, str(SOURCE / "tests" / "model" / "pretrained_folders.py"),
                            "default-prompt", str(cls.folder), "--workdir", options.workdir], check=True,
                           stdout=subprocess.DEVNULL, env=environment)
        cls.model = uform.Model(cls.folder, executor=uform.Executor.ram(threads=2))

    def test_info(self):
        info = self.model.info
        self.assertEqual((info.family, info.towers, info.normalized), ("bert", ("text",), True))
        self.assertGreater(info.vocab, 0)

    def test_texts_equal_the_command_bit_for_bit(self):
        vectors = self.model.encode_texts(TEXTS)
        expected = engine_encode(self.folder, TEXTS).reshape(vectors.shape)
        self.assertEqual(vectors.tobytes(), expected.tobytes())
        plain = self.model.encode_texts(TEXTS, prompt_name="")
        self.assertEqual(plain.tobytes(), engine_encode(self.folder, TEXTS, "--prompt-name", "").tobytes())
        self.assertNotEqual(plain.tobytes(), vectors.tobytes())

    def test_states_and_token_vectors(self):
        encoded = self.model.encode_texts(TEXTS, outputs=("embeddings", "states"))
        self.assertEqual(encoded.embeddings.tobytes(), self.model.encode_texts(TEXTS).tobytes())
        self.assertEqual(encoded.states.shape, (len(TEXTS), 384))
        self.assertIsNone(encoded.token_spans)
        # A token vector per token, with its span, as `uform encode --tokens` gives them (the folder's
        # default prompt's tokens included, spanning no byte of the text).
        tokens = self.model.encode_texts(TEXTS, outputs=("token_vectors",))
        done = subprocess.run([options.uform, "encode", "--model", str(self.folder), "--tokens", *TEXTS],
                              check=True, capture_output=True)
        rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
        self.assertEqual(len(tokens.token_vectors), len(TEXTS))
        for vectors, spans, row in zip(tokens.token_vectors, tokens.token_spans, rows):
            self.assertEqual(vectors.tobytes(), np.asarray(row["tokens"], dtype=np.float32).tobytes())
            self.assertEqual(spans.tolist(), row["spans"])

    def test_tokenize_equals_tokenizers(self):
        from tokenizers import Tokenizer as Reference
        reference = Reference.from_file(str(self.folder / "tokenizer.json"))
        texts = TEXTS + ["Hello, world! Tokenizers cut this.", "naïve café", "x " * 600]
        for special in (True, False):
            tokens = uform.Tokenizer(self.folder).tokenize(texts, special_tokens=special)
            for text, ids, spans in zip(texts, tokens.ids, tokens.spans):
                expected = reference.encode(text, add_special_tokens=special)
                self.assertEqual(ids.tolist(), expected.ids)
                utf8 = [len(text[:end].encode()) for end in range(len(text) + 1)]
                self.assertEqual([tuple(span) for span in spans.tolist()],
                                 [(utf8[a], utf8[b]) for a, b in expected.offsets])
        on_executor = uform.tokenize(self.folder, texts)
        self.assertEqual([ids.tolist() for ids in on_executor.ids],
                         [reference.encode(text).ids for text in texts])

    def test_tokenizer_errors(self):
        tokenizer = uform.Tokenizer(self.folder / "tokenizer.json")
        self.assertEqual(tokenizer.info["model"], "WordPiece")
        with self.assertRaises(uform.FormatError):
            tokenizer.tokenize([b"fine", b"\xff\xfe not UTF-8"])
        with self.assertRaises(uform.InputOutputError):
            uform.Tokenizer(Path(options.workdir) / "absent.json")
        executor = uform.Executor.inline()
        self.assertEqual(tokenizer.tokenize(["after"], executor=executor).ids[0].tolist(),
                         tokenizer.tokenize(["after"]).ids[0].tolist())
        self.assertEqual(tokenizer.tokenize([]).ids, [])


    def test_choose_is_unsupported_and_leaves_the_model_usable(self):
        expected = self.model.encode_texts(TEXTS)
        with self.assertRaises(uform.UnsupportedError) as caught:
            self.model.choose(["hello"], [b"ab"])
        error = caught.exception
        self.assertIsInstance(error, NotImplementedError)
        self.assertEqual((error.status, error.function), (9, "uform_text_choose"))
        self.assertIn("reads tokens", error.message)
        self.assertEqual(self.model.encode_texts(TEXTS).tobytes(), expected.tobytes())

    def test_choose_refused_after_encoding_the_texts(self):
        # Refused before the texts are encoded: a text that is not UTF-8 used to fail its encode first.
        for texts, choices in (([b"\xff\xfe"], [b"ab"]), ([], [])):
            with self.assertRaises(uform.UnsupportedError):
                self.model.choose(texts, choices)

    def test_hub_ids_are_found_as_huggingface_hub_finds_them(self):
        """A cache laid out as huggingface_hub downloads (blobs, snapshots of links to them, refs): each id
        and revision found where snapshot_download(local_files_only=True) finds it, or missing for both;
        the model loaded by its id, in the package and the command, equal to the folder's bit for bit."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import LocalEntryNotFoundError

        cache = Path(tempfile.mkdtemp(prefix="hub-", dir=options.workdir))
        repository = cache / "models--owner--tiny-bert"
        commits = {"main": "1" * 40, "v1.0": "2" * 40, "refs/pr/1": "3" * 40}
        for ref, commit in commits.items():
            for source in sorted(self.folder.rglob("*")):
                if not source.is_file() or source.name == "folder.stamp":
                    continue
                blob = repository / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
                blob.parent.mkdir(parents=True, exist_ok=True)
                blob.write_bytes(source.read_bytes())
                link = repository / "snapshots" / commit / source.relative_to(self.folder)
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.exists():
                    link.symlink_to(os.path.relpath(blob, link.parent))
            (repository / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
            (repository / "refs" / ref).write_text(commit)
        saved = os.environ.get("HF_HUB_CACHE")
        os.environ["HF_HUB_CACHE"] = str(cache)
        try:
            for revision in (None, "main", "v1.0", "refs/pr/1", "2" * 40, "v2", "4" * 40):
                id = "owner/tiny-bert" + (f"@{revision}" if revision else "")
                try:
                    expected = snapshot_download("owner/tiny-bert", revision=revision, cache_dir=str(cache),
                                                 local_files_only=True)
                except LocalEntryNotFoundError:
                    with self.assertRaises(uform.InputOutputError, msg=id):
                        uform.hub_folder(id)
                    continue
                self.assertEqual(uform.hub_folder(id), expected, id)
            for id in ("other/tiny-bert", "tiny-bert"):
                with self.assertRaises(uform.InputOutputError):
                    uform.hub_folder(id)
            with self.assertRaises(uform.InvalidArgumentError):
                uform.hub_folder("owner/../tiny-bert")
            by_id = uform.Model("owner/tiny-bert@v1.0", executor=uform.Executor.inline())
            self.assertEqual(by_id.encode_texts(TEXTS).tobytes(), self.model.encode_texts(TEXTS).tobytes())
            self.assertEqual(engine_encode("owner/tiny-bert", TEXTS).tobytes(),
                             engine_encode(self.folder, TEXTS).tobytes())
            cut = [subprocess.run([options.uform, "tokenize", "--model", str(model), "--", *TEXTS], check=True,
                                  stdout=subprocess.PIPE).stdout for model in ("owner/tiny-bert", self.folder)]
            self.assertEqual(cut[0], cut[1])
            with self.assertRaises(uform.InputOutputError) as caught:
                uform.Model("owner/absent")
            self.assertIn("not in the Hugging Face cache", caught.exception.message)
        finally:
            if saved is None:
                os.environ.pop("HF_HUB_CACHE", None)
            else:
                os.environ["HF_HUB_CACHE"] = saved
            shutil.rmtree(cache, ignore_errors=True)

    def test_prompts_are_the_folders(self):
        written = json.loads((self.folder / "config_sentence_transformers.json").read_text())
        self.assertEqual(self.model.prompt(), written["prompts"][written["default_prompt_name"]])
        for name, prompt in written["prompts"].items():
            self.assertEqual(self.model.prompt(name), prompt)
        self.assertEqual(self.model.prompt(""), "")
        with self.assertRaises(uform.InvalidArgumentError):
            self.model.prompt("absent")
        # The default prompt, as text, gives what the default gives.
        self.assertEqual(self.model.encode_texts(TEXTS, prompt=self.model.prompt()).tobytes(),
                         self.model.encode_texts(TEXTS).tobytes())

    def test_the_models_tokenizer_and_ids(self):
        from tokenizers import Tokenizer as Reference
        reference = Reference.from_file(str(self.folder / "tokenizer.json"))
        tokenizer = uform.Model(self.folder, executor=uform.Executor.inline()).tokenizer  # keeps its model
        self.assertIsInstance(tokenizer, uform.Tokenizer)
        self.assertEqual(tokenizer.info["vocabulary"], reference.get_vocab_size())
        texts = TEXTS[:3] + ["Hello, world! Tokenizers cut this."]
        reference.no_padding()  # the model's tokenizer cuts as its text verbs do: never padded
        self.assertEqual([ids.tolist() for ids in tokenizer.tokenize(texts).ids],
                         [reference.encode(text).ids for text in texts])
        for token in range(0, reference.get_vocab_size(), 97):
            self.assertEqual(tokenizer.token(token), reference.id_to_token(token))
        for absent in (reference.get_vocab_size(), 1 << 40, -1):
            with self.assertRaises(uform.InvalidArgumentError):
                tokenizer.token(absent)
        with self.assertRaises(TypeError):
            tokenizer.token("1")
        with self.assertRaises(uform.UnsupportedError):
            uform.Model(DEMO, executor=uform.Executor.inline()).tokenizer

    def test_tokenizer_parsed_from_memory(self):
        parsed = uform.Tokenizer.parse((self.folder / "tokenizer.json").read_bytes())
        opened = uform.Tokenizer(self.folder / "tokenizer.json")
        texts = TEXTS + ["naïve café"]
        self.assertEqual([ids.tolist() for ids in parsed.tokenize(texts).ids],
                         [ids.tolist() for ids in opened.tokenize(texts).ids])
        self.assertEqual(parsed.info, opened.info)
        for bad in (b"{not json", b"{}", b""):
            with self.assertRaises(uform.FormatError) as caught:
                uform.Tokenizer.parse(bad)
            self.assertEqual(caught.exception.function, "uform_tokenizer_parse")

    def test_folder_converted_to_a_checkpoint(self):
        converted = Path(options.workdir) / "default-prompt.safetensors"
        uform.convert_checkpoint(self.folder, converted)
        model = uform.Model(converted, executor=uform.Executor.inline())
        self.assertEqual(model.encode_texts(TEXTS).tobytes(), self.model.encode_texts(TEXTS).tobytes())
        self.assertEqual(model.prompt(), self.model.prompt())

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uform", required=True, help="the built `uform` command")
    parser.add_argument("--workdir", required=True)
    global options
    options, rest = parser.parse_known_args()
    os.makedirs(options.workdir, exist_ok=True)
    try:
        import pytest
    except ImportError:
        if in_ci():
            print("pytest does not import: apt-get install python3-pytest")
            return 1
        pytest = None
    if pytest:
        os.environ.update(UFORM_TEST_COMMAND=options.uform, UFORM_TEST_WORKDIR=options.workdir)
        # No cache folder in the source tree; the summary line ("N passed, ...") ends the output.
        return int(pytest.main([__file__, "-v", "-p", "no:cacheprovider", "--rootdir", str(Path(__file__).parent),
                                *rest]))
    program = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    result = program.result
    # A class skipped or failed whole (in setUpClass) counts as a skip or an error, but not as a test run.
    not_passed = sum(isinstance(test, unittest.TestCase) for test, _ in
                     result.failures + result.errors + result.skipped)
    print(f"{result.testsRun - not_passed} passed, "
          f"{len(result.failures) + len(result.errors)} failed, {len(result.skipped)} skipped")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
