"""The faulty-node and reservation lifecycle: pure functions from node states to changes."""

from __future__ import annotations

import pytest

from krea2.infra.errors import UserError
from krea2.infra.k8s.nodes import (
    NodeChange,
    NodeState,
    Taint,
    clear_faulty,
    label_value,
    mark_faulty,
    release,
    reserve,
)

FAULTY, RESERVED = "krea2.ai/faulty", "krea2.ai/reserved-for"


def cluster() -> list[NodeState]:
    return [
        NodeState("n1", gpus=8),
        NodeState("n2", gpus=8, labels={FAULTY: "xid-79"}),
        NodeState("n3", gpus=8, unschedulable=True),
        NodeState("n4", gpus=8, roles=frozenset({"dev"})),
        NodeState("n5", gpus=8, labels={RESERVED: "other-run"}),
        NodeState("n6", gpus=4),
        NodeState("n7", gpus=8, roles=frozenset({"krablet"})),  # interruptible: may be taken
        NodeState("n8", gpus=8),
    ]


def apply(nodes: list[NodeState], changes: list[NodeChange]) -> list[NodeState]:
    """What the cluster looks like after the changes (as the API server would merge them)."""
    by_name = {c.node: c for c in changes}
    out = []
    for n in nodes:
        c = by_name.get(n.name)
        if c is None:
            out.append(n)
            continue
        patch = c.patch(n)
        labels = {k: v for k, v in {**n.labels, **patch["metadata"]["labels"]}.items() if v}
        taints = n.taints
        if "spec" in patch:
            taints = [
                Taint(t["key"], t.get("value", ""), t["effect"]) for t in patch["spec"]["taints"]
            ]
        out.append(NodeState(n.name, labels, taints, n.unschedulable, n.gpus, n.roles))
    return out


def test_reserve_skips_faulty_cordoned_busy_small_and_foreign_nodes():
    changes = reserve(cluster(), "run-a", 3, gpus_per_node=8)
    assert [c.node for c in changes] == ["n1", "n7", "n8"]
    assert all(c.set_labels == {RESERVED: "run-a"} and not c.add_taints for c in changes)


def test_too_few_eligible_nodes_is_one_message_with_the_reasons():
    with pytest.raises(UserError) as info:
        reserve(cluster(), "run-a", 4, gpus_per_node=8)
    message = str(info.value)
    assert "needs 4 nodes with 8 GPUs; 3 of 8 are eligible" in message
    for reason in ("1 cordoned", "1 faulty", "1 fewer than 8 GPUs", "1 reserved for another run"):
        assert reason in message
    assert "1 running training or dev pods" in message


def test_a_relaunch_keeps_its_nodes_and_changes_nothing():
    nodes = apply(cluster(), reserve(cluster(), "run-a", 2, gpus_per_node=8))
    assert reserve(nodes, "run-a", 2, gpus_per_node=8) == []
    # its own training pods do not make its nodes "busy"
    busy = [
        NodeState(n.name, n.labels, n.taints, n.unschedulable, n.gpus, frozenset({"training"}))
        if n.labels.get(RESERVED) == "run-a"
        else n
        for n in nodes
    ]
    assert reserve(busy, "run-a", 2, gpus_per_node=8) == []


def test_large_runs_taint_their_nodes_and_teardown_removes_labels_and_taints():
    nodes = apply(cluster(), reserve(cluster(), "big", 3, gpus_per_node=8, taint=True))
    held = [n for n in nodes if n.labels.get(RESERVED) == "big"]
    assert [t for n in held for t in n.taints] == [Taint(RESERVED, "big")] * 3
    after = apply(nodes, release(nodes, "big"))
    assert not any(RESERVED in n.labels and n.labels[RESERVED] == "big" for n in after)
    assert all(not n.taints for n in after)
    assert next(n for n in after if n.name == "n5").labels[RESERVED] == "other-run"


def test_a_node_marked_faulty_leaves_its_run_and_a_relaunch_replaces_it():
    nodes = apply(cluster(), reserve(cluster(), "run-a", 2, gpus_per_node=8, taint=True))
    n1 = next(n for n in nodes if n.name == "n1")
    change = mark_faulty(n1, "XID 79: fallen off the bus")
    assert change.set_labels == {FAULTY: "XID-79-fallen-off-the-bus"}
    assert change.remove_labels == [RESERVED] and change.remove_taints == [RESERVED]
    nodes = apply(nodes, [change])
    replaced = apply(nodes, reserve(nodes, "run-a", 2, gpus_per_node=8, taint=True))
    assert sorted(n.name for n in replaced if n.labels.get(RESERVED) == "run-a") == ["n7", "n8"]
    repaired = apply(replaced, [clear_faulty(next(n for n in replaced if n.name == "n1"))])
    assert FAULTY not in next(n for n in repaired if n.name == "n1").labels


def test_shrinking_a_run_releases_the_extra_nodes():
    nodes = apply(cluster(), reserve(cluster(), "run-a", 3, gpus_per_node=8))
    changes = reserve(nodes, "run-a", 1, gpus_per_node=8)
    assert [(c.node, c.remove_labels) for c in changes] == [("n7", [RESERVED]), ("n8", [RESERVED])]


def test_patch_deletes_labels_with_null_and_rewrites_the_taint_list():
    node = NodeState(
        "n", labels={RESERVED: "r"}, taints=[Taint("nvidia.com/gpu"), Taint(RESERVED, "r")]
    )
    patch = NodeChange("n", remove_labels=[RESERVED], remove_taints=[RESERVED]).patch(node)
    assert patch == {
        "metadata": {"labels": {RESERVED: None}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    }


def test_label_values_are_made_valid():
    assert label_value("XID 79 (GPU off the bus)!") == "XID-79-GPU-off-the-bus"
    assert len(label_value("x" * 100)) == 63 and label_value("!!!") == "unknown"
