"""Render the k8s/ kustomizations and validate every object: built-in kinds against the Kubernetes
OpenAPI schemas shipped by kubernetes-validate, custom kinds against the CRD schemas vendored in
k8s/crds/ (SOURCES.md there says where each came from)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CRDS = K8S / "crds"
# The oldest Kubernetes the manifests target; kubectl here is 1.32 as well.
KUBERNETES_VERSION = "1.32.0"

Obj = dict[str, Any]

_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"
_OBJECT_META = {"$ref": f"{_DEFINITIONS_ID}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}


class NoSchema(Exception):
    """A rendered object whose kind has neither a built-in nor a vendored schema."""


def kustomize_command() -> list[str] | None:
    """``kubectl kustomize`` (built-in kustomize) or a standalone ``kustomize build``; None if neither."""
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize"]
    if kustomize := shutil.which("kustomize"):
        return [kustomize, "build"]
    return None


def render(directory: Path) -> list[Obj]:
    """The objects that ``kubectl kustomize directory`` renders."""
    command = kustomize_command()
    if command is None:
        raise RuntimeError("neither kubectl nor kustomize is on PATH")
    out = subprocess.run([*command, str(directory)], check=True, capture_output=True, text=True, timeout=60)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def pod_spec(obj: Obj) -> Obj | None:
    """The pod template spec of a workload (Deployment, StatefulSet, Job), else None."""
    if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
        spec: Obj = obj["spec"]["template"]["spec"]
        return spec
    return None


def containers(spec: Obj) -> Iterator[Obj]:
    """Init containers, then containers."""
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env_of(container: Obj) -> dict[str, Obj]:
    """A container's env entries by name."""
    return {e["name"]: e for e in container.get("env", [])}


# --- validation ------------------------------------------------------------------------------------


def validate(obj: Obj) -> None:
    """Raise if ``obj`` is not valid; NoSchema if nothing can validate its kind."""
    custom = crd_validator(obj["apiVersion"], obj["kind"])
    if custom is not None:
        custom.validate(obj)
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise NoSchema(f"{obj['apiVersion']} {obj['kind']}: no built-in and no vendored schema") from exc


def schema_file(api_version: str, kind: str) -> Path:
    """Where the vendored schema of a custom kind lives: ``<group>_<version>_<kind>.json``."""
    group, _, version = api_version.rpartition("/")
    return CRDS / f"{group}_{version}_{kind.lower()}.json"


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    """A validator for a custom kind from its vendored schema; None for built-in kinds."""
    path = schema_file(api_version, kind)
    if "." not in api_version.split("/")[0] or not path.exists():
        # Core ("v1") and built-in groups ("apps/v1", "policy/v1", ...) have no dot; an unknown
        # custom group falls through to kubernetes-validate, which then reports NoSchema.
        return None
    schema = prepare_crd_schema(json.loads(path.read_text()))
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema.setdefault("required", [])
    schema["required"] = sorted({*schema["required"], "apiVersion", "kind", "metadata"})
    return jsonschema.Draft202012Validator(schema, registry=_definitions_registry())


def prepare_crd_schema(schema: Obj) -> Obj:
    """A CRD's OpenAPI v3 schema as JSON Schema that validates like the API server does.

    - ``nullable: true`` admits null;
    - ``x-kubernetes-int-or-string`` admits an integer or a string;
    - unknown fields are errors where the schema lists properties and does not preserve unknown
      fields (kubectl's default server-side field validation, "Strict", rejects them too);
    - ``metadata`` is checked as a Kubernetes ObjectMeta (the API server does that for every kind).
    Other ``x-kubernetes-*`` keywords (CEL rules, list types) are left out: JSON Schema ignores them.
    """
    out = _prepare(schema)
    out.setdefault("properties", {})["metadata"] = dict(_OBJECT_META)
    return out


_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "$defs")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "items", "not", "additionalItems")


def _prepare(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out: Obj = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS:
            out[key] = {name: _prepare(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS or (key == "items" and isinstance(value, list)):
            out[key] = [_prepare(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = _prepare(value)
        elif key == "$ref" and value.startswith("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"):
            # kubernetes-models' own name for ObjectMeta.
            out[key] = _OBJECT_META["$ref"]
        elif key != "nullable":
            out[key] = value
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("nullable") is True:
        return {"anyOf": [{"type": "null"}, out]}
    return out


@cache
def _definitions_registry() -> Registry:
    # The strict Kubernetes definitions (ObjectMeta rejects unknown fields), as kubernetes-validate uses.
    version = KUBERNETES_VERSION.rsplit(".", 1)[0]
    definitions = schema_contents(
        f"kubernetes-json-schema/v{version}.0-local-strict/_definitions.json", KUBERNETES_VERSION
    )
    return Resource.from_contents(definitions) @ Registry()


# --- the NATS Helm values --------------------------------------------------------------------------


def nats_values() -> Obj:
    values: Obj = yaml.safe_load((K8S / "nats" / "values.yaml").read_text())
    return values
