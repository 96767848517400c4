"""Where a job's dataset comes from on this machine: its own folder or store, or the job's data server.

A job names its datasets by the paths the user gave. A machine that sees the path (a local folder, a
shared folder, a URI of a store) reads it directly. A machine that does not, in a job whose first
machine serves its datasets (`shoal.data.flight`), is told the server's address in `SERVER_VARIABLE`
and the job's secret in `SECRET_VARIABLE`, and streams only the rows it reads from there.

The address alone is not trusted: whoever answers there must prove it holds the job's secret. Every
call is signed with a key taken from the secret (fresh each time: a recorded call is not answered
again), every answer must carry that key's MAC, and every row must match the digest the server took
of its block when it started serving; anything else is a one-line `DataError` naming the dataset,
and no row of it is used (`shoal.data.flight` says how). The secret itself never crosses the network.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from shoal.data.format import Dataset, open_dataset
from shoal.errors import DataError

SERVER_VARIABLE = "SHOAL_DATA_SERVER"
"""host:port of the job's data server, set for the workers of machines that may lack the job's datasets."""
SECRET_VARIABLE = "SHOAL_JOB_SECRET"
"""The job's secret, handed by the launcher to its workers in their environment (never on a command line)."""


def readable_here(path: str) -> bool:
    """Whether this machine reads the dataset `path` itself: a URI of a store, or a path it sees."""
    return "://" in path or os.path.lexists(path)


def open_source(path: str, environ: Mapping[str, str] | None = None) -> Dataset:
    """The dataset at `path`: read here when `path` is a URI or exists here, else streamed from the job's
    data server when one is set in `environ` (default: this process's environment); else "not found"."""
    environ = os.environ if environ is None else environ
    path = str(path)
    address = environ.get(SERVER_VARIABLE)
    if readable_here(path) or not address:
        return open_dataset(path)
    secret = environ.get(SECRET_VARIABLE)
    if not secret:
        raise DataError(f"{path}: not found on this machine, and the job's data server at {address} needs the "
                        f"job's secret, which {SECRET_VARIABLE} does not hold")
    from shoal.data.flight import open_remote  # gRPC is loaded only by the processes that stream rows

    return open_remote(address, path, secret)
