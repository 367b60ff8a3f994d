"""Launcher plugins, registered by the names manifests use in ``launch.kind``."""

from repro.launchers.base import Launcher, NodeCommand
from repro.registry import Registry

LAUNCHERS: Registry[Launcher] = Registry(
    "launcher",
    ["repro.launchers.torch", "repro.launchers.paddle", "repro.launchers.mpi", "repro.launchers.plain",
     "repro.launchers.tf_ps"],
)

__all__ = ["LAUNCHERS", "Launcher", "NodeCommand"]
