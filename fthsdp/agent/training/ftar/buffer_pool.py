"""Host buffers of the overlapped all-reduce, reused from step to step.

A step's flat buffer (fthsdp/agent/training/ftar/overlap.py) holds every gradient
of the replica: 100 MB and more. A fresh one per step costs more than its
size suggests on the host: an allocation that large is mapped anew by the C
allocator each time and every page is faulted in and zeroed on first write
(measured here: 120 ms per 100 MB step against 34 ms for the copy alone into
a reused buffer). Torch DDP keeps its buckets for the same reason.

Who may still read or write a step's buffer decides when it can be reused,
so ownership is explicit:

* the pool lends a buffer for one step (``take``);
* a committed step's sum goes to the gradient log
  (fthsdp/agent/training/catchup/grad_log.py), which owns it from then on and hands it
  back when it lets the entry go and no joiner is still reading it
  (``give_back``);
* a buffer whose step did not end in it (its collectives were abandoned for
  a newer quorum and may still write it, or the step was summed again
  elsewhere) is never reused (``forget``).

GPU buffers are not pooled: torch's caching allocator already reuses device
memory, with the stream ordering this pool would have to redo.
"""

from __future__ import annotations

import threading

import torch


class BufferPool:
    def __init__(self, size: int) -> None:
        """``size``: the most buffers held, lent and free together (the log's
        steps and a few more); beyond it a step gets a buffer of its own."""
        self._size = size
        self._free: list[torch.Tensor] = []
        self._lent: dict[int, torch.Tensor] = {}
        """Lent buffers by address: what the log hands back starts at one of them."""
        self._lock = threading.Lock()
        """``take`` runs on the training thread; ``give_back`` may run on a catch-up server's."""

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        with self._lock:
            for i, free in enumerate(self._free):
                if free.numel() == numel and free.dtype == dtype:
                    buffer = self._free.pop(i)
                    break
            else:
                if self._free:
                    self._free.pop(0)  # of another size or dtype: let it go
                if len(self._free) + len(self._lent) >= self._size:
                    return torch.empty(numel, dtype=dtype)  # not pooled
                buffer = torch.empty(numel, dtype=dtype)
            self._lent[buffer.data_ptr()] = buffer
            return buffer

    def give_back(self, data: torch.Tensor) -> None:
        """The log let go of ``data``: if it is (the start of) a lent buffer,
        that buffer is free again. Anything else is ignored."""
        with self._lock:
            buffer = self._lent.pop(data.data_ptr(), None)
            if buffer is not None:
                self._free.append(buffer)

    def forget(self, buffer: torch.Tensor) -> None:
        """Never reuse ``buffer``: a collective of an abandoned group may still write it."""
        with self._lock:
            self._lent.pop(buffer.data_ptr(), None)

    @property
    def held(self) -> tuple[int, int]:
        """(lent, free) buffers, for tests."""
        with self._lock:
            return len(self._lent), len(self._free)


__all__ = ["BufferPool"]
