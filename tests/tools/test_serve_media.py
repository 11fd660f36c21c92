#!/usr/bin/env python3
"""Drives the multimodal extension of `uform serve`: images, sounds and clips sent as base64 in
POST /v1/embeddings, alone, mixed with texts, concurrently, corrupt and malformed.

    test_serve_media.py --uform build/tools/uform --workdir build/tests/serve-media [--without jpeg,spng,ffmpeg]

Every vector the server answers must equal, bit for bit in F32, what `uform encode` writes for the same
file or text and width: media are batched like texts, and a vector must not depend on its batch. An
item the engine cannot decode fails its own request (400, `param` naming its index) and no other one of
its batch; malformed base64 fails before any batch. Media whose decoder the build lacks (--without, as
meson says) must answer 400 unsupported_modality instead.

The media are made here: PNG and JPEG images with Pillow, WAV sounds written as RIFF by hand, and a
YUV4MPEG2 clip (raw 4:2:0 frames behind a text header, which FFmpeg demuxes) also by hand. OpenAI's client
sends only strings and token ids, so requests go through urllib. Needs Pillow: when the running
interpreter lacks it, the script re-runs itself under .venv/bin/python3 or /usr/bin/python3, and exits 77
(skip) when none has it. Exit status: 0 pass, 1 fail, 77 skip."""

import base64
import io
import json
import math
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_serve import Server as ServeServer, f32_bytes, serve_test_setup  # noqa: E402

CONTEXT = 64  # the tiny checkpoint's text context, in bytes
DIMS, NARROW = 64, 32  # its width and its other matryoshka width
TEXTS = ["a cat", "a photo of a red car parked by the sea", "long " * 40]


# ---- the media -----------------------------------------------------------------------------------

def make_images():
    """{name: encoded bytes}: PNGs of several colour types and JPEGs, of various sizes."""
    from PIL import Image

    images = {}
    for name, mode, size, fmt in (("rgb.png", "RGB", (48, 40), "PNG"), ("grey.png", "L", (33, 70), "PNG"),
                                  ("rgba.png", "RGBA", (64, 64), "PNG"), ("photo.jpg", "RGB", (80, 60), "JPEG"),
                                  ("small.jpg", "RGB", (20, 36), "JPEG")):
        width, height = size
        image = Image.new("RGB", size)
        image.putdata([((x * 7 + y * 3) % 256, (x * y) % 256, (255 - 4 * y) % 256)
                       for y in range(height) for x in range(width)])
        image = image.convert(mode)
        data = io.BytesIO()
        image.save(data, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        images[name] = data.getvalue()
    return images


def wav_bytes(frequency, seconds, rate, channels):
    """A 16-bit PCM WAV of a sine, written as RIFF by hand: the RIFF header, "fmt " and "data"."""
    frames = int(seconds * rate)
    samples = []
    for i in range(frames):
        value = int(12000 * math.sin(2 * math.pi * frequency * i / rate))
        samples += [value] * channels
    data = struct.pack(f"<{len(samples)}h", *samples)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    chunks = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(chunks)) + chunks


def y4m_bytes(width, height, frames):
    """A YUV4MPEG2 clip of moving gradients, 4:2:0, 10 frames per second."""
    out = [b"YUV4MPEG2 W%d H%d F10:1 Ip A1:1 C420jpeg\n" % (width, height)]
    for k in range(frames):
        out.append(b"FRAME\n")
        out.append(bytes((x * 4 + y * 2 + k * 30) & 255 for y in range(height) for x in range(width)))
        chroma = (width // 2) * (height // 2)
        out.append(bytes([(k * 40) & 255]) * chroma + bytes([(200 - k * 20) & 255]) * chroma)
    return b"".join(out)


# The decoder each kind of file needs, as meson names the build's features.
CODECS = {"png": "spng", "jpg": "jpeg", "wav": "ffmpeg", "y4m": "ffmpeg"}


def make_media(workdir):
    """[(modality, name, bytes)], each also written to workdir/name for `uform encode`."""
    media = [("image", name, data) for name, data in make_images().items()]
    media += [("audio", "tone.wav", wav_bytes(440, 1.0, 16000, 1)),
              ("audio", "stereo.wav", wav_bytes(1000, 0.5, 44100, 2))]
    media += [("video", "clip.y4m", y4m_bytes(48, 32, 6)), ("video", "short.y4m", y4m_bytes(32, 32, 2))]
    for _, name, data in media:
        with open(os.path.join(workdir, name), "wb") as file:
            file.write(data)
    return media


def codec(name):
    return CODECS[name.rsplit(".", 1)[1]]


# ---- the reference: `uform encode` ---------------------------------------------------------------

def encode_rows(uform, model, workdir, items, dims=None):
    """Raw little-endian F32 rows of `uform encode --manifest`, one bytes object per item; an item is
    ("text", text) or (modality, file name in workdir)."""
    if not items:
        return []
    manifest = os.path.join(workdir, "manifest.jsonl")
    with open(manifest, "w") as file:
        for modality, value in items:
            file.write(json.dumps({modality: value if modality == "text" else os.path.join(workdir, value)}) + "\n")
    arguments = [uform, "encode", "--model", model, "--format", "f32", "--manifest", manifest]
    if dims:
        arguments += ["--dims", str(dims)]
    done = subprocess.run(arguments, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    width = dims or DIMS
    assert len(done.stdout) == len(items) * width * 4, len(done.stdout)
    return [done.stdout[i * width * 4:(i + 1) * width * 4] for i in range(len(items))]


# ---- the server: tests/tools/test_serve.py's, with the calls this test makes -----------------------------

class Server(ServeServer):
    """`uform serve --port 0` as a child process (tests/tools/test_serve.py), plus embeddings and metrics."""

    def embed(self, body):
        """(status, parsed body) of one POST /v1/embeddings."""
        request = urllib.request.Request(f"{self.url}/v1/embeddings", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def metric(self, name):
        """One sample of GET /metrics, by its full name with labels."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=60) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
        return 0.0


def assert_error(status, body, expected_status, code, param):
    assert status == expected_status, (status, body)
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"] and error["type"], error
    assert error["code"] == code and error["param"] == param, error


def data_url(modality, name, data):
    kinds = {"png": "image/png", "jpg": "image/jpeg", "wav": "audio/wav", "y4m": "video/x-yuv4mpeg"}
    return {modality: f"data:{kinds[name.rsplit('.', 1)[1]]};base64," + base64.b64encode(data).decode()}


def vectors(body):
    """The F32 bytes of each data item, float or base64."""
    return [base64.b64decode(item["embedding"]) if isinstance(item["embedding"], str) else f32_bytes(item["embedding"])
            for item in body["data"]]


# ---- the checks ----------------------------------------------------------------------------------

def check_equal(server, media, reference):
    """Each medium alone, as a data URL and as bare base64; then everything in one request."""
    for index, (modality, name, data) in enumerate(media):
        for item in (data_url(modality, name, data), {modality: base64.b64encode(data).decode()}):
            status, body = server.embed({"input": [item], "encoding_format": "float"})
            assert status == 200, (name, body)
            assert vectors(body) == [reference["media", DIMS][index]], f"{name} differs from uform encode"
            assert "truncated" not in body["data"][0], body["data"][0]
            assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}, body["usage"]

    # Texts and every medium interleaved, answered in input order, at both widths and in both formats.
    order = list(range(len(media) + len(TEXTS)))
    random.Random(5).shuffle(order)
    items, expected = [], {DIMS: [], NARROW: []}
    for k in order:
        if k < len(media):
            items.append(data_url(*media[k]))
            for width in expected:
                expected[width].append(reference["media", width][k])
        else:
            items.append(TEXTS[k - len(media)] if k % 2 else {"text": TEXTS[k - len(media)]})
            for width in expected:
                expected[width].append(reference["text", width][k - len(media)])
    tokens = sum(min(len(text.encode()), CONTEXT) + 1 for text in TEXTS)
    for width, fmt in ((DIMS, "float"), (NARROW, "base64"), (DIMS, "base64")):
        body = {"input": items, "encoding_format": fmt, **({"dimensions": width} if width != DIMS else {})}
        status, answer = server.embed(body)
        assert status == 200, answer
        assert [item["index"] for item in answer["data"]] == list(range(len(items)))
        assert vectors(answer) == expected[width], f"a mixed request at width {width} ({fmt}) differs"
        assert answer["usage"]["prompt_tokens"] == tokens, answer["usage"]
        flags = [item.get("truncated") for item in answer["data"]]
        assert flags == [None if k < len(media) else k - len(media) == 2 for k in order], flags
    print(f"{len(media)} media alone and mixed with {len(TEXTS)} texts: equal to uform encode at widths "
          f"{DIMS} and {NARROW}")


def post_together(server, bodies):
    """Posts every body at once from its own thread; answers [(status, body)] in the same order."""
    results = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def post(index):
        barrier.wait()
        try:
            results[index] = server.embed(bodies[index])
        except Exception as error:  # reported by the caller
            results[index] = (None, repr(error))

    threads = [threading.Thread(target=post, args=(index,)) for index in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return results


def check_corrupt(uform, model, workdir, media, reference, without):
    """Corrupt media among good requests of the same batches: 400 for their own requests only."""
    # A long delay gathers what comes together into one batch per modality.
    server = Server(uform, model, workdir, "corrupt", "--threads", "2", "--batch-delay-us", "300000")
    try:
        png = make_images()["rgb.png"]
        wav = wav_bytes(440, 1.0, 16000, 1)
        corrupt = [  # (modality, bytes, the decoders any one of which reads it as far as its fault)
            ("image", png[:len(png) // 2], {"spng"}),                         # a PNG cut short
            ("image", png[:40] + bytes(64) + png[104:], {"spng"}),            # chunks zeroed: CRC errors
            ("image", b"\xff\xd8\xff\xe0" + bytes(100), {"jpeg"}),             # a JPEG header and nothing
            ("image", b"GIF89a" + bytes(30), {"spng", "jpeg"}),               # a format the engine lacks
            ("audio", b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk", {"ffmpeg"}),    # no "fmt " nor "data"
            ("audio", wav[:44] + wav[44:100], {"ffmpeg"}),                    # shorter than one patch
            ("video", wav, {"ffmpeg"}),                                       # no video stream
            ("video", b"YUV4MPEG2 W16 H16 F10:1 C420jpeg\nFRAME\n" + bytes(10), {"ffmpeg"}),  # a frame cut short
        ]
        corrupt = [(modality, data) for modality, data, needs in corrupt if needs - without]
        goods = [(index, item) for index, item in enumerate(media)]
        bodies, expect = [], []
        for index, (modality, name, data) in goods:
            bodies.append({"input": [data_url(modality, name, data), TEXTS[0]], "encoding_format": "base64"})
            expect.append([reference["media", DIMS][index], reference["text", DIMS][0]])
        for modality, data in corrupt:
            # The bad item second, after a good text and before a good item of its own modality.
            good = next(i for i, item in enumerate(media) if item[0] == modality)
            bodies.append({"input": [TEXTS[1], {modality: base64.b64encode(data).decode()},
                                     data_url(*media[good])]})
            expect.append(None)
        batches = {modality: server.metric(f'uform_modality_batches_total{{modality="{modality}"}}')
                   for modality in ("text", "image", "audio", "video")}
        results = post_together(server, bodies)
        for body, wanted, (status, answer) in zip(bodies, expect, results):
            if wanted is None:
                assert_error(status, answer, 400, "invalid_media", "input[1]")
                assert "could not be encoded: " in answer["error"]["message"], answer
            else:
                assert status == 200, answer
                assert vectors(answer) == wanted, "a good request batched with a corrupt one differs"
        counts = {modality: server.metric(f'uform_modality_batches_total{{modality="{modality}"}}') - before
                  for modality, before in batches.items()}
        requests = {modality: sum(1 for body in bodies if any(modality in item for item in body["input"]
                                                               if isinstance(item, dict)))
                    for modality in ("image", "audio", "video")}
        for modality, count in requests.items():
            assert count < 2 or counts[modality] < count, f"{count} {modality} requests took {counts[modality]} batches"

        # The batcher goes on: the same good and bad requests again, one after another.
        for body, wanted in zip(bodies, expect):
            status, answer = server.embed(body)
            assert (status == 200 and vectors(answer) == wanted) if wanted else status == 400, answer
        server.stop()
    finally:
        if server.process.poll() is None:
            server.process.kill()
    print(f"{len(corrupt)} corrupt media among {len(goods)} good requests, batched together "
          f"({', '.join(f'{m} {int(c)} batches' for m, c in counts.items())}): each corrupt one 400 with its "
          "index, every good one equal to uform encode")


def check_concurrency(server, media, reference, clients=16, per_client=5):
    """Clients sending random mixtures of texts and media at both widths, all at once."""
    failures = []
    before = {modality: server.metric(f'uform_modality_inputs_total{{modality="{modality}"}}')
              for modality in ("text", "image", "audio", "video")}
    sent = {modality: 0 for modality in before}
    lock = threading.Lock()

    def client(seed):
        generator = random.Random(seed)
        try:
            for _ in range(per_client):
                width = generator.choice([DIMS, NARROW])
                items, wanted = [], []
                for _ in range(generator.randint(1, 4)):
                    if not media or generator.random() < 0.4:
                        k = generator.randrange(len(TEXTS))
                        items.append(TEXTS[k])
                        wanted.append(reference["text", width][k])
                        modality = "text"
                    else:
                        k = generator.randrange(len(media))
                        items.append(data_url(*media[k]))
                        wanted.append(reference["media", width][k])
                        modality = media[k][0]
                    with lock:
                        sent[modality] += 1
                body = {"input": items, "encoding_format": generator.choice(["float", "base64"])}
                if width != DIMS:
                    body["dimensions"] = width
                status, answer = server.embed(body)
                if status != 200:
                    raise AssertionError(f"status {status}: {answer}")
                if vectors(answer) != wanted:
                    raise AssertionError(f"client {seed}: a vector at width {width} differs")
        except Exception as error:  # reported below, with every other failure
            with lock:
                failures.append(repr(error))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not failures, failures[:5]
    for modality, count in sent.items():
        got = server.metric(f'uform_modality_inputs_total{{modality="{modality}"}}') - before[modality]
        assert got == count, f"{modality}: {count} inputs sent, {got} encoded"
    print(f"{clients} clients x {per_client} requests of texts and media: all equal to uform encode "
          f"({', '.join(f'{m} {c}' for m, c in sent.items())} inputs)")


def check_bad_input(server, media):
    """Malformed base64 and data URLs: 400 before any batch, whatever the build decodes."""
    png = base64.b64encode(make_images()["rgb.png"]).decode()
    cases = [
        ({"image": "!!!!"}, "invalid_value"),
        ({"image": png[:-4] + "=" + png[-3:]}, "invalid_value"),        # padding inside
        ({"image": png + "A"}, "invalid_value"),                         # a last group of one character
        ({"image": png[:8] + " " + png[8:]}, "invalid_value"),           # whitespace
        ({"image": png[:8] + "-_" + png[10:]}, "invalid_value"),         # the URL-safe alphabet
        ({"image": "iVBORw0KGgo=="}, "invalid_value"),                   # padding past its group
        ({"image": "iVBORw0KGg="}, "invalid_value"),                     # padding short of its group
        ({"image": "data:image/png," + png}, "invalid_value"),           # not base64
        ({"image": "data:image/png;base64" + png}, "invalid_value"),     # no comma
        ({"audio": "data:;base64,"}, "invalid_value"),                   # nothing
        ({"video": ""}, "invalid_value"),
        ({"image": 5}, "invalid_type"),
        ({"image": png, "text": "a cat"}, "invalid_value"),              # two modalities in one item
        ({"image": png, "audio": png}, "invalid_value"),
        ({"picture": png}, "invalid_value"),
    ]
    inputs = server.metric("uform_inputs_total")
    for item, code in cases:
        status, answer = server.embed({"input": ["a cat", item]})
        assert_error(status, answer, 400, code, "input")
        assert "input[1]" in answer["error"]["message"], answer
    assert server.metric("uform_inputs_total") == inputs, "a malformed request reached the engine"
    print(f"{len(cases)} malformed media items: 400 before batching")
    images = [data for modality, _, data in media if modality == "image"]
    if not images:
        return
    # Padding may be left out; any media type is taken, as the format is recognized by content.
    image = base64.b64encode(images[0]).decode()
    for item in ({"image": image.rstrip("=")}, {"image": "data:application/octet-stream;base64," + image},
                 {"image": "DATA:image/png;charset=x;BASE64," + image}):
        status, answer = server.embed({"input": [item]})
        assert status == 200, answer
    print("unpadded base64, and any media type: taken")


def check_unsupported(server, media, without):
    """Media this build cannot decode: 400 unsupported_modality, before any batch where it lacks every
    decoder of the modality, else (a JPEG without libjpeg-turbo, a PNG without libspng) for the item."""
    for modality, name, data in media:
        early = modality != "image" or {"jpeg", "spng"} <= without
        status, answer = server.embed({"input": [data_url(modality, name, data)]})
        assert_error(status, answer, 400, "unsupported_modality", "input" if early else "input[0]")
    if media:
        print(f"{len(media)} media this build cannot decode ({', '.join(sorted(without))} not built): "
              "400 unsupported_modality")


def check_metrics(server):
    """The decode stage is timed per media batch, and only for media batches."""
    media = sum(server.metric(f'uform_modality_batches_total{{modality="{modality}"}}')
                for modality in ("image", "audio", "video"))
    decode = server.metric('uform_stage_seconds_count{stage="decode"}')
    assert decode == media, (decode, media)
    assert media == 0 or server.metric('uform_stage_seconds_sum{stage="decode"}') > 0
    assert server.metric('uform_stage_seconds_count{stage="compute"}') == server.metric("uform_batches_total")
    print(f"metrics: {decode:.0f} decode observations for {media:.0f} media batches")


def check_drain(uform, model, workdir, media, reference):
    """A request whose texts and media wait in the queue, each part for its own batch, when SIGTERM
    comes: the parts go at once, one batch after another, the request is answered whole, and the server
    exits 0."""
    server = Server(uform, model, workdir, "drain", "--threads", "1", "--batch-delay-us", "30000000")
    try:
        picks = list(range(min(3, len(media))))
        items = [TEXTS[0], *(data_url(*media[k]) for k in picks), TEXTS[1]]
        wanted = [reference["text", DIMS][0], *(reference["media", DIMS][k] for k in picks),
                  reference["text", DIMS][1]]
        result = {}
        thread = threading.Thread(target=lambda: result.update(answer=server.embed({"input": items})))
        thread.start()
        while server.metric("uform_queue_requests") != 1:
            assert thread.is_alive(), result
        server.process.send_signal(signal.SIGTERM)
        thread.join(timeout=60)
        status, answer = result["answer"]
        assert status == 200 and vectors(answer) == wanted, answer
        server.stop()
    finally:
        if server.process.poll() is None:
            server.process.kill()
    print(f"a request of {len(items)} inputs queued in parts, then SIGTERM: answered whole, exit 0")


def main():
    options, model = serve_test_setup(
        __doc__, ["PIL"], "UFORM_SERVE_MEDIA_REEXEC",
        lambda parser: parser.add_argument("--without", default="",
                                           help="the decoders the build lacks: jpeg, spng, ffmpeg"))
    without = set(filter(None, options.without.split(",")))
    uform = options.uform
    features = subprocess.run([uform, "serve", "--help"], capture_output=True, text=True)
    if features.returncode != 0:
        print(f"SKIP: uform serve is not built: {features.stderr.strip()}")
        return 77
    made = make_media(options.workdir)
    media = [item for item in made if codec(item[1]) not in without]
    reference = {}
    for width in (DIMS, NARROW):
        dims = width if width != DIMS else None
        reference["media", width] = encode_rows(uform, model, options.workdir,
                                                [(modality, name) for modality, name, _ in media], dims)
        reference["text", width] = encode_rows(uform, model, options.workdir, [("text", t) for t in TEXTS], dims)

    server = Server(uform, model, options.workdir, "media", "--threads", "2", "--batch-delay-us", "2000")
    try:
        check_equal(server, media, reference)
        check_bad_input(server, media)
        check_unsupported(server, [item for item in made if item not in media], without)
        check_concurrency(server, media, reference)
        check_metrics(server)
        server.stop()
    finally:
        if server.process.poll() is None:
            server.process.kill()
    check_corrupt(uform, model, options.workdir, media, reference, without)
    check_drain(uform, model, options.workdir, media, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
