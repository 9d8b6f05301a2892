"""The published JSON schemas the deployment files are checked against, kept in tests/deploy/schemas/."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMAS = Path(__file__).parents[2] / "deploy" / "schemas"
COMPOSE_SCHEMA = SCHEMAS / "compose" / "compose-spec.json"
KUBERNETES_SCHEMAS = SCHEMAS / "kubernetes-v1.32.0"


def _load(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text())
    assert isinstance(document, dict)
    return document


@cache
def compose_validator() -> Draft202012Validator:
    """The Compose specification's schema."""
    return Draft202012Validator(_load(COMPOSE_SCHEMA))


@cache
def _kubernetes_registry() -> Registry:
    definitions = _load(KUBERNETES_SCHEMAS / "_definitions.json")
    return Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))


def kubernetes_schema_path(api_version: str, kind: str) -> Path:
    """Where the schema of one Kubernetes kind lies (`apps/v1` Deployment: deployment-apps-v1.json;
    `networking.k8s.io/v1` NetworkPolicy: networkpolicy-networking-v1.json)."""
    group, _, version = api_version.rpartition("/")
    group_version = f"{group.split('.')[0]}-{version}" if group else version
    return KUBERNETES_SCHEMAS / f"{kind.lower()}-{group_version}.json"


def kubernetes_validator(api_version: str, kind: str) -> Draft202012Validator:
    """The strict schema of one built-in Kubernetes kind (unknown fields are errors)."""
    path = kubernetes_schema_path(api_version, kind)
    return Draft202012Validator(_load(path), registry=_kubernetes_registry())


def schema_errors(validator: Draft202012Validator, document: Mapping[str, Any]) -> list[str]:
    """Every way `document` breaks the schema, one line each (empty when it validates)."""
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.absolute_path))
    return [f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}" for error in errors]
