#!/usr/bin/env python3
"""The expected ids of the SentencePiece model fixture (xlm-roberta-unigram/spiece.model) read by
transformers' slow tokenizers, for checking the command's spiece.model path later:

    spiece_expected.py --workdir build/tests/tokenizer/tokenizer-reference

writes, beside the model, xlm-roberta-slow.jsonl (XLMRobertaTokenizer: <s> $A </s>, ids shifted as
fairseq's) and siglip-slow.jsonl (SiglipTokenizer: lowercased, punctuation removed, </s> appended), one
line per text in compare.py's format without spans: {"index": i, "ids": [...]}. The texts are the
corpus's lines, then corpus.edge_cases in order (index len(corpus) onwards). The corpus and fixtures
are built first as compare.py builds them. Some 70 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reference"))
sys.path.insert(0, str(HERE))

from interpreter import run_under_python_with  # noqa: E402  (standard library only)

BATCH = 4096


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="compare.py's workdir")
    args = parser.parse_args()
    run_under_python_with(["numpy", "tokenizers", "transformers", "sentencepiece", "google.protobuf"])
    import compare

    corpus, lines, files = compare.prepare(args.workdir)
    texts = lines + [text for _, text in corpus.edge_cases(lines)]
    model = files["xlm-roberta-unigram"].parent / "spiece.model"
    warnings.filterwarnings("ignore")
    from transformers import SiglipTokenizer, XLMRobertaTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()  # SigLIP's "longer than the maximum sequence length" notes
    for name, tokenizer in (("xlm-roberta-slow", XLMRobertaTokenizer(vocab_file=str(model))),
                            ("siglip-slow", SiglipTokenizer(vocab_file=str(model)))):
        path = model.parent / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as out:
            for start in range(0, len(texts), BATCH):
                batch = tokenizer(texts[start:start + BATCH])["input_ids"]
                for k, ids in enumerate(batch):
                    out.write(f'{{"index": {start + k}, "ids": {json.dumps(ids)}}}\n')
        print(f"{path}: {len(texts)} texts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
