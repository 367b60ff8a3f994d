"""One small registry for every plugin kind (parsers, launchers).

Plugins register by name with a class decorator. Built-in plugin modules are imported
lazily the first time the registry is asked for anything, so importing ``repro`` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from repro.errors import PluginUnavailable, UnknownPlugin

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> plugin class, with lazily imported built-in modules."""

    def __init__(self, kind: str, builtin_modules: Sequence[str]) -> None:
        self.kind = kind
        self._builtin = tuple(builtin_modules)
        self._loaded = False
        self._plugins: dict[str, type[T]] = {}
        self._unavailable: dict[str, str] = {}

    def register(self, name: str, *, unavailable: str | None = None) -> Callable[[type[T]], type[T]]:
        """Class decorator. ``unavailable`` records why the plugin cannot run here."""

        def decorate(cls: type[T]) -> type[T]:
            if name in self._plugins:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self._plugins[name] = cls
            if unavailable:
                self._unavailable[name] = unavailable
            return cls

        return decorate

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self._builtin:
                importlib.import_module(module)

    def get(self, name: str) -> type[T]:
        self._load()
        if name not in self._plugins:
            raise UnknownPlugin(
                f"no {self.kind} {name!r}; available: {', '.join(self.names())}",
                hint=f"pick one of the registered {self.kind}s",
            )
        if name in self._unavailable:
            raise PluginUnavailable(f"{self.kind} {name!r} is unavailable: {self._unavailable[name]}")
        return self._plugins[name]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._plugins)

    def plugins(self) -> list[type[T]]:
        """Registered classes in registration order (detection order for parsers)."""
        self._load()
        return list(self._plugins.values())

    def unavailable(self) -> dict[str, str]:
        self._load()
        return dict(self._unavailable)
