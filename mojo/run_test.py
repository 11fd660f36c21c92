#!/usr/bin/env python3
"""Builds mojo/test.mojo with the `mojo` compiler and runs it against a freshly built libuform, with
UFORM_TEST_CHECKPOINT pointing at a tiny checkpoint written by `uform_tiny_checkpoint` (or at the one the
caller's UFORM_TEST_CHECKPOINT names) and UFORM_TEST_MEDIA at a folder of small inputs written here (PNG,
WAV, a Y4M clip, a file that is no image, a small sentence-transformers BERT folder). Exits 77 (skipped,
with the reason) where no compiler is at hand, and fails for it under CI=true."""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import wave
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reference"))
from interpreter import how_to_install, unavailable  # noqa: E402  (standard library only)


def write_png(path, width, height, seed):
    """An 8-bit RGB PNG (colour type 2) of a seeded gradient, written with zlib and the chunk CRCs."""
    rows = b"".join(b"\x00" + bytes(((x * 7 + y * 3 + seed) % 256, (x * 2 + seed * 5) % 256, (y * 9 + seed) % 256)
                                      [c] for x in range(width) for c in range(3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    open(path, "wb").write(png)


def write_wav(path, rate, seconds, hz):
    """A mono 16-bit PCM WAV of a sine (the standard `wave` module)."""
    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        count = int(rate * seconds)
        out.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * hz * i / rate)))
                                 for i in range(count)))


def write_y4m(path, width, height, frames):
    """A raw YUV4MPEG2 clip (4:2:0, 25 fps) of moving gradients: FFmpeg's yuv4mpegpipe demuxer."""
    with open(path, "wb") as out:
        out.write(f"YUV4MPEG2 W{width} H{height} F25:1 Ip A1:1 C420jpeg\n".encode())
        for f in range(frames):
            out.write(b"FRAME\n")
            out.write(bytes((x * 4 + y * 2 + f * 16) % 256 for y in range(height) for x in range(width)))
            out.write(bytes((128 + x * 3 + f * 8) % 256 for y in range(height // 2) for x in range(width // 2)))
            out.write(bytes((128 - y * 3 + f * 8) % 256 for y in range(height // 2) for x in range(width // 2)))


# A WordPiece tokenizer.json over a vocabulary of 16 (tests/model/test_pretrained.c's; test.mojo's WORDPIECE_JSON).
BERT_TOKENIZER = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True} for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])],
    "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
                   "lowercase": True},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
    "decoder": None,
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
              "vocab": {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "cat", "sits", "on", "the",
                                                            "mat", "##s", "kitten", "rug", "stock", "markets", "."])}},
}


def write_bert_folder(folder, hidden=64, heads=2, mlp=128, depth=2, positions=40):
    """A sentence-transformers BERT folder in small, as tests/model/test_pretrained.c writes it: config.json,
    model.safetensors (F32, seeded values), tokenizer.json, modules.json, mean pooling, Normalize."""
    vocab = len(BERT_TOKENIZER["model"]["vocab"])
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    os.makedirs(os.path.join(folder, "2_Normalize"), exist_ok=True)

    def write(name, value):
        with open(os.path.join(folder, name), "w") as out:
            json.dump(value, out)

    write("config.json", {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": hidden,
                          "num_hidden_layers": depth, "num_attention_heads": heads, "intermediate_size": mlp,
                          "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": positions,
                          "type_vocab_size": 2, "vocab_size": vocab, "pad_token_id": 0,
                          "position_embedding_type": "absolute"})
    write("tokenizer.json", BERT_TOKENIZER)
    write("modules.json", [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                           {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    write("1_Pooling/config.json", {"word_embedding_dimension": hidden, "pooling_mode_cls_token": False,
                                    "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                                    "pooling_mode_mean_sqrt_len_tokens": False})
    write("sentence_bert_config.json", {"max_seq_length": 12, "do_lower_case": False})
    tensors = []

    def tensor(name, shape, scale, offset):
        state = (len(tensors) + 1) * 2654435761 + 1 & 0xFFFFFFFF
        values = []
        for _ in range(math.prod(shape)):
            state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
            values.append(offset + scale * ((state >> 8) / float(1 << 24) * 2 - 1))
        tensors.append((name, shape, struct.pack(f"<{len(values)}f", *values)))

    tensor("embeddings.word_embeddings.weight", [vocab, hidden], 0.5, 0)
    tensor("embeddings.position_embeddings.weight", [positions, hidden], 0.5, 0)
    tensor("embeddings.token_type_embeddings.weight", [2, hidden], 0.5, 0)
    tensor("embeddings.LayerNorm.weight", [hidden], 0.1, 1)
    tensor("embeddings.LayerNorm.bias", [hidden], 0.1, 0)
    for i in range(depth):
        layer = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            tensor(layer + f"attention.self.{part}.weight", [hidden, hidden], 0.15, 0)
            tensor(layer + f"attention.self.{part}.bias", [hidden], 0.05, 0)
        tensor(layer + "attention.output.dense.weight", [hidden, hidden], 0.15, 0)
        tensor(layer + "attention.output.dense.bias", [hidden], 0.05, 0)
        tensor(layer + "attention.output.LayerNorm.weight", [hidden], 0.1, 1)
        tensor(layer + "attention.output.LayerNorm.bias", [hidden], 0.1, 0)
        tensor(layer + "intermediate.dense.weight", [mlp, hidden], 0.15, 0)
        tensor(layer + "intermediate.dense.bias", [mlp], 0.05, 0)
        tensor(layer + "output.dense.weight", [hidden, mlp], 0.1, 0)
        tensor(layer + "output.dense.bias", [hidden], 0.05, 0)
        tensor(layer + "output.LayerNorm.weight", [hidden], 0.1, 1)
        tensor(layer + "output.LayerNorm.bias", [hidden], 0.1, 0)
    # safetensors: a little-endian u64 header length, the JSON header (padded to 8 bytes), the data.
    header, begin = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + len(data)]}
        begin += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + b"".join(data for _, _, data in tensors))


def write_media(directory):
    """The model checks' inputs, beside the checkpoint: two PNGs, a file that is no image, a WAV, a clip."""
    write_png(os.path.join(directory, "a.png"), 40, 24, 1)
    write_png(os.path.join(directory, "b.png"), 24, 36, 2)
    open(os.path.join(directory, "not_an_image.png"), "wb").write(b"this is not an image at all\n")
    write_wav(os.path.join(directory, "tone.wav"), 16000, 1.0, 440.0)
    write_y4m(os.path.join(directory, "clip.y4m"), 32, 32, 8)
    write_bert_folder(os.path.join(directory, "bert"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mojo", default="")
    parser.add_argument("--library", required=True)
    parser.add_argument("--tiny-checkpoint-tool", required=True)
    parser.add_argument("--source-root", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    if not args.mojo or not shutil.which(args.mojo):
        unavailable(f"mojo: the mojo compiler is not found ({how_to_install(['mojo'])})")
    os.makedirs(args.workdir, exist_ok=True)
    # A checkpoint the caller names (UFORM_TEST_CHECKPOINT=<path> pixi run test) is used as it is.
    checkpoint = os.environ.get("UFORM_TEST_CHECKPOINT") or os.path.join(args.workdir, "tiny.safetensors")
    if not os.environ.get("UFORM_TEST_CHECKPOINT"):
        subprocess.run([args.tiny_checkpoint_tool, checkpoint], check=True)
    write_media(args.workdir)
    program = os.path.join(args.workdir, "test_mojo")
    # `mojo build`, not `mojo run`: a linked program, as users ship it.
    subprocess.run([args.mojo, "build", "-I", os.path.join(args.source_root, "mojo"),
                    os.path.join(args.source_root, "mojo", "test.mojo"), "-o", program], check=True)
    env = dict(os.environ, UFORM_LIBRARY=os.path.abspath(args.library), UFORM_TEST_CHECKPOINT=os.path.abspath(checkpoint),
               UFORM_TEST_MEDIA=os.path.abspath(args.workdir))
    return subprocess.run([program], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
