"""The `fthsdp` command: coordinator, agent, status, drain, cordon, uncordon, give-up-state, restore, reopen-job,
inject, demo.

This is where the coordinator and the agent read the environment (FTHSDP_*),
once, handing it on (the training process's own entry point is
``Manager.from_env``, fthsdp/agent/training/manager.py), and the only place
that turns errors into exit codes: a user mistake ends with one line on
stderr and a non-zero status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence

from fthsdp.core.errors import ConfigError, CoordinatorUnavailable, FthsdpError, RequestRejected, StoreError

EXIT_USAGE = 2
EXIT_FAILURE = 1


def _add_coordinator_parser(sub) -> None:
    from fthsdp.coordinator.config import CoordinatorConfig
    from fthsdp.core.settings import add_flags

    p = sub.add_parser(
        "coordinator",
        help="run the coordinator (lighthouse) service",
        description="Run the coordinator: replica membership, the quorum, push to agents, status.",
    )
    p.add_argument("--config", metavar="FILE",
                   help="TOML file with a [coordinator] table (flags and FTHSDP_* win over it)")
    add_flags(p, CoordinatorConfig)
    p.set_defaults(run=_run_coordinator)


def _add_agent_parser(sub) -> None:
    from fthsdp.agent.node.config import AgentConfig
    from fthsdp.core.settings import add_flags

    p = sub.add_parser(
        "agent",
        help="launch and supervise the local ranks of one replica group",
        description="Start the ranks of one replica group on this node, restart the group when a rank dies, "
        "report every transition to the coordinator.",
        usage="fthsdp agent --replica-id ID [options] -- COMMAND [ARG ...]",
    )
    p.add_argument("--config", metavar="FILE", help="TOML file with an [agent] table (flags and FTHSDP_* win over it)")
    add_flags(p, AgentConfig)
    p.add_argument("rank_command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command every rank runs")
    p.set_defaults(run=_run_agent)


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--coordinator",
        metavar="ADDR[,ADDR]",
        help="coordinator address(es) [env FTHSDP_COORDINATOR; default 127.0.0.1:29510]",
    )
    p.add_argument("--job", default=None,
                   help="job name [env FTHSDP_JOB]; may be omitted if the coordinator serves one job")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="file holding the coordinator's bearer token [env FTHSDP_TOKEN_FILE]")
    p.add_argument("--tls-ca", default=None, metavar="PEM",
                   help="connect over TLS, trusting this CA bundle [env FTHSDP_TLS_CA]")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="client certificate for mutual TLS, with --tls-key [env FTHSDP_TLS_CERT]")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="key of --tls-cert [env FTHSDP_TLS_KEY]")


def _add_admin_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin-token-file", default=None, metavar="FILE",
                   help="file holding the coordinator's admin token, for a coordinator that has one "
                   "(--admin-token-file there) [env FTHSDP_ADMIN_TOKEN_FILE]")


SLOW_SECONDS, SLOW_STEPS = 1.0, 20
"""`fthsdp inject slow` without --seconds/--steps: a second more per step, for 20 steps."""


def _add_inject_parser(sub) -> None:
    text = "inject a fault into a running replica, to test the cluster's recovery (needs the admin token)"
    p = sub.add_parser("inject", help=text, description=(
        "Inject a fault into a running replica, to test how the job recovers: kill (its node agent SIGKILLs "
        "its ranks; a crash, restarted as any crash), hang (its training loop blocks at its next step while "
        "its heartbeats go on; the coordinator takes it out once the others waited past the hang limit, its "
        "stacks are dumped and its agent restarts it) or slow (each of its next --steps steps takes --seconds "
        "longer: a straggler). Carried out once, by the replica's current incarnation; recorded in the "
        "coordinator's log, `fthsdp status` and the status page. Needs the coordinator's admin token."),
        usage="fthsdp inject [options] --replica ID {kill,hang,slow} [--seconds S] [--steps N]")
    _add_client_flags(p)
    _add_admin_flag(p)
    p.add_argument("--replica", required=True, metavar="ID", help="the replica to inject the fault into")
    p.add_argument("fault", choices=("kill", "hang", "slow"), help="what to inject")
    p.add_argument("--seconds", default=None, metavar="S",
                   help=f"slow: seconds added to each step, e.g. 2 or 500ms (default {SLOW_SECONDS:g})")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help=f"slow: how many steps are slowed (default {SLOW_STEPS})")
    p.set_defaults(run=_run_inject)


def _add_demo_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run a local demo: a coordinator, replicas of the example model, a failure and its recovery",
        description="Train the example GPT with several replicas on this machine (a coordinator and one "
        "fthsdp agent per replica), fail one at a chosen step, watch it restart and catch up; then a summary, "
        "summary.json and demo.png in --out.",
    )
    p.add_argument("--replicas", type=int, default=3, help="replica groups, one agent and rank each (default 3)")
    p.add_argument("--steps", type=int, default=100, help="steps every replica trains (default 100)")
    p.add_argument("--fail-step", type=int, default=30,
                   help="fail once the failing replica committed this step (default 30)")
    p.add_argument("--fail-replica", type=int, default=-1, metavar="INDEX",
                   help="which replica fails (default: the last)")
    p.add_argument("--fail-mode", choices=("kill", "hang", "deadlock", "kill-all"), default="kill",
                   help="kill: SIGKILL its training process; hang: SIGSTOP it (found by the heartbeat timeout), "
                   "then SIGKILL it; deadlock: its training loop blocks after the backward pass, process and "
                   "heartbeats alive (taken out as hung once the others waited past the hang limit, ended and "
                   "restarted by its agent); kill-all: the replicas write checkpoints, and every replica's "
                   "training process is SIGKILLed at once: the coordinator restores the newest checkpoint "
                   "and the restarted replicas train on from its step (default kill)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="kill-all: the replicas write a checkpoint every N steps, into --out/checkpoints "
                   "(default 10; at most --fail-step)")
    p.add_argument("--no-live", action="store_true", help="plain log lines instead of the live view")
    p.add_argument("--out", default="", metavar="DIR",
                   help="folder for demo.png, summary.json and the logs (default: a new ./fthsdp-demo-DATE-TIME/)")
    p.add_argument("--store", default="memory",
                   help="memory (embedded), etcd (start a private etcd) or etcd://HOST:PORT (default memory)")
    p.set_defaults(run=_run_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fthsdp", description="Fault-tolerant HSDP training for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_coordinator_parser(sub)
    _add_agent_parser(sub)

    p = sub.add_parser("status", help="show the quorum and every replica",
                       description="Show a job's quorum and replicas.")
    _add_client_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_run_status)

    for name, text in (
        ("drain", "ask a replica to leave the quorum at its next step boundary"),
        ("cordon", "keep a replica out of future quorums (a member keeps its place)"),
        ("uncordon", "let a cordoned replica be admitted again"),
    ):
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _add_client_flags(p)
        _add_admin_flag(p)
        p.add_argument("replica_id", metavar="REPLICA")
        p.set_defaults(run=_run_admin, admin=name)

    text = "start over a job whose committed state every replica lost (see fthsdp status)"
    p = sub.add_parser("give-up-state", help=text, description=(
        "Give up a job's committed state that no live replica holds any more, and let the coordinator form a "
        "quorum of the replicas there are, from the highest step they hold. Refused unless the state is lost "
        "at exactly --step right now."))
    _add_client_flags(p)
    p.add_argument("--step", type=int, required=True, metavar="N",
                   help="the step given up: the one `fthsdp status` says the state was lost at")
    _add_admin_flag(p)
    p.set_defaults(run=_run_give_up)

    text = "restore a job whose committed state every replica lost from one of its checkpoints (see fthsdp status)"
    p = sub.add_parser("restore", help=text, description=(
        "Restore a job's committed state that no live replica holds any more from its complete checkpoint of "
        "--step: the replicas load it and the job goes on from that step (the steps committed after it are "
        "lost). The coordinator does this by itself with the newest checkpoint unless it runs with "
        "--no-auto-restore. Refused unless the state is lost right now."))
    _add_client_flags(p)
    p.add_argument("--step", type=int, required=True, metavar="N",
                   help="the checkpoint's step (`fthsdp status` shows the newest)")
    _add_admin_flag(p)
    p.set_defaults(run=_run_restore)

    text = "reopen a job whose members all finished, so that quorums form again (see fthsdp status)"
    p = sub.add_parser("reopen-job", help=text, description=(
        "Reopen a finished job: once every member of its last quorum left finished, the coordinator forms no "
        "quorum and tells every replica that arrives that the job is finished (it exits 0). Reopening clears "
        "that mark: the replicas there are form a quorum and start over from the state they hold. Refused "
        "unless the job finished at exactly --step."))
    _add_client_flags(p)
    p.add_argument("--step", type=int, required=True, metavar="N",
                   help="the step the job finished at, as `fthsdp status` shows it")
    _add_admin_flag(p)
    p.set_defaults(run=_run_reopen)

    _add_inject_parser(sub)
    _add_demo_parser(sub)
    return parser


# ----- coordinator ---------------------------------------------------------------------


def coordinator_config(args: argparse.Namespace, env: Mapping[str, str]):
    from fthsdp.coordinator.config import CoordinatorConfig
    from fthsdp.core.settings import load_toml, resolve

    file_values = load_toml(args.config, "coordinator") if args.config else None
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "run", "config")}
    return resolve(CoordinatorConfig, flags, env, file_values, file_name=args.config or "config file")


def _run_coordinator(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from fthsdp.core.log_format import configure_logging

    config = coordinator_config(args, env)
    configure_logging(config.log_level, config.log_format)
    # The coordinator holds an entry per replica and makes small objects per
    # heartbeat: with the default thresholds the collector's full passes over
    # 10,000 replicas' entries took an eighth of its CPU (profiled under the
    # scale benchmark). Nothing here builds reference cycles in bulk.
    gc.set_threshold(100_000, 50, 100)
    return asyncio.run(_serve(config))


async def _serve(config) -> int:
    from fthsdp.coordinator.server import start_coordinator

    running = await start_coordinator(config)
    http = running.metrics_address
    metrics = f"; status page on http://{http}/ and metrics on http://{http}/metrics" if http else ""
    print(f"fthsdp coordinator listening on {running.address} (jobs: {', '.join(config.job)}){metrics}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping, lost = asyncio.create_task(stop.wait()), asyncio.create_task(running.lost.wait())
    await asyncio.wait({stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
    if lost.done():
        print("fthsdp: error: this coordinator lost its leadership (lease expired); exiting so that it "
              "restarts as a follower", file=sys.stderr, flush=True)
        await running.stop(grace=1.0)
        return 1
    stopping.cancel()
    lost.cancel()
    logging.getLogger("fthsdp.coordinator").info("shutting down")
    await running.stop(grace=1.0)
    return 0


# ----- clients -------------------------------------------------------------------------


def _client(args: argparse.Namespace, env: Mapping[str, str]):
    from fthsdp.client import CoordinatorClient, parse_addresses
    from fthsdp.core.credentials import TlsFiles, read_token_file

    addresses = parse_addresses(args.coordinator or env.get("FTHSDP_COORDINATOR") or "127.0.0.1:29510")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    token = read_token_file(args.token_file or env.get("FTHSDP_TOKEN_FILE", ""))
    tls = TlsFiles(*(getattr(args, f"tls_{n}") or env.get(f"FTHSDP_TLS_{n.upper()}", "")
                     for n in ("ca", "cert", "key")))
    tls.check()
    client = CoordinatorClient(addresses, timeout=args.timeout, token=token, tls=tls)
    if hasattr(args, "admin_token_file"):  # an admin command
        path = args.admin_token_file or env.get("FTHSDP_ADMIN_TOKEN_FILE", "")
        client.use_admin_token(read_token_file(path, "--admin-token-file"))
    return client


def _job_name(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return args.job if args.job is not None else env.get("FTHSDP_JOB", "")


def _run_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    import json

    from fthsdp.coordinator.decisions.status_view import status_dict, status_table
    from fthsdp.coordinator.serving.progress_view import progress_lines, progress_view

    with _client(args, env) as client:
        status = client.status(_job_name(args, env))
    view = progress_view(status, status_dict(status))
    table = status_table(status, now=time.time())
    print(json.dumps(view, indent=2) if args.json else "\n".join([table, *progress_lines(view)]))
    return 0


def _run_admin(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    job = _job_name(args, env)
    with _client(args, env) as client:
        if args.admin == "drain":
            client.drain(job, args.replica_id)
            print(f"replica {args.replica_id} will leave the quorum at its next step boundary")
        else:
            client.cordon(job, args.replica_id, cordoned=args.admin == "cordon")
            print(f"replica {args.replica_id} {args.admin}ed")
    return 0


def _operator() -> str:
    """Who runs this command, for the coordinator's record: user@host."""
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):  # no user name in a bare container
        return f"uid {os.getuid()}@{socket.gethostname()}"


def _run_reopen(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    job = _job_name(args, env)
    if args.step <= 0:
        raise ConfigError(f"--step must be the step the job finished at (see fthsdp status), got {args.step}")
    with _client(args, env) as client:
        finished = client.reopen_job(job, args.step, requested_by=_operator())
    print(f"{f'job {job}: ' if job else ''}reopened (it had finished at step {finished.step}); "
          "the coordinator forms quorums again")
    return 0


def _run_give_up(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    job = _job_name(args, env)
    if args.step <= 0:
        raise ConfigError(f"--step must be the step whose state was lost (see fthsdp status), got {args.step}")
    who = _operator()
    with _client(args, env) as client:
        give_up = client.give_up_state(job, args.step, requested_by=who)
    print(f"{f'job {job}: ' if job else ''}state at step {give_up.step} given up; "
          "the coordinator forms a quorum of the replicas there are")
    return 0


def _run_restore(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    job = _job_name(args, env)
    if args.step <= 0:
        raise ConfigError(f"--step must be the step of a complete checkpoint (see fthsdp status), got {args.step}")
    with _client(args, env) as client:
        restore = client.restore_checkpoint(job, args.step, requested_by=_operator())
    print(f"{f'job {job}: ' if job else ''}restoring the checkpoint of step {restore.checkpoint.step} "
          f"({restore.lost_step - restore.checkpoint.step} committed steps lost): the replicas load it from "
          f"{restore.checkpoint.path}")
    return 0


def inject_request(args: argparse.Namespace) -> dict:
    """The InjectRequest fields of `fthsdp inject` (ConfigError for a usage mistake)."""
    from fthsdp.coordinator.validation import MAX_SLOW_SECONDS, MAX_SLOW_STEPS
    from fthsdp.core.faults import KIND_OF
    from fthsdp.core.settings import parse_duration

    if args.fault != "slow":
        if args.seconds is not None or args.steps is not None:
            raise ConfigError(f"--seconds and --steps are for a slow fault only, not {args.fault}")
        return {"kind": KIND_OF[args.fault]}
    seconds = SLOW_SECONDS if args.seconds is None else parse_duration(args.seconds, "--seconds")
    steps = SLOW_STEPS if args.steps is None else args.steps
    if not 0 < seconds <= MAX_SLOW_SECONDS:
        raise ConfigError(f"--seconds must be above 0 and at most {MAX_SLOW_SECONDS:g}, got {seconds:g}")
    if not 0 < steps <= MAX_SLOW_STEPS:
        raise ConfigError(f"--steps must be between 1 and {MAX_SLOW_STEPS}, got {steps}")
    return {"kind": KIND_OF["slow"], "seconds": seconds, "steps": steps}


INJECT_OUTCOMES = {
    "kill": "its node agent SIGKILLs its ranks and restarts them, as after any crash",
    "hang": "its ranks block at their next step, heartbeats alive; the coordinator takes it out once the "
            "others waited past the hang limit, and its agent restarts it",
    "slow": "its next steps take longer before the all-reduce (a straggler; the others wait for it)",
}


def _run_inject(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from fthsdp.core.faults import describe

    job = _job_name(args, env)
    fields = inject_request(args)
    with _client(args, env) as client:
        done = client.inject(job, args.replica, requested_by=_operator(), **fields)
    print(f"{f'job {job}: ' if job else ''}replica {done.replica_id}: fault injected: {describe(done)} "
          f"(id {done.id}, incarnation {done.restart_count}, at step {done.step}); {INJECT_OUTCOMES[args.fault]}")
    return 0


def _run_agent(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from fthsdp.agent.node.supervisor import main as agent_main

    return agent_main(args, env)


def _run_demo(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from fthsdp.demo.config import DemoConfig
    from fthsdp.demo.scenario import run_demo

    config = DemoConfig(replicas=args.replicas, steps=args.steps, fail_step=args.fail_step,
                        fail_replica=args.fail_replica, fail_mode=args.fail_mode, live=not args.no_live,
                        out=args.out, store=args.store, checkpoint_every=args.checkpoint_every)
    return run_demo(config)


# ----- entry point ---------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    from fthsdp.core.log_format import TEXT_FORMAT

    logging.basicConfig(level=logging.INFO, format=TEXT_FORMAT)
    parser = build_parser()
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    prog = f"fthsdp {args.command}"
    try:
        return args.run(args, env)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (StoreError, CoordinatorUnavailable, RequestRejected, FthsdpError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
