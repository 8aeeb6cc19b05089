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

    def encode(x: object, path: str) -> object:
        if isinstance(x, torch.Tensor):
            tensors.append(local(x).detach())
            sharded.append(is_dtensor(x))
            return {"$t": len(tensors) - 1}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: encode(v, f"{path}.{k}") for k, v in x.items()}
            for k in x:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise StateCodecError(f"{path}: a dict key of type {type(k).__name__} cannot be transferred")
            return {"$d": [[k, encode(v, f"{path}.{k}")] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"$tuple": [encode(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [encode(v, f"{path}[{i}]") for i, v in enumerate(x)]
        raise StateCodecError(
            f"{path}: a {type(x).__name__} in the training state cannot be transferred "
            "(only tensors, numbers, strings, None, lists, tuples and dicts can)"
        )

    skeleton = json.dumps(encode(state, "state"), separators=(",", ":"))
    return skeleton, tensors, sharded


def unflatten(skeleton: str, tensors: list[torch.Tensor]) -> object:
    """The inverse of ``flatten`` (shards come back as plain local tensors)."""

    def decode(x: object) -> object:
        if isinstance(x, list):
            return [decode(v) for v in x]
        if isinstance(x, dict):
            if "$t" in x:
                index = x["$t"]
                if not isinstance(index, int) or not 0 <= index < len(tensors):
                    raise StateCodecError(f"the state refers to tensor {index!r}, but {len(tensors)} were sent")
                return tensors[index]
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
