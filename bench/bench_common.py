"""What the benchmarks share: finding an interpreter with PyTorch, timing (and PyTorch's rate over groups of
items), base-sized checkpoints with a tower's front end redrawn, the engine's stage figures over files, and the
printed table.

A benchmark imports this first (bench/ is its own folder, so on sys.path), calls `python_with(...)`, then
imports numpy, PyTorch and tests/reference's modules (`REFERENCE` is put on sys.path here).
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
REFERENCE = REPOSITORY / "tests" / "reference"
sys.path.insert(0, str(REFERENCE))

from interpreter import run_under_python_with  # noqa: E402


def python_with(modules: list) -> None:
    """Re-runs under the project's .venv or Debian's python3 when this one cannot import `modules`;
    exits 0 (a benchmark never fails for it, but under CI=true) where none can, naming what to install."""
    run_under_python_with(modules, status=0)


def torch_blas() -> str:
    """Which BLAS PyTorch's float32 GEMMs run on, read from the libraries mapped after one: Debian's
    python3-torch calls libblas.so.3, whatever implementation Debian's alternatives point that name to
    (the reference libblas3, far slower than OpenBLAS, unless libopenblas0 is installed), while PyTorch's
    own wheels carry MKL or OpenBLAS. The float32 baselines are only as fair as this library."""
    import os
    import torch

    torch.ones(64, 64) @ torch.ones(64, 64)
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "/" in line}
    found = []
    for path in sorted(mapped):
        name = os.path.basename(path)
        # SciPy's and scikit-learn's extension modules (_fblas, cython_blas) call a BLAS; they are none.
        if any(key in name for key in ("blas", "mkl_", "blis")) and ".cpython-" not in name:
            real = os.path.realpath(path)
            kind = ("OpenBLAS" if "openblas" in real else "MKL" if "mkl" in real else "BLIS" if "blis" in real
                    else "the reference BLAS (netlib, unoptimized)" if real.endswith("/blas/libblas.so.3") else real)
            found.append(kind)
    return ", ".join(dict.fromkeys(found)) or "its own kernels (no BLAS library mapped)"


def torch_threads(threads: int) -> None:
    """torch.set_num_threads(threads), and the same count for OpenBLAS where PyTorch's GEMMs run on it: its
    own pool ignores PyTorch's setting and would take every core."""
    import ctypes
    import torch

    torch.set_num_threads(threads)
    torch.ones(2, 2) @ torch.ones(2, 2)  # maps the BLAS
    with open("/proc/self/maps") as maps:
        libraries = {line.split()[-1] for line in maps if "openblas" in line}
    for path in libraries:
        setter = getattr(ctypes.CDLL(path), "openblas_set_num_threads", None)
        if setter:
            setter(threads)


def measure(run, min_seconds: float, warm_up=None) -> float:
    """Seconds per call of `run`, after one call of `warm_up` (default: `run`), over at least
    `min_seconds` (at least one call)."""
    (warm_up or run)()
    calls, start = 0, time.perf_counter()
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def interleaved_best(runs: dict, min_seconds: float, rounds: int = 3) -> dict:
    """Seconds per call of each of `runs` (name: callable), the calls taken in turn, round after round, for
    at least `rounds` rounds and `min_seconds` per run, the best of each: on a machine shared with other
    work, load that comes and goes moves every run alike, and the best call is the engine's own speed."""
    best = {name: float("inf") for name in runs}
    start, done = time.perf_counter(), 0
    while done < rounds or time.perf_counter() - start < min_seconds * len(runs):
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - began)
        done += 1
    return best


def groups(items: list, size: int) -> list:
    """`items` in consecutive groups of `size` (the last may be shorter)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def torch_rate(items: list, batch: int, min_seconds: float, embed_group) -> tuple:
    """Items per second of PyTorch embedding `items` in groups of `batch` (`embed_group(group)` answers a
    group's embeddings as a tensor, under inference mode), and the first group's embeddings as F32."""
    import numpy as np
    import torch

    def run():
        with torch.inference_mode():
            embeddings = [embed_group(group).float().numpy() for group in groups(items, batch)]
        return np.concatenate(embeddings)

    first = run()[:batch]
    return len(items) / measure(run, min_seconds), first


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


def figure(x, unit="") -> str:
    return f"{x:.1f}{unit}" if x else "n/a"


def arguments(description: str, name: str, items: tuple, batch: int, argv=None, extra=()) -> argparse.Namespace:
    """--build, --library and --tiny-checkpoint-tool (defaults in the build), --workdir (default
    <build>/bench-<name>), --threads, --<items> and --batch (their defaults), --seed, --min-seconds,
    --no-torch, and each (flags, options) of `extra`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--library", help="libuform.so (default: <build>/libuform.so)")
    parser.add_argument("--tiny-checkpoint-tool", help="default: <build>/tools/uform_tiny_checkpoint")
    parser.add_argument("--workdir", help=f"checkpoint and inputs (default: <build>/bench-{name})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(f"--{items[0]}", type=int, default=items[1])
    parser.add_argument("--batch", type=int, default=batch, help=f"{items[0]} per call, for every engine")
    for flags, options in extra:
        parser.add_argument(*flags, **options)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=3.0, help="timed at least this long, per engine")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    build = Path(args.build)
    args.library = args.library or str(build / "libuform.so")
    args.tiny_checkpoint_tool = args.tiny_checkpoint_tool or str(build / "tools" / "uform_tiny_checkpoint")
    args.workdir = Path(args.workdir or build / f"bench-{name}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def write_redrawn_checkpoint(tool: str, path: Path, seed: int, tower: str, settings: dict, redrawn: dict) -> None:
    """The tool's base checkpoint (depth 12, hidden 768, mlp 3072) with `settings` merged into `tower`'s
    metadata and the tensors `redrawn` (name: shape) drawn again (std 0.02, BF16) to match them; kept
    where `path` is there already."""
    import numpy as np
    import uform_reference as ref

    if path.exists():
        return

    base = path.with_suffix(".tool.safetensors")
    subprocess.run([tool, str(base), "--depth", "12", "--hidden", "768", "--mlp", "3072", "--seed", str(seed)],
                   check=True, capture_output=True)
    blob = base.read_bytes()
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8 : 8 + length])
    metadata = header.pop("__metadata__")
    config = json.loads(metadata["uform"])
    config[tower].update(settings)
    metadata["uform"] = json.dumps(config)
    rng = np.random.default_rng(seed)
    tensors, data = {}, bytearray()
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        if name in redrawn:
            values = (0.02 * rng.standard_normal(redrawn[name])).astype(np.float32)
            raw, shape = ref.f32_to_bf16_bits(values.reshape(-1)).tobytes(), list(redrawn[name])
        else:
            begin, end = info["data_offsets"]
            raw, shape = blob[8 + length + begin : 8 + length + end], info["shape"]
        tensors[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps({"__metadata__": metadata, **tensors}).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(data))
    base.unlink()


def bench_stages(library: str, checkpoint: Path, threads: int, min_seconds: float, encode_files, encode_decoded,
                 paths: list, decoded: list, batch: int, weights: tuple = ("bf16", "i8")) -> dict:
    """The engine over files end to end and over already decoded inputs, on a RAM executor of `threads`,
    the model loaded once with each of `weights` ("bf16", "i8"): `encode_files(engine, model, group, arena,
    executor)` and `encode_decoded(...)` each answer the call's result. The passes of every model and kind
    take turns, the best of each kept (interleaved_best). Answers, per weights, items per second (end to
    end, its read and decode stages, its tower stage, decoded inputs only) and the embeddings of the first
    group of files."""
    import harness

    engine = harness.Engine(library)
    executor = engine.ram_executor(threads)
    arena = engine.arena(executor)
    models = {w: engine.load(str(checkpoint), executor, w) for w in weights}
    stages = {w: {"read_ns": 0, "decode_ns": 0, "compute_ns": 0, "items": 0} for w in weights}
    try:
        def end_to_end(w):
            for group in groups(paths, batch):
                stats = encode_files(engine, models[w], group, arena, executor)["stats"]
                for key in ("read_ns", "decode_ns", "compute_ns"):
                    stages[w][key] += getattr(stats, key)
                stages[w]["items"] += stats.items - stats.failed

        def decoded_only(w):
            for group in groups(decoded, batch):
                encode_decoded(engine, models[w], group, arena, executor)

        firsts = {w: encode_files(engine, models[w], paths[:batch], arena, executor)["embeddings"]["values"]
                  for w in weights}
        runs = {(w, kind): (lambda w=w, kind=kind: kind(w)) for w in weights for kind in (end_to_end, decoded_only)}
        best = interleaved_best(runs, min_seconds)
        answers = {}
        for w in weights:
            s = stages[w]
            answers[w] = (len(paths) / best[(w, end_to_end)], s["items"] / ((s["read_ns"] + s["decode_ns"]) * 1e-9),
                          s["items"] / (s["compute_ns"] * 1e-9), len(decoded) / best[(w, decoded_only)], firsts[w])
        return answers
    finally:
        for model in models.values():
            engine.library.uform_model_free(model)
        engine.library.uform_arena_free(arena)
        engine.library.uform_executor_free(executor)


def stage_labels(steps: tuple, decoded: str) -> tuple:
    """compare_stages' four labels for a tower whose files pass through `steps` after their decode (resize;
    resample, log-mel), its already decoded inputs being `decoded`."""
    return (f"uform end to end (files: read, decode, {', '.join(steps)}, tower)",
            f"uform decode only (read + decode + {' + '.join(steps)} stages)",
            "uform tower stage of the end-to-end calls",
            f"uform encode only ({decoded})")


def compare_stages(args, checkpoint: Path, paths: list, decoded: list, encode_files, encode_decoded, labels: tuple,
                   unit: str, baseline: str, bench_baseline, agreement: str) -> None:
    """bench_stages (`labels`: its four figures) with BF16 weights and the end-to-end, tower and encode-only
    figures with I8 weights (uform_weights_t), measured in turns, then, unless --no-torch, the baseline in float32 (PyTorch's
    default on a CPU) and in bfloat16: `bench_baseline(checkpoint, paths, batch, threads, min_seconds, dtype)`
    answers its items per second and the embeddings of its first group. Prints their agreement, the figures
    and the ratios."""
    import harness
    import torch

    paths = [str(p) for p in paths]
    figures = bench_stages(args.library, checkpoint, args.threads, args.min_seconds, encode_files, encode_decoded,
                           paths, decoded, args.batch)
    e2e, decode, compute, encode, first = figures["bf16"]
    i8_e2e, _, i8_compute, i8_encode, i8_first = figures["i8"]
    print(f"agreement, first batch, I8 weights against BF16: min cosine {harness.cosines(i8_first, first).min():.5f}")
    rows = list(zip(labels, (e2e, decode, compute, encode)))
    rows += [(f"{labels[0]}, I8 weights", i8_e2e), (f"{labels[2]}, I8 weights", i8_compute),
             (f"{labels[3]}, I8 weights", i8_encode)]
    baselines = [("uform, BF16 weights", e2e)]
    if not args.no_torch:
        for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
            rate, baseline_first = bench_baseline(checkpoint, paths, args.batch, args.threads, args.min_seconds,
                                                  dtype)
            rows.append((f"{baseline} eager {name}", rate))
            baselines.append((f"{baseline} {name}", rate))
            print(f"agreement, first batch, {name}: min cosine {harness.cosines(first, baseline_first).min():.5f} "
                  f"({agreement.format(dtype=name)})")
    print_stages(rows, unit, e2e, encode, baselines[1:])
    print_stages([], unit, i8_e2e, i8_encode, baselines, "I8 weights, ")


def print_stages(rows: list, unit: str, e2e: float, encode: float, baselines: list, which: str = "") -> None:
    """The figures of bench_stages (and the baselines': (name, rate) pairs) and the ratios between them;
    `which` names the engine's weights in the ratios' lines."""
    print()
    width = max([len(name) for name, _ in rows] + [0])
    for name, rate in rows:
        print(f"  {name:<{width}} {rate:8.2f} {unit}/s")
    if rows:
        print()
    width = max([len(f"{which}end to end / encode only:")] +
                [len(f"{which}end to end / {name}:") for name, _ in baselines])
    print(f"  {f'{which}end to end / encode only:':<{width}} {e2e / encode:.2f}")
    for name, rate in baselines:
        print(f"  {f'{which}end to end / {name}:':<{width}} {e2e / rate:.2f}")


PACKAGE_PASSES = 2
PACKAGE_WARM_UP = 32


def package_run(kind: str, build: str, folder: str, manifest: str, threads: str, weights: str, out: str) -> int:
    """`bench_common.py --package-run texts|images BUILD FOLDER MANIFEST THREADS WEIGHTS OUT`: the engine's
    Python package alone in this process (numpy and uform imported, nothing else), the model loaded, a warm-up
    call over the first PACKAGE_WARM_UP items, then every item of the manifest (JSON lines of "text" or
    "image" paths) in one call: prints its items per second, the best of PACKAGE_PASSES passes, and saves the
    embeddings to `out` (.npy)."""
    sys.path.insert(0, str(Path(build) / "python"))
    import numpy as np
    import uform

    lines = Path(manifest).read_text(encoding="utf-8").split("\n")  # not splitlines: texts hold U+2028
    if kind == "texts":
        items = [json.loads(line)["text"] for line in lines if line]
    else:
        items = [Path(json.loads(line)["image"]) for line in lines if line]
    model = uform.Model(folder, executor=uform.Executor.ram(threads=int(threads)), weights=weights)
    encode = model.encode_texts if kind == "texts" else model.encode_images
    encode(items[:PACKAGE_WARM_UP])
    best = float("inf")
    for _ in range(PACKAGE_PASSES):
        began = time.perf_counter()
        vectors = encode(items)
        best = min(best, time.perf_counter() - began)
    np.save(out, np.asarray(vectors, dtype=np.float64))
    print(len(items) / best)
    return 0


def package_rate(kind: str, build: Path, folder: Path, manifest: Path, threads: int, weights: str, out: Path):
    """The engine's Python package from `build` over a manifest of texts or images, loaded and after a warm-up
    call, as the other engines are measured, in a process of its own (package_run): (items per second or None,
    a note, the embeddings or None)."""
    import numpy as np

    command = [sys.executable, str(Path(__file__).resolve()), "--package-run", kind, str(build), str(folder),
               str(manifest), str(threads), weights, str(out)]
    ran = subprocess.run(command, capture_output=True, text=True)
    if ran.returncode:
        lines = (ran.stderr or ran.stdout).strip().splitlines() or [f"exit status {ran.returncode}"]
        return None, lines[-1][:160], None
    return float(ran.stdout.split()[-1]), "", np.load(out)


if __name__ == "__main__" and sys.argv[1:2] == ["--package-run"]:
    sys.exit(package_run(*sys.argv[2:9]))
