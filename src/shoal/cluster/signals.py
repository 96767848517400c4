"""Ctrl-C, SIGTERM and SIGHUP in a launcher: a stop at any moment, and the caller's handlers given back.

torch's agent handles these signals while workers run, and takes them over for good. Around
it, while machines meet or wait to restart, shoal handles them itself, so a launcher stops
within moments whatever it is doing; afterwards the caller (a notebook, a service) gets its
own handlers back. A signal the caller ignores (SIGHUP under nohup) stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # the signals torch's agent handles


class Interrupted(Exception):
    """The job was stopped by a signal; `exit_code` is 128 + its number (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signal_number: int):
        self.signal = signal.Signals(signal_number)
        self.exit_code = 128 + int(signal_number)
        super().__init__(f"stopped by {self.signal.name}")


def handled_signals() -> str:
    """The signals that may stop a job, comma-separated: those the caller does not ignore."""
    return ",".join(name for name in STOP_SIGNALS if signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN)


def _raise_interrupted(number: int, frame) -> None:
    raise Interrupted(number)


@contextlib.contextmanager
def caller_signal_handlers():
    """Put back, on the way out, whatever handlers the signals had on the way in."""
    saved = {name: signal.getsignal(getattr(signal, name)) for name in STOP_SIGNALS}
    try:
        yield
    finally:
        for name, handler in saved.items():
            if handler is None:  # installed outside Python: nothing to put back
                continue
            try:
                signal.signal(getattr(signal, name), handler)
            except ValueError:  # not the main thread, where nothing was installed either
                pass


@contextlib.contextmanager
def interruptible():
    """Within: a stop signal raises Interrupted (main thread only; elsewhere nothing changes)."""
    with caller_signal_handlers():
        for name in filter(None, handled_signals().split(",")):
            if signal.getsignal(getattr(signal, name)) is None:  # installed outside Python: left alone
                continue
            try:
                signal.signal(getattr(signal, name), _raise_interrupted)
            except ValueError:
                break
        yield


def call_on_stop(callback, names: tuple[str, ...] = ("SIGTERM", "SIGINT")) -> threading.Thread:
    """Call `callback(signal)` from a thread the moment one of `names` arrives, then end the process
    with the status it returns (None: 128 + the signal's number). A Python handler runs only when
    the main thread is back in Python, and a worker waits in C++ collectives for minutes; the
    wake-up descriptor is written by the C handler at once. A signal the caller ignores stays
    ignored; other signals with Python handlers keep them."""
    receiver, sender = socket.socketpair()
    sender.setblocking(False)
    signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)
    watched = set()
    for name in names:
        if signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN:
            signal.signal(getattr(signal, name), _noted)
            watched.add(int(getattr(signal, name)))

    def wait() -> None:
        while True:
            received = receiver.recv(1)
            if not received or sender.fileno() < 0:  # closed (the interpreter is ending): nothing arrived
                return
            if received[0] in watched:  # the descriptor hears every signal that has a Python handler
                break
        number, status = received[0], None
        try:
            status = callback(signal.Signals(number))
        finally:
            os._exit(128 + number if status is None else status)  # nothing more is written; checkpoints stay whole

    thread = threading.Thread(target=wait, name="shoal-stop-signal", daemon=True)
    thread.start()
    return thread


def _noted(number: int, frame) -> None:
    """The Python-level handler: nothing (the thread of `call_on_stop` acts)."""
