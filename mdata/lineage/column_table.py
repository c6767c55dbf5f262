"""Append-only tables of fixed-dtype numpy columns, the storage of the DGraph.

One Python object per planned sample would cost hundreds of bytes at thousands of GPUs, so the
lineage tables (:mod:`mdata.lineage.dgraph`) are parallel numpy columns that grow by doubling
(amortised O(1) appends, vectorised per step) and drop old rows in place when a long run forgets
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["ColumnTable"]


class ColumnTable:
    """Append-only table of fixed-dtype numpy columns with amortised growth."""

    def __init__(self, dtypes: Mapping[str, Any], capacity: int = 1024) -> None:
        self._dtypes = dict(dtypes)
        self._cols = {name: np.empty(capacity, dtype=dt) for name, dt in self._dtypes.items()}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def append(self, **columns: np.ndarray | int) -> tuple[int, int]:
        """Append rows (arrays of equal length; scalars broadcast); returns their ``[start, stop)``."""
        lengths = {np.size(v) for v in columns.values() if np.ndim(v) > 0}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths {sorted(lengths)}")
        if set(columns) != set(self._dtypes):
            raise ValueError(f"expected columns {sorted(self._dtypes)}, got {sorted(columns)}")
        k = lengths.pop() if lengths else 1
        start, stop = self._n, self._n + k
        capacity = next(iter(self._cols.values())).size
        if stop > capacity:
            new = max(stop, 2 * capacity)
            for name, col in self._cols.items():
                grown = np.empty(new, dtype=col.dtype)
                grown[:start] = col[:start]
                self._cols[name] = grown
        for name, value in columns.items():
            self._cols[name][start:stop] = value
        self._n = stop
        return start, stop

    def append_row(self, *values: int) -> int:
        """Append one row, ``values`` in column order (no checks, no broadcasting): the path of
        events that come one at a time by the thousand, e.g. a chunk load each; returns its index."""
        i = self._n
        cols = self._cols
        if i >= next(iter(cols.values())).size:
            self.append(**dict(zip(cols, values)))
            return i
        for col, value in zip(cols.values(), values):
            col[i] = value
        self._n = i + 1
        return i

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the rows where ``mask`` is true (in place, order preserved)."""
        kept = int(np.count_nonzero(mask))
        for name, col in self._cols.items():
            col[:kept] = col[: self._n][mask]
        self._n = kept

    def column(self, name: str) -> np.ndarray:
        """A read-only view of the filled part of column ``name``."""
        view = self._cols[name][: self._n]
        view.flags.writeable = False
        return view

    def copy_rows(self, mask: np.ndarray | slice) -> dict[str, np.ndarray]:
        """Copies of the rows selected by ``mask`` (a boolean mask or a slice), column by column."""
        return {name: col[: self._n][mask].copy() for name, col in self._cols.items()}

    def row(self, i: int) -> dict[str, int]:
        return {name: col[i].item() for name, col in self._cols.items()}

    @property
    def nbytes(self) -> int:
        """Bytes held by the filled rows (capacity beyond them is at most as much again)."""
        return self.row_nbytes * self._n

    @property
    def allocated_nbytes(self) -> int:
        """Bytes the columns occupy, capacity included: what the table costs in memory."""
        return sum(col.nbytes for col in self._cols.values())

    @property
    def row_nbytes(self) -> int:
        return sum(col.dtype.itemsize for col in self._cols.values())
