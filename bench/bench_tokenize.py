#!/usr/bin/env python3
"""Tokens per second of the engine's tokenizers beside Hugging Face's tokenizers (its Rust core through the
Python package), one thread each, on the same corpus and the same tokenizer.json files, in one run.

The engine's side is bench_tokenize (uform_text_tokenize on a RAM executor of one thread, the best of its
passes); the reference's is Tokenizer.encode_batch with RAYON_NUM_THREADS=1 (set before tokenizers is
imported), the best of as many passes over the same texts. Both count every token they produce, special
tokens included, so the counts agree where the ids do (tests/tokenizer/compare.py checks that). By default
the corpus and tokenizers are tests/tokenizer's (corpus.py, fixtures.py), built into the build folder.

    bench_tokenize.py --build BUILD [--corpus FILE] [--tokenizer FILE ...] [--min-seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: its encode_batch runs on Rayon
os.environ["TOKENIZERS_PARALLELISM"] = "false"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import python_with  # noqa: E402

python_with(["tokenizers"])
from tokenizers import Tokenizer  # noqa: E402

TESTS = HERE.parent / "tests" / "tokenizer"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_texts(path: Path) -> list:
    texts = []
    with open(path, "rb") as corpus:
        for line in corpus:
            line = line[:-1] if line.endswith(b"\n") else line
            line = line[:-1] if line.endswith(b"\r") else line
            texts.append(line.decode("utf-8"))
    return texts


def reference_rate(path: Path, texts: list, min_seconds: float) -> tuple:
    tokenizer = Tokenizer.from_file(str(path))
    best, passes, started, tokens = float("inf"), 0, time.perf_counter(), 0
    while passes < 2 or time.perf_counter() - started < min_seconds:
        begin = time.perf_counter()
        encodings = tokenizer.encode_batch(texts)
        best = min(best, time.perf_counter() - begin)
        tokens = sum(len(encoding.ids) for encoding in encodings)
        passes += 1
    return tokens, tokens / best


def engine_rate(program: Path, path: Path, corpus: Path, min_seconds: float) -> tuple:
    out = subprocess.run([str(program), str(path), str(corpus), "1", str(min_seconds)], check=True,
                         capture_output=True, text=True).stdout
    figures = json.loads(out)
    return figures["tokens"], figures["tokens_per_second"]


def default_inputs(build: Path) -> tuple:
    work = build / "bench-tokenize"
    subprocess.run([sys.executable, str(TESTS / "corpus.py"), "--out", str(work)], check=True,
                   stdout=subprocess.DEVNULL)
    corpus = work / "corpus.txt"
    subprocess.run([sys.executable, str(TESTS / "fixtures.py"), "--corpus", str(corpus), "--out", str(work / "fixtures")],
                   check=True, stdout=subprocess.DEVNULL)
    return corpus, sorted((work / "fixtures").rglob("tokenizer.json"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, required=True, help="the meson build folder (bench/bench_tokenize)")
    parser.add_argument("--corpus", type=Path, help="one text per line (default: tests/tokenizer/corpus.py's)")
    parser.add_argument("--tokenizer", type=Path, action="append", help="a tokenizer.json (repeatable)")
    parser.add_argument("--min-seconds", type=float, default=3.0)
    args = parser.parse_args()
    corpus, tokenizers = args.corpus, args.tokenizer
    if not corpus or not tokenizers:
        default_corpus, default_tokenizers = default_inputs(args.build)
        corpus, tokenizers = corpus or default_corpus, tokenizers or default_tokenizers
    texts = read_texts(corpus)
    program = args.build / "bench" / "bench_tokenize"
    print(f"CPU: {cpu_name()}; one thread each; {len(texts)} texts, {corpus.stat().st_size / 1e6:.1f} MB ({corpus})")
    print(f"{'tokenizer':<40} {'tokens':>11} {'engine tok/s':>14} {'tokenizers tok/s':>17} {'ratio':>7}")
    for path in tokenizers:
        name = path.parent.name if path.name == "tokenizer.json" else path.name
        ours_tokens, ours = engine_rate(program, path, corpus, args.min_seconds)
        theirs_tokens, theirs = reference_rate(path, texts, args.min_seconds)
        note = "" if ours_tokens == theirs_tokens else f"  (token counts differ: {ours_tokens} and {theirs_tokens})"
        print(f"{name:<40} {ours_tokens:>11} {ours:>14,.0f} {theirs:>17,.0f} {ours / theirs:>6.2f}x{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
