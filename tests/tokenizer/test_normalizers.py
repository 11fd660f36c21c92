#!/usr/bin/env python3
"""The engine's normalizers (src/tokenizer/normalizers.c) against Hugging Face's tokenizers 0.19.1, through
tests/tokenizer/normalize_driver.c:

- every normalizer, with its options, on texts of many scripts (accents and stacked marks, Hangul, CJK,
  ligatures, Turkish İ, Greek sigma, full width, Arabic, Devanagari, Thai, emoji with ZWJ and flags),
  controls, U+FFFD, soft hyphens, every kind of white space, NUL, and random strings of such code points:
  the normalized text and the span of original bytes of every code point, which tokenizers gives through
  PreTokenizedString splits of one code point each;
- texts cut by added tokens, whose pieces pass untouched and whose other pieces keep their offsets;
- every code point assigned in Unicode 3.2 (older than every table involved) through each normalizer, and
  every code point of the BMP after NBSP through Precompiled (grapheme cluster boundaries);
- the JSON forms serde's untagged NormalizerWrapper takes (any "type" for the structs, fields as arrays,
  lenient base64) and the ones it refuses, with the status and message the engine answers.

    test_normalizers.py --driver build/tests/tokenizer/normalize_driver

Skipped (77) where tokenizers 0.19.1 does not import; the Precompiled part needs sentencepiece, which
builds the charsmaps."""
import argparse
import base64
import io
import json
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import optional_import, run_under_python_with, unavailable  # noqa: E402

TEXTS = [
    "", "a", "Hello, World!", "  leading and trailing  ", "\t tabs\tand\nlines\r\n", "Crème brûlée à la française",
    "e\u0301\u0316x", "a\u0316\u0301", "\u1e0b\u0323", "\u1e0d\u0307", "q\u0307\u0323", "a\u0301\u0300\u0302\u0303",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA",
    "\u0301leading mark", "\u0344\u0345 \u0f73 \u0f75 \u0f81", "\u0958\u0915\u093c", "\u212b\u00c5A\u030a",
    "\u2126\u212a", "한국어 텍스트", "\u1100\u1161\u11a8", "\u1100\u1161\u11a7", "\uac00\u11a8", "\uac00\u11a7",
    "\u1100\u1100\u1161",
    "中文字符和日本語のテキスト", "漢字かなカナ\uff76\uff9e", "\U00020000\U0002a6df\uf900\U0002f800",
    "ﬁ ﬂ ﬃ ㎏ ½ ² ℃ ™ ① ㈱ \ufdfa", "İstanbul ıi IJ", "ΣΑΣ ὈΔΥΣΣΕΎΣ ς", "ǅ ǈ ǋ ẞ ß",
    "ＦＵＬＬ　ｗｉｄｔｈ！", "مرحبا بالعالم \u0627\u0653 \ufefb", "नमस्ते दुनिया \u0915\u094d\u0937",
    "สวัสดีชาวโลก ำ",
    "👨\u200d👩\u200d👧\u200d👦 🇫🇷🇩🇪🇺 👍🏽 ❤\ufe0f", "x\u0600y \u0605a",
    "\x00\x01\x08\x1b\x1f\x7f\x80\x85\x8f\x9f\u00a0", "\ufffd\u00ad\u200b\u200c\u200d\u200e\ufeff\u2060",
    "\t\n\r\x0b\x0c \u2028\u2029\u3000\u1680\u2000\u2005\u200a\u202f\u205f\u180e", "\ue000\U000f0000 private",
    "a\r\nb\n\rc", "\u2581already\u2581metaspaced", "don't  stop   me", "tokenization… “quoted” — dash",
]

# Code points for random strings: marks of many classes, Hangul jamo, controls, CJK, compatibility forms.
POOL = ("aAeEiIoOzZ 09.,'-\t\n\r\x00\x07\x7f\x85\u00a0\u00ad\u00e9\u00c5\u0130\u0131\u03a3\u03c2\u1e9e\u00df"
        "\u0300\u0301\u0302\u0308\u0316\u0323\u0327\u0334\u0345\u0344\u034f\u0591\u05b0\u064b\u0670\u093c"
        "\u094d\u0e31\u0e49\u0f71\u0f72\u0f74\u0f80\u1dc0\u20d0\u20e3\u302a\u3099\u309a\ufe20\U0001d165"
        "\u1100\u1112\u1161\u1175\u11a7\u11a8\u11c2\uac00\uac01\ud7a3\u4e2d\u6587\u3042\u30ab\uff76\uff9e"
        "\ufb01\u2126\u212b\u2460\u3392\uff21\ufffd\u200b\u200d\u2028\u3000\U0001f44d\U0001f3fd\U0001f1eb\u0627\u0653"
        "\u0915\u0958\u0b47\u0b3e\u0b57\u1025\u102e\u0ddd\u0dca")

SEGMENTS = [
    [["hello ", None], ["[MASK]", 7], [" wörld ", None]],
    [["[CLS]", 1], [" Éte\u0301 ", None], ["[SEP]", 2]],
    [["  ", None], ["<s>", 0], ["\u0301x", None]],
]

BERT = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
        "lowercase": True}


def unit(name):
    return {"type": name}


def replace(kind, pattern, content):
    return {"type": "Replace", "pattern": {kind: pattern}, "content": content}


def strip(left, right):
    return {"type": "Strip", "strip_left": left, "strip_right": right}


def prepend(text):
    return {"type": "Prepend", "prepend": text}


def precompiled(charsmap):
    return {"type": "Precompiled", "precompiled_charsmap": charsmap}


def configs(charsmaps):
    """The normalizers every text goes through."""
    made = [
        BERT, {**BERT, "lowercase": False}, {**BERT, "strip_accents": True, "lowercase": False},
        {**BERT, "clean_text": False, "handle_chinese_chars": False, "strip_accents": True},
        {**BERT, "handle_chinese_chars": False, "strip_accents": False},
        {**BERT, "clean_text": False, "strip_accents": False, "lowercase": False},
        unit("NFC"), unit("NFD"), unit("NFKC"), unit("NFKD"), unit("Lowercase"), unit("StripAccents"), unit("Nmt"),
        strip(True, True), strip(True, False), strip(False, True), strip(False, False),
        replace("String", " ", "\u2581"), replace("String", "ab", "X"), replace("String", "", "-"),
        replace("String", "\u00e9", ""), replace("String", "a.", "[dot]"), replace("Regex", r"\s+", " "),
        replace("Regex", " {2,}", " "), replace("Regex", "(?=a)", "^"), replace("Regex", "a|(?=c)", "X"),
        replace("Regex", r"\p{Mn}", ""), replace("Regex", "", "|"), replace("Regex", "$", "!"),
        replace("Regex", r"\b", "|"),
        replace("Regex", ".", "<>"), replace("Regex", r"(\X)", "[]"), replace("Regex", "^ +", ""),
        prepend("\u2581"), prepend(""), prepend("ab"),
        {"type": "Sequence", "normalizers": []},
        {"type": "Sequence", "normalizers": [unit("NFD"), unit("StripAccents"), unit("Lowercase")]},
        {"type": "Sequence", "normalizers": [replace("String", " ", "\u2581"), prepend("\u2581")]},
        {"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": [unit("NFKC")]}, unit("Lowercase"),
                                             {"type": "Sequence", "normalizers": [{"type": "Strip", "strip_left": True,
                                                                                   "strip_right": True}]}]},
    ]
    for name, charsmap in charsmaps.items():
        made.append(precompiled(charsmap))
        made.append({"type": "Sequence", "normalizers": [precompiled(charsmap),
                                                         replace("Regex", " {2,}", " ")]})
    return made


# Forms serde's untagged enum takes that a tokenizer.json would not normally hold: compared like the rest.
QUIRKS = [
    {"type": "NFC", "strip_left": True, "strip_right": True},
    {"clean_text": True, "handle_chinese_chars": False, "lowercase": True},
    {"type": "Prepend", "normalizers": [unit("Lowercase")]},
    {"type": "NFC", "prepend": "x"},
    {"type": "Replace", "pattern": {"Regex": "("}, "content": "x", "prepend": "y"},
    {"type": "Sequence", "normalizers": [[True, True, None, True], [True, False], ["Lowercase"], ["\u2581"], [[]],
                                         [{"String": "e"}, "E"]]},
    {"type": "StripAccents", "extra": [1, 2]},
    {**BERT, "unknown": 1},
]

# Refused by both: (normalizer, status, message). Charsmaps given as bytes are base64-encoded here.
REFUSALS = [
    (unit("Foo"), "unsupported", 'normalizer: unsupported type "Foo"'),
    ({"type": "Sequence", "normalizers": [unit("NFC"), unit("Nope")]}, "unsupported",
     'normalizer: unsupported type "Nope"'),
    ({"type": "BertNormalizer"}, "format", 'BertNormalizer: "clean_text" is missing'),
    ({**BERT, "clean_text": 1}, "format", 'BertNormalizer: "clean_text" is not a boolean'),
    ({**BERT, "lowercase": None}, "format", 'BertNormalizer: "lowercase" is missing'),
    ({**BERT, "strip_accents": "yes"}, "format", 'BertNormalizer: "strip_accents" is not a boolean'),
    ({"type": "Strip", "strip_left": True}, "format", 'Strip: "strip_right" is missing'),
    (replace("Regex", "(", "x"), "format", "Replace: bad regex: end pattern with unmatched parenthesis"),
    ({"type": "Replace", "pattern": "a", "content": "x"}, "format", 'Replace: "pattern" is not'),
    ({"type": "Replace", "pattern": {"String": "a", "Regex": "b"}, "content": "x"}, "format",
     'Replace: "pattern" is not'),
    ({"type": "Replace", "pattern": {"String": "a"}}, "format", 'Replace: "content" is missing'),
    ({"type": "Prepend"}, "format", 'Prepend: "prepend" is missing'),
    ({"type": "Prepend", "prepend": 3}, "format", 'Prepend: "prepend" is not a string'),
    ({"type": "Sequence"}, "format", 'Sequence: "normalizers" is not an array'),
    ({"type": "Sequence", "normalizers": ["NFC"]}, "format", "normalizer is not an object"),
    ({"type": "Sequence", "normalizers": [["NFC", 1]]}, "format", "normalizer: the array fits no normalizer"),
    ({"typ": "NFC"}, "format", 'normalizer has no "type" string'),
    ({"type": "Precompiled"}, "format", 'Precompiled: "precompiled_charsmap" is missing'),
    ({"type": "Precompiled", "precompiled_charsmap": None}, "format", 'Precompiled: "precompiled_charsmap" is missing'),
    (precompiled("!!!!"), "format", 'Precompiled: "precompiled_charsmap" is not base64'),
    ({"type": "Precompiled", "precompiled_charsmap": "AAAAAAB="}, "format", "is not base64"),
    ({"type": "Precompiled", "precompiled_charsmap": "AAAAA"}, "format", "is not base64"),
    ({"type": "Precompiled", "precompiled_charsmap": "AA==AA=="}, "format", "is not base64"),
    ({"type": "Precompiled", "precompiled_charsmap": "AAA AAA="}, "format", "is not base64"),
    ({"type": "Precompiled", "precompiled_charsmap": ""}, "format", "Precompiled: the charsmap has no trie size"),
    (precompiled(b"\x10\x00\x00\x00\x00"), "format", "the trie runs past the charsmap"),
    ({"type": "Precompiled", "precompiled_charsmap": b"\x00\x00\x00\x00a\xff"}, "format", "replacements are not UTF-8"),
]

# Taken by both (base64 with and without padding), whose tries are empty: tokenizers panics on them, the
# engine leaves the text as it was.
ACCEPTED = ["AAAAAA", "AAAAAA=", "AAAAAA==", "AAAAAAA", "AAAAAAAA", "BQAAAAAAAAAAAA==", "AAAAAGHDqQ=="]


# Worked by hand from tokenizers' transform rule: (normalizer, case, [(text, id, spans of its code points)]).
HAND_WORKED = [
    (unit("NFD"), "\u00e9", [("e\u0301", -1, [[0, 2], [0, 2]])]),  # the mark is inserted after its base
    (unit("NFD"), "a\u0301\u0316", [("a\u0316\u0301", -1, [[0, 1], [1, 3], [3, 5]])]),  # reordered, spans stay
    (unit("NFC"), "e\u0301x", [("\u00e9x", -1, [[0, 1], [3, 4]])]),  # the composite replaces e, the mark is removed
    (unit("Lowercase"), "\u0130x", [("i\u0307x", -1, [[0, 2], [0, 2], [2, 3]])]),
    (BERT, "a\u4e2d\u00c9", [("a \u4e2d e", -1, [[0, 1], [1, 4], [1, 4], [1, 4], [4, 6]])]),
    ({"type": "Strip", "strip_left": True, "strip_right": True}, "  ab ", [("ab", -1, [[2, 3], [3, 4]])]),
    (replace("Regex", " {2,}", " "), "a   b", [("a b", -1, [[0, 1], [3, 4], [4, 5]])]),  # the match's last span
    (replace("String", "", "-"), "ab", [("-a-b-", -1, [[0, 0], [0, 1], [0, 1], [1, 2], [1, 2]])]),
    (prepend("\u2581"), [["[CLS]", 1], ["ab", None]],
     [("[CLS]", 1, [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]), ("\u2581ab", -1, [[5, 6], [5, 6], [6, 7]])]),
    (prepend(""), [["x", 1], ["ab", None]],
     [("x", 1, [[0, 1]]), ("ab", -1, [[1, 1], [2, 3]])]),  # the first code point, inserted, at the piece's start
]


def compare_hand_worked(tokenizers, driver, checker):
    """The spans worked by hand are tokenizers' and the engine's."""
    results = run_driver(driver, [{"normalizer": n, "cases": [case]} for n, case, _ in HAND_WORKED])
    for (normalizer, case, expected), result in zip(HAND_WORKED, results):
        name = "hand-worked " + json.dumps(normalizer)[:60]
        reference = reference_case(tokenizers, reference_normalizer(tokenizers, normalizer), case)
        checker.pieces(name + " in tokenizers", case, [{"text": t, "id": i, "spans": s} for t, i, s in reference],
                       expected)
        checker.pieces(name, case, result["results"][0] if result["status"] == "ok" else result["status"], expected)


def encoded(normalizer):
    """The normalizer with a charsmap given as bytes base64-encoded."""
    charsmap = normalizer.get("precompiled_charsmap") if isinstance(normalizer, dict) else None
    if isinstance(charsmap, bytes):
        return {**normalizer, "precompiled_charsmap": base64.b64encode(charsmap).decode()}
    return normalizer


def tokenizer_json(normalizer):
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                       "normalizer": normalizer, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                       "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}})


def reference_normalizer(tokenizers, normalizer):
    """tokenizers' normalizer read from a tokenizer.json, or None where it refuses it."""
    try:
        return tokenizers.Tokenizer.from_str(tokenizer_json(normalizer)).normalizer
    except Exception:  # noqa: BLE001 (tokenizers raises a plain Exception)
        return None


def reference_piece(tokenizers, normalizer, text, offset):
    """tokenizers' normalized text and the original bytes of each of its code points."""
    pretokenized = tokenizers.PreTokenizedString(text)
    pretokenized.normalize(lambda normalized: normalizer.normalize(normalized))
    pretokenized.split(lambda _, normalized: [normalized.slice((j, j + 1)) for j in range(len(normalized.normalized))])
    splits = pretokenized.get_splits(offset_referential="original", offset_type="byte")
    return "".join(s for s, _, _ in splits), [[b + offset, e + offset] for _, (b, e), _ in splits]


def reference_case(tokenizers, normalizer, case):
    """The pieces tokenizers makes of a case: each open segment normalized alone (its offsets shifted by
    its start), added tokens untouched, empty pieces dropped."""
    segments = [[case, None]] if isinstance(case, str) else case
    pieces, offset = [], 0
    for text, token in segments:
        size = len(text.encode())
        if token is not None:
            spans, at = [], offset
            for ch in text:
                spans.append([at, at + len(ch.encode())])
                at += len(ch.encode())
            pieces.append((text, token, spans))
        else:
            normalized, spans = reference_piece(tokenizers, normalizer, text, offset)
            if normalized:
                pieces.append((normalized, -1, spans))
        offset += size
    return pieces


def run_driver(driver, runs):
    completed = subprocess.run([driver], input=json.dumps({"runs": runs}).encode(), capture_output=True, timeout=300)
    if completed.returncode != 0:
        sys.exit(f"FAIL: the driver exited {completed.returncode}: {completed.stderr.decode(errors='replace')}")
    return json.loads(completed.stdout)["runs"]


def spm_charsmaps(spm, model_pb2):
    """SentencePiece's built-in charsmaps, from models trained on a few words."""
    charsmaps = {}
    for rule in ("nmt_nfkc", "nfkc_cf"):
        model = io.BytesIO()
        sentences = iter(["hello world this is a test of the sentencepiece trainer"] * 20)
        spm.SentencePieceTrainer.train(sentence_iterator=sentences, model_writer=model, vocab_size=20,
                                       normalization_rule_name=rule, minloglevel=2)
        proto = model_pb2.ModelProto()
        proto.ParseFromString(model.getvalue())
        charsmaps[rule] = base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode()
    return charsmaps


def random_texts(count, seed=1):
    generator = random.Random(seed)
    return ["".join(generator.choice(POOL) for _ in range(generator.randrange(1, 12))) for _ in range(count)]


class Checker:
    def __init__(self):
        self.failures = 0
        self.checks = 0

    def fail(self, what):
        self.failures += 1
        if self.failures <= 40:
            print(f"  FAIL {what}", flush=True)

    def pieces(self, name, case, got, expected):
        self.checks += 1
        got = [(p["text"], p["id"], p["spans"]) for p in got] if isinstance(got, list) else got
        expected = [(t, i, s) for t, i, s in expected]
        if got != expected:
            self.fail(f"{name} on {case!r}:\n      engine     {got!r}\n      tokenizers {expected!r}")


def compare_behaviour(tokenizers, driver, normalizers, cases, checker):
    """Every normalizer tokenizers takes, on every case: texts and spans."""
    runs, expected = [], []
    for normalizer in normalizers:
        reference = reference_normalizer(tokenizers, normalizer)
        if reference is None:
            checker.fail(f"tokenizers refuses {json.dumps(normalizer)}")
            continue
        runs.append({"normalizer": normalizer, "cases": cases})
        expected.append([reference_case(tokenizers, reference, case) for case in cases])
    for run, result, wanted in zip(runs, run_driver(driver, runs), expected):
        name = json.dumps(run["normalizer"], ensure_ascii=True)[:100]
        if result["status"] != "ok":
            checker.fail(f"{name}: {result['status']} {result['message']}")
            continue
        for case, got, want in zip(run["cases"], result["results"], wanted):
            checker.pieces(name, case, got, want)


def compare_refusals(tokenizers, driver, checker):
    runs = [{"normalizer": encoded(normalizer), "cases": []} for normalizer, _, _ in REFUSALS]
    runs += [{"normalizer": precompiled(text), "cases": ["a\u00e9\r\n"]}
             for text in ACCEPTED]
    results = run_driver(driver, runs)
    for (normalizer, status, message), run, result in zip(REFUSALS, runs, results):
        checker.checks += 1
        if reference_normalizer(tokenizers, run["normalizer"]) is not None:
            checker.fail(f"tokenizers takes {json.dumps(run['normalizer'])}")
        if result["status"] != status or message not in result["message"]:
            checker.fail(f"{json.dumps(run['normalizer'])}: {result['status']} {result['message']!r}, "
                         f"not {status} {message!r}")
    unchanged = [("a\u00e9\r\n", -1, [[0, 1], [1, 3], [3, 4], [4, 5]])]
    for run, result in zip(runs[len(REFUSALS):], results[len(REFUSALS):]):
        checker.checks += 1
        if reference_normalizer(tokenizers, run["normalizer"]) is None or result["status"] != "ok":
            checker.fail(f"{json.dumps(run['normalizer'])} is taken by tokenizers, here {result['status']} "
                         f"{result['message']!r}")
        else:  # tokenizers panics on a trie without units; here the text is left as it was
            checker.pieces(json.dumps(run["normalizer"]), run["cases"][0], result["results"][0], unchanged)


# Assigned in Unicode 3.2, but their General_Category changed since tokenizers' unicode_categories (8.0):
# U+1885 and U+1886 became Mn in 9.0, U+1734 left Mn in 14.0 (normalizers.c's head lists the differences).
RECATEGORIZED = {"\u1734", "\u1885", "\u1886"}


def compare_code_points(tokenizers, driver, normalizers, checker):
    """Each code point assigned in Unicode 3.2 alone, between separators (U+2FFF, unassigned in both),
    through each normalizer."""
    import unicodedata
    old = unicodedata.ucd_3_2_0
    separator = "\u2fff"
    points = [chr(c) for c in range(0x110000) if old.category(chr(c)) not in ("Cn", "Co", "Cs")]
    text = separator.join(points)
    results = run_driver(driver, [{"normalizer": n, "cases": [text], "text_only": True} for n in normalizers])
    for normalizer, result in zip(normalizers, results):
        checker.checks += 1
        name = json.dumps(normalizer)[:80]
        got = "".join(p["text"] for p in result["results"][0]) if result["status"] == "ok" else ""
        want = reference_normalizer(tokenizers, normalizer).normalize_str(text)
        got_parts, want_parts = got.split(separator), want.split(separator)
        differing = [f"U+{ord(p):04X}" for p, g, w in zip(points, got_parts, want_parts)
                     if g != w and p not in RECATEGORIZED]
        if not differing and len(got_parts) == len(want_parts):
            continue
        checker.fail(f"{name}: {len(differing)} code points differ ({', '.join(differing[:12])}), "
                     f"{len(got_parts)} parts here, {len(want_parts)} there")


def compare_clusters(tokenizers, driver, charsmaps, checker):
    """Grapheme clusters under Precompiled: a cluster of fewer than 6 bytes is replaced whole when its
    first code point is in the charsmap, so NBSP (replaced by a space) followed by each code point of the
    BMP shows where utf8proc and unicode-segmentation put a boundary."""
    separator = "\u2fff"
    points = [chr(c) for c in range(0x20, 0x10000) if not 0xD800 <= c < 0xE000 and c != 0x2FFF]
    text = separator.join("\u00a0" + p for p in points)
    normalizers = [precompiled(charsmap) for charsmap in charsmaps.values()]
    results = run_driver(driver, [{"normalizer": n, "cases": [text], "text_only": True} for n in normalizers])
    for normalizer, result in zip(normalizers, results):
        checker.checks += 1
        got = "".join(p["text"] for p in result["results"][0]).split(separator)
        want = reference_normalizer(tokenizers, normalizer).normalize_str(text).split(separator)
        differing = [f"U+{ord(p):04X}" for p, g, w in zip(points, got, want) if g != w]
        if differing or len(got) != len(want):
            checker.fail(f"Precompiled after NBSP: {len(differing)} code points differ ({', '.join(differing[:12])})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--driver", required=True)
    arguments = parser.parse_args()
    run_under_python_with(["tokenizers"])
    import tokenizers
    if tokenizers.__version__ != "0.19.1":
        unavailable(f"tokenizers {tokenizers.__version__} is installed, the reference is 0.19.1")
    spm = optional_import("sentencepiece", "Precompiled's charsmaps")
    model_pb2 = optional_import("sentencepiece.sentencepiece_model_pb2", "Precompiled's charsmaps") if spm else None
    charsmaps = spm_charsmaps(spm, model_pb2) if model_pb2 else {}
    checker = Checker()
    cases = TEXTS + random_texts(150) + SEGMENTS
    compare_hand_worked(tokenizers, arguments.driver, checker)
    compare_behaviour(tokenizers, arguments.driver, configs(charsmaps), cases, checker)
    compare_behaviour(tokenizers, arguments.driver, QUIRKS, TEXTS, checker)
    compare_refusals(tokenizers, arguments.driver, checker)
    whole = [BERT, {**BERT, "lowercase": False, "strip_accents": True}, unit("NFC"), unit("NFD"), unit("NFKC"),
             unit("NFKD"), unit("Lowercase"), unit("StripAccents"), unit("Nmt")]
    whole += [precompiled(charsmap) for charsmap in charsmaps.values()]
    compare_code_points(tokenizers, arguments.driver, whole, checker)
    compare_clusters(tokenizers, arguments.driver, charsmaps, checker)
    print(f"{checker.checks - checker.failures} of {checker.checks} checks pass", flush=True)
    sys.exit(1 if checker.failures else 0)


if __name__ == "__main__":
    main()
