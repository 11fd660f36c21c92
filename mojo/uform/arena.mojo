"""Arenas (`uform_arena_t`), the outputs calls write, and views over them (`uform_view_t`)."""

from std.ffi import c_size_t
from std.sys import size_of

from ._c import *
from ._c import _raw, _field
from .library import Library, Status, Error
from .executor import Executor


@fieldwise_init
struct ScalarKind(Equatable, TrivialRegisterPassable, Writable):
    """`uform_scalar_t`: the kind outputs land as."""

    var code: Int32
    comptime F32 = Self(0)
    comptime BF16 = Self(1)
    comptime F16 = Self(2)
    comptime I8 = Self(3)  # scaled per row: value = q * scale
    comptime U32 = Self(4)  # token ids and byte offsets (the tokenizers' views)

    def dtype(self) -> DType:
        if self == Self.BF16:
            return DType.bfloat16
        if self == Self.F16:
            return DType.float16
        if self == Self.I8:
            return DType.int8
        if self == Self.U32:
            return DType.uint32
        return DType.float32

    def write_to(self, mut writer: Some[Writer]):
        writer.write("ScalarKind(", self.code, ")")


struct Arena(Movable):
    """Holds every output whose length only the call knows. Each call rewinds it, so the previous
    call's views go stale (reading one raises `Status.INVALID_ARGUMENT`)."""

    var _handle: RawOpt
    var library: Library

    def __init__(out self, executor: Executor) raises Error:
        """Placed where `executor` computes."""
        self.library = executor.library
        self._handle = None
        var status = self.library._symbols[].arena_create(executor._handle, _raw(Pointer(to=self._handle)))
        self.library._check(status)

    def __init__(out self, library: Library) raises Error:
        """Host pages for the calling thread, serving calls of any host executor."""
        self.library = library
        self._handle = None
        self.library._check(self.library._symbols[].arena_create_host(_raw(Pointer(to=self._handle))))

    def reserve(self, bytes: Int) raises Error:
        self.library._check(self.library._symbols[].arena_reserve(self._handle, c_size_t(bytes)))

    def capacity(self) -> Int:
        return Int(self.library._symbols[].arena_capacity(self._handle))

    def generation(self) -> UInt64:
        return self.library._symbols[].arena_generation(self._handle)

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (values die after
        # their last use, so `_ = library^` marks the end).
        var library = self.library
        library._symbols[].arena_free(self._handle)
        _ = library^


trait _Product(ImplicitlyCopyable):
    """What a final deferred call answers, read from its outcome (`Deferred.wait`)."""

    def _take(mut self, library: Library, outcome: RawOpt) raises Error:
        ...


struct View[origin: ImmOrigin](_Product, ImplicitlyCopyable, Sized):
    """Rows in an arena, valid until the arena's next call; keeps the arena alive (its origin)."""

    var _c: CView
    var _arena: Pointer[Arena, Self.origin]

    def __init__(out self, c: CView, arena: Pointer[Arena, Self.origin]):
        self._c = c
        self._arena = arena

    def __len__(self) -> Int:
        return Int(self._c.rows)

    def columns(self) -> Int:
        return Int(self._c.columns)

    def items(self) -> Int:
        return Int(self._c.items)

    def scalar(self) -> ScalarKind:
        return ScalarKind(self._c.scalar)

    def generation(self) -> UInt64:
        return self._c.generation

    def scalar_bytes(self) -> Int:
        """Bytes of one scalar of the view's kind (`uform_scalar_size`)."""
        return Int(self._arena[].library._symbols[].scalar_size(self._c.scalar))

    def check(self) raises Error:
        """`uform_view_check`: raises `INVALID_ARGUMENT` once stale, `DEVICE` for device memory."""
        var library = self._arena[].library
        library._check(library._symbols[].view_check(_raw(Pointer(to=self._c))))

    def row[dtype: DType](self, row: Int) raises Error -> Span[Scalar[dtype], Self.origin]:
        """Row `row` read in place (`uform_view_row`), its scalars typed as `dtype`, which must be the
        view's kind (`DType.float32` for F32, `bfloat16`, `float16`, `int8`)."""
        var library = self._arena[].library
        if dtype != self.scalar().dtype():
            raise Error(Status.INVALID_ARGUMENT, "uform_view_row", "the row's dtype is not the view's scalar kind", library)
        if row < 0:
            raise Error(Status.INVALID_ARGUMENT, "uform_view_row", "row out of range", library)
        var data: RawOpt = None
        library._check(library._symbols[].view_row(_raw(Pointer(to=self._c)), c_size_t(row), _raw(Pointer(to=data))))
        # std.memory `Pointer.unsafe_bitcast` / `unsafe_origin_cast`: the row lives in the arena.
        var typed = data.value().unsafe_bitcast[Scalar[dtype]]().unsafe_mut_cast[False]().unsafe_origin_cast[Self.origin]()
        return Span[Scalar[dtype], Self.origin](unsafe_ptr=typed, length=self.columns())

    def copy_out[dtype: DType](self) raises Error -> List[Scalar[dtype]]:
        """`uform_view_copy`: every row, packed, into host memory, from host or device arenas alike. An I8
        view needs its scales: use `copy_out_scaled`."""
        var library = self._arena[].library
        if dtype != self.scalar().dtype():
            raise Error(Status.INVALID_ARGUMENT, "uform_view_copy", "the dtype is not the view's scalar kind", library)
        var count = len(self) * self.columns()
        var data = List[Scalar[dtype]](length=count, fill=0)
        library._check(library._symbols[].view_copy(_raw(Pointer(to=self._c)), _raw(data.unsafe_ptr()),
                                                    c_size_t(count * size_of[Scalar[dtype]]()), None))
        return data^

    def copy_out_scaled(self) raises Error -> Tuple[List[Int8], List[Float32]]:
        """`uform_view_copy` of an I8 view: the rows, and one scale per row (value = q * scale)."""
        var library = self._arena[].library
        var data = List[Int8](length=len(self) * self.columns(), fill=0)
        var scales = List[Float32](length=max(len(self), 1), fill=0)
        library._check(library._symbols[].view_copy(_raw(Pointer(to=self._c)), _raw(data.unsafe_ptr()),
                                                    c_size_t(len(data)), _field(scales.unsafe_ptr())))
        scales.resize(len(self), 0)
        return (data^, scales^)

    def row_offsets(self) -> List[Int]:
        """Rows grouped per item (token vectors, choice probabilities): item i owns rows
        [offsets[i], offsets[i + 1]). One row per item when the view has no grouping."""
        var offsets = List[Int]()
        for i in range(self.items() + 1):
            if self._c.item_offsets:
                # std.memory `Pointer.unsafe_offset`: item_offsets holds items + 1 host `size_t`s.
                offsets.append(Int(self._c.item_offsets.value().unsafe_bitcast[c_size_t]().unsafe_offset(i)[]))
            else:
                offsets.append(i)
        return offsets^

    def _take(mut self, library: Library, outcome: RawOpt) raises Error:
        """The probabilities of a final `text_choose` outcome (`uform_outcome_probabilities`)."""
        library._check(library._symbols[].outcome_probabilities(outcome, _raw(Pointer(to=self._c))))
