"""The messages of the parameter-server algorithms: one flat buffer each, one tag per kind.

A message is a header followed by a payload of model-sized numbers, all in one tensor, so each
exchange is one send and one receive however many layers the model has. Its kind travels as
the tag, never as a field, so a receiver only ever waits for the kind it expects and the server
can take updates from whichever worker sends first (receive from any source).
"""

from __future__ import annotations

import torch

# Tags: one per kind of message.
UPDATE = 11  # worker (or sub-master) -> server: gradients (Downpour) or weights (EASGD)
REPLY = 12  # server -> worker: current weights (Downpour) or the elastic difference (EASGD)

HEADER = 3  # version (two slots, exact to 2**44 in float32) and rows
_SPLIT = 2**22


class Message:
    """A reusable buffer: header (version, rows) + payload."""

    def __init__(self, size: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None):
        self.buffer = torch.zeros(HEADER + size, dtype=dtype, device=device)
        self.payload = self.buffer[HEADER:]

    @property
    def version(self) -> int:
        high, low = self.buffer[0].item(), self.buffer[1].item()
        return int(high) * _SPLIT + int(low)

    @version.setter
    def version(self, value: int) -> None:
        self.buffer[0], self.buffer[1] = value // _SPLIT, value % _SPLIT

    @property
    def rows(self) -> int:
        return int(self.buffer[2].item())

    @rows.setter
    def rows(self, value: int) -> None:
        self.buffer[2] = value
