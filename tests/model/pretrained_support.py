"""What the checks and the benchmark of sentence-transformers folders share: the command's embeddings of
texts through a JSONL manifest, sentence-transformers' of the same, row cosines, the tokenizer corpus and a
deterministic sample of it across scripts and lengths, and a text's short description.

Import it after interpreter.run_under_python_with(...) has found a Python with numpy (and, for
`reference_embeddings`, sentence-transformers).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
sys.path.insert(0, str(REPOSITORY / "tests" / "reference"))
sys.path.insert(0, str(REPOSITORY / "tests" / "tokenizer"))

# sentence-transformers' batch in every check (its default, and the engine's output does not depend on it).
BATCH = 32


class EngineRefused(Exception):
    """The command ended with a nonzero status (or printed rows that do not parse): what it said."""


def program(uform: str) -> list:
    """The command line that runs `uform`: a .py file (a stand-in) runs under this Python."""
    return [sys.executable, uform] if uform.endswith(".py") else [uform]


def encode_help(uform: str) -> str:
    """`uform encode --help` as text ('' where it fails)."""
    done = subprocess.run([*program(uform), "encode", "--help"], capture_output=True, timeout=60)
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else ""


def write_manifest(path: Path, texts: list) -> Path:
    """One {"text": ...} per line (UTF-8; a NUL or a line end inside a text escaped by JSON)."""
    with open(path, "w", encoding="utf-8") as file:
        for text in texts:
            file.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


def engine_run(uform: str, folder: Path, manifest: Path, extra: list = (), timeout: float = 900,
               stdout=subprocess.PIPE) -> tuple:
    """Runs `uform encode --model FOLDER --manifest FILE *extra`: (stdout bytes or None, seconds of wall
    time). EngineRefused, with its exit status and stderr, where it fails, cannot start or does not end."""
    arguments = ["encode", "--model", str(folder), "--manifest", str(manifest), *extra]
    began = time.perf_counter()
    try:
        done = subprocess.run([*program(uform), *arguments], stdout=stdout, stderr=subprocess.PIPE, timeout=timeout)
    except OSError as error:
        raise EngineRefused(f"cannot run {uform}: {error}") from error
    except subprocess.TimeoutExpired as error:
        raise EngineRefused(f"`uform {' '.join(arguments)}` did not end within {timeout:.0f} s") from error
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip()
        raise EngineRefused(f"`uform {' '.join(arguments)}` exited {done.returncode}: {said[-1500:] or '(no message)'}")
    return done.stdout, seconds


def engine_embeddings(uform: str, folder: Path, texts: list, manifest: Path, extra: list = ()):
    """The command's embeddings of `texts` (float64, texts x width) from its JSONL rows. EngineRefused where
    it fails or its rows are not one {"index": i, "embedding": [...]} per text in order."""
    import numpy as np

    write_manifest(manifest, texts)
    out, _ = engine_run(uform, folder, manifest, ["--format", "jsonl", *extra])
    try:
        rows = [json.loads(line) for line in out.decode("utf-8").splitlines() if line.strip()]
        indices = [row["index"] for row in rows]
        vectors = [row["embedding"] for row in rows]
    except (ValueError, KeyError, TypeError) as error:
        raise EngineRefused(f"its output is not one JSON row with an index and an embedding per line: {error}") \
            from error
    if indices != list(range(len(texts))):
        raise EngineRefused(f"{len(rows)} rows for {len(texts)} texts, indices {indices[:5]}...")
    widths = {len(vector) for vector in vectors}
    if len(widths) != 1:
        raise EngineRefused(f"rows of different widths: {sorted(widths)}")
    return np.asarray(vectors, dtype=np.float64)


def reference_model(folder: Path):
    """sentence-transformers' model of the folder, on the CPU in float32."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def reference_embeddings(model, texts: list, **options):
    """sentence-transformers' embeddings of `texts` (float64, texts x width), as a user gets them from
    `encode` with batches of up to BATCH. A batch holds texts whose token counts are within a factor of two
    (`encode` orders texts by characters and pads each batch to its longest, which makes a short text cost
    a long one's tokens): a vector does not depend on its batch."""
    import numpy as np

    counts = model.tokenize(texts)["attention_mask"].sum(1).tolist() if texts else []
    order = sorted(range(len(texts)), key=lambda i: (-counts[i], i))
    batches = []
    for i in order:
        if not batches or len(batches[-1]) == BATCH or 2 * counts[i] < counts[batches[-1][0]]:
            batches.append([])
        batches[-1].append(i)
    vectors = np.zeros((len(texts), model.get_sentence_embedding_dimension()))
    for batch in batches:
        vectors[batch] = model.encode([texts[i] for i in batch], batch_size=BATCH, convert_to_numpy=True,
                                      show_progress_bar=False, **options)
    return vectors


def cosines(a, b):
    """The cosine of each row of `a` with the same row of `b` (1 where both are zero)."""
    import numpy as np

    dot = (a * b).sum(axis=1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, dot / np.where(norms > 0, norms, 1), np.where(dot == 0, 1.0, 0.0))


def versioned(texts: list):
    """Per text, whether it holds a code point whose cut depends on the Unicode version (corpus.py: tokenizers
    0.19.1 reads older tables than the engine's utf8proc; neither cut is wrong), as a numpy bool array; all
    False where Debian's unicode-data, which says which code points those are, is not installed."""
    import corpus
    import numpy as np

    try:
        late = corpus.versioned_code_points()
    except corpus.MissingPackages:
        return np.zeros(len(texts), dtype=bool)
    return np.array([corpus.is_versioned(text, late) for text in texts], dtype=bool)


def describe(text: str, most: int = 72) -> str:
    """`text` as a short Python literal: its start, and its length where it is cut."""
    shown = repr(text if len(text) <= most else text[:most])
    return shown if len(text) <= most else f"{shown}... ({len(text)} characters, {len(text.split())} words)"


def first_values(vector, count: int = 5) -> str:
    return "[" + ", ".join(f"{value:+.5f}" for value in vector[:count]) + ", ...]"


# ---------------------------------------------------------------------------------------------------
# The tokenizer corpus (tests/tokenizer/corpus.py)


def corpus_lines(workdir: Path, versioned: bool = True):
    """The corpus's lines and the script of each ([...], [...]), built into `workdir` (or reused where its
    stamp matches); without the lines whose cut depends on the Unicode version unless `versioned`.
    MissingPackages (corpus.py) names the Debian packages it needs where they are absent."""
    import corpus

    lines = corpus.read_corpus(corpus.build(workdir))
    if not versioned:
        late = corpus.versioned_code_points()
        lines = [line for line in lines if not corpus.is_versioned(line, late)]
    scripts = corpus.Scripts(corpus.unicode_folder())
    return lines, [scripts.of_line(line) for line in lines]


def sample_corpus(lines: list, scripts: list, count: int) -> list:
    """At least `count` corpus lines (or all), the same from run to run, spread over scripts and lengths:
    every script gives lines in proportion to the square root of its count of lines, at least one, so that
    the scripts of many lines (Latin, Cyrillic, Han, ...) weigh more and none is left out; each script's are
    taken evenly over its lines ordered by length, its shortest and longest among them. Answers their
    indices, by script then length."""
    by_script = {}
    for index, script in enumerate(scripts):
        by_script.setdefault(script, []).append(index)
    for indices in by_script.values():
        indices.sort(key=lambda i: (len(lines[i]), i))

    def shares(scale: float) -> dict:
        return {script: min(len(indices), max(1, round(scale * len(indices) ** 0.5)))
                for script, indices in by_script.items()}

    scale = 0.0
    while sum(shares(scale).values()) < min(count, len(lines)):
        scale += 0.01
    chosen = []
    for script, take in sorted(shares(scale).items()):
        indices = by_script[script]
        ranks = [len(indices) // 2] if take == 1 else \
            sorted({round(k * (len(indices) - 1) / (take - 1)) for k in range(take)})
        chosen += [indices[rank] for rank in ranks]
    return chosen


def long_texts(lines: list, scripts: list, words: int, names: tuple) -> list:
    """For each script of `names`, its corpus lines (every 7th, from its first) joined by spaces until the
    text has at least `words` words, or six times as many characters for scripts written without spaces
    (or until the script's lines run out)."""
    texts = []
    for name in names:
        indices = [i for i, script in enumerate(scripts) if script == name][::7]
        parts, total, characters = [], 0, 0
        for i in indices:
            parts.append(lines[i])
            total += len(lines[i].split())
            characters += len(lines[i]) + 1
            if total >= words or characters >= 6 * words:
                break
        if parts:
            texts.append(" ".join(parts))
    return texts
