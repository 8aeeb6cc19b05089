"""A training state as JSON structure plus a list of tensors, and back.

The catch-up transport never pickles: a state such as
``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}`` is
split into a JSON *skeleton* (dicts, lists, numbers, strings, with
``{"$t": i}`` where tensor ``i`` was) and the tensors themselves, whose raw
bytes travel separately. Anything else in the state (an arbitrary object in
an optimizer's state, say) is refused with a clear error instead of being
serialised by some generic, unsafe means.

Encoding rules: a dict with only string keys (none starting with "$") stays a
JSON object; any other dict (the optimizer's integer parameter indices)
becomes ``{"$d": [[key, value], ...]}``; a tuple becomes ``{"$tuple": [...]}``
so that it comes back a tuple. FSDP2 DTensors are replaced by this rank's
local shard and marked ``sharded``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypeGuard

import torch

from fthsdp.core.errors import FthsdpError

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


class StateCodecError(FthsdpError):
    """The state holds something that cannot be sent without pickling."""


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    return isinstance(t, torch.Tensor) and hasattr(t, "to_local") and hasattr(t, "placements")


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) tensor; the tensor itself otherwise."""
    return t.to_local() if is_dtensor(t) else t


def flatten(state: object) -> tuple[str, list[torch.Tensor], list[bool]]:
    """Return (skeleton JSON, tensors, sharded flags) for ``state``."""
    tensors: list[torch.Tensor] = []
    sharded: list[bool] = []

    def mark(x: torch.Tensor, path: tuple[str | int, ...]) -> object:
        tensors.append(local(x).detach())
        sharded.append(is_dtensor(x))
        return {"$t": len(tensors) - 1}

    return _skeleton(state, mark), tensors, sharded


def flatten_named(state: object) -> tuple[str, dict[str, torch.Tensor], dict[str, tuple[str | int, ...]]]:
    """Return (skeleton JSON, tensors by name, each name's path) for ``state``:
    a tensor at ``state["optimizer"]["state"][0]["exp_avg"]`` is named
    ``optimizer.state.0.exp_avg`` (torch.distributed.checkpoint's names) and
    marked ``{"$k": name}`` in the skeleton. DTensors stay DTensors."""
    tensors: dict[str, torch.Tensor] = {}
    paths: dict[str, tuple[str | int, ...]] = {}

    def mark(x: torch.Tensor, path: tuple[str | int, ...]) -> object:
        name = ".".join(str(p) for p in path)
        if name in tensors:
            raise StateCodecError(f"two tensors of the state are both named {name!r}")
        tensors[name], paths[name] = x.detach(), path
        return {"$k": name}

    return _skeleton(state, mark), tensors, paths


def _skeleton(state: object, mark) -> str:
    def encode(x: object, path: tuple[str | int, ...]) -> object:
        where = "state" + "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in path)
        if isinstance(x, torch.Tensor):
            return mark(x, path)
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: encode(v, (*path, k)) for k, v in x.items()}
            for k in x:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise StateCodecError(f"{where}: a dict key of type {type(k).__name__} cannot be transferred")
            return {"$d": [[k, encode(v, (*path, k))] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"$tuple": [encode(v, (*path, i)) for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [encode(v, (*path, i)) for i, v in enumerate(x)]
        raise StateCodecError(
            f"{where}: a {type(x).__name__} in the training state cannot be transferred "
            "(only tensors, numbers, strings, None, lists, tuples and dicts can)"
        )

    return json.dumps(encode(state, ()), separators=(",", ":"))


def unflatten(skeleton: str, tensors: list[torch.Tensor] | dict[str, torch.Tensor]) -> object:
    """The inverse of ``flatten`` (shards come back as plain local tensors) or,
    with tensors by name, of ``flatten_named``."""

    def decode(x: object) -> object:
        if isinstance(x, list):
            return [decode(v) for v in x]
        if isinstance(x, dict):
            if "$t" in x:
                index = x["$t"]
                if not isinstance(tensors, list) or not isinstance(index, int) or not 0 <= index < len(tensors):
                    raise StateCodecError(f"the state refers to tensor {index!r}, but {len(tensors)} were sent")
                return tensors[index]
            if "$k" in x:
                if not isinstance(tensors, dict) or x["$k"] not in tensors:
                    raise StateCodecError(f"the state refers to tensor {x['$k']!r}, which is missing")
                return tensors[x["$k"]]
            if "$d" in x:
                return {k: decode(v) for k, v in x["$d"]}
            if "$tuple" in x:
                return tuple(decode(v) for v in x["$tuple"])
            return {k: decode(v) for k, v in x.items()}
        return x

    try:
        return decode(json.loads(skeleton))
    except (ValueError, TypeError) as e:
        raise StateCodecError(f"malformed state structure: {e}") from e


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise StateCodecError(f"unknown tensor dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
