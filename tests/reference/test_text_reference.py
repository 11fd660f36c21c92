#!/usr/bin/env python3
"""The C engine's text tower against the independent PyTorch reference (uform_reference.py).

    test_text_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/tools/uform_tiny_checkpoint --workdir build/text-reference

Writes two seeded checkpoints with the tool (the tiny default, and depth 4 hidden 256) and a third
derived from the second with sharper attention (q and k rows x4, exact in BF16: the tool's small
weights make attention nearly uniform, which hides rotary and scale bugs), loads each through
ctypes, checks the ctypes mirror of every struct against uform.h with a compiled probe, and compares on a batch of texts of varied lengths (empty, one byte, ASCII, UTF-8,
exactly `context`, past `context`, random bytes): embeddings, token vectors, states, every
matryoshka width, every output kind (F32, BF16, F16, I8), text_choose probabilities, and the
encode statistics, on every receiver (the calling thread, RAM executors of 1 and 2 threads, deferred
with an outcome), whose results must be bitwise identical.

Exit status: 0 pass, 1 fail (what differs is printed), 77 skip (no PyTorch in any interpreter found).
A verb that answers UFORM_UNSUPPORTED is a failure: this test exists to hold the text tower.

Tolerances (the reference computes in float32 from the same BF16 weights; the engine may round GEMM
inputs to BF16, which the reference's BF16-input emulation puts at cosine > 0.99999 and a state
error near 4e-3 on these models):
  - embeddings, token vectors, matryoshka prefixes: cosine >= 0.999 per row;
  - states: relative L2 error <= 1e-2 per row (BF16 keeps 8 bits: 2^-8 = 3.9e-3 per rounding);
  - BF16 / F16 / I8 outputs against the engine's own F32 output converted by the reference's
    helpers: at most 1 unit in the last place (BF16, F16), at most 1 quantization step (I8, where
    x / scale may land on either side of a half), scales within 1e-6 relative; the same outputs
    against the reference: cosine >= 0.999 per row (I8 dequantized);
  - text_choose on the engine's own states: abs <= 2e-3 per probability against the reference's
    softmax of those states (the logits may be computed from BF16-rounded states); on the reference's
    states: abs <= 2e-2; every item's probabilities sum to 1 within 1e-4.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from interpreter import optional_import, run_under_python_with  # noqa: E402

if __name__ == "__main__":
    run_under_python_with(["torch", "numpy"])

import numpy as np  # noqa: E402

import harness  # noqa: E402  (the ctypes mirror, Engine, Report)
import uform_reference as ref  # noqa: E402
from harness import (BF16, F16, F32, I8, OK, OUTPUT_EMBEDDINGS, OUTPUT_STATES, OUTPUT_TOKEN_VECTORS,  # noqa: E402
                     SCALAR_NAMES, UNSUPPORTED, Engine, EngineError, Report, compare_rows)

CHOOSE_SAME_STATES_ABS = 2e-3
CHOOSE_REFERENCE_STATES_ABS = 2e-2
CHOOSE_SUM_ABS = 1e-4
SCALE_RELATIVE = 1e-6


def ulps_apart(a: np.ndarray, b: np.ndarray, storage) -> int:
    """The largest distance in units of the last place between two arrays of one 16-bit kind."""
    def ordered(x):
        bits = np.asarray(x).view(storage).astype(np.int64)
        return np.where(bits & 0x8000, 0x8000 - (bits & 0x7FFF), 0x8000 + bits)
    if a.size == 0:
        return 0
    return int(np.abs(ordered(a) - ordered(b)).max())



def test_texts(context: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    sentence = b"The quick brown fox jumps over the lazy dog. "
    texts = [
        b"",
        b"a",
        b"Hello, world!",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u4f60\u597d\uff0c\u4e16\u754c \U0001F30D na\u00efve caf\u00e9".encode(),
        (sentence * (context // len(sentence) + 1))[:context],  # exactly `context`: kept whole
        (sentence * (context // len(sentence) + 1))[: context + 1],  # one byte past
        (sentence * (3 * context // len(sentence) + 2))[: 3 * context + 7],  # well past
    ]
    texts += [rng.integers(0, 256, size=int(rng.integers(0, 301)), dtype=np.uint8).tobytes() for _ in range(20)]
    return texts


def split_rows(view: dict) -> list:
    offsets = view["offsets"]
    values = view["values"]
    return [values[offsets[i] - offsets[0] : offsets[i + 1] - offsets[0]] for i in range(len(offsets) - 1)]


def check_checkpoint(engine: Engine, report: Report, label: str, path: Path, weights: str = "stored") -> None:
    print(f"\n== {label}: {path}", flush=True)
    with harness.loaded(engine, path, weights=weights) as model:
        _check_model(engine, report, model, path, weights)


def _check_model(engine, report, model, path, weights):
    reference = ref.Reference(str(path))
    full = None
    if weights == "i8":  # the reference quantizes as the engine does; the unquantized one stays near
        full = reference.text.encode(test_texts(reference.text.context, seed=11)).embeddings
        ref.quantize_blocks(reference.text)
    info = engine.info(model)
    text = reference.config["text"]
    report.check("model info matches the metadata",
                 info.has_text and info.dims == reference.dims
                 and list(info.matryoshka[: info.matryoshka_count]) == reference.matryoshka
                 and (info.text.transformer.depth, info.text.transformer.hidden, info.text.transformer.heads,
                      info.text.transformer.mlp, info.text.context)
                 == (text["depth"], text["hidden"], text["heads"], text["mlp"], text["context"]),
                 f"dims {info.dims}, matryoshka {list(info.matryoshka[: info.matryoshka_count])}, text "
                 f"{info.text.transformer.depth}x{info.text.transformer.hidden} heads {info.text.transformer.heads} "
                 f"mlp {info.text.transformer.mlp} context {info.text.context}")
    tower = reference.text
    texts = test_texts(tower.context, seed=11)
    expected = tower.encode(texts)
    everything = OUTPUT_EMBEDDINGS | OUTPUT_TOKEN_VECTORS | OUTPUT_STATES

    side_arena = engine.arena()
    try:
        with harness.executors_and_arenas(engine) as (executors, arenas):
            _check_receivers(engine, report, model, texts, expected, tower, everything, arenas["host"], side_arena,
                             executors, arenas, full)
    finally:
        engine.library.uform_arena_free(side_arena)


def _check_receivers(engine, report, model, texts, expected, tower, everything, host_arena, side_arena, executors, arenas,
                     unquantized=None):
    # F32, every output, every receiver: bitwise identical.
    receivers = harness.receivers(host_arena, executors, arenas)
    first = harness.encode_on_receivers(
        report, "uform_text_encode",
        lambda executor, arena, deferred: engine.encode(model, texts, everything, arena, executor, deferred=deferred),
        receivers, hint=" (the text tower is not built yet: this test fails until uform_text_encode works)")
    if first is None:
        return

    result = first
    items = len(texts)
    report.check("one status per item, all OK", result["statuses"] is not None and result["statuses"] == [OK] * items,
                 f"{result['statuses']}")
    stats = result["stats"]
    total_bytes, kept_bytes = sum(map(len, texts)), sum(expected.kept)
    report.check("encode stats: items, failed, truncated",
                 (stats.items, stats.failed, stats.truncated) == (items, 0, expected.truncated),
                 f"items {stats.items} failed {stats.failed} truncated {stats.truncated} (expected {items}, 0, "
                 f"{expected.truncated}); bytes {stats.bytes} (input {total_bytes}, kept {kept_bytes})")
    report.check("encode stats: bytes are the input or the kept bytes", stats.bytes in (total_bytes, kept_bytes),
                 f"{stats.bytes}")

    embeddings, vectors, states = result["embeddings"], result["token_vectors"], result["states"]
    for view_name, view, columns in (("embeddings", embeddings, tower.dims), ("token vectors", vectors, tower.dims),
                                     ("states", states, tower.config.hidden)):
        report.check(f"{view_name}: a host F32 view of {columns} columns",
                     view is not None and view["scalar"] == F32 and view["columns"] == columns,
                     "missing" if view is None else f"scalar {SCALAR_NAMES.get(view['scalar'])}, columns {view['columns']}")
    if embeddings is None or vectors is None or states is None:
        return
    report.check("embeddings: one row per item", embeddings["rows"] == items, f"{embeddings['rows']}")
    compare_rows(report, "embeddings vs reference", embeddings["values"], expected.embeddings)
    if unquantized is not None:
        compare_rows(report, "I8 embeddings vs the reference's without I8", embeddings["values"], unquantized,
                     minimum=harness.I8_COSINE_MIN)
    report.check("embeddings are unit rows", np.abs(np.linalg.norm(embeddings["values"], axis=1) - 1).max() < 1e-3)

    offsets = vectors["offsets"]
    expected_offsets = np.array(expected.token_offsets)
    report.check("token vectors: item offsets = kept bytes per item (none for BOS)",
                 offsets is not None and np.array_equal(offsets - offsets[0], expected_offsets),
                 f"engine {None if offsets is None else (offsets - offsets[0]).tolist()}, reference {expected_offsets.tolist()}")
    if offsets is not None and offsets[-1] - offsets[0] == vectors["rows"] == expected_offsets[-1]:
        compare_rows(report, "token vectors vs reference", vectors["values"], expected.stacked_token_vectors())

    report.check("states: one row per item", states["rows"] == items, f"{states['rows']}")
    if states["rows"] == items:
        relative = np.linalg.norm(states["values"] - expected.states, axis=1) / np.linalg.norm(expected.states, axis=1)
        maximum = harness.states_max(tower)
        report.check("states vs reference, relative L2", relative.max() <= maximum,
                     f"max {relative.max():.2e} (item {int(np.argmax(relative))}, <= {maximum}), "
                     f"max abs {np.abs(states['values'] - expected.states).max():.2e}")

    # Matryoshka widths: the prefix renormalized, against the reference and the engine's own rows.
    info = engine.info(model)
    for width in info.matryoshka[: info.matryoshka_count]:
        try:
            narrow = engine.encode(model, texts, OUTPUT_EMBEDDINGS, host_arena, matryoshka=width)["embeddings"]
        except EngineError as error:
            report.check(f"matryoshka {width}", False, str(error))
            continue
        if report.check(f"matryoshka {width}: {width} columns", narrow["columns"] == width, f"{narrow['columns']}"):
            compare_rows(report, f"matryoshka {width} vs reference", narrow["values"], expected.matryoshka(width))
            own = embeddings["values"][:, :width]
            own = own / np.linalg.norm(own, axis=1, keepdims=True)
            report.check(f"matryoshka {width} == the engine's own prefix renormalized",
                         np.abs(narrow["values"] - own).max() <= 1e-5, f"max abs {np.abs(narrow['values'] - own).max():.2e}")

    # Output kinds: exact conversions of the engine's own F32 rows, and close to the reference.
    reference_rows = {"embeddings": expected.embeddings, "token_vectors": expected.stacked_token_vectors(), "states": expected.states}
    for scalar in (BF16, F16, I8):
        kind = SCALAR_NAMES[scalar]
        try:
            converted = engine.encode(model, texts, everything, host_arena, scalar=scalar)
        except EngineError as error:
            report.check(f"{kind} outputs", False, str(error))
            continue
        for output in ("embeddings", "token_vectors", "states"):
            view, f32 = converted[output], result[output]["values"].astype(np.float32)
            if view is None or view["scalar"] != scalar or view["values"].shape != f32.shape:
                report.check(f"{kind} {output}", False, "missing" if view is None else
                             f"scalar {SCALAR_NAMES.get(view['scalar'])}, shape {view['values'].shape}, F32 {f32.shape}")
                continue
            if scalar == BF16:
                got = view["values"].astype(np.float32)
                distance = ulps_apart(ref.f32_to_bf16_bits(got), ref.f32_to_bf16_bits(f32), np.uint16)
                exact = np.mean(got == ref.to_bf16(f32)) if got.size else 1.0
                report.check(f"BF16 {output} == F32 rounded to nearest even", distance <= 1,
                             f"max {distance} ulp, {100 * exact:.1f}% exact")
                dequantized = got
            elif scalar == F16:
                got = view["values"].astype(np.float16)
                distance = ulps_apart(got, ref.to_f16(f32), np.uint16)
                exact = np.mean(got == ref.to_f16(f32)) if got.size else 1.0
                report.check(f"F16 {output} == F32 rounded to nearest even", distance <= 1,
                             f"max {distance} ulp, {100 * exact:.1f}% exact")
                dequantized = got.astype(np.float64)
            else:
                q, scales = view["values"].astype(np.int64), view["scales"]
                want_q, want_scales = ref.quantize_i8_rows(f32)
                steps = int(np.abs(q - want_q).max()) if q.size else 0
                scale_error = float(np.max(np.abs(scales - want_scales) / np.maximum(want_scales, 1e-30))) if scales.size else 0.0
                report.check(f"I8 {output} == F32 quantized per row", steps <= 1 and scale_error <= SCALE_RELATIVE,
                             f"max {steps} step(s), scales relative {scale_error:.1e}, "
                             f"{100 * (np.mean(q == want_q) if q.size else 1):.1f}% exact")
                dequantized = ref.dequantize_i8_rows(q, scales)
            compare_rows(report, f"{kind} {output} vs reference", dequantized, reference_rows[output])

    # text_choose: legal byte sets of varied sizes, on the engine's F32 and BF16 states.
    rng = np.random.default_rng(5)
    sizes = [1, 2, 5, 17, 256, 40]
    choices = [bytes(rng.permutation(256)[:size].astype(np.uint8)) for size in sizes]
    chosen_items = list(range(len(choices)))  # the first texts: empty, one byte, ASCII, UTF-8, context, context+1
    for scalar in (F32, BF16):
        kind = SCALAR_NAMES[scalar]
        try:
            live = engine.encode(model, [texts[i] for i in chosen_items], OUTPUT_STATES, host_arena, scalar=scalar,
                                 keep_views=True)
        except EngineError as error:
            report.check(f"{kind} states for text_choose", False, str(error))
            continue
        engine_states = live["states"]["values"]
        answers = {}
        for name, executor, arena, deferred in receivers:
            arena = side_arena if executor is None else arena
            try:
                answers[name] = engine.choose(model, live["encoded"].states, choices, arena, executor, deferred)
            except EngineError as error:
                hint = " (not built yet: this test fails until uform_text_choose works)" if error.status == UNSUPPORTED else ""
                report.check(f"uform_text_choose on {kind} states, {name}", False, f"{error}{hint}")
                break
        if len(answers) != len(receivers):
            continue
        first = answers[receivers[0][0]]
        for name, _, _, _ in receivers[1:]:
            report.check(f"text_choose ({kind} states): {name} == calling thread, bitwise", answers[name]["raw"] == first["raw"])
        if first["offsets"] is None or first["columns"] * first["rows"] != sum(sizes):
            report.check(f"text_choose ({kind} states): one F32 per legal byte, grouped per item", False,
                         f"rows {first['rows']}, columns {first['columns']}, offsets {first['offsets']}")
            continue
        flat = first["values"].reshape(-1)
        offsets = first["offsets"] - first["offsets"][0]
        report.check(f"text_choose ({kind} states): F32, item offsets = legal bytes per item",
                     first["scalar"] == F32 and np.array_equal(np.diff(offsets), sizes), f"{offsets.tolist()}")
        got = [flat[offsets[i] : offsets[i + 1]] for i in range(len(sizes))]
        same_states = tower.choose(engine_states, choices)
        reference_states = tower.choose(expected.states[chosen_items], choices)
        sums = max(abs(g.sum() - 1) for g in got)
        report.check(f"text_choose ({kind} states): each item sums to 1", sums <= CHOOSE_SUM_ABS, f"max |sum - 1| {sums:.1e}")
        error = max(np.abs(g - w).max() for g, w in zip(got, same_states))
        report.check(f"text_choose ({kind} states) vs reference on the engine's states", error <= CHOOSE_SAME_STATES_ABS,
                     f"max abs {error:.2e} (<= {CHOOSE_SAME_STATES_ABS})")
        error = max(np.abs(g - w).max() for g, w in zip(got, reference_states))
        report.check(f"text_choose ({kind} states) vs reference end to end", error <= CHOOSE_REFERENCE_STATES_ABS,
                     f"max abs {error:.2e} (<= {CHOOSE_REFERENCE_STATES_ABS})")


def check_reference_alone(report: Report, paths: list) -> None:
    print("\n== the reference on its own", flush=True)
    failures = ref.self_check(verbose=True)
    report.failures += [f"reference self-check: {f}" for f in failures]
    safetensors_numpy = optional_import("safetensors.numpy", "the parser is not cross-checked")
    if not safetensors_numpy:
        return
    load_file = safetensors_numpy.load_file
    for path in paths:
        tensors, _ = ref.read_safetensors(str(path))
        try:
            theirs = load_file(str(path))
        except (TypeError, ValueError) as error:  # numpy has no bfloat16: read the bits through torch instead
            from safetensors.torch import load_file as load_torch
            theirs = {k: v.float().numpy() for k, v in load_torch(str(path)).items()}
            del error
        same = tensors.keys() == theirs.keys() and all(np.array_equal(tensors[k], np.asarray(theirs[k], np.float32)) for k in tensors)
        report.check(f"the parser == the safetensors package on {path.name}", same)


def main(argv=None) -> int:
    args = harness.parse_arguments(__doc__, argv)
    workdir = harness.open_workdir(args, "text")
    report = Report()
    callable_engine = harness.check_layouts(report, args.header, workdir)
    checkpoints = harness.write_standard_checkpoints(args.tiny_checkpoint_tool, workdir, "text", "text")
    if checkpoints is None:
        return 1
    check_reference_alone(report, [path for _, path in checkpoints[:2]])
    engine = harness.open_engine(args.library)
    if engine is None:
        return 1
    outcome = harness.Outcome(engine.library)
    report.check("outcome buffer is 64-byte aligned", outcome.address % harness.OUTCOME_ALIGNMENT == 0)
    outcome.destroy()
    if callable_engine:
        harness.check_each(report, checkpoints, lambda label, path: check_checkpoint(engine, report, label, path))
        harness.check_each(report, harness.with_i8_weights(checkpoints),
                           lambda label, path: check_checkpoint(engine, report, label, path, "i8"))
    return harness.summary(report)


if __name__ == "__main__":
    sys.exit(main())
