#!/usr/bin/env python3
"""Requests per second and p50/p99 latency of `uform serve` at concurrency 1, 16 and 64, beside direct
library calls on the same inputs, and the overhead of serving.

    python3 bench/bench_serve.py --build build                  # starts its own server on a small model
    python3 bench/bench_serve.py --build build --threads 2 --requests 3000
    python3 bench/bench_serve.py --build build --url http://127.0.0.1:8080 --model model.safetensors
                                                                # against a server already running

Without --url it writes a seeded checkpoint with `uform checkpoint tiny` (depth 4, hidden 256, context
256: small enough for a laptop, large enough that compute is not free) and starts
`uform serve --port 0 --threads T` on it; with --url, --model must name the checkpoint that server
serves, so the direct calls run the same weights.

Server: C client threads (C = 1, 16, 64), each with one keep-alive http.client connection, POST
/v1/embeddings with one text per request (seeded printable texts of 32 to 256 bytes, the same list for
every run), "encoding_format": "float"; --requests requests in all per level, after a warm-up of C.
Latency is per request, as the client sees it; requests per second over the whole level.

Direct: the same texts through ctypes on libuform (the ctypes mirror of tests/reference, which needs
numpy and PyTorch importable; without them the direct figures are skipped), on a RAM executor of the
same T threads: one text per call (the latency floor of a request with no HTTP, no JSON, no queue),
and batches of C texts (the throughput floor at concurrency C if every batch gathered C requests).
Both include Python's ctypes overhead of a few microseconds per call; the engine's own time per call
(uform_encode_stats_t.total_ns) is printed beside them.

The client is Python and shares the machine with the server: at high concurrency on few cores it can
be the bottleneck, which the printed client CPU share shows. Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
REFERENCE = REPOSITORY / "tests" / "reference"
LEVELS = (1, 16, 64)


def make_texts(count: int, seed: int = 5) -> list:
    generator = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz      ,.0123456789"
    return ["".join(generator.choice(alphabet) for _ in range(generator.randint(32, 256))) for _ in range(count)]


def percentile(sorted_values: list, fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


# ------------------------------------------------------------------------------------------------
# The server and its clients
# ------------------------------------------------------------------------------------------------


def start_server(uform: Path, model: Path, threads: int, extra: list):
    process = subprocess.Popen([str(uform), "serve", "--model", str(model), "--port", "0", "--threads", str(threads),
                                *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ready, _, _ = select.select([process.stdout], [], [], 120)
    line = process.stdout.readline().decode() if ready else ""
    found = re.match(r"uform serve: listening on (http://[^ ]+) \(model ([^)]+)\)", line)
    if not found:
        process.kill()
        sys.exit(f"uform serve did not start: {line!r}")
    return process, found.group(1), found.group(2)


def run_level(host: str, port: int, name: str, texts: list, concurrency: int, requests: int):
    """Answers (requests per second, sorted latencies in seconds, errors, client CPU seconds)."""
    latencies, errors = [], []
    lock = threading.Lock()
    counter = iter(range(requests + concurrency))  # the first `concurrency` are the warm-up
    warm = threading.Barrier(concurrency + 1)

    def client(index: int):
        connection = http.client.HTTPConnection(host, port, timeout=300)
        own = []
        try:
            first = True
            while True:
                with lock:
                    number = next(counter, None)
                if number is None:
                    break
                body = json.dumps({"input": texts[number % len(texts)], "model": name, "encoding_format": "float"})
                started = time.perf_counter()
                connection.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                data = response.read()
                elapsed = time.perf_counter() - started
                if response.status != 200:
                    errors.append(f"{response.status}: {data[:200]!r}")
                if first:
                    first = False
                    warm.wait()  # every client warmed up before the clock starts
                else:
                    own.append(elapsed)
        except Exception as error:  # counted and printed: a benchmark reports, it does not stop
            errors.append(repr(error))
            if first:
                warm.abort()
        finally:
            connection.close()
            with lock:
                latencies.extend(own)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        warm.wait()
    except threading.BrokenBarrierError:
        pass
    cpu, started = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    latencies.sort()
    return len(latencies) / seconds if seconds > 0 else 0.0, latencies, errors, cpu / seconds if seconds else 0.0


# ------------------------------------------------------------------------------------------------
# Direct library calls
# ------------------------------------------------------------------------------------------------


class Direct:
    """The same texts through ctypes on libuform, on a RAM executor of the server's thread count."""

    def __init__(self, library: Path, model: Path, threads: int, texts: list, min_seconds: float):
        sys.path.insert(0, str(REFERENCE))
        import harness  # the ctypes mirror of uform.h, checked against it by the reference tests

        self.harness, self.texts, self.min_seconds = harness, texts, min_seconds
        self.engine = harness.Engine(str(library))
        self.executor = self.engine.ram_executor(threads)
        self.arena = self.engine.arena(self.executor)
        self.model = self.engine.load(str(model), self.executor)

    def measure(self, batch: int):
        """(seconds per call, engine nanoseconds per call) for calls of `batch` texts."""
        engine, texts = self.engine, self.texts
        groups = [[t.encode() for t in texts[i:i + batch]] for i in range(0, len(texts) - batch + 1, batch)]

        def call(group):
            return engine.encode(self.model, group, self.harness.OUTPUT_EMBEDDINGS, self.arena, self.executor)

        call(groups[0])  # warm-up
        calls, engine_ns, started = 0, 0, time.perf_counter()
        while True:
            engine_ns += call(groups[calls % len(groups)])["stats"].total_ns
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= self.min_seconds and calls >= 3:
                return elapsed / calls, engine_ns / calls

    def close(self):
        self.engine.library.uform_model_free(self.model)
        self.engine.library.uform_arena_free(self.arena)
        self.engine.library.uform_executor_free(self.executor)


def open_direct(library: Path, model, threads: int, texts: list, min_seconds: float):
    """A Direct, or None and why not."""
    if model is None:
        return None, "direct figures skipped: pass --model, the checkpoint the server serves"
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return None, "direct figures skipped: numpy and PyTorch are needed by tests/reference's ctypes harness"
    return Direct(library, model, threads, texts, min_seconds), ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=Path, default=REPOSITORY / "build", help="the meson build directory")
    parser.add_argument("--url", help="a running uform serve (default: start one)")
    parser.add_argument("--model", type=Path, help="the checkpoint (required with --url for the direct figures)")
    parser.add_argument("--threads", type=int, default=2, help="the executor's threads, for both sides")
    parser.add_argument("--requests", type=int, default=2000, help="requests per concurrency level")
    parser.add_argument("--batch-delay-us", type=int, default=0, help="passed to the server it starts")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="per direct measurement")
    options = parser.parse_args()

    uform = options.build / "tools" / "uform"
    library = options.build / "libuform.so"
    texts = make_texts(512)
    process = None
    workdir = options.build / "bench-serve"
    workdir.mkdir(parents=True, exist_ok=True)
    model = options.model
    if options.url:
        url, name = options.url.rstrip("/"), None
    else:
        if model is None:
            model = workdir / "small.safetensors"
            subprocess.run([str(uform), "checkpoint", "tiny", str(model), "--seed", "3", "--depth", "4", "--hidden",
                            "256", "--context", "256"], check=True, capture_output=True)
        process, url, name = start_server(uform, model, options.threads, ["--batch-delay-us", str(options.batch_delay_us)])
    found = re.match(r"http://\[?([^\]/]+?)\]?:(\d+)$", url)
    if not found:
        sys.exit(f"cannot read a host and port from {url}")
    host, port = found.group(1), int(found.group(2))
    if name is None:
        connection = http.client.HTTPConnection(host, port, timeout=60)
        connection.request("GET", "/v1/models")
        name = json.loads(connection.getresponse().read())["data"][0]["id"]
        connection.close()

    print(f"uform serve at {url}, model {name}, executor threads {options.threads}, {os.cpu_count()} cores here; "
          f"{options.requests} requests of one text (32-256 bytes) per level")
    direct, note = open_direct(library, model, options.threads, texts, options.min_seconds)
    # Each level's direct figures are taken right after its server run, so that both meet the same load
    # from whatever else the machine runs.
    served, measured = {}, {}
    try:
        if direct:
            measured[1] = direct.measure(1)
        for level in LEVELS:
            served[level] = run_level(host, port, name, texts, level, options.requests)
            if direct and level not in measured:
                measured[level] = direct.measure(level)
    finally:
        if process:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        if direct:
            direct.close()

    print()
    print(f"{'concurrency':>11} {'requests/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'client CPU':>10}   "
          f"{'direct texts/s':>14} {'direct ms':>9} {'engine ms':>9}   {'overhead':>28}")
    for level in LEVELS:
        rps, latencies, errors, client_cpu = served[level]
        p50, p99 = percentile(latencies, 0.50) * 1e3, percentile(latencies, 0.99) * 1e3
        line = f"{level:>11} {rps:>11.0f} {p50:>8.3f} {p99:>8.3f} {client_cpu:>9.0%}   "
        if direct:
            seconds, engine_ns = measured[level]
            texts_per_second = level / seconds
            # At concurrency 1 the overhead is the latency a request adds to one direct call; above,
            # the throughput kept against perfect batches of `level` texts.
            overhead = (f"{p50 - seconds * 1e3:+.3f} ms per request" if level == 1
                        else f"{rps / texts_per_second:.2f}x of batched direct")
            line += f"{texts_per_second:>14.0f} {seconds * 1e3:>9.3f} {engine_ns * 1e-6:>9.3f}   {overhead:>28}"
        print(line)
        if errors:
            print(f"{'':>11} {len(errors)} errors, first: {errors[0]}")
    if not direct:
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
