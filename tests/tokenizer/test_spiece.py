"""SentencePiece model files (src/tokenizer/spiece.c) against transformers 4.44's slow tokenizers and the
sentencepiece package, id for id.

Three models are trained here with the sentencepiece package, seeded and on one thread, on a multilingual
text (the locales' month and day names, the common licenses, lines of many scripts written below): a
Unigram model (nmt_nfkc, 4000 pieces, characters past 98 % coverage left unknown), a BPE model (3000
pieces, byte fallback), and a Unigram model that normalizes nothing and keeps every space (2000 pieces;
SiglipTokenizer's rules for a lone leading "▁" run only there). Each is laid out three ways and cut by
`uform tokenize` and by the reference:

  - a folder with sentencepiece.bpe.model and tokenizer_config.json naming XLMRobertaTokenizer, against
    XLMRobertaTokenizer(vocab_file=...)(text)["input_ids"];
  - a folder with spiece.model and tokenizer_config.json naming SiglipTokenizer, against
    SiglipTokenizer(vocab_file=...)(text)["input_ids"];
  - the bare .model file, against SentencePieceProcessor(model_file=...).encode(text), whose spans must
    be SentencePiece's own byte offsets.

The texts: edge cases (empty, whitespace, punctuation, emoji sequences, combining marks, CJK, RTL,
controls, the special tokens written in the text, long words, full-width forms, ligatures, case that
lowercases to two code points) and lines of the training text, some altered. A mismatch prints the text,
both id lists and the first position where they differ. Every span must lie within its text and the
spans of a text must be in order. Corrupt model files (empty, truncated, random bytes) must be refused
with a format error naming the fault, and unknown tokenizer classes as unsupported; a text that is not
UTF-8 fails alone. With --library, uform_tokenizer_info of each tokenizer is checked too, and
uform_tokenizer_token of every id against the reference's convert_ids_to_tokens (id_to_piece).

    test_spiece.py --uform build/tools/uform --workdir DIR [--library build/libuform.so]
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import run_under_python_with  # noqa: E402

run_under_python_with(["sentencepiece", "transformers", "google.protobuf"])

import sentencepiece as spm  # noqa: E402
import transformers  # noqa: E402
from transformers import SiglipTokenizer, XLMRobertaTokenizer  # noqa: E402

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")  # transformers' notes on clean_up_tokenization_spaces and on a text's own </s>

# Lines in scripts and forms the locales and licenses hold little of.
WRITTEN = """
The quick brown fox jumps over the lazy dog. Tokenizers cut texts into pieces; embeddings need ids.
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Übermäßig, naïve café résumé.
Le renard brun rapide saute par-dessus le chien paresseux. À bientôt, garçon! Ça va très bien.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca? ¡Mañana!
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир! Съешь ещё этих мягких булок.
Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί. Καλημέρα κόσμε. ΟΔΟΣ ΣΟΦΟΣ.
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

EDGE_CASES = [
    "", " ", "   ", "\t\n", "\u3000\u00a0\u2009", "!", "!!!", "...", "?!,.;:", "\"'`", "<>", "()[]{}",
    "a", "A", "Hello world", "  Hello   world  ", "hello, world!", "don't stop", "e-mail: a@b.c",
    "😀", "👩‍💻", "👨‍👩‍👧‍👦", "🇺🇦🇯🇵", "👍🏽", "❤️", "e\u0301", "a\u0308o\u0302\u0323", "\u0301\u0301",
    "你好，世界！", "こんにちは", "안녕하세요", "中文 English 混合", "مرحبا بالعالم", "שלום עולם",
    "\u202eabc\u202c", "a\x00b", "\x01\x02\x7f", "\r\n", "a\u200bb", "\ufeffbom", "\u200d",
    "<s>", "</s>", "<unk>", "<pad>", "<mask>", "<s></s>", "a<mask>b", "a <mask> b", "a  <mask>  b",
    "x </s> y", "</s> y", "x </s>", " </s> ", "<unk> hello", "hello <unk>", "</S> <MASK>", "<s >",
    "< /s>", "<<s>>", "</s></s>", "</s> </s>", "a</s>", "▁", "▁▁", "a▁b", "▁hello", "hello▁",
    "a" * 500, "antidisestablishmentarianism" * 8, "x" * 3000 + " y", "ab" * 700,
    "ＡＢＣ　ｆｕｌｌｗｉｄｔｈ　１２３！", "ﬁ ﬂ ﬀ ﬃ ĳ Ǆ", "ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕", "①②③ ⅫⅪ ㊙ ㎏",
    "İstanbul", "İİ", "ΣΑΣ ΟΔΟΣ", "ǅungla ǈ", "ẞ straße", "ＳＴＲＡẞＥ", "Ꭰ Ꭱ ꭰ", "𐐀𐐨",
    "\t\tTabs\tand\nnewlines\n", "ends with space ", " starts with space", "Mixed CASE Words",
    "www", "wwww", "https://www.example.org/www/", "hahaha hahahaha", "0000000000 1111111", "abababababab",
    "----------", "aaaaaaaaaaaa", "lalala la la", "!!!???!!!",
]


def locale_lines() -> list:
    """The quoted strings of the locales' definitions (<Uxxxx> escapes), twelve to a line."""
    lines = []
    for path in sorted(glob.glob("/usr/share/i18n/locales/*")):
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except (IsADirectoryError, PermissionError):
            continue
        words = ["".join(chr(int(h, 16)) for h in re.findall(r"<U([0-9A-Fa-f]+)>", quoted))
                 for quoted in re.findall(r'"((?:<U[0-9A-Fa-f]{4,8}>)+)"', text)]
        lines += [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    return lines


def license_lines() -> list:
    lines = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        try:
            lines += [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        except (IsADirectoryError, UnicodeDecodeError, PermissionError):
            continue
    return lines


def corpus() -> list:
    return [line for line in WRITTEN.strip().splitlines()] * 20 + locale_lines() + license_lines()


def train(lines: list, workdir: Path) -> dict:
    """The models, trained seeded on one thread: {name: path}."""
    spm.set_random_generator_seed(1234)
    settings = {
        "unigram": dict(model_type="unigram", vocab_size=4000, normalization_rule_name="nmt_nfkc"),
        "bpe": dict(model_type="bpe", vocab_size=3000, byte_fallback=True),
        "spaces": dict(model_type="unigram", vocab_size=2000, normalization_rule_name="identity",
                       remove_extra_whitespaces=False),
    }
    paths = {}
    for name, options in settings.items():
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, num_threads=1,
                                       character_coverage=0.98, minloglevel=2, **options)
        paths[name] = workdir / f"{name}.model"
        paths[name].write_bytes(model.getvalue())
    return paths


def folder(workdir: Path, name: str, model: Path, file_name: str, config: dict) -> Path:
    path = workdir / name
    path.mkdir(exist_ok=True)
    (path / file_name).write_bytes(model.read_bytes())
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def texts(lines: list) -> list:
    """The edge cases, every 23rd line of the training text, some lines altered, and random strings of
    the text's characters, whitespace, punctuation and special tokens."""
    rng = random.Random(7)
    sample = lines[::23]
    altered = []
    for line in sample[:150]:
        words = line.split(" ")
        altered.append(line.upper())
        altered.append(" </s> ".join(words[:3]) + " <mask>" + "".join(words[3:6]))
        altered.append("".join(rng.choice([c, c + rng.choice(" !.,\u2581\u3000"), c.upper()]) for c in line[:80]))
    alphabet = sorted(set("".join(sample))) + list(" \t\n\u00a0\u2581\u0130\u0307!.,<>/") + \
        ["<s>", "</s>", "<unk>", "<pad>", "<mask>", " </s> ", "\U0001F600", "\u200d"]
    random_texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))) for _ in range(200)]
    return EDGE_CASES + sample + altered + random_texts


def uform_cut(uform: str, flag: str, path: Path, items: list, *options: str) -> list:
    """`uform tokenize` of every text, through a JSONL manifest on standard input: [(ids, spans)]."""
    manifest = "".join(json.dumps({"text": text}) + "\n" for text in items)
    done = subprocess.run([uform, "tokenize", flag, str(path), "--manifest", "-", *options], input=manifest.encode(),
                          capture_output=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"FAIL: uform tokenize {flag} {path} exited {done.returncode}: {done.stderr.decode()}")
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    if [row["index"] for row in rows] != list(range(len(items))):
        raise SystemExit(f"FAIL: uform tokenize {flag} {path} printed {len(rows)} rows for {len(items)} texts")
    return [(row["ids"], row["spans"]) for row in rows]


def first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def spans_fault(text: str, spans: list) -> str | None:
    """Why the spans of one text are wrong, or None: each within the text, and those of the text's own
    tokens in order (the special tokens a class adds span [0, 0))."""
    size = len(text.encode("utf-8"))
    previous = None
    for i, (begin, end) in enumerate(spans):
        if not 0 <= begin <= end <= size:
            return f"span {i} [{begin}, {end}) is not within the text's {size} bytes"
        if (begin, end) == (0, 0):
            continue
        if previous and (begin < previous[1][0] or end < previous[1][1]):
            return f"span {i} [{begin}, {end}) goes back from span {previous[0]} {previous[1]}"
        previous = (i, (begin, end))
    return None


def unigram_tie(want: list, ids: list, pieces) -> bool:
    """Whether two id lists differ only where one stretch of text is cut into the same pieces in another
    order ("w" "ww" against "ww" "w"): paths of one score in exact arithmetic, which SentencePiece's
    Unigram Viterbi compares in float (0.2, PyPI's) or in double against a float (0.1.97, Debian's), so
    that the two may break the tie apart."""
    head = first_difference(want, ids)
    tail = 0
    while tail < min(len(want), len(ids)) - head and want[len(want) - 1 - tail] == ids[len(ids) - 1 - tail]:
        tail += 1
    a, b = want[head:len(want) - tail], ids[head:len(ids) - tail]
    return len(a) > 1 and sorted(a) == sorted(b) and "".join(pieces(a)) == "".join(pieces(b))


def compare(label: str, items: list, expected: list, got: list, pieces, expected_spans: list | None = None) -> int:
    """Prints every mismatch (ids, spans out of the text or of order, spans unlike SentencePiece's where
    those are given); answers how many texts failed. A tie of the Unigram Viterbi broken otherwise
    (unigram_tie) is counted apart, and is no failure."""
    failures, ties = 0, 0
    for index, (text, want, (ids, spans)) in enumerate(zip(items, expected, got)):
        fault = None
        if ids != want and unigram_tie(want, ids, pieces):
            ties += 1
            print(f"  tie  {label}, text {index} {text[:80]!r}: {pieces(want)} against {pieces(ids)}")
        elif ids != want:
            at = first_difference(want, ids)
            fault = f"ids differ at {at}:\n    reference {want}\n    uform     {ids}"
        if not fault and spans_fault(text, spans):
            fault = spans_fault(text, spans)
        elif not fault and expected_spans is not None and ids == want and \
                [list(s) for s in expected_spans[index]] != spans:
            fault = f"spans differ from SentencePiece's:\n    reference {expected_spans[index]}\n    uform     {spans}"
        if fault:
            failures += 1
            if failures <= 10:
                print(f"FAIL {label}, text {index} {text[:200]!r}: {fault}")
    same = len(items) - failures - ties
    print(f"{'ok  ' if not failures else 'FAIL'} {label}: {same} of {len(items)} texts as the reference"
          + (f", {ties} Unigram ties broken otherwise" if ties else ""))
    return failures


def plain_reference(model: Path, items: list) -> tuple:
    processor = spm.SentencePieceProcessor(model_file=str(model))
    ids = [processor.encode(text) for text in items]
    spans = [[(piece.begin, piece.end) for piece in processor.encode(text, return_type="proto").pieces]
             for text in items]
    return ids, spans


def refused(uform: str, flag: str, path: Path, status: str, named: str) -> int:
    """`uform tokenize` must refuse the tokenizer with `status`, its message naming `named`."""
    done = subprocess.run([uform, "tokenize", flag, str(path), "x"], capture_output=True, timeout=60)
    message = done.stderr.decode(errors="replace").strip()
    if done.returncode == 1 and f"UForm: {status} [uform_tokenizer_open]" in message and named in message:
        print(f"ok   refused {path.name}: {message}")
        return 0
    print(f"FAIL {path.name}: expected {status} naming {named!r}; exit {done.returncode}, {message!r}")
    return 1


def invalid_utf8(uform: str, model: Path) -> int:
    """A text that is not UTF-8 fails alone: an error row between the others, exit status 1."""
    done = subprocess.run([uform, "tokenize", "--tokenizer", str(model)], input=b"ok\n\xff\xfe\nfine\n",
                          capture_output=True, timeout=60)
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    if done.returncode == 1 and len(rows) == 3 and rows[1] == {"index": 1, "error": "format"} and \
            "ids" in rows[0] and "ids" in rows[2]:
        print("ok   a text that is not UTF-8 fails alone")
        return 0
    print(f"FAIL invalid UTF-8: exit {done.returncode}, rows {rows}")
    return 1


def info_check(library: str, paths: dict) -> int:
    """uform_tokenizer_info of each tokenizer: {path: (vocabulary, special tokens added, model name)}."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [("vocabulary", ctypes.c_size_t), ("max_length", ctypes.c_size_t),
                    ("special_added", ctypes.c_size_t), ("model", ctypes.c_char * 16)]

    uform = ctypes.CDLL(library)
    failures = 0
    for path, expected in paths.items():
        tokenizer = ctypes.c_void_p()
        info = Info()
        if uform.uform_tokenizer_open(str(path).encode(), ctypes.byref(tokenizer)) != 0 or \
                uform.uform_tokenizer_info(tokenizer, ctypes.byref(info)) != 0:
            print(f"FAIL uform_tokenizer_info of {path}: cannot open it")
            failures += 1
            continue
        got = (info.vocabulary, info.special_added, info.max_length, info.model.decode())
        uform.uform_tokenizer_free(tokenizer)
        if got != expected:
            print(f"FAIL uform_tokenizer_info of {path}: {got}, expected {expected}")
            failures += 1
    print(f"{'ok  ' if not failures else 'FAIL'} uform_tokenizer_info of {len(paths)} tokenizers")
    return failures


def strings_check(library: str, strings: dict) -> int:
    """uform_tokenizer_token of every id of each tokenizer against the reference's own strings:
    {path: (vocabulary, the reference's id -> string)}; one past the vocabulary must be refused."""
    import ctypes

    uform = ctypes.CDLL(library)
    uform.uform_tokenizer_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    uform.uform_tokenizer_token.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.POINTER(ctypes.c_size_t)]
    uform.uform_tokenizer_free.argtypes = [ctypes.c_void_p]
    failures = 0
    for path, (size, reference) in strings.items():
        tokenizer = ctypes.c_void_p()
        if uform.uform_tokenizer_open(str(path).encode(), ctypes.byref(tokenizer)) != 0:
            print(f"FAIL uform_tokenizer_token of {path}: cannot open it")
            failures += 1
            continue
        wrong = []
        for token_id in range(size + 1):
            string, length = ctypes.c_void_p(), ctypes.c_size_t()
            status = uform.uform_tokenizer_token(tokenizer, token_id, ctypes.byref(string), ctypes.byref(length))
            got = ctypes.string_at(string.value, length.value).decode() if status == 0 else None
            want = reference(token_id) if token_id < size else None
            if got != want:
                wrong.append((token_id, got, want))
        uform.uform_tokenizer_free(tokenizer)
        if wrong:
            print(f"FAIL uform_tokenizer_token of {path}: {len(wrong)} ids differ, first {wrong[:5]}")
            failures += 1
    print(f"{'ok  ' if not failures else 'FAIL'} uform_tokenizer_token of every id of {len(strings)} tokenizers")
    return failures


def corrupt_cases(uform: str, workdir: Path, models: dict) -> int:
    unigram = models["unigram"].read_bytes()
    corrupt = workdir / "corrupt"
    corrupt.mkdir(exist_ok=True)
    cases = {
        "empty.model": b"",
        "truncated.model": unigram[: len(unigram) // 2],
        "random.model": bytes(random.Random(11).randrange(256) for _ in range(4096)).replace(b"{", b"}"),
        "header.model": unigram[:7],
    }
    failures = 0
    for name, data in cases.items():
        (corrupt / name).write_bytes(data)
        failures += refused(uform, "--tokenizer", corrupt / name, "format", "not a SentencePiece model")
    t5 = folder(workdir, "t5", models["unigram"], "spiece.model", {"tokenizer_class": "T5Tokenizer"})
    failures += refused(uform, "--model", t5, "unsupported", "T5Tokenizer")
    extra = folder(workdir, "siglip-extra", models["unigram"], "spiece.model",
                   {"tokenizer_class": "SiglipTokenizer", "additional_special_tokens": ["<x>"]})
    failures += refused(uform, "--model", extra, "unsupported", "additional_special_tokens")
    bare = workdir / "no-config"
    bare.mkdir(exist_ok=True)
    (bare / "spiece.model").write_bytes(unigram)
    failures += refused(uform, "--model", bare, "io", "tokenizer_config.json")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uform", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--library", help="libuform.so, for uform_tokenizer_info")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    lines = corpus()
    models = train(lines, workdir)
    items = texts(lines)
    print(f"{len(items)} texts, models {', '.join(f'{k} ({v.stat().st_size} bytes)' for k, v in models.items())}")
    failures = 0
    infos, strings = {}, {}
    for name, model in models.items():
        size = spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()
        kind = "BPE" if name == "bpe" else "Unigram"
        xlmr = folder(workdir, f"xlmr-{name}", model, "sentencepiece.bpe.model",
                      {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512})
        siglip = folder(workdir, f"siglip-{name}", model, "spiece.model",
                        {"tokenizer_class": "SiglipTokenizer", "do_lower_case": True, "model_max_length": 64})
        cased = folder(workdir, f"siglip-cased-{name}", model, "spiece.model",
                       {"tokenizer_class": "SiglipTokenizer", "do_lower_case": False})
        infos.update({xlmr: (size + 2, 2, 0, kind), siglip: (size, 1, 0, kind), model: (size, 0, 0, kind)})
        plain_processor = spm.SentencePieceProcessor(model_file=str(model))
        strings.update({xlmr: (size + 2, XLMRobertaTokenizer(vocab_file=str(model)).convert_ids_to_tokens),
                        siglip: (size, SiglipTokenizer(vocab_file=str(model)).convert_ids_to_tokens),
                        model: (size, plain_processor.id_to_piece)})
        few = items[:300]
        for label, path, reference, texts_, options in [
                ("XLMRobertaTokenizer", xlmr, XLMRobertaTokenizer(vocab_file=str(model)), items, {}),
                ("XLMRobertaTokenizer without special tokens", xlmr, XLMRobertaTokenizer(vocab_file=str(model)), few,
                 {"add_special_tokens": False}),
                ("SiglipTokenizer", siglip, SiglipTokenizer(vocab_file=str(model)), items, {}),
                ("SiglipTokenizer without special tokens", siglip, SiglipTokenizer(vocab_file=str(model)), few,
                 {"add_special_tokens": False}),
                ("SiglipTokenizer(do_lower_case=False)", cased,
                 SiglipTokenizer(vocab_file=str(model), do_lower_case=False), few, {})]:
            expected = [reference(text, **options)["input_ids"] for text in texts_]
            flags = ["--no-special"] if options else []
            failures += compare(f"{label}, {name}", texts_, expected, uform_cut(args.uform, "--model", path, texts_, *flags),
                                reference.convert_ids_to_tokens)
        processor = spm.SentencePieceProcessor(model_file=str(model))
        ids, spans = plain_reference(model, items)
        failures += compare(f"SentencePieceProcessor.encode, {name}", items, ids,
                            uform_cut(args.uform, "--tokenizer", model, items),
                            lambda ids: [processor.id_to_piece(i) for i in ids], spans)
    failures += invalid_utf8(args.uform, models["unigram"])
    failures += corrupt_cases(args.uform, workdir, models)
    if args.library:
        failures += info_check(args.library, infos)
        failures += strings_check(args.library, strings)
    if failures:
        print(f"FAIL: {failures} failures")
        return 1
    print("ok: every text cut as the reference cuts it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
