"""Signed calls to the job's data server, and signed answers: who may ask, and who answered.

The data stream (`shoal.data.flight`) takes a key of its own from the job's secret (`stream_key`), so
no value it signs can stand for one signed elsewhere with the secret (the job's store). Every call
is a JSON body naming its method and exact parameters (the dataset, the rows), a random nonce and
the time it was signed, under an HMAC-SHA256 of that key (`signed_request`). The server answers a
call only if the MAC is right (compared in constant time), the time is within `WINDOW_SECONDS` of
its own clock either way, and the nonce is not one it answered within that window
(`RequestCheck`): a recorded call cannot be replayed, and an altered one is not answered. Every
answer carries an HMAC of the same key over the call it answers and what it holds (`answer_mac`),
so a client tells the job's server from anyone else listening at the port it was given: one
without the secret cannot make it, nor pass off another call's answer as this one's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from typing import Any

from shoal.keyed import derived_key, framed_mac

KEY_LABEL = b"shoal data stream v1"
WINDOW_SECONDS = 60.0
"""How long a signed call is good for, either side of the server's clock (the machines' clocks must agree
this well), and how long the server remembers its nonce."""
NONCE_BYTES = 16


class Refused(Exception):
    """A call the server does not answer: its message says why, in words the caller is shown."""


def stream_key(secret: str) -> bytes:
    """The data stream's key: only the job's secret computes it, and it tells nothing of the secret."""
    return derived_key(secret, KEY_LABEL)


def _mac(key: bytes, role: bytes, *parts: bytes) -> bytes:
    """An HMAC of the parts after their role (framed: no two lists of parts sign alike)."""
    return framed_mac(key, role, *parts)


def signed_request(key: bytes, method: str, fields: dict[str, Any], now: float | None = None) -> tuple[bytes, bytes]:
    """A call's bytes as sent (the MAC in hex, a space, the JSON body) and its identity (their SHA-256), which
    the answer's MAC covers. `now`: the time to sign with (default: this machine's clock)."""
    body = json.dumps({**fields, "method": method, "nonce": secrets.token_hex(NONCE_BYTES),
                       "time": time.time() if now is None else now}, sort_keys=True, separators=(",", ":")).encode()
    wire = _mac(key, b"request", body).hex().encode() + b" " + body
    return wire, hashlib.sha256(wire).digest()


class RequestCheck:
    """The server's side: the body of a call signed with the key, fresh and not seen before, or `Refused`."""

    def __init__(self, key: bytes, window: float = WINDOW_SECONDS):
        self._key = key
        self.window = window
        self._seen: dict[str, float] = {}  # nonce -> the time its call was signed, for as long as it is fresh
        self._lock = threading.Lock()

    def __call__(self, wire: bytes, method: str, now: float | None = None) -> tuple[dict[str, Any], bytes]:
        """The call's body and identity; `Refused` before anything else is done when it is not to be answered."""
        mac, _, body = wire.partition(b" ")
        if not hmac.compare_digest(mac, _mac(self._key, b"request", body).hex().encode()):
            raise Refused("the call is not signed with this job's secret (another job's server, or a process "
                          "without the job's secret?)")
        request = _parsed(body)
        if request["method"] != method:
            raise Refused(f"the call was signed for {request['method']!r}, not {method!r}")
        now = time.time() if now is None else now
        offset = request["time"] - now
        if not abs(offset) <= self.window:
            raise Refused(f"the call was signed {offset:+.0f} s from the data server's clock, beyond the "
                          f"{self.window:.0f} s a call is good for (a recorded call replayed, or the machines' "
                          "clocks disagree)")
        with self._lock:
            self._seen = {nonce: signed for nonce, signed in self._seen.items() if signed >= now - self.window}
            if request["nonce"] in self._seen:
                raise Refused("the call was answered once already (a recorded call replayed)")
            self._seen[request["nonce"]] = request["time"]
        return request, hashlib.sha256(wire).digest()


def _parsed(body: bytes) -> dict[str, Any]:
    """A signed body's fields (a signed body is the job's own, so a malformed one is a bug, refused all the same)."""
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        request = None
    if not (isinstance(request, dict) and isinstance(request.get("method"), str)
            and isinstance(request.get("nonce"), str) and len(request["nonce"]) == 2 * NONCE_BYTES
            and isinstance(request.get("time"), (int, float)) and not isinstance(request["time"], bool)
            and math.isfinite(request["time"])):
        raise Refused("the call's body is not a method, a nonce and a time")
    return request


def answer_mac(key: bytes, request_id: bytes, *parts: bytes) -> bytes:
    """The MAC an answer to the call `request_id` carries over what it holds."""
    return _mac(key, b"answer", request_id, *parts)


def answered_with_key(key: bytes, request_id: bytes, mac: bytes, *parts: bytes) -> bool:
    """Whether `mac` is the answer MAC of these parts to the call `request_id` (compared in constant time)."""
    return hmac.compare_digest(mac, answer_mac(key, request_id, *parts))
