"""The plain-data messages between a job's ranks, signed with a key taken from the job's secret.

gloo's connections are not authenticated: one who reaches a worker's port as the ranks connect could sit in
the group. Its tensors cannot run code (shoal.cluster.codec), but the plain-data messages carry what the
ranks act on: rank 0's run directory, the checkpoint to resume from, a resharded checkpoint, the decision
to stop. So each such message carries an HMAC over (the attempt's context, the communicator's ranks, the
message's number on that communicator, the sender's rank, its bytes), checked before a byte of it is
decoded: a message that was not made by a rank of this job for this place in the exchange is refused. The
numbers count the object messages each communicator sends; every rank sends the same ones in the same order
(SPMD). Workers started by shoal's launcher hold the secret; under torchrun, srun or mpirun there is none,
and messages go unsigned, as those launchers trust their network.
"""

from __future__ import annotations

import hmac
import os

from shoal.cluster.codec import CodecError
from shoal.cluster.store import CONTEXT_VARIABLE, SECRET_VARIABLE
from shoal.keyed import derived_key, framed_mac

LABEL = b"shoal rank messages v1"
MAC_BYTES = 32


class MessageSeal:
    """Signs and checks one process's object messages; the job's secret stays in here, as a derived key."""

    def __init__(self, secret: str, context: str):
        self._key = derived_key(secret, LABEL)
        self.context = context

    def _mac(self, where: str, number: int, sender: int, payload: bytes) -> bytes:
        return framed_mac(self._key, self.context.encode(), where.encode(), str(number).encode(),
                          str(sender).encode(), payload)

    def sign(self, where: str, number: int, sender: int, payload: bytes) -> bytes:
        return payload + self._mac(where, number, sender, payload)

    def open(self, where: str, number: int, sender: int, signed: bytes) -> bytes:
        """The payload `sender` signed, or CodecError before any of it is read."""
        payload, mac = signed[:-MAC_BYTES], signed[-MAC_BYTES:]
        if len(signed) < MAC_BYTES or not hmac.compare_digest(mac, self._mac(where, number, sender, payload)):
            raise CodecError(f"refused rank {sender}'s message: it is not signed with the job's secret for this "
                             "exchange (a process that is not one of the job's, or a message played again); nothing "
                             "in it was read")
        return payload


def message_seal(environ=os.environ) -> MessageSeal | None:
    """The seal for this worker's messages when shoal's launcher handed it the job's secret, else None."""
    secret = environ.get(SECRET_VARIABLE)
    return MessageSeal(secret, environ.get(CONTEXT_VARIABLE, "")) if secret else None
