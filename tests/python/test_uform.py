#!/usr/bin/env python3
"""The Python package `uform` (python/) against the engine's own command and the references.

    test_uform.py --uform build/tools/uform --workdir DIR [unittest arguments]

Run by `meson test --suite python` with the package built in the tree (PYTHONPATH=build/python). Numbers
are asserted bit for bit: the demo model's embeddings against `uform encode --format f32`, a pretrained
folder's too (a tiny sentence-transformers BERT, tests/model/pretrained_folders.py), and the tokenizer's
ids and spans against Hugging Face's tokenizers. Written with unittest alone, so that it needs nothing
beyond NumPy; the pretrained folder needs transformers and tokenizers, the Arrow export pyarrow, and each
is skipped without them (under CI=true it fails instead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
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
options = argparse.Namespace(uform="", workdir="")


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uform", required=True, help="the built `uform` command")
    parser.add_argument("--workdir", required=True)
    global options
    options, rest = parser.parse_known_args()
    os.makedirs(options.workdir, exist_ok=True)
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
