"""Turn pydantic JSON schemas into Kubernetes structural OpenAPI v3 schemas (the CRD's one source).

Rules: $refs are inlined; `X | None` becomes X (optional); `int | "auto"` fields carry
x-kubernetes-int-or-string; Literal becomes enum; titles go; descriptions, bounds, defaults and
x-kubernetes-* extensions stay. Anything this converter does not understand is an error, so a model
change cannot silently produce a schema the API server would prune or reject.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

KEEP = {
    "type", "description", "enum", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
    "pattern", "default", "properties", "required", "items", "additionalProperties", "format",
}  # fmt: skip


class SchemaError(ValueError):
    pass


def structural(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, path=model.__name__)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    name = ref.rsplit("/", 1)[-1]
    merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return merged


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "title")}
        if rest.get("default", "") is None:
            rest.pop("default")
        kinds = {o.get("type") for o in options}
        if rest.get("x-kubernetes-int-or-string") or kinds == {"integer", "string"}:
            return _convert({**rest, "x-kubernetes-int-or-string": True}, defs, path)
        if len(options) != 1:
            raise SchemaError(f"{path}: a union of {len(options)} types is not structural; mark it int-or-string")
        return _convert({**_resolve(options[0], defs), **rest}, defs, path)
    extensions = {k: v for k, v in node.items() if k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        return {**{k: node[k] for k in ("description", "default") if k in node}, **extensions}
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
        raise SchemaError(f"{path}: use ge/le bounds, not gt/lt")
    out = {k: v for k, v in node.items() if k in KEEP}
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in node["properties"].items()}
        out.pop("additionalProperties", None)
    if "items" in node:
        out["items"] = _convert(node["items"], defs, f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict) and "properties" not in node:
        if node["additionalProperties"]:
            out["additionalProperties"] = _convert(node["additionalProperties"], defs, f"{path}{{}}")
        else:
            out.pop("additionalProperties")
    if out.get("additionalProperties") is True:
        # free-form JSON (dict[str, Any]): nested values are kept only with preserve-unknown-fields
        del out["additionalProperties"]
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        extensions.setdefault("x-kubernetes-preserve-unknown-fields", True)
    if "type" not in out and not extensions.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaError(f"{path}: no type in {sorted(node)}")
    if not out.get("required", True):
        out.pop("required")
    return {**out, **extensions}
