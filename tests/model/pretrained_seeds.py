#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_pretrained.c: small folders of every family (BERT: a sentence-transformers
one with mean pooling and Normalize, one with its weights in two shards and prompts, one without modules, one of
RoBERTa's positions with cls pooling, one with a Dense module; a DistilBERT; an MPNet; CLIP; SigLIP, with a WordPiece tokenizer.json and with a SentencePiece
model and its tokenizer_config.json; UForm 3), the others each with a small WordPiece tokenizer.json, packed as the target reads its input: per file, its index in the target's FILES (1 byte), its length (2 bytes, little-endian)
and its bytes. Run once by hand: python3 tests/model/pretrained_seeds.py tests/fuzz-corpus/pretrained"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

FILES = ["config.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "tokenizer.json",
         "model.safetensors", "text_encoder.safetensors", "image_encoder.safetensors", "preprocessor_config.json",
         "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
         "config_sentence_transformers.json", "spiece.model", "tokenizer_config.json", "2_Dense/config.json",
         "2_Dense/model.safetensors"]
HIDDEN, HEADS, MLP, DEPTH, POSITIONS = 8, 2, 16, 1, 16
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "cat", "sits", "on", "the", "mat", "##s", ".", "<s>", "</s>"]


def safetensors(tensors: dict) -> bytes:
    """The safetensors container of F32 arrays, in the order given."""
    header, data = {}, b""
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def bert_weights(seed: int, prefix: str = "") -> bytes:
    return safetensors(bert_tensors(seed, prefix))


def renamed_without_token_types(seed: int, renames: list) -> dict:
    """bert_tensors' values without the token types, each name with the `renames` (old, new) applied in order."""
    tensors = {}
    for name, value in bert_tensors(seed).items():
        if "token_type" in name:
            continue
        for old, new in renames:
            name = name.replace(old, new)
        tensors[name] = value
    return tensors


def distilbert_weights(seed: int) -> bytes:
    """bert_tensors' values under DistilBertModel's names, without the token types."""
    return safetensors(renamed_without_token_types(seed, [
        ("encoder.layer.", "transformer.layer."), ("attention.self.query", "attention.q_lin"),
        ("attention.self.key", "attention.k_lin"), ("attention.self.value", "attention.v_lin"),
        ("attention.output.dense", "attention.out_lin"), ("attention.output.LayerNorm", "sa_layer_norm"),
        ("intermediate.dense", "ffn.lin1"), ("output.dense", "ffn.lin2"), ("output.LayerNorm", "output_layer_norm")]))


def mpnet_weights(seed: int) -> bytes:
    """bert_tensors' values under MPNetModel's names, without the token types, with the bias by relative
    position [32, heads]."""
    tensors = renamed_without_token_types(seed, [
        ("attention.self.query", "attention.attn.q"), ("attention.self.key", "attention.attn.k"),
        ("attention.self.value", "attention.attn.v"), ("attention.output.dense", "attention.attn.o"),
        ("attention.output.LayerNorm", "attention.LayerNorm")])
    tensors["encoder.relative_attention_bias.weight"] = np.random.default_rng(seed).normal(0, 1, (32, HEADS))
    return safetensors(tensors)


def bert_sharded(seed: int) -> dict:
    """bert_weights' tensors in two shards and their index, as transformers shards a large model."""
    tensors = bert_tensors(seed)
    names = list(tensors)
    shards = [names[:len(names) // 2], names[len(names) // 2:]]
    files = {}
    weight_map = {}
    for i, part in enumerate(shards):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        files[file] = safetensors({name: tensors[name] for name in part})
        weight_map.update({name: file for name in part})
    files["model.safetensors.index.json"] = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    return files


def spiece_model() -> bytes:
    """A SentencePiece Unigram of 12 pieces over the letters a, b and c, without a normalization table."""
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["a ab abc cab", "ba cab bac", "abc abc a b c"] * 20), model_writer=model,
        vocab_size=12, model_type="unigram", character_coverage=1.0, minloglevel=2, hard_vocab_limit=False,
        normalization_rule_name="identity")
    return model.getvalue()


def bert_tensors(seed: int, prefix: str = "") -> dict:
    rng = np.random.default_rng(seed)
    tensors = {
        "embeddings.word_embeddings.weight": rng.normal(0, 0.5, (len(VOCAB), HIDDEN)),
        "embeddings.position_embeddings.weight": rng.normal(0, 0.5, (POSITIONS, HIDDEN)),
        "embeddings.token_type_embeddings.weight": rng.normal(0, 0.5, (2, HIDDEN)),
        "embeddings.LayerNorm.weight": 1 + rng.normal(0, 0.1, HIDDEN),
        "embeddings.LayerNorm.bias": rng.normal(0, 0.1, HIDDEN),
    }
    for i in range(DEPTH):
        layer = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            tensors[f"{layer}attention.self.{part}.weight"] = rng.normal(0, 0.2, (HIDDEN, HIDDEN))
            tensors[f"{layer}attention.self.{part}.bias"] = rng.normal(0, 0.05, HIDDEN)
        tensors[f"{layer}attention.output.dense.weight"] = rng.normal(0, 0.2, (HIDDEN, HIDDEN))
        tensors[f"{layer}attention.output.dense.bias"] = rng.normal(0, 0.05, HIDDEN)
        tensors[f"{layer}intermediate.dense.weight"] = rng.normal(0, 0.2, (MLP, HIDDEN))
        tensors[f"{layer}intermediate.dense.bias"] = rng.normal(0, 0.05, MLP)
        tensors[f"{layer}output.dense.weight"] = rng.normal(0, 0.2, (HIDDEN, MLP))
        tensors[f"{layer}output.dense.bias"] = rng.normal(0, 0.05, HIDDEN)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[f"{layer}{norm}.weight"] = 1 + rng.normal(0, 0.1, HIDDEN)
            tensors[f"{layer}{norm}.bias"] = rng.normal(0, 0.1, HIDDEN)
    return {prefix + name: value for name, value in tensors.items()}


def block(rng, tensors: dict, layer: str, names: dict, hidden: int, mlp: int) -> None:
    """One pre-norm block's tensors under a family's names."""
    for part in ("q", "k", "v", "out"):
        tensors[f"{layer}{names[part]}.weight"] = rng.normal(0, 0.2, (hidden, hidden))
        tensors[f"{layer}{names[part]}.bias"] = rng.normal(0, 0.05, hidden)
    tensors[f"{layer}{names['up']}.weight"] = rng.normal(0, 0.2, (mlp, hidden))
    tensors[f"{layer}{names['up']}.bias"] = rng.normal(0, 0.05, mlp)
    tensors[f"{layer}{names['down']}.weight"] = rng.normal(0, 0.2, (hidden, mlp))
    tensors[f"{layer}{names['down']}.bias"] = rng.normal(0, 0.05, hidden)
    for norm in ("norm1", "norm2"):
        tensors[f"{layer}{names[norm]}.weight"] = 1 + rng.normal(0, 0.1, hidden)
        tensors[f"{layer}{names[norm]}.bias"] = rng.normal(0, 0.1, hidden)


CLIP_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "out": "self_attn.out_proj",
              "up": "mlp.fc1", "down": "mlp.fc2", "norm1": "layer_norm1", "norm2": "layer_norm2"}
IMAGE, PATCH = 8, 4  # 2 x 2 patches


def clip_weights(seed: int, siglip: bool) -> bytes:
    rng = np.random.default_rng(seed)
    t = {"text_model.embeddings.token_embedding.weight": rng.normal(0, 0.5, (len(VOCAB), HIDDEN)),
         "text_model.embeddings.position_embedding.weight": rng.normal(0, 0.5, (POSITIONS, HIDDEN)),
         "text_model.final_layer_norm.weight": 1 + rng.normal(0, 0.1, HIDDEN),
         "text_model.final_layer_norm.bias": rng.normal(0, 0.1, HIDDEN),
         "vision_model.embeddings.patch_embedding.weight": rng.normal(0, 0.2, (HIDDEN, 3, PATCH, PATCH)),
         "vision_model.embeddings.position_embedding.weight":
             rng.normal(0, 0.5, ((IMAGE // PATCH) ** 2 + (0 if siglip else 1), HIDDEN)),
         "vision_model.post_layernorm.weight": 1 + rng.normal(0, 0.1, HIDDEN),
         "vision_model.post_layernorm.bias": rng.normal(0, 0.1, HIDDEN)}
    for tower in ("text_model", "vision_model"):
        for i in range(DEPTH):
            block(rng, t, f"{tower}.encoder.layers.{i}.", CLIP_NAMES, HIDDEN, MLP)
    if siglip:
        t["text_model.head.weight"] = rng.normal(0, 0.2, (HIDDEN, HIDDEN))
        t["text_model.head.bias"] = rng.normal(0, 0.05, HIDDEN)
        t["vision_model.embeddings.patch_embedding.bias"] = rng.normal(0, 0.05, HIDDEN)
        t["vision_model.head.probe"] = rng.normal(0, 0.5, (1, 1, HIDDEN))
        t["vision_model.head.attention.in_proj_weight"] = rng.normal(0, 0.2, (3 * HIDDEN, HIDDEN))
        t["vision_model.head.attention.in_proj_bias"] = rng.normal(0, 0.05, 3 * HIDDEN)
        for name, shape in (("attention.out_proj", (HIDDEN, HIDDEN)), ("mlp.fc1", (MLP, HIDDEN)),
                            ("mlp.fc2", (HIDDEN, MLP))):
            t[f"vision_model.head.{name}.weight"] = rng.normal(0, 0.2, shape)
            t[f"vision_model.head.{name}.bias"] = rng.normal(0, 0.05, shape[0])
        t["vision_model.head.layernorm.weight"] = 1 + rng.normal(0, 0.1, HIDDEN)
        t["vision_model.head.layernorm.bias"] = rng.normal(0, 0.1, HIDDEN)
    else:
        t["text_projection.weight"] = rng.normal(0, 0.2, (HIDDEN, HIDDEN))
        t["visual_projection.weight"] = rng.normal(0, 0.2, (HIDDEN, HIDDEN))
        t["vision_model.embeddings.class_embedding"] = rng.normal(0, 0.5, HIDDEN)
        t["vision_model.pre_layrnorm.weight"] = 1 + rng.normal(0, 0.1, HIDDEN)
        t["vision_model.pre_layrnorm.bias"] = rng.normal(0, 0.1, HIDDEN)
    return safetensors(t)


def clip_config(model_type: str) -> dict:
    sizes = {"hidden_size": HIDDEN, "intermediate_size": MLP, "num_hidden_layers": DEPTH, "num_attention_heads": HEADS}
    text = dict(sizes, vocab_size=len(VOCAB), max_position_embeddings=POSITIONS, eos_token_id=len(VOCAB) - 1,
                pad_token_id=0)
    return {"model_type": model_type, "projection_dim": HIDDEN, "text_config": text,
            "vision_config": dict(sizes, image_size=IMAGE, patch_size=PATCH)}


U3_NAMES = {"q": "attn.query", "k": "attn.key", "v": "attn.value", "out": "attn.out", "up": "mlp.hidden_layer",
            "down": "mlp.output_layer", "norm1": "norm1", "norm2": "norm2"}


def uform3_weights(seed: int, registers: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    text = {"word_embeddings.weight": rng.normal(0, 0.5, (len(VOCAB), HIDDEN)),
            "position_embeddings.weight": rng.normal(0, 0.5, (POSITIONS, HIDDEN)),
            "layer_norm.weight": 1 + rng.normal(0, 0.1, HIDDEN), "layer_norm.bias": rng.normal(0, 0.1, HIDDEN),
            "embedding_projection.weight": rng.normal(0, 0.2, (HIDDEN, HIDDEN))}
    names = dict(U3_NAMES, q="attention.query", k="attention.key", v="attention.value", out="attention.out",
                 norm1="norm_attn", norm2="norm_mlp")
    for i in range(2):  # block 1 is multimodal, skipped
        block(rng, text, f"blocks.{i}.", names, HIDDEN, 4 * HIDDEN)
    image = {"patch_embed.weight": rng.normal(0, 0.2, (HIDDEN, 3, PATCH, PATCH)),
             "patch_embed.bias": rng.normal(0, 0.05, HIDDEN),
             "pos_embed": rng.normal(0, 0.5, (1, (IMAGE // PATCH) ** 2, HIDDEN)),
             "cls_token": rng.normal(0, 0.5, (1, 1, HIDDEN)),
             **({"reg_token": rng.normal(0, 0.5, (1, registers, HIDDEN))} if registers else {}),
             "norm.weight": 1 + rng.normal(0, 0.1, HIDDEN), "norm.bias": rng.normal(0, 0.1, HIDDEN),
             "embedding_projection.weight": rng.normal(0, 0.2, (HIDDEN, HIDDEN))}
    for i in range(DEPTH):
        block(rng, image, f"blocks.{i}.", U3_NAMES, HIDDEN, 4 * HIDDEN)
        image[f"blocks.{i}.ls1.gamma"] = rng.normal(0, 0.5, HIDDEN)
        image[f"blocks.{i}.ls2.gamma"] = rng.normal(0, 0.5, HIDDEN)
    return safetensors(text), safetensors(image)


def uform3_config(registers: int = 0) -> dict:
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    return {"text_encoder": {"model_type": "bert", "dim": HIDDEN, "context_dim": HIDDEN, "vocab_size": len(VOCAB),
                             "padding_idx": 0, "num_layers": 2, "num_heads": HEADS, "embedding_dim": HIDDEN,
                             "multimodal_layers_ids": [1], "head_one_neuron": False, "pooling": "mean",
                             "max_position_embeddings": POSITIONS},
            "image_encoder": {"dim": HIDDEN, "patch_size": PATCH, "image_size": IMAGE, "num_layers": DEPTH,
                              "num_heads": HEADS, "embedding_dim": HIDDEN, "pooling": "cls",
                              "normalization_means": mean, "normalization_deviations": std,
                              **({"num_reg_tokens": registers} if registers else {})}}


def config(model_type: str, pad: int) -> dict:
    return {"architectures": ["BertModel"], "model_type": model_type, "hidden_size": HIDDEN,
            "num_hidden_layers": DEPTH, "num_attention_heads": HEADS, "intermediate_size": MLP,
            "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": POSITIONS,
            "type_vocab_size": 2, "vocab_size": len(VOCAB), "pad_token_id": pad}


def tokenizer(processor: dict) -> dict:
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for i, t in enumerate(VOCAB) if t.startswith(("[", "<"))]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": processor, "decoder": None,
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(VOCAB)}}}


def pack(files: dict) -> bytes:
    out = b""
    for name, content in files.items():
        raw = content if isinstance(content, bytes) else json.dumps(content, separators=(",", ":")).encode()
        assert len(raw) < 65536, name
        out += bytes([FILES.index(name)]) + struct.pack("<H", len(raw)) + raw
    return out


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz-corpus/pretrained")
    out.mkdir(parents=True, exist_ok=True)
    bert = {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}
    roberta = {"type": "RobertaProcessing", "sep": ["</s>", 13], "cls": ["<s>", 12], "trim_offsets": True,
               "add_prefix_space": False}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    seeds = {
        "sentence-transformers-mean.bin": {
            "config.json": config("bert", 0), "modules.json": modules,
            "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
            "sentence_bert_config.json": {"max_seq_length": 8}, "tokenizer.json": tokenizer(bert),
            "model.safetensors": bert_weights(1)},
        "bert-without-modules.bin": {
            "config.json": config("bert", 0), "tokenizer.json": tokenizer(bert),
            "model.safetensors": bert_weights(2, "bert.")},
        "sentence-transformers-sharded-prompts.bin": {
            "config.json": config("bert", 0), "modules.json": modules,
            "1_Pooling/config.json": {"pooling_mode_mean_tokens": True}, "tokenizer.json": tokenizer(bert),
            "config_sentence_transformers.json": {"prompts": {"query": "query: ", "passage": "passage: "},
                                                  "default_prompt_name": "query"},
            **bert_sharded(8)},
        "distilbert.bin": {
            "config.json": {"model_type": "distilbert", "dim": HIDDEN, "n_layers": DEPTH, "n_heads": HEADS,
                            "hidden_dim": MLP, "vocab_size": len(VOCAB), "max_position_embeddings": POSITIONS,
                            "activation": "gelu", "pad_token_id": 0, "sinusoidal_pos_embds": False},
            "modules.json": modules, "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
            "tokenizer.json": tokenizer(bert), "model.safetensors": distilbert_weights(10)},
        "sentence-transformers-dense.bin": {
            "config.json": config("bert", 0),
            "modules.json": modules[:2] + [{"idx": 2, "name": "2", "path": "2_Dense",
                                            "type": "sentence_transformers.models.Dense"}],
            "1_Pooling/config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
            "2_Dense/config.json": {"in_features": HIDDEN, "out_features": 4, "bias": True,
                                    "activation_function": "torch.nn.modules.activation.Tanh"},
            "2_Dense/model.safetensors": safetensors({"linear.weight": np.random.default_rng(12).normal(0, 0.3, (4, HIDDEN)),
                                                      "linear.bias": np.random.default_rng(13).normal(0, 0.1, 4)}),
            "tokenizer.json": tokenizer(bert), "model.safetensors": bert_weights(12)},
        "mpnet.bin": {
            "config.json": {"model_type": "mpnet", "hidden_size": HIDDEN, "num_hidden_layers": DEPTH,
                            "num_attention_heads": HEADS, "intermediate_size": MLP, "vocab_size": len(VOCAB),
                            "max_position_embeddings": POSITIONS, "hidden_act": "gelu", "pad_token_id": 1,
                            "relative_attention_num_buckets": 32, "layer_norm_eps": 1e-5},
            "modules.json": modules, "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
            "tokenizer.json": tokenizer(bert), "model.safetensors": mpnet_weights(11)},
        "roberta-cls.bin": {
            "config.json": config("roberta", 1), "modules.json": modules[:2],
            "1_Pooling/config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "tokenizer.json": tokenizer(roberta),
            "model.safetensors": bert_weights(3)},
    }
    u3_text, u3_image = uform3_weights(6)
    _, u3_registers = uform3_weights(7, registers=2)
    seeds.update({
        "clip.bin": {"config.json": clip_config("clip"), "tokenizer.json": tokenizer(bert),
                     "model.safetensors": clip_weights(4, False),
                     "preprocessor_config.json": {"crop_size": IMAGE, "image_mean": [0.5, 0.5, 0.5],
                                                  "image_std": [0.25, 0.25, 0.25]}},
        "siglip.bin": {"config.json": clip_config("siglip"), "tokenizer.json": tokenizer(bert),
                       "model.safetensors": clip_weights(5, True)},
        "siglip-spiece.bin": {"config.json": clip_config("siglip"), "spiece.model": spiece_model(),
                              "tokenizer_config.json": {"tokenizer_class": "SiglipTokenizer", "eos_token": "</s>",
                                                        "pad_token": "</s>", "unk_token": "<unk>",
                                                        "model_max_length": 64},
                              "model.safetensors": clip_weights(9, True)},
        "uform3.bin": {"config.json": uform3_config(), "tokenizer.json": tokenizer(bert),
                       "text_encoder.safetensors": u3_text, "image_encoder.safetensors": u3_image},
        "uform3-registers.bin": {"config.json": uform3_config(registers=2), "tokenizer.json": tokenizer(bert),
                                 "text_encoder.safetensors": u3_text, "image_encoder.safetensors": u3_registers},
    })
    for name, files in seeds.items():
        (out / name).write_bytes(pack(files))
        print(out / name, (out / name).stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
