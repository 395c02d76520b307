"""What goes in: a batch split into rows, each of which calls the row function.

:class:`TensorRows` holds a batch's columns (a Tensor, a tuple or a dict of
Tensors) and calls the row function on row ``i`` of each; :class:`SampleRows`
holds a list of samples. Both can take a slice (``take``: copies, ``head``:
views), call a batched function on all their rows at once, and travel to worker
processes cheaply: tensor columns by shared memory, samples as raw tensor bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import io
import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..errors import ConfigError
from .policy import ResultCheck
from .seeding import Seeding

# ---------------------------------------------------------------- inputs


class Rows(ABC):
    """Rows of a batch; ``call(fn, i)`` runs the row function on row ``i``."""

    #: whether a batched function can take all the rows in one call (tensor columns)
    batched: ClassVar[bool] = False
    offset: int  # the batch index of this object's first row
    seeds: Seeding | None  # under seed=: what each row draws from, seeded for it

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def call(self, fn: Callable[..., Any], i: int) -> Any: ...

    @abstractmethod
    def arguments(self) -> tuple[int, tuple[str, ...]]:
        """How the row function is called on a row: how many positional arguments, and
        the names of the keyword ones."""

    def checking(self, check: ResultCheck | None) -> Rows:
        """These rows, each row's result checked by ``check`` as it returns (a bad
        result then raises inside the row's call, where its row is known)."""
        return dataclasses.replace(self, check=check)  # type: ignore[type-var]

    def seeding(self, seeds: Seeding | None) -> Rows:
        """These rows, each row's draws seeded by ``seeds`` (``seed=``)."""
        return dataclasses.replace(self, seeds=seeds)  # type: ignore[type-var]

    def seeded_run(self) -> contextlib.AbstractContextManager[None]:
        """Around a run of rows in one thread: under ``seed=``, the global generators
        the rows seed are put back afterwards (:meth:`Seeding.run`)."""
        return self.seeds.run() if self.seeds is not None else contextlib.nullcontext()

    def call_batched(self, fn: Callable[..., Any]) -> Any:
        """``fn`` on every row at once (the columns themselves), where :attr:`batched`."""
        raise TypeError(f"{type(self).__name__} has no batched form: a list of samples")

    @property
    def nbytes(self) -> int:
        """Bytes of the batch's tensors (0 where not known without walking the rows)."""
        return 0

    @property
    def device(self) -> torch.device:
        """Where the batch lives (CPU for a list of samples)."""
        return torch.device("cpu")

    def head(self, stop: int) -> Rows:
        """The first ``stop`` rows, sharing this batch's memory."""
        return self.window(self.offset, self.offset + stop)

    @abstractmethod
    def window(self, start: int, stop: int) -> Rows:
        """Rows ``start:stop`` (batch indices), sharing this batch's memory."""

    @abstractmethod
    def take(self, start: int, stop: int) -> Rows:
        """Rows ``start:stop`` as copies that own their memory (cheap to pickle; a row
        function that changes its input in place changes the copy only)."""

    @abstractmethod
    def layout(self) -> Any:
        """What, besides the number of rows, makes batches alike for auto: its cached
        choice for one holds for the others."""


#: rows whose views are made together, on first use
VIEWS = 64


@dataclass(frozen=True)
class TensorRows(Rows):
    """Rows of one tensor, a tuple of tensors, or a dict of tensors (``names``)."""

    columns: tuple[Tensor, ...]
    names: tuple[str, ...] | None = None
    offset: int = 0  # the batch index of this object's first row
    check: ResultCheck | None = None  # under on_error='fill'/'skip': a bad result fails its row
    seeds: Seeding | None = None  # under seed=: what each row draws from, seeded for it
    batched: ClassVar[bool] = True

    def __len__(self) -> int:
        return self.columns[0].shape[0]

    def call(self, fn: Callable[..., Any], i: int) -> Any:
        j = i - self.offset
        views = self._views.get(j // VIEWS) or self._unbind(j // VIEWS)
        row = [v[j % VIEWS] for v in views]
        if self.seeds is None:
            result = fn(**dict(zip(self.names, row))) if self.names is not None else fn(*row)
        elif self.names is not None:
            result = fn(**dict(zip(self.names, row)), **self.seeds.row(i))
        else:
            result = fn(*row, **self.seeds.row(i))
        if self.check is not None:
            self.check(result)
        return result

    def arguments(self) -> tuple[int, tuple[str, ...]]:
        return (0, self.names) if self.names is not None else (len(self.columns), ())

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
        return (TensorRows, (self.columns, self.names, self.offset, self.check, self.seeds))

    def call_batched(self, fn: Callable[..., Any]) -> Any:
        if self.names is not None:
            return fn(**dict(zip(self.names, self.columns)))
        return fn(*self.columns)

    def window(self, start: int, stop: int) -> TensorRows:
        a, b = start - self.offset, stop - self.offset
        columns = tuple(c[a:b] for c in self.columns)
        return TensorRows(columns, self.names, start, self.check, self.seeds)

    def replace(self, columns: Sequence[Tensor]) -> TensorRows:
        return TensorRows(tuple(columns), self.names, 0, self.check, self.seeds)

    def take(self, start: int, stop: int) -> TensorRows:
        """Rows ``start:stop`` as tensors that own their memory (cheap to pickle)."""
        columns = tuple(c[start:stop].clone() for c in self.columns)
        return TensorRows(columns, self.names, start, self.check, self.seeds)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns)

    def layout(self) -> Any:
        shapes = tuple((tuple(c.shape[1:]), str(c.dtype), str(c.device)) for c in self.columns)
        return (self.names, shapes)

    @property
    def device(self) -> torch.device:
        """The first column's device that is not the CPU, if any (else the CPU)."""
        return next(
            (c.device for c in self.columns if c.device.type != "cpu"), self.columns[0].device
        )


@dataclass(frozen=True)
class SampleRows(Rows):
    """Rows that are arbitrary Python objects (``fn(sample)``), for collate functions."""

    samples: Sequence[Any]
    offset: int = 0
    check: ResultCheck | None = None  # under on_error='fill'/'skip': a bad result fails its row
    seeds: Seeding | None = None  # under seed=: what each row draws from, seeded for it

    def __len__(self) -> int:
        return len(self.samples)

    def call(self, fn: Callable[..., Any], i: int) -> Any:
        if self.seeds is not None:
            result = fn(self.samples[i - self.offset], **self.seeds.row(i))
        else:
            result = fn(self.samples[i - self.offset])
        if self.check is not None:
            self.check(result)
        return result

    def arguments(self) -> tuple[int, tuple[str, ...]]:
        return (1, ())

    def layout(self) -> Any:
        return ("samples", type(self.samples[0]).__qualname__ if self.samples else None)

    def window(self, start: int, stop: int) -> SampleRows:
        window = self.samples[start - self.offset : stop - self.offset]
        return SampleRows(window, start, self.check, self.seeds)

    def take(self, start: int, stop: int) -> SampleRows:
        return SampleRows(self.samples[start:stop], start, self.check, self.seeds)

    def __reduce__(self) -> tuple[Any, ...]:
        # samples cross to workers as bytes from a pickler that copies each tensor's
        # data raw: torch's own pickling costs about 0.2 ms a tensor (and its
        # multiprocessing pickler a shared-memory segment each), 10x more for small ones
        buffer = io.BytesIO()
        _RawTensorPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(list(self.samples))
        return (_load_samples, (buffer.getvalue(), self.offset, self.check, self.seeds))


class _RawTensorPickler(pickle.Pickler):
    """Pickles every tensor :func:`raw_tensor` can as its raw bytes."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Tensor and (reduced := raw_tensor(obj)) is not None:
            return reduced
        return NotImplemented


def raw_tensor(t: Tensor) -> tuple[Any, ...] | None:
    """The pickle reduction of a plain CPU tensor as its raw bytes: only its own
    elements, not the storage a view may share with a whole data set, and detached
    (workers get data, never autograd history; torch refuses to pickle a non-leaf
    tensor at all). None for another device, layout or a quantized tensor."""
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
        return None
    if t.requires_grad or t.is_conj() or t.is_neg() or not t.is_contiguous():
        t = t.detach().resolve_conj().resolve_neg().contiguous()
    return _raw, (ctypes.string_at(t.data_ptr(), t.nbytes), t.dtype, tuple(t.shape))


def _raw(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    """A tensor of its own, its bytes copied in (not a view of the pickle's buffer: it
    may become the caller's result as it is)."""
    t = torch.empty(shape, dtype=dtype)
    if data:
        ctypes.memmove(t.data_ptr(), data, len(data))
    return t


def _load_samples(
    blob: bytes, offset: int, check: ResultCheck | None = None, seeds: Seeding | None = None
) -> SampleRows:
    return SampleRows(pickle.loads(blob), offset, check, seeds)


def rows_of(batch: Any) -> TensorRows:
    """Split a Tensor, a tuple/list of Tensors or a dict of Tensors into rows.

    A column that requires grad is taken detached: rows are data for preprocessing,
    and the workers of every executor get the same plain tensors serial computes on.
    """
    names: tuple[str, ...] | None = None
    if isinstance(batch, Tensor):
        cols: tuple[Any, ...] = (batch,)
    elif isinstance(batch, Mapping):
        names, cols = tuple(batch), tuple(batch.values())
    elif isinstance(batch, (tuple, list)):
        cols = tuple(batch)
    elif callable(batch):
        raise TypeError(
            f"batch is a function ({getattr(batch, '__qualname__', type(batch).__name__)}), "
            f"not tensors: the arguments look swapped; call map_rows(fn, batch), the row "
            f"function first"
        )
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
        check_not_meta(col, f"batch column {key!r}")
    sizes = {c.shape[0] for c in cols}
    if len(sizes) > 1:
        listed = ", ".join(f"{k}: {c.shape[0]}" for k, c in zip(names or range(len(cols)), cols))
        raise ValueError(
            f"batch columns have different numbers of rows ({listed}); "
            f"every column needs the same size along dim 0"
        )
    return TensorRows(tuple(c.detach() if c.requires_grad else c for c in cols), names)


def samples_of(samples: Any) -> SampleRows:
    """``map_samples``' samples as rows: any iterable of samples (a list, a dataset slice,
    a generator, a tensor's rows), checked before the first row runs."""
    if callable(samples) and not isinstance(samples, (Tensor, Sequence)):
        raise TypeError(
            f"samples is a function ({getattr(samples, '__qualname__', type(samples).__name__)}),"
            f" not samples: the arguments look swapped; call map_samples(fn, samples), the "
            f"row function first"
        )
    if isinstance(samples, Tensor) and samples.dim() == 0:
        raise TypeError(
            f"samples is a 0-d tensor ({samples.item()!r}), one value with no rows; pass a "
            f"list of samples, or a tensor whose rows are the samples"
        )
    try:
        listed = list(samples)
    except TypeError:
        raise TypeError(
            f"samples={samples!r:.60} is not a sequence of samples but one "
            f"{type(samples).__name__}; pass a list (or any iterable) with one entry per "
            f"sample, e.g. map_samples(fn, [s0, s1, s2])"
        ) from None
    # the first sample stands for all (a data set lives on one device): walking every
    # sample would cost about a microsecond each, on every call
    for t in _top_tensors(listed[0]) if listed else ():
        check_not_meta(t, "sample 0")
    return SampleRows(listed)


def _top_tensors(sample: Any) -> list[Tensor]:
    """The tensors a sample is, or holds at its top level (a tuple or dict of them)."""
    if isinstance(sample, Tensor):
        return [sample]
    values = sample.values() if isinstance(sample, Mapping) else sample
    if isinstance(sample, (Mapping, tuple, list)):
        return [v for v in values if isinstance(v, Tensor)]
    return []


def check_not_meta(t: Tensor, what: str) -> None:
    """A ConfigError for a tensor on the meta device: it has a shape but no data."""
    if t.device.type == "meta":
        raise ConfigError(
            f"{what} is on the meta device (shape {tuple(t.shape)}, {t.dtype}): it has no "
            f"data, so no row function can read it; make it on a real device (e.g. "
            f"torch.zeros(..., device='cpu')) or materialize it with .to_empty(device='cpu')"
        )
