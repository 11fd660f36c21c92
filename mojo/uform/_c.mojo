"""The C structures of `include/uform.h`, mirrored field for field, and the signatures of the bound
entry points. `mojo/layout.mojo` prints every size and offset here, and `tests/mojo_lockstep.py`
compares them with what the C compiler reports."""

from std.ffi import c_int, c_size_t, c_char

# `void *` and friends. Every handle and every pointer argument crosses as an untracked opaque pointer:
# one ABI for all of them (std.memory `OpaquePointer`, `MutUntrackedOrigin` from the prelude).
# An address passed for the duration of one call is any-origin: an untracked one lets Mojo end the
# pointee's lifetime (and drop its stores) before the call reads it, as the compiler showed.
comptime Raw = OpaquePointer[MutAnyOrigin]
# A nullable `void *` in a structure or a handle: `Optional[Pointer]` is laid out as one nullable pointer
# (layout.mojo checks it); fields cannot hold any-origin pointers, so these are untracked.
comptime RawOpt = Optional[OpaquePointer[MutUntrackedOrigin]]
comptime CString = Pointer[c_char, ImmStaticOrigin]
comptime CStatus = Int32


def _field[T: AnyType](p: Pointer[T, _]) -> RawOpt:
    """An address stored in a C structure field (untracked: the caller keeps the pointee alive)."""
    return p.unsafe_bitcast[NoneType]().unsafe_mut_cast[True]().unsafe_origin_cast[MutUntrackedOrigin]()


def _raw[T: AnyType](p: Pointer[T, _]) -> Raw:
    """An address as a `void *` for one C call (std.memory `Pointer.unsafe_bitcast`, `unsafe_mut_cast`,
    `unsafe_origin_cast`). Take it with `Pointer(to=x)` at the call site: a helper taking `ref x` may see
    a temporary copy of a register-passable value, whose address dies with the helper."""
    return p.unsafe_bitcast[NoneType]().unsafe_mut_cast[True]().unsafe_origin_cast[MutAnyOrigin]()


@fieldwise_init
struct CError(ImplicitlyCopyable):
    """`uform_error_t`."""
    var status: CStatus
    var entry: CString
    var message: CString


@fieldwise_init
struct CProgress(ImplicitlyCopyable):
    """`uform_progress_t`: the handler crosses as a nullable `void *` holding a `thin abi("C")` pointer."""
    var handler: RawOpt
    var state: RawOpt
    var steps: c_size_t


@fieldwise_init
struct CRamOptions(ImplicitlyCopyable):
    """`uform_ram_options_t`."""
    var domains: RawOpt
    var domains_count: c_size_t
    var threads: c_size_t
    var spin_ns: UInt64
    var pin: Bool


@fieldwise_init
struct CExecutorInfo(ImplicitlyCopyable):
    """`uform_executor_info_t`."""
    var kind: Int32
    var threads: c_size_t
    var domains_count: c_size_t
    var uring: Bool


@fieldwise_init
struct CExecutorNopArgs(ImplicitlyCopyable):
    """`uform_executor_nop_args_t`."""
    var executor: RawOpt
    var delay_ns: UInt64
    var outcome: RawOpt


@fieldwise_init
struct CView(ImplicitlyCopyable):
    """`uform_view_t`."""
    var data: RawOpt
    var scales: RawOpt
    var item_offsets: RawOpt
    var rows: c_size_t
    var columns: c_size_t
    var items: c_size_t
    var row_stride: c_size_t
    var scalar: Int32
    var device: Bool
    var arena: RawOpt
    var generation: UInt64

    @staticmethod
    def empty() -> Self:
        return Self(None, None, None, 0, 0, 0, 0, 0, False, None, 0)


@fieldwise_init
struct CTape(ImplicitlyCopyable):
    """`uform_tape_t`."""
    var data: RawOpt
    var offsets: RawOpt
    var count: c_size_t
    var length: c_size_t


@fieldwise_init
struct CLoadConfig(ImplicitlyCopyable):
    """`uform_load_config_t`."""
    var progress: CProgress
    var map: Bool


@fieldwise_init
struct CModelLoadArgs(ImplicitlyCopyable):
    """`uform_model_load_args_t`."""
    var executor: RawOpt
    var path: RawOpt
    var config: RawOpt
    var model: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct EncodeStats(ImplicitlyCopyable, Defaultable):
    """`uform_encode_stats_t`: what an encode reports, written when the call is final."""
    var items: c_size_t
    var failed: c_size_t
    var bytes: c_size_t
    var truncated: c_size_t
    var read_ns: UInt64
    var decode_ns: UInt64
    var compute_ns: UInt64
    var convert_ns: UInt64
    var total_ns: UInt64

    def __init__(out self):
        self = Self(0, 0, 0, 0, 0, 0, 0, 0, 0)


@fieldwise_init
struct CEncodeConfig(ImplicitlyCopyable):
    """`uform_encode_config_t`."""
    var outputs_scalar: Int32
    var matryoshka: c_size_t
    var progress: CProgress
    var stats: RawOpt


@fieldwise_init
struct CEncoded(ImplicitlyCopyable):
    """`uform_encoded_t`."""
    var embeddings: CView
    var token_vectors: CView
    var states: CView
    var statuses: RawOpt
    var items: c_size_t

    @staticmethod
    def empty() -> Self:
        return Self(CView.empty(), CView.empty(), CView.empty(), None, 0)


@fieldwise_init
struct CTextEncodeArgs(ImplicitlyCopyable):
    """`uform_text_encode_args_t`: UFORM_ENCODE_COMMON, then the texts."""
    var model: RawOpt
    var executor: RawOpt
    var outputs: UInt32
    var arena: RawOpt
    var config: RawOpt
    var encoded: RawOpt
    var outcome: RawOpt
    var texts: CTape


@fieldwise_init
struct CTinyCheckpointArgs(ImplicitlyCopyable):
    """`uform_tiny_checkpoint_args_t`."""
    var path: RawOpt
    var seed: UInt64
    var depth: c_size_t
    var hidden: c_size_t
    var mlp: c_size_t
    var context: c_size_t
    var image_size: c_size_t
    var image_patch: c_size_t


comptime OUTCOME_SIZE = 512
comptime OUTCOME_ALIGNMENT = 64


@align(64)
struct COutcome(Movable):
    """`uform_outcome_t`: 512 bytes aligned to 64 (std `@align`, matching C's `_Alignas`)."""
    var opaque: Array[UInt8, OUTCOME_SIZE]

    def __init__(out self):
        self.opaque = Array[UInt8, OUTCOME_SIZE](fill=0)


# The signatures of the bound entry points (`thin abi("C")` function types: the C calling convention).
comptime FnStatusName = def(CStatus) thin abi("C") -> CString
comptime FnLastError = def() thin abi("C") -> CError
comptime FnErrorRender = def(Raw, Raw, c_size_t) thin abi("C") -> c_size_t
comptime FnFeatures = def() thin abi("C") -> UInt32
comptime FnVersion = def(Raw, Raw, Raw) thin abi("C") -> NoneType
comptime FnVoidOfRaw = def(Raw) thin abi("C") -> NoneType
comptime FnVoidOfRawOpt = def(RawOpt) thin abi("C") -> NoneType
comptime FnStatusOfRaw = def(Raw) thin abi("C") -> CStatus
comptime FnStatusOfRawOpt = def(RawOpt) thin abi("C") -> CStatus
comptime FnErrorOfRaw = def(Raw) thin abi("C") -> CError
comptime FnStatusOfRawRaw = def(RawOpt, Raw) thin abi("C") -> CStatus
comptime FnRawOptOfRaw = def(Raw) thin abi("C") -> RawOpt
comptime FnDrain = def(RawOpt, Int32) thin abi("C") -> CStatus
comptime FnArenaReserve = def(RawOpt, c_size_t) thin abi("C") -> CStatus
comptime FnSizeOfRawOpt = def(RawOpt) thin abi("C") -> c_size_t
comptime FnU64OfRawOpt = def(RawOpt) thin abi("C") -> UInt64
comptime FnScalarSize = def(Int32) thin abi("C") -> c_size_t
comptime FnViewRow = def(Raw, c_size_t, Raw) thin abi("C") -> CStatus
