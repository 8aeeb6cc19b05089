"""The deployment files in deploy/ parse, pass their tools' checks, and use
only real flags and settings: every `fthsdp` command line in them is parsed
by the real argument parser and its settings are built (a wrong flag, value
or variable fails here, not on the operator's cluster)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fthsdp.core.errors import ConfigError
from tests.harness.deploy_files import (
    DEPLOY,
    Command,
    config_maps,
    expand_exec,
    known_variables,
    kubernetes_commands,
    kubernetes_documents,
    need_tool,
    pod_templates,
    read_env_file,
    read_unit,
    split_fthsdp,
    yaml_documents,
)
from tests.harness.kubernetes import KUBERNETES, pod_labels, validate_kubernetes

ROOT = DEPLOY.parent
EXAMPLE = "fthsdp.examples.gpt.train"
"""The example the manifests' ranks run (python -m), from the installed package."""
SYSTEMD = DEPLOY / "systemd"
DOCKER = DEPLOY / "docker"
UNITS = sorted(SYSTEMD.glob("*.service"))


# ----- systemd ----------------------------------------------------------------------------


def unit_environment(unit: dict, instance: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in unit["Service"].get("EnvironmentFile", []):
        optional = item.startswith("-")
        name = Path(item.lstrip("-").replace("%i", instance)).name
        path = SYSTEMD / name
        if optional and not path.exists():
            continue
        assert path.exists(), f"EnvironmentFile {item}: deploy/systemd/{name} is missing"
        env.update(read_env_file(path))
    return env


def unit_command(path: Path, instance: str = "replica-1") -> Command | None:
    unit = read_unit(path)
    env = unit_environment(unit, instance)
    (exec_start,) = unit["Service"]["ExecStart"]
    words = expand_exec(exec_start, instance, f"/run/credentials/{path.name}", env)
    used = set(re.findall(r"%d/([\w.-]+)", exec_start))
    loaded = {item.split(":", 1)[0] for item in unit["Service"].get("LoadCredential", [])}
    assert used <= loaded, f"{path.name}: ExecStart reads credentials {used - loaded} that no LoadCredential= provides"
    argv = split_fthsdp(words)
    return None if argv is None else Command(path.name, argv, env)


@pytest.mark.parametrize("unit_path", UNITS, ids=lambda p: p.name)
def test_systemd_unit_passes_systemd_analyze_verify(unit_path, tmp_path):
    tool = need_tool(shutil.which("systemd-analyze"), "systemd-analyze (Debian package systemd)")
    unit = read_unit(unit_path)
    (exec_start,) = unit["Service"]["ExecStart"]
    program = exec_start.split()[0]
    assert program.startswith("/"), f"{unit_path.name}: ExecStart needs an absolute program path"
    # verify checks that the program exists: stand one in for the installed one.
    stand_in = tmp_path / "bin" / Path(program).name
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    names = [unit_path.name]
    if unit_path.name.endswith("@.service"):
        names.append(unit_path.name.replace("@.", "@replica-0."))
    for name in names:
        (tmp_path / name).write_text(unit_path.read_text().replace(program, str(stand_in)))
        result = subprocess.run(
            [tool, "verify", "--man=no", str(tmp_path / name)], capture_output=True, text=True, timeout=60
        )
        # verify exits 0 on unknown keys and bad values, but says so.
        ours = [line for line in (result.stdout + result.stderr).splitlines() if name in line or str(tmp_path) in line]
        assert result.returncode == 0 and not ours, f"{name}:\n{result.stdout}{result.stderr}"


def test_systemd_units_run_real_commands_with_real_settings(tmp_path):
    coordinator = unit_command(SYSTEMD / "fthsdp-coordinator.service")
    _, config, _ = coordinator.build(tmp_path)
    assert config.store.startswith("etcd://") and config.store.count(",") == 2, "three etcd members"
    assert config.token_file and config.tls_cert and config.tls_key
    assert config.heartbeat_interval < config.heartbeat_timeout

    agent = unit_command(SYSTEMD / "fthsdp-agent@.service", instance="replica-3")
    _, config, rank_command = agent.build(tmp_path)
    assert (config.replica_id, config.replica_rank) == ("replica-3", 3), "the instance name is the replica id"
    assert config.token_file and config.tls_ca
    assert len(config.coordinators) >= 2, "agents know every coordinator"
    assert rank_command[1:3] == ["-m", EXAMPLE] and "--steps" in rank_command

    unit = read_unit(SYSTEMD / "fthsdp-agent@.service")["Service"]
    assert unit["KillMode"] == ["mixed"] and unit["KillSignal"] == ["SIGTERM"]
    (timeout,) = unit["TimeoutStopSec"]
    assert float(timeout) > config.stop_timeout, "systemd must give the drain longer than the ranks' stop timeout"
    # A replica rank the job does not have is refused: the check above has teeth.
    with pytest.raises(ConfigError, match="num-replicas"):
        unit_command(SYSTEMD / "fthsdp-agent@.service", instance="replica-4").build(tmp_path)


# ----- Kubernetes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,doc", list(kubernetes_documents()), ids=lambda x: x.name if isinstance(x, Path) else x["kind"]
)
def test_kubernetes_manifest_validates_against_the_schema(path, doc):
    validate_kubernetes(doc)  # strict: an unknown or misplaced field fails too


def test_kubernetes_schema_check_catches_a_misplaced_field():
    import kubernetes_validate

    (deployment,) = [doc for _, doc in kubernetes_documents() if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessprobe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessprobe"):
        validate_kubernetes(deployment)


def test_kubernetes_commands_and_settings_are_real(tmp_path):
    commands = kubernetes_commands()
    kinds = {}
    for pod, container, command in commands:
        args, config, rank_command = command.build(tmp_path)
        kinds.setdefault(args.command, []).append((pod, container, config))
        for path in [config.token_file, config.tls_ca, config.tls_cert, config.tls_key]:
            if path:  # credentials are files of a mounted Secret
                path = path.removeprefix(str(tmp_path))  # as the manifest names it
                mounts = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"] + "/")]
                volumes = {v["name"]: v for v in pod["volumes"]}
                assert mounts and "secret" in volumes[mounts[0]["name"]], (
                    f"{command.where}: {path} is not from a Secret")
    assert set(kinds) == {"coordinator", "agent"}
    ((_, coordinator, coordinator_config),) = kinds["coordinator"]
    etcd = [doc for _, doc in kubernetes_documents()
            if doc["kind"] == "StatefulSet" and doc["metadata"]["name"] == "fthsdp-etcd"]
    members = [f"fthsdp-etcd-{i}.fthsdp-etcd:2379" for i in range(etcd[0]["spec"]["replicas"])]
    assert coordinator_config.store == "etcd://" + ",".join(members), "the coordinator uses every etcd member"
    assert coordinator_config.token_file
    for _, _, config in kinds["agent"]:
        assert config.token_file
        assert config.coordinators == ["fthsdp-coordinator:29510"], "agents reach the leader through the Service"
    assert sorted((c.replica_id, c.spare) for _, _, c in kinds["agent"]) == [("", True), ("replica-0", False)], (
        "the JobSet's group (job index 0 here) and its spare")


def test_coordinator_deployment_is_highly_available_and_probed_on_grpc_health(tmp_path):
    from fthsdp.coordinator.server import SERVICE_NAME

    docs = [doc for _, doc in kubernetes_documents()]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fthsdp-coordinator"]
    assert deployment["spec"]["replicas"] >= 2
    (pod, container, command) = kubernetes_commands([(KUBERNETES / "coordinator.yaml", deployment)])[0]
    _, config, _ = command.build(tmp_path)
    port = int(config.bind.rsplit(":", 1)[1])
    # Ready only while leading: followers report the Coordinator service
    # NOT_SERVING, so the Service below routes to the leader alone; alive
    # while the process serves at all ("" is SERVING in every coordinator).
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": SERVICE_NAME}
    liveness = container["livenessProbe"]["grpc"]
    assert liveness.get("service", "") == "" and liveness["port"] == port
    assert config.advertise == "10.1.2.3:29510", "each coordinator advertises its own pod address"
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "fthsdp-coordinator"]
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert {p["port"] for p in service["spec"]["ports"]} == {port}
    assert all(c["resources"]["requests"] for p in (pod,) for c in p["containers"])


def test_docs_name_the_kubernetes_files_where_they_are():
    """Every deploy/k8s/ file the docs and deploy files name exists, and
    nothing names the old deploy/kubernetes/."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(DEPLOY.rglob("*.md")),
             *sorted(DEPLOY.rglob("*.yaml"))]
    named = 0
    old = "deploy/" + "kubernetes"
    for path in texts:
        text = path.read_text()
        assert old not in text, f"{path.relative_to(ROOT)} names {old}/, now deploy/k8s/"
        for name in re.findall(r"\bdeploy/k8s/([\w.-]+)", text):
            assert (KUBERNETES / name).exists(), f"{path.relative_to(ROOT)} names deploy/k8s/{name}, which is not there"
            named += 1
    assert named >= 4


# ----- compose and the Dockerfile ----------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_every_yaml_file_parses():
    paths = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(paths) >= 5
    for path in paths:
        assert yaml_documents(path), f"{path} is empty"


def test_compose_runs_etcd_two_coordinators_and_three_agents_with_real_commands(tmp_path):
    services = compose()["services"]
    assert "etcd" in services
    built = {"coordinator": {}, "agent": {}, "status": {}}
    for name, service in services.items():
        argv = split_fthsdp(["fthsdp", *service["command"]]) if service.get("image", "").startswith("fthsdp") else None
        if argv is None:
            continue
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        args, config, rank_command = Command(f"compose {name}", argv, env).build(tmp_path)
        built[args.command][name] = (service, config, rank_command)
    assert len(built["coordinator"]) == 2 and len(built["agent"]) == 3
    advertised = sorted(config.advertise for _, config, _ in built["coordinator"].values())
    assert advertised == sorted(f"{name}:29510" for name in built["coordinator"])
    for service, config, _ in built["coordinator"].values():
        assert config.store == "etcd://etcd:2379" and "etcd" in service["depends_on"]
    ranks = set()
    for name, (service, config, rank_command) in built["agent"].items():
        assert sorted(config.coordinators) == advertised, f"{name} must know every coordinator"
        assert service["environment"]["FTHSDP_ADVERTISE_HOST"] == name, "peers reach its catch-up server by name"
        assert rank_command[:3] == ["python", "-m", EXAMPLE]
        check_example_flags(rank_command[3:])
        assert int(service["stop_grace_period"].rstrip("s")) > config.stop_timeout
        ranks.add(config.replica_rank)
    assert ranks == set(range(3))
    assert "token" in (DOCKER / ".gitignore").read_text(), "the compose token file must never be committed"


def check_example_flags(words: list[str]) -> None:
    """Flags given to the example (python -m fthsdp.examples.gpt.train) are ones its parser defines."""
    defined = set(re.findall(r'add_argument\("(--[\w-]+)"', (ROOT / "fthsdp/examples/gpt/train.py").read_text()))
    used = {w.split("=")[0] for w in words if w.startswith("--")}
    assert used <= defined, f"{EXAMPLE} has no {used - defined}"


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_pins_cpu_torch_and_no_pip_run_can_pull_another(tmp_path):
    instructions = dockerfile_instructions()
    args = dict(rest.split("=", 1) for kw, rest in instructions if kw == "ARG" and "=" in rest)
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu", "the default build is the CPU one"
    constrained = False
    pip_runs = 0
    for keyword, rest in instructions:
        if keyword == "ENV" and "PIP_CONSTRAINT=" in rest:
            constrained = True
        if keyword != "RUN" or "pip install" not in rest:
            continue
        pip_runs += 1
        for command in re.split(r"&&|;", rest):
            if "pip install" not in command:
                continue
            if "torch" in command:
                assert '"torch==2.13.0"' in command and '--index-url "${TORCH_INDEX}"' in command, command
            else:
                # Any later install could resolve torch from PyPI (a CUDA build) unless pinned.
                assert constrained, f"`{command.strip()}` runs before PIP_CONSTRAINT pins torch"
    assert pip_runs >= 2
    (constraint_line,) = [rest for kw, rest in instructions if kw == "RUN" and "pip-constraints" in rest]
    assert 'echo "torch==2.13.0" > /etc/pip-constraints.txt' in constraint_line

    entrypoint = [rest for kw, rest in instructions if kw == "ENTRYPOINT"]
    cmd = [rest for kw, rest in instructions if kw == "CMD"]
    argv = split_fthsdp(yaml.safe_load(entrypoint[-1]) + yaml.safe_load(cmd[-1]))
    _, config, _ = Command("Dockerfile CMD", argv, {}).build(tmp_path)
    assert config.bind == "0.0.0.0:29510"
    users = [rest for kw, rest in instructions if kw == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image runs unprivileged"
    copied = {rest.split()[0] for kw, rest in instructions if kw == "COPY"}
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text()
    for source in copied - {"pyproject.toml", "README.md"}:
        assert f"!{source}" in ignore, f"{source} is copied but excluded from the build context"
    assert "/opt/fthsdp" in dict(instructions)["WORKDIR"]


# ----- settings named anywhere -------------------------------------------------------------


def all_environments() -> list[tuple[str, dict[str, str]]]:
    out = [(path.name, read_env_file(path)) for path in sorted(SYSTEMD.glob("*.env"))]
    out += [(f"ConfigMap {name}", data) for name, data in config_maps().items()]
    out += [(f"{cmd.where} env", cmd.env) for _, _, cmd in kubernetes_commands()]
    for name, service in compose()["services"].items():
        out.append((f"compose {name}", {k: str(v) for k, v in (service.get("environment") or {}).items()}))
    return out


def test_every_fthsdp_variable_is_a_real_setting():
    known = known_variables()
    assert {"FTHSDP_STORE", "FTHSDP_REPLICA_ID", "FTHSDP_FTAR_TIMEOUT", "FTHSDP_ADVERTISE_HOST"} <= set(known)
    seen = set()
    for where, env in all_environments():
        names = {k for k in env if k.startswith("FTHSDP_")}
        assert names <= set(known), f"{where}: {sorted(names - set(known))} are not settings of fthsdp"
        seen |= names
    assert len(seen) > 15


def etcd_flags() -> set[str]:
    from fthsdp.testing.local_etcd import EtcdNotFound, find_etcd_binary

    try:
        binary = find_etcd_binary()
    except EtcdNotFound:
        binary = None
    binary = need_tool(binary, "etcd")
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text.stdout + help_text.stderr, re.M))


def test_etcd_settings_are_real_etcd_flags():
    flags = etcd_flags()
    assert "--initial-cluster" in flags
    settings: list[tuple[str, str]] = [("etcd.env", k) for k in read_env_file(SYSTEMD / "etcd.env")]
    for _, doc in kubernetes_documents():
        for pod in pod_templates(doc):
            for container in pod["containers"]:
                settings += [(doc["metadata"]["name"], e["name"]) for e in container.get("env", [])]
    etcd_service = compose()["services"]["etcd"]
    settings += [("compose etcd", "ETCD_" + w[2:].split("=")[0].upper().replace("-", "_"))
                 for w in etcd_service["command"][1:]]
    checked = 0
    for where, name in settings:
        if name.startswith("ETCD_"):
            flag = "--" + name[5:].lower().replace("_", "-")
            assert flag in flags, f"{where}: {name} is not an etcd flag ({flag})"
            checked += 1
    assert checked > 20
