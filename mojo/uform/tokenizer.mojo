"""Tokenizers (`uform_tokenizer_t`): a `tokenizer.json` (or a SentencePiece model) opened once, the
`TokenizerVerbs` trait holding the blocking verb once, the receivers (`Tokenizer` itself, `TokenizerOn`,
`TokenizerDeferredOn`), `TokenizerDeferred` calls and the `Tokenized` views they answer."""

from std.ffi import c_int, c_size_t
from std.memory import OwnedPointer

from ._c import *
from ._c import _raw, _field
from .library import Library, Status, Error
from .executor import Executor
from .arena import Arena, View, _Product
from .tape import TapeView
from .progress import Progress


struct TokenizeConfig(ImplicitlyCopyable):
    """`uform_tokenize_config_t`: whether to leave out the post-processor's special tokens (tokenizers'
    `add_special_tokens=False`), progress (in texts) and the stats slot, which must outlive the call."""

    var _c: CTokenizeConfig

    def __init__(out self, *, without_special_tokens: Bool = False, progress: Progress = Progress()):
        self._c = CTokenizeConfig(without_special_tokens, progress._c, None)

    def __init__(out self, *, stats: Pointer[mut=True, TokenizeStats, _], without_special_tokens: Bool = False,
                 progress: Progress = Progress()):
        self._c = CTokenizeConfig(without_special_tokens, progress._c, _field(stats))


struct Tokenized[origin: ImmOrigin](_Product, ImplicitlyCopyable):
    """What a tokenize call produced: views into the arena (host memory), which it keeps alive. `ids` holds
    one U32 row per token, grouped per text (`View.row_offsets`); `spans` one row of two U32 per token, the
    input bytes [begin, end) it covers counted from its text's first byte ([0, 0) for added special tokens);
    `status(i)` is `Status.OK`, or `Status.FORMAT` for a text that is not UTF-8 (it has no tokens)."""

    var _c: CTokenized
    var _arena: Pointer[Arena, Self.origin]

    def __init__(out self, c: CTokenized, arena: Pointer[Arena, Self.origin]):
        self._c = c
        self._arena = arena

    def ids(self) -> View[Self.origin]:
        return View[Self.origin](self._c.ids, self._arena)

    def spans(self) -> View[Self.origin]:
        return View[Self.origin](self._c.spans, self._arena)

    def items(self) -> Int:
        return Int(self._c.items)

    def status(self, item: Int) raises Error -> Status:
        if item < 0 or item >= self.items() or not self._c.statuses:
            raise Error(Status.INVALID_ARGUMENT, "uform_tokenized_t", "item out of range", self._arena[].library)
        return Status(self._c.statuses.value().unsafe_bitcast[Int32]().unsafe_offset(item)[])

    def _rows(self, item: Int) raises Error -> Tuple[Int, Int]:
        if item < 0 or item >= self.items():
            raise Error(Status.INVALID_ARGUMENT, "uform_tokenized_t", "item out of range", self._arena[].library)
        var offsets = self.ids().row_offsets()
        return (offsets[item], offsets[item + 1])

    def ids_of(self, item: Int) raises Error -> List[UInt32]:
        """The token ids of text `item`, copied out of the arena."""
        var rows = self._rows(item)
        var ids = self.ids()
        var out = List[UInt32]()
        for row in range(rows[0], rows[1]):
            out.append(ids.row[DType.uint32](row)[0])
        return out^

    def spans_of(self, item: Int) raises Error -> List[UInt32]:
        """The byte spans of text `item`'s tokens, flattened: begin and end of each token in turn."""
        var rows = self._rows(item)
        var spans = self.spans()
        var out = List[UInt32]()
        for row in range(rows[0], rows[1]):
            var span = spans.row[DType.uint32](row)
            out.append(span[0])
            out.append(span[1])
        return out^

    def special_of(self, item: Int) raises Error -> List[Bool]:
        """Whether each of text `item`'s tokens is special (tokenizers' special_tokens_mask: the
        post-processor's and padding's tokens)."""
        var rows = self._rows(item)
        var out = List[Bool]()
        if not self._c.special:
            return out^
        var flags = self._c.special.value().unsafe_bitcast[UInt8]()
        for row in range(rows[0], rows[1]):
            out.append(flags.unsafe_offset(row)[] != 0)
        return out^

    def _take(mut self, library: Library, outcome: RawOpt) raises Error:
        """The products of a final, successful tokenize outcome (`uform_outcome_tokenized`)."""
        library._check(library._symbols[].outcome_tokenized(outcome, _raw(Pointer(to=self._c))))


@fieldwise_init
struct _TokenizerReceiver(ImplicitlyCopyable):
    """Where a blocking tokenize runs: the tokenizer, and the executor (`None`: the calling thread)."""

    var library: Library
    var tokenizer: RawOpt
    var executor: RawOpt


def _tokenized(tokenized: CTokenized, ref arena: Arena) -> Tokenized[origin_of(arena)]:
    # std.memory `Pointer.unsafe_mut_cast[False]`: the views only read the arena.
    return Tokenized[origin_of(arena)](tokenized, Pointer(to=arena).unsafe_mut_cast[False]())


trait TokenizerVerbs:
    """The blocking verb, written once: `Tokenizer` runs it on the calling thread, `TokenizerOn` on its
    executor (`Status.CONTENDED` while another call holds it). A conforming type supplies only `_receiver`."""

    def _receiver(self) -> _TokenizerReceiver:
        ...

    def text_tokenize[T: AnyType](self, texts: TapeView[T, ...], ref arena: Arena,
                                  config: TokenizeConfig = TokenizeConfig()) raises Error -> Tokenized[origin_of(arena)]:
        """Cuts every text (UTF-8 bytes) into token ids and byte spans, in `arena` (a host arena)."""
        var r = self._receiver()
        var tokenized = CTokenized.empty()
        var c_config = config._c
        var args = CTextTokenizeArgs(r.tokenizer, r.executor, texts._c(), arena._handle, _field(Pointer(to=c_config)),
                                     _field(Pointer(to=tokenized)), None)
        r.library._check(r.library._symbols[].text_tokenize(_raw(Pointer(to=args))))
        _ = c_config^  # read through an untracked field: alive until the call returned
        return _tokenized(tokenized, arena)


struct Tokenizer(TokenizerVerbs, Movable):
    """A tokenizer, read-only once opened: any number of calls on any executors may use it at once. Freed
    by its destructor (`uform_tokenizer_free`). Its verb (`TokenizerVerbs`) runs on the calling thread."""

    var _handle: RawOpt
    var library: Library

    def __init__(out self, *, _handle: RawOpt, library: Library):
        self._handle = _handle
        self.library = library

    @staticmethod
    def open(library: Library, path: String) raises Error -> Self:
        """`uform_tokenizer_open`: a `tokenizer.json`, a SentencePiece model, or a model's folder, read
        whole on the calling thread."""
        var c_path = List[UInt8](path.as_bytes())
        c_path.append(0)
        var handle: RawOpt = None
        var status = library._symbols[].tokenizer_open(_field(c_path.unsafe_ptr()), _raw(Pointer(to=handle)))
        _ = c_path^  # read by the call: alive until it returned
        library._check(status)
        return Self(_handle=handle, library=library)

    @staticmethod
    def parse(library: Library, json: Span[UInt8, _]) raises Error -> Self:
        """`uform_tokenizer_parse`: the bytes of a tokenizer.json in memory, read only during the call."""
        var handle: RawOpt = None
        var status = library._symbols[].tokenizer_parse(_raw(json.unsafe_ptr()), c_size_t(len(json)),
                                                        _raw(Pointer(to=handle)))
        library._check(status)
        return Self(_handle=handle, library=library)

    def info(self) raises Error -> TokenizerInfo:
        """`uform_tokenizer_info`: the vocabulary, the truncation, the special tokens added, the model."""
        var info = TokenizerInfo()
        self.library._check(self.library._symbols[].tokenizer_info(self._handle, _raw(Pointer(to=info))))
        return info^

    def token(self, id: UInt32) raises Error -> String:
        """`uform_tokenizer_token`: the string of token `id` as tokenizers' `id_to_token` gives it."""
        var string: RawOpt = None
        var length: c_size_t = 0
        self.library._check(self.library._symbols[].tokenizer_token(self._handle, id, _raw(Pointer(to=string)),
                                                                     _raw(Pointer(to=length))))
        var bytes = List[UInt8]()
        var at = string.value().unsafe_bitcast[UInt8]()
        for i in range(Int(length)):
            bytes.append(at.unsafe_offset(i)[])
        return String(unsafe_from_utf8=bytes)

    def _receiver(self) -> _TokenizerReceiver:
        return _TokenizerReceiver(self.library, self._handle, None)

    def on[origin: ImmOrigin](self, ref [origin] executor: Executor) -> TokenizerOn[origin_of(self), origin]:
        """The verb, blocking on `executor` (a host one)."""
        return TokenizerOn(Pointer(to=self), Pointer(to=executor))

    def deferred[origin: ImmOrigin](self, ref [origin] executor: Executor) -> TokenizerDeferredOn[origin_of(self), origin]:
        """The verb, submitted to `executor`, answering a `TokenizerDeferred`."""
        return TokenizerDeferredOn(Pointer(to=self), Pointer(to=executor))

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (`_ = library^` marks the end).
        var library = self.library
        library._symbols[].tokenizer_free(self._handle)
        _ = library^


@fieldwise_init
struct TokenizerOn[tokenizer_origin: ImmOrigin, executor_origin: ImmOrigin](TokenizerVerbs, Copyable):
    """The tokenizer's verb (`TokenizerVerbs`), blocking on an executor, split over its threads."""

    var tokenizer: Pointer[Tokenizer, Self.tokenizer_origin]
    var executor: Pointer[Executor, Self.executor_origin]

    def _receiver(self) -> _TokenizerReceiver:
        return _TokenizerReceiver(self.tokenizer[].library, self.tokenizer[]._handle, self.executor[]._handle)


struct _TokenizeBox(Movable):
    """A deferred tokenize's outcome (64-byte aligned, at a stable heap address while pending) and config."""

    var outcome: COutcome
    var config: CTokenizeConfig

    def __init__(out self, config: CTokenizeConfig):
        self.outcome = COutcome()
        self.config = config


struct TokenizerDeferredOn[tokenizer_origin: ImmOrigin, executor_origin: ImmOrigin](Copyable):
    """The tokenizer's verb, submitted to an executor: it answers a `TokenizerDeferred` at once, with the
    same arguments as the blocking one. `notify_eventfd` and `notify_ring` answer a receiver whose calls
    also notify an external loop when final, as `ModelDeferredOn`'s do."""

    var tokenizer: Pointer[Tokenizer, Self.tokenizer_origin]
    var executor: Pointer[Executor, Self.executor_origin]
    var _eventfd: Optional[Int32]
    var _ring_fd: Optional[Int32]
    var _ring_data: UInt64

    def __init__(out self, tokenizer: Pointer[Tokenizer, Self.tokenizer_origin],
                 executor: Pointer[Executor, Self.executor_origin]):
        self.tokenizer = tokenizer
        self.executor = executor
        self._eventfd = None
        self._ring_fd = None
        self._ring_data = 0

    def notify_eventfd(self, eventfd: Int) -> Self:
        """Each call writes the 8 bytes of a UInt64 1 to `eventfd` once final (`ModelDeferredOn.notify_eventfd`)."""
        var other = self.copy()
        other._eventfd = Int32(eventfd)
        return other^

    def notify_ring(self, ring_fd: Int, user_data: UInt64) -> Self:
        """Each call posts {user_data, final status} into that io_uring once final; -1 turns it off."""
        var other = self.copy()
        other._ring_fd = Int32(ring_fd)
        other._ring_data = user_data
        return other^

    # `type_of(texts)` puts the texts' own origins into the Deferred's type, so Mojo keeps them alive.
    def text_tokenize[T: AnyType](self, texts: TapeView[T, ...], ref arena: Arena,
                                  config: TokenizeConfig = TokenizeConfig()) raises Error
            -> TokenizerDeferred[origin_of(arena), Self.tokenizer_origin, Self.executor_origin, type_of(texts)]:
        var library = self.tokenizer[].library
        var box = OwnedPointer(_TokenizeBox(config._c))
        library._symbols[].outcome_init(_raw(Pointer(to=box[].outcome)))
        if self._eventfd:
            library._check(library._symbols[].outcome_notify_eventfd(_raw(Pointer(to=box[].outcome)),
                                                                      c_int(self._eventfd.value())))
        if self._ring_fd:
            library._check(library._symbols[].outcome_notify_ring(_raw(Pointer(to=box[].outcome)),
                                                                   c_int(self._ring_fd.value()), self._ring_data))
        var args = CTextTokenizeArgs(self.tokenizer[]._handle, self.executor[]._handle, texts._c(), arena._handle,
                                     _field(Pointer(to=box[].config)), None, _field(Pointer(to=box[].outcome)))
        # A failed submission leaves the outcome final with the same status; `wait` raises it.
        _ = library._symbols[].text_tokenize(_raw(Pointer(to=args)))
        return TokenizerDeferred(box^, library, _tokenized(CTokenized.empty(), arena), self.tokenizer,
                                 self.executor, texts)


struct TokenizerDeferred[arena_origin: ImmOrigin, tokenizer_origin: ImmOrigin, executor_origin: ImmOrigin,
                         Inputs: ImplicitlyCopyable & Deinitable](Movable):
    """A submitted tokenize answering `Tokenized`. Owns its outcome and config until final; borrows the
    tokenizer, the executor, the arena and the texts, which Mojo keeps alive for as long as it lives.
    Destroying an unfinished one waits for it (`uform_outcome_destroy`)."""

    var _box: OwnedPointer[_TokenizeBox]
    var _library: Library
    var _product: Tokenized[Self.arena_origin]
    var _tokenizer: Pointer[Tokenizer, Self.tokenizer_origin]
    var _executor: Pointer[Executor, Self.executor_origin]
    var _inputs: Self.Inputs

    def __init__(out self, var box: OwnedPointer[_TokenizeBox], library: Library, product: Tokenized[Self.arena_origin],
                 tokenizer: Pointer[Tokenizer, Self.tokenizer_origin], executor: Pointer[Executor, Self.executor_origin],
                 inputs: Self.Inputs):
        self._box = box^
        self._library = library
        self._product = product
        self._tokenizer = tokenizer
        self._executor = executor
        self._inputs = inputs

    def status(self) -> Status:
        """The status word, read without blocking: `Status.PENDING` or the final status."""
        return Status(self._library._symbols[].outcome_status(_raw(Pointer(to=self._box[].outcome))))

    def wait(self) raises Error -> Tokenized[Self.arena_origin]:
        """Blocks until final (`uform_outcome_wait`), then answers the views or raises the failure, as many
        times as it is asked."""
        var symbols = self._library._symbols
        var status = symbols[].outcome_wait(_raw(Pointer(to=self._box[].outcome)))
        if status != 0:
            raise Error(symbols[].outcome_error(_raw(Pointer(to=self._box[].outcome))), self._library)
        var product = self._product
        product._take(self._library, _field(Pointer(to=self._box[].outcome)))
        return product

    def __deinit__(deinit self):
        var library = self._library
        library._symbols[].outcome_destroy(_raw(Pointer(to=self._box[].outcome)))
        _ = library^
