"""The spec's JSON Schema as editors get it: served by the coordinator without a token, the
same as ``docs/spec.schema.json``, accepting every example spec and refusing bad ones by the
field, as the coordinator does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import httpx
import jsonschema
import pytest

from headroom_client._spec import load_spec

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def served(cluster: str) -> Dict[str, Any]:
    answer = httpx.get(f"{cluster}/spec.schema.json", timeout=10)
    assert answer.status_code == 200, answer.text
    schema: Dict[str, Any] = answer.json()
    return schema


def test_the_served_schema_is_the_repository_s_and_a_valid_json_schema(served: Dict[str, Any]) -> None:
    assert served == json.loads((ROOT / "docs" / "spec.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(served)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_is_valid(served: Dict[str, Any], example: Path) -> None:
    text = example.read_text()
    assert text.startswith("# yaml-language-server: $schema=../docs/spec.schema.json"), example
    errors = list(jsonschema.Draft202012Validator(served).iter_errors(load_spec(example)))
    assert not errors, [e.message for e in errors]


def test_a_rows_file_is_a_valid_rows(served: Dict[str, Any]) -> None:
    spec = {"name": "e", "command": ["x", "{model}"], "rows": "configs.csv"}
    assert not list(jsonschema.Draft202012Validator(served).iter_errors(spec))


@pytest.mark.parametrize(
    "spec, path",
    [
        ({"name": "e", "command": ["x"], "bogus": 1}, []),
        ({"name": "e"}, []),
        ({"name": "e", "command": ["x"], "metrics": {"acc": {"pattern": "x", "take": "avg"}}}, ["metrics", "acc", "take"]),
        ({"name": "e", "command": ["x"], "early_stop": {"metric": "a", "mode": "best"}}, ["early_stop"]),
        ({"name": "e", "command": ["x"], "zip": {"a": "not a list"}}, ["zip", "a"]),
        ({"name": "e", "command": ["x"], "rows": [["a", 1]]}, ["rows"]),
        ({"name": "e", "command": ["x"], "rows": 3}, ["rows"]),
        # studies: a variant's unknown key, a variant without a name, a bad `after`, none
        ({"name": "s", "experiments": [{"name": "a", "colour": "red"}]}, ["experiments", 0]),
        ({"name": "s", "experiments": [{"command": ["x"]}]}, ["experiments", 0]),
        ({"name": "s", "experiments": [{"name": "a", "after": [{"experiment": "b", "when": "soon"}]}]},
         ["experiments", 0, "after", 0, "when"]),
        ({"name": "s", "experiments": []}, ["experiments"]),
        ({"name": "s", "bogus": 1, "experiments": [{"name": "a"}]}, []),
    ],
)
def test_bad_specs_are_refused_at_their_field(served: Dict[str, Any], spec: Dict[str, Any], path: list) -> None:
    errors = list(jsonschema.Draft202012Validator(served).iter_errors(spec))
    assert errors, spec
    assert any(list(e.absolute_path)[: len(path)] == path for e in errors), [
        (list(e.absolute_path), e.message) for e in errors
    ]


def test_a_study_is_valid_without_a_command_at_the_top(served: Dict[str, Any]) -> None:
    spec = {
        "name": "lab",
        "grid": {"model": ["a", "b"]},
        "experiments": [
            {"name": "train", "command": ["python", "train.py", "{model}"]},
            {"name": "eval", "command": ["python", "eval.py", "{model}"],
             "after": [{"experiment": "train", "match": ["model"], "on_failure": "wait"}]},
        ],
    }
    assert not list(jsonschema.Draft202012Validator(served).iter_errors(spec))
