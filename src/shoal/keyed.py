"""The one way shoal keys anything with the job's secret: a key derived per use, and an HMAC over framed parts.

The job's secret keys the store's names and values (shoal.cluster.store), the ranks' messages
(shoal.cluster.signed_messages) and the data stream's calls and answers (shoal.data.signing). Each use takes a key
of its own from the secret (`derived_key`, by a label), so that nothing keyed for one use stands for another, and
every MAC is HMAC-SHA256 over its parts each prefixed by its length (`framed_mac`), so that no two lists of parts
read alike ("ab" + "c" is not "a" + "bc").
"""

from __future__ import annotations

import hashlib
import hmac


def derived_key(secret: str, label: bytes) -> bytes:
    """The key of one use of the job's secret: it tells nothing of the secret or of the other uses' keys."""
    return hmac.new(secret.encode(), label, hashlib.sha256).digest()


def framed_mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under `key` of `parts`, each after its length (8 bytes, big-endian)."""
    code = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        code.update(len(part).to_bytes(8, "big"))
        code.update(part)
    return code.digest()
