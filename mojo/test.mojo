"""Checks of the Mojo binding against the engine, one per example of the contract
(`shared/seed/uform-for-mojo.md`). The library comes from `UFORM_LIBRARY` (else the dynamic linker's
search); the model checks need `UFORM_TEST_CHECKPOINT` (a file `uform_tiny_checkpoint` wrote) and are
skipped without it. Any failed check raises, so the program exits non-zero."""

from std.os import getenv
from std.time import sleep
from std.math import isfinite

from uform import (
    Arena, Continuation, Deferred, Error as UFormError, EncodeConfig, EncodeStats, Executor, ExecutorKind, Library, Model, Mood,
    Outputs, Progress, RamOptions, ScalarKind, Status, TapeView,
)


def check(condition: Bool, what: String) raises:
    if not condition:
        raise Error("check failed: " + what)


def test_library(library: Library) raises:
    var version = library.version()
    check(version[0] == 4, "major version 4")
    check(library.status_name(Status.IO) == "io", "uform_status_name")
    check(Status.IO.name() == library.status_name(Status.IO), "Status.name matches the engine")
    check(Status.MISSING_SYMBOL.name() == library.status_name(Status.MISSING_SYMBOL), "the last status name")


def test_error(library: Library) raises:
    var executor = Executor(library)
    var caught1 = Optional[UFormError](None)
    try:
        _ = Model.load_ram(executor, "/nonexistent/missing.safetensors")
    except error:
        caught1 = error.copy()
    check(Bool(caught1), "loading a missing checkpoint raises")
    check(caught1.value().status == Status.IO, "a missing checkpoint is Status.IO")
    check(caught1.value().entry() == "uform_model_load_ram", "the entry point")
    var text = String(caught1.value())
    check(text.startswith("UForm: io [uform_model_load_ram]: "), "the rendering: " + text)
    check(text.byte_length() > 36, "a message follows")
    var caught2 = Optional[UFormError](None)
    try:
        _ = Library("/nonexistent/libuform.so")
    except error:
        caught2 = error.copy()
    check(Bool(caught2), "a missing library raises")
    check(caught2.value().status == Status.IO, "a missing library is Status.IO")


def test_executors(library: Library) raises:
    var inline = Executor(library)
    check(inline.kind() == ExecutorKind.INLINE, "the inline kind")
    var threads = Executor.for_ram(library, RamOptions(pin=False), threads=2)
    check(threads.kind() == ExecutorKind.RAM, "the RAM kind")
    check(threads.threads() == 2, "two threads")
    threads.nop()
    threads.drain(Mood.SPINNING)
    threads.drain(Mood.SLEEPING)
    var caught3 = Optional[UFormError](None)
    try:
        _ = Executor.for_ram(library, threads=-1)
    except error:
        caught3 = error.copy()
    check(Bool(caught3), "negative threads raise")
    check(caught3.value().status == Status.INVALID_ARGUMENT, "negative threads: the status C would answer")
    var arena = Arena(threads)
    arena.reserve(1 << 16)
    check(arena.capacity() >= 1 << 16, "reserve")
    _ = Arena(library)


def stop_halfway(completed: Int, total: Int, seen: Pointer[Int, MutAnyOrigin]) -> Continuation:
    seen[] = completed
    return Continuation.CANCEL if 2 * completed >= total else Continuation.CONTINUE


def hold_the_executor(completed: Int, total: Int, calls: Pointer[Int, MutAnyOrigin]) -> Continuation:
    calls[] += 1
    sleep(0.3)
    return Continuation.CONTINUE


def test_model(library: Library, path: String) raises:
    # The quick start.
    var executor = Executor.for_ram(library, RamOptions(pin=False), threads=2)
    var model = Model.load_ram(executor, path)
    var texts = "a cata dog".as_bytes()  # two texts end to end
    var offsets: List[UInt] = [0, 5, 10]
    var arena = Arena(executor)
    var encoded = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    check(encoded.items() == 2, "two items")
    check(encoded.status(0) == Status.OK and encoded.status(1) == Status.OK, "item statuses")
    var embeddings = encoded.embeddings().value()
    check(len(embeddings) == 2, "two rows")
    check(embeddings.columns() > 0, "columns")
    check(not encoded.token_vectors() and not encoded.states(), "unrequested outputs are absent")
    var first = embeddings.row[DType.float32](0)
    var norm: Float32 = 0
    for value in first:
        check(isfinite(value), "finite values")
        norm += value * value
    check(abs(norm - 1) < 1e-3, "embeddings are normalized")
    var reference = List[Float32](first)

    # The calling thread and the inline executor give the same rows, bitwise.
    var host = Arena(library)
    var here = model.text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS | Outputs.STATES, host)
    check(List[Float32](here.embeddings().value().row[DType.float32](0)) == reference, "calling thread, bitwise")
    check(Bool(here.states()), "states requested")
    var inline = Executor(library)
    var inline_arena = Arena(inline)
    var there = model.on(inline).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, inline_arena)
    check(List[Float32](there.embeddings().value().row[DType.float32](0)) == reference, "inline executor, bitwise")

    # A stale view: the arena's next call rewinds it.
    var generation = arena.generation()
    _ = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    check(arena.generation() != generation, "the generation moved")
    var caught4 = Optional[UFormError](None)
    try:
        _ = embeddings.row[DType.float32](0)
    except error:
        caught4 = error.copy()
    check(Bool(caught4), "a stale view raises")
    check(caught4.value().status == Status.INVALID_ARGUMENT, "a stale view is INVALID_ARGUMENT")

    # BF16 outputs and the stats slot.
    var stats = EncodeStats()
    var config = EncodeConfig(stats=Pointer(to=stats), outputs_scalar=ScalarKind.BF16)
    var halves = model.text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, host, config)
    var half_view = halves.embeddings().value()
    check(half_view.scalar() == ScalarKind.BF16, "BF16 view")
    check(abs(Float32(half_view.row[DType.bfloat16](0)[0]) - reference[0]) < 2e-2, "BF16 close to F32")
    check(stats.items == 2 and stats.failed == 0 and stats.bytes == 10, "stats written")
    var caught5 = Optional[UFormError](None)
    try:
        _ = half_view.row[DType.float32](0)
    except error:
        caught5 = error.copy()
    check(Bool(caught5), "a row read as the wrong dtype raises")
    check(caught5.value().status == Status.INVALID_ARGUMENT, "wrong dtype is INVALID_ARGUMENT")

    # A Deferred waited several times.
    var deferred_arena = Arena(executor)
    var call = model.deferred(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, deferred_arena)
    for _ in range(3):
        var waited = call.wait()
        check(List[Float32](waited.embeddings().value().row[DType.float32](0)) == reference, "deferred, bitwise")
    check(call.status() == Status.OK, "final status")

    # A progress handler that cancels halfway.
    var many = String()
    var many_offsets: List[UInt] = [0]
    for i in range(64):
        many += "text number " + String(i) + " "
        many_offsets.append(UInt(many.byte_length()))
    var seen = 0
    var cancelling = EncodeConfig(progress=Progress.of[stop_halfway](Pointer(to=seen), steps=10))
    var caught6 = Optional[UFormError](None)
    try:
        _ = model.on(executor).text_encode(TapeView.of(many.as_bytes(), many_offsets), Outputs.EMBEDDINGS, arena, cancelling)
    except error:
        caught6 = error.copy()
    check(Bool(caught6), "a cancelling handler raises")
    check(caught6.value().status == Status.CANCELLED, "Status.CANCELLED halfway")
    check(seen > 0 and 2 * seen >= 64, "the handler saw half the texts: " + String(seen))

    # A contended executor: a deferred call holds it (its handler sleeps) while a blocking one arrives.
    var calls = 0
    var slow = EncodeConfig(progress=Progress.of[hold_the_executor](Pointer(to=calls), steps=2))
    var held_arena = Arena(executor)
    var holding = model.deferred(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, held_arena, slow)
    var caught7 = Optional[UFormError](None)
    try:
        _ = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    except error:
        caught7 = error.copy()
    check(Bool(caught7), "a call on a held executor raises")
    check(caught7.value().status == Status.CONTENDED, "Status.CONTENDED")
    _ = holding.wait()
    check(calls > 0, "the holding call reported progress")
    executor.drain()


def main() raises:
    var library = Library()
    test_library(library)
    test_error(library)
    test_executors(library)
    var path = getenv("UFORM_TEST_CHECKPOINT")
    if not path:
        print("mojo: model checks skipped: UFORM_TEST_CHECKPOINT is not set")
    else:
        test_model(library, path)
        # The checkpoint tool from Mojo: the same seed writes a checkpoint that loads.
        var written = path + ".mojo.safetensors"
        library.write_tiny_checkpoint(written, seed=7)
        _ = Model.load_ram(Executor(library), written)
    print("mojo: all checks passed")
