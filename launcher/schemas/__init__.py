"""The JSON Schemas of every `--json` output, generated from launcher.schemas.models.

`python -m launcher.schemas` rewrites the shipped files; `python -m launcher.schemas --check`
exits 1 when one of them differs from what the models say (the test suite runs it).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

DIRECTORY = Path(__file__).parent
EXIT_CODES = [0, 1, 2, 3, 4, 5, 6, 7, 130]


def schema_id(command: str) -> str:
    from launcher.output.jsonout import schema_name

    return schema_name(command)


def shipped(command: str) -> dict[str, Any]:
    """The schema file installed with the package."""
    import json

    text = resources.files("launcher").joinpath(f"schemas/{command}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def build(command: str) -> dict[str, Any]:
    """The JSON Schema of one command's envelope, from its result models."""
    from launcher.schemas.models import CONTRACTS

    contract = next(c for c in CONTRACTS if c.command == command)
    defs: dict[str, Any] = {}
    refs = []
    for model in contract.items:
        defs.update(_model_schema(model, defs))
        refs.append({"$ref": f"#/$defs/{model.__name__}"})
    properties: dict[str, Any] = {
        "schema": {"const": schema_id(command)},
        "exit_code": {
            "enum": EXIT_CODES,
            "description": "the command's exit code: the most severe of its targets'",
        },
        "targets": {
            "type": "array",
            "description": "one item per target, in the order they were named",
            "items": {"anyOf": refs} if refs else False,
            **({} if refs else {"maxItems": 0}),
        },
    }
    required = ["schema", "exit_code", "targets"]
    if contract.extra is not None:
        extra = _model_schema(contract.extra, defs)[contract.extra.__name__]
        properties.update(extra["properties"])
        required += [key for key in extra.get("required", []) if key not in required]
    document: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id(command),
        "title": f"{contract.title} --json",
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }
    if contract.per_target:
        _flattened(document, [defs[m.__name__] for m in contract.items])
    document["$defs"] = defs
    return document


def _model_schema(model: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The model's schema under its own name, and the models it uses beside it."""
    schema: dict[str, Any] = model.model_json_schema(by_alias=True)
    found = dict(schema.pop("$defs", {}))
    found[model.__name__] = schema
    return found


def _flattened(document: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """With exactly one target, its item's fields are repeated at the top level (the shape of
    a one-target document before the envelope); with several, they are absent."""
    properties = document["properties"]
    flat: dict[str, list[Any]] = {}
    for item in items:
        for key, schema in item["properties"].items():
            if key not in properties and schema not in flat.setdefault(key, []):
                flat[key].append(schema)
    for key, schemas in flat.items():
        properties[key] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    document["if"] = {
        "required": ["targets"],
        "properties": {"targets": {"minItems": 1, "maxItems": 1}},
    }
    document["then"] = {"anyOf": [{"required": item.get("required", [])} for item in items]}
    document["else"] = {"not": {"anyOf": [{"required": [key]} for key in flat]}}


def render(command: str) -> str:
    import json

    return json.dumps(build(command), indent=2, ensure_ascii=False) + "\n"


def commands() -> list[str]:
    from launcher.schemas.models import CONTRACTS

    return [c.command for c in CONTRACTS]
