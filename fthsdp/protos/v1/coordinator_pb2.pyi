from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_JOINING: _ClassVar[ReplicaState]
    REPLICA_STATE_HEALTHY: _ClassVar[ReplicaState]
    REPLICA_STATE_CATCHING_UP: _ClassVar[ReplicaState]
    REPLICA_STATE_FAILED: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINING: _ClassVar[ReplicaState]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_COMPUTE: _ClassVar[Phase]
    PHASE_ALLREDUCE: _ClassVar[Phase]
    PHASE_UPDATE: _ClassVar[Phase]
    PHASE_SECTION: _ClassVar[Phase]
    PHASE_STARTING: _ClassVar[Phase]

class FaultKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_KIND_UNSPECIFIED: _ClassVar[FaultKind]
    FAULT_KIND_KILL: _ClassVar[FaultKind]
    FAULT_KIND_HANG: _ClassVar[FaultKind]
    FAULT_KIND_SLOW: _ClassVar[FaultKind]

class AgentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_STATE_UNSPECIFIED: _ClassVar[AgentState]
    AGENT_STATE_STARTING: _ClassVar[AgentState]
    AGENT_STATE_RUNNING: _ClassVar[AgentState]
    AGENT_STATE_FAILED: _ClassVar[AgentState]
    AGENT_STATE_RESTARTING: _ClassVar[AgentState]
    AGENT_STATE_DRAINING: _ClassVar[AgentState]
    AGENT_STATE_SUCCEEDED: _ClassVar[AgentState]
    AGENT_STATE_GAVE_UP: _ClassVar[AgentState]
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_JOINING: ReplicaState
REPLICA_STATE_HEALTHY: ReplicaState
REPLICA_STATE_CATCHING_UP: ReplicaState
REPLICA_STATE_FAILED: ReplicaState
REPLICA_STATE_DRAINING: ReplicaState
PHASE_UNSPECIFIED: Phase
PHASE_COMPUTE: Phase
PHASE_ALLREDUCE: Phase
PHASE_UPDATE: Phase
PHASE_SECTION: Phase
PHASE_STARTING: Phase
FAULT_KIND_UNSPECIFIED: FaultKind
FAULT_KIND_KILL: FaultKind
FAULT_KIND_HANG: FaultKind
FAULT_KIND_SLOW: FaultKind
AGENT_STATE_UNSPECIFIED: AgentState
AGENT_STATE_STARTING: AgentState
AGENT_STATE_RUNNING: AgentState
AGENT_STATE_FAILED: AgentState
AGENT_STATE_RESTARTING: AgentState
AGENT_STATE_DRAINING: AgentState
AGENT_STATE_SUCCEEDED: AgentState
AGENT_STATE_GAVE_UP: AgentState

class QuorumMember(_message.Message):
    __slots__ = ("replica_id", "address", "world_size", "step", "joined_quorum_id")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    JOINED_QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    world_size: int
    step: int
    joined_quorum_id: int
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., world_size: _Optional[int] = ..., step: _Optional[int] = ..., joined_quorum_id: _Optional[int] = ...) -> None: ...

class Quorum(_message.Message):
    __slots__ = ("id", "members", "step", "created_unix_ms", "reason", "epoch", "member_count", "first_member_address", "last_drop_id", "generation")
    ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_MEMBER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_DROP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    id: int
    members: _containers.RepeatedCompositeFieldContainer[QuorumMember]
    step: int
    created_unix_ms: int
    reason: str
    epoch: int
    member_count: int
    first_member_address: str
    last_drop_id: int
    generation: int
    def __init__(self, id: _Optional[int] = ..., members: _Optional[_Iterable[_Union[QuorumMember, _Mapping]]] = ..., step: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ..., epoch: _Optional[int] = ..., member_count: _Optional[int] = ..., first_member_address: _Optional[str] = ..., last_drop_id: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class QuorumPlace(_message.Message):
    __slots__ = ("rank",)
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    def __init__(self, rank: _Optional[int] = ...) -> None: ...

class QuorumDelta(_message.Message):
    __slots__ = ("base_id", "added", "removed")
    BASE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    base_id: int
    added: _containers.RepeatedCompositeFieldContainer[QuorumMember]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, base_id: _Optional[int] = ..., added: _Optional[_Iterable[_Union[QuorumMember, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ...) -> None: ...

class CatchUp(_message.Message):
    __slots__ = ("source_replica_id", "source_address", "source_step", "source_catch_up_addresses", "source_catch_up_fingerprints")
    SOURCE_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_STEP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CATCH_UP_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CATCH_UP_FINGERPRINTS_FIELD_NUMBER: _ClassVar[int]
    source_replica_id: str
    source_address: str
    source_step: int
    source_catch_up_addresses: _containers.RepeatedScalarFieldContainer[str]
    source_catch_up_fingerprints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, source_replica_id: _Optional[str] = ..., source_address: _Optional[str] = ..., source_step: _Optional[int] = ..., source_catch_up_addresses: _Optional[_Iterable[str]] = ..., source_catch_up_fingerprints: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("job", "replica_id", "address", "world_size", "step", "quorum_id", "catch_up_addresses", "restart_count", "wait_for_replicas", "agent_ids", "incarnation", "catch_up_fingerprints")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FINGERPRINTS_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    address: str
    world_size: int
    step: int
    quorum_id: int
    catch_up_addresses: _containers.RepeatedScalarFieldContainer[str]
    restart_count: int
    wait_for_replicas: int
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    incarnation: str
    catch_up_fingerprints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., address: _Optional[str] = ..., world_size: _Optional[int] = ..., step: _Optional[int] = ..., quorum_id: _Optional[int] = ..., catch_up_addresses: _Optional[_Iterable[str]] = ..., restart_count: _Optional[int] = ..., wait_for_replicas: _Optional[int] = ..., agent_ids: _Optional[_Iterable[str]] = ..., incarnation: _Optional[str] = ..., catch_up_fingerprints: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session_id", "heartbeat_interval_s", "heartbeat_timeout_s", "quorum", "leader")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    quorum: Quorum
    leader: str
    def __init__(self, session_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., heartbeat_timeout_s: _Optional[float] = ..., quorum: _Optional[_Union[Quorum, _Mapping]] = ..., leader: _Optional[str] = ...) -> None: ...

class StepChecksum(_message.Message):
    __slots__ = ("step", "checksum", "inputs")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    checksum: str
    inputs: str
    def __init__(self, step: _Optional[int] = ..., checksum: _Optional[str] = ..., inputs: _Optional[str] = ...) -> None: ...

class PingBatch(_message.Message):
    __slots__ = ("pings", "job", "hosts", "seq", "digests")
    PINGS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    pings: _containers.RepeatedCompositeFieldContainer[HeartbeatRequest]
    job: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    seq: int
    digests: _containers.RepeatedCompositeFieldContainer[RankDigest]
    def __init__(self, pings: _Optional[_Iterable[_Union[HeartbeatRequest, _Mapping]]] = ..., job: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., seq: _Optional[int] = ..., digests: _Optional[_Iterable[_Union[RankDigest, _Mapping]]] = ...) -> None: ...

class RankDigest(_message.Message):
    __slots__ = ("job", "replica_id", "incarnation", "ranks", "phases", "phase_ages_s", "steps", "step_times_s", "compute_times_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    PHASE_AGES_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMES_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TIMES_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    incarnation: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    phases: _containers.RepeatedScalarFieldContainer[Phase]
    phase_ages_s: _containers.RepeatedScalarFieldContainer[float]
    steps: _containers.RepeatedScalarFieldContainer[int]
    step_times_s: _containers.RepeatedScalarFieldContainer[float]
    compute_times_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., phases: _Optional[_Iterable[_Union[Phase, str]]] = ..., phase_ages_s: _Optional[_Iterable[float]] = ..., steps: _Optional[_Iterable[int]] = ..., step_times_s: _Optional[_Iterable[float]] = ..., compute_times_s: _Optional[_Iterable[float]] = ...) -> None: ...

class GroupPingsReply(_message.Message):
    __slots__ = ("forwarded", "refused")
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    forwarded: int
    refused: PingRefused
    def __init__(self, forwarded: _Optional[int] = ..., refused: _Optional[_Union[PingRefused, _Mapping]] = ...) -> None: ...

class PingRefused(_message.Message):
    __slots__ = ("replica_id", "shard_rank", "incarnation", "code", "details")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_RANK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    shard_rank: int
    incarnation: str
    code: int
    details: str
    def __init__(self, replica_id: _Optional[str] = ..., shard_rank: _Optional[int] = ..., incarnation: _Optional[str] = ..., code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job", "replica_id", "session_id", "step", "ready", "state_checksum", "checksum_step", "recent_checksums", "shard_rank", "catch_up_bytes", "catch_up_total_bytes", "catching_up", "ack", "progress", "checkpoint", "refused_checkpoint", "refused_checkpoint_reason", "wait_for_replicas", "left", "lease_seq", "incarnation", "local_only")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_STEP_FIELD_NUMBER: _ClassVar[int]
    RECENT_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    SHARD_RANK_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_BYTES_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CATCHING_UP_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_CHECKPOINT_REASON_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    LEASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    session_id: str
    step: int
    ready: bool
    state_checksum: str
    checksum_step: int
    recent_checksums: _containers.RepeatedCompositeFieldContainer[StepChecksum]
    shard_rank: int
    catch_up_bytes: int
    catch_up_total_bytes: int
    catching_up: bool
    ack: bool
    progress: Progress
    checkpoint: CheckpointRecord
    refused_checkpoint: str
    refused_checkpoint_reason: str
    wait_for_replicas: int
    left: bool
    lease_seq: int
    incarnation: str
    local_only: bool
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., session_id: _Optional[str] = ..., step: _Optional[int] = ..., ready: _Optional[bool] = ..., state_checksum: _Optional[str] = ..., checksum_step: _Optional[int] = ..., recent_checksums: _Optional[_Iterable[_Union[StepChecksum, _Mapping]]] = ..., shard_rank: _Optional[int] = ..., catch_up_bytes: _Optional[int] = ..., catch_up_total_bytes: _Optional[int] = ..., catching_up: _Optional[bool] = ..., ack: _Optional[bool] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointRecord, _Mapping]] = ..., refused_checkpoint: _Optional[str] = ..., refused_checkpoint_reason: _Optional[str] = ..., wait_for_replicas: _Optional[int] = ..., left: _Optional[bool] = ..., lease_seq: _Optional[int] = ..., incarnation: _Optional[str] = ..., local_only: _Optional[bool] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("phase", "phase_age_s", "step", "step_time_s", "compute_time_s", "section", "section_timeout_s")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    SECTION_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    phase_age_s: float
    step: int
    step_time_s: float
    compute_time_s: float
    section: str
    section_timeout_s: float
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., phase_age_s: _Optional[float] = ..., step: _Optional[int] = ..., step_time_s: _Optional[float] = ..., compute_time_s: _Optional[float] = ..., section: _Optional[str] = ..., section_timeout_s: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("quorum_id", "drain_requested", "lease_s", "lease_seq")
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    quorum_id: int
    drain_requested: bool
    lease_s: float
    lease_seq: int
    def __init__(self, quorum_id: _Optional[int] = ..., drain_requested: _Optional[bool] = ..., lease_s: _Optional[float] = ..., lease_seq: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("register", "heartbeat")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    register: RegisterRequest
    heartbeat: HeartbeatRequest
    def __init__(self, register: _Optional[_Union[RegisterRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("registered", "watch", "ack")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    registered: RegisterResponse
    watch: WatchEvent
    ack: HeartbeatResponse
    def __init__(self, registered: _Optional[_Union[RegisterResponse, _Mapping]] = ..., watch: _Optional[_Union[WatchEvent, _Mapping]] = ..., ack: _Optional[_Union[HeartbeatResponse, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job", "replica_id", "session_id", "member_list")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_LIST_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    session_id: str
    member_list: bool
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., session_id: _Optional[str] = ..., member_list: _Optional[bool] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("quorum", "catch_up", "drain_requested", "leader", "reason", "heartbeat_interval_s", "delta", "place", "state_lost_step", "hang", "hang_limit_s", "finished", "divergence", "probe", "unreachable", "injections", "restore", "place_withheld")
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    STATE_LOST_STEP_FIELD_NUMBER: _ClassVar[int]
    HANG_FIELD_NUMBER: _ClassVar[int]
    HANG_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    DIVERGENCE_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    INJECTIONS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    PLACE_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    quorum: Quorum
    catch_up: CatchUp
    drain_requested: bool
    leader: str
    reason: str
    heartbeat_interval_s: float
    delta: QuorumDelta
    place: QuorumPlace
    state_lost_step: int
    hang: HangNotice
    hang_limit_s: float
    finished: JobFinished
    divergence: Divergence
    probe: ReachProbe
    unreachable: str
    injections: _containers.RepeatedCompositeFieldContainer[FaultInjection]
    restore: CheckpointRecord
    place_withheld: bool
    def __init__(self, quorum: _Optional[_Union[Quorum, _Mapping]] = ..., catch_up: _Optional[_Union[CatchUp, _Mapping]] = ..., drain_requested: _Optional[bool] = ..., leader: _Optional[str] = ..., reason: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., delta: _Optional[_Union[QuorumDelta, _Mapping]] = ..., place: _Optional[_Union[QuorumPlace, _Mapping]] = ..., state_lost_step: _Optional[int] = ..., hang: _Optional[_Union[HangNotice, _Mapping]] = ..., hang_limit_s: _Optional[float] = ..., finished: _Optional[_Union[JobFinished, _Mapping]] = ..., divergence: _Optional[_Union[Divergence, _Mapping]] = ..., probe: _Optional[_Union[ReachProbe, _Mapping]] = ..., unreachable: _Optional[str] = ..., injections: _Optional[_Iterable[_Union[FaultInjection, _Mapping]]] = ..., restore: _Optional[_Union[CheckpointRecord, _Mapping]] = ..., place_withheld: _Optional[bool] = ...) -> None: ...

class FaultInjection(_message.Message):
    __slots__ = ("id", "replica_id", "kind", "seconds", "steps", "restart_count", "requested_by", "peer", "unix_ms", "step")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    id: int
    replica_id: str
    kind: FaultKind
    seconds: float
    steps: int
    restart_count: int
    requested_by: str
    peer: str
    unix_ms: int
    step: int
    def __init__(self, id: _Optional[int] = ..., replica_id: _Optional[str] = ..., kind: _Optional[_Union[FaultKind, str]] = ..., seconds: _Optional[float] = ..., steps: _Optional[int] = ..., restart_count: _Optional[int] = ..., requested_by: _Optional[str] = ..., peer: _Optional[str] = ..., unix_ms: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class InjectRequest(_message.Message):
    __slots__ = ("job", "replica_id", "kind", "seconds", "steps", "requested_by")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    kind: FaultKind
    seconds: float
    steps: int
    requested_by: str
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., kind: _Optional[_Union[FaultKind, str]] = ..., seconds: _Optional[float] = ..., steps: _Optional[int] = ..., requested_by: _Optional[str] = ...) -> None: ...

class InjectResponse(_message.Message):
    __slots__ = ("injection",)
    INJECTION_FIELD_NUMBER: _ClassVar[int]
    injection: FaultInjection
    def __init__(self, injection: _Optional[_Union[FaultInjection, _Mapping]] = ...) -> None: ...

class ReachProbe(_message.Message):
    __slots__ = ("id", "targets")
    ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    id: int
    targets: _containers.RepeatedCompositeFieldContainer[ReachTarget]
    def __init__(self, id: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[ReachTarget, _Mapping]]] = ...) -> None: ...

class ReachTarget(_message.Message):
    __slots__ = ("replica_id", "addresses")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class ReachReportRequest(_message.Message):
    __slots__ = ("job", "replica_id", "session_id", "shard_rank", "probe_id", "reached", "unreached", "incarnation")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_RANK_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    UNREACHED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    session_id: str
    shard_rank: int
    probe_id: int
    reached: _containers.RepeatedScalarFieldContainer[str]
    unreached: _containers.RepeatedScalarFieldContainer[str]
    incarnation: str
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., session_id: _Optional[str] = ..., shard_rank: _Optional[int] = ..., probe_id: _Optional[int] = ..., reached: _Optional[_Iterable[str]] = ..., unreached: _Optional[_Iterable[str]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class ReachReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobFinished(_message.Message):
    __slots__ = ("step", "unix_ms", "quorum_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    unix_ms: int
    quorum_id: int
    def __init__(self, step: _Optional[int] = ..., unix_ms: _Optional[int] = ..., quorum_id: _Optional[int] = ...) -> None: ...

class Divergence(_message.Message):
    __slots__ = ("reason", "step", "restart_count", "strikes", "give_up")
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    STRIKES_FIELD_NUMBER: _ClassVar[int]
    GIVE_UP_FIELD_NUMBER: _ClassVar[int]
    reason: str
    step: int
    restart_count: int
    strikes: int
    give_up: bool
    def __init__(self, reason: _Optional[str] = ..., step: _Optional[int] = ..., restart_count: _Optional[int] = ..., strikes: _Optional[int] = ..., give_up: _Optional[bool] = ...) -> None: ...

class HangNotice(_message.Message):
    __slots__ = ("reason", "restart_count", "step")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    reason: str
    restart_count: int
    step: int
    def __init__(self, reason: _Optional[str] = ..., restart_count: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("job", "replica_id", "session_id", "reason", "failed", "step")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    session_id: str
    reason: str
    failed: bool
    step: int
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., session_id: _Optional[str] = ..., reason: _Optional[str] = ..., failed: _Optional[bool] = ..., step: _Optional[int] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentEventRequest(_message.Message):
    __slots__ = ("job", "replica_id", "state", "node_rank", "restart_count", "detail", "agent_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    state: AgentState
    node_rank: int
    restart_count: int
    detail: str
    agent_id: str
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., state: _Optional[_Union[AgentState, str]] = ..., node_rank: _Optional[int] = ..., restart_count: _Optional[int] = ..., detail: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class AgentEventResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "state", "step", "heartbeat_age_s", "address", "state_checksum", "checksum_step", "world_size", "cordoned", "catch_up_source", "agent_state", "restart_count", "agent_detail", "checksum_mismatch_step", "catch_up_bytes", "catch_up_total_bytes", "phase", "phase_age_s", "step_time_s", "compute_time_s", "straggler_score", "hang_reason", "mismatch_reason", "mismatch_strikes", "unreachable")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_SOURCE_FIELD_NUMBER: _ClassVar[int]
    AGENT_STATE_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    AGENT_DETAIL_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_MISMATCH_STEP_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_BYTES_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_SCORE_FIELD_NUMBER: _ClassVar[int]
    HANG_REASON_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_REASON_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_STRIKES_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: ReplicaState
    step: int
    heartbeat_age_s: float
    address: str
    state_checksum: str
    checksum_step: int
    world_size: int
    cordoned: bool
    catch_up_source: str
    agent_state: AgentState
    restart_count: int
    agent_detail: str
    checksum_mismatch_step: int
    catch_up_bytes: int
    catch_up_total_bytes: int
    phase: Phase
    phase_age_s: float
    step_time_s: float
    compute_time_s: float
    straggler_score: float
    hang_reason: str
    mismatch_reason: str
    mismatch_strikes: int
    unreachable: str
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., step: _Optional[int] = ..., heartbeat_age_s: _Optional[float] = ..., address: _Optional[str] = ..., state_checksum: _Optional[str] = ..., checksum_step: _Optional[int] = ..., world_size: _Optional[int] = ..., cordoned: _Optional[bool] = ..., catch_up_source: _Optional[str] = ..., agent_state: _Optional[_Union[AgentState, str]] = ..., restart_count: _Optional[int] = ..., agent_detail: _Optional[str] = ..., checksum_mismatch_step: _Optional[int] = ..., catch_up_bytes: _Optional[int] = ..., catch_up_total_bytes: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ..., phase_age_s: _Optional[float] = ..., step_time_s: _Optional[float] = ..., compute_time_s: _Optional[float] = ..., straggler_score: _Optional[float] = ..., hang_reason: _Optional[str] = ..., mismatch_reason: _Optional[str] = ..., mismatch_strikes: _Optional[int] = ..., unreachable: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("job", "leader", "epoch", "quorum", "replicas", "reason", "jobs", "follower", "committed_step", "state_lost_step", "state_lost_reason", "last_give_up", "hang_limit_s", "median_step_time_s", "finished", "injections", "checkpoint", "last_restore", "groups", "spares")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_LOST_STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_LOST_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_GIVE_UP_FIELD_NUMBER: _ClassVar[int]
    HANG_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    INJECTIONS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_RESTORE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    job: str
    leader: str
    epoch: int
    quorum: Quorum
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    reason: str
    jobs: _containers.RepeatedScalarFieldContainer[str]
    follower: bool
    committed_step: int
    state_lost_step: int
    state_lost_reason: str
    last_give_up: GiveUp
    hang_limit_s: float
    median_step_time_s: float
    finished: JobFinished
    injections: _containers.RepeatedCompositeFieldContainer[FaultInjection]
    checkpoint: CheckpointRecord
    last_restore: Restore
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    spares: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., leader: _Optional[str] = ..., epoch: _Optional[int] = ..., quorum: _Optional[_Union[Quorum, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., reason: _Optional[str] = ..., jobs: _Optional[_Iterable[str]] = ..., follower: _Optional[bool] = ..., committed_step: _Optional[int] = ..., state_lost_step: _Optional[int] = ..., state_lost_reason: _Optional[str] = ..., last_give_up: _Optional[_Union[GiveUp, _Mapping]] = ..., hang_limit_s: _Optional[float] = ..., median_step_time_s: _Optional[float] = ..., finished: _Optional[_Union[JobFinished, _Mapping]] = ..., injections: _Optional[_Iterable[_Union[FaultInjection, _Mapping]]] = ..., checkpoint: _Optional[_Union[CheckpointRecord, _Mapping]] = ..., last_restore: _Optional[_Union[Restore, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., spares: _Optional[_Iterable[str]] = ...) -> None: ...

class HostStatus(_message.Message):
    __slots__ = ("host_id", "node_rank", "state", "lost_for_s")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOST_FOR_S_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    node_rank: int
    state: str
    lost_for_s: float
    def __init__(self, host_id: _Optional[str] = ..., node_rank: _Optional[int] = ..., state: _Optional[str] = ..., lost_for_s: _Optional[float] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("replica_id", "round", "complete", "reason", "hosts", "nnodes")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    round: int
    complete: bool
    reason: str
    hosts: _containers.RepeatedCompositeFieldContainer[HostStatus]
    nnodes: int
    def __init__(self, replica_id: _Optional[str] = ..., round: _Optional[int] = ..., complete: _Optional[bool] = ..., reason: _Optional[str] = ..., hosts: _Optional[_Iterable[_Union[HostStatus, _Mapping]]] = ..., nnodes: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("job", "replica_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("job", "replica_id", "cordoned")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    job: str
    replica_id: str
    cordoned: bool
    def __init__(self, job: _Optional[str] = ..., replica_id: _Optional[str] = ..., cordoned: _Optional[bool] = ...) -> None: ...

class CordonResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GiveUpStateRequest(_message.Message):
    __slots__ = ("job", "step", "requested_by", "resume_step")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    RESUME_STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    requested_by: str
    resume_step: int
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., requested_by: _Optional[str] = ..., resume_step: _Optional[int] = ...) -> None: ...

class ReopenJobRequest(_message.Message):
    __slots__ = ("job", "step", "requested_by")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    requested_by: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., requested_by: _Optional[str] = ...) -> None: ...

class ReopenJobResponse(_message.Message):
    __slots__ = ("finished",)
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    finished: JobFinished
    def __init__(self, finished: _Optional[_Union[JobFinished, _Mapping]] = ...) -> None: ...

class RestoreCheckpointRequest(_message.Message):
    __slots__ = ("job", "step", "requested_by")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    requested_by: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., requested_by: _Optional[str] = ...) -> None: ...

class RestoreCheckpointResponse(_message.Message):
    __slots__ = ("restore",)
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    restore: Restore
    def __init__(self, restore: _Optional[_Union[Restore, _Mapping]] = ...) -> None: ...

class GiveUpStateResponse(_message.Message):
    __slots__ = ("give_up",)
    GIVE_UP_FIELD_NUMBER: _ClassVar[int]
    give_up: GiveUp
    def __init__(self, give_up: _Optional[_Union[GiveUp, _Mapping]] = ...) -> None: ...

class HostHello(_message.Message):
    __slots__ = ("job", "host_id", "replica_id", "replica_rank", "nnodes", "nproc", "rendezvous_timeout", "round", "node_rank", "store", "num_replicas", "incarnation", "address", "hosts", "hosts_round")
    JOB_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_RANK_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    NPROC_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_ROUND_FIELD_NUMBER: _ClassVar[int]
    job: str
    host_id: str
    replica_id: str
    replica_rank: int
    nnodes: int
    nproc: int
    rendezvous_timeout: float
    round: int
    node_rank: int
    store: str
    num_replicas: int
    incarnation: str
    address: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    hosts_round: int
    def __init__(self, job: _Optional[str] = ..., host_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., replica_rank: _Optional[int] = ..., nnodes: _Optional[int] = ..., nproc: _Optional[int] = ..., rendezvous_timeout: _Optional[float] = ..., round: _Optional[int] = ..., node_rank: _Optional[int] = ..., store: _Optional[str] = ..., num_replicas: _Optional[int] = ..., incarnation: _Optional[str] = ..., address: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., hosts_round: _Optional[int] = ...) -> None: ...

class HostJoin(_message.Message):
    __slots__ = ("round", "store", "pings", "pings_cert")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    PINGS_FIELD_NUMBER: _ClassVar[int]
    PINGS_CERT_FIELD_NUMBER: _ClassVar[int]
    round: int
    store: str
    pings: str
    pings_cert: bytes
    def __init__(self, round: _Optional[int] = ..., store: _Optional[str] = ..., pings: _Optional[str] = ..., pings_cert: _Optional[bytes] = ...) -> None: ...

class HostFailure(_message.Message):
    __slots__ = ("round", "reason")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round: int
    reason: str
    def __init__(self, round: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class HostLeave(_message.Message):
    __slots__ = ("round", "reason")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round: int
    reason: str
    def __init__(self, round: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class HostRequest(_message.Message):
    __slots__ = ("hello", "join", "failure", "leave", "heartbeat")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    hello: HostHello
    join: HostJoin
    failure: HostFailure
    leave: HostLeave
    heartbeat: bool
    def __init__(self, hello: _Optional[_Union[HostHello, _Mapping]] = ..., join: _Optional[_Union[HostJoin, _Mapping]] = ..., failure: _Optional[_Union[HostFailure, _Mapping]] = ..., leave: _Optional[_Union[HostLeave, _Mapping]] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class HostWelcome(_message.Message):
    __slots__ = ("host_id", "heartbeat_interval", "round", "beats_in_batches")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BEATS_IN_BATCHES_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    heartbeat_interval: float
    round: int
    beats_in_batches: bool
    def __init__(self, host_id: _Optional[str] = ..., heartbeat_interval: _Optional[float] = ..., round: _Optional[int] = ..., beats_in_batches: _Optional[bool] = ...) -> None: ...

class RoundComplete(_message.Message):
    __slots__ = ("round", "node_rank", "store", "hosts", "pings", "pings_cert")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    PINGS_FIELD_NUMBER: _ClassVar[int]
    PINGS_CERT_FIELD_NUMBER: _ClassVar[int]
    round: int
    node_rank: int
    store: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    pings: str
    pings_cert: bytes
    def __init__(self, round: _Optional[int] = ..., node_rank: _Optional[int] = ..., store: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., pings: _Optional[str] = ..., pings_cert: _Optional[bytes] = ...) -> None: ...

class RoundEnded(_message.Message):
    __slots__ = ("round", "reason")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round: int
    reason: str
    def __init__(self, round: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SpareAdopted(_message.Message):
    __slots__ = ("replica_id", "replica_rank", "round", "num_replicas", "hosts")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    replica_rank: int
    round: int
    num_replicas: int
    hosts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., replica_rank: _Optional[int] = ..., round: _Optional[int] = ..., num_replicas: _Optional[int] = ..., hosts: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupRoster(_message.Message):
    __slots__ = ("round", "hosts")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    round: int
    hosts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., hosts: _Optional[_Iterable[str]] = ...) -> None: ...

class HostPush(_message.Message):
    __slots__ = ("welcome", "joined", "complete", "ended", "adopted", "gave_up", "refused", "released", "roster", "heartbeat_interval")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    GAVE_UP_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    welcome: HostWelcome
    joined: int
    complete: RoundComplete
    ended: RoundEnded
    adopted: SpareAdopted
    gave_up: str
    refused: str
    released: str
    roster: GroupRoster
    heartbeat_interval: float
    def __init__(self, welcome: _Optional[_Union[HostWelcome, _Mapping]] = ..., joined: _Optional[int] = ..., complete: _Optional[_Union[RoundComplete, _Mapping]] = ..., ended: _Optional[_Union[RoundEnded, _Mapping]] = ..., adopted: _Optional[_Union[SpareAdopted, _Mapping]] = ..., gave_up: _Optional[str] = ..., refused: _Optional[str] = ..., released: _Optional[str] = ..., roster: _Optional[_Union[GroupRoster, _Mapping]] = ..., heartbeat_interval: _Optional[float] = ...) -> None: ...

class ReplicaRecord(_message.Message):
    __slots__ = ("replica_id", "address", "world_size", "cordoned", "drain_requested", "registered_unix_ms", "unreachable", "agent_ids", "restart_count")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    world_size: int
    cordoned: bool
    drain_requested: bool
    registered_unix_ms: int
    unreachable: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    restart_count: int
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., world_size: _Optional[int] = ..., cordoned: _Optional[bool] = ..., drain_requested: _Optional[bool] = ..., registered_unix_ms: _Optional[int] = ..., unreachable: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., restart_count: _Optional[int] = ...) -> None: ...

class Epoch(_message.Message):
    __slots__ = ("epoch", "coordinator", "started_unix_ms")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    coordinator: str
    started_unix_ms: int
    def __init__(self, epoch: _Optional[int] = ..., coordinator: _Optional[str] = ..., started_unix_ms: _Optional[int] = ...) -> None: ...

class GiveUp(_message.Message):
    __slots__ = ("step", "unix_ms", "requested_by", "peer", "coordinator", "epoch", "quorum_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    unix_ms: int
    requested_by: str
    peer: str
    coordinator: str
    epoch: int
    quorum_id: int
    def __init__(self, step: _Optional[int] = ..., unix_ms: _Optional[int] = ..., requested_by: _Optional[str] = ..., peer: _Optional[str] = ..., coordinator: _Optional[str] = ..., epoch: _Optional[int] = ..., quorum_id: _Optional[int] = ...) -> None: ...

class CommittedStep(_message.Message):
    __slots__ = ("step", "quorum_id", "updated_unix_ms", "last_give_up", "finished", "last_restore", "generation", "lineage_from")
    STEP_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_GIVE_UP_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LAST_RESTORE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FROM_FIELD_NUMBER: _ClassVar[int]
    step: int
    quorum_id: int
    updated_unix_ms: int
    last_give_up: GiveUp
    finished: JobFinished
    last_restore: Restore
    generation: int
    lineage_from: int
    def __init__(self, step: _Optional[int] = ..., quorum_id: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., last_give_up: _Optional[_Union[GiveUp, _Mapping]] = ..., finished: _Optional[_Union[JobFinished, _Mapping]] = ..., last_restore: _Optional[_Union[Restore, _Mapping]] = ..., generation: _Optional[int] = ..., lineage_from: _Optional[int] = ...) -> None: ...

class CheckpointRecord(_message.Message):
    __slots__ = ("step", "path", "digest", "quorum_id", "shares", "bytes", "sealed_unix_ms", "sealed_by", "state_checksum", "kept", "generation")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SEALED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SEALED_BY_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    step: int
    path: str
    digest: str
    quorum_id: int
    shares: int
    bytes: int
    sealed_unix_ms: int
    sealed_by: str
    state_checksum: str
    kept: int
    generation: int
    def __init__(self, step: _Optional[int] = ..., path: _Optional[str] = ..., digest: _Optional[str] = ..., quorum_id: _Optional[int] = ..., shares: _Optional[int] = ..., bytes: _Optional[int] = ..., sealed_unix_ms: _Optional[int] = ..., sealed_by: _Optional[str] = ..., state_checksum: _Optional[str] = ..., kept: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class CheckpointList(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointRecord]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointRecord, _Mapping]]] = ...) -> None: ...

class Restore(_message.Message):
    __slots__ = ("checkpoint", "lost_step", "unix_ms", "requested_by")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LOST_STEP_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointRecord
    lost_step: int
    unix_ms: int
    requested_by: str
    def __init__(self, checkpoint: _Optional[_Union[CheckpointRecord, _Mapping]] = ..., lost_step: _Optional[int] = ..., unix_ms: _Optional[int] = ..., requested_by: _Optional[str] = ...) -> None: ...
