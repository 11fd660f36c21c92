"""The C engine through ctypes, and what the reference tests (test_*_reference.py) and the benchmarks
(bench/) share: a mirror of include/uform.h checked against it by a compiled probe, an Engine with every
encode verb and text_choose, the report of checks, row comparisons, receivers, checkpoints written by the
tiny checkpoint tool and sharpened, and the command line every reference test takes.

Import it after interpreter.run_under_python_with(...): it imports numpy and the PyTorch reference.
"""

from __future__ import annotations

import argparse
import contextlib
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

import numpy as np

import uform_reference as ref
from interpreter import REPOSITORY

def preload_sanitizer(library: str) -> None:
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
OK, PENDING, INVALID_ARGUMENT, IO, FORMAT, UNSUPPORTED = 0, 1, 4, 5, 6, 9
OUTPUT_EMBEDDINGS, OUTPUT_TOKEN_VECTORS, OUTPUT_STATES = 1, 2, 4
EVERYTHING = OUTPUT_EMBEDDINGS | OUTPUT_TOKEN_VECTORS | OUTPUT_STATES
SOURCE_FILES, SOURCE_MEMORY = 0, 1
F32, BF16, F16, I8 = 0, 1, 2, 3
SCALAR_NAMES = {F32: "F32", BF16: "BF16", F16: "F16", I8: "I8"}
SCALAR_SIZES = {F32: 4, BF16: 2, F16: 2, I8: 1}
OUTCOME_SIZE, OUTCOME_ALIGNMENT = 768, 64


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
    _fields_ = [("depth", c_size), ("hidden", c_size), ("heads", c_size), ("mlp", c_size), ("head", c_size),
                ("norm", ctypes.c_int), ("norm_eps", ctypes.c_float), ("post_norm", ctypes.c_bool),
                ("input_norm", ctypes.c_bool), ("final_norm", ctypes.c_bool), ("activation", ctypes.c_int),
                ("rotary", ctypes.c_bool), ("causal", ctypes.c_bool), ("pooling", ctypes.c_int),
                ("projection", ctypes.c_bool), ("projection_bias", ctypes.c_bool), ("class_token", ctypes.c_bool),
                ("registers", c_size), ("relative_buckets", c_size),
                ("projection_tanh", ctypes.c_bool)]


class _text_info(Struct):
    anonymous_in_c = True
    _fields_ = [("transformer", uform_transformer_info_t), ("context", c_size), ("vocab", c_size),
                ("positions", c_size), ("position_offset", c_size), ("token_type", ctypes.c_bool),
                ("cut_ids", ctypes.c_bool), ("padded", ctypes.c_bool), ("pad_id", c_size), ("strip", ctypes.c_bool)]


class _image_info(Struct):
    anonymous_in_c = True
    _fields_ = [("transformer", uform_transformer_info_t), ("size", c_size), ("patch", c_size),
                ("mean", ctypes.c_float * 3), ("std", ctypes.c_float * 3), ("resize", ctypes.c_int),
                ("resample", ctypes.c_int)]


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
                ("text", _text_info), ("image", _image_info), ("video", _video_info), ("audio", _audio_info),
                ("weights", ctypes.c_int), ("family", ctypes.c_char * 16), ("normalized", ctypes.c_bool)]


class uform_encode_stats_t(Struct):
    c_name = "uform_encode_stats_t"
    _fields_ = [("items", c_size), ("failed", c_size), ("bytes", c_size), ("truncated", c_size),
                ("read_ns", ctypes.c_uint64), ("decode_ns", ctypes.c_uint64), ("compute_ns", ctypes.c_uint64),
                ("convert_ns", ctypes.c_uint64), ("total_ns", ctypes.c_uint64)]


class uform_encode_config_t(Struct):
    c_name = "uform_encode_config_t"
    _fields_ = [("outputs_scalar", c_status), ("matryoshka", c_size), ("progress", uform_progress_t),
                ("stats", ctypes.POINTER(uform_encode_stats_t)), ("normalize", ctypes.c_bool),
                ("prompt", ctypes.c_char_p), ("prompt_name", ctypes.c_char_p)]


class uform_encoded_t(Struct):
    c_name = "uform_encoded_t"
    _fields_ = [("embeddings", uform_view_t), ("token_vectors", uform_view_t), ("states", uform_view_t),
                ("statuses", ctypes.POINTER(c_status)), ("items", c_size), ("token_spans", uform_view_t)]


def _encode_args(c_name: str, *tail) -> type:
    """The arguments of an encode verb: the fields every one starts with, then its own `tail`."""
    fields = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("outputs", c_status),
              ("arena", ctypes.c_void_p), ("config", ctypes.POINTER(uform_encode_config_t)),
              ("encoded", ctypes.POINTER(uform_encoded_t)), ("outcome", ctypes.c_void_p)]
    return type(c_name, (Struct,), {"c_name": c_name, "_fields_": fields + list(tail)})


uform_text_encode_args_t = _encode_args("uform_text_encode_args_t", ("texts", uform_tape_t))
uform_image_encode_args_t = _encode_args("uform_image_encode_args_t", ("images", uform_tape_t), ("source", c_status))
uform_image_encode_pixels_args_t = _encode_args("uform_image_encode_pixels_args_t", ("pixels", uform_tape_t),
                                                ("heights", ctypes.POINTER(c_size)), ("widths", ctypes.POINTER(c_size)))
uform_audio_encode_args_t = _encode_args("uform_audio_encode_args_t", ("sounds", uform_tape_t), ("source", c_status))
uform_audio_encode_samples_args_t = _encode_args("uform_audio_encode_samples_args_t", ("samples", uform_tape_t),
                                                 ("rate", c_size))
uform_video_encode_args_t = _encode_args("uform_video_encode_args_t", ("videos", uform_tape_t), ("source", c_status))


class uform_text_choose_args_t(Struct):
    c_name = "uform_text_choose_args_t"
    _fields_ = [("model", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("states", ctypes.POINTER(uform_view_t)),
                ("choices", uform_tape_t), ("arena", ctypes.c_void_p), ("progress", ctypes.POINTER(uform_progress_t)),
                ("probabilities", ctypes.POINTER(uform_view_t)), ("outcome", ctypes.c_void_p)]


class uform_model_load_args_t(Struct):
    c_name = "uform_model_load_args_t"
    _fields_ = [("executor", ctypes.c_void_p), ("path", ctypes.c_char_p), ("config", ctypes.c_void_p),
                ("model", ctypes.POINTER(ctypes.c_void_p)), ("outcome", ctypes.c_void_p)]


class uform_load_config_t(Struct):
    c_name = "uform_load_config_t"
    _fields_ = [("progress", uform_progress_t), ("map", ctypes.c_bool), ("weights", c_status)]


WEIGHTS = {"stored": 0, "bf16": 1, "i8": 2}  # uform_weights_t


class uform_tiny_checkpoint_args_t(Struct):
    c_name = "uform_tiny_checkpoint_args_t"
    _fields_ = [("path", ctypes.c_char_p), ("seed", ctypes.c_uint64), ("depth", c_size), ("hidden", c_size), ("mlp", c_size),
                ("context", c_size), ("image_size", c_size), ("image_patch", c_size)]


MIRRORED = [uform_error_t, uform_progress_t, uform_outcome_t, uform_ram_options_t, uform_tape_t, uform_view_t,
            uform_transformer_info_t, uform_model_info_t, uform_encode_stats_t, uform_encode_config_t, uform_encoded_t,
            uform_text_encode_args_t, uform_text_choose_args_t, uform_load_config_t, uform_model_load_args_t,
            uform_tiny_checkpoint_args_t,
            uform_image_encode_args_t, uform_image_encode_pixels_args_t, uform_audio_encode_args_t,
            uform_audio_encode_samples_args_t, uform_video_encode_args_t]


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


def _offsets(items: list):
    """The offsets of items laid end to end (items + 1 of them, in the items' own units)."""
    offsets = (c_size * (len(items) + 1))()
    for i, item in enumerate(items):
        offsets[i + 1] = offsets[i] + len(item)
    return offsets


def _tape(items: list) -> tuple:
    """A uform_tape_t over bytes objects, and the buffers that must outlive it."""
    joined = b"".join(items)
    data = ctypes.create_string_buffer(joined, len(joined) + 1)
    offsets = _offsets(items)
    return uform_tape_t(ctypes.cast(data, ctypes.c_void_p), offsets, len(items), len(joined)), (data, offsets)


def _samples_tape(clips: list) -> tuple:
    """A uform_tape_t of float32 samples (offsets in samples), and the buffers that must outlive it."""
    joined = np.ascontiguousarray(np.concatenate([np.asarray(c, np.float32) for c in clips] + [np.zeros(1, np.float32)]))
    offsets = _offsets(clips)
    return uform_tape_t(joined.ctypes.data_as(ctypes.c_void_p), offsets, len(clips), offsets[len(clips)]), (joined, offsets)


def _encoded_tape(items: list, kind: str) -> tuple:
    """A tape of paths (`kind` "files") or encoded bytes ("memory"), its keep-alive and its source."""
    if kind == "files":
        return (*_tape([str(path).encode() for path in items]), SOURCE_FILES)
    return (*_tape([bytes(item) for item in items]), SOURCE_MEMORY)


class Engine:
    """The C library through ctypes: every encode verb, text_choose, and what the checks and the
    benchmarks need around them."""

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
            "uform_image_encode": (status, [ctypes.POINTER(uform_image_encode_args_t)]),
            "uform_image_encode_pixels": (status, [ctypes.POINTER(uform_image_encode_pixels_args_t)]),
            "uform_audio_encode": (status, [ctypes.POINTER(uform_audio_encode_args_t)]),
            "uform_audio_encode_samples": (status, [ctypes.POINTER(uform_audio_encode_samples_args_t)]),
            "uform_video_encode": (status, [ctypes.POINTER(uform_video_encode_args_t)]),
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

    def load(self, path: str, executor=None, weights: str = "stored") -> ctypes.c_void_p:
        """`weights`: "stored", "bf16" or "i8" (uform_weights_t)."""
        model = ctypes.c_void_p()
        config = uform_load_config_t(weights=WEIGHTS[weights])
        args = uform_model_load_args_t(executor, str(path).encode(), ctypes.cast(ctypes.pointer(config), ctypes.c_void_p),
                                       ctypes.pointer(model), None)
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

    def _encode(self, verb, args_type, tape, extra: tuple, model, outputs, arena, executor, scalar, matryoshka,
                deferred, keep_views=False) -> dict:
        """Runs one encode verb (its arguments `args_type`: the common fields, the tape, then `extra`) and
        copies every produced view out. With `keep_views`, also answers the live uform_encoded_t (valid
        until `arena` is used again)."""
        stats = uform_encode_stats_t()
        config = uform_encode_config_t(scalar, matryoshka, uform_progress_t(), ctypes.pointer(stats))
        encoded = uform_encoded_t()
        outcome = Outcome(self.library) if deferred else None
        args = args_type(model, executor, outputs, arena, ctypes.pointer(config),
                         None if deferred else ctypes.pointer(encoded), outcome.pointer if outcome else None,
                         tape, *extra)
        try:
            self._submit(verb, args, outcome)
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
            if outcome is not None:
                outcome.destroy()

    def encode(self, model, texts, outputs: int, arena, executor=None, scalar=F32, matryoshka=0,
               deferred=False, keep_views=False) -> dict:
        """uform_text_encode of `texts` (bytes)."""
        tape, keep = _tape(list(texts))
        result = self._encode(self.library.uform_text_encode, uform_text_encode_args_t, tape, (), model, outputs,
                              arena, executor, scalar, matryoshka, deferred, keep_views)
        del keep
        return result

    def encode_images(self, model, items, arena, kind="pixels", outputs=EVERYTHING, executor=None, scalar=F32,
                      matryoshka=0, deferred=False) -> dict:
        """`kind` "pixels": items are uint8 arrays [height, width, 3] (or (bytes, height, width) for a
        deliberately wrong span), through uform_image_encode_pixels; "files": paths; "memory": encoded
        bytes, through uform_image_encode."""
        if kind != "pixels":
            tape, keep, source = _encoded_tape(items, kind)
            return self._encode(self.library.uform_image_encode, uform_image_encode_args_t, tape, (source,), model,
                                outputs, arena, executor, scalar, matryoshka, deferred)
        blobs, shapes = [], []
        for item in items:
            if isinstance(item, tuple):
                blobs.append(item[0])
                shapes.append(item[1:])
            else:
                blobs.append(np.ascontiguousarray(item, dtype=np.uint8).tobytes())
                shapes.append(item.shape[:2])
        heights = (c_size * len(items))(*[h for h, _ in shapes])
        widths = (c_size * len(items))(*[w for _, w in shapes])
        tape, keep = _tape(blobs)
        return self._encode(self.library.uform_image_encode_pixels, uform_image_encode_pixels_args_t, tape,
                            (heights, widths), model, outputs, arena, executor, scalar, matryoshka, deferred)

    def encode_sounds(self, model, items, arena, kind="samples", rate=0, outputs=EVERYTHING, executor=None,
                      scalar=F32, matryoshka=0, deferred=False) -> dict:
        """`kind` "samples": items are float arrays at `rate`, through uform_audio_encode_samples;
        "files": paths; "memory": encoded bytes, through uform_audio_encode."""
        if kind != "samples":
            tape, keep, source = _encoded_tape(items, kind)
            return self._encode(self.library.uform_audio_encode, uform_audio_encode_args_t, tape, (source,), model,
                                outputs, arena, executor, scalar, matryoshka, deferred)
        tape, keep = _samples_tape(items)
        return self._encode(self.library.uform_audio_encode_samples, uform_audio_encode_samples_args_t, tape,
                            (rate,), model, outputs, arena, executor, scalar, matryoshka, deferred)

    def encode_videos(self, model, items, arena, kind="memory", outputs=EVERYTHING, executor=None, scalar=F32,
                      matryoshka=0, deferred=False) -> dict:
        """uform_video_encode of paths (`kind` "files") or encoded clips ("memory")."""
        tape, keep, source = _encoded_tape(items, kind)
        return self._encode(self.library.uform_video_encode, uform_video_encode_args_t, tape, (source,), model,
                            outputs, arena, executor, scalar, matryoshka, deferred)

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

COSINE_MIN = 0.999  # embeddings and token vectors, per row
STATE_RELATIVE_L2_MAX = 1e-2  # states, per row (BF16 keeps 8 bits: 2^-8 = 3.9e-3 per rounding)
I8_COSINE_MIN = 0.99  # embeddings with I8 weights against the same model's without, per row
# States with I8 weights, per row: an activation within a rounding's width of a step's edge lands on
# either side in two implementations that differ only in float rounding, and the step moves the state:
# the reference's own float32 and float64 runs differ by up to 1.7e-2 on the sharp checkpoints (without
# I8, 1e-6), the engine and the reference by up to 2.7e-2 (x86-64, avx512bf16).
I8_STATE_RELATIVE_L2_MAX = 5e-2


def states_max(tower) -> float:
    """The states' tolerance for a reference tower: wider for one with I8 weights (quantize_blocks)."""
    return I8_STATE_RELATIVE_L2_MAX if getattr(tower, "i8", False) else STATE_RELATIVE_L2_MAX


Report = ref.Report  # named checks, printed as they run


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


def compare_states(report, name, got, want, maximum=STATE_RELATIVE_L2_MAX):
    """States: relative L2 error per row within `maximum`."""
    relative = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    return report.check(name, relative.max() <= maximum,
                        f"max {relative.max():.2e} (item {int(np.argmax(relative))}, <= {maximum})")


def compare_encodings(report, label, result, expected, keep=None, states_maximum=STATE_RELATIVE_L2_MAX):
    """Engine views (F32) against a reference encoding (embeddings, stacked token vectors, states), on the
    items `keep` (None: all)."""
    keep = slice(None) if keep is None else keep
    compare_rows(report, f"{label}: embeddings vs reference", result["embeddings"]["values"][keep],
                 expected.embeddings[keep])
    compare_rows(report, f"{label}: token vectors vs reference", result["token_vectors"]["values"],
                 expected.stacked_token_vectors())
    compare_states(report, f"{label}: states vs reference, relative L2", result["states"]["values"][keep],
                   expected.states[keep], states_maximum)


def same_bitwise(a: dict, b: dict) -> bool:
    """Two encodings' views are the same bytes (or both missing)."""
    return all((a[k] is None and b[k] is None) or (a[k] is not None and b[k] is not None and a[k]["raw"] == b[k]["raw"])
               for k in ("embeddings", "token_vectors", "states"))


def receivers(host_arena, executors: dict, arenas: dict) -> list:
    """(name, executor, arena, deferred) of every receiver the checks compare."""
    return [("calling thread", None, host_arena, False),
            ("RAM executor, 1 thread", executors[1], arenas[1], False),
            ("RAM executor, 2 threads", executors[2], arenas[2], False),
            ("RAM executor, 2 threads, deferred", executors[2], arenas[2], True)]


def encode_on_receivers(report, label: str, encode, every: list, hint: str = ""):
    """Runs `encode(executor, arena, deferred)` on every receiver and checks each answer equals the
    calling thread's, bitwise. Answers the calling thread's, or None when a call failed (`hint` is
    added for an UNSUPPORTED one)."""
    results = {}
    for name, executor, arena, deferred in every:
        try:
            results[name] = encode(executor, arena, deferred)
        except EngineError as error:
            report.check(f"{label} on the {name}", False, f"{error}{hint if error.status == UNSUPPORTED else ''}")
            return None
    first_name, first = every[0][0], results[every[0][0]]
    for name, _, _, _ in every[1:]:
        report.check(f"{label}: {name} == {first_name}, bitwise", same_bitwise(first, results[name]))
    return first


def check_bf16_outputs(report, label: str, converted: dict, f32: dict) -> None:
    """Every output of `converted` (BF16) is the F32 output rounded to nearest even."""
    for output in ("embeddings", "token_vectors", "states"):
        got = converted[output]["values"].astype(np.float32)
        want = ref.to_bf16(f32[output]["values"].astype(np.float32))
        report.check(f"{label}: BF16 {output} == F32 rounded", np.array_equal(got, want),
                     f"{100 * np.mean(got == want):.2f}% equal")


@contextlib.contextmanager
def loaded(engine: Engine, path: Path, executor=None, weights: str = "stored"):
    """A model loaded into RAM (`weights` as Engine.load takes them), freed on leaving."""
    model = engine.load(str(path), executor, weights)
    try:
        yield model
    finally:
        engine.library.uform_model_free(model)


@contextlib.contextmanager
def executors_and_arenas(engine: Engine):
    """RAM executors of 1 and 2 threads and an arena on each, and a host arena ("host"), freed on leaving."""
    executors, arenas = {}, {"host": engine.arena()}
    try:
        for threads in (1, 2):
            executors[threads] = engine.ram_executor(threads)
            arenas[threads] = engine.arena(executors[threads])
        yield executors, arenas
    finally:
        for arena in arenas.values():
            engine.library.uform_arena_free(arena)
        for executor in executors.values():
            engine.library.uform_executor_free(executor)


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------


def write_checkpoints(tool: str, checkpoints: list) -> bool:
    """Writes each (label, path, flags) with the tiny checkpoint tool; prints what failed."""
    for _, path, flags in checkpoints:
        written = subprocess.run([tool, str(path), *flags], capture_output=True, text=True)
        if written.returncode != 0:
            print(f"FAIL: {tool} {path} {' '.join(flags)}: {written.stdout}{written.stderr}")
            return False
    return True


def sharpen_checkpoint(source: Path, target: Path, tower: str, factor: int = 4) -> None:
    """Copies a checkpoint with `tower`'s q and k rows (weights and biases) multiplied by `factor`, a
    power of two, so exact in BF16. The tool's weights (std 0.02) leave attention almost uniform, where
    a wrong rotary or attention scale, or attention that leaks between items, moves embeddings by less
    than the tolerance; sharpened, those bugs drop the cosine below 0.9 while BF16 rounding stays near
    5e-3 in states."""
    blob = bytearray(source.read_bytes())
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(bytes(blob[8 : 8 + length]))
    base = 8 + length
    hidden = int(json.loads(header["__metadata__"]["uform"])[tower]["hidden"])
    for name, info in header.items():
        if not re.fullmatch(rf"{tower}\.blocks\.\d+\.attn\.qkv\.(weight|bias)", name):
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


def write_standard_checkpoints(tool: str, workdir: Path, prefix: str, tower: str, seeds=(1, 2)):
    """The tool's tiny default, depth 4 hidden 256, and the latter with `tower`'s attention sharpened:
    (label, path) of each, or None with what failed printed."""
    checkpoints = [("tiny default", workdir / f"{prefix}-reference-tiny.safetensors", ["--seed", str(seeds[0])]),
                   ("depth 4, hidden 256", workdir / f"{prefix}-reference-256.safetensors",
                    ["--seed", str(seeds[1]), "--depth", "4", "--hidden", "256"])]
    if not write_checkpoints(tool, checkpoints):
        return None
    sharp = workdir / f"{prefix}-reference-256-sharp.safetensors"
    sharpen_checkpoint(checkpoints[1][1], sharp, tower)
    checkpoints.append((f"depth 4, hidden 256, {tower} q and k x4 (sharp attention)", sharp, []))
    return [(label, path) for label, path, _ in checkpoints]


def with_i8_weights(checkpoints: list) -> list:
    """The checkpoints again, each labelled as loaded with I8 weights (uform_weights_t UFORM_WEIGHTS_I8)."""
    return [(f"{label}, I8 weights", path) for label, path in checkpoints]


def check_each(report: Report, checkpoints: list, check, hint: str = "") -> None:
    """`check(label, path)` of every checkpoint; an engine error fails that checkpoint (`hint` added for
    an UNSUPPORTED one) and the next one runs."""
    for label, path in checkpoints:
        try:
            check(label, path)
        except EngineError as error:
            report.check(label, False, f"{error}{hint if error.status == UNSUPPORTED else ''}")


# ------------------------------------------------------------------------------------------------
# The command line of every reference test
# ------------------------------------------------------------------------------------------------


def parse_arguments(description: str, argv=None, extra=()) -> argparse.Namespace:
    """--library, --tiny-checkpoint-tool, --workdir, --header, and each (flags, options) of `extra`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", required=True, help="libuform.so")
    parser.add_argument("--tiny-checkpoint-tool", required=True, help="the uform_tiny_checkpoint executable")
    for flags, options in extra:
        parser.add_argument(*flags, **options)
    parser.add_argument("--workdir", default=None, help="where checkpoints and inputs go (default: a temporary folder)")
    parser.add_argument("--header", default=str(REPOSITORY / "include" / "uform.h"), help="uform.h, for the layout probe")
    return parser.parse_args(argv)


def open_workdir(args: argparse.Namespace, prefix: str) -> Path:
    """Re-runs under the ASan runtime where the library needs it, then makes the work folder."""
    preload_sanitizer(args.library)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"uform-{prefix}-reference-"))
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def check_layouts(report: Report, header: str, workdir: Path) -> bool:
    """The ctypes mirror against the header; answers whether the engine may be called."""
    print("== ctypes layouts", flush=True)
    report.check(f"sizeof(uform_outcome_t) == {OUTCOME_SIZE}", ctypes.sizeof(uform_outcome_t) == OUTCOME_SIZE)
    differences = probe_layouts(Path(header), workdir)
    if differences is None:
        print("  --   no C compiler: struct layouts are not checked against the header")
        return True
    report.check(f"every mirrored struct's size, alignment and offsets match {Path(header).name}",
                 not differences, "\n       ".join([""] + differences))
    if differences:
        print("\nthe ctypes mirror does not match uform.h: the engine is not called")
    return not differences


def open_engine(library: str):
    """The Engine, or None with the reason printed."""
    try:
        return Engine(library)
    except (OSError, AttributeError) as error:
        print(f"FAIL: cannot load {library} through ctypes: {error}")
        return None


def summary(report: Report) -> int:
    """Prints the failures, if any; answers the exit status."""
    print()
    if report.failures:
        print(f"FAILED: {len(report.failures)} check(s):")
        for failure in report.failures:
            print(f"  - {failure}")
        return 1
    print("passed")
    return 0
