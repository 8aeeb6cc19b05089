"""Starting, signalling and describing the rank processes of one node.

The pure parts (``rank_environments``, ``describe_exit``) need no processes,
so the launch contract is tested without starting anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence

from fthsdp.agent.node.config import AgentConfig
from fthsdp.core.child_process import die_with_parent_prefix

log = logging.getLogger("fthsdp.agent")


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick on the
    wildcard address, so it is free on every local address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rank_environments(
    config: AgentConfig, restart_count: int, master_port: int, base: Mapping[str, str], agent_id: str = "",
    relay: str = "",
) -> list[dict[str, str]]:
    """The environment of each local rank, in local-rank order.

    torchrun's contract for the replica group's own (intra-replica) world, so
    that ``torch.distributed.init_process_group("env://")`` works unchanged,
    plus FTHSDP_* for the fault-tolerant layer above it. ``base`` (the agent's
    own environment) is passed through underneath. ``agent_id``: the id the
    agent drew at start, which binds its reports to the processes it started
    (``RegisterRequest.agent_id``). ``relay``: the agent's local relay
    (fthsdp/agent/node/relay/), which the ranks reach the coordinator
    through; empty: the coordinators themselves.
    """
    shared = {
        "WORLD_SIZE": str(config.nnodes * config.nproc),
        "LOCAL_WORLD_SIZE": str(config.nproc),
        "GROUP_RANK": str(config.node_rank),
        "GROUP_WORLD_SIZE": str(config.nnodes),
        "MASTER_ADDR": config.master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        "FTHSDP_COORDINATOR": relay or ",".join(config.coordinators),
        "FTHSDP_JOB": config.job,
        "FTHSDP_REPLICA_ID": config.replica_id,
        "FTHSDP_REPLICA_RANK": str(config.replica_rank),
        "FTHSDP_NUM_REPLICAS": str(config.num_replicas),
        "FTHSDP_BUCKET_CAP_MB": f"{config.bucket_cap_mb:g}",
        "FTHSDP_CROSS_REPLICA_BACKEND": config.cross_replica_backend,
        "FTHSDP_CROSS_REPLICA_GROUPS": config.cross_replica_groups,
        "FTHSDP_CATCH_UP_TRANSPORT": config.catch_up_transport,
        "FTHSDP_RESTART_COUNT": str(restart_count),
        **({"FTHSDP_AGENT_ID": agent_id} if agent_id else {}),
        **({"FTHSDP_TOKEN_FILE": config.token_file} if config.token_file else {}),
        **({"FTHSDP_CHECKPOINT_DIR": config.checkpoint_dir,
            "FTHSDP_CHECKPOINT_EVERY": str(config.checkpoint_every),
            "FTHSDP_CHECKPOINT_KEEP": str(config.checkpoint_keep),
            "FTHSDP_RESUME": "1" if config.resume else "0"} if config.checkpoint_dir else {}),
        **{
            f"FTHSDP_TLS_{n.upper()}": getattr(config, f"tls_{n}")
            for n in ("ca", "cert", "key")
            if getattr(config, f"tls_{n}")
        },
    }
    return [
        {
            **base,
            **shared,
            "RANK": str(config.node_rank * config.nproc + local_rank),
            "LOCAL_RANK": str(local_rank),
        }
        for local_rank in range(config.nproc)
    ]


def describe_exit(returncode: int) -> str:
    """'code 3' or 'signal SIGKILL' for a Popen return code ("exited with ...")."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


class Rank:
    """One rank process, the leader of its own process group.

    ``start_new_session`` (not ``preexec_fn``, which can deadlock a parent
    that runs gRPC threads) makes the rank lead a new session and process
    group, so signals reach the rank's whole tree (data-loader workers,
    compile workers) and a Ctrl-C in the agent's terminal reaches only the
    agent, which then drains the ranks in order.
    """

    def __init__(
        self, local_rank: int, command: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> None:
        self.local_rank = local_rank
        if shutil.which(command[0], path=env.get("PATH")) is None:
            # Checked here: behind setpriv a missing program would look like a rank exiting 127.
            raise FileNotFoundError(2, "No such file or directory", command[0])
        # The rank dies with its agent (PR_SET_PDEATHSIG through setpriv): an
        # agent killed by the OOM killer must not leave ranks training on.
        self.proc = subprocess.Popen(
            [*die_with_parent_prefix(), *command], env=dict(env), start_new_session=True, pass_fds=tuple(pass_fds)
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the rank's process group; its leader may be gone
        already while children it left behind are still in the group."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_ranks(ranks: Sequence[Rank], timeout: float, interval: float, sweep: bool = True) -> None:
    """SIGTERM every rank's process group, wait up to ``timeout`` for the
    leaders to exit, then SIGKILL the groups of those still running.

    With ``sweep``, every group is SIGKILLed at the end as well, so nothing a
    rank left behind (it holds ports and GPU memory) survives into the next
    start. The wait polls: it must not be cut short by a second signal.
    """
    for rank in ranks:
        rank.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    for rank in ranks:
        if rank.poll() is None:
            log.warning(
                "local rank %d (pid %d) still running %gs after SIGTERM: SIGKILL", rank.local_rank, rank.pid, timeout
            )
            rank.signal_group(signal.SIGKILL)
        elif sweep:
            rank.signal_group(signal.SIGKILL)
    for rank in ranks:
        try:
            rank.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # e.g. stuck in the kernel (D state) on a GPU driver call
            log.error("local rank %d (pid %d) did not die after SIGKILL", rank.local_rank, rank.pid)
