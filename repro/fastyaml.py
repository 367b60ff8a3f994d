"""libyaml, where PyYAML was built with it: its safe loader and dumper read and write the same documents as
PyYAML's pure-Python ones, several times faster (about ten for reading). The one place that chooses it."""

from __future__ import annotations

from typing import Any

import yaml


def libyaml(pure: type[yaml.SafeLoader] | type[yaml.SafeDumper]) -> Any | None:
    """The libyaml counterpart of PyYAML's ``yaml.SafeLoader`` or ``yaml.SafeDumper`` (``CSafeLoader``,
    ``CSafeDumper``), or None where PyYAML was built without libyaml."""
    if pure not in (yaml.SafeLoader, yaml.SafeDumper):
        raise ValueError(f"libyaml: {pure.__name__} is neither yaml.SafeLoader nor yaml.SafeDumper")
    return getattr(yaml, f"C{pure.__name__}", None)
