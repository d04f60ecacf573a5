"""The node lifecycle of training runs as pure functions: node states in, label/taint changes out.

The report's launch procedure (§6.4): read the faulty-node list (now node labels, so
pods can keep away by anti-affinity), exclude those and the nodes running training or
dev machines, pick N, label them (and taint them for the largest runs), and remove the
labels and taints on teardown. Nothing here talks to a cluster;
:mod:`krea2.infra.k8s.apply` reads the nodes and applies the changes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from krea2.infra.errors import UserError

BUSY_ROLES = frozenset({"training", "dev"})  # pod roles that make a node unavailable
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass
class NodeState:
    """What placement needs to know about one node."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    unschedulable: bool = False  # cordoned
    gpus: int = 0  # allocatable nvidia.com/gpu
    roles: frozenset[str] = frozenset()  # krea2.ai/role of the pods running there


@dataclass
class NodeChange:
    """Labels to set or remove and taints to add or remove (by key) on one node."""

    node: str
    set_labels: dict[str, str] = field(default_factory=dict)
    remove_labels: list[str] = field(default_factory=list)
    add_taints: list[Taint] = field(default_factory=list)
    remove_taints: list[str] = field(default_factory=list)

    def patch(self, state: NodeState) -> dict[str, Any]:
        """A merge patch for the node: labels by key (None deletes), the full taint list."""
        labels: dict[str, str | None] = dict(self.set_labels)
        labels.update(dict.fromkeys(self.remove_labels))
        dropped = set(self.remove_taints) | {t.key for t in self.add_taints}
        taints = [t for t in state.taints if t.key not in dropped] + list(self.add_taints)
        body: dict[str, Any] = {"metadata": {"labels": labels}}
        if self.add_taints or self.remove_taints:
            body["spec"] = {"taints": [t.as_dict() for t in taints]}
        return body


def label_value(text: str) -> str:
    """``text`` as a valid label value (63 characters of [A-Za-z0-9_.-], alphanumeric ends)."""
    value = _LABEL_VALUE.sub("-", text).strip("-_.")[:63].rstrip("-_.")
    return value or "unknown"


def _why_not(
    node: NodeState, run: str, gpus: int, faulty_label: str, reservation_label: str
) -> str | None:
    if faulty_label in node.labels:
        return "faulty"
    if node.unschedulable:
        return "cordoned"
    if node.gpus < gpus:
        return f"fewer than {gpus} GPUs"
    owner = node.labels.get(reservation_label)
    if owner is not None and owner != run:
        return "reserved for another run"
    if owner is None and node.roles & BUSY_ROLES:
        return "running training or dev pods"
    return None


def reserve(
    nodes: Sequence[NodeState],
    run: str,
    count: int,
    *,
    gpus_per_node: int,
    faulty_label: str = "krea2.ai/faulty",
    reservation_label: str = "krea2.ai/reserved-for",
    taint: bool = False,
) -> list[NodeChange]:
    """Changes that reserve ``count`` clean nodes for ``run`` (idempotent).

    Nodes already reserved for ``run`` are kept first (a relaunch picks the same nodes);
    the rest are taken by name. Reserved nodes beyond ``count``, or that became faulty,
    are released. Raises :class:`UserError` saying why nodes were excluded when too few
    are eligible.
    """
    reasons: Counter[str] = Counter()
    eligible = []
    for node in nodes:
        why = _why_not(node, run, gpus_per_node, faulty_label, reservation_label)
        if why is None:
            eligible.append(node)
        else:
            reasons[why] += 1
    if len(eligible) < count:
        excluded = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items())) or "none"
        raise UserError(
            f"run {run} needs {count} nodes with {gpus_per_node} GPUs; {len(eligible)} of "
            f"{len(nodes)} are eligible (excluded: {excluded}). Free nodes, clear a faulty "
            "label (krea2 infra node NODE --clear) or launch with fewer nodes (--nodes)"
        )
    eligible.sort(key=lambda n: (n.labels.get(reservation_label) != run, n.name))
    picked = {n.name for n in eligible[:count]}
    changes = []
    for node in nodes:
        held = node.labels.get(reservation_label) == run
        tainted = any(t.key == reservation_label for t in node.taints)
        if node.name in picked:
            change = NodeChange(node.name)
            if not held:
                change.set_labels[reservation_label] = run
            if taint and not tainted:
                change.add_taints.append(Taint(reservation_label, run))
            if not taint and tainted:
                change.remove_taints.append(reservation_label)
            if change.set_labels or change.add_taints or change.remove_taints:
                changes.append(change)
        elif held or (tainted and _taint_value(node, reservation_label) == run):
            changes.append(_release_change(node, reservation_label))
    return changes


def _taint_value(node: NodeState, key: str) -> str | None:
    return next((t.value for t in node.taints if t.key == key), None)


def _release_change(node: NodeState, reservation_label: str) -> NodeChange:
    change = NodeChange(node.name, remove_labels=[reservation_label])
    if any(t.key == reservation_label for t in node.taints):
        change.remove_taints.append(reservation_label)
    return change


def release(
    nodes: Sequence[NodeState], run: str, reservation_label: str = "krea2.ai/reserved-for"
) -> list[NodeChange]:
    """Changes that remove ``run``'s reservation labels and taints (teardown)."""
    return [
        _release_change(n, reservation_label)
        for n in nodes
        if n.labels.get(reservation_label) == run or _taint_value(n, reservation_label) == run
    ]


def mark_faulty(
    node: NodeState,
    reason: str,
    faulty_label: str = "krea2.ai/faulty",
    reservation_label: str = "krea2.ai/reserved-for",
) -> NodeChange:
    """Label ``node`` faulty (the value says why) and drop any run's reservation of it.

    The node keeps running other work: dev machines tolerate a hot GPU (the report packs
    them onto faulty nodes); training pods keep away through their node affinity.
    """
    change = _release_change(node, reservation_label)
    if reservation_label not in node.labels:
        change.remove_labels = []
    change.set_labels[faulty_label] = label_value(reason)
    return change


def clear_faulty(node: NodeState, faulty_label: str = "krea2.ai/faulty") -> NodeChange:
    """Return a repaired node to the pool."""
    return NodeChange(
        node.name, remove_labels=[faulty_label] if faulty_label in node.labels else []
    )
