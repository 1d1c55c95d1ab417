"""deploy/argo and deploy/flagger validate offline, strictly, against their kinds' schemas.

Built-in kinds go through ``kubernetes-validate``; it ships no schemas for
custom resources, so AnalysisTemplate and Canary are checked against the CRDs'
own ``openAPIV3Schema`` (tests/data/crds, with their source commits), made
strict: an unknown field is an error, as ``kubectl apply --validate=strict`` says.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "data" / "crds"
K8S_VERSION = "1.37.0"


def _strict(schema: Any) -> Any:
    """Close every object schema that lists its properties (Kubernetes prunes the rest)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in CRDS.glob("*.json.gz"):
        data = json.loads(gzip.decompress(path.read_bytes()))
        for api_version, schema in data["schemas"].items():
            out[(api_version, data["kind"])] = _strict(schema)
    return out


SCHEMAS = _crd_schemas()


def validate(doc: dict[str, Any]) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in SCHEMAS:
        jsonschema.validate(doc, SCHEMAS[key])
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for folder in ("argo", "flagger"):
        for path in sorted((ROOT / "deploy" / folder).glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    docs.append((f"{folder}/{path.name}:{doc['kind']}", doc))
    return docs


@pytest.mark.parametrize(("name", "doc"), manifests(), ids=[n for n, _ in manifests()])
def test_manifest_validates(name: str, doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_kinds_are_the_ones_documented() -> None:
    kinds = sorted(doc["kind"] for _, doc in manifests())
    assert kinds == ["AnalysisTemplate", "Canary", "Secret"]


def test_a_misspelt_field_is_refused() -> None:
    """The validation can fail: the strict schema refuses what a cluster would drop."""
    template = next(doc for _, doc in manifests() if doc["kind"] == "AnalysisTemplate")
    bad = copy.deepcopy(template)
    metric = bad["spec"]["metrics"][0]
    metric["successCondtion"] = metric.pop("successCondition")
    with pytest.raises(jsonschema.ValidationError, match="successCondtion"):
        validate(bad)
    canary = next(doc for _, doc in manifests() if doc["kind"] == "Canary")
    bad = copy.deepcopy(canary)
    bad["spec"]["analysis"]["webhooks"][0]["type"] = "pre-rolout"
    with pytest.raises(jsonschema.ValidationError, match="pre-rolout"):
        validate(bad)
    secret = next(doc for _, doc in manifests() if doc["kind"] == "Secret")
    bad = {**secret, "strinData": secret["stringData"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


def test_the_analysis_conditions_are_the_documented_ones() -> None:
    template = next(doc for _, doc in manifests() if doc["kind"] == "AnalysisTemplate")
    metric = template["spec"]["metrics"][0]
    assert metric["successCondition"] == 'result.verdict == "pass"'
    assert metric["failureCondition"] == 'result.verdict == "fail"'
    assert metric["provider"]["web"]["url"].endswith("/api/v1/routes/{{args.route}}/verdict")


def test_every_flagger_hook_is_wired() -> None:
    canary = next(doc for _, doc in manifests() if doc["kind"] == "Canary")
    hooks = {h["type"]: h for h in canary["spec"]["analysis"]["webhooks"]}
    assert set(hooks) == {"pre-rollout", "confirm-promotion", "rollback", "event"}
    for kind, hook in hooks.items():
        assert hook["url"].endswith(f"/api/v1/flagger/{kind}")
        assert hook["metadata"]["route"] and hook["metadata"]["token"]
