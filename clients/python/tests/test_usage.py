"""``usage()``: what each user and experiment used, and every user's fair-share standing, from
a coordinator that needs tokens (users with shares and caps are an admin's) and an agent on a
fake GPU. A user's jobs run to their end; the report is read as that user, by user and by
experiment, over windows given as text and as a ``timedelta``, from both faces."""

from __future__ import annotations

from datetime import timedelta
from typing import Dict, Iterator

import httpx
import pytest

from headroom_client import AsyncClient, Client, InvalidError, UsageReport

from .conftest import running_cluster

ADMIN = "py-usage-admin-token-0123456789abcdef"
#: The coordinator's fair-share half-life, which the report gives back in seconds.
HALF_LIFE_S = 3600


@pytest.fixture(scope="module")
def lab() -> Iterator[Dict[str, str]]:
    """The coordinator's URL and the tokens of alice (share 1) and bob (share 2, at most one
    GPU at once), made by the admin; alice has run two jobs to their end (`experiment`)."""
    flags = ("--fair-share-half-life", f"{HALF_LIFE_S}s")
    with running_cluster("py-usage", "1x24GiB", None, *flags, admin_token=ADMIN) as url:
        admin = {"authorization": f"Bearer {ADMIN}"}
        tokens = {"url": url}
        with httpx.Client(base_url=url, headers=admin) as http:
            for name, limits in [("alice", {"share": 1}), ("bob", {"share": 2, "max_gpus": 1})]:
                put = http.put(f"/v1/users/{name}", json={"role": "user", **limits})
                assert put.status_code == 200, put.text
                assert {k: put.json()[k] for k in limits} == limits, put.text
                made = http.post("/v1/tokens", json={"name": name, "role": "user"})
                assert made.status_code == 200, made.text
                tokens[name] = made.json()["token"]
        with Client(url, tokens["alice"]) as alice:
            exp = alice.submit(
                {
                    "name": "py-usage",
                    "command": ["true"],
                    "runs_per_config": 2,
                    "resources": {"gpus": 1, "memory": "1GiB"},
                }
            )
            done = exp.wait(timeout=60)
            assert done.counts.succeeded == 2, done.counts
            assert exp.id is not None
            tokens["experiment"] = exp.id
        yield tokens


def test_usage_reads_what_each_user_used_and_the_shares(lab: Dict[str, str]) -> None:
    with Client(lab["url"], lab["alice"]) as alice:
        report = alice.usage()
    assert isinstance(report, UsageReport)
    assert report.by == "user" and report.half_life_s == HALF_LIFE_S
    # The default window: the last 30 days.
    assert abs((report.until - report.since) - timedelta(days=30)) < timedelta(seconds=5)
    rows = {r.key: r for r in report.rows}
    mine = rows["alice"]
    assert mine.name is None
    assert mine.attempts >= 2, mine
    assert mine.jobs.get("succeeded") == 2, mine
    assert mine.gib_hours >= 0 and mine.gpu_hours >= 0, mine
    assert mine.energy_kwh >= mine.clean_energy_kwh >= 0, mine
    # Every user's standing: alice ran jobs, bob has a share of 2; lowest normalized first.
    shares = {s.user: s for s in report.shares}
    assert {"alice", "bob"} <= set(shares), report.shares
    assert shares["alice"].share == 1 and shares["bob"].share == 2
    assert shares["alice"].running_jobs == 0 and shares["alice"].running_gpus == 0
    assert shares["alice"].used_gib_hours >= 0
    normalized = [s.normalized for s in report.shares]
    assert normalized == sorted(normalized), report.shares


def test_usage_by_experiment_and_over_a_timedelta(lab: Dict[str, str]) -> None:
    with Client(lab["url"], lab["bob"]) as bob:
        report = bob.usage(timedelta(hours=1), by="experiment")
    assert report.by == "experiment"
    assert abs((report.until - report.since) - timedelta(hours=1)) < timedelta(seconds=5)
    row = {r.key: r for r in report.rows}[lab["experiment"]]
    assert row.name == "py-usage" and row.attempts >= 2, row


def test_a_window_the_coordinator_cannot_read_is_an_error_naming_since(
    lab: Dict[str, str],
) -> None:
    with Client(lab["url"], lab["alice"]) as alice:
        with pytest.raises(InvalidError) as refused:
            alice.usage(since="nonsense")
        assert refused.value.field == "since", refused.value
        assert "nonsense" in str(refused.value)
        # Told here, before anything is sent.
        with pytest.raises(ValueError, match="'user' or 'experiment'"):
            alice.usage(by="project")  # type: ignore[arg-type]


async def test_the_async_client_reads_usage_too(lab: Dict[str, str]) -> None:
    async with AsyncClient(lab["url"], lab["alice"]) as alice:
        report = await alice.usage("30d", by="user")
        assert {r.key for r in report.rows} >= {"alice"}
        with pytest.raises(InvalidError) as refused:
            await alice.usage("soon")
        assert refused.value.field == "since"
