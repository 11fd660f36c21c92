"""Models (`uform_model_t`): loads, the `ModelVerbs` trait holding every blocking verb once, the receivers
(`Model` itself, `ModelOn`, `ModelDeferredOn`), `Deferred` calls and their outputs."""

from std.ffi import c_int, c_size_t
from std.memory import OwnedPointer

from ._c import *
from ._c import _raw, _field
from .library import Library, Status, Error, Weights
from .executor import Executor
from .arena import Arena, View, ScalarKind, _Product
from .tape import TapeView
from .progress import Progress


@fieldwise_init
struct Outputs(Equatable, TrivialRegisterPassable):
    """`uform_outputs_t`: the outputs an encode keeps, combined with `|`."""

    var code: UInt32
    comptime EMBEDDINGS = Self(1)
    comptime TOKEN_VECTORS = Self(2)
    comptime STATES = Self(4)

    def __or__(self, other: Self) -> Self:
        return Self(self.code | other.code)


@fieldwise_init
struct Source(Equatable, TrivialRegisterPassable):
    """`uform_source_t`: where encoded media come from."""

    var code: Int32
    comptime FILES = Self(0)  # the tape holds file paths (no NUL needed)
    comptime MEMORY = Self(1)  # the tape holds the encoded files' bytes


struct EncodeConfig(ImplicitlyCopyable):
    """`uform_encode_config_t`: the scalar outputs land as, the matryoshka width, progress and the
    stats slot, which must outlive the call."""

    var _c: CEncodeConfig

    def __init__(out self, *, outputs_scalar: ScalarKind = ScalarKind.F32, matryoshka: Int = 0,
                 progress: Progress = Progress()):
        self._c = CEncodeConfig(outputs_scalar.code, c_size_t(matryoshka), progress._c, None, False, None, None)

    def __init__(out self, *, stats: Pointer[mut=True, EncodeStats, _], outputs_scalar: ScalarKind = ScalarKind.F32,
                 matryoshka: Int = 0, progress: Progress = Progress()):
        self._c = CEncodeConfig(outputs_scalar.code, c_size_t(matryoshka), progress._c, _field(stats), False, None, None)


struct LoadConfig(ImplicitlyCopyable):
    """`uform_load_config_t`: progress in bytes of tensor data, whether to `mmap` the checkpoint (the file
    must then not shrink while the model lives), and the weights of the blocks' linear layers."""

    var _c: CLoadConfig

    def __init__(out self, *, progress: Progress = Progress(), map: Bool = False, weights: Weights = Weights.STORED):
        self._c = CLoadConfig(progress._c, map, weights.code)


struct Encoded[origin: ImmOrigin](_Product, ImplicitlyCopyable):
    """What an encode produced: views into the arena, which it keeps alive."""

    var _c: CEncoded
    var _arena: Pointer[Arena, Self.origin]

    def __init__(out self, c: CEncoded, arena: Pointer[Arena, Self.origin]):
        self._c = c
        self._arena = arena

    def _view(self, c: CView) -> Optional[View[Self.origin]]:
        if not c.data:
            return None
        return View[Self.origin](c, self._arena)

    def embeddings(self) -> Optional[View[Self.origin]]:
        return self._view(self._c.embeddings)

    def token_vectors(self) -> Optional[View[Self.origin]]:
        return self._view(self._c.token_vectors)

    def states(self) -> Optional[View[Self.origin]]:
        return self._view(self._c.states)

    def token_spans(self) -> Optional[View[Self.origin]]:
        """With token vectors of a model that reads tokens: each token's bytes [begin, end) in its text, two
        U32 a row, grouped as the token vectors; None otherwise."""
        return self._view(self._c.token_spans)

    def items(self) -> Int:
        return Int(self._c.items)

    def status(self, item: Int) raises Error -> Status:
        """The status of one item: a failed item's rows are zero."""
        if item < 0 or item >= self.items() or not self._c.statuses:
            raise Error(Status.INVALID_ARGUMENT, "uform_encoded_t", "item out of range", self._arena[].library)
        return Status(self._c.statuses.value().unsafe_bitcast[Int32]().unsafe_offset(item)[])

    def _take(mut self, library: Library, outcome: RawOpt) raises Error:
        library._check(library._symbols[].outcome_encoded(outcome, _raw(Pointer(to=self._c))))


def _c_path(path: String) -> List[UInt8]:
    """A NUL-terminated copy of `path` for a C `char const *`."""
    var bytes = List[UInt8](path.as_bytes())
    bytes.append(0)
    return bytes^


@fieldwise_init
struct _Receiver(ImplicitlyCopyable):
    """Where a blocking verb runs: the model, and the executor (`None`: the calling thread)."""

    var library: Library
    var model: RawOpt
    var executor: RawOpt


def _common(model: RawOpt, executor: RawOpt, outputs: Outputs, ref arena: Arena, config: RawOpt, encoded: RawOpt,
            outcome: RawOpt) -> CEncodeCommon:
    return CEncodeCommon(model, executor, outputs.code, arena._handle, config, encoded, outcome)


def _encoded(encoded: CEncoded, ref arena: Arena) -> Encoded[origin_of(arena)]:
    # std.memory `Pointer.unsafe_mut_cast[False]`: the views only read the arena.
    return Encoded[origin_of(arena)](encoded, Pointer(to=arena).unsafe_mut_cast[False]())


trait ModelVerbs:
    """The blocking verbs, written once: `Model` runs them on the calling thread, `ModelOn` on its executor
    (`Status.CONTENDED` while another call holds it). A conforming type supplies only `_receiver`; each
    verb's body is this trait's default (a trait method with a body is a default implementation)."""

    def _receiver(self) -> _Receiver:
        ...

    def text_encode[T: AnyType](self, texts: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                config: EncodeConfig = EncodeConfig()) raises Error -> Encoded[origin_of(arena)]:
        """Texts as bytes: EMBEDDINGS one row per text, TOKEN_VECTORS one per kept byte, STATES `hidden` wide."""
        var r = self._receiver()
        var encoded = CEncoded.empty()
        var c_config = config._c
        var args = CTextEncodeArgs(
            _common(r.model, r.executor, outputs, arena, _field(Pointer(to=c_config)), _field(Pointer(to=encoded)), None),
            texts._c())
        r.library._check(r.library._symbols[].text_encode(_raw(Pointer(to=args))))
        _ = c_config^  # read through an untracked field: alive until the call returned
        return _encoded(encoded, arena)

    def image_encode[T: AnyType](self, images: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                 config: EncodeConfig = EncodeConfig(), *, source: Source = Source.FILES)
            raises Error -> Encoded[origin_of(arena)]:
        """JPEG or PNG images: file paths (`Source.FILES`) or the files' bytes (`Source.MEMORY`). A bad
        image answers its own status (`Encoded.status`) with zero rows; the call still succeeds."""
        var r = self._receiver()
        var encoded = CEncoded.empty()
        var c_config = config._c
        var args = CMediaEncodeArgs(
            _common(r.model, r.executor, outputs, arena, _field(Pointer(to=c_config)), _field(Pointer(to=encoded)), None),
            images._c(), source.code)
        r.library._check(r.library._symbols[].image_encode(_raw(Pointer(to=args))))
        _ = c_config^
        return _encoded(encoded, arena)

    def image_encode_pixels(self, pixels: TapeView[UInt8, ...], heights: Span[UInt, _], widths: Span[UInt, _],
                            outputs: Outputs, ref arena: Arena, config: EncodeConfig = EncodeConfig())
            raises Error -> Encoded[origin_of(arena)]:
        """Interleaved RGB8 pixels, item i of `heights[i]` x `widths[i]`."""
        var r = self._receiver()
        if len(heights) != len(pixels) or len(widths) != len(pixels):
            raise Error(Status.INVALID_ARGUMENT, "uform_image_encode_pixels",
                        "heights and widths must hold one value per item", r.library)
        var encoded = CEncoded.empty()
        var c_config = config._c
        var args = CImageEncodePixelsArgs(
            _common(r.model, r.executor, outputs, arena, _field(Pointer(to=c_config)), _field(Pointer(to=encoded)), None),
            pixels._c(), _span_field(heights), _span_field(widths))
        r.library._check(r.library._symbols[].image_encode_pixels(_raw(Pointer(to=args))))
        _ = c_config^
        return _encoded(encoded, arena)

    def video_encode[T: AnyType](self, videos: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                 config: EncodeConfig = EncodeConfig(), *, source: Source = Source.FILES)
            raises Error -> Encoded[origin_of(arena)]:
        """Clips in any container FFmpeg knows: file paths or the files' bytes."""
        var r = self._receiver()
        var encoded = CEncoded.empty()
        var c_config = config._c
        var args = CMediaEncodeArgs(
            _common(r.model, r.executor, outputs, arena, _field(Pointer(to=c_config)), _field(Pointer(to=encoded)), None),
            videos._c(), source.code)
        r.library._check(r.library._symbols[].video_encode(_raw(Pointer(to=args))))
        _ = c_config^
        return _encoded(encoded, arena)

    def audio_encode[T: AnyType](self, sounds: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                 config: EncodeConfig = EncodeConfig(), *, source: Source = Source.FILES)
            raises Error -> Encoded[origin_of(arena)]:
        """Sounds in any format FFmpeg decodes: file paths or the files' bytes."""
        var r = self._receiver()
        var encoded = CEncoded.empty()
        var c_config = config._c
        var args = CMediaEncodeArgs(
            _common(r.model, r.executor, outputs, arena, _field(Pointer(to=c_config)), _field(Pointer(to=encoded)), None),
            sounds._c(), source.code)
        r.library._check(r.library._symbols[].audio_encode(_raw(Pointer(to=args))))
        _ = c_config^
        return _encoded(encoded, arena)

    def audio_encode_samples(self, samples: TapeView[Float32, ...], rate: Int, outputs: Outputs, ref arena: Arena,
                             config: EncodeConfig = EncodeConfig()) raises Error -> Encoded[origin_of(arena)]:
        """Mono F32 samples at `rate` Hz, one rate for the whole call."""
        var r = self._receiver()
        if rate <= 0:
            raise Error(Status.INVALID_ARGUMENT, "uform_audio_encode_samples", "rate must be positive", r.library)
        var encoded = CEncoded.empty()
        var c_config = config._c
        var args = CAudioEncodeSamplesArgs(
            _common(r.model, r.executor, outputs, arena, _field(Pointer(to=c_config)), _field(Pointer(to=encoded)), None),
            samples._c(), c_size_t(rate))
        r.library._check(r.library._symbols[].audio_encode_samples(_raw(Pointer(to=args))))
        _ = c_config^
        return _encoded(encoded, arena)

    def text_choose[T: AnyType](self, states: View[_], choices: TapeView[T, ...], ref arena: Arena,
                                progress: Progress = Progress()) raises Error -> View[origin_of(arena)]:
        """Per item, the softmax over its legal next bytes: one F32 row per legal byte, grouped per item.
        `states` is a STATES view of this model in another arena."""
        var r = self._receiver()
        var probabilities = CView.empty()
        var c_states = states._c
        var c_progress = progress._c
        var args = CTextChooseArgs(r.model, r.executor, _field(Pointer(to=c_states)), choices._c(), arena._handle,
                                   _field(Pointer(to=c_progress)), _field(Pointer(to=probabilities)), None)
        r.library._check(r.library._symbols[].text_choose(_raw(Pointer(to=args))))
        _ = c_states^
        _ = c_progress^
        return View(probabilities, Pointer(to=arena).unsafe_mut_cast[False]())


def _span_field(span: Span[UInt, _]) -> RawOpt:
    """A host array of `size_t` for a C structure field; NULL when empty (`Span.unsafe_ptr`)."""
    if len(span) == 0:
        return None
    return _field(span.unsafe_ptr())


def _load_args(executor: Executor, ref path: List[UInt8], config: RawOpt, model: RawOpt, outcome: RawOpt) -> CModelLoadArgs:
    return CModelLoadArgs(executor._handle, _field(path.unsafe_ptr()), config, model, outcome)


struct Model(ModelVerbs, Movable):
    """Owns its weights, BF16 as the checkpoint stores them, placed where the executor that loaded it
    computes. Freed by its destructor. Its verbs (`ModelVerbs`) run on the calling thread."""

    var _handle: RawOpt
    var library: Library

    def __init__(out self, *, _handle: RawOpt, library: Library):
        self._handle = _handle
        self.library = library

    @staticmethod
    def load_ram(executor: Executor, path: String, config: LoadConfig = LoadConfig()) raises Error -> Self:
        """Loads a checkpoint into host memory, blocking on `executor`."""
        return Self._load[False](executor, path, config)

    @staticmethod
    def load_vram(executor: Executor, path: String, config: LoadConfig = LoadConfig()) raises Error -> Self:
        """Loads a checkpoint into the device memory of a VRAM executor, blocking on it."""
        return Self._load[True](executor, path, config)

    @staticmethod
    def _load[vram: Bool](executor: Executor, path: String, config: LoadConfig) raises Error -> Self:
        var c_path = _c_path(path)
        var c_config = config._c
        var handle: RawOpt = None
        var args = _load_args(executor, c_path, _field(Pointer(to=c_config)), _field(Pointer(to=handle)), None)
        var status: CStatus
        comptime if vram:  # `comptime if`: one instantiation per residency
            status = executor.library._symbols[].model_load_vram(_raw(Pointer(to=args)))
        else:
            status = executor.library._symbols[].model_load_ram(_raw(Pointer(to=args)))
        _ = c_config^
        _ = c_path^  # read by the call: alive until it returned
        executor.library._check(status)
        return Self(_handle=handle, library=executor.library)

    @staticmethod
    def load_ram_deferred[origin: ImmOrigin](ref [origin] executor: Executor, path: String,
                                             config: LoadConfig = LoadConfig()) raises Error -> DeferredLoad[origin]:
        """Submits a load into host memory to `executor` and answers at once."""
        return DeferredLoad[origin]._submit[False](Pointer(to=executor), path, config)

    @staticmethod
    def load_vram_deferred[origin: ImmOrigin](ref [origin] executor: Executor, path: String,
                                              config: LoadConfig = LoadConfig()) raises Error -> DeferredLoad[origin]:
        """Submits a load into device memory to a VRAM `executor` and answers at once."""
        return DeferredLoad[origin]._submit[True](Pointer(to=executor), path, config)

    def info(self) raises Error -> ModelInfo:
        """`uform_model_info`: sizes, towers and input geometry."""
        var info = ModelInfo()
        self.library._check(self.library._symbols[].model_info(self._handle, _raw(Pointer(to=info))))
        return info^

    def prompt(self, name: Optional[String] = None) raises Error -> String:
        """`uform_model_prompt`: the prompt a text takes before it is cut, the model's prompt `name`, or
        with None its default ("" for none)."""
        var buffer = List[UInt8](length=4096, fill=0)
        var length: c_size_t = 0
        var c_name = List[UInt8]()
        if name:
            c_name = List[UInt8](name.value().as_bytes())
            c_name.append(0)
        var name_field: RawOpt = _field(c_name.unsafe_ptr()) if name else None
        var status = self.library._symbols[].model_prompt(self._handle, name_field, _raw(buffer.unsafe_ptr()),
                                                          c_size_t(len(buffer)), _raw(Pointer(to=length)))
        _ = c_name^  # read by the call: alive until it returned
        self.library._check(status)
        var bytes = List[UInt8]()
        for i in range(Int(length)):
            bytes.append(buffer[i])
        return String(unsafe_from_utf8=bytes)

    def _receiver(self) -> _Receiver:
        return _Receiver(self.library, self._handle, None)

    def on[origin: ImmOrigin](self, ref [origin] executor: Executor) -> ModelOn[origin_of(self), origin]:
        """Verbs that block on `executor`."""
        return ModelOn(Pointer(to=self), Pointer(to=executor))

    def deferred[origin: ImmOrigin](self, ref [origin] executor: Executor) -> ModelDeferredOn[origin_of(self), origin]:
        """Verbs submitted to `executor`, each answering a `Deferred`."""
        return ModelDeferredOn(Pointer(to=self), Pointer(to=executor))

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (values die after
        # their last use, so `_ = library^` marks the end).
        var library = self.library
        library._symbols[].model_free(self._handle)
        _ = library^


@fieldwise_init
struct ModelOn[model_origin: ImmOrigin, executor_origin: ImmOrigin](ModelVerbs, Copyable):
    """The model's verbs (`ModelVerbs`), blocking on an executor: `Status.CONTENDED` while another call
    holds it."""

    var model: Pointer[Model, Self.model_origin]
    var executor: Pointer[Executor, Self.executor_origin]

    def _receiver(self) -> _Receiver:
        return _Receiver(self.model[].library, self.model[]._handle, self.executor[]._handle)


struct _DeferredBox(Movable):
    """The outcome (64-byte aligned, at a stable heap address while pending) and the config it reads."""

    var outcome: COutcome
    var config: CEncodeConfig

    def __init__(out self, config: CEncodeConfig):
        self.outcome = COutcome()
        self.config = config


struct ModelDeferredOn[model_origin: ImmOrigin, executor_origin: ImmOrigin](Copyable):
    """The model's verbs, submitted to an executor: each answers a `Deferred` at once, with the same
    arguments as the blocking ones. `notify_eventfd` and `notify_ring` answer a receiver whose calls also
    notify an external loop when final."""

    var model: Pointer[Model, Self.model_origin]
    var executor: Pointer[Executor, Self.executor_origin]
    var _eventfd: Optional[Int32]
    var _ring_fd: Optional[Int32]
    var _ring_data: UInt64

    def __init__(out self, model: Pointer[Model, Self.model_origin], executor: Pointer[Executor, Self.executor_origin]):
        self.model = model
        self.executor = executor
        self._eventfd = None
        self._ring_fd = None
        self._ring_data = 0

    def notify_eventfd(self, eventfd: Int) -> Self:
        """Each call writes the 8 bytes of a UInt64 1 to `eventfd` once final, a descriptor that becomes
        readable: an eventfd(2) on Linux, the write end of a non-blocking pipe on macOS
        (`uform_outcome_notify_eventfd` in uform.h); -1 turns it off."""
        var other = self.copy()
        other._eventfd = Int32(eventfd)
        return other^

    def notify_ring(self, ring_fd: Int, user_data: UInt64) -> Self:
        """Each call posts {user_data, final status} into that io_uring once final; -1 turns it off."""
        var other = self.copy()
        other._ring_fd = Int32(ring_fd)
        other._ring_data = user_data
        return other^

    def _box(self, config: CEncodeConfig) raises Error -> OwnedPointer[_DeferredBox]:
        var library = self.model[].library
        # std.memory `OwnedPointer`: the outcome stays at one heap address while the Deferred moves.
        var box = OwnedPointer(_DeferredBox(config))
        library._symbols[].outcome_init(_raw(Pointer(to=box[].outcome)))
        if self._eventfd:
            library._check(library._symbols[].outcome_notify_eventfd(_raw(Pointer(to=box[].outcome)),
                                                                      c_int(self._eventfd.value())))
        if self._ring_fd:
            library._check(library._symbols[].outcome_notify_ring(_raw(Pointer(to=box[].outcome)),
                                                                   c_int(self._ring_fd.value()), self._ring_data))
        return box^

    def _common(self, outputs: Outputs, ref arena: Arena, ref box: OwnedPointer[_DeferredBox]) -> CEncodeCommon:
        return _common(self.model[]._handle, self.executor[]._handle, outputs, arena, _field(Pointer(to=box[].config)),
                       None, _field(Pointer(to=box[].outcome)))

    # `type_of(x)` (the builtin naming an argument's type) puts the inputs' own origins into the Deferred's
    # type, so Mojo keeps them alive while it lives, whatever their parameters.
    def text_encode[T: AnyType](self, texts: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                config: EncodeConfig = EncodeConfig()) raises Error
            -> Deferred[Encoded[origin_of(arena)], Self.model_origin, Self.executor_origin, type_of(texts)]:
        var box = self._box(config._c)
        var args = CTextEncodeArgs(self._common(outputs, arena, box), texts._c())
        # A failed submission leaves the outcome final with the same status; `wait` raises it.
        _ = self.model[].library._symbols[].text_encode(_raw(Pointer(to=args)))
        return Deferred(box^, self.model[].library, _encoded(CEncoded.empty(), arena), self.model,
                        self.executor, texts)

    def image_encode[T: AnyType](self, images: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                 config: EncodeConfig = EncodeConfig(), *, source: Source = Source.FILES) raises Error
            -> Deferred[Encoded[origin_of(arena)], Self.model_origin, Self.executor_origin, type_of(images)]:
        var box = self._box(config._c)
        var args = CMediaEncodeArgs(self._common(outputs, arena, box), images._c(), source.code)
        _ = self.model[].library._symbols[].image_encode(_raw(Pointer(to=args)))
        return Deferred(box^, self.model[].library, _encoded(CEncoded.empty(), arena), self.model,
                        self.executor, images)

    def image_encode_pixels(self, pixels: TapeView[UInt8, ...], heights: Span[UInt, _], widths: Span[UInt, _],
                            outputs: Outputs, ref arena: Arena, config: EncodeConfig = EncodeConfig()) raises Error
            -> Deferred[Encoded[origin_of(arena)], Self.model_origin, Self.executor_origin,
                        _Pixels[type_of(pixels), type_of(heights), type_of(widths)]]:
        var library = self.model[].library
        if len(heights) != len(pixels) or len(widths) != len(pixels):
            raise Error(Status.INVALID_ARGUMENT, "uform_image_encode_pixels",
                        "heights and widths must hold one value per item", library)
        var box = self._box(config._c)
        var args = CImageEncodePixelsArgs(self._common(outputs, arena, box), pixels._c(), _span_field(heights),
                                          _span_field(widths))
        _ = library._symbols[].image_encode_pixels(_raw(Pointer(to=args)))
        return Deferred(box^, library, _encoded(CEncoded.empty(), arena), self.model, self.executor,
                        _Pixels(pixels, heights, widths))

    def video_encode[T: AnyType](self, videos: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                 config: EncodeConfig = EncodeConfig(), *, source: Source = Source.FILES) raises Error
            -> Deferred[Encoded[origin_of(arena)], Self.model_origin, Self.executor_origin, type_of(videos)]:
        var box = self._box(config._c)
        var args = CMediaEncodeArgs(self._common(outputs, arena, box), videos._c(), source.code)
        _ = self.model[].library._symbols[].video_encode(_raw(Pointer(to=args)))
        return Deferred(box^, self.model[].library, _encoded(CEncoded.empty(), arena), self.model,
                        self.executor, videos)

    def audio_encode[T: AnyType](self, sounds: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                 config: EncodeConfig = EncodeConfig(), *, source: Source = Source.FILES) raises Error
            -> Deferred[Encoded[origin_of(arena)], Self.model_origin, Self.executor_origin, type_of(sounds)]:
        var box = self._box(config._c)
        var args = CMediaEncodeArgs(self._common(outputs, arena, box), sounds._c(), source.code)
        _ = self.model[].library._symbols[].audio_encode(_raw(Pointer(to=args)))
        return Deferred(box^, self.model[].library, _encoded(CEncoded.empty(), arena), self.model,
                        self.executor, sounds)

    def audio_encode_samples(self, samples: TapeView[Float32, ...], rate: Int, outputs: Outputs, ref arena: Arena,
                             config: EncodeConfig = EncodeConfig()) raises Error
            -> Deferred[Encoded[origin_of(arena)], Self.model_origin, Self.executor_origin, type_of(samples)]:
        var library = self.model[].library
        if rate <= 0:
            raise Error(Status.INVALID_ARGUMENT, "uform_audio_encode_samples", "rate must be positive", library)
        var box = self._box(config._c)
        var args = CAudioEncodeSamplesArgs(self._common(outputs, arena, box), samples._c(), c_size_t(rate))
        _ = library._symbols[].audio_encode_samples(_raw(Pointer(to=args)))
        return Deferred(box^, library, _encoded(CEncoded.empty(), arena), self.model, self.executor, samples)

    def text_choose[T: AnyType](self, states: View[_], choices: TapeView[T, ...], ref arena: Arena,
                                progress: Progress = Progress()) raises Error
            -> Deferred[View[origin_of(arena)], Self.model_origin, Self.executor_origin,
                        _Choose[type_of(states), type_of(choices)]]:
        var library = self.model[].library
        var config = CEncodeConfig(0, 0, progress._c, None, False, None, None)
        var box = self._box(config)
        var c_states = states._c  # copied by the engine at submission
        var args = CTextChooseArgs(self.model[]._handle, self.executor[]._handle, _field(Pointer(to=c_states)),
                                   choices._c(), arena._handle, _field(Pointer(to=box[].config.progress)), None,
                                   _field(Pointer(to=box[].outcome)))
        _ = library._symbols[].text_choose(_raw(Pointer(to=args)))
        _ = c_states^
        return Deferred(box^, library, View(CView.empty(), Pointer(to=arena).unsafe_mut_cast[False]()), self.model,
                        self.executor, _Choose(states, choices))


@fieldwise_init
struct _Pixels[P: ImplicitlyCopyable & Deinitable, H: ImplicitlyCopyable & Deinitable, W: ImplicitlyCopyable & Deinitable](
    ImplicitlyCopyable
):
    """The inputs a deferred `image_encode_pixels` borrows (their origins live in the type)."""

    var pixels: Self.P
    var heights: Self.H
    var widths: Self.W


@fieldwise_init
struct _Choose[S: ImplicitlyCopyable & Deinitable, C: ImplicitlyCopyable & Deinitable](ImplicitlyCopyable):
    """The inputs a deferred `text_choose` borrows."""

    var states: Self.S
    var choices: Self.C


# Trait composition with `&` (`Deinitable`: the std trait of implicitly destroyed values) lets a generic
# field of these types be dropped with the Deferred.
struct Deferred[R: _Product & Deinitable, model_origin: ImmOrigin, executor_origin: ImmOrigin,
               Inputs: ImplicitlyCopyable & Deinitable](Movable):
    """A submitted call answering `R` (`Encoded`, or the `View` of `text_choose`). Owns its outcome until
    final and borrows the model, the executor, the arena (inside `R`) and the inputs, which Mojo keeps
    alive for as long as it lives (their origins are in its type). Destroying an unfinished one waits
    for it (`uform_outcome_destroy`)."""

    var _box: OwnedPointer[_DeferredBox]
    var _library: Library
    var _product: Self.R
    var _model: Pointer[Model, Self.model_origin]
    var _executor: Pointer[Executor, Self.executor_origin]
    var _inputs: Self.Inputs

    def __init__(out self, var box: OwnedPointer[_DeferredBox], library: Library, product: Self.R,
                 model: Pointer[Model, Self.model_origin], executor: Pointer[Executor, Self.executor_origin],
                 inputs: Self.Inputs):
        self._box = box^
        self._library = library
        self._product = product
        self._model = model
        self._executor = executor
        self._inputs = inputs

    def status(self) -> Status:
        """The status word, read without blocking: `Status.PENDING` or the final status."""
        return Status(self._library._symbols[].outcome_status(_raw(Pointer(to=self._box[].outcome))))

    def wait(self) raises Error -> Self.R:
        """Blocks until final (`uform_outcome_wait`), then answers the products or raises the failure,
        as many times as it is asked."""
        var symbols = self._library._symbols
        var status = symbols[].outcome_wait(_raw(Pointer(to=self._box[].outcome)))
        if status != 0:
            raise Error(symbols[].outcome_error(_raw(Pointer(to=self._box[].outcome))), self._library)
        var product = self._product
        product._take(self._library, _field(Pointer(to=self._box[].outcome)))
        return product

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (values die after
        # their last use, so `_ = library^` marks the end).
        var library = self._library
        library._symbols[].outcome_destroy(_raw(Pointer(to=self._box[].outcome)))
        _ = library^


struct _LoadBox(Movable):
    """A deferred load's outcome and config, at stable heap addresses while pending."""

    var outcome: COutcome
    var config: CLoadConfig

    def __init__(out self, config: CLoadConfig):
        self.outcome = COutcome()
        self.config = config


struct DeferredLoad[executor_origin: ImmOrigin](Movable):
    """A submitted load. `wait` answers the model, as many times as asked; `take` moves it out (later waits
    then raise `Status.INVALID_ARGUMENT`). Borrows the executor; owns the path it reads. Destroying it
    waits for the load and frees a model not taken."""

    var _box: OwnedPointer[_LoadBox]
    var _path: List[UInt8]
    var _executor: Pointer[Executor, Self.executor_origin]
    var _model: Model
    var _taken: Bool

    @staticmethod
    def _submit[vram: Bool](executor: Pointer[Executor, Self.executor_origin], path: String, config: LoadConfig)
            raises Error -> Self:
        var library = executor[].library
        var load = Self(OwnedPointer(_LoadBox(config._c)), _c_path(path), executor, Model(_handle=None, library=library))
        library._symbols[].outcome_init(_raw(Pointer(to=load._box[].outcome)))
        var args = _load_args(executor[], load._path, _field(Pointer(to=load._box[].config)), None,
                              _field(Pointer(to=load._box[].outcome)))
        # A failed submission leaves the outcome final with the same status; `wait` raises it.
        comptime if vram:
            _ = library._symbols[].model_load_vram(_raw(Pointer(to=args)))
        else:
            _ = library._symbols[].model_load_ram(_raw(Pointer(to=args)))
        return load^

    def __init__(out self, var box: OwnedPointer[_LoadBox], var path: List[UInt8],
                 executor: Pointer[Executor, Self.executor_origin], var model: Model):
        self._box = box^
        self._path = path^
        self._executor = executor
        self._model = model^
        self._taken = False

    def status(self) -> Status:
        """The status word, read without blocking: `Status.PENDING` or the final status."""
        return Status(self._model.library._symbols[].outcome_status(_raw(Pointer(to=self._box[].outcome))))

    # `-> ref [origin] T` returns a reference bound to the named field (its origin), not a copy.
    def wait(mut self) raises Error -> ref [self._model] Model:
        """Blocks until final, then answers the loaded model (`uform_outcome_model` takes it once) or raises
        the failure."""
        var library = self._model.library
        var status = library._symbols[].outcome_wait(_raw(Pointer(to=self._box[].outcome)))
        if status != 0:
            raise Error(library._symbols[].outcome_error(_raw(Pointer(to=self._box[].outcome))), library)
        if self._taken:
            raise Error(Status.INVALID_ARGUMENT, "uform_outcome_model", "the model was already taken", library)
        if not self._model._handle:
            self._model._handle = library._symbols[].outcome_model(_raw(Pointer(to=self._box[].outcome)))
        return self._model

    def take(mut self) raises Error -> Model:
        """Waits, then moves the model out: the caller owns it."""
        var library = self._model.library
        var handle = self.wait()._handle
        self._model._handle = None
        self._taken = True
        return Model(_handle=handle, library=library)

    def __deinit__(deinit self):
        var library = self._model.library
        library._symbols[].outcome_destroy(_raw(Pointer(to=self._box[].outcome)))
        _ = library^
