"""The engine, loaded once: `Library`, the symbol table it resolves, `Status` and the `Error` every
fallible entry point raises."""

from std.ffi import OwnedDLHandle, CStringSpan, c_char, c_int, c_size_t
from std.memory import ArcPointer
from std.os import getenv
from std.sys import CompilationTarget

from ._c import *
from ._c import _raw, _field


@fieldwise_init
struct Status(Equatable, TrivialRegisterPassable, Writable):
    """`uform_status_t`: one enumeration shared with the C interface (`__eq__` is synthesized)."""

    var code: Int32

    comptime OK = Self(0)
    comptime PENDING = Self(1)
    comptime CANCELLED = Self(2)
    comptime CONTENDED = Self(3)
    comptime INVALID_ARGUMENT = Self(4)
    comptime IO = Self(5)
    comptime FORMAT = Self(6)
    comptime OUT_OF_MEMORY = Self(7)
    comptime DEVICE = Self(8)
    comptime UNSUPPORTED = Self(9)
    comptime INTERNAL = Self(10)
    comptime MISSING_SYMBOL = Self(11)

    def name(self) -> StaticString:
        """The engine's lowercase name (`uform_status_name`), kept here so that a library that failed to
        load can still be named."""
        comptime names: Array[StaticString, 12] = [
            "ok", "pending", "cancelled", "contended", "invalid_argument", "io", "format",
            "out_of_memory", "device", "unsupported", "internal", "missing_symbol",
        ]
        if self.code < 0 or self.code >= 12:
            return "unknown"
        return materialize[names]()[Int(self.code)]

    def write_to(self, mut writer: Some[Writer]):
        writer.write(self.name())


@fieldwise_init
struct Feature(Equatable, TrivialRegisterPassable):
    """`uform_feature_t`: an optional feature of the build (`Library.has`)."""

    var code: UInt32
    comptime URING = Self(1 << 0)
    comptime HWLOC = Self(1 << 1)
    comptime JPEG = Self(1 << 2)
    comptime SPNG = Self(1 << 3)
    comptime FFMPEG = Self(1 << 4)
    comptime CUDA = Self(1 << 5)
    comptime NCCL = Self(1 << 6)
    comptime MPI = Self(1 << 7)
    comptime MICROHTTPD = Self(1 << 8)
    comptime FORK_UNION = Self(1 << 9)
    comptime TOKENIZERS = Self(1 << 10)
    comptime SENTENCEPIECE = Self(1 << 11)


@fieldwise_init
struct Weights(Equatable, TrivialRegisterPassable):
    """`uform_weights_t`: the weights of the blocks' linear layers a host model holds."""

    var code: Int32
    comptime STORED = Self(0)  # as the checkpoint stores them: BF16, or I8 with their scales
    comptime BF16 = Self(1)  # I8 layers widened to BF16
    comptime I8 = Self(2)  # BF16 layers quantized per output row as they load


def _c_string(s: StaticString) -> CString:
    """A literal's bytes as `char const *`: Mojo string literals are NUL-terminated static storage."""
    return s.unsafe_ptr().unsafe_bitcast[c_char]()


def _static(s: CString) -> StaticString:
    """A static C string of the engine as a `StaticString` (std.ffi `CStringSpan(unsafe_from_ptr=)`)."""
    return StaticString(unsafe_from_utf8=CStringSpan[ImmStaticOrigin](unsafe_from_ptr=s))


def _text_of(s: RawOpt) -> String:
    """A C string of the engine that an out-parameter received (up to its NUL), copied."""
    var bytes = List[UInt8]()
    var at = s.value().unsafe_bitcast[UInt8]()
    var i = 0
    while at.unsafe_offset(i)[] != 0:
        bytes.append(at.unsafe_offset(i)[])
        i += 1
    return String(unsafe_from_utf8=bytes)


def _message_copy(s: CString) -> Array[UInt8, ERROR_MESSAGE_SIZE]:
    """A failure's message, copied NUL-terminated (cut at `ERROR_MESSAGE_SIZE - 1` bytes, as the engine
    cuts it): the engine's copy lives only until the thread's next failure, or with its outcome."""
    var copy = Array[UInt8, ERROR_MESSAGE_SIZE](fill=0)
    var bytes = _static(s).as_bytes()
    for i in range(min(len(bytes), ERROR_MESSAGE_SIZE - 1)):
        copy[i] = bytes[i]
    return copy^


struct Error(Copyable, Writable):
    """A failure: its `Status`, the entry point and the message. It keeps the engine mapped while it
    lives, since the entry point is the engine's own static text; the message is a copy of its own,
    taken when the failure was read (`uform_error_t` says how briefly the engine's copy lives)."""

    var status: Status
    var _c: CError
    var _message: Array[UInt8, ERROR_MESSAGE_SIZE]
    var _library: Optional[Library]

    def __init__(out self, c: CError, library: Optional[Library]):
        self.status = Status(c.status)
        self._c = c
        self._message = _message_copy(c.message)
        self._library = library

    def __init__(out self, status: Status, entry: StaticString, message: StaticString, library: Optional[Library] = None):
        """A fault this binding catches before the boundary, with the status the engine would report."""
        self.status = status
        self._c = CError(status.code, _c_string(entry), _c_string(message))
        self._message = _message_copy(self._c.message)
        self._library = library

    def entry(self) -> StaticString:
        return _static(self._c.entry)

    def message(self) -> String:
        var length = 0
        while length < ERROR_MESSAGE_SIZE - 1 and self._message[length] != 0:
            length += 1
        return String(StringSpan(unsafe_from_utf8=Span(self._message)[:length]))

    def write_to(self, mut writer: Some[Writer]):
        """`UForm: io [uform_model_load_ram]: cannot open checkpoint`, rendered by `uform_error_render`
        when the engine is loaded."""
        if self._library:
            var buffer = Array[UInt8, 512](fill=0)
            var message = self._message.copy()
            var c = self._c
            c.message = Pointer(to=message).unsafe_bitcast[c_char]().unsafe_mut_cast[False]().unsafe_origin_cast[ImmStaticOrigin]()
            var needed = self._library.value()._symbols[].error_render(_raw(Pointer(to=c)), _raw(Pointer(to=buffer)), 512)
            var length = min(Int(needed), 511)
            writer.write(StringSpan(unsafe_from_utf8=Span(buffer)[:length]))
        else:
            writer.write("UForm: ", self.status, " [", self.entry(), "]: ", self.message())


def _resolve[Sig: TrivialRegisterPassable](ref handle: OwnedDLHandle, name: StaticString) raises Error -> Sig:
    """One `dlsym` per symbol (std.ffi `OwnedDLHandle.get_symbol` answers `Optional[Pointer]`), the
    address then read as a typed `thin abi("C")` function pointer (`Pointer.unsafe_bitcast`)."""
    var found = handle.get_symbol[NoneType](name)
    if not found:
        raise Error(Status.MISSING_SYMBOL, name, "the loaded library lacks this entry point")
    # The address must live in a variable: a pointer to the temporary `found.value()` crashes.
    var address = found.value()
    return Pointer(to=address).unsafe_bitcast[Sig]()[]


struct _Symbols(Movable):
    """The handle and every bound entry point, resolved once. `mojo/lockstep.py` reads the names."""

    var handle: OwnedDLHandle
    var status_name: FnStatusName
    var last_error: FnLastError
    var error_render: FnErrorRender
    var features: FnFeatures
    var kernels: FnKernels
    var version: FnVersion
    var outcome_init: FnVoidOfRaw
    var outcome_destroy: FnVoidOfRaw
    var outcome_status: FnStatusOfRaw
    var outcome_wait: FnStatusOfRaw
    var outcome_error: FnErrorOfRaw
    var outcome_encoded: FnStatusOfRawRaw
    var outcome_model: FnRawOptOfRaw
    var executor_create_inline: FnStatusOfRaw
    var executor_create_ram: FnStatusOfRawRaw
    var executor_free: FnVoidOfRawOpt
    var executor_drain: FnDrain
    var executor_info: FnStatusOfRawRaw
    var executor_nop: FnStatusOfRaw
    var arena_create: FnStatusOfRawRaw
    var arena_create_host: FnStatusOfRaw
    var arena_free: FnVoidOfRawOpt
    var arena_reserve: FnArenaReserve
    var arena_capacity: FnSizeOfRawOpt
    var arena_generation: FnU64OfRawOpt
    var scalar_size: FnScalarSize
    var view_check: FnStatusOfRaw
    var view_row: FnViewRow
    var model_load_ram: FnStatusOfRaw
    var model_free: FnVoidOfRawOpt
    var text_encode: FnStatusOfRaw
    var tiny_checkpoint: FnStatusOfRaw
    var checkpoint_quantize: FnStatusOfRaw
    var outcome_notify_eventfd: FnNotifyEventfd
    var outcome_notify_ring: FnNotifyRing
    var outcome_probabilities: FnStatusOfRawRaw
    var executor_create_pool: FnStatusOfRawRawRaw
    var executor_create_fork_union: FnStatusOfRawRaw
    var executor_create_vram: FnStatusOfRawRaw
    var view_copy: FnViewCopy
    var model_load_vram: FnStatusOfRaw
    var model_info: FnStatusOfRawRaw
    var image_encode: FnStatusOfRaw
    var image_encode_pixels: FnStatusOfRaw
    var video_encode: FnStatusOfRaw
    var audio_encode: FnStatusOfRaw
    var audio_encode_samples: FnStatusOfRaw
    var text_choose: FnStatusOfRaw
    var ram_options_default: FnRamOptionsDefault
    var ram_options_init: FnVoidOfRaw
    var mesh_bootstrap: FnStatusOfRaw
    var mesh_free: FnVoidOfRawOpt
    var mesh_rank: FnSizeOfRawOpt
    var mesh_size: FnSizeOfRawOpt
    var mesh_info: FnStatusOfRawRaw
    var trainer_config_default: FnVoidOfRaw
    var trainer_init_ram: FnStatusOfRaw
    var trainer_init_vram: FnStatusOfRaw
    var trainer_free: FnVoidOfRawOpt
    var trainer_step: FnStatusOfRaw
    var trainer_save: FnStatusOfRaw
    var checkpoint_convert: FnStatusOfRaw
    var tokenizer_open: FnStatusOfRawRaw
    var tokenizer_parse: FnTokenizerParse
    var tokenizer_free: FnVoidOfRawOpt
    var tokenizer_info: FnStatusOfRawRaw
    var text_tokenize: FnStatusOfRaw
    var outcome_tokenized: FnStatusOfRawRaw
    var tokenizer_token: FnTokenizerToken
    var model_prompt: FnModelPrompt
    var hub_folder: FnHubFolder

    def __init__(out self, var handle: OwnedDLHandle) raises Error:
        self.status_name = _resolve[FnStatusName](handle, "uform_status_name")
        self.last_error = _resolve[FnLastError](handle, "uform_last_error")
        self.error_render = _resolve[FnErrorRender](handle, "uform_error_render")
        self.features = _resolve[FnFeatures](handle, "uform_features")
        self.version = _resolve[FnVersion](handle, "uform_version")
        self.kernels = _resolve[FnKernels](handle, "uform_kernels")
        self.outcome_init = _resolve[FnVoidOfRaw](handle, "uform_outcome_init")
        self.outcome_destroy = _resolve[FnVoidOfRaw](handle, "uform_outcome_destroy")
        self.outcome_status = _resolve[FnStatusOfRaw](handle, "uform_outcome_status")
        self.outcome_wait = _resolve[FnStatusOfRaw](handle, "uform_outcome_wait")
        self.outcome_error = _resolve[FnErrorOfRaw](handle, "uform_outcome_error")
        self.outcome_encoded = _resolve[FnStatusOfRawRaw](handle, "uform_outcome_encoded")
        self.outcome_model = _resolve[FnRawOptOfRaw](handle, "uform_outcome_model")
        self.executor_create_inline = _resolve[FnStatusOfRaw](handle, "uform_executor_create_inline")
        self.executor_create_ram = _resolve[FnStatusOfRawRaw](handle, "uform_executor_create_ram")
        self.executor_free = _resolve[FnVoidOfRawOpt](handle, "uform_executor_free")
        self.executor_drain = _resolve[FnDrain](handle, "uform_executor_drain")
        self.executor_info = _resolve[FnStatusOfRawRaw](handle, "uform_executor_info")
        self.executor_nop = _resolve[FnStatusOfRaw](handle, "uform_executor_nop")
        self.arena_create = _resolve[FnStatusOfRawRaw](handle, "uform_arena_create")
        self.arena_create_host = _resolve[FnStatusOfRaw](handle, "uform_arena_create_host")
        self.arena_free = _resolve[FnVoidOfRawOpt](handle, "uform_arena_free")
        self.arena_reserve = _resolve[FnArenaReserve](handle, "uform_arena_reserve")
        self.arena_capacity = _resolve[FnSizeOfRawOpt](handle, "uform_arena_capacity")
        self.arena_generation = _resolve[FnU64OfRawOpt](handle, "uform_arena_generation")
        self.scalar_size = _resolve[FnScalarSize](handle, "uform_scalar_size")
        self.view_check = _resolve[FnStatusOfRaw](handle, "uform_view_check")
        self.view_row = _resolve[FnViewRow](handle, "uform_view_row")
        self.model_load_ram = _resolve[FnStatusOfRaw](handle, "uform_model_load_ram")
        self.model_free = _resolve[FnVoidOfRawOpt](handle, "uform_model_free")
        self.text_encode = _resolve[FnStatusOfRaw](handle, "uform_text_encode")
        self.tiny_checkpoint = _resolve[FnStatusOfRaw](handle, "uform_tiny_checkpoint")
        self.checkpoint_quantize = _resolve[FnStatusOfRaw](handle, "uform_checkpoint_quantize")
        self.outcome_notify_eventfd = _resolve[FnNotifyEventfd](handle, "uform_outcome_notify_eventfd")
        self.outcome_notify_ring = _resolve[FnNotifyRing](handle, "uform_outcome_notify_ring")
        self.outcome_probabilities = _resolve[FnStatusOfRawRaw](handle, "uform_outcome_probabilities")
        self.executor_create_pool = _resolve[FnStatusOfRawRawRaw](handle, "uform_executor_create_pool")
        self.executor_create_fork_union = _resolve[FnStatusOfRawRaw](handle, "uform_executor_create_fork_union")
        self.executor_create_vram = _resolve[FnStatusOfRawRaw](handle, "uform_executor_create_vram")
        self.view_copy = _resolve[FnViewCopy](handle, "uform_view_copy")
        self.model_load_vram = _resolve[FnStatusOfRaw](handle, "uform_model_load_vram")
        self.model_info = _resolve[FnStatusOfRawRaw](handle, "uform_model_info")
        self.image_encode = _resolve[FnStatusOfRaw](handle, "uform_image_encode")
        self.image_encode_pixels = _resolve[FnStatusOfRaw](handle, "uform_image_encode_pixels")
        self.video_encode = _resolve[FnStatusOfRaw](handle, "uform_video_encode")
        self.audio_encode = _resolve[FnStatusOfRaw](handle, "uform_audio_encode")
        self.audio_encode_samples = _resolve[FnStatusOfRaw](handle, "uform_audio_encode_samples")
        self.text_choose = _resolve[FnStatusOfRaw](handle, "uform_text_choose")
        self.ram_options_default = _resolve[FnRamOptionsDefault](handle, "uform_ram_options_default")
        self.ram_options_init = _resolve[FnVoidOfRaw](handle, "uform_ram_options_init")
        self.mesh_bootstrap = _resolve[FnStatusOfRaw](handle, "uform_mesh_bootstrap")
        self.mesh_free = _resolve[FnVoidOfRawOpt](handle, "uform_mesh_free")
        self.mesh_rank = _resolve[FnSizeOfRawOpt](handle, "uform_mesh_rank")
        self.mesh_size = _resolve[FnSizeOfRawOpt](handle, "uform_mesh_size")
        self.mesh_info = _resolve[FnStatusOfRawRaw](handle, "uform_mesh_info")
        self.trainer_config_default = _resolve[FnVoidOfRaw](handle, "uform_trainer_config_default")
        self.trainer_init_ram = _resolve[FnStatusOfRaw](handle, "uform_trainer_init_ram")
        self.trainer_init_vram = _resolve[FnStatusOfRaw](handle, "uform_trainer_init_vram")
        self.trainer_free = _resolve[FnVoidOfRawOpt](handle, "uform_trainer_free")
        self.trainer_step = _resolve[FnStatusOfRaw](handle, "uform_trainer_step")
        self.trainer_save = _resolve[FnStatusOfRaw](handle, "uform_trainer_save")
        self.checkpoint_convert = _resolve[FnStatusOfRaw](handle, "uform_checkpoint_convert")
        self.tokenizer_open = _resolve[FnStatusOfRawRaw](handle, "uform_tokenizer_open")
        self.tokenizer_parse = _resolve[FnTokenizerParse](handle, "uform_tokenizer_parse")
        self.tokenizer_free = _resolve[FnVoidOfRawOpt](handle, "uform_tokenizer_free")
        self.tokenizer_info = _resolve[FnStatusOfRawRaw](handle, "uform_tokenizer_info")
        self.text_tokenize = _resolve[FnStatusOfRaw](handle, "uform_text_tokenize")
        self.outcome_tokenized = _resolve[FnStatusOfRawRaw](handle, "uform_outcome_tokenized")
        self.tokenizer_token = _resolve[FnTokenizerToken](handle, "uform_tokenizer_token")
        self.model_prompt = _resolve[FnModelPrompt](handle, "uform_model_prompt")
        self.hub_folder = _resolve[FnHubFolder](handle, "uform_hub_folder")
        self.handle = handle^


struct Library(ImplicitlyCopyable):
    """The engine, opened once; every handle and error made through it holds a copy, which keeps it
    mapped (std.memory `ArcPointer`: the resolved pointers alone would not)."""

    var _symbols: ArcPointer[_Symbols]

    def __init__(out self) raises Error:
        """Opens `$UFORM_LIBRARY` when set, else the engine by the platform's search: `libuform.so` through
        the dynamic linker on Linux, which reads the RUNPATH `mojo build` bakes in (a pixi or conda
        environment's `lib`, where the `uform` package installs it), then LD_LIBRARY_PATH and the system's
        folders; on macOS `@rpath/libuform.dylib` (the LC_RPATH entries `mojo build` bakes in), then
        `libuform.dylib` through dyld's own search."""
        var path = getenv("UFORM_LIBRARY")
        if path:
            self = Library(path)
            return
        comptime if CompilationTarget.is_macos():
            try:
                self = Library("@rpath/libuform.dylib")
                return
            except:
                pass
            self = Library("libuform.dylib")
        else:
            self = Library("libuform.so")

    def __init__(out self, path: String) raises Error:
        var handle: OwnedDLHandle
        try:
            handle = OwnedDLHandle(path)
        except:
            # The builtin error of `dlopen` becomes ours ("wrap Error at API boundaries").
            raise Error(Status.IO, "dlopen", "the engine's shared library could not be opened (set UFORM_LIBRARY to its"
                + " path, or install the uform package into the environment whose mojo built the program)")
        self._symbols = ArcPointer(_Symbols(handle^))

    def version(self) -> Tuple[Int, Int, Int]:
        var major: c_int = 0
        var minor: c_int = 0
        var patch: c_int = 0
        self._symbols[].version(_raw(Pointer(to=major)), _raw(Pointer(to=minor)), _raw(Pointer(to=patch)))
        return (Int(major), Int(minor), Int(patch))

    def features(self) -> UInt32:
        return self._symbols[].features()

    def has(self, feature: Feature) -> Bool:
        """Whether this build has `feature` (`uform_features`); without it its verbs raise UNSUPPORTED."""
        return (self.features() & feature.code) != 0

    def kernels(self) -> Tuple[String, String, String]:
        """`uform_kernels`: the CPU kernel path this process computes on ("avx512bf16", "avx2", "neon", ...), why
        it was chosen (the dispatcher's rule, or "UFORM_KERNELS"), and whether Intel AMX's tiles are used and
        why not ("amx: ...")."""
        var reason: RawOpt = None
        var amx: RawOpt = None
        var path = self._symbols[].kernels(_raw(Pointer(to=reason)), _raw(Pointer(to=amx)))
        return (String(_static(path)), _text_of(reason), _text_of(amx))

    def hub_folder(self, id: String) raises Error -> String:
        """`uform_hub_folder`: the folder of hub model `id` ("OWNER/NAME", then "@REVISION" if not main) in
        the local Hugging Face cache, as huggingface_hub finds it offline; raises IO when it is not cached.
        `Model.load` takes such an id as its path where no file or folder of that name exists."""
        var c_id = List[UInt8](id.as_bytes())
        c_id.append(0)
        var buffer = List[UInt8](length=4096, fill=0)
        var length: c_size_t = 0
        var status = self._symbols[].hub_folder(_raw(c_id.unsafe_ptr()), _raw(buffer.unsafe_ptr()),
                                                c_size_t(len(buffer)), _raw(Pointer(to=length)))
        _ = c_id^  # read by the call: alive until it returned
        self._check(status)
        var bytes = List[UInt8]()
        for i in range(Int(length)):
            bytes.append(buffer[i])
        return String(unsafe_from_utf8=bytes)

    def status_name(self, status: Status) -> StaticString:
        return _static(self._symbols[].status_name(status.code))

    def write_tiny_checkpoint(self, path: String, seed: UInt64 = 42) raises Error:
        """`uform_tiny_checkpoint`: a small, seeded, valid checkpoint with every tower, default sizes."""
        var bytes = List[UInt8](path.as_bytes())
        bytes.append(0)
        var args = CTinyCheckpointArgs(_field(bytes.unsafe_ptr()), seed, 0, 0, 0, 0, 0, 0)
        self._check(self._symbols[].tiny_checkpoint(_raw(Pointer(to=args))))
        _ = bytes^  # the path is read by the call: keep it alive until it returns

    def quantize_checkpoint(self, input: String, output: String) raises Error:
        """`uform_checkpoint_quantize`: `input` written again as `output` with I8 weights."""
        var input_bytes = List[UInt8](input.as_bytes())
        input_bytes.append(0)
        var output_bytes = List[UInt8](output.as_bytes())
        output_bytes.append(0)
        var args = CCheckpointQuantizeArgs(_field(input_bytes.unsafe_ptr()), _field(output_bytes.unsafe_ptr()))
        self._check(self._symbols[].checkpoint_quantize(_raw(Pointer(to=args))))
        _ = input_bytes^  # the paths are read by the call: keep them alive until it returns
        _ = output_bytes^

    def convert_checkpoint(self, input: String, output: String, weights: Weights = Weights.STORED) raises Error:
        """`uform_checkpoint_convert`: the model at `input` (a checkpoint or a pretrained model's folder)
        written as one self-contained checkpoint at `output`, its tokenizer.json in the metadata; it loads to
        the same embeddings, bit for bit. `Weights.STORED` keeps the weights as they load (a folder's in
        BF16), `Weights.I8` quantizes them as `quantize_checkpoint` does. Blocks on the calling thread."""
        var input_bytes = List[UInt8](input.as_bytes())
        input_bytes.append(0)
        var output_bytes = List[UInt8](output.as_bytes())
        output_bytes.append(0)
        var args = CCheckpointConvertArgs(_field(input_bytes.unsafe_ptr()), _field(output_bytes.unsafe_ptr()),
                                          weights.code)
        self._check(self._symbols[].checkpoint_convert(_raw(Pointer(to=args))))
        _ = input_bytes^  # the paths are read by the call: keep them alive until it returns
        _ = output_bytes^

    def _last_error(self) -> Error:
        return Error(self._symbols[].last_error(), self)

    def _check(self, code: CStatus) raises Error:
        """Raises the calling thread's last error (`uform_last_error`) for a failed status."""
        if code != 0:
            var c = self._symbols[].last_error()
            if c.status != code:
                c.status = code
            raise Error(c, self)
