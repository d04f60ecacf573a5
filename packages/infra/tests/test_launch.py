"""``krea2 infra launch --dry-run``: the production run file renders manifests that pass the
Kubernetes, JobSet and Kueue schemas for 1 and 16 nodes, with gang admission, priorities,
rendezvous, placement and a disruption budget; and the validator catches broken ones."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from krea2.infra.cli import app
from krea2.infra.config import ConfigError
from krea2.infra.extras import MissingExtraError
from krea2.infra.k8s.config import load_launch
from krea2.infra.k8s.manifests import to_yaml, training_manifests

sys.path.insert(0, str(Path(__file__).parent))  # the validator, under importlib mode
from k8s_schema import validation_errors

ROOT = Path(__file__).resolve().parents[3]
RUN_FILE = ROOT / "configs" / "production" / "krea2-12b.toml"


def dry_run(*args: str) -> list[dict]:
    result = CliRunner().invoke(app, ["launch", str(RUN_FILE), "--dry-run", *args])
    assert result.exit_code == 0, result.output
    return [doc for doc in yaml.safe_load_all(result.output) if doc is not None]


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize("nodes", [1, 16])
def test_production_manifests_pass_the_schemas(nodes):
    objects = dry_run("--nodes", str(nodes))
    assert [o["kind"] for o in objects] == [
        "PriorityClass",
        "WorkloadPriorityClass",
        "LocalQueue",
        "ConfigMap",
        "Service",
        "PodDisruptionBudget",
        "JobSet",
    ]
    for obj in objects:
        assert validation_errors(obj) == []
    job = by_kind(objects)["JobSet"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == nodes
    assert by_kind(objects)["PodDisruptionBudget"]["spec"]["minAvailable"] == nodes
    args = job["template"]["spec"]["containers"][0]["args"]
    assert f"--nnodes={nodes}" in args and "--nproc-per-node=8" in args


def test_the_jobset_is_a_suspended_gang_in_its_kueue_queue_with_two_tier_priority():
    objects = by_kind(dry_run())
    js = objects["JobSet"]
    assert js["spec"]["suspend"] is True  # Kueue admits all 16 pods at once, or none
    labels = js["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == objects["LocalQueue"]["metadata"]["name"]
    assert labels["kueue.x-k8s.io/priority-class"] == "research-high"
    assert objects["WorkloadPriorityClass"]["value"] == objects["PriorityClass"]["value"] == 1000
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "research-high"
    assert objects["LocalQueue"]["spec"]["clusterQueue"] == "gpu"


def test_rendezvous_goes_through_the_headless_service_to_pod_zero():
    objects = by_kind(dry_run())
    service, js = objects["Service"], objects["JobSet"]
    assert service["spec"]["clusterIP"] == "None"
    assert js["spec"]["network"]["subdomain"] == service["metadata"]["name"] == "krea2-12b"
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--master-addr=krea2-12b-node-0-0.krea2-12b" in args
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in args
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert (
        "job-completion-index" in env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    )
    # the hang watchdog fires before the 1800 s collective timeout of the run file
    assert float(env["KREA2_HANG_TIMEOUT_S"]["value"]) < 1800


def test_pods_keep_off_faulty_nodes_and_onto_their_reserved_nodes():
    for nodes, tainted in ((1, False), (16, True)):
        js = by_kind(dry_run("--nodes", str(nodes)))["JobSet"]
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        exprs = terms["nodeSelectorTerms"][0]["matchExpressions"]
        assert {"key": "krea2.ai/faulty", "operator": "DoesNotExist"} in exprs
        assert {"key": "krea2.ai/reserved-for", "operator": "In", "values": ["krea2-12b"]} in exprs
        keys = {t["key"] for t in pod["tolerations"]}
        assert ("krea2.ai/reserved-for" in keys) is tainted  # only the largest runs taint
        anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti[0]["topologyKey"] == "kubernetes.io/hostname"  # one pod per node


def test_soft_avoidance_prefers_healthy_nodes_without_requiring_them():
    cfg, run = load_launch(RUN_FILE, ["launch.faulty_avoidance=soft", "launch.reserve_nodes=false"])
    js = training_manifests(cfg, run)[-1]
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    affinity = pod["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    [pref] = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["preference"]["matchExpressions"][0]["key"] == "krea2.ai/faulty"
    assert validation_errors(js) == []


def test_a_run_file_without_launch_gets_the_defaults(tmp_path):
    run = tmp_path / "Toy Run.toml"
    run.write_text('run_dir = "runs/toy"\n[parallel]\ntp = 1\n')
    cfg, facts = load_launch(run)
    assert cfg.name == "toy-run" and cfg.nodes == 1 and facts.run_dir == "runs/toy"
    assert all(validation_errors(o) == [] for o in training_manifests(cfg, facts))


def test_mistakes_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"gpu_per_node=4'; did you mean 'gpus_per_node'"):
        load_launch(RUN_FILE, ["launch.gpu_per_node=4"])
    with pytest.raises(ConfigError, match=r"must start with 'launch\.'"):
        load_launch(RUN_FILE, ["nodes=4"])
    with pytest.raises(ConfigError, match=r"parallel\.tp=2 does not divide"):
        load_launch(RUN_FILE, ["launch.gpus_per_node=1", "launch.nodes=3"])
    with pytest.raises(ConfigError, match="DNS label"):
        load_launch(RUN_FILE, ["launch.queue=Research_Q"])


def test_the_validator_rejects_broken_manifests():
    cfg, run = load_launch(RUN_FILE)
    objects = {o["kind"]: o for o in training_manifests(cfg, run)}
    broken = copy.deepcopy(objects["JobSet"])
    pod = broken["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["imagePullPolicyy"] = "Always"
    pod["containers"][0]["ports"][0]["containerPort"] = "29500"
    broken["spec"]["successPolicy"]["operator"] = "Every"
    broken["spec"]["suspended"] = True
    errors = "\n".join(validation_errors(broken))
    assert "imagePullPolicyy: unknown field of V1Container" in errors
    assert "containerPort: expected int" in errors
    assert "'Every' is not one of ['All', 'Any']" in errors
    assert "'suspended' was unexpected" in errors
    no_containers = copy.deepcopy(objects["JobSet"])
    del no_containers["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ]
    errors = "\n".join(validation_errors(no_containers))
    assert "V1PodSpec" in errors and "containers\n  Field required" in errors
    pdb = copy.deepcopy(objects["PodDisruptionBudget"])
    pdb["metadata"]["labels"]["krea2.ai/run"] = "not a label value!"
    pdb["spec"]["minAvaliable"] = 1
    errors = "\n".join(validation_errors(pdb))
    assert "bad value 'not a label value!'" in errors and "minAvaliable: unknown field" in errors
    queue = copy.deepcopy(objects["LocalQueue"])
    queue["spec"]["clusterQueue"] = "GPU_Queue"
    assert validation_errors(queue)


def test_yaml_needs_the_k8s_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(MissingExtraError, match=r"krea2-infra\[k8s\]"):
        to_yaml([])


def test_pods_run_unprivileged_and_take_secrets_only_from_kubernetes_secrets():
    cfg, run = load_launch(RUN_FILE, ['launch.secret_env={"WANDB_API_KEY" = "wandb/api-key"}'])
    objects = training_manifests(cfg, run)
    assert all(validation_errors(o) == [] for o in objects)
    pod = by_kind(objects)["JobSet"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = pod["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    ref = next(e for e in container["env"] if e["name"] == "WANDB_API_KEY")
    assert ref == {"name": "WANDB_API_KEY",
                   "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}  # fmt: skip
    # A secret written as a plain value would land in the pod spec and the ConfigMap.
    with pytest.raises(ConfigError, match=r"HF_TOKEN.*look like secrets.*secret_env"):
        load_launch(RUN_FILE, ['launch.env={"HF_TOKEN" = "hf_abc"}'])
    with pytest.raises(ConfigError, match="secret-name/key"):
        load_launch(RUN_FILE, ['launch.secret_env={"X_TOKEN" = "no-key"}'])
    image_user, _ = load_launch(RUN_FILE, ["launch.run_as_user=-1"])
    jobset = by_kind(training_manifests(image_user, run))["JobSet"]
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
