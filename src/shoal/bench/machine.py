"""What machine a measurement ran on: cores, memory, CPU model, torch and Python versions.

Every result of a study or benchmark carries this, since times mean nothing without it.
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

import torch

from shoal.cluster.env import cores


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not a POSIX system that tells
        return None


def describe() -> dict:
    return {"host": socket.gethostname(), "cores": cores(), "memory_gib": memory_gib(), "cpu": cpu_model(),
            "torch": torch.__version__, "python": platform.python_version()}


def machine_line(info: dict) -> str:
    memory = "unknown memory" if info.get("memory_gib") is None else f"{info['memory_gib']} GiB"
    return (f"{info['cores']} cores, {memory}, {info['cpu']}; "
            f"torch {info['torch']}, Python {info['python']}")
