#!/usr/bin/env python3
"""`uform serve` against hostile clients and with its guards on: one case per run, named by --case.

    test_serve_faults.py --uform build/tools/uform --workdir build/tests/serve-faults --case NAME

  half_closed_burst_blocks_server  5,000 clients that each send part of a request and close at once:
                                   every connection is closed as its FIN comes, a request after the
                                   burst is answered within 1 s, and their 5,000 log lines are printed
                                   at most 10 a second, the rest counted
  abandoned_requests_are_computed  1,000 requests of 2,048 texts whose clients close once sent: they are
                                   dropped unencoded and counted (uform_requests_abandoned_total), and a
                                   request after them is answered within 1 s
  api_key_not_checked              --api-key, --api-key-file and UFORM_API_KEY: 401 in OpenAI's shape on
                                   every route but /health without a key or with another, OpenAI's
                                   client works with one; the warning for another address without a key
  tls                              --tls-cert/--tls-key with a certificate made by `openssl` at test
                                   time: OpenAI's client over HTTPS, plain HTTP refused, bad files named

Needs the `openai` package, as test_serve.py does (re-run under the project's .venv, else exit 77), and
the `openssl` command for the tls case. Exit status: 0 pass, 1 fail, 77 skip."""

import http.client
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import SKIP, in_ci  # noqa: E402
from test_serve import DIMS, TEXTS, Server, embed, encode_rows, f32_bytes, metric, request, serve_test_setup  # noqa: E402


def answered_within(port, seconds, body=None):
    """Posts one small embeddings request on a fresh connection; its answer must come within `seconds`
    (the socket's timeout bounds the wait), and it must be the right vector."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=seconds)
    started = time.monotonic()
    try:
        status, _, answer = embed(port, body or {"input": TEXTS[0], "encoding_format": "float"}, connection)
    except (socket.timeout, TimeoutError) as error:
        raise AssertionError(f"a request was not answered within {seconds} s: {error!r}") from None
    finally:
        connection.close()
    took = time.monotonic() - started
    assert status == 200, answer
    assert took <= seconds, took
    return answer, took


def wait_until(what, predicate, seconds):
    """Polls `predicate` until it holds; a connection the server closed at its limit is tried again."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if predicate():
                return
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def raise_open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- half_closed_burst_blocks_server ------------------------------------------------------------

def half_closed_burst_blocks_server(uform, model, workdir, reference):
    raise_open_files()
    server = Server(uform, model, workdir, "burst", "--threads", "1")
    try:
        fragment = (b"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{\"input\": [\"a")
        clients, wave = 5000, 500
        started = time.monotonic()
        for first in range(0, clients, wave):
            sockets = []
            for _ in range(wave):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.settimeout(10)
                sock.connect(("127.0.0.1", server.port))
                sockets.append(sock)
            for sock in sockets:
                sock.sendall(fragment)
            for sock in sockets:
                sock.close()  # a FIN right behind the bytes
        burst = time.monotonic() - started
        answer, took = answered_within(server.port, 1.0)
        assert f32_bytes(answer["data"][0]["embedding"]) == reference[0]
        # Every half-closed connection is closed as its FIN is read, not at the 60 s idle timeout.
        wait_until("the half-closed connections were not closed",
                   lambda: metric(server.port, "uform_requests_in_flight") <= 1, 10)
        lasted = time.monotonic() - started
        server.stop()
        # libmicrohttpd's message for each of them ("... with incomplete request", or, for a connection
        # that finds the server at its limit, "... connection limit ...") is printed at most 10 times a
        # second, the rest counted.
        log = [line for line in server.stderr().splitlines() if line.startswith("uform: http: ")]
        counts = [re.match(r"uform: http: (\d+) more messages not printed \(at most 10 a second\)$", line)
                  for line in log]
        unprinted = sum(int(found.group(1)) for found in counts if found)
        printed = counts.count(None)
        assert printed + unprinted == clients, (printed, unprinted)
        assert printed <= 10 * (int(lasted) + 2), (printed, lasted)
        print(f"{clients} half-closed connections in {burst:.2f} s: the next request answered in {took:.3f} s, "
              f"every connection closed; {printed} of their {clients} log lines printed, the rest counted")
    finally:
        server.kill()

    # --ip-connections: a third connection of one address is closed while two are held.
    server = Server(uform, model, workdir, "ip-connections", "--threads", "1", "--ip-connections", "2")
    try:
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(2)]
        def health(sock):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):
                data = sock.recv(1000)
                assert data, f"a held connection was not answered: {answer!r}"
                answer += data
            assert answer.startswith(b"HTTP/1.1 200"), answer

        for sock in held:  # each answered once, so taken by the server, and kept alive
            health(sock)
        third = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        try:
            third.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            refused = third.recv(100)
        except (ConnectionResetError, BrokenPipeError):
            refused = b""
        third.close()
        assert refused == b"", f"a third connection was answered: {refused!r}"
        health(held[0])
        for sock in held:
            sock.close()
        wait_until("a connection after the held ones was refused",
                   lambda: request(server.port, "GET", "/health")[0] == 200, 10)
        server.stop()
        print("--ip-connections 2: a third connection closed, the held ones answered")
    finally:
        server.kill()


# ---- abandoned_requests_are_computed ------------------------------------------------------------

def abandoned_requests_are_computed(uform, model, workdir, reference):
    raise_open_files()
    # Every abandoned request may be queued at once: no per-address bound refuses them before the queue.
    server = Server(uform, model, workdir, "abandoned", "--threads", "2", "--ip-connections", "100000")
    try:
        requests, texts = 1000, 2048
        body = json.dumps({"input": ["abandoned by its client: " + "x" * 39] * texts}).encode()
        head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))
        for _ in range(requests):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sock.sendall(head + body)
            sock.close()  # whole, and gone before its answer
        # Each request is queued, then dropped once its FIN is seen, or encoded when the executor took it
        # before the FIN came.
        wait_until("the abandoned requests never left the queue",
                   lambda: metric(server.port, "uform_queue_requests") == 0, 120)
        answer, took = answered_within(server.port, 1.0)
        assert f32_bytes(answer["data"][0]["embedding"]) == reference[0]
        abandoned = metric(server.port, "uform_requests_abandoned_total")
        encoded = metric(server.port, 'uform_modality_inputs_total{modality="text"}') - 1
        assert encoded % texts == 0, encoded
        assert abandoned + encoded / texts >= requests, (abandoned, encoded)
        assert abandoned >= requests / 2, f"only {abandoned:.0f} of {requests} abandoned requests were dropped"
        server.stop()
        print(f"{requests} abandoned requests: {abandoned:.0f} dropped, {encoded / texts:.0f} encoded before "
              f"their client left; the next request answered in {took:.3f} s")
    finally:
        server.kill()


# ---- api_key_not_checked ------------------------------------------------------------------------

def assert_unauthorized(status, response, body):
    assert status == 401, (status, body)
    assert response.getheader("WWW-Authenticate") == "Bearer", response.getheaders()
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key", error
    assert error["param"] is None and error["message"], error


def api_key_not_checked(uform, model, workdir, reference):
    import openai

    keys = os.path.join(workdir, "keys")
    with open(keys, "w") as file:
        file.write("# the second key\n\n  sk-second  \r\nsk-third\n")
    env = {**os.environ, "UFORM_API_KEY": "sk-from-the-environment"}
    server = Server(uform, model, workdir, "keys", "--threads", "1", "--api-key", "sk-first",
                    "--api-key-file", keys, env=env)
    try:
        port = server.port
        for method, path in (("POST", "/v1/embeddings"), ("GET", "/v1/models"), ("GET", f"/v1/models/{server.name}"),
                             ("GET", "/metrics"), ("GET", "/ready"), ("GET", "/nothing"), ("GET", "/v1/embeddings")):
            body = {"input": TEXTS[0]} if method == "POST" else None
            for headers in ({}, {"Authorization": "Bearer sk-firs"}, {"Authorization": "Bearer sk-first-"},
                            {"Authorization": "Bearer "}, {"Authorization": "sk-first"},
                            {"Authorization": "Basic c2stZmlyc3Q6"}, {"Authorization": "Bearer # the second key"}):
                assert_unauthorized(*request(port, method, path, body, headers=headers))
        status, _, body = request(port, "GET", "/health")
        assert status == 200 and body == {"status": "ok"}, (status, body)

        for key in ("sk-first", "sk-second", "sk-third", "sk-from-the-environment"):
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)
            assert [model.id for model in client.models.list()] == [server.name]
            floats = client.embeddings.create(model=server.name, input=TEXTS[:2], encoding_format="float")
            assert [f32_bytes(item.embedding) for item in floats.data] == reference[:2], key
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-other", max_retries=0, timeout=120)
        try:
            client.embeddings.create(model=server.name, input=TEXTS[0])
        except openai.AuthenticationError as error:
            assert error.body and error.body.get("code") == "invalid_api_key", error.body
        else:
            raise AssertionError("another key was accepted")
        status, _, body = request(port, "GET", "/metrics", headers={"Authorization": "Bearer sk-first"})
        assert status == 200 and 'uform_requests_total{route="embeddings",status="401"}' in body, body
        server.stop()
        assert "without an API key" not in server.stderr(), server.stderr()
    finally:
        server.kill()

    # Bad key sources are named.
    for flags, expected in ((["--api-key", ""], "--api-key must not be empty"),
                            (["--api-key-file", os.path.join(workdir, "absent")], "absent"),
                            (["--api-key-file", os.devnull], "holds no key")):
        done = subprocess.run([uform, "serve", "--model", model, "--port", "0", *flags], capture_output=True,
                              timeout=120)
        assert done.returncode != 0 and expected in done.stderr.decode(), (flags, done.stderr.decode())

    # Another address than a loopback one: one line on stderr without a key, none with one.
    for flags, warned in (([], True), (["--api-key", "sk-first"], False)):
        server = Server(uform, model, workdir, "anywhere", "--threads", "1", "--host", "0.0.0.0", *flags)
        try:
            wait_until("no warning", lambda: not warned or "without an API key" in server.stderr(), 10)
            server.stop()
            log = server.stderr()
            assert ("without an API key" in log) == warned, log
            assert log.count("without an API key") <= 1, log
        finally:
            server.kill()
    print("keys: 401 in OpenAI's shape on every route but /health, OpenAI's client with each key; "
          "the warning for 0.0.0.0 without a key")


# ---- tls ----------------------------------------------------------------------------------------

def tls(uform, model, workdir, reference):
    import openai
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx

    openssl = shutil.which("openssl")
    if not openssl:
        print("the openssl command is missing (apt-get install openssl)")
        if in_ci():
            return 1
        return SKIP
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=120)
    server = Server(uform, model, workdir, "tls", "--threads", "1", "--api-key", "sk-tls", "--tls-cert", cert,
                    "--tls-key", key)
    try:
        assert server.url.startswith("https://127.0.0.1:"), server.url
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-tls", max_retries=0, timeout=120,
                               http_client=httpx.Client(verify=cert, timeout=120))
        assert [model.id for model in client.models.list()] == [server.name]
        floats = client.embeddings.create(model=server.name, input=TEXTS, encoding_format="float")
        assert [f32_bytes(item.embedding) for item in floats.data] == reference, "vectors over TLS differ"
        default = client.embeddings.create(model=server.name, input=TEXTS[:3])
        assert [f32_bytes(item.embedding) for item in default.data] == reference[:3]
        nokey = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-other", max_retries=0, timeout=120,
                              http_client=httpx.Client(verify=cert, timeout=120))
        try:
            nokey.embeddings.create(model=server.name, input=TEXTS[0])
        except openai.AuthenticationError:
            pass
        else:
            raise AssertionError("another key was accepted over TLS")
        # Plain HTTP on the TLS port gets no HTTP answer.
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        try:
            answer = sock.recv(100)
        except ConnectionResetError:
            answer = b""
        sock.close()
        assert not answer.startswith(b"HTTP/"), answer
        server.stop()
    finally:
        server.kill()

    # Files that are missing or not PEM are named.
    garbage = os.path.join(workdir, "garbage.pem")
    with open(garbage, "w") as file:
        file.write("not a certificate\n")
    for flags, expected in ((["--tls-cert", cert], "--tls-cert and --tls-key go together"),
                            (["--tls-cert", os.path.join(workdir, "absent.pem"), "--tls-key", key], "absent.pem"),
                            (["--tls-cert", cert, "--tls-key", os.path.join(workdir, "gone.pem")], "gone.pem"),
                            (["--tls-cert", garbage, "--tls-key", key], "garbage.pem")):
        done = subprocess.run([uform, "serve", "--model", model, "--port", "0", *flags], capture_output=True,
                              timeout=120)
        assert done.returncode != 0 and expected in done.stderr.decode(), (flags, done.stderr.decode())
    print("TLS: OpenAI's client over https with the test's CA, plain HTTP refused, bad files named")
    return 0


CASES = {"half_closed_burst_blocks_server": half_closed_burst_blocks_server,
         "abandoned_requests_are_computed": abandoned_requests_are_computed,
         "api_key_not_checked": api_key_not_checked, "tls": tls}


def main():
    options, model = serve_test_setup(
        __doc__, ["openai"], "UFORM_SERVE_REEXEC",
        lambda parser: parser.add_argument("--case", required=True, choices=sorted(CASES)))
    reference = encode_rows(options.uform, model, TEXTS)
    assert len(reference[0]) == DIMS * 4
    return CASES[options.case](options.uform, model, options.workdir, reference) or 0


if __name__ == "__main__":
    sys.exit(main())
