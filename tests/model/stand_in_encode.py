#!/usr/bin/env python3
"""A stand-in for `uform encode` on sentence-transformers folders, made of sentence-transformers itself: the
checks of this folder run on it to check themselves (test_pretrained_reference.py --self-check).

    stand_in_encode.py encode --model FOLDER --manifest FILE [--format jsonl] [--prompt-name NAME]
                       [--prompt TEXT] [--threads N]

It prints {"index": i, "embedding": [...]} per item of the manifest, as the command does. With
UFORM_STAND_IN_VARIANT set to one of VARIANTS it embeds as an engine with that fault, or that rounding,
would; a folder it cannot load ends it with exit status 1 and one line on stderr, as the command's faults do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The faults an engine could have, and the roundings of a BF16 engine, each as sentence-transformers made to
# have it.
VARIANTS = {
    "truncation-of-tokenizer-json": "texts cut at tokenizer.json's own truncation (128) rather than max_seq_length",
    "mean-without-special-tokens": "mean pooling over the text's tokens only, [CLS] and [SEP] left out",
    "no-token-type": "BERT's token_type_embeddings[0] not added",
    "positions-from-zero": "XLM-R's positions counted from 0 rather than from padding id + 1",
    "no-strip": "texts tokenized without Python's str.strip() first",
    "no-default-prompt": "config_sentence_transformers.json's default_prompt_name ignored",
    "normalized-always": "every embedding made unit-norm, Normalize module or not",
    "erf-gelu": "GELU computed exactly (erf) where hidden_act asks for the tanh approximation",
    "layer-norm-eps-1e-5": "LayerNorm with eps 1e-5 rather than config.json's 1e-12",
    "bf16-matmul-inputs": "every linear layer's input rounded to BF16, the rest in F32 (a BF16 GEMM's rounding)",
    "bfloat16": "the transformer in bfloat16 (torch.bfloat16), its pooling and normalization in float32",
}


def with_variant(model, variant: str) -> None:
    """Makes sentence-transformers' `model` embed as an engine with `variant` would."""
    import torch
    from sentence_transformers import models

    transformer, pooling = model[0], model[1]
    bert = transformer.auto_model
    if variant == "truncation-of-tokenizer-json":
        truncation = transformer.tokenizer.backend_tokenizer.truncation
        model.max_seq_length = truncation["max_length"] if truncation else model.max_seq_length
    elif variant == "mean-without-special-tokens":
        forward = pooling.forward

        def without_specials(features):
            mask = features["attention_mask"].clone()
            mask[:, 0] = 0
            mask[torch.arange(len(mask)), features["attention_mask"].sum(1) - 1] = 0
            return forward({**features, "attention_mask": mask})

        pooling.forward = without_specials
    elif variant == "no-token-type":
        with torch.no_grad():
            bert.embeddings.token_type_embeddings.weight.zero_()
    elif variant == "positions-from-zero":
        bert.embeddings.padding_idx = -1  # positions = cumsum(ids != -1) - 1: 0, 1, 2, ...
    elif variant == "no-strip":
        def unstripped(texts, padding=True):
            return transformer.tokenizer(texts, padding=padding, truncation="longest_first", return_tensors="pt",
                                         max_length=transformer.max_seq_length)

        transformer.tokenize = unstripped
    elif variant == "no-default-prompt":
        model.default_prompt_name = None
    elif variant == "normalized-always":
        if not any(isinstance(module, models.Normalize) for module in model):
            model.append(models.Normalize())
    elif variant == "erf-gelu":
        for layer in bert.encoder.layer:
            layer.intermediate.intermediate_act_fn = torch.nn.GELU()
    elif variant == "layer-norm-eps-1e-5":
        for module in bert.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = 1e-5
    elif variant == "bf16-matmul-inputs":
        for module in bert.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(lambda _, inputs: (inputs[0].to(torch.bfloat16).float(),))
    elif variant == "bfloat16":
        transformer.to(torch.bfloat16)
        forward = pooling.forward
        pooling.forward = lambda features: forward({**features,
                                                    "token_embeddings": features["token_embeddings"].float()})
    else:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def main() -> int:
    if sys.argv[1:2] != ["encode"]:
        print("usage: stand_in_encode.py encode --model FOLDER --manifest FILE ...", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="stand_in_encode.py encode",
                                     description="Embeds the texts of a manifest as `uform encode` would.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--format", default="jsonl", choices=["jsonl"])
    parser.add_argument("--prompt-name", help="a prompt of config_sentence_transformers.json, by its name")
    parser.add_argument("--prompt", help="a text put before every text")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(sys.argv[2:])
    import pretrained_folders
    import pretrained_support

    pretrained_folders.quiet_libraries()
    try:
        model = pretrained_support.reference_model(Path(args.model))
    except (OSError, ValueError) as error:
        print(f"uform: {args.model}: {error}".splitlines()[0], file=sys.stderr)
        return 1
    variant = os.environ.get("UFORM_STAND_IN_VARIANT", "")
    if variant:
        with_variant(model, variant)
    with open(args.manifest, encoding="utf-8") as file:
        texts = [json.loads(line)["text"] for line in file if line.strip()]
    vectors = pretrained_support.reference_embeddings(model, texts, prompt_name=args.prompt_name, prompt=args.prompt)
    out = sys.stdout
    for index, vector in enumerate(vectors.astype("float32").tolist()):
        out.write(json.dumps({"index": index, "embedding": vector}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
