"""Launcher plugins, registered by the names manifests use in ``launch.kind``."""

from repro.run.launchers.base import Launcher, NodeCommand
from repro.registry import Registry

LAUNCHERS: Registry[Launcher] = Registry(
    "launcher",
    ["repro.run.launchers.torch", "repro.run.launchers.paddle", "repro.run.launchers.mpi",
     "repro.run.launchers.plain", "repro.run.launchers.tf_ps"],
)

__all__ = ["LAUNCHERS", "Launcher", "NodeCommand"]
