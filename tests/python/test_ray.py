#!/usr/bin/env python3
"""examples/ray_embed.py on a local Ray cluster of two CPUs and two encoding actors, against one process.

    test_ray.py --workdir DIR [unittest arguments]

Writes a folder of texts (a few hundred lines over three files) and one of images, embeds each with the
example into Parquet, and checks that every row's vector, a FixedSizeList<float32>, equals the demo model's
`encode_texts` (`encode_images`) in this process bit for bit, rows matched by their path and line. Run by
`meson test --suite python` with the package built in the tree (PYTHONPATH=build/python, which the cluster's
workers inherit). Needs ray and pyarrow: skipped without them (under CI=true it fails instead), and in
sanitized builds, whose extension Ray's workers cannot load without the sanitizer's runtime.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import time
import unittest
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
DEMO = SOURCE / "models" / "demo.safetensors"
EXAMPLE = SOURCE / "examples" / "ray_embed.py"
IMAGES = SOURCE / "tests" / "fuzz-corpus" / "image_decode"
WORDS = ["a", "photo", "of", "the", "cat", "dog", "red", "blue", "car", "Ünïcödé", "naïve", "café", "—", "x" * 40]
options = argparse.Namespace(workdir="")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip(reason: str) -> None:
    """Exit status 77, which meson counts as skipped; under CI=true a missing package fails instead."""
    print(f"test_ray: skipped: {reason}")
    sys.exit(77)


def sanitized() -> bool:
    extensions = [path for folder in sys.path for path in Path(folder or ".").glob("uform/_uform*.so")]
    return bool(extensions) and re.search(rb"libasan\.so\.\d+", extensions[0].read_bytes()) is not None


if __name__ == "__main__":
    if sanitized():
        skip("the extension is built with a sanitizer, whose runtime Ray's workers do not preload")
    try:
        import numpy as np
        import pyarrow.parquet as pq
        import ray  # noqa: F401
    except ImportError as missing:
        if in_ci():
            raise
        skip(f"the Ray example needs {missing.name} (pip install ray==2.9.3 pyarrow==15.0.2)")
import uform  # noqa: E402


def embed(kind: str, folder: Path, output: Path) -> float:
    """Runs the example on a local cluster of 2 CPUs, 2 actors of one thread; answers its seconds."""
    shutil.rmtree(output, ignore_errors=True)
    began = time.monotonic()
    environment = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")  # Ray reports nothing home from a test
    subprocess.run([sys.executable, str(EXAMPLE), kind, str(folder), str(output), "--model", str(DEMO),
                    "--num-cpus", "2", "--concurrency", "2", "--threads", "1", "--batch-size", "64"], check=True,
                   env=environment)
    return time.monotonic() - began


class RayEmbed(unittest.TestCase):
    def setUp(self):
        self.model = uform.Model(DEMO, executor=uform.Executor.inline())

    def assert_vectors(self, output: Path, keys: list, expected):
        table = pq.read_table(output)
        self.assertEqual(table.schema.field("vector").type, pa_list(self.model.info.dims))
        self.assertEqual(table.num_rows, len(keys))
        names = [name for name in ("path", "line") if name in table.column_names]
        table = table.sort_by([(name, "ascending") for name in names])
        self.assertEqual(list(zip(*(table.column(name).to_pylist() for name in names))), keys)
        vectors = table.column("vector").combine_chunks().flatten().to_numpy()
        self.assertEqual(vectors.tobytes(), np.ascontiguousarray(expected).tobytes())

    def test_texts_equal_one_process(self):
        folder = Path(options.workdir) / "texts"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        rng = random.Random(7)
        keys, texts = [], []
        for part, count in enumerate((150, 120, 130)):
            path = folder / f"part-{part}.txt"
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30))) for _ in range(count)]
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            keys += [(str(path.resolve()), number) for number in range(count)]
            texts += lines
        seconds = embed("texts", folder, Path(options.workdir) / "texts.parquet")
        print(f"test_ray: {len(texts)} texts embedded by 2 actors in {seconds:.1f} s")
        self.assert_vectors(Path(options.workdir) / "texts.parquet", keys, self.model.encode_texts(texts))

    def test_images_equal_one_process(self):
        wanted = {"jpg": "jpeg", "png": "spng"}
        paths = [path for path in sorted(IMAGES.iterdir()) if wanted.get(path.suffix[1:]) in uform.features()]
        if not paths:
            self.skipTest("this build decodes neither JPEG nor PNG")
        folder = Path(options.workdir) / "images"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        copies = [folder / f"{i:03d}{path.suffix}" for i, path in enumerate(paths[:6] * 4)]
        for path, copy in zip(paths[:6] * 4, copies):
            shutil.copyfile(path, copy)
        seconds = embed("images", folder, Path(options.workdir) / "images.parquet")
        print(f"test_ray: {len(copies)} images embedded by 2 actors in {seconds:.1f} s")
        keys = [(str(copy.resolve()),) for copy in copies]
        self.assert_vectors(Path(options.workdir) / "images.parquet", keys, self.model.encode_images(copies))


def pa_list(width: int):
    import pyarrow as pa
    return pa.list_(pa.float32(), width)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    global options
    options, rest = parser.parse_known_args()
    os.makedirs(options.workdir, exist_ok=True)
    program = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
