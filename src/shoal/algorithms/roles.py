"""What a rank does in a job: train, serve as the parameter server, or relay for a group.

Collective algorithms make every rank a trainer; parameter-server algorithms give rank 0 (and
the sub-masters of hierarchical groups) other roles. The runner asks once and then runs the
epoch loop of that role.
"""

from __future__ import annotations

import enum


class Role(enum.Enum):
    TRAINER = "trainer"
    """Trains on its share of the data."""
    SERVER = "server"
    """Holds the central model and applies the trainers' updates (rank 0)."""
    RELAY = "relay"
    """A sub-master: combines its group's updates and passes them to the server."""
