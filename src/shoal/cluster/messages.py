"""The messages of the parameter-server algorithms: one flat buffer each, one tag per kind.

A message is a header followed by a payload of model-sized numbers, all in one buffer, so each
exchange is one send and one receive however many layers the model has. The buffer is bytes: the
header is read through an int64 view and the payload through a view in the model's dtype, so a
version or a row count stays exact whatever that dtype (bfloat16 holds integers only up to 256).
Its kind travels as the tag, never as a field, so a receiver only ever waits for the kind it
expects and the server can take updates from whichever worker sends first (receive from any source).
Buffers stay in CPU memory whatever the model's device: messages travel over gloo
(`collectives.message_group`), which moves CPU memory only.
"""

from __future__ import annotations

import torch

# Tags: one per kind of message.
UPDATE = 11  # worker (or sub-master) -> server: gradients (Downpour) or weights (EASGD)
REPLY = 12  # server -> worker: current weights (Downpour) or the elastic difference (EASGD)

HEADER_TYPE = torch.int64
VERSION, ROWS = 0, 1  # the header's slots
HEADER_BYTES = 2 * torch.empty((), dtype=HEADER_TYPE).element_size()  # a multiple of any payload's item size


class Message:
    """A reusable buffer of bytes: an int64 header (version, rows) + a payload in the model's dtype."""

    def __init__(self, size: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None):
        width = torch.empty((), dtype=dtype).element_size()
        self.buffer = torch.zeros(HEADER_BYTES + size * width, dtype=torch.uint8, device=device)
        self.header = self.buffer[:HEADER_BYTES].view(HEADER_TYPE)
        self.payload = self.buffer[HEADER_BYTES:].view(dtype)

    @property
    def dtype(self) -> torch.dtype:
        """The payload's dtype (the model's)."""
        return self.payload.dtype

    @property
    def version(self) -> int:
        return int(self.header[VERSION].item())

    @version.setter
    def version(self, value: int) -> None:
        self.header[VERSION] = value

    @property
    def rows(self) -> int:
        return int(self.header[ROWS].item())

    @rows.setter
    def rows(self, value: int) -> None:
        self.header[ROWS] = value

    def copy(self) -> Message:
        """A message of its own holding the same bytes (an update kept while the buffer is reused)."""
        other = Message(len(self.payload), self.dtype, self.buffer.device)
        other.buffer.copy_(self.buffer)
        return other
