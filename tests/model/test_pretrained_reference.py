#!/usr/bin/env python3
"""`uform encode` of sentence-transformers folders against sentence-transformers 3.0.1, text by text, on
random-weight folders at the shapes of published embedders (pretrained_folders.py).

    test_pretrained_reference.py --uform build/tools/uform --workdir DIR [--families NAME,...]
    test_pretrained_reference.py --self-check --workdir DIR    the checks on stand_in_encode.py: as the
                                                               reference, every check passes; with each of
                                                               its faults, the checks fail where they can
                                                               see it; with BF16's roundings, they pass

For every family the folder is written into WORKDIR/folders (reused while its stamp matches), the texts are
embedded by sentence-transformers (CPU, float32, batches of 32, as a user's `encode` does) and by the
command (`uform encode --model FOLDER --manifest FILE --format jsonl`, one run), and then:
  - the command loads the folder and gives one row per text;
  - its vectors are as wide as sentence-transformers' (the pooling's width);
  - each text's cosine is at least 0.9999 (COSINE): every weight is a BF16 value, so an engine that
    holds its weights in BF16 holds them exactly, and what is left is the arithmetic's rounding;
  - each vector's norm is within 1% of sentence-transformers' (NORM): unit where the folder has a
    Normalize module, the pooling's own where it has none (a wrong normalization is off by far more; an
    engine whose hidden states are BF16 moves an unnormalized norm by some 0.4%, as far as COSINE allows);
  - where `uform encode --help` names --prompt-name (a prompt of config_sentence_transformers.json) or
    --prompt (a text), the families with prompts are embedded with each and compared again; a command
    without them leaves those checks out (and says so), while a folder's default_prompt_name, which
    sentence-transformers applies to every text unasked, is checked by the default-prompt family in any case.
A failure prints, per text (the first ten of a family), the text, its cosine and the first values of both.
For the tanh GELU families it also prints whether the command's vectors lie nearer to the tanh reference
than to the exact (erf) one, where its rounding lets that be told: the two differ by less than the cosine
can see (see --self-check). A text holding a code point whose cut depends on the Unicode version
(corpus.py: tokenizers 0.19.1 reads older tables than the engine) is counted apart and does not fail.

The texts: the tokenizer corpus's edge cases (tests/tokenizer/corpus.py: empty, blank, controls, marks,
scripts, special tokens written in the text, long words), texts with Python-only or Unicode blanks at their
ends (sentence-transformers strips texts with str.strip() before tokenizing), a few short and multilingual
ones, texts of exactly max_seq_length - 2, - 1 and + 0 one-token words, and texts of thousands of words; with
the corpus (Debian packages), a sample of its lines across scripts and long texts joined from them.

Exit status 0 when every check passes, 1 on any failure (a folder the command refuses fails), 77 (skip)
where torch, transformers or sentence-transformers cannot be imported by any interpreter found
(tests/reference/interpreter.py; under CI=true that fails instead).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "reference"))
sys.path.insert(0, str(HERE.parents[0] / "tokenizer"))
sys.path.insert(0, str(HERE))

from interpreter import partly_unavailable, run_under_python_with  # noqa: E402  (standard library only)

import pretrained_folders  # noqa: E402  (standard library until a folder is written)

COSINE = 0.9999
NORM = 1e-2
PRINTED_FAILURES = 10
# The families the self-check runs; the variants of stand_in_encode.py it expects the checks to see (each in
# its family), and those it expects them to pass: faults below what a cosine of COSINE sees, and the
# roundings of an engine that computes in BF16.
SELF_CHECK_FAMILIES = ("all-minilm-l6-v2", "e5-base", "multilingual-e5-small", "gelu-new", "default-prompt")
SEEN_VARIANTS = {"truncation-of-tokenizer-json": "all-minilm-l6-v2", "mean-without-special-tokens": "all-minilm-l6-v2",
                 "no-token-type": "all-minilm-l6-v2", "positions-from-zero": "multilingual-e5-small",
                 "no-strip": "multilingual-e5-small", "no-default-prompt": "default-prompt",
                 "normalized-always": "e5-base"}
PASSING_VARIANTS = {"erf-gelu": "gelu-new", "layer-norm-eps-1e-5": "all-minilm-l6-v2",
                    "bf16-matmul-inputs": "all-minilm-l6-v2", "bfloat16": "multilingual-e5-small"}

# Texts with blanks at their ends that str.strip() takes off and the tokenizers do not all drop alike
# (U+0085 and U+00A0 before a combining mark change XLM-R's Unigram pieces), short and multilingual texts.
OWN_TEXTS = [
    "a cat", "A cat sits on the mat.", "Hello, world!", "query: already prefixed",
    "\x1c\x1dtext between information separators\x1e\x1f", "\x85text between next-line characters\x85",
    "  \x85\u0300 \t", "\xa0\u0308$", "\u3000\u2028 text between Unicode blanks \u00a0\u2029", " \t\n ", "\x85",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440", "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4", "Gr\u00fc\u00dfe aus M\u00fcnchen, \u00e7a va?",
]
PROSE = ("The committee met on Tuesday to review the proposal, and after a long discussion about costs, "
         "timelines and the risks of delay, it agreed to fund a smaller first phase. ")


def family_texts(family, corpus_texts: list) -> list:
    """The texts of one family (the module's head lists them)."""
    import corpus

    edge = [text for _, text in corpus.EDGE_CASES]
    n = family.max_seq_length
    boundary = [corpus.many_words(n - 2), corpus.many_words(n - 1), corpus.many_words(n)]
    long = [PROSE * 120, corpus.many_words(5000)]
    return edge + OWN_TEXTS + boundary + long + corpus_texts


def corpus_texts(workdir: Path) -> list:
    """Some 30 corpus lines across scripts and a long text joined from Cyrillic ones, none whose cut depends on
    the Unicode version; none at all where the corpus cannot be built (its Debian packages are missing)."""
    import corpus
    import pretrained_support as support

    try:
        lines, scripts = support.corpus_lines(workdir / "corpus", versioned=False)
    except corpus.MissingPackages as error:
        partly_unavailable(f"the tokenizer corpus is not built (apt-get install {' '.join(error.packages)}): "
                           "its lines are left out of the texts")
        return []
    sample = support.sample_corpus(lines, scripts, 1)
    return [lines[i] for i in sample[::len(sample) // 30]] + support.long_texts(lines, scripts, 3000, ("Cyrillic",))


# ---------------------------------------------------------------------------------------------------
# The comparison


def compare(report, label: str, texts: list, reference, engine) -> bool:
    """Width, per-text cosines and norms of the command's rows against sentence-transformers'; prints the
    failing texts. A text holding a code point whose cut depends on the Unicode version (corpus.py) is
    counted apart, not failing. Answers whether all held."""
    import numpy as np
    import pretrained_support as support

    if not report.check(f"{label}: vectors {reference.shape[1]} wide, as sentence-transformers'",
                        engine.shape[1] == reference.shape[1], f"the command's are {engine.shape[1]}"):
        return False
    late = support.versioned(texts)
    cosine = support.cosines(engine, reference)
    norms = np.linalg.norm(reference, axis=1)
    ratio = np.linalg.norm(engine, axis=1) / np.maximum(norms, 1e-30)
    wrong = (cosine < COSINE) | (np.abs(ratio - 1) > NORM)
    kept = ~late
    ok_cosine = report.check(f"{label}: cosine >= {COSINE} for each of {int(kept.sum())} texts",
                             not np.any((cosine < COSINE) & kept),
                             f"min {cosine[kept].min():.6f}, mean {cosine[kept].mean():.6f}"
                             + (f"; {int(((cosine < COSINE) & kept).sum())} below" if np.any(wrong & kept) else ""))
    ok_norm = report.check(f"{label}: norms within {NORM:.1%} of sentence-transformers'",
                           not np.any((np.abs(ratio - 1) > NORM) & kept),
                           f"ratio {ratio[kept].min():.5f} .. {ratio[kept].max():.5f}, reference norms "
                           f"{norms.min():.4f} .. {norms.max():.4f}")
    if np.any(wrong & late):
        print(f"  --   {label}: of {int(late.sum())} texts holding a code point whose cut depends on the Unicode "
              f"version, {int((wrong & late).sum())} differ (not failing; min cosine {cosine[late].min():.6f})")
    for i in np.flatnonzero(wrong)[:PRINTED_FAILURES]:
        print(f"       text {i}{' (its cut depends on the Unicode version)' if late[i] else ''}: "
              f"{support.describe(texts[i])}\n"
              f"         cosine {cosine[i]:.6f}, norm ratio {ratio[i]:.5f}\n"
              f"         uform                 {support.first_values(engine[i])}\n"
              f"         sentence-transformers {support.first_values(reference[i])}")
    return ok_cosine and ok_norm


def prompt_flags(uform: str) -> dict:
    """The prompt flags `uform encode --help` names: {"--prompt-name": ..., "--prompt": ...} (present ones)."""
    import pretrained_support as support

    text = support.encode_help(uform)
    return {flag: True for flag, pattern in (("--prompt-name", r"--prompt-name\b"), ("--prompt", r"--prompt(?![-\w])"))
            if re.search(pattern, text)}


def has_convert(uform: str) -> bool:
    """Whether `uform --help` names the convert verb (the self-check's stand-in has none)."""
    import subprocess

    help_text = subprocess.run([uform, "--help"], capture_output=True, text=True).stdout
    return re.search(r"^\s*convert\b", help_text, re.MULTILINE) is not None


def check_converted(report, uform: str, name: str, folder: Path, texts: list, engine, workdir: Path,
                    convert: bool) -> None:
    """`uform convert FOLDER OUT.safetensors` writes one checkpoint whose embeddings of the texts are the folder's,
    bit for bit (the block's settings, the tokenizer and the modules travel in its metadata). Left out where the
    command has no convert (`convert` false: the self-check's stand-in)."""
    import subprocess

    import numpy as np
    import pretrained_support as support

    if not convert:
        print(f"  --   {name}: the command has no convert: its checkpoint is not checked", flush=True)
        return
    checkpoint = workdir / f"{name}.safetensors"
    run = subprocess.run([uform, "convert", str(folder), str(checkpoint)], capture_output=True, text=True)
    if run.returncode != 0:
        report.check(f"{name}: `uform convert` writes the folder as one checkpoint", False, run.stderr.strip())
        return
    try:
        again = support.engine_embeddings(uform, checkpoint, texts, workdir / f"{name}-converted.jsonl")
    except support.EngineRefused as error:
        report.check(f"{name}: the converted checkpoint loads and embeds the texts", False, str(error))
        return
    report.check(f"{name}: the converted checkpoint embeds {len(texts)} texts to the folder's bits",
                 again.shape == engine.shape and bool(np.array_equal(again, engine)),
                 f"max |difference| {float(np.max(np.abs(again - engine))) if again.shape == engine.shape else 'n/a'}")
    checkpoint.unlink()


def check_prompts(report, uform: str, name: str, family, folder: Path, model, texts: list, workdir: Path,
                  flags: dict) -> None:
    """The family's prompts asked for by name and given as text, where the command has the flags."""
    import pretrained_support as support

    if not family.prompts:
        return
    if not flags:
        print(f"  --   {name}: `uform encode --help` names neither --prompt-name nor --prompt: "
              "prompts asked for are not checked")
        return
    for prompt_name, prompt in family.prompts:
        asks = []
        if "--prompt-name" in flags:
            asks.append((f"--prompt-name {prompt_name}", ["--prompt-name", prompt_name], {"prompt_name": prompt_name}))
        if "--prompt" in flags:
            asks.append((f"--prompt {prompt!r}", ["--prompt", prompt], {"prompt": prompt}))
        for label, arguments, options in asks:
            reference = support.reference_embeddings(model, texts, **options)
            try:
                engine = support.engine_embeddings(uform, folder, texts, workdir / f"{name}.prompt.jsonl", arguments)
            except support.EngineRefused as error:
                report.check(f"{name} {label}: the command embeds with the prompt", False, str(error))
                continue
            compare(report, f"{name} {label}", texts, reference, engine)


def tanh_or_erf(name: str, folder: Path, texts: list, engine) -> None:
    """Prints whether the command's vectors lie nearer to the tanh GELU reference than to the erf one (over the
    texts whose cut does not depend on the Unicode version)."""
    import numpy as np
    import pretrained_support as support
    import stand_in_encode

    kept = ~support.versioned(texts)
    texts, engine = [text for text, keep in zip(texts, kept, strict=True) if keep], engine[kept]
    exact = support.reference_model(folder)
    stand_in_encode.with_variant(exact, "erf-gelu")
    erf = support.reference_embeddings(exact, texts)
    tanh = support.reference_embeddings(support.reference_model(folder), texts)
    near_tanh, near_erf, apart = (np.linalg.norm(engine - tanh), np.linalg.norm(engine - erf),
                                  np.linalg.norm(tanh - erf))
    if min(near_tanh, near_erf) > apart / 2:
        verdict = "cannot tell which GELU the command computes: its own rounding is the larger"
    else:
        verdict = f"the command computes the {'tanh' if near_tanh < near_erf else 'erf (exact)'} GELU"
    print(f"  --   {name}: {verdict} (distance to the tanh reference {near_tanh:.3g}, to the erf one {near_erf:.3g}, "
          f"between them {apart:.3g}; not failing: the cosine cannot see it)")


def expected_spans(model, text: str, prompt: str) -> tuple:
    """The token count and byte spans the command should give `text`: sentence-transformers cuts the prompt
    and the text joined, stripped by str.strip(), at max_seq_length; tokenizers' character offsets become
    bytes of `text`, and a special token or one of the prompt spans [0, 0)."""
    joined = prompt + text
    stripped = joined.strip()
    lead = len(joined[: len(joined) - len(joined.lstrip())].encode())
    before = len(prompt.encode())
    cut = model.tokenizer(stripped, truncation="longest_first", max_length=model.max_seq_length,
                          return_offsets_mapping=True, return_special_tokens_mask=True)
    spans = []
    for (begin, end), special in zip(cut["offset_mapping"], cut["special_tokens_mask"], strict=True):
        begin, end = len(stripped[:begin].encode()) + lead, len(stripped[:end].encode()) + lead
        spans.append((0, 0) if special or begin < before else (begin - before, end - before))
    return spans


def check_token_vectors(report, uform: str, name: str, family, folder: Path, model, texts: list,
                        workdir: Path) -> None:
    """`uform encode --tokens`: each token's vector against sentence-transformers' token embeddings (the
    transformer's last states, before pooling: cosine >= COSINE each, the command's being unit vectors where
    the folder normalizes; where the folder has a Dense module, the command projects each token through it as
    it projects the pooled state, and the reference's token embeddings go through the folder's own module),
    and its byte span in the text."""
    import numpy as np
    import pretrained_support as support
    import torch
    from sentence_transformers import models

    dense = next((module for module in model if isinstance(module, models.Dense)), None)

    prompt = dict(family.prompts).get(family.default_prompt_name, "") if family.default_prompt_name else ""
    support.write_manifest(workdir / f"{name}.tokens.jsonl", texts)
    try:
        out, _ = support.engine_run(uform, folder, workdir / f"{name}.tokens.jsonl", ["--format", "jsonl", "--tokens"])
        rows = [json.loads(line) for line in out.decode("utf-8").splitlines() if line.strip()]
    except (support.EngineRefused, ValueError) as error:
        report.check(f"{name}: the command gives token vectors", False, str(error))
        return
    worst, wrong_counts, wrong_spans, tokens = 1.0, [], [], 0
    for index, (text, row) in enumerate(zip(texts, rows, strict=True)):
        reference = model.encode(text, output_value="token_embeddings")
        if dense is not None:
            with torch.no_grad():
                reference = dense({"sentence_embedding": reference})["sentence_embedding"]
        reference = reference.numpy().astype(np.float64)
        ours = np.asarray(row["tokens"], dtype=np.float64)
        if ours.shape != reference.shape:
            wrong_counts.append(f"text {index}: {ours.shape} against {reference.shape}")
            continue
        tokens += len(ours)
        worst = min(worst, float(support.cosines(ours, reference).min()))
        spans = [tuple(span) for span in row["spans"]]
        expected = expected_spans(model, text, prompt)
        if spans != expected:
            first = next(i for i, (a, b) in enumerate(zip(spans, expected)) if a != b)
            wrong_spans.append(f"text {index} {support.describe(text)}: token {first}: {spans[first]} against "
                               f"{expected[first]}")
    report.check(f"{name}: one token vector per token for each of {len(texts)} texts", not wrong_counts,
                 "; ".join(wrong_counts[:PRINTED_FAILURES]) or f"{tokens} tokens")
    report.check(f"{name}: token vectors at cosine >= {COSINE} to sentence-transformers' token embeddings",
                 worst >= COSINE, f"min {worst:.6f} over {tokens} tokens")
    report.check(f"{name}: each token's byte span as the tokenizer's offsets give it", not wrong_spans,
                 "; ".join(wrong_spans[:PRINTED_FAILURES]))


def check_family(report, uform: str, name: str, workdir: Path, corpus_part: list, flags: dict,
                 convert: bool) -> None:
    import pretrained_support as support

    family = pretrained_folders.FAMILIES[name]
    print(f"== {name}, like {family.like}: {family.describe()}", flush=True)
    started = time.perf_counter()
    try:
        folder = pretrained_folders.write_folder(name, workdir / "folders" / name, workdir)
    except pretrained_folders.Unavailable as error:
        partly_unavailable(f"{name}: its folder cannot be made here: {error}")
        return
    texts = family_texts(family, corpus_part)
    model = support.reference_model(folder)
    reference = support.reference_embeddings(model, texts)
    built = time.perf_counter()
    try:
        engine = support.engine_embeddings(uform, folder, texts, workdir / f"{name}.jsonl")
    except support.EngineRefused as error:
        report.check(f"{name}: the command loads {folder} and embeds {len(texts)} texts", False, str(error))
        return
    ran = time.perf_counter()
    report.check(f"{name}: the command loads the folder and embeds {len(texts)} texts", True,
                 f"folder and reference {built - started:.1f} s, the command {ran - built:.1f} s")
    compare(report, name, texts, reference, engine)
    check_converted(report, uform, name, folder, texts, engine, workdir, convert)
    check_prompts(report, uform, name, family, folder, model, texts[:24] + texts[-4:], workdir, flags)
    kept = [text for text, late in zip(texts, support.versioned(texts), strict=True) if not late]
    check_token_vectors(report, uform, name, family, folder, model, kept[:32] + kept[-3:], workdir)
    if family.hidden_act != "gelu":
        tanh_or_erf(name, folder, texts, engine)


def run_checks(uform: str, workdir: Path, names: list):
    """Every family of `names` checked against the command `uform`: answers the report."""
    import torch
    import uform_reference

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    report = uform_reference.Report()
    flags = prompt_flags(uform)
    print(f"prompt flags of `uform encode`: {', '.join(flags) or 'none'}", flush=True)
    convert = has_convert(uform)
    corpus_part = corpus_texts(workdir)
    for name in names:
        check_family(report, uform, name, workdir, corpus_part, flags, convert)
    return report


def self_check(workdir: Path) -> int:
    """The checks on stand_in_encode.py: faithful, every check passes; with each of SEEN_VARIANTS, its family
    fails; with each of PASSING_VARIANTS, its family passes."""
    import stand_in_encode

    stand_in = str(HERE / "stand_in_encode.py")
    wrong = []
    print("--- the stand-in as the command: every check passes", flush=True)
    if run_checks(stand_in, workdir, list(SELF_CHECK_FAMILIES)).failures:
        wrong.append("the faithful stand-in failed")
    for variants, seen in ((SEEN_VARIANTS, True), (PASSING_VARIANTS, False)):
        for variant, family in variants.items():
            print(f"--- the stand-in with {variant!r} ({stand_in_encode.VARIANTS[variant]}): {family} "
                  f"{'fails' if seen else 'passes'}", flush=True)
            os.environ["UFORM_STAND_IN_VARIANT"] = variant
            failed = bool(run_checks(stand_in, workdir, [family]).failures)
            del os.environ["UFORM_STAND_IN_VARIANT"]
            if failed != seen:
                wrong.append(f"{variant} {'passed' if seen else 'failed'}")
    print(f"self-check: {'as expected' if not wrong else 'NOT as expected: ' + '; '.join(wrong)}")
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uform", help="the uform command (a .py file runs under this Python)")
    parser.add_argument("--workdir", type=Path, required=True, help="where the folders, corpus and manifests go")
    parser.add_argument("--families", help=f"a comma-separated subset of: {', '.join(pretrained_folders.FAMILIES)}")
    parser.add_argument("--self-check", action="store_true", help="check the checks on stand_in_encode.py")
    args = parser.parse_args()
    if not args.self_check and not args.uform:
        parser.error("--uform is required (or --self-check)")
    names = args.families.split(",") if args.families else list(pretrained_folders.FAMILIES)
    unknown = [name for name in names if name not in pretrained_folders.FAMILIES]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    run_under_python_with(pretrained_folders.MODULES)
    pretrained_folders.quiet_libraries()
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.self_check:
        return self_check(args.workdir)
    import harness

    return harness.summary(run_checks(os.path.abspath(args.uform), args.workdir, names))


if __name__ == "__main__":
    sys.exit(main())
