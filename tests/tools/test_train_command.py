#!/usr/bin/env python3
"""Drives `uform train` and `uform eval` on a tiny manifest this script writes (texts, and PNG images
written with the standard library): three steps of a one-block model, the progress lines, the
checkpoint and `uform info` on it, a resume that continues the step count, Ctrl-C, a save that runs
out of room (reported once, nothing left behind), bad manifests, the
batches --dry-run shows (passes, --neighbours, identical captions), the shape of eval's table and JSON,
and two processes under mpirun against one (losses, weights, a Ctrl-C seen by one of them).

    test_train_command.py --uform build/tools/uform --workdir build/tests/train-command

The standard library only."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

from command_support import parse_options, run_size_limited, run_text, write_png

IMAGE_SIZE = 32
MODEL_FLAGS = ["--depth", "1", "--hidden", "64", "--dims", "32", "--image-size", "32", "--image-patch", "8",
               "--threads", "2", "--seed", "7"]
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss (\S+) contrastive (\S+) lm (\S+) lr (\S+) (\S+) items/s$")


def run(uform, *arguments, expect=0):
    """Runs the command and answers (stdout text, stderr text), checking its exit status."""
    return run_text(uform, arguments, 240, expect)


def write_manifest(path, lines):
    with open(path, "w") as file:
        for line in lines:
            file.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def make_dataset(workdir):
    """Four groups of a text and an image, and one of two texts: the manifest's path."""
    media = os.path.join(workdir, "data", "media")
    os.makedirs(media)
    lines = []
    for index, word in enumerate(["red", "green", "blue", "gray"]):
        group = f"img-{index:06d}"
        write_png(os.path.join(media, f"{group}.png"), IMAGE_SIZE, IMAGE_SIZE, 40 * index)
        lines.append({"modality": "text", "text": f"a {word} square", "groups": [group]})
        lines.append({"modality": "image", "path": f"media/{group}.png", "groups": [group]})
    lines.append({"modality": "text", "text": "a caption", "groups": ["txt-000000"]})
    lines.append({"modality": "text", "text": "another caption", "groups": ["txt-000000"]})
    manifest = os.path.join(workdir, "data", "train.jsonl")
    write_manifest(manifest, lines)
    return manifest


def step_lines(stderr, total):
    """The steps the progress lines report, checking each line's form."""
    steps = []
    for line in stderr.splitlines():
        match = STEP_LINE.match(line)
        if not match:
            continue
        step, shown_total, loss, contrastive, lm, lr, rate = match.groups()
        assert int(shown_total) == total, line
        for value in (loss, contrastive, lm, lr, rate):
            float(value)  # a number, finite or not, is what the line promises
        assert float(loss) == float(loss), line  # not NaN
        steps.append(int(step))
    return steps


def check_train(uform, manifest, workdir):
    model = os.path.join(workdir, "model.safetensors")
    _, stderr = run(uform, "train", "--data", manifest, "--out", model, "--steps", "3", "--batch", "4",
                    *MODEL_FLAGS)
    assert step_lines(stderr, 3) == [1, 2, 3], stderr
    assert os.path.isfile(model) and os.path.isfile(model + ".optimizer"), os.listdir(workdir)
    info = json.loads(run(uform, "info", "--model", model, "--json")[0])
    assert info, info
    text, _ = run(uform, "info", "--model", model)
    assert text, text

    resumed = os.path.join(workdir, "resumed.safetensors")
    # At its total already: nothing to do is an error that says so.
    _, stderr = run(uform, "train", "--data", manifest, "--out", resumed, "--steps", "3", "--resume", model,
                    expect=1)
    assert "step 3" in stderr and stderr.count("\n") == 1, stderr
    # Past the end of its schedule: the learning rate is 0 there, so the steps would change nothing.
    _, stderr = run(uform, "train", "--data", manifest, "--out", resumed, "--steps", "5", "--batch", "4",
                    "--resume", model, expect=1)
    assert "decays to 0 at step 3" in stderr and stderr.count("\n") == 1, stderr
    assert not os.path.exists(resumed)
    return model


def check_interrupt(uform, manifest, workdir):
    """Ctrl-C stops after the current step, saves, and says so."""
    model = os.path.join(workdir, "interrupted.safetensors")
    process = subprocess.Popen([uform, "train", "--data", manifest, "--out", model, "--steps", "1000000",
                                "--batch", "4", *MODEL_FLAGS], stderr=subprocess.PIPE)
    lines = []
    try:
        for raw in process.stderr:
            lines.append(raw.decode())
            if STEP_LINE.match(lines[-1].rstrip("\n")):
                process.send_signal(signal.SIGINT)
                break
        rest = process.stderr.read().decode()
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = "".join(lines) + rest
    last = stderr.splitlines()[-1]
    assert status == 1 and re.match(r"^uform: interrupted after step \d+ of 1000000; saved ", last), stderr
    assert os.path.isfile(model) and os.path.isfile(model + ".optimizer"), stderr
    run(uform, "info", "--model", model)

    # A resume continues the step count (and the schedule) from the saved optimizer state.
    saved = int(re.match(r"^uform: interrupted after step (\d+)", last).group(1))
    resumed = os.path.join(workdir, "resumed.safetensors")
    _, stderr = run(uform, "train", "--data", manifest, "--out", resumed, "--steps", str(saved + 2), "--batch",
                    "4", "--resume", model, *MODEL_FLAGS)
    assert step_lines(stderr, saved + 2) == [saved + 1, saved + 2], stderr
    assert os.path.isfile(resumed) and os.path.isfile(resumed + ".optimizer")


def check_full_disk(uform, manifest, model, workdir):
    """A save that runs out of room (a file size limit the checkpoint fits in and its optimizer state does
    not) fails once, naming the file and the system's reason, and leaves nothing behind."""
    limit = os.path.getsize(model) + 4096
    full = os.path.join(workdir, "full", "model.safetensors")
    os.makedirs(os.path.dirname(full))

    status, stderr = run_size_limited(uform, ["train", "--data", manifest, "--out", full, "--steps", "3",
                                              "--save-every", "1", "--batch", "4", *MODEL_FLAGS], limit, 240)
    failures = [line for line in stderr.splitlines() if not STEP_LINE.match(line)]
    expected = f"UForm: io [uform_trainer_save]: cannot write {full}.optimizer: {os.strerror(27)}"
    assert status == 1 and failures == [expected], stderr
    assert os.listdir(os.path.dirname(full)) == [], os.listdir(os.path.dirname(full))


def check_errors(uform, manifest, workdir):
    model = os.path.join(workdir, "bad.safetensors")
    good = {"modality": "text", "text": "fine", "groups": ["g"]}
    bad_lines = [
        ("{not json", "line 2"),
        ("[1]", "line 2: not a JSON object"),
        (json.dumps({"modality": "smell", "path": "x", "groups": ["g"]}), "line 2: modality 'smell'"),
        (json.dumps({"modality": "text", "groups": ["g"]}), "line 2: no \"text\""),
        (json.dumps({"modality": "text", "text": "a", "groups": []}), "line 2: \"groups\""),
        (json.dumps({"modality": "image", "path": "media/missing.png", "groups": ["g"]}), "line 2: "),
    ]
    bad = os.path.join(workdir, "data", "bad.jsonl")
    for line, expected in bad_lines:
        write_manifest(bad, [good, line])
        for command in (["train", "--data", bad, "--out", model, "--steps", "1"],
                        ["eval", "--model", model, "--data", bad]):
            _, stderr = run(uform, *command, expect=1)
            assert stderr.startswith(f"uform: {bad} {expected}") and stderr.count("\n") == 1, (line, stderr)
    assert not os.path.exists(model)
    write_manifest(bad, [good, json.dumps({"modality": "image", "path": "media/missing.png", "groups": ["g"]})])
    _, stderr = run(uform, "train", "--data", bad, "--out", model, expect=1)
    assert "missing.png" in stderr and "No such file" in stderr, stderr
    _, stderr = run(uform, "train", "--data", os.path.join(workdir, "missing.jsonl"), "--out", model, expect=1)
    assert stderr.startswith("uform: cannot open") and stderr.count("\n") == 1, stderr

    for status, arguments in [
        (2, ["train"]),
        (2, ["train", "--data", manifest]),
        (2, ["train", "--data", manifest, "--out", model, "--steps", "x"]),
        (2, ["train", "--data", manifest, "--out", model, "--lr", "fast"]),
        (2, ["train", "--data", manifest, "--out", model, "--frobnicate"]),
        (2, ["train", "--data", manifest, "--out", model, "--device", "gpu"]),
        (2, ["train", "--data", manifest, "--out", model, "--device", "cuda:16"]),
        (2, ["eval", "--model", model]),
        (2, ["eval", "--data", manifest, "--batch", "0"]),
    ]:
        _, stderr = run(uform, *arguments, expect=status)
        assert stderr.startswith("uform:") and stderr.count("\n") == 1, (arguments, stderr)
    for arguments in (["train", "--help"], ["eval", "--help"]):
        text, _ = run(uform, *arguments)
        assert text.startswith("usage: uform"), (arguments, text)
    # The devices found: the CPU, and each CUDA device, or why there is none.
    text, _ = run(uform, "train", "--help")
    devices = [line for line in text.splitlines() if line.startswith("Devices here: cpu")]
    assert len(devices) == 1, text
    assert "cuda:0" in devices[0] or "no CUDA device" in devices[0], devices
    if "cuda:0" not in devices[0]:  # a device that is not here: the engine's reason, exit status 1
        _, stderr = run(uform, "train", "--data", manifest, "--out", model, "--steps", "1", "--device", "cuda",
                        expect=1)
        assert "[uform_executor_create_vram]" in stderr and stderr.count("\n") == 1, stderr
        assert not os.path.exists(model)
    text, _ = run(uform, "--help")
    assert "\n  train " in text and "\n  eval " in text, text


def dry_run(uform, manifest, *arguments):
    """The batches `uform train --dry-run` prints: a list of its JSON lines."""
    text, stderr = run(uform, "train", "--data", manifest, "--out", "unused.safetensors", "--dry-run", *arguments)
    assert stderr == "", stderr
    return [json.loads(line) for line in text.splitlines()]


def check_batches(uform, workdir):
    """Batches as --dry-run shows them: every group once a pass; --neighbours brings a group's nearest
    groups by their words; identical texts relate their groups' items (not under --strict)."""
    folder = os.path.join(workdir, "batches")
    os.makedirs(folder)
    # Twelve groups of one text, in six twin pairs: a pair shares three words no other group holds.
    twins = os.path.join(folder, "twins.jsonl")
    write_manifest(twins, [{"modality": "text", "text": f"w{k // 2}a w{k // 2}b W{k // 2}c, only{k}", "groups": [f"t{k}"]}
                           for k in range(12)])
    plain = dry_run(uform, twins, "--steps", "6", "--batch", "4", "--seed", "5")
    assert [batch["step"] for batch in plain] == [1, 2, 3, 4, 5, 6], plain
    for first in (0, 3):  # a pass is three batches of four groups: every group once
        names = [name for batch in plain[first:first + 3] for name in batch["groups"]]
        assert sorted(names) == sorted(f"t{k}" for k in range(12)), plain
    assert all(len(batch["lines"]) == 4 and batch["related"] == [] for batch in plain), plain
    assert dry_run(uform, twins, "--steps", "6", "--batch", "4", "--seed", "5") == plain  # seeded
    assert dry_run(uform, twins, "--steps", "6", "--batch", "4", "--seed", "6") != plain

    near = dry_run(uform, twins, "--steps", "30", "--batch", "4", "--seed", "5", "--neighbours", "1")
    for batch in near:  # each group drawn brings its twin, the only group sharing a word with it
        groups = [int(name[1:]) for name in batch["groups"]]
        assert len(groups) == 4 and len(set(groups)) == 4, batch
        assert all(groups[i] // 2 == groups[i + 1] // 2 for i in (0, 2)), batch
    # Grouped in twins, the batches still take every group of a pass, none twice in a batch.
    assert len({name for batch in near for name in batch["groups"]}) == 12, near

    # Identical captions: "a red square" captions the images of g0 and g1; g1 also has its own caption.
    media = os.path.join(folder, "media")
    os.makedirs(media)
    lines = []
    for index in range(3):
        write_png(os.path.join(media, f"g{index}.png"), IMAGE_SIZE, IMAGE_SIZE, 40 * index)
        lines.append({"modality": "image", "path": f"media/g{index}.png", "groups": [f"g{index}"]})
    lines += [{"modality": "text", "text": "a red square", "groups": ["g0"]},
              {"modality": "text", "text": "a red square", "groups": ["g1"]},
              {"modality": "text", "text": "a red square, drawn again", "groups": ["g1"]},
              {"modality": "text", "text": "a blue square", "groups": ["g2"]}]
    alike = os.path.join(folder, "alike.jsonl")
    write_manifest(alike, lines)

    def pairs(batch):  # related pairs as manifest line numbers, each ascending
        return {tuple(sorted((batch["lines"][i], batch["lines"][j]))) for i, j in batch["related"]}

    [loose] = dry_run(uform, alike, "--steps", "1", "--batch", "7")
    [strict] = dry_run(uform, alike, "--steps", "1", "--batch", "7", "--strict")
    assert sorted(loose["lines"]) == list(range(1, 8)) and sorted(strict["lines"]) == list(range(1, 8))
    # Lines: 1-3 the images of g0, g1, g2; 4 and 5 "a red square" in g0 and g1; 6 g1's own; 7 g2's.
    assert pairs(strict) == {(1, 4), (2, 5), (2, 6), (5, 6), (3, 7)}, strict
    assert pairs(loose) == pairs(strict) | {(1, 5), (2, 4), (4, 5), (4, 6)}, loose

    _, stderr = run(uform, "train", "--data", twins, "--out", "unused", "--neighbours", "9", expect=2)
    assert "--neighbours" in stderr and stderr.count("\n") == 1, stderr


def check_eval(uform, model, manifest):
    text, _ = run(uform, "eval", "--model", model, "--data", manifest, "--batch", "3")
    rows = [line.split() for line in text.splitlines()]
    assert rows[0] == ["modality", "queries", "candidates", "recall@1", "recall@5"], text
    assert len(rows) == 2 and rows[1][0] == "image", text
    assert rows[1][1] == "4" and rows[1][2] == "4", text  # four texts have an image; four images
    recall1, recall5 = float(rows[1][3]), float(rows[1][4])
    assert 0 <= recall1 <= recall5 <= 1, text
    assert recall5 == 1, text  # five candidates of four hold every hit

    report = json.loads(run(uform, "eval", "--model", model, "--data", manifest, "--json")[0])
    assert report["items"] == 10, report
    image = report["modalities"]["image"]
    assert image["queries"] == 4 and image["candidates"] == 4, report
    assert abs(image["recall@1"] - recall1) < 1e-4 and image["recall@5"] == 1, report
    assert list(report["modalities"]) == ["image"], report

    # Items captioned alike are described alike: with every image's group holding the same caption,
    # any image is a hit for that caption; --strict counts groups only.
    same = os.path.join(os.path.dirname(manifest), "same-captions.jsonl")
    with open(manifest) as source:
        lines = [json.loads(line) for line in source if line.strip()]
    lines = [line for line in lines if line["modality"] == "image"] + [
        {"modality": "text", "text": "a square", "groups": line["groups"]} for line in lines if line["modality"] == "image"]
    write_manifest(same, lines)
    loose = json.loads(run(uform, "eval", "--model", model, "--data", same, "--json")[0])["modalities"]["image"]
    assert loose["queries"] == 4 and loose["recall@1"] == 1, loose
    strict = json.loads(run(uform, "eval", "--model", model, "--data", same, "--json", "--strict")[0])
    strict = strict["modalities"]["image"]
    # Identical texts embed identically, so each ranks the images alike: one of the four is first.
    assert abs(strict["recall@1"] - 0.25) < 1e-6, strict


def read_masters(path):
    """The F32 tensors of an optimizer state (safetensors), by name, as lists of floats."""
    with open(path, "rb") as file:
        length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(length))
        data = file.read()
    tensors = {}
    for name, entry in header.items():
        if name != "__metadata__" and entry["dtype"] == "F32":
            begin, end = entry["data_offsets"]
            tensors[name] = struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])
    return tensors


def mpirun(count, *arguments, **popen):
    """`mpirun -n count` of a command through tests/train/mpirun.sh, as the mesh suites run theirs: two or
    more processes on however many cores, as root where CI is, leaks unchecked in the ranks (Open MPI's)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "train", "mpirun.sh")
    return subprocess.Popen([script, str(count), *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **popen)


def children(pid):
    """The processes whose parent is `pid`, read from /proc (a minimal Debian has no pgrep)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as file:
                stat = file.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: the parent
            found.append(int(entry))
    return sorted(found)


def check_mesh(uform, manifest, workdir):
    """Under mpirun, two processes train as one on the whole batch (each on whole groups of it): the same
    losses and, to rounding, the same weights; a Ctrl-C seen by one process stops both after one step."""
    if not shutil.which("mpirun"):
        assert os.environ.get("CI") != "true", "no mpirun: apt-get install openmpi-bin"
        print("uform train under mpirun: skipped, no mpirun (apt-get install openmpi-bin)")
        return
    flags = ["--data", manifest, "--steps", "3", "--batch", "6", "--strict", *MODEL_FLAGS]
    single = os.path.join(workdir, "single.safetensors")
    _, alone = run(uform, "train", "--out", single, *flags)
    meshed = os.path.join(workdir, "meshed.safetensors")
    process = mpirun(2, uform, "train", "--out", meshed, *flags)
    _, stderr = (text.decode() for text in process.communicate(timeout=240))
    if "no MPI" in stderr:
        print("uform train under mpirun: skipped, this build has no MPI")
        return
    assert process.returncode == 0, stderr
    assert step_lines(stderr, 3) == [1, 2, 3] and stderr.count("uform: saved") == 1, stderr
    losses = [STEP_LINE.match(line).group(3) for line in stderr.splitlines() if STEP_LINE.match(line)]
    assert losses == [STEP_LINE.match(line).group(3) for line in alone.splitlines() if STEP_LINE.match(line)], \
        (alone, stderr)
    one, two = read_masters(single + ".optimizer"), read_masters(meshed + ".optimizer")
    assert one.keys() == two.keys() and one, (one.keys(), two.keys())
    for name in one:
        largest = max(abs(value) for value in one[name]) or 1.0
        worst = max(abs(a - b) for a, b in zip(one[name], two[name]))
        assert worst <= 1e-4 * largest, (name, worst, largest)

    interrupted = os.path.join(workdir, "meshed-interrupted.safetensors")
    process = mpirun(2, uform, "train", "--out", interrupted, *flags[:3], "1000000", *flags[4:])
    try:
        for raw in process.stderr:
            if STEP_LINE.match(raw.decode().rstrip("\n")):
                break
        ranks = children(process.pid)
        assert len(ranks) == 2, ranks
        os.kill(int(ranks[-1]), signal.SIGINT)  # one process alone sees it
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stops = re.findall(r"uform: interrupted after step (\d+) of 1000000", rest.decode())
    assert process.returncode != 0 and len(stops) == 2 and stops[0] == stops[1], rest.decode()
    assert os.path.isfile(interrupted) and os.path.isfile(interrupted + ".optimizer")
    print(f"uform train under mpirun: 2 processes = 1; a Ctrl-C on one stopped both after step {stops[0]}")


def main():
    options = parse_options(__doc__)
    manifest = make_dataset(options.workdir)
    model = check_train(options.uform, manifest, options.workdir)
    check_eval(options.uform, model, manifest)
    check_interrupt(options.uform, manifest, options.workdir)
    check_full_disk(options.uform, manifest, model, options.workdir)
    check_errors(options.uform, manifest, options.workdir)
    check_batches(options.uform, options.workdir)
    check_mesh(options.uform, manifest, options.workdir)
    print("uform train and eval: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
