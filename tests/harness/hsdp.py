"""HSDP replica groups: an agent running tests/hsdp_worker.py on several
FSDP2 shard ranks, and the shape the HSDP tests share."""

from __future__ import annotations

from tests.harness.processes import AgentProcess

REPLICAS, RANKS, HIDDEN = 2, 2, "32"


def hsdp_agent(tmp_path, address: str, k: int, *args: str, agent_args: tuple[str, ...] = ()) -> AgentProcess:
    a = AgentProcess(tmp_path, address, f"r{k}", k, REPLICAS, "--hidden", HIDDEN, "--wait-for", str(REPLICAS), *args,
                     agent_args=("--nproc", str(RANKS), *agent_args))
    a.argv[a.argv.index("tests.ftar_worker")] = "tests.hsdp_worker"
    return a
