"""The served OpenAPI document: valid (openapi-spec-validator), matching the client's models
field by field, and honoured by the running coordinator under schemathesis fuzzing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Set, Tuple

import httpx
import pytest
from openapi_spec_validator import validate

from headroom_client.models import ALL_MODELS

from .conftest import start_coordinator

#: The fuzzed coordinator's admin token: it requires one, so every route's gate is fuzzed too
#: (a request without it is a 401, as the document says).
FUZZ_TOKEN = "fuzz-admin-token-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def document(cluster: str) -> Dict[str, Any]:
    resp = httpx.get(f"{cluster}/openapi.json")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    return resp.json()


@pytest.fixture(scope="module")
def figures(cluster: str) -> Set[str]:
    """The run's figures as the export declares them (`measurements!` on the server)."""
    resp = httpx.get(f"{cluster}/v1/export", params={"format": "json", "limit": 1})
    assert resp.status_code == 200, resp.text
    return {c["name"] for c in resp.json()["columns"] if c.get("figure")}


def test_the_document_is_valid_openapi(document: Dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"].startswith("3.1")


def _fields(schema: Dict[str, Any], schemas: Dict[str, Any]) -> Tuple[Set[str], Set[str]]:
    """(all properties, required ones) of a component, `allOf` parts merged."""
    if "$ref" in schema:
        return _fields(schemas[schema["$ref"].rsplit("/", 1)[1]], schemas)
    props, required = set(schema.get("properties", {})), set(schema.get("required", []))
    for part in schema.get("allOf", []):
        p, r = _fields(part, schemas)
        props |= p
        required |= r
    return props, required


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_models_match_the_served_components(
    model: Any, document: Dict[str, Any], figures: Set[str]
) -> None:
    schemas = document["components"]["schemas"]
    assert model.__schema__ in schemas, f"no component {model.__schema__}"
    props, required = _fields(schemas[model.__schema__], schemas)
    # By the API's names: a field named like a Python keyword has an alias (`from_`: `from`).
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    assert set(fields) <= props, f"{model.__name__}: fields the API does not have"
    # A figure the server declares reaches frames through the export's columns and models as
    # an extra attribute (`extra="allow"`) before it is typed here; any other field must be.
    untyped = props - set(fields) - figures
    assert not untyped, f"{model.__name__}: fields not typed: {sorted(untyped)}"
    model_required = {name for name, f in fields.items() if f.is_required()}
    assert model_required == required, f"{model.__name__}: required fields differ"


def test_every_error_answer_uses_the_one_error_shape(document: Dict[str, Any]) -> None:
    responses = document["components"]["responses"]
    for path, item in document["paths"].items():
        for method, op in item.items():
            for status, resp in op["responses"].items():
                if int(status) < 400:
                    continue
                name = resp["$ref"].rsplit("/", 1)[1]
                schema = responses[name]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)


def _schemathesis() -> str:
    exe = Path(sys.executable).parent / "schemathesis"
    found = str(exe) if exe.exists() else shutil.which("schemathesis")
    if not found:
        pytest.fail("schemathesis is not installed (scripts/test installs it)")
    return found


def _seed_data(url: str) -> Dict[str, str]:
    """An experiment, a registered agent (played by this test over HTTP: nothing runs) and a
    leased attempt, so the fuzzer reaches past `not_found` into the handlers and the store."""
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {FUZZ_TOKEN}"}) as http:
        sub = http.post(
            "/v1/experiments",
            json={"spec": {"name": "fuzz", "command": ["true"], "runs_per_config": 3,
                           "resources": {"gpus": 1, "memory": "1GiB"}}},
        )
        assert sub.status_code == 200, sub.text
        made = http.post("/v1/tokens", json={"name": "fuzz-node", "role": "agent"})
        assert made.status_code == 200, made.text
        as_agent = {"authorization": f"Bearer {made.json()['token']}"}
        gpu = {"index": 0, "uuid": "GPU-fuzz-0", "name": "fake", "total_mib": 24576}
        reg = http.post(
            "/v1/agents/register",
            json={"node": "fuzz-node", "gpus": [gpu], "version": "fuzz"},
            headers=as_agent,
        )
        assert reg.status_code == 200, reg.text
        agent = reg.json()["agent"]
        claim = http.post(
            f"/v1/agents/{agent}/claim",
            json={"gpus": [{"index": 0, "used_mib": 0, "free_mib": 24576}], "max": 1},
            headers=as_agent,
        )
        assert claim.status_code == 200, claim.text
        lease = claim.json()["leases"][0]
        return {
            "experiment": sub.json()["experiment"],
            "job": lease["job"],
            "attempt": lease["attempt"],
            "agent": agent,
        }


def test_fuzzing_finds_no_server_error_and_no_undocumented_answer(tmp_path: Path) -> None:
    """schemathesis against a coordinator of its own, with no agent: what it submits is never
    run. Every answer must be documented (status, content type, schema), none a 5xx."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(FUZZ_TOKEN + "\n")
    token_file.chmod(0o600)
    url, coord = start_coordinator(
        tmp_path, "--long-poll", "1s", "--max-jobs", "50", "--admin-token-file", str(token_file)
    )
    examples = os.environ.get("HEADROOM_FUZZ_EXAMPLES", "15")
    ids = _seed_data(url)
    # Path ids of real rows (schemathesis.toml in the run's directory).
    config = "".join(
        f'[[operations]]\ninclude-path-regex = "{rx}"\nparameters = {{ "path.{p}" = "{v}" }}\n'
        for rx, p, v in [
            ("^/v1/experiments/", "id", ids["experiment"]),
            ("^/v1/jobs/", "id", ids["job"]),
            ("^/v1/attempts/", "id", ids["attempt"]),
            ("^/v1/agents/[{]", "id", ids["agent"]),
            ("^/v1/nodes/", "name", "fuzz-node"),
        ]
    )
    # Rules that tie fields together, which no schema of one field states: the document
    # lists them on their operations (`x-cross-field-rules`), and there a 422 for data the
    # schema allows is the rule speaking, not a break of the contract.
    doc = httpx.get(f"{url}/openapi.json").json()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if op.get("x-cross-field-rules"):
                config += (
                    f'[[operations]]\ninclude-path = "{path}"\ninclude-method = "{method.upper()}"\n'
                    '[operations.checks.positive_data_acceptance]\n'
                    'expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]\n'
                )
    (tmp_path / "schemathesis.toml").write_text(config)
    try:
        run = subprocess.run(
            [
                _schemathesis(),
                "run",
                f"{url}/openapi.json",
                "--checks",
                os.environ.get("HEADROOM_FUZZ_CHECKS", "all"),
                # Authenticated, so the run keeps working once the coordinator wants tokens.
                "--header",
                f"Authorization: Bearer {FUZZ_TOKEN}",
                "--phases",
                "coverage,fuzzing,stateful",
                "--max-examples",
                examples,
                "--seed",
                os.environ.get("HEADROOM_FUZZ_SEED", "11"),
                "--request-timeout",
                "15",
                "--generation-database",
                "none",
                "--no-color",
                "--workers",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        coord.stop()
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-20000:] + "\n--- coordinator ---\n" + coord.output()[-5000:]
    cases = re.search(r"(\d+) generated", out)
    assert cases is not None, out[-5000:]
    assert int(cases.group(1)) >= 300, f"only {cases.group(1)} cases"
    print(f"schemathesis: {cases.group(0)} cases, all passed")
