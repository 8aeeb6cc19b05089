"""Reading the deployment files in deploy/ the way their runtimes do, for
tests/test_deploy.py: systemd units and environment files, Kubernetes
manifests, the compose file and the Dockerfile, down to the ``fthsdp`` command
lines they run and the settings they give it."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from fthsdp.cli.main import build_parser, coordinator_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

CREDENTIAL_FLAGS = ("--token-file", "--tls-ca", "--tls-cert", "--tls-key", "--config")
CREDENTIAL_VARIABLES = ("FTHSDP_TOKEN_FILE", "FTHSDP_TLS_CA", "FTHSDP_TLS_CERT", "FTHSDP_TLS_KEY")


# ----- what is a real setting ------------------------------------------------------------


class _Recording(dict):
    """An environment that remembers every name looked up in it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)


def known_variables() -> dict[str, str]:
    """Every FTHSDP_* variable a user may set, and who reads it: the
    coordinator's and the agent's settings, and what the training process
    reads (found by reading it: ``ManagerConfig.from_env`` on an environment
    that records the names it asks for)."""
    from fthsdp.agent.node.config import AgentConfig
    from fthsdp.agent.training.config import ManagerConfig
    from fthsdp.coordinator.config import CoordinatorConfig
    from fthsdp.core.settings import env_name

    known: dict[str, str] = {}
    for owner, cls in (("coordinator", CoordinatorConfig), ("agent", AgentConfig)):
        for field in dataclasses.fields(cls):
            known.setdefault(env_name(field.name), owner)
    env = _Recording()
    env.update(FTHSDP_REPLICA_ID="r0", FTHSDP_COORDINATOR="127.0.0.1:1")
    ManagerConfig.from_env(env)
    for name in env.asked:
        if name.startswith("FTHSDP_"):
            known.setdefault(name, "training process")
    return known


# ----- fthsdp command lines ----------------------------------------------------------------


def materialise_credentials(argv: list[str], env: Mapping[str, str], root: Path) -> tuple[list[str], dict[str, str]]:
    """The same command with every credential file it names created under
    ``root`` (a token, or a PEM-looking file for .crt/.key/.pem), so that the
    settings, which read these files, can be built here. The paths must be
    absolute: a service's working directory is not the operator's."""

    def made(path: str, what: str) -> str:
        assert path.startswith("/"), f"{what} {path!r} must be an absolute path"
        local = root / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith((".crt", ".key", ".pem")):
            local.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        elif what != "--config":
            local.write_text("a-token-of-the-job\n")
        return str(local)

    out: list[str] = []
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        if word == "--":
            out += [word, *rest]
            break
        flag, eq, value = word.partition("=")
        if flag in CREDENTIAL_FLAGS and eq:
            out.append(f"{flag}={made(value, flag)}")
        elif word in CREDENTIAL_FLAGS and rest:
            out += [word, made(rest.pop(0), word)]
        else:
            out.append(word)
    env = {k: (made(v, k) if k in CREDENTIAL_VARIABLES and v else v) for k, v in env.items()}
    return out, env


@dataclasses.dataclass
class Command:
    """One ``fthsdp`` command line of a deployment file, with its settings."""

    where: str
    argv: list[str]
    """The words after the program name."""
    env: dict[str, str]

    def build(self, root: Path):
        """Parse the command line with the real parser and build its
        settings: (args, config, rank command); a bad flag or value fails."""
        argv, env = materialise_credentials(self.argv, self.env, root)
        parser = build_parser()
        parser.exit_on_error = False
        try:
            args = parser.parse_args(argv)
        except (SystemExit, argparse.ArgumentError) as e:
            raise AssertionError(f"{self.where}: `fthsdp {shlex.join(self.argv)}` does not parse: {e}") from e
        if args.command == "coordinator":
            return args, coordinator_config(args, env), []
        if args.command == "agent":
            from fthsdp.agent.node.config import config_from_args

            config, command = config_from_args(args, env)
            return args, config, command
        return args, None, []


def split_fthsdp(words: list[str]) -> list[str] | None:
    """The arguments of an ``fthsdp`` (or ``python -m fthsdp``) command line, else None."""
    if words and words[0].rsplit("/", 1)[-1] == "fthsdp":
        return words[1:]
    if words[:3] == ["python", "-m", "fthsdp"]:
        return words[3:]
    return None


# ----- systemd -----------------------------------------------------------------------------


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (keys may repeat, as systemd allows)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not KEY=VALUE"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, the format systemd's EnvironmentFile= and compose read
    alike (so: no quotes, no spaces around '=')."""
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", key), f"{path.name}:{number}: {line!r} is not KEY=VALUE"
        assert not value.startswith(("'", '"')), f"{path.name}:{number}: no quotes, please (readers differ on them)"
        env[key] = value
    return env


def expand_exec(line: str, instance: str, credentials: str, env: Mapping[str, str]) -> list[str]:
    """ExecStart= as systemd runs it: specifiers %i/%I (instance), %d (the
    credentials directory), %%; then "$VAR" as a word splits into words,
    ${VAR} inside a word is replaced."""
    specifiers = {"i": instance, "I": instance, "d": credentials, "%": "%"}

    def specifier(match: re.Match) -> str:
        assert match.group(1) in specifiers, f"specifier %{match.group(1)} is not handled by this test"
        return specifiers[match.group(1)]

    words: list[str] = []
    for word in shlex.split(re.sub(r"%(.)", specifier, line.lstrip("-@:+!"))):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            words += env.get(whole.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return words


# ----- Kubernetes and compose ---------------------------------------------------------------


def yaml_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kubernetes_documents() -> Iterator[tuple[Path, dict]]:
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml_documents(path):
            yield path, doc


def pod_templates(doc: dict) -> list[dict]:
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [doc["spec"]["template"]["spec"]]
    if doc.get("kind") == "Pod":
        return [doc["spec"]]
    if doc.get("kind") == "JobSet":  # a Job template per replicated job
        return [rjob["template"]["spec"]["template"]["spec"] for rjob in doc["spec"]["replicatedJobs"]]
    return []


def expand_kubernetes(words: list[str], env: Mapping[str, str]) -> list[str]:
    """$(VAR) references in a container's command and args, as the kubelet expands them."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), w) for w in words]


def config_maps() -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc.get("data", {})
            for _, doc in kubernetes_documents() if doc["kind"] == "ConfigMap"}


SAMPLE_FIELDS = {  # what the downward API gives a first pod
    "status.podIP": "10.1.2.3",
    "metadata.name": "pod-0",
    "metadata.namespace": "fthsdp",
    "metadata.labels['jobset.sigs.k8s.io/job-index']": "0",
}


def container_environment(container: dict, maps: dict[str, dict[str, str]],
                          fields: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it; ``fields`` stands in for the downward API."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in maps, f"ConfigMap {name} is not in deploy/k8s"
        env.update(maps[name])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand_kubernetes([str(item["value"])], env)[0]
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def kubernetes_commands(documents=None, fields: Mapping[str, str] = SAMPLE_FIELDS) -> list[tuple[dict, dict, Command]]:
    """(pod spec, container, command) of every container that runs fthsdp."""
    maps = config_maps()
    out = []
    for path, doc in documents or kubernetes_documents():
        pods = pod_templates(doc)
        names = ([f"{doc['metadata']['name']}/{rjob['name']}" for rjob in doc["spec"]["replicatedJobs"]]
                 if doc.get("kind") == "JobSet" else [doc["metadata"]["name"]] * len(pods))
        for name, pod in zip(names, pods, strict=True):
            for container in pod["containers"]:
                env = container_environment(container, maps, fields)
                words = expand_kubernetes(container.get("command", []) + container.get("args", []), env)
                argv = split_fthsdp(words)
                if argv is not None:
                    out.append((pod, container, Command(f"{path.name} {name}", argv, env)))
    return out


def need_tool(path: str | None, what: str) -> str:
    """The tool's path; fail under CI (CI=true), where `make test` installs
    it, and skip only on a developer's machine."""
    if path:
        return path
    message = f"{what} is not installed (`make etcd` installs it)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def subcommand_flags() -> dict[str, set[str]]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}
