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
    """`uform_ram_options_t`. A field left unset (`None`) takes the engine's default when the executor is
    made (`uform_ram_options_init`: every domain, threads 0 = 7/8 of the cores, spin 0 = 100 ms, pinned);
    `RamOptions.defaults(library)` answers those defaults themselves (`uform_ram_options_default`)."""

    var domains: List[UInt]  # empty: every domain
    var threads: Optional[Int]
    var spin_ns: Optional[UInt64]
    var pin: Optional[Bool]

    def __init__(out self, *, threads: Optional[Int] = None, spin_ns: Optional[UInt64] = None,
                 pin: Optional[Bool] = None):
        self.domains = List[UInt]()
        self.threads = threads
        self.spin_ns = spin_ns
        self.pin = pin

    @staticmethod
    def on(domains: List[UInt]) -> Self:
        var options = Self()
        options.domains = domains.copy()
        return options^

    @staticmethod
    def defaults(library: Library) -> Self:
        """The engine's defaults, every field set (`uform_ram_options_default`, returned by value)."""
        var c = library._symbols[].ram_options_default()
        var options = Self(threads=Int(c.threads), spin_ns=c.spin_ns, pin=c.pin)
        if c.domains:
            options.domains = List[UInt](Span(unsafe_ptr=c.domains.value().unsafe_bitcast[UInt](),
                                              length=Int(c.domains_count)))
        return options^

    def _c(self, library: Library) -> CRamOptions:
        """The engine's defaults (`uform_ram_options_init`, written through a pointer), then the fields
        set here. `domains` points into this value, which must outlive the call it is passed to."""
        var c = CRamOptions(None, 0, 0, 0, False)
        library._symbols[].ram_options_init(_raw(Pointer(to=c)))
        if len(self.domains) > 0:
            c.domains = _field(self.domains.unsafe_ptr())
            c.domains_count = c_size_t(len(self.domains))
        if self.threads:
            c.threads = c_size_t(self.threads.value())
        if self.spin_ns:
            c.spin_ns = self.spin_ns.value()
        if self.pin:
            c.pin = self.pin.value()
        return c


struct VramOptions(Copyable):
    """`uform_vram_options_t`: the CUDA device ordinals to run on (empty: device 0)."""

    var devices: List[UInt]

    def __init__(out self):
        self.devices = List[UInt]()

    @staticmethod
    def on(devices: List[UInt]) -> Self:
        var options = Self()
        options.devices = devices.copy()
        return options^


comptime _CountThreadsC = def(OpaquePointer[MutUntrackedOrigin]) thin abi("C") -> c_size_t
comptime _ForThreadsC = def(OpaquePointer[MutUntrackedOrigin], OpaquePointer[MutUntrackedOrigin],
                            OpaquePointer[MutUntrackedOrigin]) thin abi("C") -> NoneType
comptime _WorkC = def(OpaquePointer[MutUntrackedOrigin], c_size_t) thin abi("C") -> NoneType


@fieldwise_init
struct PoolWork(ImplicitlyCopyable):
    """The engine's work for one call, handed to `ThreadPool.for_threads`: run it once for every thread in
    [0, count_threads), then return when all have returned."""

    var _work: _WorkC
    var _context: OpaquePointer[MutUntrackedOrigin]

    def __call__(self, thread: Int):
        self._work(self._context, c_size_t(thread))


trait ThreadPool:
    """A thread pool of the caller's (`uform_pool_vtable_t`), for executors that start no threads."""

    def count_threads(self) -> Int:
        """The threads `for_threads` runs on, the calling one included."""
        ...

    def for_threads(mut self, work: PoolWork):
        """Runs `work(thread)` for every thread in [0, count_threads) and returns when all have returned."""
        ...


def _count_threads[P: ThreadPool](pool: OpaquePointer[MutUntrackedOrigin]) abi("C") -> c_size_t:
    """Refers only to its parameter `P`, so it stays `thin` and crosses into C (an `abi("C")` callee)."""
    return c_size_t(pool.unsafe_bitcast[P]()[].count_threads())


def _for_threads[P: ThreadPool](pool: OpaquePointer[MutUntrackedOrigin], work: OpaquePointer[MutUntrackedOrigin],
                                context: OpaquePointer[MutUntrackedOrigin]) abi("C"):
    # The engine's `work` arrives as an address, read as a typed `thin abi("C")` pointer (`unsafe_bitcast`).
    var function = Pointer(to=work).unsafe_bitcast[_WorkC]()[]
    pool.unsafe_bitcast[P]()[].for_threads(PoolWork(function, context))


def _c_function[F: TrivialRegisterPassable](function: F) -> RawOpt:
    """A function pointer stored as `void *`, as the stdlib stores them (`Pointer.unsafe_bitcast`)."""
    var copy = function
    return Pointer(to=copy).unsafe_bitcast[OpaquePointer[MutUntrackedOrigin]]()[]


struct Executor(Movable):
    """Owns where a call runs and one event loop; runs one call at a time (another finds
    `Status.CONTENDED`). Freed by its destructor, which waits for a call in flight."""

    var _handle: RawOpt
    var library: Library
    var _vtable: List[CPoolVTable]  # a pool executor's vtable, at a stable heap address; else empty

    def __init__(out self, library: Library) raises Error:
        """The inline executor: no threads, every call runs on the calling thread."""
        self.library = library
        self._handle = None
        self._vtable = List[CPoolVTable]()
        library._check(library._symbols[].executor_create_inline(_raw(Pointer(to=self._handle))))

    def __init__(out self, *, _handle: RawOpt, library: Library):
        self._handle = _handle
        self.library = library
        self._vtable = List[CPoolVTable]()

    @staticmethod
    def for_ram(library: Library, options: RamOptions = RamOptions(), *, threads: Int = 0) raises Error -> Self:
        """Worker threads of its own over `options.domains` (all when empty); `threads`, when not 0,
        overrides `options.threads`."""
        if threads < 0 or (options.threads and options.threads.value() < 0):
            raise Error(Status.INVALID_ARGUMENT, "uform_executor_create_ram", "threads must not be negative", library)
        var c = options._c(library)
        if threads:
            c.threads = c_size_t(threads)
        var handle: RawOpt = None
        var status = library._symbols[].executor_create_ram(_field(Pointer(to=c)), _raw(Pointer(to=handle)))
        _ = c^  # read through an untracked pointer: alive until the call returned
        library._check(status)
        return Self(_handle=handle, library=library)

    @staticmethod
    def on_pool(library: Library, fu_pool: OpaquePointer[mut=True, _]) raises Error -> Self:
        """Borrows a fork_union `fu_pool_t *` (`uform_executor_create_fork_union`), which must outlive the
        executor: starts no thread, a call runs its loop on the calling thread and fans out through the
        pool. Raises `Status.UNSUPPORTED` in builds without fork_union."""
        var handle: RawOpt = None
        var status = library._symbols[].executor_create_fork_union(_field(fu_pool), _raw(Pointer(to=handle)))
        library._check(status)
        return Self(_handle=handle, library=library)

    @staticmethod
    def on_pool[P: ThreadPool](library: Library, mut pool: P) raises Error -> Self:
        """Over a pool of the caller's (`uform_executor_create_pool`): starts no thread, a call runs its loop
        on the calling thread and fans compute out through `pool.for_threads`. The pool must outlive the
        executor and every call on it (it crosses as an untracked pointer)."""
        var vtable: _CountThreadsC = _count_threads[P]
        var for_threads: _ForThreadsC = _for_threads[P]
        var executor = Self(_handle=None, library=library)
        executor._vtable.append(CPoolVTable(_c_function(vtable), _c_function(for_threads)))
        var handle: RawOpt = None
        var status = library._symbols[].executor_create_pool(_raw(executor._vtable.unsafe_ptr()),
                                                             _field(Pointer(to=pool)), _raw(Pointer(to=handle)))
        library._check(status)
        executor._handle = handle
        return executor^

    @staticmethod
    def for_vram(library: Library, options: VramOptions = VramOptions()) raises Error -> Self:
        """One host thread and one CUDA stream per device (`uform_executor_create_vram`). Raises the
        engine's status where that cannot be had: `Status.UNSUPPORTED` in builds without CUDA,
        `Status.DEVICE` where no such device exists."""
        var devices: RawOpt = None
        if len(options.devices) > 0:
            devices = _field(options.devices.unsafe_ptr())
        var c = CVramOptions(devices, c_size_t(len(options.devices)))
        var handle: RawOpt = None
        var status = library._symbols[].executor_create_vram(_field(Pointer(to=c)), _raw(Pointer(to=handle)))
        _ = c^  # read through an untracked pointer: alive until the call returned
        library._check(status)
        return Self(_handle=handle, library=library)

    def drain(self, mood: Mood = Mood.SLEEPING) raises Error:
        """Waits until no call holds the executor, then leaves idle workers in `mood`: `Mood.SPINNING`
        keeps them polling until the next call (one busy core per thread meanwhile), then `spin_ns`
        after each call; `Mood.SLEEPING` lets them sleep at once (`uform_executor_drain`)."""
        self.library._check(self.library._symbols[].executor_drain(self._handle, mood.code))

    def kind(self) raises Error -> ExecutorKind:
        return ExecutorKind(self._info().kind)

    def threads(self) raises Error -> Int:
        return Int(self._info().threads)

    def domains(self) raises Error -> Int:
        """NUMA domains it runs on (0 when unknown)."""
        return Int(self._info().domains_count)

    def uring(self) raises Error -> Bool:
        """Whether its loop runs on io_uring."""
        return self._info().uring

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
