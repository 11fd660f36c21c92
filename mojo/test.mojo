"""Checks of the Mojo binding against the engine, one per example of the contract
(`shared/seed/uform-for-mojo.md`). The library comes from `UFORM_LIBRARY` (else the dynamic linker's
search); the model checks need `UFORM_TEST_CHECKPOINT` (a file `uform_tiny_checkpoint` wrote) and are
skipped without it. Any failed check raises, so the program exits non-zero."""

from std.os import getenv
from std.time import sleep
from std.math import isfinite, nan, sin, pi
from std.ffi import c_int, external_call

from uform import (
    Arena, Continuation, Deferred, DeferredLoad, Error as UFormError, EncodeConfig, EncodeStats, Executor, ExecutorKind,
    Feature, Library, LoadConfig, PoolWork, ThreadPool, Model, ModelInfo, ModelVerbs, Mood, Outputs, Progress, RamOptions, ScalarKind, Source,
    Status, TapeView, View, VramOptions, Mesh, MeshCollectives, MeshOptions, Modality, Trainer, TrainerConfig, TrainerInitRamConfig,
    TrainerInitVramConfig, TrainerStepConfig, TrainerStepStats, Weights, Tokenizer, TokenizerVerbs, TokenizeConfig,
    TokenizeStats, Tokenized,
)
from uform._c import _field


def check(condition: Bool, what: String) raises:
    if not condition:
        raise Error("check failed: " + what)


def test_library(library: Library) raises:
    var version = library.version()
    check(version[0] == 4, "major version 4")
    check(library.status_name(Status.IO) == "io", "uform_status_name")
    var kernels = library.kernels()
    check(kernels[0].byte_length() > 0, "uform_kernels names the kernel path")
    check(kernels[1].startswith(kernels[0] + ": ") or kernels[1] == "UFORM_KERNELS", "uform_kernels says why")
    check(kernels[2].startswith("amx: "), "uform_kernels gives AMX's state")
    check(Status.IO.name() == library.status_name(Status.IO), "Status.name matches the engine")
    check(Status.MISSING_SYMBOL.name() == library.status_name(Status.MISSING_SYMBOL), "the last status name")
    var not_id = Optional[UFormError](None)
    try:
        _ = library.hub_folder("owner/../x")
    except error:
        not_id = error.copy()
    check(Bool(not_id), "uform_hub_folder refuses what is no hub id")
    check(not_id.value().status == Status.INVALID_ARGUMENT, "a malformed hub id is Status.INVALID_ARGUMENT")
    var not_cached = Optional[UFormError](None)
    try:
        _ = library.hub_folder("uform-tests/never-cached")
    except error:
        not_cached = error.copy()
    check(Bool(not_cached), "uform_hub_folder raises for a model not cached")
    check(not_cached.value().status == Status.IO, "a model not cached is Status.IO")
    check(not_cached.value().entry() == "uform_hub_folder", "its entry point")


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
    # RamOptions.on(domains), pinned as the defaults are: the first NUMA domain. Domains need hwloc: a
    # build without it answers UNSUPPORTED, as C does.
    if library.has(Feature.HWLOC):
        var on_domain = Executor.for_ram(library, RamOptions.on([0]), threads=2)
        check(on_domain.domains() == 1, "one domain")
    else:
        var caught_domains = Optional[UFormError](None)
        try:
            _ = Executor.for_ram(library, RamOptions.on([0]), threads=2)
        except error:
            caught_domains = error.copy()
        check(Bool(caught_domains), "domains without hwloc raise")
        check(caught_domains.value().status == Status.UNSUPPORTED, "domains without hwloc: UNSUPPORTED")
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
    # A tape given by its address and length, as a device buffer's would be, reads the same bytes.
    var address_arena = Arena(executor)
    var by_address = model.on(executor).text_encode(
        TapeView.of(texts.unsafe_ptr(), len(texts), offsets), Outputs.EMBEDDINGS, address_arena)
    check(List[Float32](by_address.embeddings().value().row[DType.float32](0)) == reference, "a tape by address, bitwise")
    # The two-argument form, `TapeView.of(buffer.unsafe_ptr(), offsets)`: the length is the last offset.
    var buffer = List[UInt8](texts)
    var pointer_arena = Arena(executor)
    var by_pointer = model.on(executor).text_encode(TapeView.of(buffer.unsafe_ptr(), offsets), Outputs.EMBEDDINGS,
                                                    pointer_arena)
    check(rows_equal(by_pointer.embeddings().value(), 0, by_address.embeddings().value(), 0)
          and rows_equal(by_pointer.embeddings().value(), 1, by_address.embeddings().value(), 1),
          "TapeView.of(pointer, offsets) encodes as TapeView.of(pointer, length, offsets), bitwise")

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
    check(half_view.scalar_bytes() == 2 and embeddings.scalar_bytes() == 4, "uform_scalar_size")
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


def expect(caught: Optional[UFormError], status: Status, what: String) raises:
    """A captured error (captured outside the `try`, whose error type is `uform.Error`) has `status`."""
    check(Bool(caught), what + ": raises")
    check(caught.value().status == status,
          what + ": expected " + String(status) + ", got " + String(caught.value()))


def norm(row: Span[Float32, _]) -> Float32:
    var total: Float32 = 0
    for value in row:
        total += value * value
    return total


def is_zero(row: Span[Float32, _]) -> Bool:
    for value in row:
        if value != 0:
            return False
    return True


def rows_equal(a: View[_], i: Int, b: View[_], j: Int) raises -> Bool:
    return List[Float32](a.row[DType.float32](i)) == List[Float32](b.row[DType.float32](j))


def read_file(path: String) raises -> List[UInt8]:
    with open(path, "r") as f:  # std builtin `open` and `FileHandle.read_bytes`
        return f.read_bytes()


def tape_of(items: List[String]) -> Tuple[List[UInt8], List[UInt]]:
    """Strings end to end, and one more offset than strings."""
    var data = List[UInt8]()
    var offsets: List[UInt] = [0]
    for item in items:
        data.extend(Span(item.as_bytes()))
        offsets.append(UInt(len(data)))
    return (data^, offsets^)


def bytes_tape(files: List[List[UInt8]]) -> Tuple[List[UInt8], List[UInt]]:
    var data = List[UInt8]()
    var offsets: List[UInt] = [0]
    for file in files:
        data.extend(Span(file))
        offsets.append(UInt(len(data)))
    return (data^, offsets^)


def gradient(width: Int, height: Int, seed: Int) -> List[UInt8]:
    """The RGB8 pixels `run_test.py` writes into its PNGs (`write_png`)."""
    var pixels = List[UInt8]()
    for y in range(height):
        for x in range(width):
            pixels.append(UInt8((x * 7 + y * 3 + seed) % 256))
            pixels.append(UInt8((x * 2 + seed * 5) % 256))
            pixels.append(UInt8((y * 9 + seed) % 256))
    return pixels^


def text_rows[V: ModelVerbs](verbs: V, mut arena: Arena) raises -> List[Float32]:
    """Any receiver of the blocking verbs (the `ModelVerbs` trait): the model itself or `model.on(executor)`."""
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var encoded = verbs.text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    return List[Float32](encoded.embeddings().value().row[DType.float32](1))


def test_i8_weights(library: Library, path: String, quantized: String) raises:
    # A checkpoint quantized ahead loads as I8 and embeds as the BF16 one quantized as it loads, bitwise;
    # its rows stay near the BF16 weights' rows.
    var executor = Executor(library)
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var rows = List[List[Float32]]()
    for which in range(3):
        var weights = Weights.BF16 if which == 0 else Weights.I8
        var model = Model.load_ram(executor, quantized if which == 2 else path, LoadConfig(weights=weights))
        check(model.info().weights == weights.code, "ModelInfo.weights says how the layers run")
        var arena = Arena(executor)
        var encoded = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
        rows.append(List[Float32](encoded.embeddings().value().row[DType.float32](1)))
    check(rows[1] == rows[2], "I8 at load and I8 stored, bitwise")
    var dot: Float32 = 0
    for i in range(len(rows[0])):
        dot += rows[0][i] * rows[1][i]
    check(dot > 0.99, "I8 embeddings near BF16 ones")


def test_verbs_trait(library: Library, model: Model, executor: Executor) raises:
    var host = Arena(library)
    var arena = Arena(executor)
    check(text_rows(model, host) == text_rows(model.on(executor), arena), "ModelVerbs: the same rows on either receiver")


def count_bytes(completed: Int, total: Int, last: Pointer[Int, MutAnyOrigin]) -> Continuation:
    last[] = completed
    return Continuation.CONTINUE


def test_info_and_loads(library: Library, path: String, executor: Executor) raises:
    var model = Model.load_ram(executor, path)
    var info = model.info()
    check(info.has_text and info.has_image and info.has_video and info.has_audio and info.has_logit,
          "the tiny checkpoint has every tower")
    check(info.dims > 0 and info.parameters > 0 and info.bytes > 0, "sizes")
    check(info.text.context == 64 and info.image.size == 32 and info.image.patch == 8, "the tiny defaults")
    check(info.text.transformer.hidden == 64 and info.text.transformer.heads == 1, "the text tower: " + String(info.text.transformer))
    check(info.video.frames > 0 and info.audio.rate > 0 and info.audio.seconds > 0, "video and audio geometry")
    var widths = info.matryoshka_widths()
    check(len(widths) == Int(info.matryoshka_count), "matryoshka widths")
    for i in range(len(widths)):
        check(widths[i] > 0 and widths[i] <= Int(info.dims), "a matryoshka width within dims")
        if i > 0:
            check(widths[i] > widths[i - 1], "matryoshka widths ascend")

    # Load progress, in bytes of tensor data, with the checkpoint mapped.
    var last = 0
    var mapped = Model.load_ram(executor, path, LoadConfig(progress=Progress.of[count_bytes](Pointer(to=last)), map=True))
    check(last == Int(info.bytes), "load progress ends at the tensor bytes: " + String(last))
    check(mapped.info().parameters == info.parameters, "a mapped load is the same model")

    # A progress handler that cancels a load halfway.
    var seen = 0
    var caught = Optional[UFormError](None)
    try:
        _ = Model.load_ram(executor, path, LoadConfig(progress=Progress.of[stop_halfway](Pointer(to=seen), steps=10)))
    except error:
        caught = error.copy()
    expect(caught, Status.CANCELLED, "a load cancelled halfway")
    check(2 * seen >= Int(info.bytes), "the handler saw half the bytes")

    # A deferred load, waited several times, then taken.
    var load = Model.load_ram_deferred(executor, path)
    for _ in range(3):
        check(load.wait().info().dims == info.dims, "a deferred load waited again")
    check(load.status() == Status.OK, "the load is final")
    var taken = load.take()
    var arena = Arena(executor)
    check(text_rows(taken.on(executor), arena) == text_rows(model.on(executor), arena), "the taken model encodes")
    var caught2 = Optional[UFormError](None)
    try:
        _ = load.wait()
    except error:
        caught2 = error.copy()
    expect(caught2, Status.INVALID_ARGUMENT, "a taken model")
    var missing = Model.load_ram_deferred(executor, "/nonexistent/missing.safetensors")
    for _ in range(2):
        var caught3 = Optional[UFormError](None)
        try:
            _ = missing.wait()
        except error:
            caught3 = error.copy()
        expect(caught3, Status.IO, "a deferred load of a missing file")
        check(caught3.value().entry() == "uform_model_load_ram", "its entry point")

    # A VRAM load through a host executor is refused with the engine's own status.
    var caught4 = Optional[UFormError](None)
    try:
        _ = Model.load_vram(executor, path)
    except error:
        caught4 = error.copy()
    check(Bool(caught4), "load_vram on a RAM executor raises")
    var status = caught4.value().status
    check(status == Status.INVALID_ARGUMENT or status == Status.UNSUPPORTED or status == Status.DEVICE,
          "load_vram on a RAM executor: " + String(caught4.value()))


def test_images(library: Library, model: Model, executor: Executor, media: String) raises:
    var a = media + "/a.png"
    var b = media + "/b.png"
    var bad = media + "/not_an_image.png"
    var paths = tape_of([a, b, bad, a, media + "/missing.png"])
    var stats = EncodeStats()
    var arena = Arena(executor)
    var encoded = model.on(executor).image_encode(TapeView.of(paths[0], paths[1]), Outputs.EMBEDDINGS | Outputs.TOKEN_VECTORS,
                                                  arena, EncodeConfig(stats=Pointer(to=stats)))
    check(encoded.items() == 5, "five images")
    check(encoded.status(0) == Status.OK and encoded.status(1) == Status.OK, "good images")
    check(encoded.status(2) == Status.FORMAT, "a file that is no image answers FORMAT: " + String(encoded.status(2)))
    check(encoded.status(4) == Status.IO, "a missing file answers IO")
    check(stats.items == 5 and stats.failed == 2, "stats count the failed images")
    var embeddings = encoded.embeddings().value()
    check(abs(norm(embeddings.row[DType.float32](0)) - 1) < 1e-3, "image rows are unit-norm")
    check(abs(norm(embeddings.row[DType.float32](1)) - 1) < 1e-3, "image rows are unit-norm")
    check(is_zero(embeddings.row[DType.float32](2)), "a failed image's row is zero")
    check(rows_equal(embeddings, 0, embeddings, 3), "the same file gives the same row, bitwise")
    check(not rows_equal(embeddings, 0, embeddings, 1), "different images differ")
    var tokens = encoded.token_vectors().value()
    var patches = (32 // 8) * (32 // 8)
    check(len(tokens) == 5 * patches, "token vectors: one row per patch")
    var offsets = tokens.row_offsets()
    check(len(offsets) == 6 and offsets[1] == patches and offsets[5] == 5 * patches, "token vectors grouped per image")
    var reference = List[Float32](embeddings.row[DType.float32](0))

    # Encoded bytes in memory give the rows their files give.
    var files = bytes_tape([read_file(a), read_file(b)])
    var host = Arena(library)
    var in_memory = model.image_encode(TapeView.of(files[0], files[1]), Outputs.EMBEDDINGS, host, source=Source.MEMORY)
    check(List[Float32](in_memory.embeddings().value().row[DType.float32](0)) == reference, "memory source, bitwise")

    # Pixels: the PNG's own pixels give its row; identical inputs give equal unit-norm rows; a zero side
    # answers that item's INVALID_ARGUMENT.
    var pixels = gradient(40, 24, 1)
    var twice = List[UInt8](pixels)
    twice.extend(Span(pixels))
    var pixel_offsets: List[UInt] = [0, UInt(len(pixels)), UInt(2 * len(pixels)), UInt(2 * len(pixels))]
    var heights: List[UInt] = [24, 24, 0]
    var widths: List[UInt] = [40, 40, 5]
    var pixel_arena = Arena(executor)
    var from_pixels = model.on(executor).image_encode_pixels(TapeView.of(twice, pixel_offsets), heights, widths,
                                                             Outputs.EMBEDDINGS, pixel_arena)
    var rows = from_pixels.embeddings().value()
    check(abs(norm(rows.row[DType.float32](0)) - 1) < 1e-3, "pixel rows are unit-norm")
    check(rows_equal(rows, 0, rows, 1), "identical pixels give equal rows")
    check(from_pixels.status(2) == Status.INVALID_ARGUMENT, "a zero side answers INVALID_ARGUMENT for its item")
    check(is_zero(rows.row[DType.float32](2)), "the bad item's row is zero")
    var decoded = rows.row[DType.float32](0)
    for i in range(len(reference)):
        check(abs(decoded[i] - reference[i]) < 1e-5, "a PNG decodes to the pixels it holds")

    # The deferred forms answer the blocking rows.
    var deferred_arena = Arena(executor)
    var call = model.deferred(executor).image_encode(TapeView.of(paths[0], paths[1]), Outputs.EMBEDDINGS, deferred_arena)
    for _ in range(2):
        var waited = call.wait()
        check(List[Float32](waited.embeddings().value().row[DType.float32](0)) == reference, "deferred image_encode")
        check(waited.status(2) == Status.FORMAT, "deferred: the bad image's status")
    var pixel_call = model.deferred(executor).image_encode_pixels(TapeView.of(twice, pixel_offsets), heights, widths,
                                                                  Outputs.EMBEDDINGS, deferred_arena)
    check(List[Float32](pixel_call.wait().embeddings().value().row[DType.float32](1)) == List[Float32](decoded),
          "deferred image_encode_pixels")


def test_video(library: Library, model: Model, executor: Executor, media: String) raises:
    var info = model.info()
    var clip = media + "/clip.y4m"
    var paths = tape_of([clip, media + "/missing.y4m"])
    var arena = Arena(executor)
    var encoded = model.on(executor).video_encode(TapeView.of(paths[0], paths[1]), Outputs.EMBEDDINGS | Outputs.TOKEN_VECTORS, arena)
    check(encoded.status(0) == Status.OK, "the clip encodes: " + String(encoded.status(0)))
    check(encoded.status(1) == Status.IO, "a missing clip answers IO")
    var embeddings = encoded.embeddings().value()
    check(abs(norm(embeddings.row[DType.float32](0)) - 1) < 1e-3, "clip rows are unit-norm")
    check(len(encoded.token_vectors().value()) == 2 * Int(info.video.frames), "one token vector per sampled frame")
    var reference = List[Float32](embeddings.row[DType.float32](0))
    var bytes = bytes_tape([read_file(clip)])
    var host = Arena(library)
    var in_memory = model.video_encode(TapeView.of(bytes[0], bytes[1]), Outputs.EMBEDDINGS, host, source=Source.MEMORY)
    check(List[Float32](in_memory.embeddings().value().row[DType.float32](0)) == reference, "a clip in memory, bitwise")
    var deferred_arena = Arena(executor)
    var call = model.deferred(executor).video_encode(TapeView.of(bytes[0], bytes[1]), Outputs.EMBEDDINGS, deferred_arena,
                                                     source=Source.MEMORY)
    check(List[Float32](call.wait().embeddings().value().row[DType.float32](0)) == reference, "deferred video_encode")


def test_audio(library: Library, model: Model, executor: Executor, media: String) raises:
    var info = model.info()
    var wav = media + "/tone.wav"
    var paths = tape_of([wav, wav])
    var arena = Arena(executor)
    var encoded = model.on(executor).audio_encode(TapeView.of(paths[0], paths[1]), Outputs.EMBEDDINGS, arena)
    check(encoded.status(0) == Status.OK, "the sound encodes: " + String(encoded.status(0)))
    var embeddings = encoded.embeddings().value()
    check(abs(norm(embeddings.row[DType.float32](0)) - 1) < 1e-3, "sound rows are unit-norm")
    check(rows_equal(embeddings, 0, embeddings, 1), "the same sound gives the same row")
    var reference = List[Float32](embeddings.row[DType.float32](0))
    var bytes = bytes_tape([read_file(wav)])
    var host = Arena(library)
    var in_memory = model.audio_encode(TapeView.of(bytes[0], bytes[1]), Outputs.EMBEDDINGS, host, source=Source.MEMORY)
    check(List[Float32](in_memory.embeddings().value().row[DType.float32](0)) == reference, "a sound in memory, bitwise")

    # Samples: two identical tones, a NaN one and a too short one, at the model's rate.
    var rate = Int(info.audio.rate)
    var count = rate  # one second
    var samples = List[Float32]()
    for _ in range(2):
        for i in range(count):
            samples.append(Float32(0.3 * sin(2 * pi * 440 * Float64(i) / Float64(rate))))
    for i in range(count):
        samples.append(nan[DType.float32]() if i == count // 2 else Float32(0))  # std.math `nan`
    samples.append(0.5)
    var offsets: List[UInt] = [0, UInt(count), UInt(2 * count), UInt(3 * count), UInt(3 * count + 1)]
    var stats = EncodeStats()
    var sample_arena = Arena(executor)
    var from_samples = model.on(executor).audio_encode_samples(TapeView.of(samples, offsets), rate, Outputs.EMBEDDINGS,
                                                               sample_arena, EncodeConfig(stats=Pointer(to=stats)))
    var rows = from_samples.embeddings().value()
    check(abs(norm(rows.row[DType.float32](0)) - 1) < 1e-3, "sample rows are unit-norm")
    check(rows_equal(rows, 0, rows, 1), "identical samples give equal rows")
    check(from_samples.status(2) == Status.INVALID_ARGUMENT, "a NaN sample answers INVALID_ARGUMENT for its item")
    check(from_samples.status(3) == Status.INVALID_ARGUMENT, "a clip shorter than a patch answers INVALID_ARGUMENT")
    check(stats.failed == 2 and Int(stats.bytes) == len(samples) * 4, "sample stats")
    var caught = Optional[UFormError](None)
    try:
        _ = model.audio_encode_samples(TapeView.of(samples, offsets), 0, Outputs.EMBEDDINGS, host)
    except error:
        caught = error.copy()
    expect(caught, Status.INVALID_ARGUMENT, "a rate of 0")
    var deferred_arena = Arena(executor)
    var call = model.deferred(executor).audio_encode_samples(TapeView.of(samples, offsets), rate, Outputs.EMBEDDINGS, deferred_arena)
    check(List[Float32](call.wait().embeddings().value().row[DType.float32](1)) == List[Float32](rows.row[DType.float32](0)),
          "deferred audio_encode_samples")
    var sound_call = model.deferred(executor).audio_encode(TapeView.of(paths[0], paths[1]), Outputs.EMBEDDINGS, Arena(executor))
    check(List[Float32](sound_call.wait().embeddings().value().row[DType.float32](1)) == reference, "deferred audio_encode")


def test_choose(library: Library, model: Model, executor: Executor) raises:
    var texts = "the cat sat on thea dog".as_bytes()
    var offsets: List[UInt] = [0, 16, 23]
    var states_arena = Arena(executor)
    var encoded = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.STATES, states_arena)
    var states = encoded.states().value()
    var choices = "mnb xyz".as_bytes()
    var choice_offsets: List[UInt] = [0, 3, 7]
    var arena = Arena(executor)
    var probabilities = model.on(executor).text_choose(states, TapeView.of(choices, choice_offsets), arena)
    check(len(probabilities) == 7 and probabilities.columns() == 1, "one F32 per legal byte")
    var groups = probabilities.row_offsets()
    check(len(groups) == 3 and groups[0] == 0 and groups[1] == 3 and groups[2] == 7, "grouped per item")
    var values = probabilities.copy_out[DType.float32]()
    for item in range(2):
        var total: Float32 = 0
        for row in range(groups[item], groups[item + 1]):
            check(values[row] > 0 and values[row] < 1, "a probability")
            total += values[row]
        check(abs(total - 1) < 1e-4, "probabilities sum to 1 per item")
    var deferred_arena = Arena(executor)
    var call = model.deferred(executor).text_choose(states, TapeView.of(choices, choice_offsets), deferred_arena)
    for _ in range(2):
        check(call.wait().copy_out[DType.float32]() == values, "deferred text_choose, bitwise")
    # A repeated legal byte, and states in the arena the call rewinds.
    var repeated = "aa xyz".as_bytes()
    var repeated_offsets: List[UInt] = [0, 2, 6]
    var caught = Optional[UFormError](None)
    try:
        _ = model.text_choose(states, TapeView.of(repeated, repeated_offsets), arena)
    except error:
        caught = error.copy()
    expect(caught, Status.INVALID_ARGUMENT, "a repeated legal byte")
    # States in the arena the call rewinds (C answers INVALID_ARGUMENT) do not compile in Mojo: the view
    # borrows `states_arena` immutably while the call takes it mutably (the argument exclusivity check).


def test_copy_out(library: Library, model: Model, executor: Executor) raises:
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var arena = Arena(executor)
    var encoded = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    var view = encoded.embeddings().value()
    var copied = view.copy_out[DType.float32]()
    check(len(copied) == len(view) * view.columns(), "copy_out packs every row")
    var row1 = List[Float32](view.row[DType.float32](1))
    for i in range(view.columns()):
        check(copied[view.columns() + i] == row1[i], "copy_out equals the rows read in place")
    # Matryoshka widths narrow the rows, still unit-norm.
    var widths = model.info().matryoshka_widths()
    if len(widths) > 0:
        var host = Arena(library)
        var narrow = model.text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, host, EncodeConfig(matryoshka=widths[0]))
        var narrow_view = narrow.embeddings().value()
        check(narrow_view.columns() == widths[0], "a matryoshka width")
        check(abs(norm(narrow_view.row[DType.float32](0)) - 1) < 1e-3, "a matryoshka prefix is renormalized")
    # I8 rows come with their scales.
    var i8_arena = Arena(executor)
    var quantized = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, i8_arena,
                                                   EncodeConfig(outputs_scalar=ScalarKind.I8))
    var i8_view = quantized.embeddings().value()
    var caught = Optional[UFormError](None)
    try:
        _ = i8_view.copy_out[DType.int8]()
    except error:
        caught = error.copy()
    expect(caught, Status.INVALID_ARGUMENT, "an I8 view copied without scales")
    var scaled = i8_view.copy_out_scaled()
    check(len(scaled[1]) == 2, "one scale per row")
    for i in range(view.columns()):
        check(abs(Float32(scaled[0][view.columns() + i]) * scaled[1][1] - row1[i]) < 2e-2, "I8 times its scale")
    # A stale view cannot be copied out.
    _ = model.on(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    var caught2 = Optional[UFormError](None)
    try:
        _ = view.copy_out[DType.float32]()
    except error:
        caught2 = error.copy()
    expect(caught2, Status.INVALID_ARGUMENT, "copying out a stale view")


def test_notifications(library: Library, model: Model, executor: Executor) raises:
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    # eventfd(2) through libc (std.ffi `external_call`, resolved against the C library the program links).
    var fd = external_call["eventfd", c_int](UInt32(0), c_int(0))
    check(fd >= 0, "eventfd")
    var arena = Arena(executor)
    var call = model.deferred(executor).notify_eventfd(Int(fd)).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    _ = call.wait()
    var counter: UInt64 = 0
    var got = external_call["read", Int](fd, Pointer(to=counter), UInt(8))  # read(2): the 8-byte counter
    check(got == 8 and counter == 1, "the engine wrote 1 to the eventfd: " + String(counter))
    _ = external_call["close", c_int](fd)
    # A ring fd of -1 turns ring notification off: OK, or UNSUPPORTED where io_uring is not available.
    var ring_arena = Arena(executor)
    var caught = Optional[UFormError](None)
    try:
        var ring_call = model.deferred(executor).notify_ring(-1, 7).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, ring_arena)
        _ = ring_call.wait()
    except error:
        caught = error.copy()
    if caught:
        expect(caught, Status.UNSUPPORTED, "notify_ring without io_uring")


def test_vram_trainer(library: Library, streams: Executor, directory: String) raises:
    """A VRAM trainer on four texts: the steps count and the loss falls, a save resumes on the device and on
    the host (the same files either residency writes)."""
    var config = small_trainer_config(library)
    var trainer = Trainer.init_vram(streams, config)
    var items: List[String] = ["a red circle", "a round red thing", "a blue square", "a square of blue"]
    var tape = tape_of(items)
    var modalities: List[Modality] = [Modality.TEXT, Modality.TEXT, Modality.TEXT, Modality.TEXT]
    var relations: List[UInt32] = [0, 1, 2, 3]
    var contents = TapeView.of(tape[0], tape[1])
    var first = TrainerStepStats()
    var last = TrainerStepStats()
    for i in range(20):
        last = trainer.on(streams).step(modalities, contents, TrainerStepConfig(relations=relations))
        check(Int(last.step) == i + 1, "a VRAM trainer's stats.step counts: " + String(last))
        if i == 0:
            first = last
    check(last.loss < 0.8 * first.loss, "a VRAM trainer's loss falls: " + String(first) + " -> " + String(last))
    var saved = directory + "/mojo-vram-trainer.safetensors"
    trainer.on(streams).save(saved)
    var resume = small_trainer_config(library)
    resume.resume_path = saved
    var on_device = Trainer.init_vram(streams, resume)
    var host = Executor.for_ram(library, RamOptions(pin=False), threads=2)
    var on_host = Trainer.init_ram(host, resume)
    var device_next = on_device.on(streams).step(modalities, contents, TrainerStepConfig(relations=relations))
    var host_next = on_host.on(host).step(modalities, contents, TrainerStepConfig(relations=relations))
    check(device_next.step == 21 and host_next.step == 21, "both residencies resume at step 20")
    check(abs(device_next.loss - host_next.loss) <= 2e-2 * host_next.loss, "and agree on the next loss")


def test_vram(library: Library, path: String) raises:
    """Only where a VRAM executor can be had: a VRAM trainer steps; device arenas refuse host accessors
    with DEVICE, and `copy_out` brings the rows to the host."""
    var streams = Executor.for_vram(library, VramOptions.on([0]))
    check(streams.kind() == ExecutorKind.VRAM, "the VRAM kind")
    test_vram_trainer(library, streams, getenv("UFORM_TEST_MEDIA", "/tmp"))
    if not path:
        return
    var model = Model.load_vram(streams, path)
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var arena = Arena(streams)
    var encoded = model.on(streams).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    var view = encoded.embeddings().value()
    var caught = Optional[UFormError](None)
    try:
        view.check()
    except error:
        caught = error.copy()
    expect(caught, Status.DEVICE, "a host accessor on device memory")
    var rows = view.copy_out[DType.float32]()
    check(abs(norm(Span(rows)[: view.columns()]) - 1) < 1e-2, "device rows copied out are unit-norm")


def test_device_executors(library: Library, path: String) raises:
    # VRAM executors: bound and callable everywhere; the engine's status where no GPU can be had.
    var caught = Optional[UFormError](None)
    var kind = Optional[ExecutorKind](None)
    try:
        var streams = Executor.for_vram(library, VramOptions.on([0]))
        kind = streams.kind()
    except error:
        caught = error.copy()
    if kind:
        test_vram(library, path)
    else:
        var expected = Status.DEVICE if library.has(Feature.CUDA) else Status.UNSUPPORTED
        expect(caught, expected, "a VRAM executor without a device")
        check(caught.value().entry() == "uform_executor_create_vram", "its entry point")
    # fork_union pools: UNSUPPORTED in builds without fork_union (a pool cannot be made here otherwise).
    if not library.has(Feature.FORK_UNION):
        var not_a_pool = 0
        var caught2 = Optional[UFormError](None)
        try:
            _ = Executor.on_pool(library, Pointer(to=not_a_pool).unsafe_bitcast[NoneType]())
        except error:
            caught2 = error.copy()
        expect(caught2, Status.UNSUPPORTED, "Executor.on_pool without fork_union")


struct SerialPool(ThreadPool):  # conforms to uform's `ThreadPool` trait; the engine calls it through C
    """A pool of the caller's that runs every thread's share on the calling thread, one after another."""

    var threads: Int
    var calls: Int

    def __init__(out self, threads: Int):
        self.threads = threads
        self.calls = 0

    def count_threads(self) -> Int:
        return self.threads

    def for_threads(mut self, work: PoolWork):
        self.calls += 1
        for thread in range(self.threads):
            work(thread)


def test_pool(library: Library, model: Model, executor: Executor) raises:
    var pool = SerialPool(3)
    var pooled = Executor.on_pool(library, pool)
    check(pooled.kind() == ExecutorKind.POOL, "the POOL kind")
    check(pooled.threads() == 3, "the pool's threads")
    var arena = Arena(pooled)
    var reference_arena = Arena(executor)
    check(text_rows(model.on(pooled), arena) == text_rows(model.on(executor), reference_arena), "a pool executor, bitwise")
    check(pool.calls > 0, "the engine fanned out through the pool")
    # A deferred call on a pool executor is final when the verb returns.
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var call = model.deferred(pooled).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena)
    check(call.status() == Status.OK, "final at once")
    _ = call^
    _ = pooled^  # the pool outlives the executor
    _ = pool^


def test_unfinished_deferred(library: Library, model: Model, executor: Executor) raises:
    # Destroying an unfinished Deferred waits for it: afterwards the executor is free and the handler ran.
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var calls = 0
    var slow = EncodeConfig(progress=Progress.of[hold_the_executor](Pointer(to=calls), steps=2))
    var arena = Arena(executor)
    var call = model.deferred(executor).text_encode(TapeView.of(texts, offsets), Outputs.EMBEDDINGS, arena, slow)
    check(call.status() == Status.PENDING, "pending while its handler sleeps")
    _ = call^  # `^` transfers the value into `_`, which destroys it here: `Deferred.__deinit__` waits
    check(calls > 0, "the destroyed call had run to the end")
    executor.nop()  # not CONTENDED: nothing holds the executor any more


# A WordPiece tokenizer.json, BERT's normalizer, pre-tokenizer and post-processor over a vocabulary of 16
# (tests/model/test_pretrained.c's, and run_test.py's BERT folder's).
comptime WORDPIECE_JSON = """{"version":"1.0","truncation":null,"padding":null,"added_tokens":[
{"id":0,"content":"[PAD]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":1,"content":"[UNK]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":2,"content":"[CLS]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":3,"content":"[SEP]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true},
"pre_tokenizer":{"type":"BertPreTokenizer"},
"post_processor":{"type":"BertProcessing","sep":["[SEP]",3],"cls":["[CLS]",2]},
"decoder":null,
"model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100,
"vocab":{"[PAD]":0,"[UNK]":1,"[CLS]":2,"[SEP]":3,"a":4,"cat":5,"sits":6,"on":7,"the":8,"mat":9,"##s":10,
"kitten":11,"rug":12,"stock":13,"markets":14,".":15}}}
"""


def tokenizer_texts() -> Tuple[List[UInt8], List[UInt]]:
    """Three texts and a fourth that is not UTF-8 (a lone 0xFF byte)."""
    var bad = List[UInt8](" bad ".as_bytes())
    bad.insert(0, 0xFF)
    return bytes_tape([List[UInt8]("A cat sits on the mat.".as_bytes()), List[UInt8]("Kittens  café".as_bytes()),
                       List[UInt8](), bad^])


# The expected tokens, as Hugging Face's tokenizers 0.19.1 cuts the same texts from the same file, its
# character offsets turned into byte offsets:
#     t = tokenizers.Tokenizer.from_str(WORDPIECE_JSON); e = t.encode(text)
#     e.ids, [(len(text[:b].encode()), len(text[:e].encode())) for b, e in e.offsets]
# ("é" is two bytes: "café" covers bytes 9 to 14, characters 9 to 13).
def expected_ids(item: Int) -> List[UInt32]:
    if item == 0:
        return [2, 4, 5, 6, 7, 8, 9, 15, 3]
    if item == 1:
        return [2, 11, 10, 1, 3]
    if item == 2:
        return [2, 3]
    return []


def expected_spans(item: Int) -> List[UInt32]:
    if item == 0:
        return [0, 0, 0, 1, 2, 5, 6, 10, 11, 13, 14, 17, 18, 21, 21, 22, 0, 0]
    if item == 1:
        return [0, 0, 0, 6, 6, 7, 9, 14, 0, 0]
    if item == 2:
        return [0, 0, 0, 0]
    return []


def check_tokenized(tokenized: Tokenized[_], what: String) raises:
    check(tokenized.items() == 4, what + ": four texts")
    for item in range(4):
        check(tokenized.status(item) == (Status.FORMAT if item == 3 else Status.OK), what + ": item status")
        check(tokenized.ids_of(item) == expected_ids(item), what + ": the ids of text " + String(item))
        check(tokenized.spans_of(item) == expected_spans(item), what + ": the spans of text " + String(item))
    # [CLS] and [SEP] are the post-processor's: special; the words are not.
    var flags = tokenized.special_of(1)
    check(len(flags) == 5 and flags[0] and not flags[1] and not flags[3] and flags[4], what + ": special flags")
    var ids = tokenized.ids()
    check(ids.scalar() == ScalarKind.U32 and ids.columns() == 1 and len(ids) == 16, what + ": one U32 row per token")
    check(tokenized.spans().columns() == 2 and len(tokenized.spans()) == 16, what + ": two U32 per token")
    var offsets = ids.row_offsets()
    check(len(offsets) == 5 and offsets[1] == 9 and offsets[3] == 16 and offsets[4] == 16, what + ": grouped per text")


def cancel_at_once(completed: Int, total: Int, calls: Pointer[Int, MutAnyOrigin]) -> Continuation:
    calls[] += 1
    return Continuation.CANCEL


def tokenize_on[V: TokenizerVerbs](verbs: V, mut arena: Arena) raises -> List[UInt32]:
    """Any receiver of the blocking verb (the `TokenizerVerbs` trait): the tokenizer or `tokenizer.on(executor)`."""
    var texts = "the cat".as_bytes()
    var offsets: List[UInt] = [0, 7]
    return verbs.text_tokenize(TapeView.of(texts, offsets), arena).ids_of(0)


def test_tokenizer(library: Library, directory: String) raises:
    if not library.has(Feature.TOKENIZERS):
        var caught = Optional[UFormError](None)
        try:
            _ = Tokenizer.parse(library, WORDPIECE_JSON.as_bytes())
        except error:
            caught = error.copy()
        expect(caught, Status.UNSUPPORTED, "a tokenizer in a build without tokenizers")
        print("mojo: tokenizer checks skipped: this build has no tokenizers")
        return
    var tokenizer = Tokenizer.parse(library, WORDPIECE_JSON.as_bytes())
    var info = tokenizer.info()
    check(info.vocabulary == 16 and info.max_length == 0 and info.special_added == 2, "TokenizerInfo: " + String(info))
    check(info.model_name() == "WordPiece", "the model's kind")
    check(tokenizer.token(2) == "[CLS]" and tokenizer.token(10) == "##s", "token strings by id")
    var no_token = Optional[UFormError](None)
    try:
        _ = tokenizer.token(16)
    except error:
        no_token = error.copy()
    expect(no_token, Status.INVALID_ARGUMENT, "an id no token has")
    var texts = tokenizer_texts()
    var tape = TapeView.of(texts[0], texts[1])

    # On the calling thread, with the stats slot.
    var stats = TokenizeStats()
    var host = Arena(library)
    check_tokenized(tokenizer.text_tokenize(tape, host, TokenizeConfig(stats=Pointer(to=stats))), "the calling thread")
    check(stats.items == 4 and stats.failed == 1 and stats.tokens == 16 and stats.bytes == UInt(len(texts[0])),
          "TokenizeStats: items, failed, tokens, bytes")
    # Blocking on an executor's threads, and the tape given by its address (the length the last offset).
    var executor = Executor.for_ram(library, RamOptions(pin=False), threads=2)
    var arena = Arena(executor)
    check_tokenized(tokenizer.on(executor).text_tokenize(TapeView.of(texts[0].unsafe_ptr(), texts[1]), arena),
                    "tokenizer.on(executor)")
    check(tokenize_on(tokenizer, host) == tokenize_on(tokenizer.on(executor), arena) and tokenize_on(tokenizer, host) == [2, 8, 5, 3],
          "TokenizerVerbs: the same ids on either receiver")
    # Deferred, waited several times.
    var deferred_arena = Arena(executor)
    var call = tokenizer.deferred(executor).text_tokenize(tape, deferred_arena)
    for _ in range(2):
        check_tokenized(call.wait(), "tokenizer.deferred(executor)")
    check(call.status() == Status.OK, "the deferred tokenize is final")
    # A deferred tokenize notifies an eventfd when final, as a deferred encode does.
    var fd = external_call["eventfd", c_int](UInt32(0), c_int(0))
    check(fd >= 0, "eventfd")
    var notifying = tokenizer.deferred(executor).notify_eventfd(Int(fd)).text_tokenize(tape, deferred_arena)
    check_tokenized(notifying.wait(), "a deferred tokenize notifying an eventfd")
    var counter: UInt64 = 0
    var got = external_call["read", Int](fd, Pointer(to=counter), UInt(8))  # read(2): the 8-byte counter
    check(got == 8 and counter == 1, "the engine wrote 1 to the eventfd: " + String(counter))
    _ = external_call["close", c_int](fd)
    # Without the post-processor's special tokens.
    var bare = tokenizer.text_tokenize(tape, host, TokenizeConfig(without_special_tokens=True))
    check(bare.ids_of(0) == [4, 5, 6, 7, 8, 9, 15] and bare.spans_of(1) == [0, 6, 6, 7, 9, 14],
          "without special tokens")
    check(len(bare.ids_of(2)) == 0, "an empty text without special tokens has no tokens")

    # A handler that cancels at its first report: CANCELLED, on the calling thread and deferred.
    var calls = 0
    var cancelling = TokenizeConfig(progress=Progress.of[cancel_at_once](Pointer(to=calls)))
    var caught = Optional[UFormError](None)
    try:
        _ = tokenizer.on(executor).text_tokenize(tape, arena, cancelling)
    except error:
        caught = error.copy()
    expect(caught, Status.CANCELLED, "a tokenize cancelled by its handler")
    check(calls >= 1, "the handler ran")
    var cancelled = tokenizer.deferred(executor).text_tokenize(tape, deferred_arena, cancelling)
    var caught2 = Optional[UFormError](None)
    try:
        _ = cancelled.wait()
    except error:
        caught2 = error.copy()
    expect(caught2, Status.CANCELLED, "a deferred tokenize cancelled by its handler")
    check_tokenized(tokenizer.on(executor).text_tokenize(tape, arena), "after a cancelled call")

    # From a file: the same tokens. A file that is no JSON, a component the engine lacks and a missing file
    # answer their statuses.
    var path = directory + "/mojo-tokenizer.json"
    with open(path, "w") as f:
        f.write(WORDPIECE_JSON)
    var opened = Tokenizer.open(library, path)
    check(opened.info().vocabulary == 16, "an opened tokenizer.json")
    check_tokenized(opened.text_tokenize(tape, host), "Tokenizer.open")
    var broken = directory + "/mojo-broken-tokenizer.json"
    with open(broken, "w") as f:
        f.write('{"model": {"type": "WordPiece", "vocab": ')
    var caught3 = Optional[UFormError](None)
    try:
        _ = Tokenizer.open(library, broken)
    except error:
        caught3 = error.copy()
    expect(caught3, Status.FORMAT, "a tokenizer.json cut short")
    check(caught3.value().entry() == "uform_tokenizer_open", "its entry point")
    var caught4 = Optional[UFormError](None)
    try:
        _ = Tokenizer.open(library, "/nonexistent/tokenizer.json")
    except error:
        caught4 = error.copy()
    expect(caught4, Status.IO, "a missing tokenizer.json")
    var unknown = String(WORDPIECE_JSON).replace('"type":"WordPiece"', '"type":"NoSuchModel"')
    var caught5 = Optional[UFormError](None)
    try:
        _ = Tokenizer.parse(library, unknown.as_bytes())
    except error:
        caught5 = error.copy()
    check(Bool(caught5), "a model the engine does not read raises")
    check(caught5.value().status == Status.UNSUPPORTED or caught5.value().status == Status.FORMAT,
          "a model the engine does not read: " + String(caught5.value()))
    check(caught5.value().entry() == "uform_tokenizer_parse", "its entry point")

def test_convert(library: Library, media: String) raises:
    """`Library.convert_checkpoint`: run_test.py's BERT folder written as one checkpoint, which loads to the
    same embeddings, bit for bit, and carries the folder's tokenizer; a missing folder answers IO."""
    var caught = Optional[UFormError](None)
    try:
        library.convert_checkpoint("/nonexistent/folder", media + "/mojo-never-written.safetensors")
    except error:
        caught = error.copy()
    expect(caught, Status.IO, "converting a missing folder")
    check(caught.value().entry() == "uform_checkpoint_convert", "its entry point")
    if not media or not library.has(Feature.TOKENIZERS):
        print("mojo: checkpoint conversion of a folder skipped: no UFORM_TEST_MEDIA or no tokenizers in this build")
        return
    var folder = media + "/bert"
    var converted = media + "/mojo-bert.safetensors"
    library.convert_checkpoint(folder, converted)
    var executor = Executor(library)
    var from_folder = Model.load_ram(executor, folder)
    var from_checkpoint = Model.load_ram(executor, converted)
    check(from_checkpoint.info().dims == 64 and from_checkpoint.info().text.vocab == 16, "the converted model's sizes")
    var texts = tape_of(["A cat sits on the mat.", "kittens", "stock markets"])
    var folder_arena = Arena(library)
    var checkpoint_arena = Arena(library)
    var a = from_folder.text_encode(TapeView.of(texts[0], texts[1]), Outputs.EMBEDDINGS, folder_arena)
    var b = from_checkpoint.text_encode(TapeView.of(texts[0], texts[1]), Outputs.EMBEDDINGS, checkpoint_arena)
    for row in range(3):
        check(rows_equal(a.embeddings().value(), row, b.embeddings().value(), row),
              "a converted folder embeds as the folder, bitwise")
        check(abs(norm(b.embeddings().value().row[DType.float32](row)) - 1) < 1e-3, "unit-norm rows")
    check(not rows_equal(b.embeddings().value(), 0, b.embeddings().value(), 1), "different texts differ")
    # The folder's tokenizer opens from the folder, and cuts as the file it holds.
    var tokenizer = Tokenizer.open(library, folder)
    var tokenized = tokenizer.text_tokenize(TapeView.of(texts[0], texts[1]), folder_arena)
    check(tokenized.ids_of(0) == expected_ids(0) and tokenized.ids_of(1) == [2, 11, 10, 3], "the folder's tokenizer")
    check(from_folder.prompt() == "" and from_checkpoint.prompt("") == "", "a folder without prompts: none")
    var no_prompt = Optional[UFormError](None)
    try:
        _ = from_folder.prompt(String("query"))
    except error:
        no_prompt = error.copy()
    expect(no_prompt, Status.INVALID_ARGUMENT, "a prompt the model lacks")
    # I8 weights, as quantize_checkpoint writes them.
    var quantized = media + "/mojo-bert-i8.safetensors"
    library.convert_checkpoint(folder, quantized, Weights.I8)
    check(Model.load_ram(executor, quantized).info().weights == Weights.I8.code, "converted with I8 weights")


def test_ram_options(library: Library) raises:
    # The engine's defaults, returned by value (`uform_ram_options_default`), and what an unset field takes
    # (`uform_ram_options_init`): the same executor either way.
    var defaults = RamOptions.defaults(library)
    check(len(defaults.domains) == 0, "every domain by default")
    check(defaults.threads.value() == 0 and defaults.spin_ns.value() == 0, "threads 0, spin 0 by default")
    check(defaults.pin.value(), "pinned by default")
    var unset = RamOptions()
    check(not unset.threads and not unset.spin_ns and not unset.pin, "a new RamOptions leaves every field unset")
    var from_defaults = Executor.for_ram(library, defaults, threads=2)
    var from_unset = Executor.for_ram(library, unset, threads=2)
    check(from_defaults.threads() == from_unset.threads() and from_defaults.domains() == from_unset.domains(),
          "explicit defaults and unset fields make the same executor")
    var caught = Optional[UFormError](None)
    try:
        _ = Executor.for_ram(library, RamOptions(threads=-3))
    except error:
        caught = error.copy()
    expect(caught, Status.INVALID_ARGUMENT, "negative RamOptions.threads")


def small_trainer_config(library: Library) -> TrainerConfig[]:
    """The defaults with small sizes: one block of 64, texts and images (the default warmup of 100 steps
    keeps 20 steps at 3e-3 smooth; a warmup of 2 let the contrastive loss spike at step 19)."""
    var config = TrainerConfig(library)
    config.depth = 1
    config.hidden = 64
    config.dims = 32
    config.context = 32
    config.towers = Modality.TEXT.tower() | Modality.IMAGE.tower()
    config.learning_rate = 3e-3
    return config^


def cancel_halfway(completed: Int, total: Int, calls: Pointer[Int, MutAnyOrigin]) -> Continuation:
    calls[] += 1
    return Continuation.CANCEL if 2 * completed >= total else Continuation.CONTINUE


def test_trainer(library: Library, directory: String) raises:
    var executor = Executor.for_ram(library, RamOptions(pin=False), threads=2)
    var defaults = TrainerConfig(library)
    check(defaults.depth == 2 and defaults.hidden == 128 and defaults.dims == 64, "uform_trainer_config_default sizes")
    check(defaults.learning_rate == 1e-3 and defaults.beta1 == 0.9 and defaults.beta2 == 0.999, "the optimizer defaults")
    check(defaults.warmup_steps == 100 and defaults.total_steps == 10000 and defaults.seed == 42, "the schedule defaults")
    check(defaults.towers == (Modality.TEXT.tower() | Modality.IMAGE.tower() | Modality.VIDEO.tower()
                              | Modality.AUDIO.tower()), "every tower by default")
    check(not defaults.resume_path and not defaults.mesh, "no resume, no mesh")
    var config = small_trainer_config(library)
    var trainer = Trainer.init_ram(executor, config)

    # Four texts, two related pairs: the loss falls over 20 steps, and the step counts.
    var items: List[String] = ["a red circle", "a round red thing", "a blue square", "a square of blue"]
    var tape = tape_of(items)
    var modalities: List[Modality] = [Modality.TEXT, Modality.TEXT, Modality.TEXT, Modality.TEXT]
    var relations: List[UInt32] = [0, 1, 2, 3]
    var contents = TapeView.of(tape[0], tape[1])
    var first = TrainerStepStats()
    var last = TrainerStepStats()
    for i in range(20):
        last = trainer.on(executor).step(modalities, contents, TrainerStepConfig(relations=relations))
        check(Int(last.step) == i + 1, "stats.step counts: " + String(last))
        check(last.loss > 0 and last.contrastive_loss > 0 and last.lm_loss > 0, "positive losses")
        check(last.learning_rate > 0 and last.learning_rate <= 3e-3, "the learning rate: " + String(last))
        if i == 0:
            first = last
    check(last.loss < 0.8 * first.loss, "the loss falls: " + String(first) + " -> " + String(last))

    # A save is an inference checkpoint: it loads, and encodes texts.
    var saved = directory + "/mojo-trainer.safetensors"
    trainer.on(executor).save(saved)
    var model = Model.load_ram(executor, saved)
    check(model.info().dims == 32 and model.info().text.transformer.hidden == 64, "the saved model's sizes")
    var arena = Arena(executor)
    var encoded = model.on(executor).text_encode(contents, Outputs.EMBEDDINGS, arena)
    check(len(encoded.embeddings().value()) == 4, "the saved model encodes")
    check(abs(norm(encoded.embeddings().value().row[DType.float32](0)) - 1) < 1e-3, "unit-norm rows")

    # A trainer resumed from the save continues at step 20.
    var resume = small_trainer_config(library)
    resume.resume_path = saved
    var resumed = Trainer.init_ram(executor, resume)
    var next = resumed.on(executor).step(modalities, contents, TrainerStepConfig(relations=relations))
    check(next.step == 21, "the resumed trainer continues at step 20: " + String(next))

    # An item related to itself: INVALID_ARGUMENT, and the trainer goes on.
    var itself: List[UInt32] = [2, 2]
    var caught = Optional[UFormError](None)
    try:
        _ = trainer.on(executor).step(modalities, contents, TrainerStepConfig(relations=itself))
    except error:
        caught = error.copy()
    expect(caught, Status.INVALID_ARGUMENT, "a relation of an item with itself")
    check(caught.value().entry() == "uform_trainer_step", "its entry point")
    # Its message is the error's own copy: the engine's next failure on this thread leaves it as it was.
    var past: List[UInt32] = [0, 99]
    var caught_past = Optional[UFormError](None)
    try:
        _ = trainer.on(executor).step(modalities, contents, TrainerStepConfig(relations=past))
    except error:
        caught_past = error.copy()
    expect(caught_past, Status.INVALID_ARGUMENT, "a relation past the batch")
    check(caught_past.value().message().startswith("relation 0: (0, 99)"), "its message: " + caught_past.value().message())
    check(caught.value().message().startswith("relation 0: (2, 2)"), "the first message kept: " + caught.value().message())
    var half: List[UInt32] = [0, 1, 2]
    var caught2 = Optional[UFormError](None)
    try:
        _ = trainer.on(executor).step(modalities, contents, TrainerStepConfig(relations=half))
    except error:
        caught2 = error.copy()
    expect(caught2, Status.INVALID_ARGUMENT, "a relation that is not a pair")
    var three: List[Modality] = [Modality.TEXT, Modality.TEXT, Modality.TEXT]
    var caught3 = Optional[UFormError](None)
    try:
        _ = trainer.on(executor).step(three, contents, TrainerStepConfig(relations=relations))
    except error:
        caught3 = error.copy()
    expect(caught3, Status.INVALID_ARGUMENT, "fewer modalities than items")

    # A deferred step, waited twice: the same stats, counted once.
    var call = trainer.deferred(executor).step(modalities, contents, TrainerStepConfig(relations=relations))
    var once = call.wait()
    var twice = call.wait()
    check(once.step == 21 and twice.step == 21 and once.loss == twice.loss, "a deferred step waited twice")
    check(call.status() == Status.OK, "final status")
    var bad_call = trainer.deferred(executor).step(modalities, contents, TrainerStepConfig(relations=itself))
    for _ in range(2):
        var caught4 = Optional[UFormError](None)
        try:
            _ = bad_call.wait()
        except error:
            caught4 = error.copy()
        expect(caught4, Status.INVALID_ARGUMENT, "a deferred bad step, waited")

    # A progress handler cancelling halfway through the step's phases: CANCELLED, and nothing moved.
    var calls = 0
    var caught5 = Optional[UFormError](None)
    try:
        _ = trainer.on(executor).step(modalities, contents, TrainerStepConfig(
            relations=relations, progress=Progress.of[cancel_halfway](Pointer(to=calls), steps=4)))
    except error:
        caught5 = error.copy()
    expect(caught5, Status.CANCELLED, "a step cancelled halfway")
    check(calls >= 2, "the handler ran: " + String(calls))
    var after = trainer.on(executor).step(modalities, contents, TrainerStepConfig(relations=relations))
    check(after.step == 22, "a cancelled step changed nothing: " + String(after))

    # A deferred save, then a save to a folder that does not exist.
    var saved2 = directory + "/mojo-trainer-deferred.safetensors"
    var save_call = trainer.deferred(executor).save(saved2)
    _ = save_call.wait()
    _ = save_call.wait()
    check(Model.load_ram(executor, saved2).info().dims == 32, "a deferred save loads")
    var caught6 = Optional[UFormError](None)
    try:
        trainer.on(executor).save("/nonexistent/dir/x.safetensors")
    except error:
        caught6 = error.copy()
    expect(caught6, Status.IO, "a save into a missing folder")

    # A trainer lives on the executor it was made on.
    var other = Executor.for_ram(library, RamOptions(pin=False), threads=1)
    var caught7 = Optional[UFormError](None)
    try:
        _ = trainer.on(other).step(modalities, contents, TrainerStepConfig(relations=relations))
    except error:
        caught7 = error.copy()
    expect(caught7, Status.INVALID_ARGUMENT, "a step on another executor")

    # Configs the engine refuses, and the VRAM constructor.
    var odd = small_trainer_config(library)
    odd.hidden = 65
    var caught8 = Optional[UFormError](None)
    try:
        _ = Trainer.init_ram(executor, odd)
    except error:
        caught8 = error.copy()
    expect(caught8, Status.INVALID_ARGUMENT, "hidden not a multiple of 64")
    var missing = small_trainer_config(library)
    missing.resume_path = "/nonexistent/model.safetensors"
    var caught9 = Optional[UFormError](None)
    try:
        _ = Trainer.init_ram(executor, missing)
    except error:
        caught9 = error.copy()
    expect(caught9, Status.IO, "resuming from a missing checkpoint")
    var caught10 = Optional[UFormError](None)
    try:
        _ = Trainer.init_vram(executor, small_trainer_config(library))
    except error:
        caught10 = error.copy()
    expect(caught10, Status.INVALID_ARGUMENT, "Trainer.init_vram on a host executor")
    check(caught10.value().entry() == "uform_trainer_init_vram", "its entry point")


def test_mesh(library: Library) raises:
    # Builds with MPI bootstrap a mesh over a RAM executor (this process alone: rank 0 of 1, not launched by
    # mpirun); builds without it raise UNSUPPORTED. Freeing the last mesh finalizes MPI, which cannot start
    # again in this process, so this is the process's only bootstrap.
    var executor = Executor.for_ram(library, RamOptions(pin=False), threads=1)
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var modalities: List[Modality] = [Modality.TEXT, Modality.TEXT]
    var relations: List[UInt32] = [0, 1]
    # A communicator to join needs MPI initialized by the application, which this process has not done:
    # refused before the engine reads it; without MPI in the build, UNSUPPORTED.
    var not_initialized_yet = Int64(0)
    var refused = Optional[UFormError](None)
    try:
        _ = Mesh.bootstrap(executor, MeshOptions(communicator=_field(Pointer(to=not_initialized_yet))))
    except error:
        refused = error.copy()
    expect(refused, Status.INVALID_ARGUMENT if library.has(Feature.MPI) else Status.UNSUPPORTED,
           "Mesh.bootstrap joining a communicator before MPI is initialized")
    if library.has(Feature.MPI):
        var mesh = Mesh.bootstrap(executor, MeshOptions())
        check(mesh.rank() == 0 and mesh.size() == 1, "a mesh of this process alone: rank 0 of 1")
        var info = mesh.info()
        check(info.rank == 0 and info.size == 1 and info.local_rank == 0 and info.local_size == 1,
              "Mesh.info: rank 0 of 1, alone on its node")
        check(info.collectives == MeshCollectives.HOST and info.device == -1 and info.usable and not info.broken,
              "Mesh.info: MPI on host memory, no device, usable")
        var config = TrainerInitRamConfig[origin_of(mesh)](library)
        config.depth = 1
        config.hidden = 64
        config.towers = Modality.TEXT.tower()
        config.mesh = Pointer(to=mesh)
        # The trainer keeps the mesh alive (its type carries the mesh's origin) until it is gone.
        var trainer = Trainer.init_ram(executor, config)
        var stats = trainer.on(executor).step(modalities, TapeView.of(texts, offsets), TrainerStepConfig(relations=relations))
        check(stats.step == 1, "a trainer over a bootstrapped mesh steps")
    else:
        var caught = Optional[UFormError](None)
        try:
            _ = Mesh.bootstrap(executor, MeshOptions())
        except error:
            caught = error.copy()
        expect(caught, Status.UNSUPPORTED, "Mesh.bootstrap without MPI")
        check(caught.value().entry() == "uform_mesh_bootstrap", "its entry point")
    # One process alone (C's NULL mesh): rank 0 of 1, and a trainer config may name it.
    var single = Mesh.single(library)
    check(single.rank() == 0 and single.size() == 1, "the single mesh: rank 0 of 1")
    var alone = single.info()
    check(alone.rank == 0 and alone.size == 1 and alone.collectives == MeshCollectives.HOST and alone.usable,
          "Mesh.info of the single mesh: one process on the host, usable")
    var config = TrainerInitRamConfig[origin_of(single)](library)
    config.depth = 1
    config.hidden = 64
    config.towers = Modality.TEXT.tower()
    config.mesh = Pointer(to=single)
    var trainer = Trainer.init_ram(executor, config)
    var stats = trainer.on(executor).step(modalities, TapeView.of(texts, offsets), TrainerStepConfig(relations=relations))
    check(stats.step == 1, "a trainer over the single mesh steps")


def training_example(library: Library, devices: List[UInt], options: MeshOptions) raises UFormError:
    """The contract's Training example, word for word but for its inputs."""
    var texts = "a cata dog".as_bytes()
    var offsets: List[UInt] = [0, 5, 10]
    var contents = TapeView.of(texts, offsets)
    var modalities: List[Modality] = [Modality.TEXT, Modality.TEXT]
    var relations: List[UInt32] = [0, 1]
    var executor = Executor.for_vram(library, VramOptions.on(devices))
    var mesh = Mesh.bootstrap(executor, options)
    var config = TrainerInitVramConfig[origin_of(mesh)]()
    config.depth = 12
    config.hidden = 768
    config.mesh = Pointer(to=mesh)
    var trainer = Trainer.init_vram(executor, config)
    _ = trainer.on(executor).step(modalities, contents, TrainerStepConfig(relations=relations))
    trainer.on(executor).save("checkpoint.safetensors")


def test_training_example(library: Library) raises:
    # Here a VRAM executor raises UNSUPPORTED (no CUDA) or DEVICE (no device), and where one can be had,
    # Mesh.bootstrap over it raises UNSUPPORTED: without MPI, or because test_mesh finalized this process's
    # MPI (a process bootstraps once). In a process of its own on a GPU machine with MPI the example runs
    # through (a mesh of one over the VRAM executor: tests/vram/test_vram_train.c); a VRAM trainer without
    # a mesh runs in test_vram.
    var caught = Optional[UFormError](None)
    try:
        training_example(library, [0], MeshOptions())
    except error:
        caught = error.copy()
    check(Bool(caught), "the Training example raises in this build")
    var status = caught.value().status
    check(status == Status.UNSUPPORTED or status == Status.DEVICE, "UNSUPPORTED or DEVICE: " + String(caught.value()))
    if not library.has(Feature.CUDA):
        expect(caught, Status.UNSUPPORTED, "the Training example without CUDA")
        check(caught.value().entry() == "uform_executor_create_vram", "it stops at the VRAM executor")


def error_of_a_library_gone() raises -> Optional[UFormError]:
    var caught = Optional[UFormError](None)
    var library = Library()
    var executor = Executor(library)
    try:
        _ = Model.load_ram(executor, "/nonexistent/missing.safetensors")
    except error:
        caught = error.copy()
    return caught^  # the library and executor end here; the error keeps the engine mapped


def test_error_keeps_library() raises:
    var caught = error_of_a_library_gone()
    check(Bool(caught), "an error from a library gone")
    check(String(caught.value()).startswith("UForm: io [uform_model_load_ram]: "), "it still renders")


def main() raises:
    var library = Library()
    test_library(library)
    test_error(library)
    test_executors(library)
    test_ram_options(library)
    test_mesh(library)
    var scratch = getenv("UFORM_TEST_MEDIA", "/tmp")
    test_trainer(library, scratch)
    test_training_example(library)
    test_tokenizer(library, scratch)
    test_convert(library, getenv("UFORM_TEST_MEDIA"))
    var path = getenv("UFORM_TEST_CHECKPOINT")
    test_device_executors(library, path)
    test_error_keeps_library()
    if not path:
        print("mojo: model checks skipped: UFORM_TEST_CHECKPOINT is not set")
    else:
        test_model(library, path)
        var media = getenv("UFORM_TEST_MEDIA")
        var executor = Executor.for_ram(library, RamOptions(pin=False), threads=2)
        var model = Model.load_ram(executor, path)
        test_verbs_trait(library, model, executor)
        test_info_and_loads(library, path, executor)
        test_choose(library, model, executor)
        test_copy_out(library, model, executor)
        test_notifications(library, model, executor)
        test_pool(library, model, executor)
        test_unfinished_deferred(library, model, executor)
        if not media:
            print("mojo: media checks skipped: UFORM_TEST_MEDIA is not set")
        else:
            # The media are PNG, Y4M and WAV: the codecs decide what a build can check.
            if library.has(Feature.SPNG):
                test_images(library, model, executor, media)
            else:
                print("mojo: image checks skipped: this build has no libspng")
            if library.has(Feature.FFMPEG):
                test_video(library, model, executor, media)
                test_audio(library, model, executor, media)
            else:
                print("mojo: video and audio checks skipped: this build has no FFmpeg")
        # The checkpoint tool from Mojo: the same seed writes a checkpoint that loads.
        var written = path + ".mojo.safetensors"
        library.write_tiny_checkpoint(written, seed=7)
        _ = Model.load_ram(Executor(library), written)
        # I8 weights: quantized as the model loads, or ahead into a checkpoint, the same embeddings.
        var quantized = path + ".mojo-i8.safetensors"
        library.quantize_checkpoint(written, quantized)
        test_i8_weights(library, written, quantized)
    print("mojo: all checks passed")
