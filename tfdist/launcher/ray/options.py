"""The options of a job run on Ray (`tfdist.launcher.ray.gang`); ``--ray`` and its flags are
parsed in `tfdist.launcher.arguments`.

Example:
    >>> RayOptions(placement="PACK")
    RayOptions(address='auto', cpus_per_task=1.0, placement='PACK', gang_timeout=60.0, env_names=())
"""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["RayOptions"]

Placement = Literal["SPREAD", "PACK"]


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """Where and how a job runs on Ray.

    Attributes:
        address: The cluster: ``"HOST:PORT"`` of its head, ``"auto"`` (``RAY_ADDRESS``, else the
            cluster ``ray start`` began on this machine), or ``"local"`` (a new one-node cluster
            for this job alone).
        cpus_per_task: CPUs each task's bundle holds (fractions allowed).
        placement: ``"SPREAD"`` (default) or ``"PACK"``; see the module docstring.
        gang_timeout: Seconds to wait for the cluster to answer, for the gang's resources and
            for every actor to start.
        env_names: Variables of this environment the tasks get too (``--env NAME``).

    Example:
        >>> RayOptions(address="10.0.0.1:6379", cpus_per_task=2).placement
        'SPREAD'
    """

    address: str = "auto"
    cpus_per_task: float = 1.0
    placement: Placement = "SPREAD"
    gang_timeout: float = 60.0
    env_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.cpus_per_task > 0:
            raise ValueError(f"--ray-cpus-per-task must be more than 0. Received: "
                             f"{self.cpus_per_task}. Fix: e.g. --ray-cpus-per-task 1")
        if self.placement not in ("SPREAD", "PACK"):
            raise ValueError(f"placement must be SPREAD or PACK. Received: {self.placement!r}")
        if not self.gang_timeout > 0:
            raise ValueError(f"--ray-gang-timeout must be more than 0 seconds. Received: "
                             f"{self.gang_timeout}. Fix: e.g. --ray-gang-timeout 60")
