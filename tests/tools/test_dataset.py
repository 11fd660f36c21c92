#!/usr/bin/env python3
"""Drives `uform dataset synth`: the same seed writes the same bytes and another seed other ones; the
manifests' schema and counts; every path exists and every media file is listed; the held-out attribute
combinations are only in test; PNG, MP4 and WAV headers of the asked sizes; `uform encode` reads the
images, clips and sounds it wrote; a folder that is not empty is refused without --force; bad flags.

    test_dataset.py --uform build/tools/uform --workdir build/tests/dataset

The standard library only. A build without libspng (images), FFmpeg (clips) or espeak-ng (spoken words)
writes the rest: what it left out is read from dataset.json and checked to be absent."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import wave
import zlib

from command_support import parse_options, run_text

COUNTS = {"image": 96, "video": 24, "audio": 60}
SIZE, FRAMES, RATE, FRACTION = 48, 6, 8000, 0.25
PREFIXES = {"image": "img", "video": "vid", "audio": "snd"}
EXTENSIONS = {"image": "png", "video": "mp4", "audio": "wav"}
COUNT_NAMES = {"image": "images", "video": "videos", "audio": "sounds"}
PAIRS = {"image": ("colour", "shape"), "video": ("colour", "motion"), "audio": ("kind", "pitch")}


def run(uform, *arguments, expect=0):
    """Runs the command and answers (stdout text, stderr text), checking its exit status."""
    return run_text(uform, arguments, 300, expect)


def synth(uform, folder, seed, *extra, expect=0):
    return run(uform, "dataset", "synth", "--out", folder, "--seed", str(seed), "--images", str(COUNTS["image"]),
               "--videos", str(COUNTS["video"]), "--sounds", str(COUNTS["audio"]), "--image-size", str(SIZE),
               "--video-frames", str(FRAMES), "--audio-rate", str(RATE), "--test-fraction", str(FRACTION), *extra,
               expect=expect)


def tree(folder):
    """Every file under the folder, by its relative path: its bytes."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                files[os.path.relpath(path, folder)] = file.read()
    return files


def read_manifest(path):
    with open(path) as file:
        return [json.loads(line) for line in file]


def check_png(path):
    """An 8-bit RGB PNG of SIZE x SIZE: signature, chunk CRCs, IHDR, and IDAT that inflates to its rows."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    at, chunks, idat = 8, [], b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, (path, kind)
        chunks.append(kind)
        if kind == b"IHDR":
            assert struct.unpack(">IIBBBBB", body) == (SIZE, SIZE, 8, 2, 0, 0, 0), (path, body)
        if kind == b"IDAT":
            idat += body
        at += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", (path, chunks)
    raw = zlib.decompress(idat)
    assert len(raw) == SIZE * (1 + 3 * SIZE), path
    return unfilter(raw, SIZE, SIZE)


def unfilter(raw, width, height):
    """RGB8 rows from a PNG's inflated IDAT: each row's filter (none, sub, up, average, Paeth) undone."""
    stride, rows, previous = 3 * width, [], bytes(3 * width)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - 3] if x >= 3 else 0
            up, corner = previous[x], previous[x - 3] if x >= 3 else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
            else:
                assert kind == 0, kind
        rows.append(bytes(line))
        previous = line
    return rows


def column_and_row(position):
    """The words the second caption of an image ends with for a position ("top left": "left", "top"):
    both always, "centre" for the middle column and "middle" for the middle row."""
    words = position.split()
    row, column = words if len(words) == 2 else ("centre", "centre")
    return column, "middle" if row == "centre" else row


def check_backgrounds(images):
    """What the captions say of a background shows in the pixels: its grey; the noise that half
    the images have is light (a nuisance the captions do not name). Measured on the 6 x 6 corner farthest
    from the shape, which no shape reaches."""
    levels = {"dark": 30, "grey": 128, "light": 225}
    seen = set()
    for rows, attributes, captions in images:
        ground = attributes["background"]
        assert captions[0].startswith(f"a {ground} picture of "), (attributes, captions)
        column, row = column_and_row(attributes["position"])
        assert captions[1].endswith(f", {ground} background, {column}, {row}"), (attributes, captions)
        x0 = 0 if "right" in attributes["position"] else SIZE - 6
        y0 = 0 if "bottom" in attributes["position"] else SIZE - 6
        values = [rows[y][3 * x + c] for y in range(y0, y0 + 6) for x in range(x0, x0 + 6) for c in range(3)]
        mean = sum(values) / len(values)
        deviation = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        assert abs(mean - levels[attributes["background"]]) < 3, (attributes, mean)
        if attributes["noise"]:
            assert 0.5 < deviation < 6, (attributes, deviation)
        else:
            assert deviation == 0, (attributes, deviation)
        seen.add((attributes["background"], attributes["noise"]))
    assert not images or len(seen) == 6, seen  # every grey, plain and noised (no images without libspng)


def check_mp4(path):
    with open(path, "rb") as file:
        head = file.read(12)
    assert head[4:8] == b"ftyp", (path, head)


def check_wav(path):
    """16-bit PCM mono at RATE, one second, not silent."""
    with open(path, "rb") as file:
        head = file.read(44)
    assert head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt " and head[36:40] == b"data", (path, head)
    assert struct.unpack("<I", head[4:8])[0] == os.path.getsize(path) - 8, path
    assert struct.unpack("<HHIIHH", head[20:36]) == (1, 1, RATE, 2 * RATE, 2, 16), (path, head[20:36])
    with wave.open(path, "rb") as file:
        assert (file.getnchannels(), file.getsampwidth(), file.getframerate(), file.getnframes()) == (1, 2, RATE, RATE)
        samples = struct.unpack(f"<{RATE}h", file.readframes(RATE))
    assert max(abs(sample) for sample in samples) > 1000, path


def check_dataset(folder, stderr):
    """The manifests, the files and the split of one run. Answers (description, the media items by group)."""
    with open(os.path.join(folder, "dataset.json")) as file:
        description = json.load(file)
    unwritten = description["unwritten"]
    written = {m: 0 if COUNT_NAMES[m] in unwritten else COUNTS[m] for m in COUNTS}
    for modality in COUNTS:
        if COUNT_NAMES[modality] in unwritten:
            assert f"uform: warning: no {COUNT_NAMES[modality]} are written" in stderr, stderr
    assert description["seed"] in (7, 8) and description["test_fraction"] == FRACTION, description
    assert (description["image"]["size"], description["video"]["frames"], description["audio"]["rate"]) == (SIZE, FRAMES, RATE)
    speech = description["speech"]["available"]
    assert ("speech" in description["attributes"]["audio"]["kinds"]) == speech, description
    assert speech or "no spoken words" in stderr, stderr

    held = {m: {tuple(pair) for pair in description["held_out"][m]["combinations"]} for m in COUNTS}
    values = {"image": ("colours", "shapes"), "video": ("colours", "motions"), "audio": ("kinds", "pitches")}
    for modality, (rows, columns) in values.items():
        rows, columns = description["attributes"][modality][rows], description["attributes"][modality][columns]
        assert description["held_out"][modality]["attributes"] == list(PAIRS[modality])
        assert len(held[modality]) == max(1, (len(rows) * len(columns) + 4) // 8), (modality, held[modality])
        assert all(a in rows and b in columns for a, b in held[modality]), held[modality]
        # Every attribute value alone keeps a pair in training.
        for a in rows:
            assert any((a, b) not in held[modality] for b in columns), (modality, a)
        for b in columns:
            assert any((a, b) not in held[modality] for a in rows), (modality, b)

    groups, listed = {}, set()
    for split in ("train", "test"):
        for item in read_manifest(os.path.join(folder, f"{split}.jsonl")):
            assert item["modality"] in ("text", "image", "video", "audio"), item
            assert isinstance(item["groups"], list) and len(item["groups"]) == 1, item
            group = item["groups"][0]
            entry = groups.setdefault(group, {"split": split, "media": [], "texts": []})
            assert entry["split"] == split, (group, "in both splits")
            if item["modality"] == "text":
                assert set(item) == {"modality", "text", "groups"} and item["text"], item
                entry["texts"].append(item["text"])
                continue
            assert set(item) == {"modality", "path", "groups", "attributes"}, item
            modality = item["modality"]
            assert group.startswith(PREFIXES[modality] + "-"), item
            assert item["path"] == f"media/{group}.{EXTENSIONS[modality]}", item
            path = os.path.join(folder, item["path"])
            assert os.path.isfile(path), path
            listed.add(item["path"])
            entry["media"].append(item)
    on_disk = {f"media/{name}" for name in os.listdir(os.path.join(folder, "media"))}
    assert on_disk == listed, on_disk ^ listed

    by_modality = {m: [] for m in COUNTS}
    for group, entry in groups.items():
        assert len(entry["media"]) == 1 and len(entry["texts"]) == 2, (group, entry)
        assert entry["texts"][0] != entry["texts"][1], entry
        by_modality[entry["media"][0]["modality"]].append((group, entry))
    items = {"train": 0, "test": 0}
    for modality, entries in by_modality.items():
        assert len(entries) == written[modality], (modality, len(entries))
        tests = [entry for _, entry in entries if entry["split"] == "test"]
        assert len(tests) == (math.floor(written[modality] * FRACTION + 0.5) if written[modality] else 0)
        counted = description["counts"][COUNT_NAMES[modality]]
        assert (counted["asked"], counted["train"], counted["test"]) == (
            COUNTS[modality], written[modality] - len(tests), len(tests)), counted
        for group, entry in entries:
            items[entry["split"]] += 3
            attributes = entry["media"][0]["attributes"]
            pair = tuple(attributes[name] for name in PAIRS[modality])
            # The held-out combinations are in test only, and test holds nothing else.
            assert (pair in held[modality]) == (entry["split"] == "test"), (group, pair, entry["split"])
            if modality != "audio":
                caption = entry["texts"][0]
                assert attributes["colour"] in caption.split() and attributes["shape"] in caption.split(), entry
            if modality == "image":
                column, row = column_and_row(attributes["position"])
                assert attributes["size"] in entry["texts"][0].split(), entry
                assert entry["texts"][1].endswith(f", {column}, {row}"), entry
            if modality == "video":
                assert entry["texts"][0].endswith(attributes["motion"]), entry
            if modality == "audio" and attributes["kind"] == "speech":
                assert entry["texts"][0] == f"the spoken word {attributes['word']}", entry
    assert description["items"] == items, (description["items"], items)
    media = {m: [os.path.join(folder, entry["media"][0]["path"]) for _, entry in sorted(by_modality[m])] for m in COUNTS}
    paths = {os.path.join(folder, entry["media"][0]["path"]): entry for entries in by_modality.values()
             for _, entry in entries}
    attributes = {path: entry["media"][0]["attributes"] for path, entry in paths.items()}
    captions = {path: entry["texts"] for path, entry in paths.items()}
    return description, media, attributes, captions


def check_files(media, attributes, captions):
    check_backgrounds([(check_png(path), attributes[path], captions[path]) for path in media["image"]])
    for path in media["video"]:
        check_mp4(path)
    for path in media["audio"]:
        check_wav(path)


def encodes(uform, model, modality, path):
    """Whether `uform encode` embeds the file; False where the build has no decoder for it (an audio
    item without FFmpeg answers unsupported), and an error for any other failure."""
    done = subprocess.run([uform, "encode", "--model", model, "--manifest", "-"], capture_output=True, timeout=120,
                          input=json.dumps({modality: path}).encode() + b"\n")
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0 or "unsupported" in stderr, (modality, path, stderr)
    return done.returncode == 0


def check_encode(uform, workdir, media):
    """`uform encode` embeds a few files of each modality the run wrote, with a tiny checkpoint."""
    model = os.path.join(workdir, "tiny.safetensors")
    run(uform, "checkpoint", "tiny", model)
    for modality in COUNTS:
        if media[modality] and not encodes(uform, model, modality, media[modality][0]):
            print(f"this build does not decode {COUNT_NAMES[modality]}: uform encode is not tried on them")
            media[modality] = []
    chosen = [(modality, path) for modality in COUNTS for path in media[modality][:3]]
    manifest = os.path.join(workdir, "encode.jsonl")
    with open(manifest, "w") as file:
        file.write("".join(json.dumps({modality: path}) + "\n" for modality, path in chosen))
    stdout, _ = run(uform, "encode", "--model", model, "--manifest", manifest)
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert len(rows) == len(chosen), (len(rows), len(chosen))
    for row in rows:
        norm = math.sqrt(sum(value * value for value in row["embedding"]))
        assert len(row["embedding"]) == 64 and abs(norm - 1) < 1e-3, norm
    print(f"uform encode read {', '.join(f'{len(media[m][:3])} {COUNT_NAMES[m]}' for m in COUNTS)}")


def check_refusals(uform, workdir, first):
    """A folder that is not empty is refused, and --force replaces what a previous run wrote there."""
    _, stderr = synth(uform, first, 7, expect=1)
    assert stderr.startswith("uform: ") and "not empty" in stderr and "--force" in stderr, stderr
    forced = os.path.join(workdir, "forced")
    shutil.copytree(first, forced)
    with open(os.path.join(forced, "keep.txt"), "w") as file:
        file.write("not the command's\n")
    run(uform, "dataset", "synth", "--out", forced, "--force", "--images", "0", "--videos", "0", "--sounds", "4",
        "--audio-rate", str(RATE))
    assert sorted(os.listdir(os.path.join(forced, "media"))) == [f"snd-00000{i}.wav" for i in range(4)]
    assert os.path.exists(os.path.join(forced, "keep.txt"))
    assert not [name for name in os.listdir(forced) if name.endswith(".partial")]
    missing_parent = os.path.join(workdir, "no", "such", "folder")
    _, stderr = run(uform, "dataset", "synth", "--out", missing_parent, "--sounds", "1", expect=1)
    assert "cannot create" in stderr, stderr
    for arguments, message in [
        ([], "--out DIR is missing"),
        (["--out", "x", "--image-size", "33"], "even"),
        (["--out", "x", "--image-size", "8"], "--image-size takes a number from 16"),
        (["--out", "x", "--test-fraction", "2"], "--test-fraction"),
        (["--out", "x", "--test-fraction", "-0.1"], "--test-fraction"),
        (["--out", "x", "--images", "many"], "--images takes a number"),
        (["--out", "x", "--images", "0", "--videos", "0", "--sounds", "0"], "nothing to write"),
        (["--out", "x", "--what"], "unknown flag '--what'"),
        (["--out", "x", "stray"], "unexpected argument 'stray'"),
    ]:
        _, stderr = run(uform, "dataset", "synth", *arguments, expect=2)
        assert message in stderr and "uform dataset synth --help" in stderr, (arguments, stderr)
    _, stderr = run(uform, "dataset", "nonsense", expect=2)
    assert "unknown tool 'nonsense'" in stderr, stderr
    stdout, _ = run(uform, "dataset", "synth", "--help")
    assert stdout.startswith("usage: uform dataset synth --out DIR"), stdout
    stdout, _ = run(uform, "--help")
    assert "\n  dataset " in stdout, stdout


def main():
    options = parse_options(__doc__)
    folders = [os.path.join(options.workdir, name) for name in ("first", "again", "other")]
    outputs = [synth(options.uform, folder, seed) for folder, seed in zip(folders, (7, 7, 8))]
    assert outputs[0][0].startswith(f"wrote {folders[0]}: "), outputs[0][0]

    # One seed, the same bytes in every file; another seed, other manifests and other media.
    first, again, other = (tree(folder) for folder in folders)
    assert first.keys() == again.keys() and all(first[name] == again[name] for name in first), \
        sorted(name for name in first if first.get(name) != again.get(name))[:5]
    assert first["train.jsonl"] != other["train.jsonl"] and first["test.jsonl"] != other["test.jsonl"]
    assert any(first[name] != other.get(name) for name in first if name.startswith("media/"))

    description, media, attributes, captions = check_dataset(folders[0], outputs[0][1])
    other_description, _, _, _ = check_dataset(folders[2], outputs[2][1])
    assert description["held_out"] != other_description["held_out"]
    check_files(media, attributes, captions)
    check_encode(options.uform, options.workdir, media)
    check_refusals(options.uform, options.workdir, folders[0])
    unwritten = ", ".join(f"{name}: {why}" for name, why in description["unwritten"].items())
    print(f"uform dataset: all checks passed{' (not written: ' + unwritten + ')' if unwritten else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
