#!/usr/bin/env python3
"""Exports the reference text tower (uform_reference.py) to ONNX, for bench/bench_text.py.

    python3 tests/reference/export_onnx.py CHECKPOINT OUT.onnx [--bf16] [--check]

The graph takes a batch of right-padded byte ids and answers the embeddings:

    ids   int64 [batch, length]  BOS (256) first, then the kept bytes, then any padding byte
    last  int64 [batch]          index of each item's last kept position (its byte count, BOS excluded)
    ->    embeddings  [batch, dims], L2-normalized, float32 (or bfloat16 with --bf16)

Both axes are dynamic; `length` may not exceed `context + 1`. Attention is causal, so padding after
an item's last byte never reaches the kept positions and no attention mask is needed.
`make_batch(texts, context)` builds `ids` and `last` from bytes. Exported with torch.onnx.export,
opset 17. With --check, ONNX Runtime (if installed) runs the file and is compared to PyTorch.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import uform_reference as ref  # noqa: E402

OPSET = 17


class TextEmbedder(torch.nn.Module):
    """(ids [B, T], last [B]) -> embeddings [B, dims] of a TextTower."""

    def __init__(self, tower: ref.TextTower):
        super().__init__()
        self.tower = tower

    def forward(self, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        states = self.tower(ids)  # [B, T, hidden]
        index = last.reshape(-1, 1, 1).expand(-1, 1, states.shape[-1])  # [B, 1, hidden]
        return self.tower.embed_states(states.gather(1, index).squeeze(1))  # [B, dims]


def make_batch(texts, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids [B, T] (BOS first, bytes past `context` dropped) and last indices [B]."""
    kept = [bytes(t)[:context] for t in texts]
    length = 1 + max((len(t) for t in kept), default=0)
    ids = np.zeros((len(kept), length), dtype=np.int64)
    ids[:, 0] = ref.BOS
    for i, t in enumerate(kept):
        ids[i, 1 : 1 + len(t)] = np.frombuffer(t, dtype=np.uint8)
    return ids, np.array([len(t) for t in kept], dtype=np.int64)


def export(checkpoint: str, output: str, dtype: torch.dtype = torch.float32) -> TextEmbedder:
    """Writes the ONNX file and answers the module that was exported."""
    model = ref.Reference(checkpoint)
    if model.text is None:
        raise ValueError(f"{checkpoint}: no text tower")
    embedder = TextEmbedder(model.text.to(dtype)).eval()
    ids, last = make_batch([b"an example", b"of two texts"], model.text.context)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shape-inference chatter of torch.onnx in PyTorch 1.13
        torch.onnx.export(
            embedder,
            (torch.from_numpy(ids), torch.from_numpy(last)),
            output,
            input_names=["ids", "last"],
            output_names=["embeddings"],
            dynamic_axes={"ids": {0: "batch", 1: "length"}, "last": {0: "batch"}, "embeddings": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
        )
    return embedder


def check(embedder: TextEmbedder, output: str, threads: int = 1) -> float:
    """Runs the file in ONNX Runtime on a few texts; answers the max abs difference from PyTorch."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(output, options, providers=["CPUExecutionProvider"])
    texts = [b"", b"a", b"hello world", bytes(range(200))]
    ids, last = make_batch(texts, embedder.tower.context)
    (got,) = session.run(None, {"ids": ids, "last": last})
    with torch.no_grad():
        want = embedder(torch.from_numpy(ids), torch.from_numpy(last)).float().numpy()
    return float(np.abs(got.astype(np.float32) - want).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--bf16", action="store_true", help="weights and activations in bfloat16")
    parser.add_argument("--check", action="store_true", help="run the file in ONNX Runtime and compare")
    args = parser.parse_args(argv)
    embedder = export(args.checkpoint, args.output, torch.bfloat16 if args.bf16 else torch.float32)
    print(f"wrote {args.output} (opset {OPSET}, {'bfloat16' if args.bf16 else 'float32'})")
    if args.check:
        try:
            difference = check(embedder, args.output)
        except ImportError:
            print("onnxruntime not installed: not checked")
            return 0
        print(f"ONNX Runtime vs PyTorch: max abs {difference:.2e}")
        return 0 if difference < 1e-4 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
