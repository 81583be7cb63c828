"""A small generic registry: duplicate names raise, unknown names suggest the closest."""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from orchestrator.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}{suggest(name, self._items)}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def suggest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest choice, or a list of valid choices."""
    choices = sorted({str(c) for c in choices})  # a YAML key may be a number or a bool; no name twice
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.5)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (valid: {', '.join(choices)})" if choices else ""
