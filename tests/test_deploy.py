"""The deployment files in deploy/ parse, pass their tools' checks, and use
only real flags and settings: every `fthsdp` command line in them is parsed
by the real argument parser and its settings are built (a wrong flag, value
or variable fails here, not on the operator's cluster)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fthsdp.core.errors import ConfigError
from tests.harness.deploy_files import (
    DEPLOY,
    SAMPLE_FIELDS,
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

ROOT = DEPLOY.parent
EXAMPLE = "fthsdp.examples.gpt.train"
"""The example the manifests' ranks run (python -m), from the installed package."""
SYSTEMD = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "k8s"
DOCKER = DEPLOY / "docker"
UNITS = sorted(SYSTEMD.glob("*.service"))
KUBERNETES_VERSIONS = ("1.30.0", "latest")
"""The oldest Kubernetes the manifests need (gRPC probes, the Job's
podReplacementPolicy) and the newest schema kubernetes-validate bundles."""


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


def validate_kubernetes(doc: dict) -> None:
    import kubernetes_validate

    if doc["kind"] == "JobSet":  # a custom resource: its own fields here, its Job templates against the schema
        check_jobset_fields(doc)
        for rjob in doc["spec"]["replicatedJobs"]:
            validate_kubernetes(jobset_job(doc, rjob, 0))
        return
    for version in KUBERNETES_VERSIONS:
        version = kubernetes_validate.latest_version() if version == "latest" else version
        kubernetes_validate.validate(doc, version, strict=True)


# The JobSet API (jobset.x-k8s.io/v1alpha2, kubernetes-sigs/jobset's
# api/jobset/v1alpha2/jobset_types.go): the fields of the objects a manifest
# may write, which kubernetes-validate, knowing only Kubernetes' own kinds,
# cannot check.
JOBSET_FIELDS = {
    "JobSet": {"apiVersion", "kind", "metadata", "spec"},
    "JobSetSpec": {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
                   "coordinator", "managedBy", "ttlSecondsAfterFinished", "volumeClaimPolicies"},
    "ReplicatedJob": {"name", "groupName", "template", "replicas", "dependsOn"},
    "SuccessPolicy": {"operator", "targetReplicatedJobs"},
    "FailurePolicy": {"maxRestarts", "restartStrategy", "rules"},
    "FailurePolicyRule": {"name", "action", "onJobFailureReasons", "onJobFailureMessagePatterns",
                          "targetReplicatedJobs"},
}
JOBSET_ACTIONS = {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}
"""The failure policy actions of a JobSet controller without feature gates
(RestartJob and RestartJobAndIgnoreMaxRestarts need the alpha gate RestartJob)."""
RESTARTS_EVERY_JOB = {"RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}
JOBSET_POD_LABELS = {"jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name",
                     "jobset.sigs.k8s.io/replicatedjob-replicas", "jobset.sigs.k8s.io/global-replicas",
                     "jobset.sigs.k8s.io/job-index", "jobset.sigs.k8s.io/job-global-index",
                     "jobset.sigs.k8s.io/job-key", "batch.kubernetes.io/job-completion-index"}
"""The labels the JobSet controller (and the Job controller) put on every pod."""


def check_jobset_fields(doc: dict) -> None:
    def only(obj: dict, kind: str, where: str) -> None:
        unknown = set(obj) - JOBSET_FIELDS[kind]
        assert not unknown, f"{where}: {sorted(unknown)} are not fields of a {kind}"

    assert doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    only(doc, "JobSet", "JobSet")
    spec = doc["spec"]
    only(spec, "JobSetSpec", "spec")
    names = [rjob["name"] for rjob in spec["replicatedJobs"]]
    assert len(set(names)) == len(names), "replicated job names must be unique"
    for rjob in spec["replicatedJobs"]:
        only(rjob, "ReplicatedJob", f"replicatedJobs {rjob['name']}")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rjob["name"]), rjob["name"]
        assert isinstance(rjob.get("replicas", 1), int) and rjob.get("replicas", 1) >= 1
    if "successPolicy" in spec:
        only(spec["successPolicy"], "SuccessPolicy", "successPolicy")
        assert spec["successPolicy"]["operator"] in ("All", "Any")
        assert set(spec["successPolicy"].get("targetReplicatedJobs", [])) <= set(names)
    for rule in spec.get("failurePolicy", {}).get("rules", []):
        only(spec["failurePolicy"], "FailurePolicy", "failurePolicy")
        only(rule, "FailurePolicyRule", f"failurePolicy rule {rule.get('name')}")
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]), rule["name"]
        assert rule["action"] in JOBSET_ACTIONS, f"rule {rule['name']}: action {rule['action']}"
        assert set(rule.get("targetReplicatedJobs", [])) <= set(names)


def jobset_job(doc: dict, rjob: dict, index: int) -> dict:
    """The Job the JobSet controller makes of ``rjob`` for job index ``index``."""
    template = rjob["template"]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {**template.get("metadata", {}), "name": f"{doc['metadata']['name']}-{rjob['name']}-{index}"},
            "spec": template["spec"]}


def jobset_failure_action(spec: dict, rjob: str, reason: str, message: str = "") -> str:
    """What the JobSet controller does when a Job of ``rjob`` fails for
    ``reason``: the first rule that matches, else RestartJobSet (the default
    action); without a failure policy the JobSet fails."""
    policy = spec.get("failurePolicy")
    if policy is None:
        return "FailJobSet"
    for rule in policy.get("rules", []):
        if rule.get("targetReplicatedJobs") and rjob not in rule["targetReplicatedJobs"]:
            continue
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        return rule["action"]
    return "RestartJobSet"


def jobset_succeeded(spec: dict, succeeded: dict[str, int]) -> bool:
    """Whether the JobSet controller declares the JobSet complete with
    ``succeeded[rjob]`` Jobs of each replicated job complete."""
    policy = spec.get("successPolicy") or {"operator": "All"}
    targets = policy.get("targetReplicatedJobs") or [r["name"] for r in spec["replicatedJobs"]]
    done = sum(succeeded.get(name, 0) for name in targets)
    if policy["operator"] == "Any":
        return done >= 1
    return done >= sum(r.get("replicas", 1) for r in spec["replicatedJobs"] if r["name"] in targets)


JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "PodFailurePolicy", "FailedIndexes",
                       "MaxFailedIndexesExceeded")


def pod_failures_can_fail(job_spec: dict) -> str | None:
    """Why failing pods could fail this Job (the Job controller's rules), or None."""
    if job_spec.get("backoffLimit", 6) < 2**31 - 1:
        return f"backoffLimit {job_spec.get('backoffLimit', 6)}"
    if "backoffLimitPerIndex" in job_spec:
        return f"backoffLimitPerIndex {job_spec['backoffLimitPerIndex']}"
    if "activeDeadlineSeconds" in job_spec:
        return f"activeDeadlineSeconds {job_spec['activeDeadlineSeconds']}"
    rules = job_spec.get("podFailurePolicy", {}).get("rules", [])
    failing = [rule for rule in rules if rule["action"] in ("FailJob", "FailIndex")]
    if failing:
        return f"podFailurePolicy {failing}"
    return None


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


def pod_labels(doc: dict) -> dict:
    return doc["spec"]["template"]["metadata"]["labels"]


def jobset() -> tuple[dict, dict[str, dict]]:
    """The JobSet of jobset.yaml, and its replicated jobs by name."""
    (doc,) = yaml_documents(KUBERNETES / "jobset.yaml")
    return doc, {rjob["name"]: rjob for rjob in doc["spec"]["replicatedJobs"]}


def jobset_fields(group_index: int) -> dict[str, str]:
    return {**SAMPLE_FIELDS, "metadata.labels['jobset.sigs.k8s.io/job-index']": str(group_index)}


def rjob_command(doc: dict, rjob: dict, fields=SAMPLE_FIELDS) -> tuple[dict, dict, Command]:
    (found,) = kubernetes_commands([(KUBERNETES / "jobset.yaml", {**doc, "spec": {**doc["spec"],
                                                                                  "replicatedJobs": [rjob]}})], fields)
    return found


def test_jobset_makes_every_replica_group_of_the_job(tmp_path):
    """One Job per replica group, each an Indexed Job of one pod per host
    (--nnodes), its replica id from the JobSet's job index, and the job's
    size enforced: job index R of R groups is refused."""
    doc, rjobs = jobset()
    group = rjobs["group"]
    job = group["template"]["spec"]
    assert job["completionMode"] == "Indexed"
    num_replicas = int(config_maps()["fthsdp-agent"]["FTHSDP_NUM_REPLICAS"])
    assert group["replicas"] == num_replicas, "one Job per replica group: replicas = FTHSDP_NUM_REPLICAS"
    for index in range(group["replicas"] + 1):
        pod, _, command = rjob_command(doc, group, jobset_fields(index))
        if index == group["replicas"]:
            with pytest.raises(ConfigError, match="num-replicas"):
                command.build(tmp_path)
            continue
        args, config, rank_command = command.build(tmp_path)
        assert (config.replica_id, config.replica_rank, config.num_replicas) == (
            f"replica-{index}", index, group["replicas"])
        assert job["completions"] == job["parallelism"] == config.nnodes > 1, "one pod per host of the group"
        # Every host runs the same command: the coordinator hands out the node ranks and the store.
        assert config.rendezvous and config.node_rank == -1 and config.master_port == 0
        assert not config.spare and not config.standby and config.host_id == "", "the host id is the pod's host name"
        assert pod["terminationGracePeriodSeconds"] > config.stop_timeout, (
            "Kubernetes must give the drain longer than the ranks' stop timeout")
        assert rank_command[0] == "python"
        # The example GPT is one rank per replica group (it refuses a world of several ranks).
        assert EXAMPLE not in rank_command or config.nnodes * config.nproc == 1


def test_jobset_reads_only_labels_that_jobset_sets():
    doc, _ = jobset()
    read = [item["valueFrom"]["fieldRef"]["fieldPath"] for pod in pod_templates(doc) for c in pod["containers"]
            for item in c.get("env", []) if "valueFrom" in item]
    labels = {m for path in read for m in re.findall(r"metadata\.labels\['([^']+)'\]", path)}
    assert "jobset.sigs.k8s.io/job-index" in labels
    assert labels <= JOBSET_POD_LABELS, f"no controller sets {sorted(labels - JOBSET_POD_LABELS)}"


def test_jobset_spares_fit_the_groups(tmp_path):
    """The spare pool runs fthsdp agent --spare with the groups' --nnodes,
    --nproc and rank command, in the same pod as a group's host."""
    doc, rjobs = jobset()
    assert set(rjobs) == {"group", "spare"}
    group_pod, group_container, group_command = rjob_command(doc, rjobs["group"])
    spare_pod, spare_container, spare_command = rjob_command(doc, rjobs["spare"])
    group_args, group_config, group_rank_command = group_command.build(tmp_path)
    spare_args, spare_config, spare_rank_command = spare_command.build(tmp_path)
    assert "--spare" in spare_command.argv and spare_config.spare and spare_config.rendezvous
    assert spare_config.replica_id == "", "a spare belongs to no group until the coordinator gives it a place"
    assert (spare_config.nnodes, spare_config.nproc) == (group_config.nnodes, group_config.nproc)
    assert spare_rank_command == group_rank_command
    assert spare_config.num_replicas == group_config.num_replicas, "a spare trains on a group's data shard"
    spare_job = rjobs["spare"]["template"]["spec"]
    assert spare_job["completions"] == spare_job["parallelism"] >= 1
    for key in ("image", "resources", "securityContext", "volumeMounts"):
        assert spare_container[key] == group_container[key], f"a spare's {key} is a group host's"
    for key in ("affinity", "securityContext", "volumes", "terminationGracePeriodSeconds", "restartPolicy"):
        assert spare_pod[key] == group_pod[key], f"a spare's pod {key} is a group host's"


def test_jobset_succeeds_when_the_groups_do_and_spares_do_not_block_it():
    doc, rjobs = jobset()
    spec = doc["spec"]
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["group"]}
    groups = rjobs["group"]["replicas"]
    assert jobset_succeeded(spec, {"group": groups, "spare": 0}), "spares still waiting do not block success"
    assert not jobset_succeeded(spec, {"group": groups - 1, "spare": rjobs["spare"]["replicas"]})
    # Without the policy, the waiting spares would keep the JobSet from completing.
    assert not jobset_succeeded({**spec, "successPolicy": None}, {"group": groups, "spare": 0})


def test_one_groups_failures_never_restart_the_other_groups():
    """A pod's failure stays within its Job (restarted there, never failing
    the Job), and a Job's failure, were there one, never makes the JobSet
    recreate every Job."""
    doc, rjobs = jobset()
    for name, rjob in rjobs.items():
        job = rjob["template"]["spec"]
        why = pod_failures_can_fail(job)
        assert why is None, f"{name}: a pod's failures can fail the Job ({why}), and the JobSet with it"
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "OnFailure", f"{name}: a failed agent restarts in its pod"
        assert job["podReplacementPolicy"] == "Failed", f"{name}: never two pods of one index (one host id) at once"
        for reason in JOB_FAILURE_REASONS:
            action = jobset_failure_action(doc["spec"], name, reason, "Job has reached the specified backoff limit")
            assert action not in RESTARTS_EVERY_JOB, f"a failed {name} Job ({reason}) would restart every group"
    # The checks have teeth: a Job's defaults fail it after 6 pod failures,
    # and with no rule the JobSet's default is to recreate every Job.
    assert pod_failures_can_fail({"completionMode": "Indexed"}) == "backoffLimit 6"
    assert pod_failures_can_fail({"backoffLimit": 2**31 - 1, "podFailurePolicy": {"rules": [
        {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [2]}}]}, "backoffLimitPerIndex": 1})
    no_rules = {**doc["spec"], "failurePolicy": {"maxRestarts": 3}}
    assert jobset_failure_action(no_rules, "group", "BackoffLimitExceeded") == "RestartJobSet"
    other_rule = {**doc["spec"], "failurePolicy": {"rules": [
        {"name": "x", "action": "FailJobSet", "targetReplicatedJobs": ["spare"]}]}}
    assert jobset_failure_action(other_rule, "group", "BackoffLimitExceeded") == "RestartJobSet"


def test_group_template_runs_as_a_plain_job_without_the_jobset_controller(tmp_path):
    """deploy/README.md's way without the controller: a group's Job template
    as a batch/v1 Job of its own, the replica id written in."""
    readme = (DEPLOY / "README.md").read_text()
    assert "`--replica-id replica-1` in place of\n  `replica-$(GROUP_INDEX)`" in readme
    doc, rjobs = jobset()
    job = copy.deepcopy(jobset_job(doc, rjobs["group"], 1))
    assert job["metadata"]["name"] == "fthsdp-group-1" and "`fthsdp-group-1`" in readme
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("replica-$(GROUP_INDEX)")] = "replica-1"
    validate_kubernetes(job)
    # No JobSet labels on its pods: the downward API gives "" for a missing label.
    fields = {**SAMPLE_FIELDS, "metadata.labels['jobset.sigs.k8s.io/job-index']": ""}
    ((_, _, command),) = kubernetes_commands([(KUBERNETES / "jobset.yaml", job)], fields)
    _, config, _ = command.build(tmp_path)
    assert (config.replica_id, config.replica_rank, config.nnodes) == ("replica-1", 1, job["spec"]["completions"])


def test_jobset_check_catches_a_misplaced_field():
    doc, _ = jobset()
    validate_kubernetes(doc)
    bad = {**doc, "spec": {**doc["spec"], "sucessPolicy": doc["spec"]["successPolicy"]}}
    with pytest.raises(AssertionError, match="sucessPolicy"):
        validate_kubernetes(bad)
    import kubernetes_validate

    rjob = doc["spec"]["replicatedJobs"][0]
    job = rjob["template"]["spec"]
    misplaced = {**rjob, "template": {"spec": {**job, "template": {**job["template"], "restartPolicy": "Never"}}}}
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        validate_kubernetes({**doc, "spec": {**doc["spec"], "replicatedJobs": [misplaced]}})
    wrong_action = {"name": "x", "action": "RestartJob"}
    with pytest.raises(AssertionError, match="RestartJob"):
        check_jobset_fields({**doc, "spec": {**doc["spec"], "failurePolicy": {"rules": [wrong_action]}}})


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
