"""Models (`uform_model_t`), their receivers, the text encode verb and its outputs."""

from std.ffi import c_size_t
from std.memory import OwnedPointer

from ._c import *
from ._c import _raw, _field
from .library import Library, Status, Error
from .executor import Executor
from .arena import Arena, View, ScalarKind
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


struct EncodeConfig(ImplicitlyCopyable):
    """`uform_encode_config_t`: the scalar outputs land as, the matryoshka width, progress and the
    stats slot, which must outlive the call."""

    var _c: CEncodeConfig

    def __init__(out self, *, outputs_scalar: ScalarKind = ScalarKind.F32, matryoshka: Int = 0,
                 progress: Progress = Progress()):
        self._c = CEncodeConfig(outputs_scalar.code, c_size_t(matryoshka), progress._c, None)

    def __init__(out self, *, stats: Pointer[mut=True, EncodeStats, _], outputs_scalar: ScalarKind = ScalarKind.F32,
                 matryoshka: Int = 0, progress: Progress = Progress()):
        self._c = CEncodeConfig(outputs_scalar.code, c_size_t(matryoshka), progress._c, _field(stats))


struct Encoded[origin: ImmOrigin](ImplicitlyCopyable):
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

    def items(self) -> Int:
        return Int(self._c.items)

    def status(self, item: Int) raises Error -> Status:
        """The status of one item: a failed item's rows are zero."""
        if item < 0 or item >= self.items() or not self._c.statuses:
            raise Error(Status.INVALID_ARGUMENT, "uform_encoded_t", "item out of range", self._arena[].library)
        return Status(self._c.statuses.value().unsafe_bitcast[Int32]().unsafe_offset(item)[])


def _c_path(path: String) -> List[UInt8]:
    """A NUL-terminated copy of `path` for a C `char const *`."""
    var bytes = List[UInt8](path.as_bytes())
    bytes.append(0)
    return bytes^


def _text_encode_args[T: AnyType](model: RawOpt, executor: RawOpt, texts: TapeView[T, ...], outputs: Outputs,
                                  ref arena: Arena, config: RawOpt, encoded: RawOpt, outcome: RawOpt) -> CTextEncodeArgs:
    return CTextEncodeArgs(model, executor, outputs.code, arena._handle, config, encoded, outcome, texts._c())


def _text_encode_blocking[T: AnyType](library: Library, model: RawOpt, executor: RawOpt, texts: TapeView[T, ...],
                                      outputs: Outputs, ref arena: Arena, config: EncodeConfig)
        raises Error -> Encoded[origin_of(arena)]:
    var encoded = CEncoded.empty()
    var c_config = config._c
    var args = _text_encode_args(model, executor, texts, outputs, arena, _field(Pointer(to=c_config)),
                                 _field(Pointer(to=encoded)), None)
    library._check(library._symbols[].text_encode(_raw(Pointer(to=args))))
    return Encoded[origin_of(arena)](encoded, Pointer(to=arena).unsafe_mut_cast[False]())


struct Model(Movable):
    """Owns its weights, BF16 as the checkpoint stores them, placed where the executor that loaded it
    computes. Freed by its destructor."""

    var _handle: RawOpt
    var library: Library

    def __init__(out self, *, _handle: RawOpt, library: Library):
        self._handle = _handle
        self.library = library

    @staticmethod
    def load_ram(executor: Executor, path: String) raises Error -> Self:
        """Loads a checkpoint into host memory, blocking on `executor`."""
        var c_path = _c_path(path)
        var handle: RawOpt = None
        var args = CModelLoadArgs(executor._handle, _field(c_path.unsafe_ptr()), None, _field(Pointer(to=handle)), None)
        var status = executor.library._symbols[].model_load_ram(_raw(Pointer(to=args)))
        executor.library._check(status)
        return Self(_handle=handle, library=executor.library)

    def on[origin: ImmOrigin](self, ref [origin] executor: Executor) -> ModelOn[origin_of(self), origin]:
        """Verbs that block on `executor`."""
        return ModelOn(Pointer(to=self), Pointer(to=executor))

    def deferred[origin: ImmOrigin](self, ref [origin] executor: Executor) -> ModelDeferredOn[origin_of(self), origin]:
        """Verbs submitted to `executor`, each answering a `Deferred`."""
        return ModelDeferredOn(Pointer(to=self), Pointer(to=executor))

    def text_encode[T: AnyType](self, texts: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                config: EncodeConfig = EncodeConfig()) raises Error -> Encoded[origin_of(arena)]:
        """Texts as bytes, on the calling thread."""
        return _text_encode_blocking(self.library, self._handle, None, texts, outputs, arena, config)

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (values die after
        # their last use, so `_ = library^` marks the end).
        var library = self.library
        library._symbols[].model_free(self._handle)
        _ = library^


@fieldwise_init
struct ModelOn[model_origin: ImmOrigin, executor_origin: ImmOrigin](Copyable):
    """The model's verbs, blocking on an executor: `Status.CONTENDED` while another call holds it."""

    var model: Pointer[Model, Self.model_origin]
    var executor: Pointer[Executor, Self.executor_origin]

    def text_encode[T: AnyType](self, texts: TapeView[T, ...], outputs: Outputs, ref arena: Arena,
                                config: EncodeConfig = EncodeConfig()) raises Error -> Encoded[origin_of(arena)]:
        return _text_encode_blocking(self.model[].library, self.model[]._handle, self.executor[]._handle,
                                     texts, outputs, arena, config)


@fieldwise_init
struct ModelDeferredOn[model_origin: ImmOrigin, executor_origin: ImmOrigin](Copyable):
    """The model's verbs, submitted to an executor: each answers a `Deferred` at once."""

    var model: Pointer[Model, Self.model_origin]
    var executor: Pointer[Executor, Self.executor_origin]

    def text_encode[T: AnyType, data_origin: ImmOrigin, offsets_origin: ImmOrigin](
        self, texts: TapeView[T, data_origin, offsets_origin], outputs: Outputs, ref arena: Arena,
        config: EncodeConfig = EncodeConfig()
    ) raises Error -> Deferred[origin_of(arena), Self.model_origin, Self.executor_origin, T, data_origin, offsets_origin]:
        var library = self.model[].library
        var box = OwnedPointer(_DeferredBox(config._c))
        library._symbols[].outcome_init(_raw(Pointer(to=box[].outcome)))
        var args = _text_encode_args(self.model[]._handle, self.executor[]._handle, texts, outputs, arena,
                                     _field(Pointer(to=box[].config)), None, _field(Pointer(to=box[].outcome)))
        var status = library._symbols[].text_encode(_raw(Pointer(to=args)))
        # A failed submission leaves the outcome final with the same status; `wait` raises it.
        _ = status
        return Deferred(box^, library, Pointer(to=arena).unsafe_mut_cast[False](), self.model, self.executor, texts)


struct _DeferredBox(Movable):
    """The outcome (64-byte aligned, at a stable heap address while pending) and the config it reads."""

    var outcome: COutcome
    var config: CEncodeConfig

    def __init__(out self, config: CEncodeConfig):
        self.outcome = COutcome()
        self.config = config


struct Deferred[arena_origin: ImmOrigin, model_origin: ImmOrigin, executor_origin: ImmOrigin, T: AnyType,
                data_origin: ImmOrigin, offsets_origin: ImmOrigin](Movable):
    """A submitted call. Owns its outcome until final and borrows the model, the executor, the arena and
    the inputs, which Mojo keeps alive for as long as it lives (its origins). Destroying an unfinished
    one waits for it (`uform_outcome_destroy`)."""

    var _box: OwnedPointer[_DeferredBox]
    var _library: Library
    var _arena: Pointer[Arena, Self.arena_origin]
    var _model: Pointer[Model, Self.model_origin]
    var _executor: Pointer[Executor, Self.executor_origin]
    var _texts: TapeView[Self.T, Self.data_origin, Self.offsets_origin]

    def __init__(out self, var box: OwnedPointer[_DeferredBox], library: Library, arena: Pointer[Arena, Self.arena_origin],
                 model: Pointer[Model, Self.model_origin], executor: Pointer[Executor, Self.executor_origin],
                 texts: TapeView[Self.T, Self.data_origin, Self.offsets_origin]):
        self._box = box^
        self._library = library
        self._arena = arena
        self._model = model
        self._executor = executor
        self._texts = texts.copy()

    def status(self) -> Status:
        """The status word, read without blocking: `Status.PENDING` or the final status."""
        return Status(self._library._symbols[].outcome_status(_raw(Pointer(to=self._box[].outcome))))

    def wait(self) raises Error -> Encoded[Self.arena_origin]:
        """Blocks until final (`uform_outcome_wait`), then answers the products or raises the failure,
        as many times as it is asked."""
        var symbols = self._library._symbols
        var status = symbols[].outcome_wait(_raw(Pointer(to=self._box[].outcome)))
        if status != 0:
            raise Error(symbols[].outcome_error(_raw(Pointer(to=self._box[].outcome))), self._library)
        var encoded = CEncoded.empty()
        self._library._check(symbols[].outcome_encoded(_field(Pointer(to=self._box[].outcome)), _raw(Pointer(to=encoded))))
        return Encoded[Self.arena_origin](encoded, self._arena)

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (values die after
        # their last use, so `_ = library^` marks the end).
        var library = self._library
        library._symbols[].outcome_destroy(_raw(Pointer(to=self._box[].outcome)))
        _ = library^
