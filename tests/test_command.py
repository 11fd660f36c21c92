#!/usr/bin/env python3
"""Drives the real `uform` command: checkpoint tiny, info, encode in every format, scalar and width,
bad flags and bad paths, and the default model.

    test_command.py --uform build/src/tools/uform --workdir build/tests/command

The standard library only; the .npy file is also loaded with NumPy where it imports."""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

TEXTS = ["a cat", "a dog"]


def run(uform, *arguments, stdin=None, env=None, expect=0):
    """Runs the command and answers (stdout bytes, stderr text), checking its exit status."""
    done = subprocess.run([uform, *arguments], input=stdin, capture_output=True, env=env, timeout=120)
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != expect:
        command = " ".join(arguments)
        raise AssertionError(f"uform {command}: exit {done.returncode}, expected {expect}\n{stderr}")
    return done.stdout, stderr


def rows_of(jsonl):
    rows = [json.loads(line) for line in jsonl.decode().splitlines()]
    assert [row["index"] for row in rows] == list(range(len(rows))), rows
    return rows


def as_f32(values):
    """Python floats rounded to F32: %.9g text reads back to the very F32 it was printed from."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


def assert_unit(vector, width):
    assert len(vector) == width, (len(vector), width)
    norm = math.sqrt(sum(value * value for value in vector))
    assert abs(norm - 1) < 1e-3, norm


def read_npy(path):
    """The header and the raw rows of a format 1.0 .npy file, parsed without NumPy."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"\x93NUMPY\x01\x00", data[:8]
    (length,) = struct.unpack("<H", data[8:10])
    assert (10 + length) % 64 == 0, length
    header = eval(data[10 : 10 + length].decode("latin1"), {}, {})  # a Python dict literal, by the format
    return header, data[10 + length :]


def check_checkpoint_and_info(uform, workdir):
    model = os.path.join(workdir, "tiny.safetensors")
    run(uform, "checkpoint", "tiny", model, "--seed", "7")
    info = json.loads(run(uform, "info", "--model", model, "--json")[0])
    assert info["dims"] == 64, info
    assert sorted(info["towers"]) == ["audio", "image", "text", "video"], info
    assert info["matryoshka"][-1] == 64 and 32 in info["matryoshka"], info
    assert info["towers"]["text"]["hidden"] == 64 and info["parameters"] > 0, info
    text, _ = run(uform, "info", "--model", model)
    assert b"matryoshka" in text and b"text" in text, text
    return model


def check_encode(uform, model, workdir):
    rows = rows_of(run(uform, "encode", "--model", model, *TEXTS)[0])
    assert len(rows) == 2
    for row in rows:
        assert_unit(row["embedding"], 64)
    reference = [row["embedding"] for row in rows]

    # The same texts as lines of standard input, and as a manifest.
    piped = rows_of(run(uform, "encode", "--model", model, stdin="\n".join(TEXTS).encode() + b"\n")[0])
    assert [row["embedding"] for row in piped] == reference
    crlf = rows_of(run(uform, "encode", "--model", model, stdin=b"a cat\r\na dog")[0])
    assert [row["embedding"] for row in crlf] == reference
    manifest = os.path.join(workdir, "manifest.jsonl")
    with open(manifest, "w") as file:
        file.write("".join(json.dumps({"text": text, "id": i}) + "\n\n" for i, text in enumerate(TEXTS)))
    listed = rows_of(run(uform, "encode", "--model", model, "--manifest", manifest)[0])
    assert [row["embedding"] for row in listed] == reference

    # Raw F32 rows are the JSONL values, bit for bit.
    raw = os.path.join(workdir, "rows.f32")
    run(uform, "encode", "--model", model, "--format", "f32", "--output", raw, *TEXTS)
    with open(raw, "rb") as file:
        data = file.read()
    assert len(data) == 2 * 64 * 4, len(data)
    values = struct.unpack("<128f", data)
    assert [list(values[:64]), list(values[64:])] == [as_f32(vector) for vector in reference]
    piped_raw = run(uform, "encode", "--model", model, "--format", "f32", *TEXTS)[0]
    assert piped_raw == data

    # .npy, patched in a file and held for a pipe: the same bytes either way.
    npy = os.path.join(workdir, "rows.npy")
    run(uform, "encode", "--model", model, "--format", "npy", "--output", npy, *TEXTS)
    header, body = read_npy(npy)
    assert header == {"descr": "<f4", "fortran_order": False, "shape": (2, 64)}, header
    assert body == data
    with open(npy, "rb") as file:
        assert run(uform, "encode", "--model", model, "--format", "npy", *TEXTS)[0] == file.read()
    try:
        import numpy
    except ImportError:
        print("numpy does not import: the .npy file is checked by its header and bytes only")
    else:
        array = numpy.load(npy)
        assert array.shape == (2, 64) and array.dtype == numpy.float32
        assert array.tolist() == [list(values[:64]), list(values[64:])]
    for scalar, description, size in (("bf16", "<u2", 2), ("f16", "<f2", 2), ("i8", "|i1", 1)):
        run(uform, "encode", "--model", model, "--format", "npy", "--scalar", scalar, "--output", npy, *TEXTS)
        header, body = read_npy(npy)
        assert header["descr"] == description and header["shape"] == (2, 64), header
        assert len(body) == 2 * 64 * size
    empty = os.path.join(workdir, "empty.npy")
    run(uform, "encode", "--model", model, "--format", "npy", "--output", empty, stdin=b"")
    assert read_npy(empty) == ({"descr": "<f4", "fortran_order": False, "shape": (0, 64)}, b"")

    # A matryoshka width.
    narrow = rows_of(run(uform, "encode", "--model", model, "--dims", "32", *TEXTS)[0])
    for row in narrow:
        assert_unit(row["embedding"], 32)

    # I8 rows dequantize to the F32 ones; BF16 and F16 round them.
    quantized = rows_of(run(uform, "encode", "--model", model, "--scalar", "i8", *TEXTS)[0])
    for row, floats in zip(quantized, reference):
        assert all(isinstance(q, int) and -127 <= q <= 127 for q in row["embedding"])
        error = max(abs(q * row["scale"] - value) for q, value in zip(row["embedding"], floats))
        assert error <= 1 / 127, error
    for scalar, tolerance in (("bf16", 1 / 128), ("f16", 1 / 1024)):
        halves = rows_of(run(uform, "encode", "--model", model, "--scalar", scalar, *TEXTS)[0])
        for row, floats in zip(halves, reference):
            assert max(abs(a - b) for a, b in zip(row["embedding"], floats)) <= tolerance

    # Token vectors: one per byte kept, BOS excluded.
    tokens = rows_of(run(uform, "encode", "--model", model, "--tokens", *TEXTS)[0])
    assert [len(row["tokens"]) for row in tokens] == [len(text) for text in TEXTS], tokens
    assert [row["embedding"] for row in tokens] == reference

    # The thread count changes nothing, nor does a batch boundary (300 texts span two batches).
    many = "".join(f"text number {i}\n" for i in range(300)).encode()
    one = run(uform, "encode", "--model", model, "--threads", "1", stdin=many)[0]
    two = run(uform, "encode", "--model", model, "--threads", "2", stdin=many)[0]
    assert one == two
    assert len(rows_of(one)) == 300
    alone = rows_of(run(uform, "encode", "--model", model, "text number 299")[0])
    assert rows_of(one)[299]["embedding"] == alone[0]["embedding"]


def check_errors(uform, model, workdir):
    """Each bad command line or path: its exit status and one line on stderr."""
    cases = [
        (2, ["encode", "--model", model, "--unknown", "x"]),
        (1, ["encode", "--model", model, "--dims", "7", "x"]),
        (2, ["encode", "--model", model, "--scalar", "f64", "x"]),
        (2, ["encode", "--model", model, "--format", "csv", "x"]),
        (2, ["encode", "--model", model, "--threads", "-1", "x"]),
        (2, ["encode", "--model", model, "--tokens", "--format", "f32", "x"]),
        (2, ["encode", "--model"]),
        (1, ["encode", "--model", os.path.join(workdir, "missing.safetensors"), "x"]),
        (1, ["encode", "--model", workdir, "x"]),
        (1, ["info", "--model", os.path.join(workdir, "missing.safetensors")]),
        (1, ["info", "--model", workdir]),
        (2, ["info", "--unknown"]),
        (2, ["checkpoint", "tiny"]),
        (2, ["checkpoint", "tiny", os.path.join(workdir, "x"), "--depth", "two"]),
        (2, ["checkpoint", "huge", "x"]),
        (1, ["checkpoint", "tiny", os.path.join(workdir, "missing", "x.safetensors")]),
        (2, ["frobnicate"]),
        (1, ["search", "x"]),
        (1, ["serve"]),
        (1, ["encode", "--model", model, "--manifest", os.path.join(workdir, "missing.jsonl")]),
    ]
    for status, arguments in cases:
        _, stderr = run(uform, *arguments, expect=status)
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(("uform:", "UForm:")), (arguments, stderr)

    # Media items answer the engine's UNSUPPORTED, naming their modality; a bad manifest line says where.
    for modality in ("image", "video", "audio"):
        manifest = os.path.join(workdir, f"{modality}.jsonl")
        with open(manifest, "w") as file:
            file.write(json.dumps({modality: "missing.file"}) + "\n")
        _, stderr = run(uform, "encode", "--model", model, "--manifest", manifest, expect=1)
        assert stderr.startswith("UForm: unsupported") and modality in stderr, stderr
        assert stderr.count("\n") == 1, stderr
    for line in (b"{not json", b"[1]", b'{"text": 1}', b'{"text": "a", "image": "b"}', b'{"id": 1}'):
        _, stderr = run(uform, "encode", "--model", model, "--manifest", "-", stdin=line + b"\n", expect=1)
        assert stderr.startswith("uform: standard input line 1:") and stderr.count("\n") == 1, stderr

    # A failed run leaves no partial file behind.
    output = os.path.join(workdir, "failed.npy")
    run(uform, "encode", "--model", model, "--dims", "7", "--format", "npy", "--output", output, "x",
        expect=1)
    assert not os.path.exists(output)

    # Help: every subcommand has one, on stdout, with status 0.
    for arguments in (["--help"], ["encode", "--help"], ["info", "-h"], ["checkpoint", "--help"],
                      ["checkpoint", "tiny", "--help"]):
        text, _ = run(uform, *arguments)
        assert text.startswith(b"usage: uform"), (arguments, text)
    assert b"not built yet" in run(uform, "--help")[0]


def check_default_model(uform, model, workdir):
    cache = os.path.join(workdir, "cache")
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    first = run(uform, "encode", *TEXTS, env=env)[0]
    path = os.path.join(cache, "uform", "tiny-42.safetensors")
    assert os.path.isfile(path)
    again = run(uform, "encode", *TEXTS, env=env)[0]  # reused, not rewritten
    assert first == again
    seeded = os.path.join(workdir, "tiny-42.safetensors")
    run(uform, "checkpoint", "tiny", seeded)
    with open(path, "rb") as cached, open(seeded, "rb") as written:
        assert cached.read() == written.read()
    assert json.loads(run(uform, "info", "--json", env=env)[0])["path"] == path


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--uform", required=True)
    parser.add_argument("--workdir", required=True)
    options = parser.parse_args()
    shutil.rmtree(options.workdir, ignore_errors=True)
    os.makedirs(options.workdir)
    model = check_checkpoint_and_info(options.uform, options.workdir)
    check_encode(options.uform, model, options.workdir)
    check_errors(options.uform, model, options.workdir)
    check_default_model(options.uform, model, options.workdir)
    print("uform command: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
