#!/usr/bin/env python3
"""`uform serve` with two models: the demo checkpoint (models/demo.safetensors, which reads bytes) as
"demo", and a sentence-transformers BERT folder with random weights and a default prompt
(tests/model/pretrained_folders.py's "default-prompt") as "minilm".

    test_serve_models.py --uform build/tools/uform --workdir build/tests/serve-models

Checks:
  - the listening line names both, GET /v1/models lists both in order with their dimensions, context
    length and whether they have a tokenizer, and GET /v1/models/NAME answers each;
  - POST /v1/embeddings: each model's vectors equal, bit for bit in F32, what `uform encode` writes with
    that model, under 32 concurrent clients that mix both models; a request naming no model is the first's;
    an unknown model is 404 model_not_found naming the served ones;
  - POST /tokenize against Hugging Face's tokenizers 0.19.1 on the folder's tokenizer.json, as
    text-embeddings-inference answers: the default prompt put before each text unless prompt_name names
    another, no truncation (a text of 600 tokens stays whole), per token its id, special_tokens_mask,
    id_to_token for a special token with null offsets, else the byte offsets of the prompted text and its
    bytes between them; add_special_tokens false; an added token's content inside a text is not special;
  - refusals that leave the server serving both models: /tokenize on the model that reads bytes (400
    tokenizer_unavailable), an unknown prompt_name, empty inputs, a body that is not JSON, a model that
    is not served, texts past --batch-bytes with their prompt (413 inputs_too_large);
  - the command line: --name with two models or beside a NAME=PATH, and two models of one name, are usage
    errors (exit 2);
  - a model given by its hub id in the local Hugging Face cache (HF_HUB_CACHE) is served under that id,
    with the folder's vectors.

Needs torch, sentence-transformers and tokenizers to write the folder, and nothing else (re-run under
a Python that has them, else exit 77, naming them). Exit status: 0 pass, 1 fail, 77 skip."""

import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[0] / "model"))

MODULES = ["torch", "numpy", "scipy", "sklearn", "transformers", "tokenizers", "sentence_transformers"]
FAMILY = "default-prompt"  # BERT, 384 wide, one block, prompts "query" (the default) and "document" ("")
DEMO = HERE.parents[1] / "models" / "demo.safetensors"

TEXTS = ["a cat sits on the mat", "Hello, wörld! [SEP] and [MASK] inside", "ünïcødé текст 文字 😀",
         "tabs\tand\nnewlines", "x"]


def encode_rows(uform, model, texts, width):
    """Raw little-endian F32 rows of `uform encode --model MODEL`, one bytes object per text."""
    done = subprocess.run([uform, "encode", "--model", model, "--format", "f32", "--", *texts],
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert len(done.stdout) == len(texts) * width * 4, (len(done.stdout), width)
    return [done.stdout[i * width * 4:(i + 1) * width * 4] for i in range(len(texts))]


def f32_bytes(values):
    return struct.pack(f"<{len(values)}f", *values)


def expected_tokens(tokenizer, prompt, text, add_special):
    """What text-embeddings-inference answers for one input: the prompted text encoded whole, its character
    offsets turned into UTF-8 byte offsets, a special token's string from id_to_token."""
    prompted = prompt + text
    encoding = tokenizer.encode(prompted, add_special_tokens=add_special)
    data = prompted.encode()
    starts = [0]
    for character in prompted:
        starts.append(starts[-1] + len(character.encode()))
    tokens = []
    for token_id, (begin, end), special in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask):
        if special:
            tokens.append({"id": token_id, "text": tokenizer.id_to_token(token_id), "special": True,
                           "start": None, "stop": None})
            continue
        start, stop = starts[begin], starts[end]
        tokens.append({"id": token_id, "text": data[start:stop].decode("utf-8", "replace"), "special": False,
                       "start": start, "stop": stop})
    return tokens


def check_models(server, demo_dims, minilm_dims):
    from test_serve import request

    status, _, body = request(server.port, "GET", "/v1/models")
    assert status == 200, body
    listed = [(m["id"], m["dimensions"], m["context_length"], m["tokenizer"], m["dims"], m["context"])
              for m in body["data"]]
    assert listed == [("demo", demo_dims, 64, False, demo_dims, 64), ("minilm", minilm_dims, 256, True, minilm_dims,
                                                                          256)], listed
    for name in ("demo", "minilm"):
        status, _, body = request(server.port, "GET", f"/v1/models/{name}")
        assert status == 200 and body["id"] == name, body
    status, _, body = request(server.port, "GET", "/v1/models/other")
    assert status == 404 and body["error"]["code"] == "model_not_found", body
    print("GET /v1/models: both models, in order, with dimensions, context_length and tokenizer")


def check_embeddings(server, references):
    from test_serve import embed

    for name, rows in references.items():
        status, _, body = embed(server.port, {"model": name, "input": TEXTS, "encoding_format": "float"})
        assert status == 200, body
        assert body["model"] == name, body["model"]
        assert [f32_bytes(item["embedding"]) for item in body["data"]] == rows, f"{name}: vectors differ"
    status, _, body = embed(server.port, {"input": TEXTS[0], "encoding_format": "float"})
    assert status == 200 and body["model"] == "demo", body
    assert f32_bytes(body["data"][0]["embedding"]) == references["demo"][0]
    status, _, body = embed(server.port, {"model": "text-embedding-3-small", "input": "a"})
    assert status == 404 and body["error"]["code"] == "model_not_found", body
    assert "'demo', 'minilm'" in body["error"]["message"], body

    # 32 clients at once, each asking both models in a random order: batches hold one model's parts.
    failures = []

    def client(seed):
        generator = random.Random(seed)
        for _ in range(4):
            name = generator.choice(["demo", "minilm"])
            picked = generator.sample(range(len(TEXTS)), generator.randint(1, len(TEXTS)))
            status, _, body = embed(server.port, {"model": name, "input": [TEXTS[i] for i in picked],
                                                  "encoding_format": "float"})
            if status != 200 or [f32_bytes(item["embedding"]) for item in body["data"]] != \
                    [references[name][i] for i in picked]:
                failures.append((seed, name, status))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:5]
    print("POST /v1/embeddings: each model's vectors equal `uform encode`'s, under 32 clients mixing both")


def check_tokenize(server, folder):
    from test_serve import request
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    query = "Represent this sentence for searching relevant passages: "
    long_text = "the stock markets " * 200  # 600 tokens and more: past the context, not truncated

    def tokenize(body):
        return request(server.port, "POST", "/tokenize", {"model": "minilm", **body})

    cases = [({"inputs": TEXTS[1]}, query, [TEXTS[1]], True),
             ({"inputs": TEXTS}, query, TEXTS, True),
             ({"inputs": TEXTS, "add_special_tokens": False}, query, TEXTS, False),
             ({"inputs": TEXTS, "prompt_name": "document"}, "", TEXTS, True),
             ({"inputs": [TEXTS[2]], "prompt_name": "query", "add_special_tokens": True}, query, [TEXTS[2]], True),
             ({"inputs": long_text, "prompt_name": "document"}, "", [long_text], True)]
    for body, prompt, texts, special in cases:
        status, _, answer = tokenize(body)
        assert status == 200, (body, answer)
        expected = [expected_tokens(tokenizer, prompt, text, special) for text in texts]
        assert answer == expected, (body, answer, expected)
    status, _, answer = tokenize({"inputs": long_text, "prompt_name": "document"})
    assert len(answer[0]) > 600, len(answer[0])
    # [SEP] and [MASK] inside a text are added tokens matched there: not special, their bytes as text.
    status, _, answer = tokenize({"inputs": TEXTS[1], "prompt_name": "document"})
    inside = [token for token in answer[0] if token["text"] in ("[SEP]", "[MASK]") and not token["special"]]
    assert len(inside) == 2 and all(token["start"] is not None for token in inside), answer
    assert answer[0][0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}, answer[0][0]
    # The first model reads bytes: a request naming none goes to it.
    status, _, answer = request(server.port, "POST", "/tokenize", {"inputs": "a"})
    assert status == 400 and answer["error"]["code"] == "tokenizer_unavailable", answer
    print(f"POST /tokenize: {len(cases)} requests equal tokenizers' ids, special_tokens_mask, id_to_token and "
          "byte offsets, prompts included, nothing truncated")


def check_token_context(server, folder):
    """pretrained_text_context_counted_in_bytes: a model that reads tokens has its context in tokens, and
    the server once held a text's bytes against it, flagging a 360-byte text of some 120 tokens as
    truncated and refusing it under "truncate": false. Now its tokens count (its default prompt's with
    them): usage, "truncated" and the refusal as the engine cuts the text."""
    from test_serve import embed
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    query = "Represent this sentence for searching relevant passages: "
    short, long = "a cat sits on the mat " * 16, "the stock markets fell sharply " * 60
    counts = [len(tokenizer.encode((query + text).strip()).ids) for text in (short, long)]
    assert len(short.encode()) > 256 and counts[0] < 256 < counts[1], counts
    status, _, body = embed(server.port, {"model": "minilm", "input": [short, long], "truncate": True})
    assert status == 200, body
    assert [item["truncated"] for item in body["data"]] == [False, True], body["data"]
    assert body["usage"]["prompt_tokens"] == counts[0] + 256, (body["usage"], counts)
    status, _, body = embed(server.port, {"model": "minilm", "input": short, "truncate": False})
    assert status == 200 and body["data"][0]["truncated"] is False, body
    status, _, body = embed(server.port, {"model": "minilm", "input": long, "truncate": False})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert f"{counts[1]} tokens" in body["error"]["message"], body
    print(f"POST /v1/embeddings: a tokenized model's context counted in tokens ({counts[0]} and {counts[1]} of 256)")


def check_refusals(server, references):
    from test_serve import assert_error, embed, request

    refusals = [({"model": "demo", "inputs": "a"}, 400, "tokenizer_unavailable"),
                ({"model": "minilm", "inputs": "a", "prompt_name": "title"}, 400, "invalid_value"),
                ({"model": "minilm", "inputs": []}, 400, "invalid_value"),
                ({"model": "minilm", "inputs": ""}, 400, "invalid_value"),
                ({"model": "minilm", "inputs": ["a", 3]}, 400, "invalid_type"),
                ({"model": "minilm", "inputs": "a", "add_special_tokens": "yes"}, 400, "invalid_type"),
                ({"model": "minilm"}, 400, "missing_required_parameter"),
                ({"model": "nope", "inputs": "a"}, 404, "model_not_found"),
                ({"model": 7, "inputs": "a"}, 400, "invalid_type"),
                ({"model": "minilm", "inputs": ["a" * 200000, "b" * 70000]}, 413, "inputs_too_large")]
    for body, status_expected, code in refusals:
        status, _, answer = request(server.port, "POST", "/tokenize", body)
        assert status == status_expected, (str(body)[:200], status, str(answer)[:300])
        assert_error(status, answer, status_expected, code)
    status, _, answer = request(server.port, "POST", "/tokenize", "{not json")
    assert_error(status, answer, 400, "invalid_json")
    status, _, answer = request(server.port, "GET", "/tokenize")
    assert_error(status, answer, 405, "method_not_allowed")
    for name, rows in references.items():
        status, _, body = embed(server.port, {"model": name, "input": TEXTS[0], "encoding_format": "float"})
        assert status == 200 and f32_bytes(body["data"][0]["embedding"]) == rows[0], body
    print(f"{len(refusals) + 2} refusals answered with their errors; both models serve after them")


def check_hub_id(uform, workdir, folder, rows):
    from test_serve import Server, embed

    cache = workdir / "hub-cache"
    repository = cache / "models--owner--minilm"
    commit = "5" * 40
    (repository / "refs").mkdir(parents=True, exist_ok=True)
    (repository / "snapshots").mkdir(parents=True, exist_ok=True)
    (repository / "refs" / "main").write_text(commit)
    if not (repository / "snapshots" / commit).exists():
        (repository / "snapshots" / commit).symlink_to(folder.resolve())
    server = Server(uform, "owner/minilm", str(workdir), "hub", "--threads", "2",
                    env={**os.environ, "HF_HUB_CACHE": str(cache)})
    try:
        assert server.names == ["owner/minilm"], server.names
        status, _, body = embed(server.port, {"model": "owner/minilm", "input": TEXTS, "encoding_format": "float"})
        assert status == 200 and body["model"] == "owner/minilm", body
        assert [f32_bytes(item["embedding"]) for item in body["data"]] == rows, "vectors differ"
        server.stop(expect=0)
    finally:
        server.kill()
    print("--model OWNER/NAME: a hub id in the local cache, served under that id with the folder's vectors")


def check_command_line(uform, demo, folder):
    for arguments, said in ((["--model", f"a={demo}", "--model", f"b={folder}", "--name", "c"], "--name names"),
                            (["--model", f"a={demo}", "--name", "c"], "--name and --model NAME=PATH"),
                            (["--model", f"a={demo}", "--model", f"a={folder}"], "two models are named 'a'")):
        done = subprocess.run([uform, "serve", "--port", "0", *arguments], capture_output=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr.decode(), (arguments, done.returncode, done.stderr)
    print("--name with two models or with a NAME=PATH, and two models of one name: usage errors")


def main():
    from test_serve import Server, serve_test_setup

    options, _ = serve_test_setup(__doc__, MODULES, "UFORM_SERVE_MODELS_REEXEC")
    import pretrained_folders

    pretrained_folders.quiet_libraries()
    workdir = Path(options.workdir).resolve()
    try:
        folder = pretrained_folders.write_folder(FAMILY, workdir / FAMILY, workdir)
    except pretrained_folders.Unavailable as error:
        print(f"SKIP: {error}")
        return 77
    uform, demo = options.uform, str(DEMO)
    info = subprocess.run([uform, "info", "--model", demo], capture_output=True, text=True, check=True).stdout
    demo_dims = int(next(line.split()[-1] for line in info.splitlines() if line.startswith("dims")))
    minilm_dims = pretrained_folders.FAMILIES[FAMILY].hidden
    references = {"demo": encode_rows(uform, demo, TEXTS, demo_dims),
                  "minilm": encode_rows(uform, str(folder), TEXTS, minilm_dims)}

    server = Server(uform, f"demo={demo}", options.workdir, "models", "--model", f"minilm={folder}",
                    "--threads", "2", "--batch-delay-us", "2000")
    try:
        assert server.names == ["demo", "minilm"] and server.name == "demo", server.names
        check_models(server, demo_dims, minilm_dims)
        check_embeddings(server, references)
        check_tokenize(server, folder)
        check_token_context(server, folder)
        check_refusals(server, references)
        server.stop(expect=0)
    finally:
        server.kill()
    check_command_line(uform, demo, folder)
    check_hub_id(uform, workdir, folder, references["minilm"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
