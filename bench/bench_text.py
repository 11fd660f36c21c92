#!/usr/bin/env python3
"""Texts per second of the C engine with BF16 and with I8 weights beside PyTorch and ONNX Runtime (float32 and
dynamically quantized int8), and its BF16 and I8 GEMMs beside PyTorch and the machine's peaks.

    python3 bench/bench_text.py --build build [--threads 2] [--texts 256] [--batch 64]

On one base-sized checkpoint written by the tiny checkpoint tool (depth 12, hidden 768, mlp 3072,
seed 3), with the same weights and the same number of threads everywhere, on seeded random texts of
64 to 256 printable bytes (cut to the model's `context`, as every engine does):
  (a) the C engine through ctypes: a RAM executor of `--threads` threads, embeddings, F32 output, the
      model loaded with BF16 weights and again with I8 weights (uform_weights_t: the blocks' linear layers
      quantized per output row as they load, activations per row as they run), their passes taken in turns
      and the best pass of each kept, so that other work on a shared machine moves both alike;
  (b) PyTorch eager, the independent reference (tests/reference/uform_reference.py) in bfloat16
      (and float32 with --torch-f32: Debian's PyTorch does float32 GEMMs through libblas.so.3, the reference
      BLAS at about 4 GFLOP/s unless libopenblas0 is installed, while its bfloat16 goes through oneDNN),
      torch.set_num_threads(threads) and as many OpenBLAS threads;
  (c) ONNX Runtime (pip package onnxruntime) on the reference exported to ONNX (opset 17) in
      float32, intra_op_num_threads = threads; bfloat16 is attempted and its failure reported;
  (d) ONNX Runtime on that model quantized by onnxruntime.quantization.quantize_dynamic (pip package onnx
      too): int8 weights, uint8 activations quantized per tensor as it runs, its defaults.
Every engine gets the same batches, one warm-up batch first, then whole passes over the texts
until --min-seconds have passed (at least one pass). Then BF16 GEMM: `<build>/bench/bench_gemm --json` beside
torch.matmul in bfloat16 at the same shapes (m = 512) and threads, with both as a share of the
peak bench_gemm measures; and the engine's I8 GEMM at those shapes as a share of the `vpdpbusd` peak.

It prints figures and ratios and never fails on time: a missing piece (onnxruntime, bench_gemm,
a verb that answers UNSUPPORTED) is printed as such and the rest still runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import bench_common as common
from bench_common import figure, ratio

if __name__ == "__main__":
    common.python_with(["torch", "numpy"])
import numpy as np  # noqa: E402
import torch  # noqa: E402

import export_onnx  # noqa: E402
import harness  # noqa: E402  (the ctypes mirror of uform.h)
import uform_reference as ref  # noqa: E402

GEMM_SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]  # (n, k): qkv, out, up, down of the base model
GEMM_M = 512


def make_texts(count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(32, 127, size=int(rng.integers(64, 257)), dtype=np.uint8).tobytes() for _ in range(count)]


def write_checkpoint(tool: str, path: Path, depth: int, hidden: int, mlp: int, context: int, seed: int) -> str:
    """The base checkpoint, written by the tool. Answers the command, as a note."""
    flags = ["--depth", str(depth), "--hidden", str(hidden), "--mlp", str(mlp), "--context", str(context),
             "--seed", str(seed)]
    subprocess.run([tool, str(path), *flags], check=True, capture_output=True)
    return f"{Path(tool).name} {' '.join(flags)}"


# ------------------------------------------------------------------------------------------------
# The engines
# ------------------------------------------------------------------------------------------------


def bench_uform(library: str, checkpoint: Path, texts: list, batch: int, threads: int, min_seconds: float):
    """The model loaded with BF16 and with I8 weights on one executor, their passes over the texts taken in
    turns, the best of each (common.interleaved_best). Answers {weights: (texts per second or None, a note,
    the embeddings of the first batch or None)}."""
    try:
        engine = harness.Engine(library)
    except OSError as error:
        return {w: (None, f"cannot load {library}: {error}", None) for w in ("bf16", "i8")}
    executor = arena = None
    models = {}
    try:
        executor = engine.ram_executor(threads)
        arena = engine.arena(executor)
        for weights in ("bf16", "i8"):
            models[weights] = engine.load(str(checkpoint), executor, weights)
        groups = common.groups(texts, batch)

        def encode(model, group):
            return engine.encode(model, group, harness.OUTPUT_EMBEDDINGS, arena, executor)["embeddings"]["values"]

        firsts = {w: encode(m, groups[0]) for w, m in models.items()}  # the warm-up
        best = common.interleaved_best({w: (lambda m=m: [encode(m, g) for g in groups]) for w, m in models.items()},
                                       min_seconds)
        return {w: (len(texts) / best[w], "", firsts[w]) for w in models}
    except harness.EngineError as error:
        return {w: (None, str(error), None) for w in ("bf16", "i8")}
    finally:
        for model in models.values():
            engine.library.uform_model_free(model)
        if arena:
            engine.library.uform_arena_free(arena)
        if executor:
            engine.library.uform_executor_free(executor)


def bench_torch(checkpoint: Path, texts: list, batch: int, threads: int, min_seconds: float, dtype):
    common.torch_threads(threads)
    model = ref.Reference(str(checkpoint), dtype)
    embedder = export_onnx.TextEmbedder(model.text).eval()
    inputs = [tuple(torch.from_numpy(a) for a in export_onnx.make_batch(g, model.text.context)) for g in common.groups(texts, batch)]
    with torch.inference_mode():
        first = embedder(*inputs[0]).float().numpy()  # the warm-up
        seconds = common.measure(lambda: [embedder(*i) for i in inputs], min_seconds, warm_up=lambda: None)
    return len(texts) / seconds, first


def ort_int8(float32: Path, path: Path, feeds: list, options, min_seconds: float):
    """The float32 model quantized by quantize_dynamic into `path`: answers (texts per second or None, note,
    the first batch's embeddings or None)."""
    import onnxruntime
    try:
        from onnxruntime.quantization import quantize_dynamic
    except ImportError as error:
        return None, (f"onnxruntime.quantization: {error} (pip install --no-deps onnx==1.16.2 ml_dtypes==0.4.1: "
                      "onnx's own dependencies would replace Debian's numpy, which its torch needs)"), None
    quantize_dynamic(str(float32), str(path))
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    seconds = common.measure(lambda: [session.run(None, f) for f in feeds], min_seconds,
                             warm_up=lambda: session.run(None, feeds[0]))
    return sum(len(f["last"]) for f in feeds) / seconds, "", session.run(None, feeds[0])[0]


def bench_ort(checkpoint: Path, workdir: Path, texts: list, batch: int, threads: int, min_seconds: float):
    """Answers (float32 texts per second or None, note, bf16 note, int8 texts per second or None, int8 note,
    the int8 model's first batch of embeddings or None)."""
    try:
        import onnxruntime
    except ImportError:
        return None, "not installed (pip install onnxruntime)", "not installed", None, "not installed", None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    path = workdir / f"{checkpoint.stem}.onnx"
    embedder = export_onnx.export(str(checkpoint), str(path))
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = [dict(zip(("ids", "last"), export_onnx.make_batch(g, embedder.tower.context))) for g in common.groups(texts, batch)]
    seconds = common.measure(lambda: [session.run(None, f) for f in feeds], min_seconds, warm_up=lambda: session.run(None, feeds[0]))
    bf16_note = "not supported by ONNX Runtime's CPU provider"
    bf16_path = workdir / f"{checkpoint.stem}-bf16.onnx"
    try:
        export_onnx.export(str(checkpoint), str(bf16_path), torch.bfloat16)
        onnxruntime.InferenceSession(str(bf16_path), options, providers=["CPUExecutionProvider"])
        bf16_note = "a session was created; not timed"
    except Exception as error:  # the reason, shortened: ORT names the first node it has no kernel for
        reason = str(error).strip().splitlines()[-1]
        bf16_note += f" ({reason[reason.find('Could not'):] if 'Could not' in reason else reason[:120]})"
    int8_rate, int8_note, int8_first = ort_int8(path, workdir / f"{checkpoint.stem}-int8.onnx", feeds, options,
                                                min_seconds)
    return len(texts) / seconds, "", bf16_note, int8_rate, int8_note, int8_first


# ------------------------------------------------------------------------------------------------
# GEMM
# ------------------------------------------------------------------------------------------------


def gemm_uform(build: Path) -> tuple[list, dict, str]:
    """Runs bench_gemm --json: answers (records, peak GFLOP/s per thread count, note), the I8 records
    ("kind": "i8") among them and the `vpdpbusd` peaks under ("i8", threads)."""
    exe = build / "bench" / "bench_gemm"
    if not exe.exists():
        return [], {}, f"{exe} not built"
    ran = subprocess.run([str(exe), "--json"], capture_output=True, text=True)
    if ran.returncode != 0:
        return [], {}, f"bench_gemm exited {ran.returncode}: {ran.stderr.strip()[:200]}"
    records, peaks = [], {}
    for line in ran.stdout.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "peak_gflops" in item:
            peaks[int(item.get("threads", 0))] = float(item["peak_gflops"])
        elif "i8_peak_gops" in item:
            peaks[("i8", int(item.get("threads", 0)))] = float(item["i8_peak_gops"])
        elif "gflops" in item or item.get("kind") == "i8":
            records.append(item)
    return records, peaks, ""


def gemm_torch(n: int, k: int, m: int, threads: int, min_seconds: float) -> float:
    common.torch_threads(threads)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(torch.bfloat16)
    w = torch.randn(n, k, generator=generator).to(torch.bfloat16)  # [out, in], as a linear layer
    with torch.inference_mode():
        seconds = common.measure(lambda: torch.matmul(a, w.t()), min_seconds)
    return 2.0 * m * n * k / seconds / 1e9


def main(argv=None) -> int:
    extra = [(("--torch-f32",), {"action": "store_true",
                                 "help": "also PyTorch in float32 (slow where PyTorch has no optimized BLAS, as Debian's)"}),
             (("--no-gemm",), {"action": "store_true"})]
    args = common.arguments(__doc__, "text", ("texts", 256), 64, argv, extra)
    build, library, tool, workdir = Path(args.build), args.library, args.tiny_checkpoint_tool, args.workdir
    checkpoint = workdir / "base-d12-h768-m3072-c256-s3.safetensors"
    made, text = "reused", None
    if checkpoint.exists():
        text = json.loads(ref.read_safetensors(str(checkpoint), prefixes=("none.",))[1]["uform"])["text"]
    if not text or (text["depth"], text["hidden"], text["mlp"], text["context"]) != (12, 768, 3072, 256):
        made = write_checkpoint(tool, checkpoint, 12, 768, 3072, 256, args.seed)
        text = json.loads(ref.read_safetensors(str(checkpoint), prefixes=("none.",))[1]["uform"])["text"]
    texts = make_texts(args.texts, args.seed)

    print(f"checkpoint {checkpoint} ({made}): text depth {text['depth']}, hidden {text['hidden']}, mlp {text['mlp']}, "
          f"context {text['context']}")
    cut = sum(len(t) > int(text["context"]) for t in texts)
    print(f"{len(texts)} texts of 64..256 printable bytes (seed {args.seed}); {cut} longer than context "
          f"{text['context']} are cut to it by every engine; batches of {args.batch}; {args.threads} threads; "
          f"PyTorch {torch.__version__} (float32 GEMMs on {common.torch_blas()})")

    rows = []
    uform = bench_uform(library, checkpoint, texts, args.batch, args.threads, args.min_seconds)
    uform_rate, note, uform_first = uform["bf16"]
    rows.append(("uform (C, RAM executor, F32 out)", uform_rate, note))
    i8_rate, note, i8_first = uform["i8"]
    rows.append(("uform, I8 weights", i8_rate, note))
    torch_bf16 = torch_first = torch_f32 = None
    if not args.no_torch:
        torch_bf16, torch_first = bench_torch(checkpoint, texts, args.batch, args.threads, args.min_seconds,
                                              torch.bfloat16)
        rows.append(("PyTorch eager, bfloat16", torch_bf16, ""))
    if args.torch_f32 and not args.no_torch:
        torch_f32, reference_first = bench_torch(checkpoint, texts, args.batch, args.threads, args.min_seconds, torch.float32)
        rows.append(("PyTorch eager, float32", torch_f32, ""))
    ort_rate, ort_note, bf16_note, int8_rate, int8_note, int8_first = bench_ort(
        checkpoint, workdir, texts, args.batch, args.threads, args.min_seconds)
    rows.append(("ONNX Runtime, float32", ort_rate, ort_note))
    rows.append(("ONNX Runtime, bfloat16", None, bf16_note))
    rows.append(("ONNX Runtime, int8 (quantize_dynamic)", int8_rate, int8_note))

    print(f"\n{'engine':38s} {'texts/s':>10s} {'uform/it':>9s} {'I8/it':>7s}  note")
    for name, rate, note in rows:
        print(f"{name:38s} {figure(rate):>10s} {ratio(uform_rate, rate) if not name.startswith('uform') else '':>9s} "
              f"{ratio(i8_rate, rate) if rate is not i8_rate else '':>7s}  {note}")
    print(f"uform/torch (bf16): {ratio(uform_rate, torch_bf16)}   uform/ort (f32): {ratio(uform_rate, ort_rate)}")
    print(f"I8 weights: /uform BF16 {ratio(i8_rate, uform_rate)}   /ort int8 {ratio(i8_rate, int8_rate)}   "
          f"/torch bf16 {ratio(i8_rate, torch_bf16)}")
    if i8_first is not None and uform_first is not None:
        print(f"first batch, uform I8 vs uform BF16: min cosine {ref._cosines(i8_first, uform_first).min():.5f}")
    if int8_first is not None and uform_first is not None:
        print(f"first batch, ONNX Runtime int8 vs uform BF16: min cosine {ref._cosines(int8_first, uform_first).min():.5f}")
    if uform_first is not None and torch_first is not None:
        compare = reference_first if torch_f32 else torch_first
        cosine = ref._cosines(uform_first, compare).min()
        print(f"first batch, uform vs the reference in {'float32' if torch_f32 else 'bfloat16 (a sanity check only)'}: "
              f"min cosine {cosine:.5f}")

    if args.no_gemm:
        return 0
    records, peaks, note = gemm_uform(build)
    print(f"\nBF16 GEMM, m = {GEMM_M}, {args.threads} threads" + (f"; uform: {note}" if note else ""))
    peak = peaks.get(args.threads)
    print(f"measured peak ({args.threads} threads): {figure(peak, ' GFLOP/s')}")
    print(f"{'n x k':>12s} {'uform path':>12s} {'uform':>9s} {'torch':>9s} {'ratio':>6s} {'uform/peak':>10s} {'torch/peak':>10s}")
    for n, k in GEMM_SHAPES:
        theirs = gemm_torch(n, k, GEMM_M, args.threads, min(args.min_seconds, 1.0))
        ours = [r for r in records if r.get("shape") == f"{n} x {k}" and int(r.get("m", 0)) == GEMM_M
                and int(r.get("threads", 0)) == args.threads and "gflops" in r] or [{"path": "n/a", "gflops": None}]
        for r in ours:
            gflops = r["gflops"]
            print(f"{f'{n} x {k}':>12s} {r['path']:>12s} {figure(gflops):>9s} {figure(theirs):>9s} {ratio(gflops, theirs):>6s} "
                  f"{ratio(gflops, peak):>10s} {ratio(theirs, peak):>10s}")
    print_i8_gemm(records, peaks, args.threads)
    return 0


def print_i8_gemm(records: list, peaks: dict, threads: int) -> None:
    """The I8 GEMM's figures from bench_gemm, as a share of the `vpdpbusd` peak at `threads` threads."""
    peak = peaks.get(("i8", threads))
    print(f"\nI8 GEMM, m = {GEMM_M}, {threads} threads; measured vpdpbusd peak: {figure(peak, ' GOP/s')}")
    print(f"{'n x k':>12s} {'uform path':>12s} {'GOP/s':>9s} {'/peak':>6s} {'quantize':>9s}")
    for n, k in GEMM_SHAPES:
        for r in records:
            if r.get("kind") == "i8" and r.get("shape") == f"{n} x {k}" and int(r.get("threads", 0)) == threads:
                print(f"{f'{n} x {k}':>12s} {r['path']:>12s} {figure(r['gops']):>9s} {ratio(r['gops'], peak):>6s} "
                      f"{100 * r['quantize_share']:8.1f}%")


if __name__ == "__main__":
    sys.exit(main())
