#!/usr/bin/env python3
"""`uform tokenize` against Hugging Face's tokenizers, text by text: every fixture (fixtures.py) over the
corpus and the edge cases (corpus.py).

    compare.py --uform build/tools/uform --workdir build/tests/tokenizer-reference [--library libuform.so]
    compare.py --self-check --workdir DIR     the comparison checked on stand_in.py: the reference
                                              against itself passes, a perturbed copy fails each fixture
                                              with exactly the texts it perturbed

For each fixture the command runs once with the texts that fit a line on its standard input, one per line,
and once with the rest (those with a "\\n", or a "\\r" at the end) as arguments after "--" (or, as
--line-ends-via says, NUL-terminated on its standard input with --null, or as a JSONL manifest there with
--manifest -). The reference is `Tokenizer.from_file(FILE).encode_batch(texts)` (special tokens added,
the file's own truncation and padding applied), its character offsets turned into UTF-8 byte offsets. A
text passes where the command printed {"index": i, "ids": [...], "spans": [[begin, end], ...], "special":
[...]} with the reference's ids, spans and special_tokens_mask: compared a chunk at a time as bytes and arrays while the lines have that form
(those keys in that order, any blanks), else as JSON line by line. A mismatch prints the fixture, the
text, both id lists around the first difference and the spans there (the first ten per fixture; every
one goes to WORKDIR/mismatches/FIXTURE.txt); the run ends with "N passed, N failed", counting fixtures.
With --library, uform_tokenizer_token of every id of each fixture is compared with id_to_token too.

The corpus and fixtures are built once into the workdir and reused while their stamps match. Outside CI
a missing Python or Debian package skips the check (exit 77); under CI=true it fails
(tests/reference/interpreter.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import io
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reference"))
sys.path.insert(0, str(HERE))

from interpreter import run_under_python_with, unavailable  # noqa: E402  (standard library only)

MODULES = ["numpy", "tokenizers", "transformers", "sentencepiece", "google.protobuf"]
# Texts encoded by the reference at a time while the command's lines stream in.
CHUNK = 4096
# Mismatches printed in full per fixture; the rest are counted.
PRINTED_MISMATCHES = 10
# Ids shown on each side of the first difference.
ID_WINDOW = 12


@dataclass
class Item:
    """A text and where it comes from ("corpus line 12", "edge case 'emoji'"), and whether it holds a code
    point whose cut depends on the Unicode version (corpus.py's versioned_code_points)."""
    label: str
    text: str
    versioned: bool = False


@dataclass
class Run:
    """One run of the command: the items whose texts it reads, the arguments after the tokenizer's, and
    the bytes of its standard input (None: no input)."""
    items: list
    arguments: list
    stdin: bytes | None


@dataclass
class Outcome:
    """What one fixture's comparison found."""
    name: str
    texts: int = 0
    tokens: int = 0
    mismatches: int = 0
    versioned_texts: int = 0
    versioned_mismatches: int = 0  # in texts whose cut depends on the Unicode version: reported, not failing
    faults: list = field(default_factory=list)  # the command's own failures: exit status, missing lines
    log: object = None  # a text file that gets every mismatch's report, or None

    @property
    def passed(self) -> bool:
        return self.mismatches == 0 and not self.faults


# ---------------------------------------------------------------------------------------------------
# The texts and how they reach the command


def fits_a_line(text: str) -> bool:
    """Whether the command can read `text` as a line of its standard input."""
    return "\n" not in text and not text.endswith("\r")


def plan_runs(items: list, via: str) -> list:
    """The runs of the command that give it every item: the texts that fit a line on standard input,
    the rest `via` arguments after "--", NUL-terminated on standard input with --null, or a JSONL
    manifest on standard input with --manifest -. The one place that says how a text reaches the
    command."""
    lines = [item for item in items if fits_a_line(item.text)]
    rest = [item for item in items if not fits_a_line(item.text)]
    if via != "manifest" and any("\0" in item.text for item in rest):
        raise ValueError("a text with both a line end and a NUL reaches the command in a manifest only")
    runs = [Run(lines, [], "".join(item.text + "\n" for item in lines).encode("utf-8"))]
    if rest and via == "null":
        runs.append(Run(rest, ["--null"], "".join(item.text + "\0" for item in rest).encode("utf-8")))
    elif rest and via == "manifest":
        runs.append(Run(rest, ["--manifest", "-"], "".join(json.dumps({"text": item.text}) + "\n"
                                                            for item in rest).encode("utf-8")))
    elif rest:
        runs.append(Run(rest, ["--", *(item.text for item in rest)], None))
    return runs


def corpus_items(corpus_module, lines: list, stride: int) -> list:
    """The corpus lines (every `stride`-th), then the edge cases, each marked where its cut depends on the
    Unicode version."""
    versioned = corpus_module.versioned_code_points()
    items = [Item(f"corpus line {i + 1}", lines[i]) for i in range(0, len(lines), stride)]
    items += [Item(f"edge case {name!r}", text) for name, text in corpus_module.edge_cases(lines)]
    for item in items:
        item.versioned = corpus_module.is_versioned(item.text, versioned)
    return items


# ---------------------------------------------------------------------------------------------------
# The reference, a chunk of texts at a time


@dataclass
class Expected:
    """The reference for a chunk of texts: per text its ids and character offsets (as tokenizers gives
    them), and for the whole chunk the numbers of its lines in order (index, ids, byte spans) and their
    skeleton (each line without its digits and blanks)."""
    ids: list
    offsets: list
    special: list
    numbers: object  # numpy int64 array
    skeleton: bytes
    line_starts: list  # where each line's numbers begin in `numbers`, and one past the last


@functools.lru_cache(maxsize=None)
def skeleton_of(count: int) -> bytes:
    """A contract's line of `count` tokens with its digits and blanks taken out."""
    return (b'{"index":,"ids":[' + b"," * max(count - 1, 0) + b'],"spans":[' +
            b",".join([b"[,]"] * count) + b'],"special":[' + b"," * max(count - 1, 0) + b"]}\n")


def byte_offsets(texts: list, counts, chars):
    """The character offsets `chars` (numpy, tokens x 2) of the tokens of `texts` (`counts` of each) as
    UTF-8 byte offsets, by one prefix sum over the texts' code points. An offset past its text's end (which
    tokenizers leaves unconverted) is taken as its end."""
    import numpy

    lengths = numpy.fromiter(map(len, texts), dtype=numpy.int64, count=len(texts))
    char_base = numpy.cumsum(lengths) - lengths
    codes = numpy.frombuffer("".join(texts).encode("utf-32-le"), dtype=numpy.uint32)
    starts = numpy.zeros(len(codes) + 1, dtype=numpy.int64)
    numpy.cumsum(1 + (codes >= 0x80).astype(numpy.int64) + (codes >= 0x800) + (codes >= 0x10000), out=starts[1:])
    owner = numpy.repeat(numpy.arange(len(texts)), counts)
    chars = numpy.minimum(chars, lengths[owner, None]) + char_base[owner, None]
    return starts[chars] - starts[char_base][owner, None]


def byte_spans(text: str, offsets: list) -> list:
    """Character offsets [(begin, end)] of `text` as UTF-8 byte offsets [[begin, end]]."""
    import numpy

    chars = numpy.asarray(offsets, dtype=numpy.int64).reshape(-1, 2)
    return byte_offsets([text], numpy.asarray([len(offsets)]), chars).tolist()


def expected_chunk(first_index: int, texts: list, encodings: list) -> Expected:
    """The reference's lines for `texts` (numbered from `first_index`) from their encodings."""
    import numpy

    ids = [encoding.ids for encoding in encodings]
    offsets = [encoding.offsets for encoding in encodings]
    special = [encoding.special_tokens_mask for encoding in encodings]
    counts = numpy.fromiter(map(len, ids), dtype=numpy.int64, count=len(ids))
    total = int(counts.sum())
    flat_ids = numpy.fromiter(itertools.chain.from_iterable(ids), dtype=numpy.int64, count=total)
    chars = numpy.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(offsets)),
                           dtype=numpy.int64, count=2 * total).reshape(-1, 2)
    spans = byte_offsets(texts, counts, chars)
    flat_special = numpy.fromiter(itertools.chain.from_iterable(special), dtype=numpy.int64, count=total)
    # Line t: its index, its ids, its spans' begins and ends in turn, its special flags.
    sizes = 1 + 4 * counts
    line_starts = numpy.cumsum(sizes) - sizes
    rank = numpy.arange(total) - numpy.repeat(numpy.cumsum(counts) - counts, counts)
    numbers = numpy.empty(int(sizes.sum()), dtype=numpy.int64)
    numbers[line_starts] = first_index + numpy.arange(len(texts))
    numbers[numpy.repeat(line_starts + 1, counts) + rank] = flat_ids
    span_at = numpy.repeat(line_starts + 1 + counts, counts) + 2 * rank
    numbers[span_at] = spans[:, 0]
    numbers[span_at + 1] = spans[:, 1]
    numbers[numpy.repeat(line_starts + 1 + 3 * counts, counts) + rank] = flat_special
    skeleton = b"".join(map(skeleton_of, counts.tolist()))
    return Expected(ids, offsets, special, numbers, skeleton, line_starts.tolist() + [len(numbers)])


# The command's lines as numbers: every byte but a digit read as a blank.
DIGITS_ONLY = bytes(c if 0x30 <= c <= 0x39 else 0x20 for c in range(256))


def lines_match(joined: bytes, skeleton: bytes, numbers) -> bool:
    """Whether the command's lines `joined` are the reference's, at the speed of bytes and arrays: the
    same `numbers` in the same `skeleton` (so the contract's keys, in its order)."""
    import numpy

    if joined.translate(None, b"0123456789 \t\r") != skeleton:
        return False
    # A trailing number, dropped after, since NumPy reads blanks alone as one 0.
    got = numpy.fromstring(joined.translate(DIGITS_ONLY) + b" 0", dtype=numpy.int64, sep=" ")[:-1]
    return numpy.array_equal(got, numbers)


def line_matches(line: bytes, k: int, expected: Expected) -> bool:
    """Whether the command's line for the chunk's k-th text is the reference's, as `lines_match`."""
    begin, end = expected.line_starts[k], expected.line_starts[k + 1]
    return lines_match(line, skeleton_of(len(expected.ids[k])), expected.numbers[begin:end])


# ---------------------------------------------------------------------------------------------------
# Reporting


def shown_text(text: str, around: tuple | None) -> str:
    """`text` as repr, cut to its start and the part `around` (character offsets) where it is long."""
    if len(text) <= 160:
        return repr(text)
    head = repr(text[:60])
    if around is None or around[1] <= 60:
        return f"{head}... ({len(text)} characters, {len(text.encode('utf-8'))} bytes)"
    begin, end = max(around[0] - 30, 60), min(around[1] + 30, len(text))
    return (f"{head}... [characters {begin}..{end}: {text[begin:end]!r}] ... "
            f"({len(text)} characters, {len(text.encode('utf-8'))} bytes)")


def shown_ids(ids: list, position: int) -> str:
    """The ids around `position` (marked >id<), with how many are left out on each side."""
    begin, end = max(position - ID_WINDOW, 0), min(position + ID_WINDOW + 1, len(ids))
    parts = [f">{ids[i]}<" if i == position else str(ids[i]) for i in range(begin, end)]
    if position >= len(ids):
        parts.append("><")
    return (f"[{'... ' if begin else ''}{', '.join(parts)}{' ...' if end < len(ids) else ''}]"
            f" ({len(ids)} ids)")


def first_difference(got_ids: list, got_spans: list, ids: list, spans: list) -> int:
    """The first token position where the command and the reference differ in id or span."""
    for i in range(min(len(got_ids), len(ids))):
        if got_ids[i] != ids[i] or (i < len(got_spans) and got_spans[i] != spans[i]):
            return i
    return min(len(got_ids), len(ids))


def report(name: str, item: Item, index: int, got: dict | None, line: bytes, ids: list, spans: list,
           offsets: list, special: list = ()) -> str:
    """The lines that describe one mismatch."""
    head = f"MISMATCH {name}, {item.label} (index {index} of its run)"
    if got is None or "error" in got or not isinstance(got.get("ids"), list):
        what = got.get("error") if got and "error" in got else line[:300].decode("utf-8", "replace")
        return (f"{head}: {shown_text(item.text, None)}\n  command:   {what!r}\n"
                f"  reference: {shown_ids(ids, 0)}")
    got_ids, got_spans = got["ids"], got.get("spans") if isinstance(got.get("spans"), list) else []
    p = first_difference(got_ids, got_spans, ids, spans)
    around = tuple(offsets[p]) if p < len(offsets) else None
    flags = [] if got.get("special") == list(special) else [
        f"  special:   command {got.get('special')}, reference {list(special)}"]
    return "\n".join([
        f"{head}: {shown_text(item.text, around)}",
        f"  first difference at token {p}",
        f"  command:   ids {shown_ids(got_ids, p)}, span there "
        f"{got_spans[p] if p < len(got_spans) else None}",
        f"  reference: ids {shown_ids(ids, p)}, span there {spans[p] if p < len(spans) else None}",
    ] + flags)


# ---------------------------------------------------------------------------------------------------
# The comparison


def command_line(uform: Path) -> list:
    """How to start the command: a .py stand-in under this interpreter, else the program itself."""
    return [sys.executable, str(uform)] if uform.suffix == ".py" else [str(uform)]


def compare_line(outcome: Outcome, item: Item, index: int, line: bytes, ids: list, offsets: list,
                 special: list) -> None:
    """One of the command's lines against the reference's ids and offsets, as JSON; a mismatch counted
    and, among the first, printed."""
    try:
        got = json.loads(line)
    except ValueError:
        got = None
    spans = byte_spans(item.text, offsets)
    if (isinstance(got, dict) and got.get("index") == index and got.get("ids") == ids and got.get("spans") == spans
            and got.get("special") == list(special) and "error" not in got):
        return
    if item.versioned and isinstance(got, dict) and "ids" in got:
        outcome.versioned_mismatches += 1
        if outcome.log:
            outcome.log.write("(Unicode version) " + report(outcome.name, item, index, got, line, ids, spans, offsets, special)
                              + "\n")
        return
    outcome.mismatches += 1
    if outcome.mismatches <= PRINTED_MISMATCHES or outcome.log:
        text = report(outcome.name, item, index, got if isinstance(got, dict) else None, line, ids, spans, offsets,
                      special)
        if outcome.mismatches <= PRINTED_MISMATCHES:
            print(text, flush=True)
        if outcome.log:
            outcome.log.write(text + "\n")


def compare_run(outcome: Outcome, tokenizer, command: list, run: Run) -> None:
    """Runs the command on `run`'s texts and compares its lines with the reference's, a chunk at a time
    while the command goes on: a whole chunk as bytes and arrays where it matches, else line by line."""
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
        if run.stdin is not None:
            stdin.write(run.stdin)
            stdin.seek(0)
        process = subprocess.Popen(command + run.arguments, stdin=stdin if run.stdin is not None
                                   else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)
        printed = 0
        for start in range(0, len(run.items), CHUNK):
            chunk = run.items[start:start + CHUNK]
            texts = [item.text for item in chunk]
            expected = expected_chunk(start, texts, tokenizer.encode_batch(texts))
            lines = list(itertools.islice(process.stdout, len(chunk)))
            printed += len(lines)
            outcome.texts += len(chunk)
            outcome.tokens += sum(map(len, expected.ids[:len(lines)]))
            if len(lines) == len(chunk) and lines_match(b"".join(lines), expected.skeleton, expected.numbers):
                continue
            for k, line in enumerate(lines):
                if not line_matches(line, k, expected):
                    compare_line(outcome, chunk[k], start + k, line, expected.ids[k], expected.offsets[k],
                                 expected.special[k])
            if len(lines) < len(chunk):
                outcome.texts += len(run.items) - start - len(chunk)
                break
        extra = sum(1 for _ in process.stdout)
        status = process.wait()
        stderr.seek(0)
        errors = stderr.read().decode("utf-8", "replace").strip()
    if printed < len(run.items):
        outcome.faults.append(f"the command printed {printed} lines for {len(run.items)} texts")
    if extra:
        outcome.faults.append(f"the command printed {extra} lines more than its {len(run.items)} texts")
    if status != 0:
        outcome.faults.append(f"the command exited with status {status}")
    if (printed < len(run.items) or status != 0) and errors:
        outcome.faults.append("its standard error ends: " + errors[-2000:])


def compare_fixture(name: str, path: Path, uform: Path, items: list, via: str, extra: list,
                    logs: Path | None) -> Outcome:
    """One fixture over every item: its outcome, printed; every mismatch's report in logs/<name>.txt
    where `logs` is given (the file removed when there is none)."""
    from tokenizers import Tokenizer

    started = time.monotonic()
    outcome = Outcome(name)
    tokenizer = Tokenizer.from_file(str(path))
    command = command_line(uform) + extra + ["tokenize", "--tokenizer", str(path)]
    log_path = logs / f"{name}.txt" if logs else None
    if log_path:
        logs.mkdir(parents=True, exist_ok=True)
        outcome.log = log_path.open("w", encoding="utf-8")
    try:
        for run in plan_runs(items, via):
            compare_run(outcome, tokenizer, command, run)
    finally:
        if outcome.log:
            outcome.log.close()
    outcome.versioned_texts = sum(item.versioned for item in items)
    if log_path and not outcome.mismatches and not outcome.versioned_mismatches:
        log_path.unlink()
    if outcome.mismatches > PRINTED_MISMATCHES:
        print(f"  ... and {outcome.mismatches - PRINTED_MISMATCHES} more mismatches of {name}"
              + (f" (every one in {log_path})" if log_path else ""))
    for fault in outcome.faults:
        print(f"FAULT {name}: {fault}")
    print(f"{name}: {outcome.texts} texts, {outcome.tokens} tokens, {outcome.mismatches} mismatches: "
          f"{'passed' if outcome.passed else 'FAILED'} ({time.monotonic() - started:.1f} s); of the "
          f"{outcome.versioned_texts} texts holding a code point whose cut depends on the Unicode version, "
          f"{outcome.versioned_mismatches} cut otherwise than by tokenizers' older tables (not failing)", flush=True)
    return outcome


def prepare(workdir: Path):
    """Builds (or reuses) the corpus and the fixtures in `workdir`: (corpus module, lines, {name: file}).
    The fixtures are made by fixtures.py in a process of its own, whose trainers run on one thread."""
    import corpus
    import fixtures

    try:
        corpus_path = corpus.build(workdir)
    except corpus.MissingPackages as error:
        unavailable(f"Debian packages the corpus reads are not installed: apt-get install "
                    f"{' '.join(error.packages)}")
    out = workdir / "fixtures"
    made = subprocess.run([sys.executable, str(HERE / "fixtures.py"), "--corpus", str(corpus_path), "--out",
                           str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if made.returncode != 0:
        print(made.stdout, end="")
        sys.exit(made.returncode)
    files = {name: fixtures.built_in(out) / name / "tokenizer.json" for name in fixtures.FIXTURES}
    return corpus, corpus.read_corpus(corpus_path), files


def token_strings_check(library: str, files: dict) -> int:
    """uform_tokenizer_token of every id of every fixture (and the first ids past them) against
    tokenizers' id_to_token, through the shared library: the failures, each printed."""
    import ctypes

    from tokenizers import Tokenizer

    uform = ctypes.CDLL(library)
    uform.uform_tokenizer_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    uform.uform_tokenizer_token.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.POINTER(ctypes.c_size_t)]
    uform.uform_tokenizer_free.argtypes = [ctypes.c_void_p]
    failures = 0
    for name, path in files.items():
        reference = Tokenizer.from_file(str(path))
        tokenizer = ctypes.c_void_p()
        if uform.uform_tokenizer_open(str(path).encode(), ctypes.byref(tokenizer)) != 0:
            print(f"FAULT {name}: uform_tokenizer_open refused {path}")
            failures += 1
            continue
        size = reference.get_vocab_size(with_added_tokens=True)
        wrong = []
        for token_id in range(size + 3):
            string, length = ctypes.c_void_p(), ctypes.c_size_t()
            status = uform.uform_tokenizer_token(tokenizer, token_id, ctypes.byref(string), ctypes.byref(length))
            got = ctypes.string_at(string.value, length.value).decode("utf-8", "replace") if status == 0 else None
            want = reference.id_to_token(token_id)
            if got != want:
                wrong.append((token_id, got, want))
        uform.uform_tokenizer_free(tokenizer)
        for token_id, got, want in wrong[:PRINTED_MISMATCHES]:
            print(f"MISMATCH {name}: id_to_token({token_id}): command {got!r}, reference {want!r}")
        print(f"{name}: id_to_token of {size + 3} ids: {len(wrong)} mismatches: "
              f"{'passed' if not wrong else 'FAILED'}", flush=True)
        failures += bool(wrong)
    return failures


def compare_fixture_apart(name: str, path: Path, uform: Path, items: list, via: str, extra: list,
                          logs: Path | None) -> tuple:
    """compare_fixture in a worker process: its outcome (without its closed log) and what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        outcome = compare_fixture(name, path, uform, items, via, extra, logs)
    outcome.log = None
    return outcome, printed.getvalue()


def compare_all(files: dict, uform: Path, items: list, via: str, extra: list = (), logs: Path | None = None) -> list:
    """Every fixture of `files` compared, as many at a time as there are cores (each a command and this
    script's comparison, which runs on one): the outcomes, each fixture's report printed in order, and the
    summary line."""
    # Forked before this process has used tokenizers (imported by compare_fixture), whose threads a fork
    # would stop.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(len(files), os.cpu_count() or 1)),
                                                mp_context=context) as pool:
        runs = [pool.submit(compare_fixture_apart, name, path, uform, items, via, list(extra), logs)
                for name, path in files.items()]
        outcomes = []
        for run in runs:
            outcome, printed = run.result()
            print(printed, end="", flush=True)
            outcomes.append(outcome)
    passed = sum(o.passed for o in outcomes)
    print(f"{passed} passed, {len(outcomes) - passed} failed", flush=True)
    return outcomes


def self_check(files: dict, items: list, via: str) -> int:
    """The comparison on stand_in.py: as the reference, every fixture passes; perturbed, every fixture
    fails with exactly the texts the stand-in perturbed, and no fault."""
    import stand_in

    stand = HERE / "stand_in.py"
    print("--- the stand-in as the reference: every fixture passes")
    faithful = compare_all(files, stand, items, via)
    print("--- the stand-in perturbed: every fixture fails with the perturbed texts")
    perturbed = compare_all(files, stand, items, via, ["--perturb"])
    marked = [run.items[i].versioned for run in plan_runs(items, via) for i in range(len(run.items))
              if stand_in.perturbed(i)]
    expected, versioned = marked.count(False), marked.count(True)
    wrong = [o.name for o in faithful if not o.passed or o.versioned_mismatches] + \
        [o.name for o in perturbed if o.mismatches != expected or o.versioned_mismatches != versioned or o.faults]
    print(f"self-check: {expected} perturbed texts expected per fixture (and {versioned} among those marked "
          "as depending on the Unicode version); "
          f"{'as expected' if not wrong else 'NOT as expected for ' + ', '.join(wrong)}")
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uform", type=Path, help="the uform program (a .py file runs under this Python)")
    parser.add_argument("--workdir", type=Path, required=True, help="where the corpus and fixtures are built")
    parser.add_argument("--line-ends-via", choices=["arguments", "null", "manifest"], default="arguments",
                        help="how the texts that do not fit a line reach the command: as arguments after --"
                        " (the default), NUL-terminated with --null, or a JSONL manifest with --manifest -")
    parser.add_argument("--fixtures", help="a comma-separated subset of the fixtures")
    parser.add_argument("--stride", type=int, default=1, help="every STRIDE-th corpus line only")
    parser.add_argument("--self-check", action="store_true", help="check the comparison on stand_in.py")
    parser.add_argument("--library", help="libuform.so: uform_tokenizer_token of every id against id_to_token")
    args = parser.parse_args()
    if not args.self_check and args.uform is None:
        parser.error("--uform is required (or --self-check)")
    run_under_python_with(MODULES)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    corpus, lines, files = prepare(args.workdir)
    if args.fixtures:
        chosen = args.fixtures.split(",")
        unknown = [name for name in chosen if name not in files]
        if unknown:
            parser.error(f"unknown fixtures: {', '.join(unknown)} (known: {', '.join(files)})")
        files = {name: files[name] for name in chosen}
    counts = corpus.script_counts(lines)
    print(f"corpus: {len(lines)} lines in {len(counts)} scripts: "
          + ", ".join(f"{script} {count}" for script, count in counts[:24]) + ", ...", flush=True)
    items = corpus_items(corpus, lines, args.stride)
    if args.self_check:
        return self_check(files, items, args.line_ends_via)
    outcomes = compare_all(files, args.uform, items, args.line_ends_via, logs=args.workdir / "mismatches")
    failures = token_strings_check(args.library, files) if args.library else 0
    return 0 if all(o.passed for o in outcomes) and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
