"""Validate rendered Kubernetes objects without a cluster.

* Built-in kinds (``v1``, ``apps/v1``, ``batch/v1``, ``policy/v1``, ``autoscaling/v2``,
  ``scheduling.k8s.io/v1``) against the OpenAPI types the ``kubernetes`` client generates
  its models from (``openapi_types``/``attribute_map``): unknown fields, wrong types and
  missing required fields are errors, like the API server's strict field validation.
* Custom resources (JobSet, Kueue, KEDA) against the trimmed CRD schemas committed in
  ``data/schemas`` with ``jsonschema``; every object is closed (no unknown fields) unless
  marked ``x-kubernetes-preserve-unknown-fields``. A JobSet's job templates are then
  checked as ``batch/v1`` JobTemplateSpecs with the client's models.
* Every ``metadata`` name and label follows Kubernetes' syntax.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes.client.models as models

SCHEMAS = Path(__file__).parent / "data" / "schemas"
_PRIMITIVES: dict[str, Any] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "datetime": str,
    "date": str,
}
_LIST = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict|dict)[\[(]str, (.+)[\])]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def model_errors(value: Any, type_name: str, path: str = "") -> list[str]:
    """Errors of ``value`` against the client model type ``type_name`` (e.g. V1PodSpec)."""
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in model_errors(v, m[1], f"{path}[{i}]")]
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {type(value).__name__}"]
        return [e for k, v in value.items() for e in model_errors(v, m[1], f"{path}.{k}")]
    if type_name == "object":  # IntOrString, Quantity-or-int, free-form maps
        return [] if value is not None else [f"{path}: null"]
    if type_name in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[type_name]) and not (
            isinstance(value, bool) and type_name != "bool"
        )
        return [] if ok else [f"{path}: expected {type_name}, got {value!r}"]
    cls = getattr(models, type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected a {type_name} object, got {value!r}"]
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    errors = [f"{path}.{k}: unknown field of {type_name}" for k in value if k not in by_json]
    known = {by_json[k]: v for k, v in value.items() if k in by_json}
    for attr, v in known.items():
        errors += model_errors(v, cls.openapi_types[attr], f"{path}.{cls.attribute_map[attr]}")
    try:  # the generated (pydantic) models refuse a missing required field
        cls(**known)
    except (ValueError, TypeError) as exc:
        errors.append(f"{path}: {exc}")
    return errors


def _closed(schema: Any) -> Any:
    """The schema with every object closed to unknown fields (the API server prunes them)."""
    if isinstance(schema, dict):
        schema = {k: _closed(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    path = SCHEMAS / f"{api_version.replace('/', '_')}_{kind}.json"
    return _closed(json.loads(path.read_text())) if path.is_file() else None


def metadata_errors(meta: Any, path: str) -> list[str]:
    if not isinstance(meta, dict):
        return [f"{path}: missing"]
    errors = []
    name = meta.get("name", "")
    if not (name and len(name) <= 253 and _DNS_SUBDOMAIN.match(name)):
        errors.append(f"{path}.name: {name!r} is not a DNS subdomain")
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label = key.rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not (
            len(label) <= 63 and _LABEL_NAME.match(label)
        ):
            errors.append(f"{path}.labels: bad key {key!r}")
        if not (isinstance(value, str) and len(value) <= 63 and _LABEL_VALUE.match(value)):
            errors.append(f"{path}.labels.{key}: bad value {value!r}")
    return errors


def validation_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema error of one rendered object (empty: valid)."""
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    where = f"{kind}/{obj.get('metadata', {}).get('name', '?')}"
    errors = metadata_errors(obj.get("metadata"), f"{where} metadata")
    schema = crd_schema(api, kind)
    if schema is not None:
        validator = jsonschema.Draft7Validator(schema)
        for err in validator.iter_errors(obj):
            errors.append(f"{where} {'/'.join(map(str, err.path))}: {err.message}")
        if kind == "JobSet":
            for i, rj in enumerate(obj.get("spec", {}).get("replicatedJobs", [])):
                errors += model_errors(
                    rj.get("template"), "V1JobTemplateSpec", f"{where} replicatedJobs[{i}].template"
                )
                pod = rj.get("template", {}).get("spec", {}).get("template", {})
                errors += metadata_errors({"name": "pod", **pod.get("metadata", {})}, where)
        return errors
    version = api.rpartition("/")[2]
    model = f"{version[:1].upper()}{version[1:]}{kind}"
    if not hasattr(models, model):
        return [f"{where}: no schema for {api} {kind}"]
    body = copy.deepcopy(obj)
    return errors + model_errors(body, model, where)
