#!/usr/bin/env python3
"""Embeds a folder of texts or images on a Ray cluster with uform, into Parquet.

    ray_embed.py texts FOLDER OUTPUT --model models/demo.safetensors    # every *.txt: one text per line
    ray_embed.py images FOLDER OUTPUT --model FOLDER_OF_A_MODEL          # every .jpg, .jpeg, .png
    RAY_ADDRESS=HEAD:6379 ray_embed.py texts ...                         # on a running cluster

A Ray Data pipeline: the files are listed here, read by the workers (texts cut into lines, each keeping its
file and line number), and encoded by `map_batches` over an actor pool of `--concurrency` actors, each of
which loads the model once (`uform.Model`) and encodes its batches on an executor of `--threads` threads.
Each batch's rows go to Arrow without a copy (`arrow=True`) and into the Parquet files of OUTPUT as a
`vector` column of FixedSizeList<float32>[width], beside `path` (and `line` for texts). A vector never
depends on its batch or its actor: it equals one process's `encode_texts` of the same text bit for bit.

Without RAY_ADDRESS or --address a local cluster of --num-cpus CPUs is started. On a cluster every node
needs uform installed (`pip install .`) and the folder and the model at the same paths (a shared file
system), and OUTPUT too, or an object store's URI that pyarrow writes (s3://...).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Dict, Iterator, List

import pyarrow as pa
import ray
import ray.data

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def text_lines(row: Dict[str, str]) -> Iterator[Dict[str, object]]:
    """A text file's lines, each a row of its own: the file, its line number (from 0), the text."""
    with open(row["path"], encoding="utf-8") as file:
        for number, line in enumerate(file):
            yield {"path": row["path"], "line": number, "text": line.rstrip("\n")}


class Encoder:
    """One per actor: loads the model once, then encodes every batch it is given (a pyarrow Table of paths,
    and texts for texts) into the same Table with `vector` in place of `text`."""

    def __init__(self, model: str, kind: str, threads: int):
        import uform

        self.model = uform.Model(model, executor=uform.Executor.ram(threads=threads))
        self.kind = kind

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.kind == "texts":
            rows = self.model.encode_texts(batch.column("text").to_pylist(), arrow=True)
            batch = batch.drop_columns(["text"])
        else:
            rows = self.model.encode_images(batch.column("path").to_pylist(), arrow=True)
        return batch.append_column("vector", pa.array(rows))


def listed(folder: Path, kind: str) -> List[str]:
    """The folder's files of `kind`, recursively, sorted, as absolute paths (the workers' own working
    folders are not this one)."""
    wanted = (".txt",) if kind == "texts" else IMAGE_SUFFIXES
    return sorted(str(path.resolve()) for path in folder.rglob("*") if path.suffix.lower() in wanted)


def pipeline(kind: str, folder: Path, output: str, model: str, batch_size: int, concurrency: int,
             threads: int) -> None:
    files = listed(folder, kind)
    if not files:
        raise SystemExit(f"ray_embed: no {kind} in {folder}")
    # A block a file (up to 256), so that every actor gets batches of a small folder too.
    items = ray.data.from_items([{"path": path} for path in files], parallelism=min(len(files), 256))
    if kind == "texts":
        items = items.flat_map(text_lines)
    vectors = items.map_batches(Encoder, batch_format="pyarrow", batch_size=batch_size, concurrency=concurrency,
                                num_cpus=threads, zero_copy_batch=True,
                                fn_constructor_args=(str(Path(model).resolve()), kind, threads))
    vectors.write_parquet(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("texts", "images"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("output", help="a folder (or an object store's URI) for the Parquet files")
    parser.add_argument("--model", required=True, help="a format-4 checkpoint or a pretrained model's folder")
    parser.add_argument("--batch-size", type=int, default=256, help="items per encode call")
    parser.add_argument("--concurrency", type=int, default=2, help="encoding actors, each with a model")
    parser.add_argument("--threads", type=int, default=1, help="the engine's threads (and Ray's CPUs) per actor")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="a running cluster (default RAY_ADDRESS; none: a local cluster)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local cluster (default all)")
    arguments = parser.parse_args()
    output = arguments.output if "://" in arguments.output else str(Path(arguments.output).resolve())
    if arguments.address:
        ray.init(address=arguments.address)
    else:
        ray.init(num_cpus=arguments.num_cpus, include_dashboard=False)
    pipeline(arguments.kind, arguments.folder, output, arguments.model, arguments.batch_size,
             arguments.concurrency, arguments.threads)
    print(f"ray_embed: {arguments.kind} of {arguments.folder} embedded into {output}")


if __name__ == "__main__":
    main()
