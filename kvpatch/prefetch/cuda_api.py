"""The CUDA operations :class:`~kvpatch.prefetch.controller.PrefetchController` needs
(streams, events, the device's range table, a device guard), over ``torch.cuda``: the one
place the controller touches torch, so that tests can hand it a CPU stand-in."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import UsageError


class TorchCudaAPI:
    """The stream/event/table operations the controller needs, over ``torch.cuda``."""

    def normalize(self, device: Any) -> str:
        """``'cuda:N'`` for ``device`` (``'cuda'``, ``'cuda:N'``, an index N or a ``torch.device``);
        UsageError for anything else, a device that is not CUDA, or no such CUDA GPU."""
        import torch

        if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
            device = f"cuda:{device}"  # torch takes an index as the accelerator's, and fails without one
        try:
            if isinstance(device, bool) or not isinstance(device, (str, torch.device)):
                raise TypeError
            d = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise UsageError(f"PrefetchController: device must be 'cuda', 'cuda:N', an index or a torch.device, "
                             f"not {device!r}") from None  # fmt: skip
        if d.type != "cuda":
            raise UsageError(f"PrefetchController needs a CUDA device, not {d}")
        if not torch.cuda.is_available():
            raise UsageError(f"PrefetchController: no CUDA GPU visible to torch {torch.__version__} (pass enabled=False "
                             "to run without the prefetch)")  # fmt: skip
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise UsageError(f"PrefetchController: no CUDA GPU {d}: torch sees {torch.cuda.device_count()}")
        return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"

    def capability(self, device: str) -> tuple[int, int]:
        import torch

        return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]

    def new_stream(self, device: str, priority: int) -> Any:
        import torch

        return torch.cuda.Stream(device=device, priority=priority)

    def new_event(self) -> Any:
        import torch

        return torch.cuda.Event()

    def current_stream(self, device: str) -> Any:
        import torch

        return torch.cuda.current_stream(device)

    def handle(self, stream: Any) -> int:
        """The ``cudaStream_t`` to pass to the C launcher."""
        return int(stream.cuda_stream)

    def make_table(self, ranges: Sequence[tuple[int, int]], device: str) -> Any:
        from .ranges import range_table

        return range_table(ranges, device)

    def device_guard(self, device: str) -> Any:
        import torch

        return torch.cuda.device(device)
