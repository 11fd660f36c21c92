"""Progress handlers (`uform_progress_t`): a compile-time handler behind a C trampoline."""

from std.ffi import c_int, c_size_t

from ._c import *


@fieldwise_init
struct Continuation(Equatable, TrivialRegisterPassable):
    """`uform_continuation_t`."""

    var code: Int32
    comptime CONTINUE = Self(0)
    comptime CANCEL = Self(1)  # the call ends with Status.CANCELLED once in-flight work drains


comptime _ProgressC = def(OpaquePointer[MutUntrackedOrigin], c_size_t, c_size_t) thin abi("C") -> c_int


def _trampoline[S: AnyType, //, handler: def(Int, Int, Pointer[S, MutAnyOrigin]) thin -> Continuation](
    state: OpaquePointer[MutUntrackedOrigin], completed: c_size_t, total: c_size_t
) abi("C") -> c_int:
    """Refers only to its parameters, so it stays `thin` and crosses into C (`abi("C")` callee)."""
    var typed = state.unsafe_bitcast[S]().unsafe_origin_cast[MutAnyOrigin]()
    return handler(Int(completed), Int(total), typed).code


struct Progress(ImplicitlyCopyable):
    """What a verb reports progress to. The state must outlive the call."""

    var _c: CProgress

    def __init__(out self):
        """No progress reports."""
        self._c = CProgress(None, None, 0)

    @staticmethod
    def of[S: AnyType, //, handler: def(Int, Int, Pointer[S, MutAnyOrigin]) thin -> Continuation](
        state: Pointer[mut=True, S, _], steps: Int = 0
    ) -> Self:
        """`handler` is a compile-time parameter, since a capturing closure cannot cross into C; `steps`
        0 takes the engine's 100."""
        var function: _ProgressC = _trampoline[handler=handler]
        var progress = Self()
        # A function pointer stored as `void *`, as the stdlib stores them (`Pointer.unsafe_bitcast`).
        progress._c.handler = Pointer(to=function).unsafe_bitcast[OpaquePointer[MutUntrackedOrigin]]()[]
        progress._c.state = state.unsafe_bitcast[NoneType]().unsafe_origin_cast[MutUntrackedOrigin]()
        progress._c.steps = c_size_t(steps)
        return progress
