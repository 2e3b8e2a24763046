"""Hydra launchers causalab ships: hydra-ray-launcher's, made safe for the two ways it runs.

A Ray cluster that the launcher starts itself (``ray.init.address: null``) listens on
127.0.0.1 only: Ray otherwise binds every interface and turns a loopback ``_node_ip_address``
into the host's routable one, unless told it runs no multi-host cluster
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is first imported, which is why
it is set at launch and before that import). A cluster it joins (``address: auto`` or
``host:port``) is given no ``object_store_memory``, which the plugin otherwise sets and Ray
refuses when connecting. Nothing happens at import.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher as _PluginRayLauncher
from omegaconf import open_dict

LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayLauncher(_PluginRayLauncher):
    """``hydra/launcher=ray``: the plugin's launcher with the two settings above."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        with open_dict(self.ray_cfg):
            if self.ray_cfg.init.get("address") is None:
                if "ray" in sys.modules and os.environ.get(LOOPBACK_ONLY) != "0":
                    raise RuntimeError(f"ray was imported before the launcher could set "
                                       f"{LOOPBACK_ONLY}=0; a local cluster would listen on "
                                       "every interface")
                os.environ[LOOPBACK_ONLY] = "0"
            elif "object_store_memory" not in self.ray_cfg.init:
                self.ray_cfg.init.object_store_memory = None
        return super().launch(job_overrides, initial_job_idx)
