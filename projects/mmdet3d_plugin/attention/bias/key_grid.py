"""The :class:`KeyGrid`: where a grid of cells lies among the keys of an attention call."""
from dataclasses import dataclass

from .part import _to_int


@dataclass(frozen=True)
class KeyGrid:
    """A block of keys laid out as ``planes x height x width`` cells.

    The key of cell ``(plane, y, x)`` is at index
    ``offset + (plane * height + y) * width + x`` of the key sequence. The BEV
    grid of CMT is ``KeyGrid(0, 1, H_bev, W_bev)``, its camera grid
    ``KeyGrid(H_bev * W_bev, N_views, H_img, W_img)``.
    """

    offset: int
    planes: int
    height: int
    width: int

    def __post_init__(self) -> None:
        object.__setattr__(self, 'offset', _to_int(self.offset, 'KeyGrid.offset', 0))
        for name in ('planes', 'height', 'width'):
            object.__setattr__(self, name, _to_int(getattr(self, name), f'KeyGrid.{name}', 1))

    @property
    def num_cells(self) -> int:
        """Number of keys in the grid."""
        return self.planes * self.height * self.width

    @property
    def end(self) -> int:
        """One past the last key index of the grid."""
        return self.offset + self.num_cells
