"""Registries of pluggable parts: a type key -> its config model and its factory, filled by the part's
own module (`@SOURCES.register("camera", CameraSourceConfig)`), read by the schema (the config union
is built from what is registered) and by the stage that builds the parts. `factories` is a plain dict
that tests may swap entries in."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil
from collections.abc import Callable, Sequence
from functools import reduce
from importlib.metadata import entry_points
from operator import or_
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, Discriminator, Field, Tag

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def package_modules(package: str) -> tuple[str, ...]:
    """The modules of `package` (by name, sorted; those whose name starts with _ left out), found without
    importing them: a registry's built-ins when each part is one file of a package."""
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    names = sorted(m.name for m in pkgutil.iter_modules(folders) if not m.name.startswith("_"))
    return tuple(f"{package}.{name}" for name in names)


class Registry(Generic[F]):
    """Type key -> (config model, factory) for one kind of part (sources, postprocessors, ...)."""

    def __init__(
        self,
        kind: str,
        key_field: str,
        builtins: Sequence[str],
        default_key: str | None = None,
        *,
        plugins: str | None = None,
    ) -> None:
        self.kind = kind
        self.key_field = key_field  # the config key that picks the part: `type`, `mode`
        self.default_key = default_key  # the part a section without `key_field` gets (None: the key is required)
        self.builtins = tuple(builtins)  # modules of the built-in parts, imported when the registry is read
        self.plugins = plugins  # the entry-point group third-party packages register their parts under
        self.factories: dict[str, F] = {}
        self.configs: dict[str, type[BaseModel]] = {}
        self._plugins_loaded = False

    def register(self, key: str, config: type[BaseModel]) -> Callable[[F], F]:
        """Decorator for the part's class (or factory function)."""

        def deco(factory: F) -> F:
            self.factories[key] = factory
            self.configs[key] = config
            return factory

        return deco

    def load_builtins(self) -> None:
        """Import the built-in parts' modules (each registers itself), then, once, the installed plugins."""
        for module in self.builtins:
            importlib.import_module(module)
        if self.plugins is not None and not self._plugins_loaded:
            self._plugins_loaded = True
            self._load_plugins(self.plugins)

    def _load_plugins(self, group: str) -> None:
        """Import every module a package names under the entry-point group (`[project.entry-points."edged.
        postprocessors"] mine = "mypkg.decoder"`); importing it registers its part as the built-ins do. A plugin
        that fails to import is logged with its name and skipped: the config then names its type as unknown."""
        for entry in entry_points(group=group):
            try:
                entry.load()
            except Exception:  # noqa: PERF203  (once per plugin at start-up; any failure is the plugin's)
                log.exception("%s plugin %s (%s) failed to load; its type is not available", self.kind, entry.name,
                              entry.value)  # fmt: skip
            else:
                log.debug("%s plugin %s loaded from %s", self.kind, entry.name, entry.value)

    def factory(self, key: str) -> F:
        """The factory registered under `key`."""
        if key not in self.factories:
            self.load_builtins()
        try:
            return self.factories[key]
        except KeyError:
            raise KeyError(f"no {self.kind} registered for {self.key_field} {key!r}") from None

    def config_union(self) -> Any:
        """The pydantic type of the config key: a union of every registered config model, told apart by
        `key_field` (a single model stands alone: a discriminator needs a union)."""
        self.load_builtins()
        models = [self.configs[key] for key in self.ordered_keys()]
        if len(models) == 1:
            return models[0]
        if self.default_key is None:
            return Annotated[reduce(or_, models), Field(discriminator=self.key_field)]
        tagged = [Annotated[self.configs[key], Tag(key)] for key in self.ordered_keys()]
        return Annotated[reduce(or_, tagged), Discriminator(self._key_of)]

    def ordered_keys(self) -> list[str]:
        """The type keys, built-in parts first in the order their modules are listed (a stable schema and
        docs whatever the import order was), then the others as they registered."""
        rank = {module: i for i, module in enumerate(self.builtins)}
        return sorted(self.configs, key=lambda k: rank.get(self.factories[k].__module__, len(rank)))

    def _key_of(self, value: Any) -> Any:
        if isinstance(value, dict):
            return value.get(self.key_field, self.default_key)
        return getattr(value, self.key_field, self.default_key)

    def keys(self) -> set[str]:
        """Every registered type key (after the built-ins loaded)."""
        self.load_builtins()
        return set(self.configs)
