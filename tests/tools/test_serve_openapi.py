#!/usr/bin/env python3
"""`uform serve`'s GET /openapi.json holds: schemathesis, run against a live server on a tiny checkpoint,
generates requests for every documented operation (and methods and bodies outside them) and finds no
5xx, no undocumented status, no answer outside its schema and no hang.

    test_serve_openapi.py --uform build/tools/uform --workdir build/tests/serve-openapi

Two models on each server: first (the model of requests that name none) a small BERT folder written
here (tests/model/pretrained_seeds.py's weights and WordPiece tokenizer), so that POST /tokenize cuts,
then the tiny checkpoint, which reads bytes. Three servers: one without a key; one with --api-key, the
key sent as a header; the same one with no header, where every route but /health and /openapi.json
answers the documented 401.

Needs the `schemathesis` package (re-run under the project's .venv, else exit 77, naming it). Exit
status: 0 pass, 1 fail, 77 skip."""

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

EXAMPLES = 30  # per operation and phase: bounds a run to a few hundred requests
RUN_SECONDS = 300  # a hang guard: a run takes seconds

# A body the schema allows may still be refused with 400 for what no schema says: a medium the engine
# cannot decode (invalid_media), a modality the model or the build lacks, or a text past the context
# with "truncate": false, a width of the other model; and POST /tokenize for a model that reads bytes
# answers 400 tokenizer_unavailable. schemathesis' positive_data_acceptance takes those statuses on those
# operations alone; every other check, and every other operation, is held as the document says.
CONFIG = """[[operations]]
include-path = "/v1/embeddings"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "404", "429"]

[[operations]]
include-path = "/tokenize"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "404"]
"""

SERVE_PATHS = {"/v1/embeddings", "/tokenize", "/v1/models", "/v1/models/{model}", "/health", "/ready", "/metrics",
               "/openapi.json"}


def document(url):
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=60) as answer:
        assert answer.status == 200, answer.status
        assert answer.headers["Content-Type"] == "application/json", answer.headers["Content-Type"]
        return json.loads(answer.read())


# The operations a key guards: without one sent, each answers 401 alone, as schemathesis warns.
KEYED = {"GET /metrics", "GET /ready", "GET /v1/models", "GET /v1/models/{model}", "HEAD /metrics",
         "HEAD /ready", "HEAD /v1/models", "HEAD /v1/models/{model}", "POST /v1/embeddings", "POST /tokenize"}


def write_words_folder(workdir):
    """A sentence-transformers BERT folder, 8 wide, mean pooling, a WordPiece tokenizer.json: what
    tests/model/pretrained_seeds.py writes for the pretrained fuzzer's corpus. Answers its path."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    import pretrained_seeds as seeds

    folder = Path(workdir) / "words"
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    files = {"config.json": seeds.config("bert", 0), "modules.json": modules,
             "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
             "sentence_bert_config.json": {"max_seq_length": 8},
             "tokenizer.json": seeds.tokenizer({"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}),
             "model.safetensors": seeds.bert_weights(1)}
    for name, content in files.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(folder)


def schemathesis(url, workdir, name, *flags, only_401=frozenset()):
    """One schemathesis run with every check; its summary is printed, and it must find nothing: no
    failure, and no warning but that the operations of `only_401` answered 401 alone."""
    config = os.path.join(workdir, "schemathesis.toml")
    with open(config, "w") as file:
        file.write(CONFIG)
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", config, "run",
               f"{url}/openapi.json", "--checks", "all", "--max-examples", str(EXAMPLES), "--seed", "20",
               "--request-timeout", "60", "--no-color", *flags]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_SECONDS, cwd=workdir)
    except subprocess.TimeoutExpired as timeout:
        raise AssertionError(f"schemathesis ({name}) did not end within {RUN_SECONDS} s:\n{timeout.stdout}")
    summary = done.stdout[done.stdout.find("=== SUMMARY ==="):] if "=== SUMMARY ===" in done.stdout else done.stdout
    print(f"schemathesis, {name}:\n{summary.rstrip()}", flush=True)
    assert done.returncode == 0, f"schemathesis ({name}) exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    if only_401:
        found = re.search(r"returned only 401/403 responses\n\n401 Unauthorized \(\d+ operations\):\n((?:  - .*\n)+)",
                          done.stdout)
        assert found, done.stdout
        assert {line[4:] for line in found.group(1).splitlines()} == only_401, found.group(1)
        assert re.search(r"=+ 1 warning in ", done.stdout), done.stdout
    else:
        assert "No issues found" in done.stdout, done.stdout
    assert "Tested: 13" in done.stdout, "schemathesis did not test every operation"


def main():
    from test_serve import Server, serve_test_setup  # noqa: E402
    options, model = serve_test_setup(__doc__, ["schemathesis", "numpy"], "UFORM_SERVE_REEXEC")
    words, tiny = f"words={write_words_folder(options.workdir)}", ["--model", f"tiny={model}"]

    server = Server(options.uform, words, options.workdir, "open", *tiny, "--threads", "1")
    try:
        served = document(server.url)
        assert served["openapi"].startswith("3.0"), served["openapi"]
        assert set(served["paths"]) == SERVE_PATHS, sorted(served["paths"])
        assert served["components"]["securitySchemes"]["bearer"] == {
            "type": "http", "scheme": "bearer",
            "description": served["components"]["securitySchemes"]["bearer"]["description"]}
        widths = served["components"]["schemas"]["EmbeddingsRequest"]["properties"]["dimensions"]["enum"]
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=60) as answer:
            listed = json.loads(answer.read())["data"]
        assert [item["id"] for item in listed] == ["words", "tiny"], listed
        every = {width for item in listed for width in (item["dimensions"], *item["matryoshka"])}
        assert sorted(w for w in widths if w is not None) == sorted(every), widths
        schemathesis(server.url, options.workdir, "no key")
        server.stop()
    finally:
        server.kill()

    server = Server(options.uform, words, options.workdir, "keyed", *tiny, "--threads", "1", "--api-key",
                    "sk-openapi")
    try:
        assert document(server.url) == served, "the document differs on a server with a key"
        schemathesis(server.url, options.workdir, "--api-key, the key sent",
                     "--header", "Authorization: Bearer sk-openapi")
        schemathesis(server.url, options.workdir, "--api-key, no key sent", only_401=KEYED)
        server.stop()
    finally:
        server.kill()
    print("serve-openapi: /openapi.json holds against schemathesis, without a key, with it, and without it sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
