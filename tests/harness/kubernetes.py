"""The Kubernetes manifests in deploy/k8s as the API server and the JobSet
controller read them, for tests/test_deploy.py and tests/test_deploy_jobset.py:
the schema check (kubernetes-validate for Kubernetes' own kinds, the JobSet
API's fields here), and what the JobSet and Job controllers do with a
JobSet (the Jobs it makes, when a failure restarts or fails it, when it
succeeds)."""

from __future__ import annotations

import re

from tests.harness.deploy_files import DEPLOY, SAMPLE_FIELDS, Command, kubernetes_commands, yaml_documents

KUBERNETES = DEPLOY / "k8s"
KUBERNETES_VERSIONS = ("1.30.0", "latest")
"""The oldest Kubernetes the manifests need (gRPC probes, the Job's
podReplacementPolicy) and the newest schema kubernetes-validate bundles."""


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
