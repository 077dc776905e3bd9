"""Name -> component registries. Every pluggable part (env, policy, algo, runtime) is chosen
by a `name` in its config; each entry carries the dataclass schema its config must match."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from embodied.core.errors import UnknownNameError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    target: Callable[..., T] | str  # the factory, or its "module:attribute", imported on first use
    schema: type

    @property
    def factory(self) -> Callable[..., T]:
        return self.target if callable(self.target) else load(self.target)


def load(target: str) -> Any:
    """The object a "module:attribute" string names, its module imported on first use."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, schema: type) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: `@ENVS.register("maniskill", ManiSkillConfig)`."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            self.add(name, schema, factory)
            return factory

        return add

    def add(self, name: str, schema: type, target: Callable[..., T] | str) -> None:
        """An entry whose factory is `target`, or a "module:attribute" string naming it: a
        component of the application (a runtime) is registered without importing it, so
        validating a config never loads the code that runs it."""
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = Entry(name, target, schema)

    def get(self, name: str) -> Entry[T]:
        if name not in self._entries:
            raise UnknownNameError(unknown_name_message(self.kind, name, self.names()))
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)


def unknown_name_message(kind: str, name: Any, known: list[str]) -> str:
    message = f"unknown {kind} '{name}'; known: {', '.join(known) or '(none)'}"
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    if close:
        message += f". Did you mean '{close[0]}'?"
    return message


ENVS: Registry = Registry("env")
POLICIES: Registry = Registry("policy")
ALGOS: Registry = Registry("algo")
RUNTIMES: Registry = Registry("runtime")
ROBOTS: Registry = Registry("robot")  # filled by robots/, which never imports torch
TELEOPS: Registry = Registry("teleop")  # operator devices, filled by robots/ (and the oracle by the robot CLI)
