"""Executors: where a call runs (`uform_executor_t`), and the options that make one."""

from std.ffi import c_size_t

from ._c import *
from ._c import _raw, _field
from .library import Library, Status, Error


@fieldwise_init
struct Mood(Equatable, TrivialRegisterPassable):
    """`uform_mood_t`: what idle workers do after `drain`."""

    var code: Int32
    comptime SLEEPING = Self(0)
    comptime SPINNING = Self(1)


@fieldwise_init
struct ExecutorKind(Equatable, TrivialRegisterPassable):
    """`uform_executor_kind_t`."""

    var code: Int32
    comptime INLINE = Self(0)
    comptime RAM = Self(1)
    comptime POOL = Self(2)
    comptime VRAM = Self(3)


struct RamOptions(Copyable):
    """`uform_ram_options_t`, with the defaults `uform_ram_options_default` documents: every domain,
    threads 0 (7/8 of the cores), spin 0 (100 ms), pinned."""

    var domains: List[UInt]
    var threads: Int
    var spin_ns: UInt64
    var pin: Bool

    def __init__(out self, *, threads: Int = 0, spin_ns: UInt64 = 0, pin: Bool = True):
        self.domains = List[UInt]()
        self.threads = threads
        self.spin_ns = spin_ns
        self.pin = pin

    @staticmethod
    def on(domains: List[UInt]) -> Self:
        var options = Self()
        options.domains = domains.copy()
        return options^


struct Executor(Movable):
    """Owns where a call runs and one event loop; runs one call at a time (another finds
    `Status.CONTENDED`). Freed by its destructor, which waits for a call in flight."""

    var _handle: RawOpt
    var library: Library

    def __init__(out self, library: Library) raises Error:
        """The inline executor: no threads, every call runs on the calling thread."""
        self.library = library
        self._handle = None
        library._check(library._symbols[].executor_create_inline(_raw(Pointer(to=self._handle))))

    def __init__(out self, *, _handle: RawOpt, library: Library):
        self._handle = _handle
        self.library = library

    @staticmethod
    def for_ram(library: Library, options: RamOptions = RamOptions(), *, threads: Int = 0) raises Error -> Self:
        """Worker threads of its own over `options.domains` (all when empty); `threads`, when not 0,
        overrides `options.threads`."""
        if threads < 0:
            raise Error(Status.INVALID_ARGUMENT, "uform_executor_create_ram", "threads must not be negative", library)
        var domains: RawOpt = None
        if len(options.domains) > 0:
            domains = _field(Pointer(to=options.domains.unsafe_ptr()[]))
        var c = CRamOptions(domains, c_size_t(len(options.domains)),
                            c_size_t(threads if threads else options.threads), options.spin_ns, options.pin)
        var handle: RawOpt = None
        var status = library._symbols[].executor_create_ram(_field(Pointer(to=c)), _raw(Pointer(to=handle)))
        library._check(status)
        return Self(_handle=handle, library=library)

    def drain(self, mood: Mood = Mood.SLEEPING) raises Error:
        """Waits until no call holds the executor, then leaves idle workers in `mood`."""
        self.library._check(self.library._symbols[].executor_drain(self._handle, mood.code))

    def kind(self) raises Error -> ExecutorKind:
        return ExecutorKind(self._info().kind)

    def threads(self) raises Error -> Int:
        return Int(self._info().threads)

    def _info(self) raises Error -> CExecutorInfo:
        var info = CExecutorInfo(0, 0, 0, False)
        self.library._check(self.library._symbols[].executor_info(self._handle, _raw(Pointer(to=info))))
        return info

    def nop(self, delay_ns: UInt64 = 0) raises Error:
        """The empty verb, blocking: one trip through the loop after at least `delay_ns`."""
        var args = CExecutorNopArgs(self._handle, delay_ns, None)
        self.library._check(self.library._symbols[].executor_nop(_raw(Pointer(to=args))))

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (values die after
        # their last use, so `_ = library^` marks the end).
        var library = self.library
        library._symbols[].executor_free(self._handle)
        _ = library^
