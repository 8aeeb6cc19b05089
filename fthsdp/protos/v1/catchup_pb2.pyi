from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorMeta(_message.Message):
    __slots__ = ("dtype", "shape", "offset", "nbytes", "sharded")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SHARDED_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    sharded: bool
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ..., sharded: _Optional[bool] = ...) -> None: ...

class SnapshotManifest(_message.Message):
    __slots__ = ("step", "replica_id", "shard_rank", "skeleton_json", "tensors", "total_bytes", "chunk_bytes", "chunk_crc32", "structure_hash", "chunk_xxh3")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_RANK_FIELD_NUMBER: _ClassVar[int]
    SKELETON_JSON_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CRC32_FIELD_NUMBER: _ClassVar[int]
    STRUCTURE_HASH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_XXH3_FIELD_NUMBER: _ClassVar[int]
    step: int
    replica_id: str
    shard_rank: int
    skeleton_json: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    total_bytes: int
    chunk_bytes: int
    chunk_crc32: _containers.RepeatedScalarFieldContainer[int]
    structure_hash: int
    chunk_xxh3: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, step: _Optional[int] = ..., replica_id: _Optional[str] = ..., shard_rank: _Optional[int] = ..., skeleton_json: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., chunk_crc32: _Optional[_Iterable[int]] = ..., structure_hash: _Optional[int] = ..., chunk_xxh3: _Optional[_Iterable[int]] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("step", "contributors", "quorum_id", "hyperparams_json", "dtype", "numel", "crc32", "checksum_after", "inputs", "part_checksums_json", "xxh3")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_AFTER_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    PART_CHECKSUMS_JSON_FIELD_NUMBER: _ClassVar[int]
    XXH3_FIELD_NUMBER: _ClassVar[int]
    step: int
    contributors: int
    quorum_id: int
    hyperparams_json: str
    dtype: str
    numel: int
    crc32: int
    checksum_after: str
    inputs: StateBlob
    part_checksums_json: str
    xxh3: int
    def __init__(self, step: _Optional[int] = ..., contributors: _Optional[int] = ..., quorum_id: _Optional[int] = ..., hyperparams_json: _Optional[str] = ..., dtype: _Optional[str] = ..., numel: _Optional[int] = ..., crc32: _Optional[int] = ..., checksum_after: _Optional[str] = ..., inputs: _Optional[_Union[StateBlob, _Mapping]] = ..., part_checksums_json: _Optional[str] = ..., xxh3: _Optional[int] = ...) -> None: ...

class StateBlob(_message.Message):
    __slots__ = ("skeleton_json", "tensors", "data")
    SKELETON_JSON_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    skeleton_json: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    data: bytes
    def __init__(self, skeleton_json: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., data: _Optional[bytes] = ...) -> None: ...

class LogBatch(_message.Message):
    __slots__ = ("entries", "head_step", "oldest_step")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HEAD_STEP_FIELD_NUMBER: _ClassVar[int]
    OLDEST_STEP_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    head_step: int
    oldest_step: int
    def __init__(self, entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., head_step: _Optional[int] = ..., oldest_step: _Optional[int] = ...) -> None: ...
