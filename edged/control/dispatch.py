"""The thin dispatcher between the gate and the handlers: each remote command's name -> its arguments' model
and its handler (one module each in handlers/, found by the registry), the arguments checked, the handler
run."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from edged.control.context import CommandContext, Handler
from edged.core.errors import CommandError
from edged.core.registry import Registry, package_modules

HANDLERS: Registry[Handler] = Registry("remote command", "cmd", package_modules("edged.control.handlers"))


class Args(BaseModel):
    """A command's arguments: nothing unknown, nothing changed after the check."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(Args):
    """reload, status."""


def parse_args(name: str, args: dict[str, Any]) -> BaseModel:
    """The command's arguments as its model reads them; CommandError("malformed") naming the first problem."""
    HANDLERS.factory(name)  # loads the handlers: KeyError for a name none handles (the gate admits only those)
    try:
        return HANDLERS.configs[name].model_validate(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CommandError("malformed", f"args.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def dispatch(name: str, args: dict[str, Any], ctx: CommandContext) -> tuple[bool, Any]:
    """Run the command `name`: (ok, detail), or CommandError / EdgedError with the reason."""
    return HANDLERS.factory(name)(parse_args(name, args), ctx)
