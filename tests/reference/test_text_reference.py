#!/usr/bin/env python3
"""The C engine's text tower against the independent PyTorch reference (uform_reference.py).

    test_text_reference.py --library build/libuform.so \
        --tiny-checkpoint-tool build/src/tools/uform_tiny_checkpoint --workdir build/text-reference

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

import argparse
import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]


def _interpreter_with_torch() -> None:
    """Meson may find a python3 without PyTorch (pyenv, a venv without system packages): re-run
    this script under one that has it (the project's .venv, Debian's /usr/bin/python3), else skip."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("UFORM_REFERENCE_REEXEC"):
        print(f"SKIP: PyTorch cannot be imported by {sys.executable}")
        sys.exit(SKIP)
    here = os.path.realpath(sys.executable)
    for candidate in (REPOSITORY / ".venv" / "bin" / "python3", Path("/usr/bin/python3")):
        if not candidate.exists() or os.path.realpath(candidate) == here:
            continue
        probe = subprocess.run([str(candidate), "-c", "import torch, numpy"], capture_output=True)
        if probe.returncode == 0:
            print(f"note: {sys.executable} has no PyTorch; running under {candidate}", flush=True)
            os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, "UFORM_REFERENCE_REEXEC": "1"})
    print(f"SKIP: PyTorch cannot be imported by {sys.executable}, {REPOSITORY / '.venv/bin/python3'} or /usr/bin/python3")
    sys.exit(SKIP)


def _preload_sanitizer(library: str) -> None:
    """A library built with -fsanitize=address needs the ASan runtime first in the process: re-run
    this script with it preloaded (and leak checking off, for the interpreter's own allocations)."""
    try:
        with open(library, "rb") as f:
            found = re.search(rb"libasan\.so\.\d+", f.read())
    except OSError:
        return
    if not found or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    environment = dict(os.environ)
    environment["LD_PRELOAD"] = " ".join(filter(None, [found.group().decode(), environment.get("LD_PRELOAD", "")]))
    environment["ASAN_OPTIONS"] = ":".join(filter(None, [environment.get("ASAN_OPTIONS", ""), "detect_leaks=0"]))
    print(f"note: {library} is built with ASan; re-running with LD_PRELOAD={environment['LD_PRELOAD']}", flush=True)
    os.execve(sys.executable, [sys.executable, *sys.argv], environment)


# ------------------------------------------------------------------------------------------------
# ctypes mirror of include/uform.h (field names as in C, so the layout probe can name them)
# ------------------------------------------------------------------------------------------------

c_size = ctypes.c_size_t
c_status = ctypes.c_int  # uform_status_t and every other enum: int-sized (gcc, clang)

STATUS_NAMES = {0: "OK", 1: "PENDING", 2: "CANCELLED", 3: "CONTENDED", 4: "INVALID_ARGUMENT", 5: "IO", 6: "FORMAT",
                7: "OUT_OF_MEMORY", 8: "DEVICE", 9: "UNSUPPORTED", 10: "INTERNAL", 11: "MISSING_SYMBOL"}
OK, PENDING, UNSUPPORTED = 0, 1, 9
OUTPUT_EMBEDDINGS, OUTPUT_TOKEN_VECTORS, OUTPUT_STATES = 1, 2, 4
F32, BF16, F16, I8 = 0, 1, 2, 3
SCALAR_NAMES = {F32: "F32", BF16: "BF16", F16: "F16", I8: "I8"}
SCALAR_SIZES = {F32: 4, BF16: 2, F16: 2, I8: 1}
OUTCOME_SIZE, OUTCOME_ALIGNMENT = 512, 64


class Struct(ctypes.Structure):
    c_name = ""  # the C typedef, for the layout probe; "" for anonymous nested structs
    anonymous_in_c = False


class uform_error_t(Struct):
    c_name = "uform_error_t"
    _fields_ = [("status", c_status), ("entry", ctypes.c_char_p), ("message", ctypes.c_char_p)]


PROGRESS_HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, c_size, c_size)


class uform_progress_t(Struct):
    c_name = "uform_progress_t"
    _fields_ = [("handler", PROGRESS_HANDLER), ("state", ctypes.c_void_p), ("steps", c_size)]


class uform_outcome_t(Struct):
    c_name = "uform_outcome_t"
    _fields_ = [("opaque", ctypes.c_ubyte * OUTCOME_SIZE)]  # ctypes cannot align it: see Outcome


class uform_ram_options_t(Struct):
    c_name = "uform_ram_options_t"
    _fields_ = [("domains", ctypes.POINTER(c_size)), ("domains_count", c_size), ("threads", c_size),
                ("spin_ns", ctypes.c_uint64), ("pin", ctypes.c_bool)]


class uform_tape_t(Struct):
    c_name = "uform_tape_t"
    _fields_ = [("data", ctypes.c_void_p), ("offsets", ctypes.POINTER(c_size)), ("count", c_size), ("length", c_size)]


class uform_view_t(Struct):
    c_name = "uform_view_t"
    _fields_ = [("data", ctypes.c_void_p), ("scales", ctypes.POINTER(ctypes.c_float)),
                ("item_offsets", ctypes.POINTER(c_size)), ("rows", c_size), ("columns", c_size), ("items", c_size),
                ("row_stride", c_size), ("scalar", c_status), ("device", ctypes.c_bool),
                ("arena", ctypes.c_void_p), ("generation", ctypes.c_uint64)]


class uform_transformer_info_t(Struct):
    c_name = "uform_transformer_info_t"
    _fields_ = [("depth", c_size), ("hidden", c_size), ("heads", c_size), ("mlp", c_size)]


class _text_info(Struct):
    anonymous_in_c = True
    _fields_ = [("transformer", uform_transformer_info_t), ("context", c_size)]


class _image_info(Struct):
    anonymous_in_c = True
    _fields_ = [("transformer", uform_transformer_info_t), ("size", c_size), ("patch", c_size),
                ("mean", ctypes.c_float * 3), ("std", ctypes.c_float * 3)]


class _video_info(Struct):
    anonymous_in_c = True
    _fields_ = [("frames", c_size)]


class _audio_info(Struct):
    anonymous_in_c = True
    _fields_ = [("transformer", uform_transformer_info_t), ("rate", c_size), ("mels", c_size), ("window", c_size),
                ("hop", c_size), ("patch_frames", c_size), ("max_patches", c_size), ("seconds", ctypes.c_double)]


class uform_model_info_t(Struct):
    c_name = "uform_model_info_t"
    _fields_ = [("dims", c_size), ("matryoshka", c_size * 16), ("matryoshka_count", c_size), ("parameters", c_size),
                ("bytes", c_size), ("has_text", ctypes.c_bool), ("has_image", ctypes.c_bool),
                ("has_video", ctypes.c_bool), ("has_audio", ctypes.c_bool), ("has_logit", ctypes.c_bool),
                ("text", _text_info), ("image", _image_info), ("video", _video_info), ("audio", _audio_info)]


class uform_encode_stats_t(Struct):
    c_name = "uform_encode_stats_t"
    _fields_ = [("items", c_size), ("failed", c_size), ("bytes", c_size), ("truncated", c_size),
                ("read_ns", ctypes.c_uint64), ("decode_ns", ctypes.c_uint64), ("compute_ns", ctypes.c_uint64),
                ("convert_ns", ctypes.c_uint64), ("total_ns", ctypes.c_uint64)]


class uform_encode_config_t(Struct):
    c_name = "uform_encode_config_t"
    _fields_ = [("outputs_scalar", c_status), ("matryoshka", c_size), ("progress", uform_progress_t),
                ("stats", ctypes.POINTER(uform_encode_stats_t))]


class uform_encoded_t(Struct):
    c_name = "uform_encoded_t"
    _fields_ = [("embeddings", uform_view_t), ("token_vectors", uform_view_t), ("states", uform_view_t),
                ("statuses", ctypes.POINTER(c_status)), ("items", c_size)]


class uform_text_encode_args_t(Struct):
    c_name = "uform_text_encode_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
                ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(uform_encode_config_t)),
                ("encoded", ctypes.POINTER(uform_encoded_t)), ("outcome", ctypes.c_void_p), ("texts", uform_tape_t)]


class uform_text_choose_args_t(Struct):
    c_name = "uform_text_choose_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("states", ctypes.POINTER(uform_view_t)),
                ("choices", uform_tape_t), ("arena", ctypes.c_void_p), ("progress", ctypes.POINTER(uform_progress_t)),
                ("probabilities", ctypes.POINTER(uform_view_t)), ("outcome", ctypes.c_void_p)]


class uform_model_load_args_t(Struct):
    c_name = "uform_model_load_args_t"
    _fields_ = [("executor", ctypes.c_void_p), ("path", ctypes.c_char_p), ("config", ctypes.c_void_p),
                ("model", ctypes.POINTER(ctypes.c_void_p)), ("outcome", ctypes.c_void_p)]


class uform_tiny_checkpoint_args_t(Struct):
    c_name = "uform_tiny_checkpoint_args_t"
    _fields_ = [("path", ctypes.c_char_p), ("seed", ctypes.c_uint64), ("depth", c_size), ("hidden", c_size), ("mlp", c_size),
                ("context", c_size), ("image_size", c_size), ("image_patch", c_size)]


MIRRORED = [uform_error_t, uform_progress_t, uform_outcome_t, uform_ram_options_t, uform_tape_t, uform_view_t,
            uform_transformer_info_t, uform_model_info_t, uform_encode_stats_t, uform_encode_config_t, uform_encoded_t,
            uform_text_encode_args_t, uform_text_choose_args_t, uform_model_load_args_t, uform_tiny_checkpoint_args_t]


def _layout_lines(mirrored, path="", base=0):
    """(C member designator, offset) of every field, descending into structs anonymous in C."""
    for name, kind in mirrored._fields_:
        offset = base + getattr(mirrored, name).offset
        designator = f"{path}{name}"
        yield designator, offset
        if isinstance(kind, type) and issubclass(kind, Struct) and kind.anonymous_in_c:
            yield from _layout_lines(kind, designator + ".", offset)


def probe_layouts(header: Path, workdir: Path) -> list:
    """Compiles a probe that prints sizeof, _Alignof and offsetof of every mirrored struct from the
    header itself, and answers the differences from the ctypes mirror (alignment of uform_outcome_t
    excepted: ctypes cannot express _Alignas, the Outcome class aligns by hand). Answers None when
    no C compiler is at hand."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler or not header.exists():
        return None
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "uform.h"', "int main(void) {"]
    expected = {}
    for mirrored in MIRRORED:
        lines.append(f'    printf("size {mirrored.c_name} %zu\\n", sizeof({mirrored.c_name}));')
        lines.append(f'    printf("align {mirrored.c_name} %zu\\n", _Alignof({mirrored.c_name}));')
        expected[f"size {mirrored.c_name}"] = ctypes.sizeof(mirrored)
        expected[f"align {mirrored.c_name}"] = OUTCOME_ALIGNMENT if mirrored is uform_outcome_t else ctypes.alignment(mirrored)
        for designator, offset in _layout_lines(mirrored):
            lines.append(f'    printf("offset {mirrored.c_name}.{designator} %zu\\n", offsetof({mirrored.c_name}, {designator}));')
            expected[f"offset {mirrored.c_name}.{designator}"] = offset
    lines += ["    return 0;", "}"]
    source, binary = workdir / "layout_probe.c", workdir / "layout_probe"
    source.write_text("\n".join(lines) + "\n")
    built = subprocess.run([compiler, "-std=gnu17", "-I", str(header.parent), "-o", str(binary), str(source)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        return [f"the layout probe does not compile against {header}:\n{built.stderr.strip()}"]
    output = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    differences = []
    for line in output.splitlines():
        key, value = line.rsplit(" ", 1)
        if expected.get(key) != int(value):
            differences.append(f"{key}: C {value}, ctypes {expected.get(key)}")
    return differences


class Outcome:
    """uform_outcome_t at a 64-byte-aligned address that never moves (ctypes has no _Alignas)."""

    def __init__(self, library):
        self._buffer = ctypes.create_string_buffer(OUTCOME_SIZE + OUTCOME_ALIGNMENT)
        address = ctypes.addressof(self._buffer)
        self.address = (address + OUTCOME_ALIGNMENT - 1) & ~(OUTCOME_ALIGNMENT - 1)
        self.pointer = ctypes.c_void_p(self.address)
        self._library = library
        library.uform_outcome_init(self.pointer)

    def destroy(self):
        if self._library is not None:
            self._library.uform_outcome_destroy(self.pointer)
            self._library = None


class EngineError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


def _tape(items: list) -> tuple:
    """A uform_tape_t over bytes objects, and the buffers that must outlive it."""
    joined = b"".join(items)
    data = ctypes.create_string_buffer(joined, len(joined) + 1)
    offsets = (c_size * (len(items) + 1))()
    position = 0
    for i, item in enumerate(items):
        offsets[i] = position
        position += len(item)
    offsets[len(items)] = position
    return uform_tape_t(ctypes.cast(data, ctypes.c_void_p), offsets, len(items), len(joined)), (data, offsets)


class Engine:
    """The C library through ctypes: just what the text checks and the benchmark need."""

    def __init__(self, path: str):
        self.library = library = ctypes.CDLL(path)
        void_p, status = ctypes.c_void_p, c_status
        signatures = {
            "uform_status_name": (ctypes.c_char_p, [status]),
            "uform_last_error": (uform_error_t, []),
            "uform_error_render": (c_size, [ctypes.POINTER(uform_error_t), ctypes.c_char_p, c_size]),
            "uform_outcome_init": (None, [void_p]),
            "uform_outcome_destroy": (None, [void_p]),
            "uform_outcome_status": (status, [void_p]),
            "uform_outcome_wait": (status, [void_p]),
            "uform_outcome_error": (uform_error_t, [void_p]),
            "uform_outcome_encoded": (status, [void_p, ctypes.POINTER(uform_encoded_t)]),
            "uform_outcome_probabilities": (status, [void_p, ctypes.POINTER(uform_view_t)]),
            "uform_ram_options_default": (uform_ram_options_t, []),
            "uform_executor_create_ram": (status, [ctypes.POINTER(uform_ram_options_t), ctypes.POINTER(void_p)]),
            "uform_executor_free": (None, [void_p]),
            "uform_arena_create": (status, [void_p, ctypes.POINTER(void_p)]),
            "uform_arena_create_host": (status, [ctypes.POINTER(void_p)]),
            "uform_arena_free": (None, [void_p]),
            "uform_arena_generation": (ctypes.c_uint64, [void_p]),
            "uform_view_check": (status, [ctypes.POINTER(uform_view_t)]),
            "uform_view_row": (status, [ctypes.POINTER(uform_view_t), c_size, ctypes.POINTER(void_p)]),
            "uform_model_load_ram": (status, [ctypes.POINTER(uform_model_load_args_t)]),
            "uform_model_free": (None, [void_p]),
            "uform_model_info": (status, [void_p, ctypes.POINTER(uform_model_info_t)]),
            "uform_text_encode": (status, [ctypes.POINTER(uform_text_encode_args_t)]),
            "uform_text_choose": (status, [ctypes.POINTER(uform_text_choose_args_t)]),
            "uform_tiny_checkpoint": (status, [ctypes.POINTER(uform_tiny_checkpoint_args_t)]),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes

    # -- errors -------------------------------------------------------------------------------

    def render(self, error: uform_error_t) -> str:
        buffer = ctypes.create_string_buffer(512)
        self.library.uform_error_render(ctypes.byref(error), buffer, len(buffer))
        return buffer.value.decode(errors="replace")

    def check(self, status: int, outcome: Outcome | None = None):
        if status != OK:
            error = self.library.uform_outcome_error(outcome.pointer) if outcome else self.library.uform_last_error()
            raise EngineError(status, f"{STATUS_NAMES.get(status, status)}: {self.render(error)}")

    # -- handles ------------------------------------------------------------------------------

    def tiny_checkpoint(self, path: str, seed: int, depth=0, hidden=0, mlp=0, context=0):
        args = uform_tiny_checkpoint_args_t(str(path).encode(), seed, depth, hidden, mlp, context)
        self.check(self.library.uform_tiny_checkpoint(ctypes.byref(args)))

    def load(self, path: str, executor=None) -> ctypes.c_void_p:
        model = ctypes.c_void_p()
        args = uform_model_load_args_t(executor, str(path).encode(), None, ctypes.pointer(model), None)
        self.check(self.library.uform_model_load_ram(ctypes.byref(args)))
        return model

    def info(self, model) -> uform_model_info_t:
        info = uform_model_info_t()
        self.check(self.library.uform_model_info(model, ctypes.byref(info)))
        return info

    def ram_executor(self, threads: int) -> ctypes.c_void_p:
        options = self.library.uform_ram_options_default()
        options.threads = threads
        executor = ctypes.c_void_p()
        self.check(self.library.uform_executor_create_ram(ctypes.byref(options), ctypes.byref(executor)))
        return executor

    def arena(self, executor=None) -> ctypes.c_void_p:
        arena = ctypes.c_void_p()
        if executor:
            self.check(self.library.uform_arena_create(executor, ctypes.byref(arena)))
        else:
            self.check(self.library.uform_arena_create_host(ctypes.byref(arena)))
        return arena

    # -- views --------------------------------------------------------------------------------

    def read_view(self, view: uform_view_t, arena) -> dict:
        """Copies a host view out of its arena: raw bytes of its rows, the values as float64 (I8 as
        the integers), scales and item offsets. Raises on a view that fails uform_view_check."""
        self.check(self.library.uform_view_check(ctypes.byref(view)))
        if view.device:
            raise EngineError(8, "a host view says it is on a device")
        if arena is not None and view.generation != self.library.uform_arena_generation(arena):
            raise EngineError(4, f"view generation {view.generation} is not its arena's")
        size = SCALAR_SIZES.get(view.scalar)
        if size is None:
            raise EngineError(4, f"view of unknown scalar {view.scalar}")
        rows, columns, stride = view.rows, view.columns, view.row_stride
        if rows and stride < columns * size:
            raise EngineError(4, f"row stride {stride} < {columns} x {size}")
        raw = np.zeros((rows, columns * size), np.uint8)
        if rows:
            first = ctypes.c_void_p()
            self.check(self.library.uform_view_row(ctypes.byref(view), 0, ctypes.byref(first)))
            if first.value != view.data:
                raise EngineError(4, "uform_view_row(0) is not view.data")
            everything = np.frombuffer(ctypes.string_at(view.data, rows * stride), np.uint8).reshape(rows, stride)
            raw = np.ascontiguousarray(everything[:, : columns * size])
        storage = {F32: np.float32, BF16: np.uint16, F16: np.float16, I8: np.int8}[view.scalar]
        typed = raw.view(storage).reshape(rows, columns)
        values = ref.bf16_bits_to_f32(typed) if view.scalar == BF16 else typed
        answer = {"scalar": view.scalar, "raw": raw.tobytes(), "values": np.asarray(values, np.float64),
                  "rows": rows, "columns": columns, "items": view.items, "scales": None, "offsets": None}
        if view.scalar == I8:
            answer["scales"] = np.ctypeslib.as_array(view.scales, (rows,)).astype(np.float64).copy() if rows else np.zeros(0)
            answer["raw"] += answer["scales"].astype(np.float32).tobytes()
        if view.item_offsets:
            answer["offsets"] = np.ctypeslib.as_array(view.item_offsets, (view.items + 1,)).copy()
            answer["raw"] += answer["offsets"].tobytes()
        return answer

    # -- verbs --------------------------------------------------------------------------------

    def _submit(self, verb, args, outcome: Outcome | None):
        status = verb(ctypes.byref(args))
        if outcome is None:
            self.check(status)
            return
        self.check(status, outcome)
        self.check(self.library.uform_outcome_wait(outcome.pointer), outcome)

    def encode(self, model, texts, outputs: int, arena, executor=None, scalar=F32, matryoshka=0,
               deferred=False, keep_views=False) -> dict:
        """Runs uform_text_encode and copies every produced view out. With `keep_views`, also
        answers the live uform_encoded_t (valid until `arena` is used again)."""
        tape, keep = _tape(list(texts))
        stats = uform_encode_stats_t()
        config = uform_encode_config_t(scalar, matryoshka, uform_progress_t(), ctypes.pointer(stats))
        encoded = uform_encoded_t()
        outcome = Outcome(self.library) if deferred else None
        args = uform_text_encode_args_t(model, executor, outputs, arena, ctypes.pointer(config),
                                        None if deferred else ctypes.pointer(encoded),
                                        outcome.pointer if outcome else None, tape)
        try:
            self._submit(self.library.uform_text_encode, args, outcome)
            if outcome is not None:
                self.check(self.library.uform_outcome_encoded(outcome.pointer, ctypes.byref(encoded)), outcome)
            result = {"stats": stats, "items": encoded.items}
            result["statuses"] = [encoded.statuses[i] for i in range(encoded.items)] if encoded.statuses else None
            for name in ("embeddings", "token_vectors", "states"):
                view = getattr(encoded, name)
                result[name] = self.read_view(view, arena) if view.data or view.rows else None
            if keep_views:
                result["encoded"] = encoded
            return result
        finally:
            del keep
            if outcome is not None:
                outcome.destroy()

    def choose(self, model, states: uform_view_t, choices, arena, executor=None, deferred=False) -> dict:
        tape, keep = _tape(list(choices))
        probabilities = uform_view_t()
        outcome = Outcome(self.library) if deferred else None
        args = uform_text_choose_args_t(model, executor, ctypes.pointer(states), tape, arena, None,
                                        None if deferred else ctypes.pointer(probabilities),
                                        outcome.pointer if outcome else None)
        try:
            self._submit(self.library.uform_text_choose, args, outcome)
            if outcome is not None:
                self.check(self.library.uform_outcome_probabilities(outcome.pointer, ctypes.byref(probabilities)), outcome)
            return self.read_view(probabilities, arena)
        finally:
            del keep
            if outcome is not None:
                outcome.destroy()


# ------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------

COSINE_MIN = 0.999
STATE_RELATIVE_L2_MAX = 1e-2
CHOOSE_SAME_STATES_ABS = 2e-3
CHOOSE_REFERENCE_STATES_ABS = 2e-2
CHOOSE_SUM_ABS = 1e-4
SCALE_RELATIVE = 1e-6


class Report:
    def __init__(self):
        self.failures = []

    def check(self, name: str, ok: bool, detail: str = ""):
        print(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failures.append(f"{name}: {detail}")
        return ok


def cosines(a, b):
    return ref._cosines(np.asarray(a, np.float64), np.asarray(b, np.float64))


def compare_rows(report, name, engine_rows, reference_rows, minimum=COSINE_MIN):
    engine_rows, reference_rows = np.atleast_2d(engine_rows), np.atleast_2d(reference_rows)
    if engine_rows.shape != reference_rows.shape:
        return report.check(name, False, f"shape {engine_rows.shape}, reference {reference_rows.shape}")
    if engine_rows.shape[0] == 0:
        return report.check(name, True, "no rows")
    c = cosines(engine_rows, reference_rows)
    worst = int(np.argmin(c))
    return report.check(name, c.min() >= minimum,
                        f"min cosine {c.min():.6f} (row {worst}, >= {minimum}), max abs {np.abs(engine_rows - reference_rows).max():.2e}")


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


def check_checkpoint(engine: Engine, report: Report, label: str, path: Path) -> None:
    print(f"\n== {label}: {path}", flush=True)
    model = engine.load(str(path))
    try:
        _check_model(engine, report, model, path)
    finally:
        engine.library.uform_model_free(model)


def _check_model(engine, report, model, path):
    reference = ref.Reference(str(path))
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

    host_arena = engine.arena()
    side_arena = engine.arena()
    executors = {}
    try:
        for threads in (1, 2):
            executors[threads] = engine.ram_executor(threads)
        arenas = {threads: engine.arena(executor) for threads, executor in executors.items()}
        try:
            _check_receivers(engine, report, model, texts, expected, tower, everything, host_arena, side_arena,
                             executors, arenas)
        finally:
            for arena in arenas.values():
                engine.library.uform_arena_free(arena)
    finally:
        for executor in executors.values():
            engine.library.uform_executor_free(executor)
        engine.library.uform_arena_free(side_arena)
        engine.library.uform_arena_free(host_arena)


def _check_receivers(engine, report, model, texts, expected, tower, everything, host_arena, side_arena, executors, arenas):
    receivers = [
        ("calling thread", None, host_arena, False),
        ("RAM executor, 1 thread", executors[1], arenas[1], False),
        ("RAM executor, 2 threads", executors[2], arenas[2], False),
        ("RAM executor, 2 threads, deferred", executors[2], arenas[2], True),
    ]

    # F32, every output, every receiver: bitwise identical.
    results = {}
    for name, executor, arena, deferred in receivers:
        try:
            results[name] = engine.encode(model, texts, everything, arena, executor, deferred=deferred)
        except EngineError as error:
            hint = " (the text tower is not built yet: this test fails until uform_text_encode works)" \
                if error.status == UNSUPPORTED else ""
            report.check(f"uform_text_encode on the {name}", False, f"{error}{hint}")
            return
    first_name, first = receivers[0][0], results[receivers[0][0]]
    for name, _, _, _ in receivers[1:]:
        same = all((first[k] is None and results[name][k] is None) or
                   (first[k] is not None and results[name][k] is not None and first[k]["raw"] == results[name][k]["raw"])
                   for k in ("embeddings", "token_vectors", "states"))
        report.check(f"{name} == {first_name}, bitwise", same)

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
        report.check("states vs reference, relative L2", relative.max() <= STATE_RELATIVE_L2_MAX,
                     f"max {relative.max():.2e} (item {int(np.argmax(relative))}, <= {STATE_RELATIVE_L2_MAX}), "
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


def sharpen_checkpoint(source: Path, target: Path, factor: int = 4) -> None:
    """Copies a checkpoint with the text tower's q and k rows (weights and biases) multiplied by
    `factor`, a power of two, so exact in BF16. The tool's weights (std 0.02) leave attention almost
    uniform, where a wrong rotary or attention scale moves embeddings by less than the tolerance;
    sharpened, those bugs drop the cosine below 0.9 while BF16 rounding stays near 5e-3 in states."""
    blob = bytearray(source.read_bytes())
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(bytes(blob[8 : 8 + length]))
    base = 8 + length
    hidden = int(json.loads(header["__metadata__"]["uform"])["text"]["hidden"])
    for name, info in header.items():
        if not re.fullmatch(r"text\.blocks\.\d+\.attn\.qkv\.(weight|bias)", name):
            continue
        if info["dtype"] != "BF16":
            raise ValueError(f"{source}: {name} is {info['dtype']}, expected BF16")
        begin, end = info["data_offsets"]
        bits = np.frombuffer(bytes(blob[base + begin : base + end]), np.uint16)
        values = ref.bf16_bits_to_f32(bits).reshape(info["shape"]).copy()
        values[: 2 * hidden] *= factor  # rows of q, then k
        scaled = ref.f32_to_bf16_bits(values.reshape(-1))
        if not np.array_equal(ref.bf16_bits_to_f32(scaled), values.reshape(-1)):
            raise ValueError(f"{name}: scaling by {factor} is not exact")
        blob[base + begin : base + end] = scaled.tobytes()
    target.write_bytes(bytes(blob))


def check_reference_alone(report: Report, paths: list) -> None:
    print("\n== the reference on its own", flush=True)
    failures = ref.self_check(verbose=True)
    report.failures += [f"reference self-check: {f}" for f in failures]
    try:
        from safetensors.numpy import load_file  # optional cross-check of the parser
    except ImportError:
        print("  --   safetensors not importable: the parser is not cross-checked")
        return
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", required=True, help="libuform.so")
    parser.add_argument("--tiny-checkpoint-tool", required=True, help="the uform_tiny_checkpoint executable")
    parser.add_argument("--workdir", default=None, help="where checkpoints and the layout probe go (default: a temporary folder)")
    parser.add_argument("--header", default=str(REPOSITORY / "include" / "uform.h"), help="uform.h, for the layout probe")
    args = parser.parse_args(argv)

    _preload_sanitizer(args.library)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="uform-reference-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report()

    print("== ctypes layouts", flush=True)
    report.check("sizeof(uform_outcome_t) == 512", ctypes.sizeof(uform_outcome_t) == OUTCOME_SIZE)
    differences = probe_layouts(Path(args.header), workdir)
    if differences is None:
        print("  --   no C compiler: struct layouts are not checked against the header")
    else:
        report.check(f"every mirrored struct's size, alignment and offsets match {Path(args.header).name}",
                     not differences, "\n       ".join([""] + differences))

    checkpoints = [("tiny default", workdir / "text-reference-tiny.safetensors", ["--seed", "1"]),
                   ("depth 4, hidden 256", workdir / "text-reference-256.safetensors",
                    ["--seed", "2", "--depth", "4", "--hidden", "256"])]
    for label, path, flags in checkpoints:
        written = subprocess.run([args.tiny_checkpoint_tool, str(path), *flags], capture_output=True, text=True)
        if written.returncode != 0:
            print(f"FAIL: {args.tiny_checkpoint_tool} {path} {' '.join(flags)}: {written.stdout}{written.stderr}")
            return 1
    sharp = workdir / "text-reference-256-sharp.safetensors"
    sharpen_checkpoint(checkpoints[1][1], sharp)
    checkpoints.append(("depth 4, hidden 256, q and k x4 (sharp attention)", sharp, []))

    check_reference_alone(report, [path for _, path, _ in checkpoints[:2]])

    try:
        engine = Engine(args.library)
    except (OSError, AttributeError) as error:
        print(f"FAIL: cannot load {args.library} through ctypes: {error}")
        return 1
    outcome = Outcome(engine.library)
    report.check("outcome buffer is 64-byte aligned", outcome.address % OUTCOME_ALIGNMENT == 0)
    outcome.destroy()
    if not differences:
        for label, path, _ in checkpoints:
            try:
                check_checkpoint(engine, report, label, path)
            except EngineError as error:
                report.check(f"{label}", False, str(error))
    else:
        print("\nthe ctypes mirror does not match uform.h: the engine is not called")

    print()
    if report.failures:
        print(f"FAILED: {len(report.failures)} check(s):")
        for failure in report.failures:
            print(f"  - {failure}")
        return 1
    print("passed")
    return 0


if __name__ == "__main__":
    _interpreter_with_torch()
    import numpy as np

    sys.path.insert(0, str(HERE))
    import uform_reference as ref

    sys.exit(main())
else:  # imported by bench/bench_text.py
    import numpy as np

    sys.path.insert(0, str(HERE))
    import uform_reference as ref
