"""Tapes (`uform_tape_t`): items end to end plus one more offset than items."""

from std.ffi import c_size_t

from ._c import *
from ._c import _field


struct TapeView[T: AnyType, data_origin: ImmOrigin, offsets_origin: ImmOrigin](ImplicitlyCopyable, Sized):
    """Borrows its elements and offsets, which Mojo keeps alive for as long as the view (their origins)."""

    var _data: Pointer[Self.T, Self.data_origin]
    var _length: Int
    var _offsets: Span[UInt, Self.offsets_origin]

    def __init__(out self, data: Pointer[Self.T, Self.data_origin], length: Int, offsets: Span[UInt, Self.offsets_origin]):
        self._data = data
        self._length = length
        self._offsets = offsets

    @staticmethod
    def of(data: Span[Self.T, Self.data_origin], ref [Self.offsets_origin] offsets: List[UInt]) -> Self:
        """Elements in host memory, and `len(offsets) - 1` items (std `Span.unsafe_ptr`)."""
        return Self(data.unsafe_ptr(), len(data), Span(offsets))

    @staticmethod
    def of(
        data: Pointer[Self.T, Self.data_origin], length: Int, ref [Self.offsets_origin] offsets: List[UInt]
    ) -> Self:
        """`length` elements at a host or device address (a MAX `DeviceBuffer`'s `unsafe_ptr()`), the
        offsets in host memory; the engine asks the driver where the elements lie. The caller keeps them
        alive for as long as the view."""
        return Self(data, length, Span(offsets))

    @staticmethod
    def of(data: Pointer[Self.T, Self.data_origin], ref [Self.offsets_origin] offsets: List[UInt]) -> Self:
        """Elements at a host or device address (`buffer.unsafe_ptr()`), `len(offsets) - 1` items, the
        length being the last offset (none: empty). The offsets lie in host memory; the caller keeps the
        elements alive for as long as the view."""
        var length = Int(offsets[len(offsets) - 1]) if len(offsets) > 0 else 0
        return Self(data, length, Span(offsets))

    def __len__(self) -> Int:
        return max(len(self._offsets) - 1, 0)

    def _c(self) -> CTape:
        # An empty offsets list is sent as a NULL tape pointer, which the engine refuses as C would.
        var offsets: RawOpt = None
        if len(self._offsets) > 0:
            offsets = _field(self._offsets.unsafe_ptr())
        return CTape(_field(self._data), offsets, c_size_t(len(self)), c_size_t(self._length))
