#!/usr/bin/env python3
"""The engine's GEMMs (bench_gemm) beside PyTorch's matmul at the same shapes and thread counts.

    python3 bench/bench_gemm.py --build build [--min-seconds 0.5] [--runs N] [path...]

Runs `<build>/bench/bench_gemm --json [path...]` (every kernel path this CPU runs, m = 512, the text tower's
qkv, out, up and down shapes, 1 and 2 threads, each figure the best of 3 rounds' medians with the paths
taking turns, and a share of its path's own peak; with --runs N, N runs and each figure the best of them),
then torch.matmul(x, w.t()) at each shape in bfloat16 and in float32, torch.set_num_threads(1) and (2) (and
as many OpenBLAS threads), the best call of each over --min-seconds. It prints the CPU, the path the
dispatcher chose, the peaks, then per shape and thread count every path's GFLOP/s with its share of its own
peak beside PyTorch's, the chosen GEMM marked `*` with its ratio to PyTorch bfloat16; then bench_gemm's I8
figures (GOP/s) and its check: every path's rate over the four shapes, and the chosen GEMM's against the
fastest one's. It prints figures and ratios and never fails on time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import bench_common as common
from bench_common import figure, ratio

if __name__ == "__main__":
    common.python_with(["torch"])
import torch  # noqa: E402

SHAPES = [("qkv", 2304, 768), ("out", 768, 768), ("up", 3072, 768), ("down", 768, 3072)]  # (layer, n, k)
M = 512


def run_bench_gemm(build: Path, paths: list) -> tuple[list, str]:
    """bench_gemm --json's records, or an empty list and why."""
    exe = build / "bench" / "bench_gemm"
    if not exe.exists():
        return [], f"{exe} not built"
    ran = subprocess.run([str(exe), "--json", *paths], capture_output=True, text=True)
    if ran.returncode != 0:
        return [], f"bench_gemm exited {ran.returncode}: {ran.stderr.strip()[:200]}"
    records = []
    for line in ran.stdout.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records, ""


def best_of(runs: list) -> list:
    """One run's records from several: each figure and peak its best over the runs (the rate the path has
    when the machine's other work leaves it alone), each figure's share of its own peak and the summaries
    recomputed from those."""
    best, order = {}, []
    for records in runs:
        for r in records:
            if "summary" in r:
                continue
            rate = next((key for key in ("gflops", "gops") if key in r), None) or next(
                (key for key in r if key.endswith("_peak") and not key.startswith("ratio")), None)
            key = (r.get("kind"), r.get("path"), r.get("shape"), r.get("threads"), rate, "cpu" in r)
            if key not in best:
                order.append(key)
                best[key] = r
            elif rate and r[rate] > best[key][rate]:
                best[key] = r
    merged = [dict(best[key]) for key in order]
    peaks = {}  # (kind, path, threads): the best peak of that path's own instruction
    for r in merged:
        key = next((key for key in r if key.endswith("_peak") and not key.startswith("ratio")), None)
        if key and "kind" in r:
            peaks[(r["kind"], r["path"], r["threads"])] = r[key]
    for r in merged:  # each best figure as a share of the best peak, which another run may have measured
        unit = "gops" if "gops" in r else "gflops" if "gflops" in r else None
        peak = peaks.get(("i8" if unit == "gops" else "bf16", r.get("path"), r.get("threads")))
        if unit and peak:
            r["ratio_to_own_peak"] = r[unit] / peak
    for kind in ("bf16", "i8"):
        unit = "gops" if kind == "i8" else "gflops"
        figures = [r for r in merged if unit in r]
        for threads in sorted({r["threads"] for r in figures}):
            rates = {}
            for path in dict.fromkeys(r["path"] for r in figures):
                mine = [r for r in figures if r["path"] == path and r["threads"] == threads]
                ops = [2.0 * r["m"] * int(r["shape"].split(" x ")[0]) * int(r["shape"].split(" x ")[1]) for r in mine]
                rates[path] = sum(ops) / sum(o / (r[unit] * 1e9) for o, r in zip(ops, mine)) / 1e9
            chosen = next((r["path"] for r in figures if r["chosen"]), None)
            fastest = max(rates, key=rates.get)
            merged.append({"summary": kind, "threads": threads, "chosen": chosen or "not measured",
                           "fastest": fastest, "chosen_rate": rates.get(chosen, 0.0),
                           "fastest_rate": rates[fastest], "ratio_to_fastest": rates.get(chosen, 0.0) / rates[fastest],
                           "rates": rates})
    return merged


def torch_gflops(n: int, k: int, threads: int, dtype, min_seconds: float) -> float:
    """torch.matmul of x [M, k] by w [n, k] transposed (a linear layer's product) in `dtype`, best call."""
    common.torch_threads(threads)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(M, k, generator=generator).to(dtype)
    w = torch.randn(n, k, generator=generator).to(dtype)
    with torch.inference_mode():
        best = common.interleaved_best({"matmul": lambda: torch.matmul(x, w.t())}, min_seconds)["matmul"]
    return 2.0 * M * n * k / best / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(common.REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--min-seconds", type=float, default=0.5, help="PyTorch's time per shape, dtype, threads")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs of bench_gemm; more than 1: each figure and peak the best of them")
    parser.add_argument("paths", nargs="*", help="bench_gemm's paths (default: every one this CPU runs)")
    args = parser.parse_args(argv)

    runs, note = [], ""
    for _ in range(args.runs):
        records, note = run_bench_gemm(Path(args.build), args.paths)
        if note:
            break
        runs.append(records)
    records = best_of(runs) if runs else records
    head = next((r for r in records if "cpu" in r), {})
    print(f"CPU: {head.get('cpu', 'unknown')}, {head.get('cpus_online', '?')} online; PyTorch {torch.__version__} "
          f"(float32 GEMMs on {common.torch_blas()}); m = {M}")
    print(f"kernels chosen: {head.get('kernels', 'n/a')}" + (f"; bench_gemm: {note}" if note else ""))
    for r in records:
        key = next((key for key in r if key.endswith("_peak") and not key.startswith("ratio")), None)
        if key:
            unit = "GOP/s" if r["kind"] == "i8" else "GFLOP/s"
            print(f"peak {key[:-5]:<10s} ({r['path']:<12s}) {r['threads']} thread(s): {r[key]:8.1f} {unit}")

    figures = [r for r in records if "gflops" in r]
    threads_seen = sorted({int(r["threads"]) for r in figures}) or [1, 2]
    print(f"\n{'layer':5s} {'n x k':>11s} {'thr':>3s} {'path':>13s} {'GFLOP/s':>8s} {'/own peak':>9s} "
          f"{'torch bf16':>10s} {'torch f32':>9s} {'/torch bf16':>11s}")
    for layer, n, k in SHAPES:
        for threads in threads_seen:
            bf16 = torch_gflops(n, k, threads, torch.bfloat16, args.min_seconds)
            f32 = torch_gflops(n, k, threads, torch.float32, args.min_seconds)
            ours = [r for r in figures if r["shape"] == f"{n} x {k}" and int(r["threads"]) == threads]
            for r in ours or [{"path": "n/a", "gflops": None, "ratio_to_own_peak": None, "chosen": False}]:
                mark = "*" if r["chosen"] else " "
                own = f"{100 * r['ratio_to_own_peak']:.1f}%" if r["ratio_to_own_peak"] else "n/a"
                print(f"{layer:5s} {f'{n} x {k}':>11s} {threads:>3d} {r['path'] + mark:>13s} {figure(r['gflops']):>8s} "
                      f"{own:>9s} {figure(bf16):>10s} {figure(f32):>9s} {ratio(r['gflops'], bf16):>11s}")

    i8 = [r for r in records if r.get("kind") == "i8" and "gops" in r]
    if i8:
        print(f"\n{'layer':5s} {'n x k':>11s} {'thr':>3s} {'I8 path':>13s} {'GOP/s':>8s} {'/own peak':>9s}")
        for layer, n, k in SHAPES:
            for r in (r for r in i8 if r["shape"] == f"{n} x {k}"):
                mark = "*" if r["chosen"] else " "
                own = f"{100 * r['ratio_to_own_peak']:.1f}%" if r["ratio_to_own_peak"] else "n/a"
                print(f"{layer:5s} {f'{n} x {k}':>11s} {int(r['threads']):>3d} {r['path'] + mark:>13s} "
                      f"{figure(r['gops']):>8s} {own:>9s}")

    print("\nOver the four shapes (their work over their summed time): the chosen GEMM against the fastest"
          + (f"; each figure the best of {args.runs} runs" if args.runs > 1 else ""))
    for r in (r for r in records if "summary" in r):
        unit = "GOP/s" if r["summary"] == "i8" else "GFLOP/s"
        within = ("its path not measured" if r["chosen"] == "not measured" else
                  "within 5%" if r["ratio_to_fastest"] >= 0.95 else "NOT within 5%")
        every = " ".join(f"{path} {rate:.1f}" for path, rate in r.get("rates", {}).items())
        print(f"{r['summary']:4s} {r['threads']} thread(s): {every + '; ' if every else ''}chosen {r['chosen']} "
              f"{r['chosen_rate']:.1f} {unit}, fastest {r['fastest']} {r['fastest_rate']:.1f}: "
              f"{r['ratio_to_fastest']:.3f} ({within})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
