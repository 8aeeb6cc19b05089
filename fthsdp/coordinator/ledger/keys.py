"""The store key layout of one job (documented in docs/coordinator.md, "State in etcd").

    PREFIX/jobs/JOB/quorum              Quorum        the current quorum; its id never decreases
    PREFIX/jobs/JOB/epoch               Epoch         bumped by each coordinator that takes the job over
    PREFIX/jobs/JOB/committed           CommittedStep the newest committed step (a lower bound) and the last give-up
    PREFIX/jobs/JOB/checkpoint          CheckpointList the newest complete checkpoints, newest first
    PREFIX/jobs/JOB/replicas/REPLICA    ReplicaRecord address, rank count, cordon and drain flags

All values are serialized protobuf messages from protos/fthsdp/v1. Every write
is a compare-and-swap on the key's revision.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class JobKeys:
    prefix: str
    job: str

    @property
    def root(self) -> str:
        return f"{self.prefix}/jobs/{self.job}/"

    @property
    def quorum(self) -> str:
        return self.root + "quorum"

    @property
    def epoch(self) -> str:
        return self.root + "epoch"

    @property
    def committed(self) -> str:
        return self.root + "committed"

    @property
    def checkpoint(self) -> str:
        return self.root + "checkpoint"

    @property
    def replicas(self) -> str:
        return self.root + "replicas/"

    def replica(self, replica_id: str) -> str:
        return self.replicas + replica_id
