"""Registries: one per extension point, one token per thing.

A plug-in registers itself under its token when its module is imported; ``Registry.get`` fails
with the sorted list of valid tokens. Modules are discovered by file name (``<variant>_<family>.py``)
so a new algorithm is one new file. A token asked for by name loads its own file alone
(``<token>_<family>.py``); only a listing, or a token that no file is named after, loads them all
(a closed-form run then imports the one algorithm and the one collective it uses, not every schedule).
"""

from __future__ import annotations

import importlib
import importlib.util
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

    def _load_own(self, name: str) -> None:
        """Import the module named after ``name`` (``<name><suffix>``), if there is one."""
        if self._loaded or name in self._items or not name.isidentifier():
            return
        assert self._package is not None
        module = f"{self._package}.{name}{self._suffix or ''}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)

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
        self._load_own(name)
        if name in self._items:
            return self._items[name]
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

    def names_from_files(self) -> list[str]:
        """``names()`` read from the modules' file names (``<token><suffix>.py``) without importing
        them, for help texts: the same list, as each file registers its own token (tests hold them
        to it)."""
        if self._loaded:
            return self.names()
        assert self._package is not None and self._suffix is not None
        package = importlib.import_module(self._package)
        tokens = {info.name.removesuffix(self._suffix) for info in pkgutil.iter_modules(package.__path__)
                  if info.name.endswith(self._suffix)}  # fmt: skip
        return sorted(tokens | set(self._items))

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._load_own(name)
        if name in self._items:
            return True
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
