"""Applying through the real ``kubernetes`` client, against a recording API endpoint.

No API server can run here, so a loopback HTTP server answers the few requests a launch
makes (API discovery, the node and pod lists, patches) and records them. What is checked
is what a real server would receive: server-side apply of every object in order, as
``application/apply-patch+yaml`` with field manager ``krea2`` and ``force``, at the
right resource paths, and merge patches that label and taint the picked nodes.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import kubernetes
import pytest

from krea2.infra.k8s import apply
from krea2.infra.k8s.config import load_launch
from krea2.infra.k8s.manifests import training_manifests

RUN_FILE = Path(__file__).resolve().parents[3] / "configs" / "production" / "krea2-12b.toml"
# (group, version) -> [(plural, kind, namespaced)]
RESOURCES = {
    ("", "v1"): [
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("nodes", "Node", False),
        ("pods", "Pod", True),
    ],
    ("scheduling.k8s.io", "v1"): [("priorityclasses", "PriorityClass", False)],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    ("kueue.x-k8s.io", "v1beta1"): [
        ("localqueues", "LocalQueue", True),
        ("workloadpriorityclasses", "WorkloadPriorityClass", False),
    ],
    ("jobset.x-k8s.io", "v1alpha2"): [("jobsets", "JobSet", True)],
}


def node(name: str, labels: dict | None = None, gpus: int = 8) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


NODES = [node(f"gpu-{i:02d}") for i in range(18)]
NODES[3]["metadata"]["labels"]["krea2.ai/faulty"] = "xid-79"
PODS = [  # a dev machine on gpu-05
    {
        "metadata": {"name": "dev-anna", "namespace": "dev", "labels": {"krea2.ai/role": "dev"}},
        "spec": {"nodeName": "gpu-05", "containers": [{"name": "dev", "image": "dev"}]},
        "status": {"phase": "Running"},
    }
]


class Recorder(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict]] = []

    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass

    def _send(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = urlparse(self.path).path.rstrip("/")
        if path == "/version":
            return self._send({"major": "1", "minor": "31", "gitVersion": "v1.31.0"})
        if path == "/api":
            return self._send({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            groups = [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                    "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                }
                for g, v in RESOURCES
                if g
            ]
            return self._send({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for (group, version), items in RESOURCES.items():
            prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
            if path == prefix:
                resources = [
                    {
                        "name": p,
                        "singularName": "",
                        "namespaced": ns,
                        "kind": k,
                        "verbs": ["get", "list", "patch", "delete"],
                    }
                    for p, k, ns in items
                ]
                return self._send(
                    {
                        "kind": "APIResourceList",
                        "groupVersion": prefix.split("/", 2)[-1] if group else version,
                        "resources": resources,
                    }
                )
        if path == "/api/v1/nodes":
            return self._send(
                {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": NODES}
            )
        if path == "/api/v1/pods":
            return self._send(
                {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": PODS}
            )
        return self._send({"kind": "Status", "code": 404}, 404)

    def do_DELETE(self) -> None:
        Recorder.requests.append({"method": "DELETE", "path": urlparse(self.path).path})
        return self._send({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_PATCH(self) -> None:
        url = urlparse(self.path)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.requests.append(
            {
                "path": url.path,
                "query": parse_qs(url.query),
                "content_type": self.headers["Content-Type"],
                "body": json.loads(body),
            }
        )
        patched = json.loads(body)
        if url.path.startswith("/api/v1/nodes/"):  # answer with the node as patched
            labels = patched.get("metadata", {}).get("labels", {})
            meta = {
                "name": url.path.rsplit("/", 1)[1],
                "labels": {k: v for k, v in labels.items() if v},
            }
            patched = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        return self._send(patched)


@pytest.fixture
def client(tmp_path, monkeypatch):
    Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HOME", str(tmp_path))  # the dynamic client caches discovery there
    config = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    yield kubernetes.client.ApiClient(config)
    server.shutdown()
    server.server_close()


def test_launch_reserves_clean_nodes_then_applies_every_object_in_order(client):
    cfg, run = load_launch(RUN_FILE)
    objects = training_manifests(cfg, run)
    applied = apply.launch(client, cfg, objects)
    assert applied == [f"{o['kind']}/{o['metadata']['name']}" for o in objects]
    node_patches = [r for r in Recorder.requests if r["path"].startswith("/api/v1/nodes/")]
    picked = [r["path"].rsplit("/", 1)[1] for r in node_patches]
    assert len(picked) == 16 and "gpu-03" not in picked and "gpu-05" not in picked  # faulty, dev
    for r in node_patches:
        assert r["content_type"] == "application/strategic-merge-patch+json"
        assert r["body"]["metadata"]["labels"] == {"krea2.ai/reserved-for": "krea2-12b"}
        assert r["body"]["spec"]["taints"] == [
            {"key": "krea2.ai/reserved-for", "value": "krea2-12b", "effect": "NoSchedule"}
        ]
    applies = [r for r in Recorder.requests if not r["path"].startswith("/api/v1/nodes/")]
    assert [r["path"] for r in applies] == [
        "/apis/scheduling.k8s.io/v1/priorityclasses/research-high",
        "/apis/kueue.x-k8s.io/v1beta1/workloadpriorityclasses/research-high",
        "/apis/kueue.x-k8s.io/v1beta1/namespaces/krea2-research/localqueues/research",
        "/api/v1/namespaces/krea2-research/configmaps/krea2-12b-run",
        "/api/v1/namespaces/krea2-research/services/krea2-12b",
        "/apis/policy/v1/namespaces/krea2-research/poddisruptionbudgets/krea2-12b",
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/krea2-research/jobsets/krea2-12b",
    ]
    for r, obj in zip(applies, objects, strict=True):
        assert r["content_type"] == "application/apply-patch+yaml"
        assert r["query"] == {"fieldManager": ["krea2"], "force": ["true"]}
        assert r["body"] == obj


def test_marking_a_node_faulty_patches_its_label(client):
    states = apply.node_states(client)
    assert next(s for s in states if s.name == "gpu-05").roles == frozenset({"dev"})
    from krea2.infra.k8s.nodes import mark_faulty

    gpu7 = next(s for s in states if s.name == "gpu-07")
    apply.apply_node_changes(client, [mark_faulty(gpu7, "pcie replay burst")], states)
    [patch] = Recorder.requests
    assert patch["path"] == "/api/v1/nodes/gpu-07"
    assert patch["content_type"] == "application/strategic-merge-patch+json"  # None deletes
    assert patch["body"] == {"metadata": {"labels": {"krea2.ai/faulty": "pcie-replay-burst"}}}


def test_teardown_deletes_the_runs_objects_and_releases_its_nodes(client, monkeypatch):
    reserved = [node(f"gpu-{i:02d}", {"krea2.ai/reserved-for": "krea2-12b"}) for i in range(2)] + [
        node("gpu-02", {"krea2.ai/reserved-for": "other-run"})
    ]
    for n in reserved[:2]:
        n["spec"]["taints"] = [
            {"key": "krea2.ai/reserved-for", "value": "krea2-12b", "effect": "NoSchedule"}
        ]
    monkeypatch.setattr(sys.modules[__name__], "NODES", reserved)
    cfg, run = load_launch(RUN_FILE)
    deleted = apply.teardown(client, cfg, training_manifests(cfg, run))
    # shared objects (priority classes, the queue) stay for the next run
    assert deleted == [
        "JobSet/krea2-12b",
        "PodDisruptionBudget/krea2-12b",
        "Service/krea2-12b",
        "ConfigMap/krea2-12b-run",
    ]
    patches = {r["path"]: r["body"] for r in Recorder.requests if "method" not in r}
    assert sorted(patches) == ["/api/v1/nodes/gpu-00", "/api/v1/nodes/gpu-01"]
    for body in patches.values():
        assert body == {
            "metadata": {"labels": {"krea2.ai/reserved-for": None}},
            "spec": {"taints": []},
        }
