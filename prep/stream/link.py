"""What a stream's producer thread and its consumer share (:class:`Link`): the queue of
finished batches (:class:`Item`), the slots that bound it and the stop event; and the
consumer's torch settings, which the producer takes on (:class:`TorchState`)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .stats import BatchFigures

__all__ = ["END", "ERROR", "POLL", "RESULT", "Item", "Link", "TorchState"]

#: seconds between the waiting side's looks at the stop event (and at the producer)
POLL = 0.1

RESULT, ERROR, END = "result", "error", "end"


class Item(NamedTuple):
    """What the producer hands the consumer: a batch's result, an error or the end; a
    result's figures (None: not measured), and the source's state as the producer
    pulled its batch (None: a source without ``state_dict``)."""

    kind: str
    value: Any
    figures: BatchFigures | None = None
    source: Any = None


@dataclass(frozen=True)
class TorchState:
    """The consumer's thread-local torch settings that change what ``call`` makes: grad
    and inference mode, and the current CUDA device and stream (DDP's
    ``torch.cuda.set_device(rank)`` must hold for ``device="cuda"``, and a result
    copied on another stream than the consumer's could be read before it lands)."""

    grad: bool
    inference: bool
    cuda_stream: Any  # torch.cuda.Stream, or None when CUDA is not initialized

    @classmethod
    def here(cls) -> TorchState:
        stream = torch.cuda.current_stream() if torch.cuda.is_initialized() else None
        return cls(torch.is_grad_enabled(), torch.is_inference_mode_enabled(), stream)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """These settings in the calling thread (the producer's, for its whole life)."""
        if self.cuda_stream is not None:
            torch.cuda.set_device(self.cuda_stream.device)
            torch.cuda.set_stream(self.cuda_stream)
        # inference_mode(False) would turn grad mode on: enter it only when it is on
        with torch.inference_mode() if self.inference else contextlib.nullcontext():
            torch.set_grad_enabled(self.grad)
            yield


class Link:
    """What the producer and the consumer share: the results queue, the slots that bound
    it and the stop event. Never the Stream itself, whose life decides when to stop."""

    def __init__(self, prefetch: int) -> None:
        self.results: queue.Queue[Item] = queue.Queue(maxsize=prefetch)
        self.slots = threading.Semaphore(prefetch)
        self.stop = threading.Event()

    def reserve(self) -> bool:
        """Wait for a slot for one more batch; False once the consumer has stopped."""
        while not self.stop.is_set():
            if self.slots.acquire(timeout=POLL):
                return not self.stop.is_set()
        return False

    def put(self, item: Item) -> bool:
        """Hand ``item`` to the consumer; False (it is dropped) once it has stopped."""
        while not self.stop.is_set():
            try:
                self.results.put(item, timeout=POLL)
                return True
            except queue.Full:  # cannot happen (an item per slot), but never block for good
                continue
        return False

    def take(self, producer: threading.Thread) -> Item:
        """The next item, waiting for it in short steps (Ctrl-C gets through at once)."""
        while True:
            try:
                item = self.results.get(timeout=POLL)
            except queue.Empty:
                if not producer.is_alive() and self.results.empty():
                    raise RuntimeError(
                        f"the {producer.name} thread ended without a result or an error"
                    ) from None
                continue
            self.slots.release()
            return item

    def drain(self) -> None:
        """Drop the results nobody will take, so their memory goes now."""
        while True:
            try:
                self.results.get_nowait()
            except queue.Empty:
                return
