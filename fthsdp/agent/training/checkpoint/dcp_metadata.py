"""DCP's ``.metadata`` files: read (checked, restricted), merged, written.

``.metadata`` is a pickle: DCP's format. fthsdp unpickles only a
``.metadata`` whose checksum it recorded when the file was written, and
then with an unpickler that builds nothing but DCP's metadata classes and
the torch values they hold (sizes, dtypes, layouts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata


class MetadataError(ValueError):
    """A ``.metadata`` that is not what was recorded, or not DCP's."""


_ALSO = {
    ("torch.serialization", "_get_layout"),  # how torch pickles a layout: by its name
    ("pathlib", "PosixPath"),  # DCP records the folder it wrote to
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith("torch.distributed.checkpoint."):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)) or value is torch.Size:
                return value
        if (module, name) in _ALSO:
            return super().find_class(module, name)
        raise MetadataError(f"a checkpoint's .metadata refers to {module}.{name}, which DCP's metadata never holds")


def read(path: Path, sha256: str) -> Metadata:
    """The metadata at ``path``, if its bytes have checksum ``sha256``."""
    return parse(path.read_bytes(), sha256, path)


def parse(data: bytes, sha256: str, path: Path) -> Metadata:
    """The metadata in ``data`` (read from ``path``), if it has checksum ``sha256``."""
    if hashlib.sha256(data).hexdigest() != sha256:
        raise MetadataError(f"{path} does not match its recorded checksum")
    try:
        metadata = _Unpickler(io.BytesIO(data)).load()
    except MetadataError:
        raise
    except Exception as e:  # a corrupt pickle raises anything from EOFError to AttributeError
        raise MetadataError(f"{path} is not DCP metadata: {e}") from e
    if not isinstance(metadata, Metadata):
        raise MetadataError(f"{path} is not DCP metadata")
    return metadata


def merge(parts: dict[str, Metadata], planner_data: dict[str, tuple]) -> Metadata:
    """One metadata for the shares in ``parts`` (by their folder's name):
    every tensor's chunks from all of them, each chunk's file under its
    share's folder. Raises MetadataError unless the chunks tile every tensor."""
    tensors: dict[str, TensorStorageMetadata] = {}
    storage: dict = {}
    version = None
    for folder, md in sorted(parts.items()):
        version = md.version
        for name, item in md.state_dict_metadata.items():
            if not isinstance(item, TensorStorageMetadata):
                raise MetadataError(f"share {folder} holds {name!r} as bytes; fthsdp writes tensors only")
            whole = tensors.setdefault(name, TensorStorageMetadata(item.properties, item.size, []))
            if whole.size != item.size or whole.properties.dtype != item.properties.dtype:
                raise MetadataError(f"the shares disagree on the size or dtype of {name!r}")
            whole.chunks.extend(item.chunks)
        for index, info in (md.storage_data or {}).items():
            storage[index] = dataclasses.replace(info, relative_path=f"{folder}/{info.relative_path}")
    for name, whole in tensors.items():
        _check_tiling(name, whole)
    # Chunk index hints must point into the merged chunk lists.
    storage = _reindex(tensors, storage)
    return Metadata(state_dict_metadata=dict(tensors), planner_data=planner_data, storage_data=storage,
                    version=version)


def write(path: Path, metadata: Metadata) -> None:
    """Write ``metadata`` as DCP does: a pickle, renamed into place, durable."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(metadata, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_tiling(name: str, whole: TensorStorageMetadata) -> None:
    """Every element of the tensor is in exactly one chunk."""
    volume = 0
    for chunk in whole.chunks:
        volume += _volume(chunk.sizes)
        for end, size, offset in zip(map(int.__add__, chunk.offsets, chunk.sizes), whole.size, chunk.offsets,
                                     strict=True):
            if offset < 0 or end > size:
                raise MetadataError(f"a chunk of {name!r} lies outside the tensor")
    if volume != _volume(whole.size):
        raise MetadataError(f"the shares hold {volume} of the {_volume(whole.size)} elements of {name!r}")
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in whole.chunks]
    for i, (a_off, a_size) in enumerate(boxes):
        for b_off, b_size in boxes[i + 1 :]:
            if _volume(a_size) and _volume(b_size) and all(
                ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a_off, a_size, b_off, b_size, strict=True)
            ):
                raise MetadataError(f"two shares both hold part of {name!r}")


def _volume(sizes) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def _reindex(tensors: dict[str, TensorStorageMetadata], storage: dict) -> dict:
    out = {}
    for index, info in storage.items():
        chunks = tensors[index.fqn].chunks
        position = next(i for i, c in enumerate(chunks) if tuple(c.offsets) == tuple(index.offset or ()))
        out[dataclasses.replace(index, index=position)] = info
    return out
