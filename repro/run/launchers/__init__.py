"""Launcher plugins, registered by the names manifests use in ``launch.kind``."""

from repro.run.launchers.base import IB_DEVICE_DIR, Launcher, NodeCommand, fill, rdma_container_options
from repro.registry import Registry

LAUNCHERS: Registry[Launcher] = Registry(
    "launcher",
    ["repro.run.launchers.torch", "repro.run.launchers.paddle", "repro.run.launchers.mpi",
     "repro.run.launchers.plain", "repro.run.launchers.tf_ps"],
)

__all__ = ["IB_DEVICE_DIR", "LAUNCHERS", "Launcher", "NodeCommand", "fill", "rdma_container_options"]
