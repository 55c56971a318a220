"""Strict settings models: the one base of every knob set worldstep reads from code and YAML alike.

Frozen, unknown keys refused, strict types (an integer knob refuses ``true`` and ``2.0``, a switch refuses
the string ``"true"``); every validation failure raises one `ConfigError` (a ``ValueError``) whose lines read
``<key> = <value>: must be <allowed range>``, so the engine (``RolloutKnobs``, ``DecoderOptions``) and the
YAML config (``worldstep.WorldstepConfig``, whose sections are those same models) explain a bad value the
same way.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A config value or key is not allowed; the message names the key, the value and the allowed range."""


class UnknownKeyError(ConfigError, TypeError):
    """An unknown config key, e.g. a keyword argument of ``gym.make`` or ``make_env`` that no section has.

    Both a ``ConfigError`` and a ``TypeError``, as Python reports an unexpected keyword argument: callers
    that probe optional keywords (torchrl passes ``frameskip=`` and retries without it) read it as such.
    """


def unknown_key_message(key: str, allowed: list[str] | tuple[str, ...]) -> str:
    """``KEY: unknown key (unexpected keyword argument 'KEY'; did you mean 'NEAR'?); allowed keys: ...``."""
    near = difflib.get_close_matches(key.split(".")[-1], allowed, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (f"{key}: unknown key (unexpected keyword argument {key.split('.')[-1]!r}{hint}); allowed keys: "
            + ", ".join(allowed))


# Messages for pydantic's error types, phrased as what the value must be.
_MUST_BE = {
    "int_type": "an integer (not a bool, float or string)",
    "float_type": "a number",
    "bool_type": "a boolean true/false (not a string or number)",
    "string_type": "a string",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}


def describe_error(error: dict[str, Any], owner: type[BaseModel] | None) -> str:
    key = ".".join(str(part) for part in error["loc"])
    kind, ctx = error["type"], error.get("ctx", {})
    nested = ctx.get("error")
    if isinstance(nested, ConfigError):  # a section's own __init__ already described it
        return "\n".join(f"{key}.{line}" if key else line for line in str(nested).splitlines())
    if kind == "value_error" and not key:  # a check across fields states its own message
        return str(nested or error["msg"])
    if kind == "missing":
        return f"{key}: required key is missing"
    if kind == "extra_forbidden":
        return unknown_key_message(key, list(owner.model_fields) if owner is not None else [])
    if kind == "value_error":
        must = str(ctx.get("error", error["msg"]))
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        must = f"{_SIGNS[kind]} {next(iter(ctx.values()))}"
    elif kind == "literal_error":
        must = f"one of {ctx.get('expected', error['msg'])}"
    else:
        must = _MUST_BE.get(kind, error["msg"])
        bounds = _bounds(owner, error["loc"])
        if bounds and kind in ("int_type", "float_type"):  # say the range too: "an integer >= 0 (not ...)"
            noun, _, rest = must.partition(" (")
            must = f"{noun} {bounds}" + (f" ({rest}" if rest else "")
    return f"{key} = {error.get('input')!r}: must be {must}"


_SIGNS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _bounds(owner: type[BaseModel] | None, loc: tuple) -> str:
    """The field's numeric range as text (">= 0", "> 0 and <= 8"), from its annotation's constraints."""
    field = owner.model_fields.get(str(loc[-1])) if owner is not None and loc else None
    parts = []
    for item in getattr(field, "metadata", ()):
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                parts.append(f"{sign} {getattr(item, attr)}")
    return " and ".join(parts)


def _owner_of(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that holds the field at ``loc[:-1]`` (for listing allowed keys)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


class StrictModel(BaseModel):
    """Frozen, strict, no unknown keys; validation errors come out as one :class:`ConfigError`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            lines = [describe_error(e, _owner_of(type(self), e["loc"])) for e in exc.errors()]
            unknown = all(e["type"] == "extra_forbidden" for e in exc.errors())
            raise (UnknownKeyError if unknown else ConfigError)("\n".join(lines)) from None

    def replace(self, **changes: Any):
        """A validated copy with ``changes`` applied (the same rules as the constructor)."""
        return type(self)(**{**self.model_dump(), **changes})


NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]


