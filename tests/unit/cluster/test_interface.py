"""The interface workers talk on: the route to the rendezvous host, the user's choice kept."""

from __future__ import annotations

import psutil
import pytest

from shoal.cluster.interface import SOCKET_VARIABLES, choose_interface, interface_to, interface_with, use_interface
from shoal.errors import ShoalError


def loopback() -> str:
    return next(name for name, entries in psutil.net_if_addrs().items()
                if any(entry.address == "127.0.0.1" for entry in entries))


def test_a_job_on_one_machine_talks_on_loopback_only():
    environment = {"MASTER_ADDR": "127.0.0.1"}
    assert interface_to("127.0.0.1") == loopback() == interface_to("localhost")
    assert interface_to("127.0.1.1") == loopback()  # a stock Debian hostname's address is loopback's too
    assert choose_interface(environment) == loopback()
    assert {environment[name] for name in SOCKET_VARIABLES} == {loopback()}


def test_a_choice_of_the_user_is_kept():
    environment = {"MASTER_ADDR": "10.1.2.3", "GLOO_SOCKET_IFNAME": "eth7"}
    assert choose_interface(environment) is None and environment["GLOO_SOCKET_IFNAME"] == "eth7"


def test_nothing_to_reach_sets_nothing():
    assert choose_interface({}) is None
    environment = {"MASTER_ADDR": "no-such-host.invalid"}
    assert choose_interface(environment) is None and set(environment) == {"MASTER_ADDR"}


def test_the_interface_holding_an_address_is_found():
    name, addresses = next(iter(psutil.net_if_addrs().items()))
    assert interface_with(addresses[0].address) == name
    assert interface_with("203.0.113.77") is None  # TEST-NET-3: held by no machine


def test_a_routed_address_names_the_interface_that_holds_the_source(monkeypatch):
    monkeypatch.setattr("shoal.cluster.interface.route_source", lambda host: "192.0.2.10")
    monkeypatch.setattr("shoal.cluster.interface.interface_with", lambda address: "eth3")
    environment = {"MASTER_ADDR": "node0"}
    assert choose_interface(environment) == "eth3"
    assert all(environment[name] == "eth3" for name in SOCKET_VARIABLES)


def test_the_user_names_an_interface_this_machine_has():
    environment = {}
    use_interface("lo", environment)
    assert all(environment[name] == "lo" for name in SOCKET_VARIABLES)
    with pytest.raises(ShoalError, match="--interface: no interface 'nope0' on this machine"):
        use_interface("nope0", environment)
