"""Which network interface a worker talks on: the one whose address routes to the rendezvous host.

gloo (and NCCL's bootstrap) advertise the address the machine's hostname resolves to unless
told an interface. On a stock Debian or Ubuntu machine the hostname resolves to 127.0.1.1, so
peers on other machines are told to connect to their own loopback and the job never starts.
The kernel already knows the right interface: the one it would send from to reach the
rendezvous host. Asking it sends no packet (a UDP socket's connect only picks a route).
A job on one machine meets on 127.0.0.1, so its workers talk on loopback only.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil

from shoal.errors import ShoalError

SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def route_source(host: str, port: int = 9) -> str | None:
    """The local address this machine would use to reach `host`; None where it cannot be resolved or routed."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address[:2])
            return probe.getsockname()[0]
    except OSError:
        return None


def local_addresses() -> set[str]:
    """Every address this machine holds, on any interface (scope suffixes of IPv6 ones left off)."""
    return {entry.address.split("%")[0] for entries in psutil.net_if_addrs().values() for entry in entries}


def interface_with(address: str) -> str | None:
    """The name of the interface holding `address`."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(entry.address.split("%")[0] == address for entry in addresses):
            return name
    return None


def interface_to(host: str, one_machine: bool = True) -> str | None:
    """The interface whose address routes to `host`; loopback's for a job on one machine; None when unknown,
    or when a job across machines meets at a name that resolves to loopback here (stock Debian's)."""
    source = route_source(host)
    if source is not None and ipaddress.ip_address(source).is_loopback:
        if not one_machine:
            return None
        source = "127.0.0.1" if ipaddress.ip_address(source).version == 4 else "::1"  # 127.0.1.1 too is lo's
    return None if source is None else interface_with(source)


def use_interface(name: str, environment: dict = os.environ) -> None:
    """`--interface NAME`: this machine's workers talk on `name` (a per-machine choice, so not a job key)."""
    known = psutil.net_if_addrs()
    if name not in known:
        raise ShoalError(f"--interface: no interface {name!r} on this machine (it has {', '.join(sorted(known))})")
    for variable in SOCKET_VARIABLES:
        environment[variable] = name


def choose_interface(environment: dict = os.environ, one_machine: bool = True) -> str | None:
    """Set gloo's and NCCL's interface to the one that reaches MASTER_ADDR, unless the user set them.

    Returns the interface chosen, or None when nothing was set (chosen by the user, or unknown). On
    one machine that is loopback, so a single-machine job listens nowhere else.
    """
    if any(name in environment for name in SOCKET_VARIABLES) or "MASTER_ADDR" not in environment:
        return None
    interface = interface_to(environment["MASTER_ADDR"], one_machine)
    if interface is not None:
        for name in SOCKET_VARIABLES:
            environment[name] = interface
    return interface
