"""The pre-tokenizers (src/tokenizer/pre_tokenizers.c) against Hugging Face's tokenizers 0.19.1.

For every pre-tokenizer under many settings, tests/tokenizer/pre_tokenize_driver cuts a set of texts
(ASCII punctuation, contractions, digits, CJK, Hangul, Thai, Arabic, Devanagari, emoji sequences, every
kind of whitespace, control characters, empty and blank texts, and seeded random mixes of them), and
each piece and its span in bytes must equal what tokenizers' pre_tokenize_str gives (its character
offsets turned into bytes). Every code point up to U+323FF, and the tags and variation selectors, goes
through the class-driven pre-tokenizers too. Objects that tokenizers refuses must be refused (FORMAT),
and types not built in answer UNSUPPORTED.

    test_pre_tokenizers.py --driver build/tests/tokenizer/pre_tokenize_driver --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import run_under_python_with, unavailable  # noqa: E402

run_under_python_with(["tokenizers"])

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

# The engine follows 0.19.1, whose objects and cuts later versions changed.
if tokenizers.__version__ != "0.19.1":
    unavailable(f"tokenizers {tokenizers.__version__} is not the reference: .venv/bin/pip install tokenizers==0.19.1")

# Punctuation by Unicode 15.0 (utf8proc) that tokenizers' unicode_categories 0.1.1 (Unicode 8.0) does
# not know, and the two code points it still takes for punctuation (pre_tokenizers.c's head).
PUNCTUATION_GAPS = (
    [0x61D, 0x9FD, 0xA76, 0xC77, 0xC84, 0x1B7D, 0x1B7E, 0x10EAD, 0x116B9, 0x1183B, 0x119E2, 0x11FFF,
     0x12FF1, 0x12FF2, 0x16FE2, 0x1E95E, 0x1E95F, 0x166D, 0x111C9, 0x1145D, 0x11A9E, 0x11EF7, 0x11EF8]
    + list(range(0x2E43, 0x2E50)) + list(range(0x2E52, 0x2E5E)) + list(range(0x10F55, 0x10F5A))
    + list(range(0x10F86, 0x10F8A)) + list(range(0x1144B, 0x11450)) + [0x1145A, 0x1145B]
    + list(range(0x11660, 0x1166D)) + list(range(0x11944, 0x11947)) + list(range(0x11A3F, 0x11A47))
    + list(range(0x11A9A, 0x11A9D)) + list(range(0x11A9F, 0x11AA3)) + list(range(0x11B00, 0x11B0A))
    + list(range(0x11C41, 0x11C46)) + [0x11C70, 0x11C71] + list(range(0x11F43, 0x11F50))
    + list(range(0x16E97, 0x16E9B)))

TEXTS = [
    "", " ", "   ", "\t\n", "\n", "a", "Hello world", "Hello, world!", "  leading and trailing  ",
    "it's we're I'll they've he'd I'm don't 'quoted' ''s", "'s", "'", " 's", "'S 'RE 'Ll", "x'll'", "''ve",
    "a  b   c    d", "x\u00a0y\u2003z\u3000w\u1680v\u205fu\u202ft", "line\r\nbreak\n\n end \n",
    "numbers 123 4567 1,234.56 \u0663\u0664\u0665 \u00b2\u00b3 \u00bd \u216b 12abc34",
    "CJK \u4f60\u597d\u4e16\u754c\uff0c\u6211\u4eec\u3002", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629: \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u061f",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u0932\u093f\u0916\u093e \u0917\u092f\u093e \u092a\u093e\u0920\u0964",
    "emoji \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family \U0001F3F3\ufe0f\u200d\U0001F308 flag \U0001F44D\U0001F3FD",
    "NUL\u0000and\u0001control\u007f\u0085x\u009f", "soft\u00adhyphen", "zero\u200bwidth\u200cnon\u200djoiner",
    "\u2581already\u2581meta space", "\u2581\u2581 \u2581", "_under_score_", "-the-final--countdown-",
    "a.b,c;d:e!f?g", "tabs\tand\u000bvertical\u000cfeed", "\u2028\u2029", "mixed123abc456",
    "$100 + 50% = ~\u20ac150 ^_^ `x` |y| <z>", "\u24b6\u24d1 circled \U0001F130", "a\u0301e\u0300 combining \u0301",
    "\U0001F600\U0001F601", "\u01c5 title", "\uff21\uff22\uff23 fullwidth \uff11\uff12\uff13",
    "\u03a9\u2248\u00e7\u221a\u222b", "\u00bfQu\u00e9? \u00a1S\u00ed!", "\u300c\u5f15\u7528\u300d\u2014\u2014\u201cquote\u201d",
    "U.S.A. e.g. i.e.", "  \t  ", " \n ", "x ", " x", "\u3000\u3000x", "12 345 6789", "\U0001D7D8\U0001D7D9",
]

# Seeded random mixes of the pieces texts are made of.
ALPHABET = list("aZ09 ''\t\n.,-!?_$") + ["\u2581", "\u00a0", "\u3000", "\u4e2d", "\ud55c", "\u0e01", "\u0645",
    "\u0915", "\u093f", "\u0301", "\U0001F600", "\u200d", "\u00ad", "\u0000", "\u0085", "\u00b2", "\u0663",
    "\u216b", "\u2014", "\u201c", "\u00e9", "\u0130", "s", "t", "re", "ll", "ve", "d", "m", "  ", "\r\n"]


def random_texts(count: int, seed: int = 1) -> list:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 24))) for _ in range(count)]


def python_pre_tokenizer(obj):
    """tokenizers' pre-tokenizer read from `obj` as tokenizer.json holds it."""
    document = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                "pre_tokenizer": obj, "post_processor": None, "decoder": None,
                "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}
    return Tokenizer.from_str(json.dumps(document)).pre_tokenizer


def expected(pre_tokenizer, text: str) -> list:
    """pre_tokenize_str's pieces with their character offsets as UTF-8 byte offsets. An empty text stays
    one empty piece in tokenizers until something splits it (an empty Sequence does not), where the
    engine's lists hold no empty piece: no model cuts a token from it either way."""
    ends = [0]
    for ch in text:
        ends.append(ends[-1] + len(ch.encode()))
    return [[piece, ends[begin], ends[end]] for piece, (begin, end) in pre_tokenizer.pre_tokenize_str(text) if piece]


def run_driver(driver: str, workdir: Path, obj, texts: list):
    """The driver's pieces per text, or its error line."""
    path = workdir / "pre_tokenizer.json"
    path.write_text(json.dumps(obj))
    lines = "".join(json.dumps(text) + "\n" for text in texts)
    done = subprocess.run([driver, str(path)], input=lines.encode(), capture_output=True, timeout=120)
    out = done.stdout.decode()
    if done.returncode == 2:
        return out.strip()
    if done.returncode != 0:
        raise RuntimeError(f"driver exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return [json.loads(line) for line in out.split("\n")[:-1]]


def behaviors():
    return ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
REGEXES = [LLAMA3, QWEN2, r"\s+", r"a|(?=c)", r"\b", r"x*", r"\d", r"(?=\p{Lu})", r"^", r"$", r"\X", r".",
           r"\p{P}+", r"[\u4e00-\u9fff]", r"\xE2\x96\x81", r"(?<=a)b?", r"\w+|[^\w\s]+", r" ?\p{L}+"]
STRINGS = [" ", "-", "", "ab", "-&~#", "\u2581", "\n", "'s", "a.b", "  "]
FOLDING = {LLAMA3, r"a|(?=c)", r"\b", r"x*", r"\s+", r"(?<=a)b?", "-", "", "\u2581", "  "}


def configurations() -> list:
    """Pre-tokenizer objects that both must read and cut alike."""
    configs = [{"type": "BertPreTokenizer"}, {"type": "Whitespace"}, {"type": "WhitespaceSplit"},
               {"type": "Punctuation"}, {"type": "Digits", "individual_digits": True},
               {"type": "Digits", "individual_digits": False}]
    configs += [{"type": "Punctuation", "behavior": b} for b in behaviors()]
    # Every behavior, inverted or not, on the patterns whose matches fold in the most ways (empty ones,
    # adjacent ones); the others isolated, and removed inverted.
    for kind, pattern in [("Regex", p) for p in REGEXES] + [("String", s) for s in STRINGS]:
        folds = pattern in FOLDING
        for invert in (False, True):
            for behavior in behaviors() if folds else ["Removed" if invert else "Isolated"]:
                configs.append({"type": "Split", "pattern": {kind: pattern}, "behavior": behavior, "invert": invert})
    for prefix in (False, True):
        for use_regex in (False, True):
            configs.append({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True,
                            "use_regex": use_regex})
    configs.append({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False})
    for replacement in ("\u2581", "_", " ", "a"):
        for scheme in ("always", "first", "never"):
            for split in (True, False):
                configs.append({"type": "Metaspace", "replacement": replacement, "prepend_scheme": scheme,
                                "split": split})
    configs += [{"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True},
                {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": False,
                 "prepend_scheme": "never"},
                {"type": "Metaspace", "replacement": "\u2581", "str_rep": "\u2581", "add_prefix_space": True}]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    first = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}
    configs += [
        {"type": "Sequence", "pretokenizers": []},
        {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, first]},
        {"type": "Sequence", "pretokenizers": [{"type": "Punctuation"}, {"type": "Digits", "individual_digits": True}]},
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False}, byte_level]},
        {"type": "Sequence", "pretokenizers": [
            {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]},
            {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False}, first]},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True}]},
        {"type": "Sequence", "pretokenizers": [{"type": "Metaspace", "replacement": "\u2581"},
                                               {"type": "Split", "pattern": {"String": "\u2581"},
                                                "behavior": "MergedWithPrevious", "invert": False}]},
    ]
    return configs


# Objects tokenizers refuses (FORMAT here) or reads as a type not built here (UNSUPPORTED).
REFUSED = [
    ("FORMAT", {"type": "ByteLevel", "add_prefix_space": True}),
    ("FORMAT", {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": None}),
    ("FORMAT", {"type": "ByteLevel", "add_prefix_space": 1, "trim_offsets": True}),
    ("FORMAT", {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": None}),
    ("FORMAT", {"type": "Metaspace"}),
    ("FORMAT", {"type": "Metaspace", "replacement": "ab"}),
    ("FORMAT", {"type": "Metaspace", "replacement": ""}),
    ("FORMAT", {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": False}),
    ("FORMAT", {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": False, "prepend_scheme": "first"}),
    ("FORMAT", {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "sometimes"}),
    ("FORMAT", {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": None}),
    ("FORMAT", {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated", "invert": False}),
    ("FORMAT", {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolated"}),
    ("FORMAT", {"type": "Split", "pattern": {"Regex": "a"}, "invert": False}),
    ("FORMAT", {"type": "Split", "pattern": {"Foo": "a"}, "behavior": "Isolated", "invert": False}),
    ("FORMAT", {"type": "Split", "pattern": {"Regex": "a", "String": "b"}, "behavior": "Isolated", "invert": False}),
    ("FORMAT", {"type": "Split", "pattern": "a", "behavior": "Isolated", "invert": False}),
    ("FORMAT", {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "isolated", "invert": False}),
    ("FORMAT", {"type": "Punctuation", "behavior": "Bogus"}),
    ("FORMAT", {"type": "Punctuation", "behavior": None}),
    ("FORMAT", {"type": "Digits"}),
    ("FORMAT", {"type": "Sequence"}),
    ("FORMAT", {"type": "Sequence", "pretokenizers": {"type": "Whitespace"}}),
    ("FORMAT", {"type": "Sequence", "pretokenizers": [{"type": "Digits"}]}),
    ("FORMAT", {"pretokenizers": []}),
    ("FORMAT", {"type": 7}),
    ("FORMAT", [1, 2]),
    ("UNSUPPORTED", {"type": "UnicodeScripts"}),
    ("UNSUPPORTED", {"type": "CharDelimiterSplit", "delimiter": "x"}),
    ("UNSUPPORTED", {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, {"type": "UnicodeScripts"}]}),
]


def every_code_point(skip=()) -> list:
    skipped = set(skip)
    points = list(range(0, 0x32400)) + list(range(0xE0000, 0xE0200))
    return [chr(c) for c in points if not 0xD800 <= c <= 0xDFFF and c not in skipped]


def exhaustive_cases() -> list:
    """(object, texts): every code point between separators that tell each class apart."""
    chars = every_code_point()
    no_gaps = every_code_point(PUNCTUATION_GAPS)
    joined = lambda separator, points: separator + separator.join(points) + separator  # noqa: E731
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    return [
        ({"type": "BertPreTokenizer"}, [joined("a", no_gaps)]),
        ({"type": "Punctuation", "behavior": "Isolated"}, [joined("a", no_gaps)]),
        ({"type": "Whitespace"}, [joined("a", chars), joined("!", chars)]),
        ({"type": "WhitespaceSplit"}, [joined("a", chars)]),
        ({"type": "Digits", "individual_digits": True}, [joined("a", chars)]),
        (byte_level, [joined("a", chars), joined("1", chars), joined("!", chars)]),
    ]


def punctuation_gaps_hold(driver: str, workdir: Path) -> bool:
    """The code points where the two differ on punctuation are exactly PUNCTUATION_GAPS."""
    obj = {"type": "Punctuation", "behavior": "Isolated"}
    text = "a" + "a".join(every_code_point()) + "a"
    alone = lambda pieces: {ord(p[0]) for p in pieces if len(p[0]) == 1 and p[0] != "a"}  # noqa: E731
    ours = alone(run_driver(driver, workdir, obj, [text])[0])
    theirs = alone(expected(python_pre_tokenizer(obj), text))
    if ours ^ theirs == set(PUNCTUATION_GAPS):
        return True
    print(f"FAIL punctuation gaps: {sorted(hex(c) for c in (ours ^ theirs) ^ set(PUNCTUATION_GAPS))}")
    return False


def compare(driver: str, workdir: Path, obj, texts: list) -> bool:
    """The driver against tokenizers on `texts`; prints the first difference."""
    ours = run_driver(driver, workdir, obj, texts)
    if isinstance(ours, str):
        print(f"FAIL {json.dumps(obj)}: {ours}")
        return False
    reference = python_pre_tokenizer(obj)
    for text, got in zip(texts, ours):
        want = expected(reference, text)
        if got != want:
            print(f"FAIL {json.dumps(obj)[:200]} on {json.dumps(text)[:200]}:")
            for i, (a, b) in enumerate(zip(got + [None] * len(want), want + [None] * len(got))):
                if a != b:
                    print(f"  piece {i}: ours {json.dumps(a)[:120]} tokenizers {json.dumps(b)[:120]}")
                    break
            return False
    return True


def refused(driver: str, workdir: Path, status: str, obj) -> bool:
    ours = run_driver(driver, workdir, obj, [])
    python_refuses = True
    try:
        python_pre_tokenizer(obj)
        python_refuses = False
    except Exception:
        pass
    if not isinstance(ours, str) or not ours.startswith(f"error {status.lower()} "):
        print(f"FAIL {json.dumps(obj)}: {status} expected, the driver answered {ours!r}")
        return False
    if status == "FORMAT" and not python_refuses:
        print(f"FAIL {json.dumps(obj)}: tokenizers reads it")
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    texts = TEXTS + random_texts(200)
    failures = 0
    configs = configurations()
    for obj in configs:
        failures += not compare(args.driver, workdir, obj, texts)
    print(f"{len(configs) - failures} of {len(configs)} pre-tokenizers cut {len(texts)} texts as tokenizers does")
    for obj, long_texts in exhaustive_cases():
        ok = compare(args.driver, workdir, obj, long_texts)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} every code point through {json.dumps(obj)}")
    failures += not punctuation_gaps_hold(args.driver, workdir)
    bad = sum(not refused(args.driver, workdir, status, obj) for status, obj in REFUSED)
    print(f"{len(REFUSED) - bad} of {len(REFUSED)} malformed or unsupported objects refused")
    failures += bad
    print("FAIL" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
