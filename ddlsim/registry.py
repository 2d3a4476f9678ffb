"""Registries: one per extension point, one token per thing.

A plug-in registers itself under its token when its module is imported; ``Registry.get`` fails
with the sorted list of valid tokens. Modules are discovered by file name (``<variant>_<family>.py``)
so a new algorithm is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown token; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str | None = None, suffix: str | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._package = package
        self._suffix = suffix
        self._loaded = package is None

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return add

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        assert self._package is not None
        package = importlib.import_module(self._package)
        for info in pkgutil.iter_modules(package.__path__):
            if self._suffix is None or info.name.endswith(self._suffix):
                importlib.import_module(f"{self._package}.{info.name}")

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
