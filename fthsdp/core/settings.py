"""Layered configuration: command-line flags over ``FTHSDP_*`` environment
variables over a TOML file over the dataclass defaults.

A config is a frozen dataclass whose fields each carry a docstring (the string
literal right after the field, read here with ``ast``); the same docstrings
become the ``--help`` text and the configuration reference, so there is one
source for both. Environment variables are read only by the entry point, which
passes them in: nothing here looks at ``os.environ``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import tomllib
import typing
from collections.abc import Mapping
from typing import Any

from fthsdp.core.errors import ConfigError
from fthsdp.core.every import parse_every

ENV_PREFIX = "FTHSDP_"
DURATION = {"kind": "duration"}
"""Field metadata marking a float of seconds that also accepts '500ms', '5s', '2m'."""
EVERY = {"kind": "every"}
"""Field metadata marking an ``Every``: a number of steps ('500') or a time ('30m'); fthsdp/core/every.py."""
LIST = {"kind": "list"}
"""Field metadata marking a tuple of strings given as a repeatable flag or a comma list."""

_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str | float | int, name: str = "duration") -> float:
    """'250ms', '5s', '1.5m', '2h' or a bare number of seconds."""
    if isinstance(text, bool):
        raise ConfigError(f"{name}: expected a duration such as 5s or 500ms, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION_RE.match(str(text))
    if not match:
        raise ConfigError(f"{name}: expected a duration such as 5s or 500ms, got {text!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring of every field of a dataclass, from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    definition = tree.body[0]
    assert isinstance(definition, ast.ClassDef), f"{cls!r} is not a class"
    body = definition.body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _kind(field: dataclasses.Field, cls: type) -> str:
    if field.metadata.get("kind"):
        return field.metadata["kind"]
    hint = typing.get_type_hints(cls)[field.name]
    if hint is bool:
        return "bool"
    if hint is int:
        return "int"
    if hint is float:
        return "float"
    return "str"


def _default(field: dataclasses.Field[Any]) -> Any:
    """The default of a settings field: its default, or what its factory makes."""
    if field.default is not dataclasses.MISSING:
        return field.default
    assert field.default_factory is not dataclasses.MISSING, f"setting {field.name} has no default"
    return field.default_factory()


def add_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per field; defaults are None so that only explicit flags win."""
    docs = field_docs(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        kind = _kind(field, cls)
        default = _default(field)
        shown = ",".join(default) if isinstance(default, tuple) else default
        help_text = f"{docs.get(field.name, '')} [env {env_name(field.name)}; default {shown!s}]"
        help_text = help_text.replace("%", "%%")
        name = flag_name(field.name)
        if kind == "bool":
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind == "list":
            parser.add_argument(name, action="append", default=None, metavar="VALUE", help=help_text)
        else:
            parser.add_argument(name, default=None, metavar=field.name.upper(), help=help_text)


def load_toml(path: str, section: str) -> dict[str, Any]:
    """Read a TOML config file: keys at the top level or under ``[section]``."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [{section}] must be a table")
    merged = {k: v for k, v in data.items() if not isinstance(v, dict)}
    merged.update(table)
    return {k.replace("-", "_"): v for k, v in merged.items()}


def _convert(value: Any, kind: str, name: str) -> Any:
    try:
        if kind == "duration":
            return parse_duration(value, name)
        if kind == "every":
            return parse_every(value, name)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "list":
            items = value if isinstance(value, (list, tuple)) else [value]
            out: list[str] = []
            for item in items:
                out.extend(part.strip() for part in str(item).split(",") if part.strip())
            return tuple(out)
        return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}: expected {'an integer' if kind == 'int' else 'a number'}, got {value!r}") from e


def resolve(
    cls: type,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    file_values: Mapping[str, Any] | None = None,
    file_name: str = "config file",
) -> Any:
    """Build ``cls`` from the layers; the first layer that sets a field wins."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key in file_values or {}:
        if key not in names:
            raise ConfigError(f"{file_name}: unknown setting {key!r}")
    values: dict[str, Any] = {}
    for name, field in names.items():
        kind = _kind(field, cls)
        if flags and flags.get(name) is not None:
            values[name] = _convert(flags[name], kind, flag_name(name))
        elif env and env.get(env_name(name)) not in (None, ""):
            values[name] = _convert(env[env_name(name)], kind, env_name(name))
        elif file_values and name in file_values:
            values[name] = _convert(file_values[name], kind, f"{file_name}: {name}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(str(e)) from e


def reference_markdown(cls: type, section: str) -> str:
    """A Markdown table of every setting: flag, environment variable, default, meaning."""
    docs = field_docs(cls)
    lines = [
        "| flag | environment | TOML key (`[" + section + "]`) | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in dataclasses.fields(cls):
        default = _default(field)
        shown = ",".join(default) if isinstance(default, tuple) else default
        doc = docs.get(field.name, "").replace("\n", " ").replace("|", "\\|")
        lines.append(
            f"| `{flag_name(field.name)}` | `{env_name(field.name)}` | `{field.name}` | `{shown}` | {doc} |"
        )
    return "\n".join(lines) + "\n"


__all__ = [
    "DURATION",
    "EVERY",
    "LIST",
    "add_flags",
    "field_docs",
    "load_toml",
    "parse_duration",
    "reference_markdown",
    "resolve",
]
