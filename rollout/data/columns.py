"""Arrow list columns as flat NumPy buffers, both ways, without a Python object per value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMPY = {pa.int32(): np.int32, pa.float32(): np.float32}


def list_slices(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list array: row i is values[offsets[i]:offsets[i + 1]]."""
    return _view(array.offsets, np.int32), _view(array.values, _NUMPY[array.type.value_type])


def list_array(
    offsets: np.ndarray, values: np.ndarray, value_type: pa.DataType, null: np.ndarray | None = None
) -> pa.ListArray:
    """A list<value_type> array of flat values cut at offsets (int32, one more than rows);
    rows where `null` is True are null."""
    mask = None if null is None or not null.any() else pa.array(null, pa.bool_())
    return pa.ListArray.from_arrays(
        pa.array(np.asarray(offsets, np.int32)),
        pa.array(np.asarray(values, _NUMPY[value_type]), value_type),
        type=pa.list_(value_type),
        mask=mask,
    )


def _view(array: pa.Array, dtype: type) -> np.ndarray:
    """A zero-copy NumPy view of a primitive array (Array.to_numpy would import pandas,
    about 45 MiB, on first use)."""
    data = array.buffers()[1]
    if data is None:
        return np.zeros(0, dtype)
    return np.frombuffer(data, dtype=dtype, count=array.offset + len(array))[array.offset :]
