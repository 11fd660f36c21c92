#!/usr/bin/env python3
"""Drives the real `uform` command: checkpoint tiny, info, encode in every format, scalar and width,
images by path and in a manifest, search (index a folder, query it), writers killed or out of room (the
previous file kept, stale temporaries removed), --keep-going, bad flags and bad paths, and the default
model.

    test_command.py --uform build/tools/uform --workdir build/tests/command

The standard library only; the .npy file is also loaded with NumPy where it imports, and a JPEG is
written with Pillow where this interpreter, .venv/bin/python3 or /usr/bin/python3 has it (under CI=true,
where either is missing, the check fails: tests/reference/interpreter.py)."""
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
import wave
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY / "tests" / "reference"))
from interpreter import optional_import, partly_unavailable  # noqa: E402  (standard library only)
from command_support import parse_options, run_bytes, run_size_limited, write_png  # noqa: E402

TEXTS = ["a cat", "a dog"]


def run(uform, *arguments, stdin=None, env=None, expect=0):
    """Runs the command and answers (stdout bytes, stderr text), checking its exit status."""
    return run_bytes(uform, arguments, 120, stdin, env, expect)


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


def write_jpeg(path, width, height, color):
    """A JPEG of one colour with a diagonal band, written by Pillow in this interpreter or another one that
    has it. Answers False where none has Pillow."""
    script = ("import sys\nfrom PIL import Image, ImageDraw\n"
              "path, width, height, r, g, b = sys.argv[1], *map(int, sys.argv[2:])\n"
              "image = Image.new('RGB', (width, height), (r, g, b))\n"
              "ImageDraw.Draw(image).line((0, 0, width, height), fill=(255 - r, 255 - g, 255 - b), width=5)\n"
              "image.save(path, quality=90)\n")
    arguments = [path, str(width), str(height), *map(str, color)]
    for interpreter in (sys.executable, str(REPOSITORY / ".venv" / "bin" / "python3"), "/usr/bin/python3"):
        if os.path.exists(interpreter) and subprocess.run([interpreter, "-c", script, *arguments],
                                                          capture_output=True).returncode == 0:
            return True
    return False


def write_wav(path, frequency, seconds=1.0, rate=16000):
    """A mono 16-bit sine: long enough for the tiny model's audio tower."""
    with wave.open(path, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * frequency * i / rate)))
                                  for i in range(int(seconds * rate))))


def check_images(uform, model, workdir):
    """Image paths as arguments (by extension) and in a manifest; `--` keeps a .png name a text; a
    broken image ends the run naming it and its status."""
    first, second = os.path.join(workdir, "first.png"), os.path.join(workdir, "second.PNG")
    write_png(first, 40, 30, 1)
    write_png(second, 17, 64, 2)
    if encode_status(uform, model, "image", first) == "unsupported":
        print("this build decodes no PNG: the image checks are skipped")
        return
    rows = rows_of(run(uform, "encode", "--model", model, first, "a cat", second, "--tokens")[0])
    assert len(rows) == 3
    for row in rows:
        assert_unit(row["embedding"], 64)
    assert len(rows[0]["tokens"]) == 16 and len(rows[1]["tokens"]) == 5, (len(rows[0]["tokens"]), len(rows[1]["tokens"]))
    assert rows[0]["embedding"] != rows[2]["embedding"]
    manifest = os.path.join(workdir, "images.jsonl")
    with open(manifest, "w") as file:
        file.write(json.dumps({"image": first}) + "\n" + json.dumps({"image": second}) + "\n")
    listed = rows_of(run(uform, "encode", "--model", model, "--manifest", manifest)[0])
    assert [row["embedding"] for row in listed] == [rows[0]["embedding"], rows[2]["embedding"]]
    literal = rows_of(run(uform, "encode", "--model", model, "--", first)[0])
    text = rows_of(run(uform, "encode", "--model", model, "--manifest", "-",
                       stdin=json.dumps({"text": first}).encode() + b"\n")[0])
    assert literal[0]["embedding"] == text[0]["embedding"] != rows[0]["embedding"]
    broken = os.path.join(workdir, "broken.jpg")
    with open(broken, "wb") as file:
        file.write(b"not a JPEG at all\n")
    _, stderr = run(uform, "encode", "--model", model, first, broken, expect=1)
    assert stderr.startswith("uform: item 1: image") and "broken.jpg" in stderr and stderr.endswith(": format\n"), stderr
    _, stderr = run(uform, "encode", "--model", model, os.path.join(workdir, "missing.png"), expect=1)
    assert stderr.startswith("uform: item 0: image") and stderr.endswith(": io (no such file or folder)\n"), stderr


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
    # The kernel path, why (the dispatcher's rule, or UFORM_KERNELS where it names a path every CPU runs) and
    # AMX's state.
    plain = {key: value for key, value in os.environ.items() if key != "UFORM_KERNELS"}
    kernels = json.loads(run(uform, "info", "--model", model, "--json", env=plain)[0])["kernels"]
    assert kernels["path"] and kernels["reason"].startswith(kernels["path"] + ": "), kernels
    assert kernels["amx"].startswith("amx: "), kernels
    line = f"\nkernels     {kernels['path']} ({kernels['reason']}); {kernels['amx']}\n"
    assert line.encode() in run(uform, "info", "--model", model, env=plain)[0]
    forced = json.loads(run(uform, "info", "--model", model, "--json", env=dict(plain, UFORM_KERNELS="scalar"))[0])
    assert (forced["kernels"]["path"], forced["kernels"]["reason"]) == ("scalar", "UFORM_KERNELS"), forced
    return model


def check_weights(uform, model, workdir):
    """I8 weights: a quantized checkpoint embeds as the BF16 one loaded with --weights i8, in every command
    that loads a model; --weights bf16 widens it back; a missing input says so."""
    quantized = os.path.join(workdir, "tiny-i8.safetensors")
    text, _ = run(uform, "checkpoint", "quantize", model, quantized)
    assert text == f"wrote {quantized} (I8 weights)\n".encode(), text
    assert json.loads(run(uform, "info", "--model", quantized, "--json")[0])["weights"] == "i8"
    assert json.loads(run(uform, "info", "--model", model, "--json")[0])["weights"] == "bf16"
    assert b"\nweights     I8 (the blocks' linear layers; BF16 elsewhere)\n" in run(uform, "info", "--model", quantized)[0]
    assert os.path.getsize(quantized) < 0.7 * os.path.getsize(model)
    asked = run(uform, "encode", "--model", model, "--weights", "i8", *TEXTS)[0]
    assert run(uform, "encode", "--model", quantized, *TEXTS)[0] == asked
    assert run(uform, "encode", "--model", quantized, "--weights", "i8", *TEXTS)[0] == asked
    assert run(uform, "encode", "--model", model, "--weights", "bf16", *TEXTS)[0] == run(uform, "encode", "--model", model, *TEXTS)[0]
    bf16 = [row["embedding"] for row in rows_of(run(uform, "encode", "--model", model, *TEXTS)[0])]
    for row, floats in zip(rows_of(asked), bf16):
        cosine = sum(a * b for a, b in zip(row["embedding"], floats))  # unit rows
        assert cosine >= 0.99, cosine
    widened = rows_of(run(uform, "encode", "--model", quantized, "--weights", "bf16", *TEXTS)[0])
    assert [row["embedding"] for row in widened] != [row["embedding"] for row in rows_of(asked)]
    _, stderr = run(uform, "checkpoint", "quantize", os.path.join(workdir, "missing.safetensors"), quantized, expect=1)
    assert stderr == "UForm: io [uform_checkpoint_quantize]: cannot open checkpoint: no such file or folder\n", stderr
    return quantized


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

    # empty_first_text_of_a_batch: a batch whose first item is an empty text added nothing to an unallocated
    # buffer (memcpy from and to NULL, which UBSan refuses); it embeds as the empty text alone does.
    with open(manifest, "w") as file:
        file.write(json.dumps({"text": ""}) + "\n" + json.dumps({"text": TEXTS[0]}) + "\n")
    first_empty = rows_of(run(uform, "encode", "--model", model, "--manifest", manifest)[0])
    assert first_empty[1]["embedding"] == reference[0]
    assert first_empty[0]["embedding"] == rows_of(run(uform, "encode", "--model", model, "")[0])[0]["embedding"]

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
    numpy = optional_import("numpy", "the .npy file is checked by its header and bytes only")
    if numpy:
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


def read_index(path):
    """A `uform search index` file, parsed by the layout its --help documents."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"UFORMIDX", data[:8]
    version, dims, items, model_bytes, paths_bytes = struct.unpack("<IIQQQ", data[8:40])
    assert version == 1 and data[40:64] == bytes(24), (version, data[40:64])
    at = 64
    vectors = [list(struct.unpack(f"<{dims}f", data[at + 4 * dims * i : at + 4 * dims * (i + 1)])) for i in range(items)]
    at += 4 * dims * items
    model = data[at : at + model_bytes].decode()
    at += model_bytes
    modalities = [("text", "image", "video", "audio")[m] for m in data[at : at + items]]
    at += items
    offsets = struct.unpack(f"<{items + 1}Q", data[at : at + 8 * (items + 1)])
    at += 8 * (items + 1)
    assert offsets[0] == 0 and offsets[-1] == paths_bytes and at + paths_bytes == len(data), (offsets, at, len(data))
    paths = [data[at + offsets[i] : at + offsets[i + 1]].decode() for i in range(items)]
    return {"dims": dims, "model": model, "items": dict(zip(paths, zip(modalities, vectors)))}


def write_index(path, model, dims, items):
    """An index written by hand, by the same layout: [(path, modality number, vector)]."""
    paths = b"".join(item[0].encode() for item in items)
    offsets, at = [0], 0
    for item in items:
        at += len(item[0].encode())
        offsets.append(at)
    with open(path, "wb") as file:
        file.write(b"UFORMIDX" + struct.pack("<IIQQQ", 1, dims, len(items), len(model.encode()), len(paths))
                   + bytes(24) + b"".join(struct.pack(f"<{dims}f", *item[2]) for item in items) + model.encode()
                   + bytes(item[1] for item in items) + struct.pack(f"<{len(offsets)}Q", *offsets) + paths)


def encode_status(uform, model, modality, path):
    """How `uform encode` ends a run of one media file: "ok", or the engine's status for it, the item's
    (`uform: item 0: image 'x.jpg': format`) or the whole call's (`UForm: unsupported [uform_...]: ...`)."""
    done = subprocess.run([uform, "encode", "--model", model, "--manifest", "-"], capture_output=True, timeout=120,
                          input=json.dumps({modality: path}).encode() + b"\n")
    if done.returncode == 0:
        return "ok"
    stderr = done.stderr.decode().rstrip("\n")
    return stderr.split(" ", 2)[1] if stderr.startswith("UForm: ") else stderr.rsplit(": ", 1)[-1]


def ranking(stdout):
    """`search query`'s text lines: (rank, score, path)."""
    rows = [line.split(" ", 2) for line in stdout.decode().splitlines()]
    return [(int(rank), float(score), path) for rank, score, path in rows]


def check_search(uform, model, workdir):
    """Index a folder of images, sounds and texts with a broken file among them, then query it: a planted
    duplicate of the query ranks first with a score of 1; the index holds what `uform encode` answers."""
    folder = os.path.join(workdir, "media")
    os.makedirs(os.path.join(folder, "sub"))
    os.makedirs(os.path.join(folder, ".hidden"))
    for i, (width, height) in enumerate(((40, 30), (17, 64), (64, 64))):
        write_png(os.path.join(folder, f"image{i}.png"), width, height, 40 * i + 3)
    write_png(os.path.join(folder, "sub", "deep.png"), 33, 20, 99)
    expected = {f"image{i}.png": "image" for i in range(3)}
    if write_jpeg(os.path.join(folder, "photo.JPG"), 48, 36, (20, 120, 220)):
        expected["photo.JPG"] = "image"
    else:
        partly_unavailable("no interpreter here imports PIL (apt-get install python3-pil): the search index holds no JPEG")
    write_wav(os.path.join(folder, "low.wav"), 220)
    write_wav(os.path.join(folder, "high.wav"), 1760, seconds=1.5)
    expected.update({"low.wav": "audio", "high.wav": "audio"})
    texts = {"cat.txt": "a cat on a mat\n", "dog.txt": "a dog", "bird.txt": "a bird\r\n", "empty.txt": ""}
    for name, text in texts.items():
        with open(os.path.join(folder, name), "w", newline="") as file:
            file.write(text)
        expected[name] = "text"
    with open(os.path.join(folder, "broken.jpg"), "wb") as file:
        file.write(b"not a JPEG at all\n")
    with open(os.path.join(folder, "clip.mp4"), "wb") as file:  # format, or unsupported where video is not built
        file.write(b"not a clip either")
    for name in ("notes.md", os.path.join(".hidden", "secret.txt"), ".dot.txt"):
        with open(os.path.join(folder, name), "w") as file:
            file.write("passed over")

    # What the index should take and skip: each media file alone through `uform encode` (a build without
    # a decoder answers unsupported for its files).
    skipped = {}
    for name in sorted(expected) + ["broken.jpg", "clip.mp4"]:
        modality = expected.get(name) or {"jpg": "image", "mp4": "video"}[name.rsplit(".", 1)[1]]
        if modality != "text":
            status = encode_status(uform, model, modality, os.path.join(folder, name))
            if status != "ok":
                skipped[name] = (modality, status)
                expected.pop(name, None)
    assert "broken.jpg" in skipped and "clip.mp4" in skipped, skipped
    if "image0.png" in expected:  # where images decode, a broken one is malformed, not unsupported
        assert skipped["broken.jpg"] == ("image", "format"), skipped

    index = os.path.join(workdir, "media.index")
    _, stderr = run(uform, "search", "index", folder, "--output", index, "--model", model, "--threads", "2")
    lines = stderr.splitlines()
    total = len(expected) + len(skipped)
    assert lines[-1] == f"uform search: indexed {len(expected)} of {total} files into {index} (64 dims); {len(skipped)} skipped", stderr
    assert len(lines) == len(skipped) + 1, stderr
    for name, (modality, status) in skipped.items():
        assert [line for line in lines if line.startswith(f"uform: warning: skipping '{name}' ({modality}): {status}")], (name, status, stderr)
    built = read_index(index)
    assert built["dims"] == 64 and built["model"] == os.path.realpath(model), built["model"]
    assert {path: item[0] for path, item in built["items"].items()} == expected, built["items"].keys()
    for _, vector in built["items"].values():
        assert_unit(vector, 64)
    assert not [name for name in os.listdir(workdir) if name.startswith("media.index.")]  # no temporary left

    # The index holds the vectors `uform encode` gives: a text file is its text without its line end.
    direct = rows_of(run(uform, "encode", "--model", model, "a cat on a mat", "a bird", "",
                         os.path.join(folder, "image1.png"))[0] if "image1.png" in expected else
                     run(uform, "encode", "--model", model, "a cat on a mat", "a bird", "")[0])
    for name, row in zip(("cat.txt", "bird.txt", "empty.txt", "image1.png"), direct):
        assert built["items"][name][1] == as_f32(row["embedding"]), name

    # A planted duplicate of the query ranks first, with a score of 1.
    top = ranking(run(uform, "search", "query", index, "a cat on a mat")[0])
    assert [row[0] for row in top] == list(range(1, min(10, len(expected)) + 1)), top
    assert top[0][2] == "cat.txt" and abs(top[0][1] - 1) < 1e-5 and top[1][1] < 1 - 1e-3, top
    assert [row[1] for row in top] == sorted((row[1] for row in top), reverse=True), top
    for name in [name for name in ("image2.png", "high.wav", "dog.txt", "photo.JPG") if name in expected]:
        rows = [json.loads(line) for line in run(uform, "search", "query", index, "--file", os.path.join(folder, name),
                                                 "--format", "jsonl", "--top", "3")[0].decode().splitlines()]
        assert len(rows) == 3 and rows[0]["path"] == name and rows[0]["modality"] == expected[name], rows
        assert abs(rows[0]["score"] - 1) < 1e-5 and rows[1]["score"] < rows[0]["score"], rows
        assert [row["rank"] for row in rows] == [1, 2, 3], rows
    everything = ranking(run(uform, "search", "query", index, "--top", "100", "--", "-a text with a dash")[0])
    assert sorted(row[2] for row in everything) == sorted(expected), everything

    # --recursive reaches sub/, --dims narrows the vectors, and the query follows the index's width;
    # the same folder indexes to the same bytes.
    narrow = os.path.join(workdir, "narrow.index")
    run(uform, "search", "index", folder + "/", "--output", narrow, "--model", model, "--dims", "32", "--recursive")
    built = read_index(narrow)
    deep = "image0.png" in expected  # PNG decodes in this build
    assert built["dims"] == 32 and ("sub/deep.png" in built["items"]) == deep
    assert len(built["items"]) == len(expected) + deep
    planted = os.path.join(folder, "sub", "deep.png") if deep else os.path.join(folder, "dog.txt")
    top = ranking(run(uform, "search", "query", narrow, "--file", planted)[0])
    assert top[0][2] == os.path.relpath(planted, folder) and abs(top[0][1] - 1) < 1e-5, top
    with open(narrow, "rb") as file:
        before = file.read()
    run(uform, "search", "index", folder, "--output", narrow, "--model", model, "--dims", "32", "--recursive")
    with open(narrow, "rb") as file:
        assert file.read() == before

    # Errors: one line each, exit 1 for what failed and 2 for a wrong command line. An index whose width
    # the model lacks, a damaged one, and a failed run that leaves nothing behind.
    odd = os.path.join(workdir, "odd.index")
    write_index(odd, os.path.realpath(model), 48, [("x.txt", 0, [1.0] + [0.0] * 47)])
    damaged = os.path.join(workdir, "damaged.index")
    with open(index, "rb") as source, open(damaged, "wb") as file:
        file.write(source.read()[:-3])
    failed = os.path.join(workdir, "failed.index")
    cases = [
        (1, ["search", "query", os.path.join(workdir, "missing.index"), "a cat"], "No such file"),
        (1, ["search", "query", model, "a cat"], "not a uform search index"),
        (1, ["search", "query", os.path.join(folder, "cat.txt"), "a cat"], "not a uform search index"),
        (1, ["search", "query", damaged, "a cat"], "damaged index"),
        (1, ["search", "query", odd, "a cat"], "the index's dims 48: not a width of the model"),
        (1, ["search", "query", index, "--file", os.path.join(folder, "broken.jpg")], f": {skipped['broken.jpg'][1]}"),
        (1, ["search", "query", index, "--file", os.path.join(folder, "missing.txt")], ": io"),
        (2, ["search", "query", index, "--file", os.path.join(folder, "notes.md")], "extension"),
        (2, ["search", "query", index, "a cat", "--top", "zero"], "--top"),
        (2, ["search", "query", index, "a cat", "--format", "csv"], "--format"),
        (2, ["search", "query", index, "a cat", "--frobnicate"], "unknown flag"),
        (2, ["search", "query", index], "TEXT"),
        (2, ["search", "query", index, "a", "cat"], "one TEXT"),
        (1, ["search", "index", os.path.join(workdir, "missing"), "--output", failed, "--model", model], "No such file"),
        (1, ["search", "index", os.path.join(folder, "cat.txt"), "--output", failed, "--model", model], "Not a directory"),
        (1, ["search", "index", folder, "--output", failed, "--model", model, "--dims", "7"], "--dims 7"),
        (1, ["search", "index", folder, "--output", os.path.join(workdir, "no", "such.index"), "--model", model], "cannot create"),
        (2, ["search", "index", folder, "--model", model], "--output"),
        (2, ["search", "index", folder, "--output", failed, "--dims", "many"], "--dims"),
        (2, ["search", "index", folder, "--output", failed, "--frobnicate"], "unknown flag"),
        (2, ["search", "frobnicate"], "index or query"),
        (2, ["search"], "index or query"),
    ]
    for status, arguments, needle in cases:
        stdout, stderr = run(uform, *arguments, expect=status)
        assert stdout == b"" and stderr.count("\n") == 1 and stderr.startswith("uform: ") and needle in stderr, (arguments, stderr)
    assert not os.path.exists(failed) and not [name for name in os.listdir(workdir) if name.startswith("failed.index")]
    for arguments in (["search", "--help"], ["search", "index", "--help"], ["search", "query", "-h"]):
        assert run(uform, *arguments)[0].startswith(b"usage: uform search"), arguments


def beside(path):
    """The other files whose names start with the base name of `path`, in its folder."""
    folder, base = os.path.split(path)
    return sorted(name for name in os.listdir(folder) if name.startswith(base) and name != base)


def kill_while_writing(uform, arguments, path, stdin=None):
    """Starts `uform *arguments`, which writes `path`, and SIGKILLs it once a new file (its temporary)
    appears beside `path`: whether it was caught writing (False when it finished first)."""
    before = set(beside(path))  # a killed run's temporary: the run started here removes it
    process = subprocess.Popen([uform, *arguments], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if stdin:
        try:
            process.stdin.write(stdin)
            process.stdin.close()
        except BrokenPipeError:
            pass
    deadline, caught = time.monotonic() + 60, False
    while process.poll() is None and time.monotonic() < deadline:
        if set(beside(path)) - before:
            process.kill()
            caught = True
            break
    process.wait(timeout=60)
    return caught and process.returncode == -signal.SIGKILL


def killed_index_leaves_temporary(uform, model, workdir):
    """`uform search index` killed while it writes leaves the previous index whole, and the next index of
    the same path removes the temporary the killed one left; a full disk leaves the previous index too,
    with one line naming the index and the reason."""
    folder, index = os.path.join(workdir, "media"), os.path.join(workdir, "writers", "media.index")
    os.makedirs(os.path.dirname(index), exist_ok=True)
    command = ["search", "index", folder, "--output", index, "--model", model, "--threads", "1"]
    run(uform, *command)
    previous = Path(index).read_bytes()
    caught = 0
    for _ in range(20):
        caught += kill_while_writing(uform, command, index)
        assert Path(index).read_bytes() == previous
        if caught >= 3:
            break
    assert caught >= 1 and beside(index), "no run was caught writing its index"
    run(uform, *command)
    assert Path(index).read_bytes() == previous and beside(index) == [], beside(index)
    status, stderr = run_size_limited(uform, command, 1024, 120)
    lines = [line for line in stderr.splitlines() if not line.startswith("uform: warning:")]
    assert status == 1 and lines == [f"uform: cannot write {index}: {os.strerror(27)}"], stderr
    assert Path(index).read_bytes() == previous and beside(index) == [], beside(index)


def bad_manifest_item_loses_good_vectors(uform, model, workdir):
    """With --keep-going, a manifest whose middle item cannot be read still gets the vectors of the
    others, and that item a row {"index", "error"}; the run says so and ends with status 1."""
    manifest = os.path.join(workdir, "writers", "one-bad.jsonl")
    os.makedirs(os.path.dirname(manifest), exist_ok=True)
    with open(manifest, "w") as file:
        for line in ({"text": "a cat"}, {"image": "missing.png"}, {"text": "a dog"}):
            file.write(json.dumps(line) + "\n")
    stdout, stderr = run(uform, "encode", "--model", model, "--manifest", manifest, "--keep-going", expect=1)
    rows = rows_of(stdout)
    assert [sorted(row) for row in rows] == [["embedding", "index"], ["error", "index"], ["embedding", "index"]], rows
    assert [row["index"] for row in rows] == [0, 1, 2] and rows[1]["error"] == "io", rows
    alone = rows_of(run(uform, "encode", "--model", model, "a cat", "a dog")[0])
    assert rows[0]["embedding"] == alone[0]["embedding"] and rows[2]["embedding"] == alone[1]["embedding"]
    assert stderr == ("uform: item 1: image 'missing.png': io (no such file or folder)\n"
                      "uform: 1 of 3 items failed; their rows hold \"error\"\n"), stderr
    _, stderr = run(uform, "encode", "--model", model, "--manifest", manifest, "--keep-going", "--format", "npy",
                    "--output", os.path.join(workdir, "writers", "x.npy"), expect=2)
    assert "--keep-going needs --format jsonl" in stderr, stderr


def ffmpeg_log_reaches_stderr(uform, model, workdir):
    """A corrupt clip ends `uform encode` with the item's one-line error and none of FFmpeg's own lines;
    with UFORM_LOG=debug, FFmpeg's lines are there, each after the engine's prefix."""
    clip = os.path.join(workdir, "writers", "cut.mp4")
    os.makedirs(os.path.dirname(clip), exist_ok=True)
    whole = (REPOSITORY / "tests" / "fuzz-corpus" / "video_decode" / "mpeg4.mp4").read_bytes()
    Path(clip).write_bytes(whole[: len(whole) // 2])
    if encode_status(uform, model, "video", clip) == "unsupported":
        print("this build decodes no video: the FFmpeg log check is skipped")
        return
    command = [uform, "encode", "--model", model, "--manifest", "-"]
    manifest = json.dumps({"video": clip}).encode() + b"\n"
    done = subprocess.run(command, capture_output=True, timeout=120, input=manifest)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1 and lines == [f"uform: item 0: video '{clip}': format"], lines
    env = dict(os.environ, UFORM_LOG="debug")
    done = subprocess.run(command, capture_output=True, timeout=120, input=manifest, env=env)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1 and lines[-1] == f"uform: item 0: video '{clip}': format", lines
    assert len(lines) > 1 and all(line.startswith("uform: ffmpeg: ") for line in lines[:-1]), lines


def check_encode_output_faults(uform, model, workdir):
    """`uform encode --output` killed while it writes, or out of room, leaves the previous file whole; the
    next run removes the temporary the killed one left; the error is one line naming the file; a symbolic
    link is written through."""
    output = os.path.join(workdir, "writers", "texts.jsonl")
    os.makedirs(os.path.dirname(output), exist_ok=True)
    texts = b"".join(b"text %d\n" % i for i in range(20000))
    command = ["encode", "--model", model, "--threads", "1", "--output", output]
    run(uform, *command, "a cat")
    previous = Path(output).read_bytes()
    caught = 0
    for _ in range(10):
        caught += kill_while_writing(uform, command, output, stdin=texts)
        assert Path(output).read_bytes() == previous
        if caught >= 2:
            break
    assert caught >= 1 and beside(output), "no run was caught writing its output"
    status, stderr = run_size_limited(uform, command, 4096, 120, stdin=texts)
    assert status == 1 and stderr == f"uform: cannot write {output}: {os.strerror(27)}\n", stderr
    assert Path(output).read_bytes() == previous and beside(output) == [], beside(output)
    # Through a symbolic link, the file it names is replaced and the link stays.
    link = os.path.join(workdir, "writers", "link.jsonl")
    os.symlink("texts.jsonl", link)
    Path(output).write_bytes(b"")
    run(uform, "encode", "--model", model, "--output", link, "a cat")
    assert os.path.islink(link) and Path(output).read_bytes() == previous



def check_errors(uform, model, workdir):
    """Each bad command line or path: its exit status and one line on stderr."""
    # Without libmicrohttpd, `serve` only says it is not built, with status 1, whatever its flags.
    serve_built = subprocess.run([uform, "serve", "--help"], capture_output=True, timeout=120).returncode == 0
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
        (2, ["search", "x"]),
        (1, ["serve", "--model", os.path.join(workdir, "missing.safetensors")]),
        (2 if serve_built else 1, ["serve", "--port", "70000"]),
        (1, ["encode", "--model", model, "--manifest", os.path.join(workdir, "missing.jsonl")]),
    ]
    for status, arguments in cases:
        _, stderr = run(uform, *arguments, expect=status)
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(("uform:", "UForm:")), (arguments, stderr)

    # One parser walks every command's flag table, so every command words the same mistake alike.
    said = [
        (["info", "--unknown"], "unknown flag '--unknown' (see 'uform info --help')"),
        (["eval", "stray"], "unexpected argument 'stray' (see 'uform eval --help')"),
        (["train", "stray"], "unexpected argument 'stray' (see 'uform train --help')"),
        (["info", "--json=yes"], "--json takes no value (see 'uform info --help')"),
        (["search", "index", "x", "--recursive=1"], "--recursive takes no value (see 'uform search index --help')"),
        (["checkpoint", "tiny", "x", "--seed"], "--seed needs a value (see 'uform checkpoint tiny --help')"),
        (["train", "--neighbours", "9"], "--neighbours takes a number up to 8, not '9' (see 'uform train --help')"),
        (["eval", "--batch=0"], "--batch takes a number from 1 to 256, not '0' (see 'uform eval --help')"),
        (["train", "--steps", "0"], "--steps takes a positive number, not '0' (see 'uform train --help')"),
        (["train", "--lr", "-1"], "--lr takes a number of at least 0, not '-1' (see 'uform train --help')"),
        (["encode", "--scalar", "f64"], "--scalar takes f32, bf16, f16 or i8, not 'f64' (see 'uform encode --help')"),
        (["checkpoint"], "a tool is missing: tiny or quantize (see 'uform checkpoint --help')"),
        (["checkpoint", "quantize"], "IN and OUT are missing (see 'uform checkpoint quantize --help')"),
        (["checkpoint", "quantize", "x"], "OUT is missing (see 'uform checkpoint quantize --help')"),
        (["checkpoint", "quantize", "x", "y", "z"], "unexpected argument 'z' (see 'uform checkpoint quantize --help')"),
        (["encode", "--weights", "f64"], "--weights takes stored, bf16 or i8, not 'f64' (see 'uform encode --help')"),
        (["search", "x"], "unknown tool 'x': index or query (see 'uform search --help')"),
    ] + ([(["serve", "--port", "70000"], "--port takes a number up to 65535, not '70000' (see 'uform serve --help')")]
         if serve_built else [])
    for arguments, message in said:
        _, stderr = run(uform, *arguments, expect=2)
        assert stderr == f"uform: {message}\n", (arguments, stderr)

    # A missing media file is one line naming the item, its modality and the engine's status (an
    # image's failures are checked by check_images); a bad manifest line says where.
    for modality in ("audio",):
        manifest = os.path.join(workdir, f"{modality}.jsonl")
        with open(manifest, "w") as file:
            file.write(json.dumps({modality: "missing.file"}) + "\n")
        _, stderr = run(uform, "encode", "--model", model, "--manifest", manifest, expect=1)
        built = not stderr.startswith(f"UForm: unsupported [uform_{modality}_encode]")  # no FFmpeg in this build
        assert not built or (stderr.startswith("uform: item 0:") and modality in stderr and ": io" in stderr), stderr
        assert stderr.count("\n") == 1, stderr
    for line in (b"{not json", b"[1]", b'{"text": 1}', b'{"text": "a", "image": "b"}', b'{"id": 1}'):
        _, stderr = run(uform, "encode", "--model", model, "--manifest", "-", stdin=line + b"\n", expect=1)
        assert stderr.startswith("uform: standard input line 1:") and stderr.count("\n") == 1, stderr

    # A failed run leaves no file behind.
    output = os.path.join(workdir, "failed.npy")
    run(uform, "encode", "--model", model, "--dims", "7", "--format", "npy", "--output", output, "x",
        expect=1)
    assert not os.path.exists(output)

    # Help: every subcommand has one, on stdout, with status 0.
    for arguments in (["--help"], ["encode", "--help"], ["info", "-h"], ["checkpoint", "--help"],
                      ["checkpoint", "tiny", "--help"], ["checkpoint", "quantize", "--help"],
                      ["search", "--help"]) + ((["serve", "--help"],) if serve_built else ()):
        text, _ = run(uform, *arguments)
        assert text.startswith(b"usage: uform"), (arguments, text)
    # Each flag's description starts in one column, the table's.
    text, _ = run(uform, "checkpoint", "tiny", "--help")
    rows = [line for line in text.decode().splitlines() if line.startswith("  --")]
    assert len(rows) == 7 and len({len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in rows}) == 1, rows


def check_default_model(uform, model, workdir):
    # The demo model of the source tree (or of an installation), unless UFORM_DEFAULT_MODEL says otherwise.
    plain = dict(os.environ)
    plain.pop("UFORM_DEFAULT_MODEL", None)
    demo = json.loads(run(uform, "info", "--json", env=plain)[0])
    assert demo["path"].endswith(os.path.join("models", "demo.safetensors")) and os.path.isfile(demo["path"]), demo
    assert json.loads(run(uform, "info", "--json", env=dict(plain, UFORM_DEFAULT_MODEL=model))[0])["path"] == model
    run(uform, "info", env=dict(plain, UFORM_DEFAULT_MODEL=os.path.join(workdir, "missing.safetensors")), expect=1)
    # UFORM_DEFAULT_MODEL=tiny: the tiny seeded checkpoint, written once to the cache and reused.
    cache = os.path.join(workdir, "cache")
    env = dict(plain, XDG_CACHE_HOME=cache, UFORM_DEFAULT_MODEL="tiny")
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
    # An index made with the default model records its path, and its queries load it from there.
    index = os.path.join(workdir, "default.index")
    run(uform, "search", "index", os.path.join(workdir, "media"), "--output", index, env=env)
    assert read_index(index)["model"] == os.path.realpath(path)
    top = ranking(run(uform, "search", "query", index, "a dog", env=plain)[0])
    assert top[0][2] == "dog.txt" and abs(top[0][1] - 1) < 1e-5, top


def check_tokenize(uform, workdir):
    """uform tokenize: the same rows from arguments, standard input and a manifest (texts with newlines
    there), spans within each text, the special flags, --no-special, a folder for --model, a text that is not UTF-8 failing
    alone with exit status 1, and the command line's faults. Its ids against tokenizers:
    tests/tokenizer/compare.py."""
    tokenizer = str(REPOSITORY / "tests" / "fuzz-corpus" / "tokenizer_json" / "wordpiece_bert.json")
    help_text = run(uform, "tokenize", "--help")[0].decode()
    assert help_text.startswith("usage: uform tokenize"), help_text
    probe = subprocess.run([uform, "tokenize", "--tokenizer", tokenizer, "a"], capture_output=True, timeout=120)
    if probe.returncode != 0 and b"unsupported" in probe.stderr:
        print("uform tokenize: built without tokenizers, skipping its checks")
        return
    texts = ["The quick brown fox.", "", "naïve café, 日本語!", "-dash first"]
    by_arguments = rows_of(run(uform, "tokenize", "--tokenizer", tokenizer, "--", *texts)[0])
    by_lines = rows_of(run(uform, "tokenize", "--tokenizer", tokenizer, stdin="\n".join(texts).encode() + b"\n")[0])
    manifest = "".join(json.dumps({"text": text}) + "\n" for text in texts + ["two\nlines"])
    by_manifest = rows_of(run(uform, "tokenize", "--tokenizer", tokenizer, "--manifest", "-", stdin=manifest.encode())[0])
    assert by_arguments == by_lines == by_manifest[:len(texts)], (by_arguments, by_lines, by_manifest)
    for text, row in zip(texts + ["two\nlines"], by_manifest):
        size = len(text.encode())
        assert len(row["ids"]) == len(row["spans"]) >= 2, row
        assert row["spans"][0] == [0, 0] and row["spans"][-1] == [0, 0], row
        assert all(0 <= begin <= end <= size for begin, end in row["spans"]), row
        assert row["special"] == [1] + [0] * (len(row["ids"]) - 2) + [1], row  # [CLS] ... [SEP]
    plain = rows_of(run(uform, "tokenize", "--tokenizer", tokenizer, "--no-special", texts[0])[0])
    assert plain[0]["ids"] == by_arguments[0]["ids"][1:-1], plain
    assert plain[0]["special"] == [0] * len(plain[0]["ids"]), plain
    folder = os.path.join(workdir, "tokenizer-folder")
    os.makedirs(folder, exist_ok=True)
    with open(tokenizer, "rb") as source, open(os.path.join(folder, "tokenizer.json"), "wb") as copy:
        copy.write(source.read())
    assert rows_of(run(uform, "tokenize", "--model", folder, "--", *texts)[0]) == by_arguments
    out, err = run(uform, "tokenize", "--tokenizer", tokenizer, stdin=b"good\nbad \xff\nalso good\n", expect=1)
    rows = rows_of(out)
    assert rows[1] == {"index": 1, "error": "format"} and "ids" in rows[0] and "ids" in rows[2], rows
    assert "1 of 3 texts" in err, err
    run(uform, "tokenize", "a", expect=2)
    run(uform, "tokenize", "--tokenizer", tokenizer, "--model", folder, "a", expect=2)
    err = run(uform, "tokenize", "--tokenizer", os.path.join(workdir, "absent.json"), "a", expect=1)[1]
    assert err.startswith("UForm: io") and err.count("\n") == 1, err
    err = run(uform, "tokenize", "--model", os.path.join(workdir, "tiny.safetensors"), "a", expect=1)[1]
    assert "no tokenizer" in err, err


def main():
    options = parse_options(__doc__)
    model = check_checkpoint_and_info(options.uform, options.workdir)
    check_encode(options.uform, model, options.workdir)
    check_weights(options.uform, model, options.workdir)
    check_images(options.uform, model, options.workdir)
    check_search(options.uform, model, options.workdir)
    killed_index_leaves_temporary(options.uform, model, options.workdir)
    bad_manifest_item_loses_good_vectors(options.uform, model, options.workdir)
    ffmpeg_log_reaches_stderr(options.uform, model, options.workdir)
    check_encode_output_faults(options.uform, model, options.workdir)
    check_errors(options.uform, model, options.workdir)
    check_default_model(options.uform, model, options.workdir)
    check_tokenize(options.uform, options.workdir)
    print("uform command: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
