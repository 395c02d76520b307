"""What goes in (rows of a batch) and what comes out (one preallocated output).

A batch is split into *rows* by a :class:`Rows` object, which knows how to call
the row function on row ``i``. Results are flattened into *leaves* (tensors) by
:func:`flatten`, and each leaf of row ``i`` is copied into ``buffer[i]`` of an
:class:`Output` allocated once, from the first row's result or from ``out=``.
"""

from __future__ import annotations

import ctypes
import functools
import io
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from .errors import StackError

Result = Tensor | tuple[Tensor, ...] | dict[str, Tensor]


# ---------------------------------------------------------------- inputs


class Rows:
    """Rows of a batch; ``call(fn, i)`` runs the row function on row ``i``."""

    def __len__(self) -> int:
        raise NotImplementedError

    def call(self, fn: Callable[..., Any], i: int) -> Any:
        raise NotImplementedError

    def chunk(self, start: int, stop: int) -> Any:
        """What a worker process needs, beyond :meth:`shell`, to run rows ``start:stop``."""
        raise NotImplementedError

    def shell(self) -> Rows:
        """The part sent to a worker once per batch; ``with_chunk`` completes it."""
        raise NotImplementedError

    def with_chunk(self, payload: Any) -> Rows:
        raise NotImplementedError

    def head(self, stop: int) -> Rows:
        raise NotImplementedError


#: rows whose views are made together, on first use
VIEWS = 64


@dataclass(frozen=True)
class TensorRows(Rows):
    """Rows of one tensor, a tuple of tensors, or a dict of tensors (``names``)."""

    columns: tuple[Tensor, ...]
    names: tuple[str, ...] | None = None
    offset: int = 0  # the batch index of this object's first row

    def __len__(self) -> int:
        return self.columns[0].shape[0]

    def call(self, fn: Callable[..., Any], i: int) -> Any:
        j = i - self.offset
        views = self._views.get(j // VIEWS) or self._unbind(j // VIEWS)
        row = [v[j % VIEWS] for v in views]
        if self.names is not None:
            return fn(**dict(zip(self.names, row)))
        return fn(*row)

    @functools.cached_property
    def _views(self) -> dict[int, list[tuple[Tensor, ...]]]:
        return {}

    def _unbind(self, block: int) -> list[tuple[Tensor, ...]]:
        # one C++ call makes a block's row views (indexing a tensor per row costs 3x
        # more); a block at a time, so rows that never run (auto hands them to a
        # batched call) cost nothing. Threads may race to fill a block: the same views
        views = [c[block * VIEWS : (block + 1) * VIEWS].unbind(0) for c in self.columns]
        self._views[block] = views
        return views

    def __reduce__(self) -> tuple[Any, ...]:  # never pickle the cached row views
        return (TensorRows, (self.columns, self.names, self.offset))

    def call_batched(self, fn: Callable[..., Any]) -> Any:
        if self.names is not None:
            return fn(**dict(zip(self.names, self.columns)))
        return fn(*self.columns)

    def head(self, stop: int) -> TensorRows:
        """The first ``stop`` rows."""
        return TensorRows(tuple(c[:stop] for c in self.columns), self.names, self.offset)

    def replace(self, columns: Sequence[Tensor]) -> TensorRows:
        return TensorRows(tuple(columns), self.names)

    def chunk(self, start: int, stop: int) -> None:
        return None  # the columns already live in shared memory

    def shell(self) -> TensorRows:
        return TensorRows((), self.names)  # the worker puts its shared columns back in

    def with_chunk(self, payload: Any) -> TensorRows:
        return self

    def take(self, start: int, stop: int) -> TensorRows:
        """Rows ``start:stop`` as tensors that own their memory (cheap to pickle)."""
        return TensorRows(tuple(c[start:stop].clone() for c in self.columns), self.names, start)

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.columns)


@dataclass(frozen=True)
class SampleRows(Rows):
    """Rows that are arbitrary Python objects (``fn(sample)``), for collate functions."""

    samples: Sequence[Any]
    offset: int = 0
    nbytes: ClassVar[int] = 0  # not known without walking the samples

    def __len__(self) -> int:
        return len(self.samples)

    def call(self, fn: Callable[..., Any], i: int) -> Any:
        return fn(self.samples[i - self.offset])

    def chunk(self, start: int, stop: int) -> SampleRows:
        return self.take(start, stop)

    def shell(self) -> SampleRows:
        return SampleRows(())

    def with_chunk(self, payload: Any) -> SampleRows:
        return payload  # type: ignore[no-any-return]

    def head(self, stop: int) -> SampleRows:
        """The first ``stop`` rows."""
        return SampleRows(self.samples[:stop], self.offset)

    def take(self, start: int, stop: int) -> SampleRows:
        return SampleRows(self.samples[start:stop], start)

    def __reduce__(self) -> tuple[Any, ...]:
        # samples cross to workers as bytes from a pickler that copies each tensor's
        # data raw: torch's own pickling costs about 0.2 ms a tensor (and its
        # multiprocessing pickler a shared-memory segment each), 10x more for small ones
        buffer = io.BytesIO()
        _RawTensorPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(list(self.samples))
        return (_load_samples, (buffer.getvalue(), self.offset))


class _RawTensorPickler(pickle.Pickler):
    """Pickles plain CPU tensors as their raw bytes (only their own elements, not the
    storage a view may share with a whole data set)."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is Tensor
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not obj.requires_grad
            and not obj.is_quantized
        ):
            t = obj.resolve_conj().resolve_neg().contiguous()
            data = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
            return (_raw_tensor, (data, t.dtype, tuple(t.shape)))
        return NotImplemented


def _raw_tensor(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _load_samples(blob: bytes, offset: int) -> SampleRows:
    return SampleRows(pickle.loads(blob), offset)


def rows_of(batch: Any) -> TensorRows:
    """Split a Tensor, a tuple/list of Tensors or a dict of Tensors into rows."""
    if isinstance(batch, Tensor):
        cols: tuple[Any, ...] = (batch,)
        names = None
    elif isinstance(batch, Mapping):
        names = tuple(batch)
        cols = tuple(batch.values())
    elif isinstance(batch, (tuple, list)):
        names = None
        cols = tuple(batch)
    else:
        raise TypeError(
            f"batch must be a Tensor, a tuple/list of Tensors or a dict of Tensors, "
            f"got {type(batch).__name__}; for a list of arbitrary samples use prep.map_samples"
        )
    if not cols:
        raise ValueError("batch has no tensors; pass at least one column")
    for key, col in zip(names or range(len(cols)), cols):
        if not isinstance(col, Tensor):
            raise TypeError(
                f"batch column {key!r} is a {type(col).__name__}, expected a Tensor; "
                f"for a list of arbitrary samples use prep.map_samples"
            )
        if col.dim() == 0:
            raise ValueError(
                f"batch column {key!r} is a 0-d tensor; rows run along dim 0, "
                f"so every column needs at least one dimension"
            )
    sizes = {c.shape[0] for c in cols}
    if len(sizes) > 1:
        listed = ", ".join(f"{k}: {c.shape[0]}" for k, c in zip(names or range(len(cols)), cols))
        raise ValueError(
            f"batch columns have different numbers of rows ({listed}); "
            f"every column needs the same size along dim 0"
        )
    return TensorRows(cols, names)


# ---------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Spec:
    """The structure of a row's result: ``tensor``, ``tuple`` or ``dict`` of ``n`` leaves."""

    kind: str
    keys: tuple[str, ...] = ()
    n: int = 1

    def unflatten(self, leaves: Sequence[Tensor]) -> Result:
        if self.kind == "tensor":
            return leaves[0]
        if self.kind == "tuple":
            return tuple(leaves)
        return dict(zip(self.keys, leaves))


def flatten(result: Any, what: str = "the row function") -> tuple[Spec, list[Tensor]]:
    """Leaves of a Tensor, tuple of Tensors or dict of Tensors, with their structure."""
    if isinstance(result, Tensor):
        return Spec("tensor"), [result]
    if isinstance(result, (tuple, list)) and all(isinstance(r, Tensor) for r in result):
        return Spec("tuple", n=len(result)), list(result)
    if isinstance(result, Mapping) and all(isinstance(r, Tensor) for r in result.values()):
        return Spec("dict", tuple(result), len(result)), list(result.values())
    raise TypeError(
        f"{what} returned {_describe(result)}; it must return a Tensor, a tuple of Tensors "
        f"or a dict of Tensors (wrap numbers with torch.tensor(...))"
    )


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in value[:4])
        return f"a {type(value).__name__} of ({inner})"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(value.items())[:4])
        return f"a dict of {{{inner}}}"
    return f"a {type(value).__name__} ({value!r:.60})"


@dataclass
class Output:
    """One buffer per result leaf, ``[rows, *leaf.shape]``, written row by row."""

    spec: Spec
    buffers: list[Tensor]
    first_row: int = 0  # the row whose result fixed the shapes, for error messages
    offset: int = 0  # the batch index of buffer row 0 (a worker's chunk)

    @classmethod
    def allocate(
        cls,
        result: Any,
        rows: int,
        *,
        row: int = 0,
        pin: bool = False,
        shared: bool = False,
        offset: int = 0,
    ) -> Output:
        spec, leaves = flatten(result)
        buffers = []
        for leaf in leaves:
            on_cpu = leaf.device.type == "cpu"
            buf = torch.empty(
                (rows, *leaf.shape),
                dtype=leaf.dtype,
                device=leaf.device,
                pin_memory=pin and on_cpu and not shared,
            )
            if shared and on_cpu:
                buf.share_memory_()
            buffers.append(buf)
        return cls(spec, buffers, row, offset)

    @classmethod
    def given(cls, out: Any, rows: int) -> Output:
        spec, leaves = flatten(out, what="out=")
        for leaf in leaves:
            if leaf.dim() == 0 or leaf.shape[0] != rows:
                raise ValueError(
                    f"out= has a tensor of shape {tuple(leaf.shape)}, but the batch "
                    f"has {rows} rows; each output tensor needs {rows} along dim 0"
                )
        return cls(spec, leaves, -1)

    def like(self, *, pin: bool = False, shared: bool = False) -> Output:
        """Empty CPU buffers shaped like these (a staging area)."""
        bufs = []
        for b in self.buffers:
            buf = torch.empty(b.shape, dtype=b.dtype, pin_memory=pin)
            if shared:
                buf.share_memory_()
            bufs.append(buf)
        return Output(self.spec, bufs, self.first_row)

    @functools.cached_property
    def _layout(self) -> list[tuple[torch.Size, torch.dtype]]:
        return [(b.shape[1:], b.dtype) for b in self.buffers]

    def __getstate__(self) -> dict[str, Any]:  # never pickle the cached layout
        return {k: v for k, v in self.__dict__.items() if k != "_layout"}

    def write(self, i: int, result: Any) -> None:
        with torch.no_grad():  # preprocessing: outputs carry no autograd history
            self._write(i, result)

    def _write(self, i: int, result: Any) -> None:
        if (
            isinstance(result, Tensor)
            and self.spec.kind == "tensor"
            and (result.shape, result.dtype) == self._layout[0]
        ):
            # the common case, kept short (a view per row: unbinding all rows up front
            # costs a microsecond a row of the whole batch, before the first write)
            self.buffers[0][i - self.offset].copy_(result)
            return
        spec, leaves = flatten(result, what=f"the row function, on row {i},")
        if spec != self.spec:
            raise StackError(
                f"row {i} returned {_spec_text(spec)} but {self._origin()} "
                f"{_spec_text(self.spec)}; every row must return the same structure"
            )
        for key, buf, leaf in zip(spec.keys or range(spec.n), self.buffers, leaves):
            if leaf.shape != buf.shape[1:] or leaf.dtype != buf.dtype:
                where = "" if spec.kind == "tensor" else f" (result {key!r})"
                raise StackError(
                    f"row {i} returned shape {tuple(leaf.shape)} {leaf.dtype}{where} but "
                    f"{self._origin()} shape {tuple(buf.shape[1:])} {buf.dtype}; rows must "
                    f"return equal shapes and dtypes to be stacked (pad or crop them in the "
                    f"row function)"
                )
            buf[i - self.offset].copy_(leaf)

    def write_block(self, start: int, results: Sequence[Any]) -> None:
        """Rows ``start, start + 1, ...``: one ``torch.stack`` per leaf straight into the
        output instead of a ``copy_`` per row (each torch call costs microseconds, so this
        is what makes light rows cheap). On any mismatch it goes row by row, so that the
        error names the row."""
        try:
            columns = self._columns(results)
        except TypeError:  # a result that is not tensors: write() says which row
            columns = None
        if columns is None:
            for k, result in enumerate(results):
                self.write(start + k, result)
            return
        lo = start - self.offset
        with torch.no_grad():  # preprocessing: outputs carry no autograd history
            for buf, column in zip(self.buffers, columns):
                torch.stack(column, out=buf[lo : lo + len(results)])

    def _columns(self, results: Sequence[Any]) -> list[list[Tensor]] | None:
        """Each leaf's tensors across ``results``, or None if a row does not match."""
        if self.spec.kind == "tensor":
            shape, dtype = self._layout[0]
            ok = all(
                isinstance(r, Tensor) and r.shape == shape and r.dtype == dtype for r in results
            )
            return [list(results)] if ok else None
        columns: list[list[Tensor]] = [[] for _ in self.buffers]
        for result in results:
            spec, leaves = flatten(result)
            if spec != self.spec:
                return None
            for column, leaf, (shape, dtype) in zip(columns, leaves, self._layout):
                if leaf.shape != shape or leaf.dtype != dtype:
                    return None
                column.append(leaf)
        return columns

    def _origin(self) -> str:
        return "out= expects" if self.first_row < 0 else f"row {self.first_row} returned"

    def result(self) -> Result:
        return self.spec.unflatten(self.buffers)


def _spec_text(spec: Spec) -> str:
    if spec.kind == "tensor":
        return "a Tensor"
    if spec.kind == "tuple":
        return f"a tuple of {spec.n} Tensors"
    return f"a dict with keys {list(spec.keys)}"
