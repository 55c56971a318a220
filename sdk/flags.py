"""Command-line flags from a dataclass: the one way every worldstep command turns its settings into flags.

Each field is one ``--flag`` (``num_steps`` -> ``--num-steps``) with the field's default. Its help is the
``flag(...)`` text, else the docstring under the field (cleanrl's ``Args`` style). ``bool`` fields take
``--flag/--no-flag``; ``list[X]`` fields a comma list (``--sizes 1,2,4``; an empty string is an empty list);
``X | None`` fields an ``X``, default None. ``flag`` may also give a field its own ``type`` (for a list, the
parser of one item), ``choices`` or ``metavar``, or make it positional, repeatable, a bare flag with a value
(``const``) or one of a mutually exclusive set.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["add_flags", "comma_list", "flag", "flag_name", "from_namespace", "int_at_least", "non_negative_int",
           "parse_flags", "positive_int"]

T = TypeVar("T")
_MISSING = dataclasses.MISSING


def flag(help: str = "", *, default: Any = _MISSING, default_factory: Any = _MISSING, type: Callable | None = None,
         choices: Sequence | None = None, metavar: str | None = None, positional: bool = False, repeat: bool = False,
         const: Any = None, exclusive: str | None = None) -> Any:
    """A dataclass field with what its flag needs beyond the type and default: help, its own parser (``type``),
    ``choices``, ``metavar``; ``positional`` (an argument without ``--``), ``repeat`` (``--set a --set b`` ->
    ``["a", "b"]``), ``const`` (the value of the bare flag: ``--port`` alone), ``exclusive`` (fields of the same
    name exclude each other)."""
    meta = {k: v for k, v in (("help", help), ("type", type), ("choices", choices), ("metavar", metavar),
                              ("positional", positional), ("repeat", repeat), ("const", const),
                              ("exclusive", exclusive)) if v is not None and v is not False and v != ""}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def flag_name(name: str) -> str:
    """``num_steps`` -> ``--num-steps``: how a field is spelled on the command line."""
    return "--" + name.replace("_", "-")


def comma_list(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse type: ``"1,2,4"`` -> ``[1, 2, 4]`` (empty items dropped)."""
    def parse(text: str) -> list:
        try:
            return [kind(item.strip()) for item in text.split(",") if item.strip()]
        except ValueError:
            name = getattr(kind, "__name__", "value")
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a comma list of {name}") from None

    return parse


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``, refused with the value and what is allowed."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: an int >= {minimum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is invalid; allowed: an int >= {minimum}")
        return value

    return parse


positive_int = int_at_least(1)  # counts: clients, rounds, episodes
non_negative_int = int_at_least(0)  # warm-up rounds, which may be none


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass body (its own body and its bases')."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not _MISSING:
        return f.default_factory()
    return None if f.default is _MISSING else f.default


def add_flags(parser: argparse.ArgumentParser, cls: type, title: str | None = None) -> None:
    """Add one flag per field of dataclass ``cls`` to ``parser`` (under the heading ``title`` if given); a field
    without a default is required."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    target: Any = parser if title is None else parser.add_argument_group(title)
    exclusive: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint, meta = hints[f.name], f.metadata
        default = _default(f)
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        text = meta.get("help") or docs.get(f.name, "")
        kwargs: dict[str, Any] = {"help": f"{text} (default {shown})".strip() if shown not in (None, "") else text}
        where = target
        if "exclusive" in meta:
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = target.add_mutually_exclusive_group()
            where = exclusive[meta["exclusive"]]
        if meta.get("positional"):  # without --; a list takes one or more values
            item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
            where.add_argument(f.name, type=meta.get("type") or item, help=text,
                               **({"nargs": "+"} if item is not hint else {}))
            continue
        kwargs.update(dest=f.name, default=default)
        if f.default is _MISSING and f.default_factory is _MISSING:
            kwargs["required"] = True
        if hint is bool:
            where.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        listed = hint if typing.get_origin(hint) is list else next((a for a in args if typing.get_origin(a) is list),
                                                                   None)
        if listed is not None and meta.get("repeat"):
            kind, kwargs["action"] = meta.get("type") or typing.get_args(listed)[0], "append"
        elif listed is not None:
            kind = comma_list(meta.get("type") or typing.get_args(listed)[0])
        else:  # int, float, str, or X | None
            kind = meta.get("type") or (args[0] if args else hint)
        if "const" in meta:
            kwargs.update(nargs="?", const=meta["const"])
        for key in ("choices", "metavar"):
            if key in meta:
                kwargs[key] = meta[key]
        where.add_argument(flag_name(f.name), type=kind, **kwargs)


def from_namespace(cls: type[T], namespace: argparse.Namespace, **values: Any) -> T:
    """The ``cls`` instance that parsed flags describe; ``values`` replace fields."""
    return cls(**{**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if f.init}, **values})


def parse_flags(cls: type[T], argv: Sequence[str] | None = None, **parser_kwargs: Any) -> T:
    """Parse ``argv`` (default ``sys.argv[1:]``) into ``cls``; ``parser_kwargs`` go to the parser (its ``prog``,
    ``description``), which defaults its description to the class docstring."""
    parser_kwargs.setdefault("description", (cls.__doc__ or "").strip())
    parser = argparse.ArgumentParser(**parser_kwargs)
    add_flags(parser, cls)
    return from_namespace(cls, parser.parse_args(argv))
