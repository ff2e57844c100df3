"""How much a computation normalises at once: the element count of every log-softmax and logsumexp it runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class SoftmaxWidths(TorchDispatchMode):
    """Records the element count of every log-softmax and logsumexp input while active."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's dispatch signature
        if func.overloadpacket in (torch.ops.aten._log_softmax, torch.ops.aten.logsumexp):
            self.sizes.append(int(args[0].numel()))
        return func(*args, **(kwargs or {}))


@contextmanager
def softmax_widths() -> Iterator[SoftmaxWidths]:
    with SoftmaxWidths() as mode:
        yield mode
