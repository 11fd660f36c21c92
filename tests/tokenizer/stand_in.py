#!/usr/bin/env python3
"""A stand-in for `uform tokenize` in Python, as its contract says, for checking compare.py without the
engine:

    stand_in.py [--perturb] tokenize --tokenizer FILE [--null | --manifest -] [-- TEXT ...]

Texts are the arguments after "--", or else the lines of standard input (without "\\n" or "\\r\\n"), or
under --null its NUL-terminated pieces, or under --manifest - the "text" of each of its JSON lines. One
JSON line per text: {"index": i, "ids": [...], "spans": [[begin, end], ...]} with UTF-8 byte offsets,
or {"index": i, "error": "..."} for a text that is not UTF-8. --perturb changes the texts that
`perturbed` picks: the last id of some, the last non-empty span of others, so that compare.py must find
each one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCH = 4096


def perturbed(index: int) -> bool:
    """Whether --perturb changes the output for the text at `index` of a run."""
    return index % 1009 in (7, 500)


def perturb(index: int, ids: list, spans: list) -> None:
    """Changes an id (index % 1009 == 7) or a span (== 500) of a text that `perturbed` picks."""
    nonempty = [i for i, (begin, end) in enumerate(spans) if end > begin]
    if index % 1009 == 7 or not nonempty:
        if ids:
            ids[-1] += 1
        else:
            ids.append(0)
    else:
        spans[nonempty[-1]][1] -= 1


def texts_of(data: bytes, separator: bytes) -> list:
    """The texts of standard input: pieces ended by `separator` (a last one without it too), a "\\r"
    before a "\\n" dropped; bytes, decoded later."""
    pieces = data.split(separator)
    if pieces and pieces[-1] == b"":
        pieces.pop()
    if separator == b"\n":
        pieces = [p[:-1] if p.endswith(b"\r") else p for p in pieces]
    return pieces


def main() -> int:
    import numpy
    from compare import byte_offsets
    from tokenizers import Tokenizer

    # Texts after "--" are arguments whatever they look like.
    argv = sys.argv[1:]
    texts_given = argv[argv.index("--") + 1:] if "--" in argv else None
    parser = argparse.ArgumentParser()
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument("verb", choices=["tokenize"])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--null", action="store_true")
    parser.add_argument("--manifest", choices=["-"])
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    tokenizer = Tokenizer.from_file(args.tokenizer)
    if texts_given is not None:
        raw = [text.encode("utf-8", "surrogateescape") for text in texts_given]
    elif args.manifest:
        raw = [json.loads(line)["text"].encode("utf-8") for line in sys.stdin.buffer.read().split(b"\n")
               if line.strip()]
    else:
        raw = texts_of(sys.stdin.buffer.read(), b"\0" if args.null else b"\n")
    out = sys.stdout
    for start in range(0, len(raw), BATCH):
        texts, errors = [], {}
        for k, data in enumerate(raw[start:start + BATCH]):
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError as error:
                errors[start + k] = f"not UTF-8: {error.reason} at byte {error.start}"
                texts.append("")
        encodings = tokenizer.encode_batch(texts)
        counts = [len(encoding.ids) for encoding in encodings]
        chars = numpy.array([o for encoding in encodings for o in encoding.offsets], dtype=numpy.int64).reshape(-1, 2)
        spans = byte_offsets(texts, numpy.asarray(counts, dtype=numpy.int64), chars).tolist()
        taken = 0
        for k, encoding in enumerate(encodings):
            index = start + k
            ids, text_spans = list(encoding.ids), spans[taken:taken + counts[k]]
            taken += counts[k]
            if index in errors:
                out.write(json.dumps({"index": index, "error": errors[index]}) + "\n")
                continue
            if args.perturb and perturbed(index):
                perturb(index, ids, text_spans)
            out.write(f'{{"index": {index}, "ids": {json.dumps(ids)}, "spans": {json.dumps(text_spans)}, '
                      f'"special": {json.dumps(list(encoding.special_tokens_mask))}}}\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
