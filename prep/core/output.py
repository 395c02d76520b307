"""What comes out: one output allocated once, each row's result written into it.

A row's result is flattened into *leaves* (tensors) by :func:`flatten`, and each
leaf of row ``i`` is copied into ``buffer[i]`` of an :class:`Output` allocated
once, from the first row's result or from ``out=``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, StackError

Result = Tensor | tuple[Tensor, ...] | dict[str, Tensor]
CPU = torch.device("cpu")


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

    def where(self, k: int) -> str:
        """`` (result 'key')`` for leaf ``k`` of a tuple or dict result."""
        if self.kind == "tensor":
            return ""
        names: tuple[object, ...] = self.keys or tuple(range(self.n))
        return f" (result {names[k]!r})"


#: the structure of every single-tensor result (one object: compared by identity first)
TENSOR = Spec("tensor")


def flatten(
    result: Any, what: str = "the row function", row: int | None = None
) -> tuple[Spec, list[Tensor]]:
    """Leaves of a Tensor, tuple of Tensors or dict of Tensors, with their structure;
    an error names ``what`` returned it (the row function on ``row``, if given)."""
    if isinstance(result, Tensor):
        return TENSOR, [result]
    # an empty tuple or dict holds no tensor: an output of no buffers has no rows
    if isinstance(result, (tuple, list)) and result and all(isinstance(r, Tensor) for r in result):
        return Spec("tuple", n=len(result)), list(result)
    if (
        isinstance(result, Mapping)
        and result
        and all(isinstance(r, Tensor) for r in result.values())
    ):
        return Spec("dict", tuple(result), len(result)), list(result.values())
    if row is not None:
        what = f"{what}, on row {row},"
    raise TypeError(
        f"{what} returned {_describe(result)}; it must return a Tensor, a tuple of Tensors "
        f"or a dict of Tensors (wrap numbers with torch.tensor(...))"
    )


def detached(result: Any) -> Any:
    """``result`` with every tensor detached: what may cross to another process (torch
    refuses to pickle a non-leaf tensor that requires grad), and all a preprocessing
    output keeps anyway."""
    spec, leaves = flatten(result)
    return spec.unflatten([t.detach() if t.requires_grad else t for t in leaves])


def fits(value: bool | int | float, dtype: torch.dtype) -> bool:
    """Whether ``value`` can be stored in ``dtype`` as given: nan in an int, 300 in
    uint8, -1 in uint8, 1.5 in int64 or 1e40 in float32 cannot (torch would refuse some
    and wrap or round others, depending on the op)."""
    if dtype == torch.bool or dtype.is_complex:
        return True  # a bool output holds truth (fill=-1 on a mask is True, as torch says)
    if dtype.is_floating_point:
        if isinstance(value, float) and not math.isfinite(value):
            return True  # nan and inf exist in every float dtype
        return abs(value) <= torch.finfo(dtype).max
    try:
        info = torch.iinfo(dtype)
    except TypeError:  # a quantized or other exotic dtype: left to torch
        return True
    whole = not isinstance(value, float) or value.is_integer()
    return whole and info.min <= value <= info.max


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list, Mapping)) and not value:
        return f"an empty {type(value).__name__} ({value!r}), which holds no tensor"
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
        spec, leaves = flatten(result, row=row)
        buffers = []
        for leaf in leaves:
            if leaf.device.type == "meta":
                raise ConfigError(
                    f"the row function returned a tensor on the meta device on row {row} (it "
                    f"has a shape but no data, so there is nothing to store); return tensors "
                    f"on a real device"
                )
            here = shared and leaf.device.type == "cpu"  # a CUDA leaf's buffer stays on it
            buffers.append(empty((rows, *leaf.shape), leaf.dtype, leaf.device, pin, here))
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

    def __len__(self) -> int:
        return len(self.buffers[0]) if self.buffers else 0

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def like(self, rows: int | None = None, *, pin: bool = False, shared: bool = False,
             device: torch.device | str | None = None) -> Output:  # fmt: skip
        """Empty buffers shaped like these, with ``rows`` rows (default: as many), on each
        buffer's own device (``device``: on that one; ``shared``: in CPU shared
        memory): the batch's output made from a worker's chunk, or a staging area."""
        n = len(self) if rows is None else rows
        on = [b.device if device is None else torch.device(device) for b in self.buffers]
        made = [empty((n, *b.shape[1:]), b.dtype, d, pin, shared) for b, d in zip(self.buffers, on)]
        return Output(self.spec, made, self.first_row)

    @functools.cached_property
    def _layout(self) -> list[tuple[torch.Size, torch.dtype]]:
        return [(b.shape[1:], b.dtype) for b in self.buffers]

    def __getstate__(self) -> dict[str, Any]:  # never pickle the cached layout
        return {k: v for k, v in self.__dict__.items() if k != "_layout"}

    @torch.no_grad()  # preprocessing: outputs carry no autograd history
    def write(self, i: int, result: Any) -> None:
        if (
            isinstance(result, Tensor)
            and self.spec.kind == "tensor"
            and (result.shape, result.dtype) == self._layout[0]
        ):
            # the common case, kept short (a view per row: unbinding all rows up front
            # costs a microsecond a row of the whole batch, before the first write)
            self.buffers[0][i - self.offset].copy_(result)
            return
        spec, leaves = flatten(result, row=i)
        self.check_spec(i, spec)
        for k, (buf, leaf) in enumerate(zip(self.buffers, leaves)):
            if leaf.shape != buf.shape[1:] or leaf.dtype != buf.dtype:
                raise self.mismatch(
                    i, k, leaf, "equal shapes and dtypes to be stacked (pass pad= to pad them)"
                )
            buf[i - self.offset].copy_(leaf)

    def check_spec(self, i: int, spec: Spec) -> None:
        if spec is not self.spec and spec != self.spec:
            raise StackError(
                f"row {i} returned {_spec_text(spec)} but {self._origin()} "
                f"{_spec_text(self.spec)}; every row must return the same structure",
                row=i,
            )

    def mismatch(self, i: int, k: int, leaf: Tensor, need: str) -> StackError:
        buf = self.buffers[k]
        return StackError(
            f"row {i} returned shape {tuple(leaf.shape)} {leaf.dtype}{self.spec.where(k)} but "
            f"{self._origin()} shape {tuple(buf.shape[1:])} {buf.dtype}; rows must "
            f"return {need}",
            row=i,
        )

    @torch.no_grad()
    def fail(self, i: int, value: bool | int | float | None) -> None:
        """Row ``i`` failed (``on_error='fill'``): every leaf filled with ``value`` (0 if
        None)."""
        for k, buf in enumerate(self.buffers):
            if value is not None:
                check_fits(value, buf.dtype, "fill", self.spec.where(k))
            buf[i - self.offset].fill_(0 if value is None else value)

    def unfail(self, i: int) -> None:
        """Row ``i`` is written after all (a failure the batch took back): nothing to
        undo here, its write replaces the fill."""

    def finish(self) -> None:
        """Called once every row is written (a padded output trims itself here)."""

    @torch.no_grad()
    def merge(self, chunk: Output) -> None:
        """The rows of a worker's ``chunk`` into rows ``chunk.offset:`` here."""
        start = chunk.offset
        self.check_spec(start, chunk.spec)
        for k, (buf, part) in enumerate(zip(self.buffers, chunk.buffers)):
            if part.shape[1:] != buf.shape[1:] or part.dtype != buf.dtype:
                raise self.mismatch(start, k, part[0], "equal shapes and dtypes (pass pad=)")
            lo = start - self.offset
            buf[lo : lo + len(part)].copy_(part)

    def lengths(self) -> Result:
        """Each row's size per leaf (all alike here): int64 ``[rows]`` for 1-D rows,
        ``[rows, dims]`` else."""
        sizes = [
            torch.tensor(b.shape[1:], dtype=torch.int64).expand(len(b), b.dim() - 1).clone()
            for b in self.buffers
        ]
        return self.spec.unflatten([s[:, 0] if s.shape[1] == 1 else s for s in sizes])

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


def check_fits(value: bool | int | float, dtype: torch.dtype, name: str, where: str) -> None:
    """A ValueError naming ``name=`` (``pad`` or ``fill``) if ``value`` cannot be stored in
    an output of ``dtype``."""
    if not fits(value, dtype):
        short = str(dtype).removeprefix("torch.")
        # examples the dtype does hold (uint8 and bool hold no -1)
        examples = " or ".join(f"{name}={v!r}" for v in (0, -1, 255) if fits(v, dtype))
        raise ValueError(
            f"{name}={value!r} does not fit the output's dtype {short}{where}: {short} cannot "
            f"hold it; pass a {name}= that it can (e.g. {examples}), or have the row "
            f"function return a dtype that holds {value!r}"
        )


def _spec_text(spec: Spec) -> str:
    if spec.kind == "tensor":
        return "a Tensor"
    if spec.kind == "tuple":
        return f"a tuple of {spec.n} Tensors"
    return f"a dict with keys {list(spec.keys)}"


def shared_empty(shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """An uninitialized CPU tensor in shared memory, made there: ``share_memory_()`` on a
    new tensor would copy it, on all of torch's intra-op threads, which then spin
    on cores that the workers it is shared with need."""
    nbytes = math.prod(shape) * dtype.itemsize
    storage: torch.UntypedStorage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage).view(dtype).view(tuple(shape))


def in_shm(t: Tensor) -> bool:
    """Whether ``t`` lives in CPU shared memory (``is_shared()`` alone is always True
    for a CUDA tensor, whose memory may be shared between processes another way)."""
    return t.device.type == "cpu" and t.is_shared()


def empty(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device = CPU,
    pin: bool = False,
    shared: bool = False,
) -> Tensor:
    """An uninitialized tensor: in CPU shared memory where ``shared`` (whatever
    ``device``), else on ``device``, pinned where ``pin`` and that is the CPU."""
    if shared:
        return shared_empty(shape, dtype)
    pinned = pin and device.type == "cpu"  # a CUDA thread's chunk is not pinned: it is there
    return torch.empty(shape, dtype=dtype, device=device, pin_memory=pinned)
