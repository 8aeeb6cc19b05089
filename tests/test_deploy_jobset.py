"""The JobSet in deploy/k8s/jobset.yaml, as the JobSet and Job controllers
would run it: one Indexed Job per replica group, spares that fit the groups,
one group's failures never restarting another, success without the spares,
and a group template that runs as a plain Job too. Every `fthsdp` command
line in it is parsed by the real argument parser (tests/harness/deploy_files.py)."""

from __future__ import annotations

import copy
import re

import pytest

from fthsdp.core.errors import ConfigError
from tests.harness.deploy_files import DEPLOY, SAMPLE_FIELDS, config_maps, kubernetes_commands, pod_templates
from tests.harness.kubernetes import (
    JOB_FAILURE_REASONS,
    JOBSET_POD_LABELS,
    KUBERNETES,
    RESTARTS_EVERY_JOB,
    check_jobset_fields,
    jobset,
    jobset_failure_action,
    jobset_fields,
    jobset_job,
    jobset_succeeded,
    pod_failures_can_fail,
    rjob_command,
    validate_kubernetes,
)

EXAMPLE = "fthsdp.examples.gpt.train"
"""The example the manifests' ranks run (python -m), from the installed package."""


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
