#!/usr/bin/env python3
"""Drives `uform serve` as its users do: OpenAI's own Python client, 64 concurrent clients, bad input,
clients that go away, a full queue, and SIGTERM with requests in flight.

    test_serve.py --uform build/tools/uform --workdir build/tests/serve

Every vector the server answers must equal, bit for bit in F32, what `uform encode` writes for the same
text and width: the server batches requests together, and a vector must not depend on its batch.

Needs the `openai` package (`.ci/run` installs it into the project's .venv): when the running
interpreter lacks it, the script re-runs itself under .venv/bin/python3 or /usr/bin/python3, and
exits 77 (skip) when none has it. Exit status: 0 pass, 1 fail, 77 skip."""

import argparse
import base64
import http.client
import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import run_under_python_with  # noqa: E402

CONTEXT = 64  # the tiny checkpoint's text context, in bytes
DIMS, NARROW = 64, 32  # its width and its other matryoshka width

TEXTS = ["a cat", "a dog", "x", "a photo of a red car parked by the sea", "ünïcødé текст 文字",
         "long " * 40, "tabs\tand\nnewlines", "0123456789" * 6 + "abcd"]


# ---- the reference: `uform encode` ---------------------------------------------------------------

def encode_rows(uform, model, texts, dims=None):
    """Raw little-endian F32 rows of `uform encode`, one bytes object per text."""
    arguments = [uform, "encode", "--model", model, "--format", "f32"]
    if dims:
        arguments += ["--dims", str(dims)]
    done = subprocess.run([*arguments, "--", *texts], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    width = dims or DIMS
    assert len(done.stdout) == len(texts) * width * 4, len(done.stdout)
    return [done.stdout[i * width * 4:(i + 1) * width * 4] for i in range(len(texts))]


def f32_bytes(values):
    """A list of floats, as the F32 bytes they were printed from (%.9g reads back exactly)."""
    return struct.pack(f"<{len(values)}f", *values)


# ---- the server ----------------------------------------------------------------------------------

class Server:
    """`uform serve --port 0` as a child process, over http or https (the scripts of tests/tools share
    it); its one stdout line says the port and the models' names."""

    def __init__(self, uform, model, workdir, name, *flags, env=None):
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen([uform, "serve", "--model", model, "--port", "0", *flags],
                                        stdout=subprocess.PIPE, stderr=self.log, env=env)
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        line = self.process.stdout.readline().decode() if ready else ""
        found = re.match(r"uform serve: listening on (https?://[^ ]+:(\d+)) \(models? ([^)]+)\)", line)
        if not found:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"no listening line from uform serve: {line!r}\n{self.stderr()}")
        self.url, self.port, self.names = found.group(1), int(found.group(2)), found.group(3).split(", ")
        self.name = self.names[0]  # the model a request that names none gets

    def stderr(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as file:
            return file.read().decode("utf-8", "replace")

    def stop(self, expect=0, signal_it=True):
        if signal_it and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        self.log.close()
        log = self.stderr()
        assert code == expect, f"uform serve exited {code}, expected {expect}\n{log}"
        for report in ("Sanitizer", "runtime error"):
            assert report not in log, log

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def vm_peak_rss(self):
        with open(f"/proc/{self.process.pid}/status") as file:
            for line in file:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0


def request(port, method, path, body=None, connection=None, headers=None):
    """(status, headers, parsed body) of one request; JSON bodies are parsed, others kept as text."""
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    connection.request(method, path, body=body,
                       headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    if own:
        connection.close()
    kind = response.getheader("Content-Type", "")
    parsed = json.loads(data) if kind.startswith("application/json") else data.decode()
    return response.status, response, parsed


def embed(port, body, connection=None):
    return request(port, "POST", "/v1/embeddings", body, connection)


def metric(port, name):
    """One sample of GET /metrics, by its full name with labels."""
    status, _, text = request(port, "GET", "/metrics")
    assert status == 200, status
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def assert_error(status, body, expected_status, code=None, param=None):
    assert status == expected_status, (status, body)
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"] and error["type"], error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error


def assert_serving(server, reference):
    status, _, body = request(server.port, "GET", "/health")
    assert status == 200 and body == {"status": "ok"}, (status, body)
    status, _, body = embed(server.port, {"input": TEXTS[0], "model": server.name, "encoding_format": "float"})
    assert status == 200, body
    assert f32_bytes(body["data"][0]["embedding"]) == reference[DIMS][0]


# ---- (a) OpenAI's client -------------------------------------------------------------------------

def check_openai(server, reference):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    assert [model.id for model in client.models.list()] == [server.name]

    floats = client.embeddings.create(model=server.name, input=TEXTS, encoding_format="float")
    assert [item.index for item in floats.data] == list(range(len(TEXTS)))
    assert [f32_bytes(item.embedding) for item in floats.data] == reference[DIMS], "float vectors differ"
    tokens = sum(min(len(text.encode()), CONTEXT) + 1 for text in TEXTS)
    assert floats.usage.prompt_tokens == tokens and floats.usage.total_tokens == tokens, floats.usage
    assert floats.model == server.name

    # The client's default asks for base64 and decodes it itself.
    default = client.embeddings.create(model=server.name, input=TEXTS)
    assert [f32_bytes(item.embedding) for item in default.data] == reference[DIMS], "decoded base64 differs"
    raw = client.embeddings.create(model=server.name, input=TEXTS, encoding_format="base64")
    assert [base64.b64decode(item.embedding) for item in raw.data] == reference[DIMS], "base64 bytes differ"

    narrow = client.embeddings.create(model=server.name, input=TEXTS, dimensions=NARROW, encoding_format="float")
    assert [f32_bytes(item.embedding) for item in narrow.data] == reference[NARROW], "dimensions differ"
    full = client.embeddings.create(model=server.name, input=TEXTS[1], dimensions=DIMS)
    assert f32_bytes(full.data[0].embedding) == reference[DIMS][1]

    for bad, kind in ((dict(dimensions=4096), openai.BadRequestError), (dict(dimensions=33), openai.BadRequestError),
                      (dict(model="text-embedding-3-small"), openai.NotFoundError),
                      (dict(input=""), openai.BadRequestError), (dict(input=[]), openai.BadRequestError),
                      (dict(input=[[1, 2, 3]]), openai.BadRequestError)):
        arguments = {"model": server.name, "input": TEXTS, **bad}
        try:
            client.embeddings.create(**arguments)
        except kind as error:
            assert error.body and error.body.get("message"), error.body
        else:
            raise AssertionError(f"{bad} was accepted")

    # Truncation: flagged per item by default, refused when asked.
    long_text = TEXTS[5]
    status, _, body = embed(server.port, {"input": [TEXTS[0], long_text], "encoding_format": "float"})
    assert status == 200, body
    assert [item["truncated"] for item in body["data"]] == [False, True], body["data"]
    assert f32_bytes(body["data"][1]["embedding"]) == reference[DIMS][5]
    status, _, body = embed(server.port, {"input": [TEXTS[0], long_text], "truncate": False})
    assert_error(status, body, 400, "context_length_exceeded", "input")
    status, _, body = embed(server.port, {"input": [TEXTS[0], TEXTS[1]], "truncate": False, "encoding_format": "float"})
    assert status == 200 and f32_bytes(body["data"][1]["embedding"]) == reference[DIMS][1], body
    print(f"openai {openai.__version__}: float, base64, dimensions, usage, truncation and errors agree")


# ---- (b) 64 concurrent clients ------------------------------------------------------------------

def check_concurrency(server, reference, clients=64, per_client=6):
    failures = []
    answered = [0]
    lock = threading.Lock()

    def client(seed):
        generator = random.Random(seed)
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        try:
            for _ in range(per_client):
                picks = [generator.randrange(len(TEXTS)) for _ in range(generator.randint(1, 5))]
                dims = generator.choice([None, NARROW])
                body = {"input": [TEXTS[i] for i in picks], "model": server.name,
                        "encoding_format": generator.choice(["float", "base64"])}
                if dims:
                    body["dimensions"] = dims
                status, _, answer = embed(server.port, body, connection)
                if status != 200:
                    raise AssertionError(f"status {status}: {answer}")
                for item, pick in zip(answer["data"], picks):
                    vector = item["embedding"]
                    got = base64.b64decode(vector) if isinstance(vector, str) else f32_bytes(vector)
                    if got != reference[dims or DIMS][pick]:
                        raise AssertionError(f"client {seed}: text {pick} at width {dims or DIMS} differs")
                with lock:
                    answered[0] += 1
        except Exception as error:  # reported below, with every other failure
            with lock:
                failures.append(repr(error))
        finally:
            connection.close()

    batches_before = metric(server.port, "uform_batches_total")
    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    seconds = time.monotonic() - started
    assert not failures, failures[:5]
    assert answered[0] == clients * per_client, answered[0]
    batches = metric(server.port, "uform_batches_total") - batches_before
    gathered = metric(server.port, "uform_batch_requests_sum") / max(metric(server.port, "uform_batch_requests_count"), 1)
    assert batches < clients * per_client, f"{batches} batches for {clients * per_client} requests: nothing was batched"
    print(f"{clients} clients x {per_client} requests: all answered and equal to uform encode in {seconds:.1f} s, "
          f"{batches:.0f} batches, {gathered:.1f} requests per batch on average")


# ---- (c) bad input and clients that go away ------------------------------------------------------

def send_oversize(port, total, chunked):
    """POSTs a body of `total` bytes without ever holding it, stopping as soon as an answer comes;
    answers (status, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sock.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 f"{framing}\r\n\r\n".encode())
    piece = b'{"input": "' + b"a" * ((1 << 20) - 11)
    sent, pending = 0, b""
    sock.setblocking(False)
    while True:
        if not pending and sent < total:
            data = piece[:total - sent]
            pending = (f"{len(data):x}\r\n".encode() + data + b"\r\n") if chunked else data
            sent += len(data)
        elif not pending and chunked and sent == total:
            pending, sent = b"0\r\n\r\n", total + 1
        readable, writable, _ = select.select([sock], [sock] if pending else [], [], 120)
        if readable:
            break
        if not writable:
            raise AssertionError("the server neither reads nor answers")
        try:
            pending = pending[sock.send(pending):]
        except (BrokenPipeError, ConnectionResetError):
            break
    sock.setblocking(True)
    answer = b""
    try:
        while b"\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except ConnectionResetError:
        pass
    sock.close()
    found = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    assert found, f"no status line after {sent} bytes: {answer[:200]!r}"
    return int(found.group(1)), min(sent, total)


def check_bad_input(server, reference):
    port = server.port
    cases = [
        ('{"input": ', 400, "invalid_json", None),
        ("", 400, "invalid_json", None),
        ("[1, 2]", 400, "invalid_type", None),
        ({"input": 5}, 400, "invalid_type", "input"),
        ({"input": ["a", 5]}, 400, "invalid_type", "input"),
        ({"input": [1, 2, 3]}, 400, "unsupported_input", "input"),
        ({"input": [[1, 2], [3]]}, 400, "unsupported_input", "input"),
        ({"input": ""}, 400, "invalid_value", "input"),
        ({"input": []}, 400, "invalid_value", "input"),
        ({"input": ["a", ""]}, 400, "invalid_value", "input"),
        ({"model": server.name}, 400, "missing_required_parameter", "input"),
        ({"input": "a", "model": 5}, 400, "invalid_type", "model"),
        ({"input": "a", "model": "other"}, 404, "model_not_found", "model"),
        ({"input": "a", "dimensions": "32"}, 400, "invalid_type", "dimensions"),
        ({"input": "a", "dimensions": 4096}, 400, "invalid_value", "dimensions"),
        ({"input": "a", "dimensions": -1}, 400, "invalid_value", "dimensions"),
        ({"input": "a", "encoding_format": "hex"}, 400, "invalid_value", "encoding_format"),
        ({"input": "a", "truncate": "no"}, 400, "invalid_type", "truncate"),
        ({"input": ["x"] * 2049}, 400, "invalid_value", "input"),
        ({"input": [{"image": "data:image/png;base64,iVBORw0KGgo="}]}, 400, "invalid_media", "input[0]"),
        ({"input": [{"audio": "data:audio/wav;base64,UklGRg=="}]}, 400, "invalid_media", "input[0]"),
        ({"input": [{"video": "not a data url"}]}, 400, "invalid_value", "input"),
        ({"input": [{"picture": "x"}]}, 400, "invalid_value", "input"),
    ]
    for body, status, code, param in cases:
        got, _, answer = embed(port, body)
        assert_error(got, answer, status, code, param)
    status, _, body = embed(port, {"input": [{"text": TEXTS[1]}, TEXTS[2]], "encoding_format": "float"})
    assert status == 200 and [f32_bytes(item["embedding"]) for item in body["data"]] == reference[DIMS][1:3], body

    status, response, body = request(port, "GET", "/v1/embeddings")
    assert_error(status, body, 405, "method_not_allowed")
    assert response.getheader("Allow") == "POST"
    # Every route of the table answers a method it does not take alike; a path only starting like one is
    # no route at all.
    for path in ("/health", "/ready", "/metrics", "/v1/models", f"/v1/models/{server.name}"):
        status, response, body = request(port, "POST", path, body={})
        assert_error(status, body, 405, "method_not_allowed")
        assert response.getheader("Allow") == "GET, HEAD", path
    for path in ("/healthz", "/v1/modelsx", "/v1/embeddings/x", "/"):
        assert_error(*request(port, "GET", path)[::2], 404, "not_found")
    assert_error(*request(port, "GET", "/v2/nothing")[::2], 404, "not_found")
    assert_error(*request(port, "GET", "/v2/%FF%C3")[::2], 404, "not_found")  # not UTF-8 once unescaped
    assert_error(*embed(port, b'{"input": "a", "model": 7, \xff}')[::2], 400, "invalid_json")
    status, _, body = request(port, "GET", f"/v1/models/{server.name}")
    assert status == 200 and body["id"] == server.name and body["matryoshka"] == [NARROW, DIMS], body
    assert request(port, "GET", "/ready")[0] == 200
    assert_serving(server, reference)

    # 100 MB announced: 413 at once, the body never read. 100 MB sent chunked (no length known ahead):
    # kept up to the limit (16 MiB by default), then read and dropped as it comes, then 413. Neither is
    # ever held whole; the bounds leave room for AddressSanitizer's quarantine.
    before = server.vm_peak_rss()
    status, sent = send_oversize(port, 100 << 20, chunked=False)
    assert status == 413 and sent < (100 << 20), (status, sent)
    grown = server.vm_peak_rss() - before
    assert grown < (8 << 20), f"the server's peak memory grew by {grown >> 20} MiB for a refused body"
    status, sent = send_oversize(port, 100 << 20, chunked=True)
    assert status == 413 and sent == 100 << 20, (status, sent)
    grown = server.vm_peak_rss() - before
    assert grown < (64 << 20), f"the server's peak memory grew by {grown >> 20} MiB for a 100 MB chunked body"
    assert_serving(server, reference)

    # Clients that go away: in the headers, in the body, and after sending a whole request (which is
    # encoded and then finds no one to answer).
    whole = json.dumps({"input": ["gone " * 10] * 2048}).encode()
    for fragment in (b"POST /v1/embeddings HTTP/1.1\r\nHost: te",
                     b"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n{\"input\": [\"a",
                     b"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n%s" % (len(whole), whole)):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(fragment)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a FIN
        sock.close()
        assert_serving(server, reference)
    deadline = time.monotonic() + 60
    while metric(port, "uform_requests_in_flight") > 1:  # the metrics request itself
        assert time.monotonic() < deadline, "requests of clients that went away were never finished"
        time.sleep(0.05)
    print("bad input, 413 for 100 MB, and clients that went away: each answered, and the server kept serving")


# ---- (d) a full queue, idle timeouts, and SIGTERM with requests in flight ------------------------

def wait_for_queue(port, count):
    deadline = time.monotonic() + 60
    while metric(port, "uform_queue_requests") != count:
        assert time.monotonic() < deadline, f"the queue never held {count}"
        time.sleep(0.01)


def check_queue_and_shutdown(uform, model, workdir, reference):
    # One queued request, held for up to 2 s by the batch delay: a second one finds the queue full.
    server = Server(uform, model, workdir, "shutdown", "--queue", "1", "--batch-delay-us", "2000000",
                    "--threads", "1", "--timeout", "5")
    results = {}

    def post(key, text):
        results[key] = embed(server.port, {"input": text, "encoding_format": "float"})

    first = threading.Thread(target=post, args=("first", TEXTS[3]))
    first.start()
    wait_for_queue(server.port, 1)
    status, response, body = embed(server.port, {"input": TEXTS[0]})
    assert_error(status, body, 429, "queue_full")
    assert response.getheader("Retry-After") == "1", response.getheaders()
    first.join(timeout=60)
    status, _, body = results["first"]
    assert status == 200 and f32_bytes(body["data"][0]["embedding"]) == reference[DIMS][3], body

    # An idle connection is closed after --timeout.
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    idle.sendall(b"GET /health HTTP/1.1\r\nHo")
    assert idle.recv(100) == b"", "an idle connection was not closed"
    idle.close()

    # SIGTERM while one request is queued and another is still sending its body: both are answered,
    # new connections are refused meanwhile, and the server exits 0.
    body = json.dumps({"input": TEXTS[4], "encoding_format": "float"}).encode()
    uploading = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    uploading.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:10]))
    queued = threading.Thread(target=post, args=("queued", TEXTS[6]))
    queued.start()
    wait_for_queue(server.port, 1)
    deadline = time.monotonic() + 60
    while metric(server.port, "uform_requests_in_flight") < 3:  # the upload, the queued, this one
        assert time.monotonic() < deadline, "the upload's headers were never taken"
        time.sleep(0.01)
    server.process.send_signal(signal.SIGTERM)
    queued.join(timeout=60)
    status, _, answer = results["queued"]
    assert status == 200 and f32_bytes(answer["data"][0]["embedding"]) == reference[DIMS][6], answer
    refused = False
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    except ConnectionRefusedError:
        refused = True
    assert refused, "new connections are still taken while shutting down"
    uploading.sendall(body[10:])
    answer = b""
    while b'"usage"' not in answer:
        data = uploading.recv(65536)
        assert data, f"the request in flight was not answered: {answer!r}"
        answer += data
    uploading.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    vector = json.loads(answer.split(b"\r\n\r\n", 1)[1])["data"][0]["embedding"]
    assert f32_bytes(vector) == reference[DIMS][4]
    server.stop(expect=0, signal_it=False)  # on its own, once nothing is left to answer
    assert "SIGTERM again" not in server.stderr(), server.stderr()
    print("429 with Retry-After, idle timeout, and SIGTERM with requests in flight: answered, exit 0")


def serve_test_setup(description, modules, flag, add_arguments=None):
    """What every server test starts with: its options (--uform, --workdir and what `add_arguments(parser)`
    adds), the run moved under a Python that has `modules` (re-executed with `flag` set, see
    interpreter.py), the work folder, and the tiny checkpoint the server loads. Answers (options, model)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uform", required=True)
    parser.add_argument("--workdir", required=True)
    if add_arguments:
        add_arguments(parser)
    options = parser.parse_args()
    run_under_python_with(modules, flag=flag)
    os.makedirs(options.workdir, exist_ok=True)
    model = os.path.join(options.workdir, "tiny.safetensors")
    subprocess.run([options.uform, "checkpoint", "tiny", model, "--seed", "11", "--context", str(CONTEXT)],
                   check=True, capture_output=True)
    return options, model


def main():
    options, model = serve_test_setup(__doc__, ["openai"], "UFORM_SERVE_REEXEC")
    uform = options.uform
    reference = {DIMS: encode_rows(uform, model, TEXTS), NARROW: encode_rows(uform, model, TEXTS, NARROW)}

    server = Server(uform, model, options.workdir, "main", "--threads", "2", "--batch-delay-us", "1000")
    try:
        assert server.name == "tiny", server.name
        check_openai(server, reference)
        check_concurrency(server, reference)
        check_bad_input(server, reference)
        server.stop(expect=0)
    finally:
        if server.process.poll() is None:
            server.process.kill()
    check_queue_and_shutdown(uform, model, options.workdir, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
