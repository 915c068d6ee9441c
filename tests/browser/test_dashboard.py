"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real
`headroom up` on fake GPUs: log in, see the GPUs, watch an experiment reach its end, filter
the runs table (the JSON export, parameters from `params`), read fair share's order and what
each user used, see a user's cap hold a job back, plot with the vendored uPlot (a
log axis for a parameter spanning decades, drag to zoom), see what an experiment's runs
achieved (learning curves, a metric against a parameter, and against energy with its Pareto
front), release a quarantined GPU as admin and be refused as a user, and be sent back to the
login form when a token expires. What the page shows is checked against what the API returns.
Each view's screenshot is saved under target/screenshots/ for a person to look at.

Needs HEADROOM_BIN_DIR (the built binaries; default target/debug) and Chromium at
HEADROOM_CHROMIUM (default /usr/bin/chromium): scripts/test installs both.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("HEADROOM_BIN_DIR", ROOT / "target" / "debug")).resolve()
CHROMIUM = os.environ.get("HEADROOM_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "target" / "screenshots"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60,
             pause: Callable[[float], Any] = lambda ms: time.sleep(ms / 1000)) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        pause(200)
    pytest.fail(f"timed out waiting for {what}")


class Up:
    """`headroom up` on two fake GPUs, its admin token, and calls to its API."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Jobs run as `nobody`: the tree they write in is open to them.
        root.chmod(0o1777)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (root / "up.log").open("wb")
        self.proc = subprocess.Popen(
            [str(BIN_DIR / "headroom"), "up", "--listen", self.url.removeprefix("http://"),
             "--data-dir", str(root / "data"), "--gpu-backend", "fake", "--fake-gpus", "2x24GiB",
             "--kill-grace", "300ms", "--verify-timeout", "1s", "--telemetry-interval", "500ms",
             # Heartbeats, which carry telemetry, every second.
             "--lease-ttl", "3s"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "HEADROOM_LOG": "warn"})
        token = root / "data" / "admin-token"
        self.admin = wait_for("the admin token", lambda: token.exists() and token.read_text().strip())
        wait_for("the GPUs", lambda: len(self.gpus(self.admin)) == 2)

    def call(self, path: str, token: str, body: Any = None, method: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, method=method or ("POST" if body is not None else "GET"))
        req.add_header("Authorization", f"Bearer {token}")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, data, timeout=10) as r:
                text = r.read().decode()
                ok_json = r.headers.get("content-type", "").startswith("application/json")
                return r.status, json.loads(text) if ok_json else text
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "null")

    def get(self, path: str, token: str | None = None) -> Any:
        status, body = self.call(path, token or self.admin)
        assert status == 200, (path, body)
        return body

    def gpus(self, token: str) -> list[tuple[str, dict[str, Any]]]:
        try:
            nodes = self.get("/v1/nodes", token)
        except (AssertionError, OSError):
            return []
        return [(n["name"], g) for n in nodes for g in n["gpus"]]

    def token(self, name: str, expires_in: str | None = None) -> str:
        body: dict[str, Any] = {"name": name, "role": "user"}
        if expires_in:
            body["expires_in"] = expires_in
        status, made = self.call("/v1/tokens", self.admin, body)
        assert status == 200, made
        token: str = made["token"]
        return token

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    with tempfile.TemporaryDirectory(prefix="dashboard") as tmp:
        u = Up(Path(tmp))
        try:
            yield u
        finally:
            u.stop()
            print((Path(tmp) / "up.log").read_text(errors="replace")[-3000:])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (scripts/test installs Debian's `chromium`)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def accept_dialog(d: Any) -> None:
    """What every page does with a dialog (the page's confirmations), unless a test says."""
    d.accept()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # What the content security policy blocks is only said on the console.
    pg.on("console", lambda m: errors.append(m.text)
          if m.type == "error" and "Content Security Policy" in m.text else None)
    pg.on("dialog", accept_dialog)
    yield pg
    ctx.close()
    assert not errors, f"the page's script failed: {errors}"


def shot(pg: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"dashboard-{name}.png"), full_page=True)


def log_in(pg: Page, up: Up, token: str) -> None:
    pg.goto(up.url + "/")
    pg.wait_for_selector("#login:not([hidden])")
    pg.fill("#login-token", token)
    pg.click("#login button[type=submit]")
    pg.wait_for_selector("#tabs:not([hidden])")


def until(pg: Page, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    """Polls from here (the page's policy forbids the string evaluation `wait_for_function`
    uses), letting the page's events through between looks."""
    return wait_for(what, check, timeout, pause=pg.wait_for_timeout)


def rows(pg: Page) -> int:
    return len(pg.query_selector_all("#runs-table tbody tr"))


def show_runs(pg: Page, exp: str, n: int) -> None:
    """Chooses an experiment on the runs tab and waits for its own table: the view shown while
    it is being rebuilt may be another experiment's with as many rows."""
    pg.click("#tabs button[data-tab=runs]")
    pg.wait_for_selector("#runs-experiment")
    pg.select_option("#runs-experiment", exp)
    until(pg, "the experiment's rows", lambda: pg.query_selector(f"#runs-table[data-experiment='{exp}']") is not None
          and rows(pg) == n)


def submit(up: Up, token: str, spec: dict[str, Any]) -> str:
    status, body = up.call("/v1/experiments", token, {"spec": spec})
    assert status == 200, body
    exp: str = body["experiment"]
    return exp


def fake_job(seconds: float) -> list[str]:
    return [str(BIN_DIR / "headroom-fake-job"), "--seconds", str(seconds), "--mem", "300MiB"]


@pytest.fixture(scope="module")
def watched(up: Up) -> str:
    """An experiment of six short jobs at three utilizations, run to its end."""
    exp = submit(up, up.admin, {"name": "watched",
                                "command": fake_job(0.3) + ["--util", "{util}", "--print", "training at {util}"],
                                "grid": {"util": [20, 60, 90]}, "runs_per_config": 2})
    wait_for("the experiment to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 6,
             timeout=90)
    return exp


# ---- the tests, in the order a person would go ---------------------------------------------


def test_the_login_form_then_the_gpus_the_api_lists(up: Up, page: Page) -> None:
    page.goto(up.url + "/")
    page.wait_for_selector("#login:not([hidden])")
    shot(page, "login")
    page.fill("#login-token", "not-a-token-of-this-coordinator")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login-message:not(:empty)")
    assert page.is_visible("#login") and not page.is_visible("#tabs")
    log_in(page, up, up.admin)
    assert page.inner_text("#who-name") == "admin (admin)"
    page.wait_for_selector("[data-gpu]")
    shown = {el.get_attribute("data-gpu") or "": el for el in page.query_selector_all("[data-gpu]")}
    api = up.gpus(up.admin)
    assert sorted(shown) == sorted(f"{n}/{g['index']}" for n, g in api)
    for n, g in api:
        el = shown[f"{n}/{g['index']}"]
        assert el.get_attribute("data-slots") == str(g["slots"])
        text = el.inner_text()
        assert f"{g['slots_used']} / {g['slots']} slots" in text
        assert g["name"] in text and f"of {g['total_mib'] / 1024:.1f} GiB" in text
        # The bar's parts are drawn (the policy lets the script size them).
        widths = [float((seg.get_attribute("style") or "width: 0%").split(":")[1].strip(" %;"))
                  for seg in el.query_selector_all(".bar > span")]
        assert abs(sum(widths) - 100) < 1.5 and max(widths) > 0, widths
    shot(page, "gpus")
    page.emulate_media(color_scheme="dark")
    shot(page, "gpus-dark")


def test_the_link_up_prints_logs_in_once_and_leaves_the_address_bar(up: Up, page: Page) -> None:
    asked: list[str] = []

    def accept(d: Any) -> None:
        asked.append(d.message)
        d.accept()

    page.remove_listener("dialog", accept_dialog)
    page.on("dialog", accept)
    page.goto(f"{up.url}/#token={up.admin}")
    page.wait_for_selector("#tabs:not([hidden])")
    assert len(asked) == 1 and "as admin (role admin)" in asked[0], asked
    assert up.admin not in page.url and page.evaluate("location.hash") == ""
    page.reload()
    page.wait_for_selector("#tabs:not([hidden])")
    page.click("#logout")
    page.wait_for_selector("#login:not([hidden])")
    assert page.evaluate("sessionStorage.length") == 0


def test_a_link_made_by_someone_else_logs_in_nobody_unless_the_person_says_so(
    up: Up, page: Page
) -> None:
    # Mallory's link: the page says whose it is, and a "no" leaves the tab logged out, the
    # token out of the address bar and of the tab.
    mallory = up.token("mallory")
    asked: list[str] = []

    def dismiss(d: Any) -> None:
        asked.append(d.message)
        d.dismiss()

    page.remove_listener("dialog", accept_dialog)
    page.on("dialog", dismiss)
    page.goto(f"{up.url}/#token={mallory}")
    page.wait_for_selector("#login:not([hidden])")
    assert len(asked) == 1 and "as mallory (role user)" in asked[0], asked
    assert mallory not in page.url
    assert page.evaluate("sessionStorage.length") == 0
    assert page.is_hidden("#tabs")


def test_an_experiment_reaches_its_end_on_the_page(up: Up, page: Page) -> None:
    log_in(page, up, up.admin)
    exp = submit(up, up.admin, {"name": "live", "command": fake_job(0.5) + ["--util", "{util}"],
                                "grid": {"util": [20, 60, 90]}, "runs_per_config": 2})
    page.click("#tabs button[data-tab=experiments]")
    card = f"[data-experiment='{exp}']"
    page.wait_for_selector(card)
    # Live: the page updates without a reload until every job has ended.
    until(page, "every job to end on the page",
          lambda: page.get_attribute(card, "data-finished") == "6", timeout=90)
    progress = up.get(f"/v1/progress?experiment={exp}")["counts"]
    assert progress["succeeded"] == 6, progress
    el = page.query_selector(card)
    assert el is not None
    assert el.get_attribute("data-total") == "6"
    assert "succeeded 6" in el.inner_text()
    shot(page, "experiments")


def export_rows(up: Up, exp: str, clean_only: bool = False) -> list[dict[str, Any]]:
    """The experiment's JSON export, every page of it."""
    rows: list[dict[str, Any]] = []
    after = 0
    while True:
        page = up.get(f"/v1/export?format=json&experiment={exp}&after={after}"
                      + ("&clean_only=true" if clean_only else ""))
        rows += page["rows"]
        if page["next_after"] is None:
            return rows
        after = page["next_after"]


def table(pg: Page) -> tuple[list[str], list[list[str]]]:
    """The runs table as shown: its headers' columns and its rows' cells."""
    head = [th.get_attribute("data-column") or "" for th in pg.query_selector_all("#runs-table th")]
    body = [[td.inner_text() for td in tr.query_selector_all("td")]
            for tr in pg.query_selector_all("#runs-table tbody tr")]
    return head, body


def test_the_queue_says_what_a_study_s_waiting_job_waits_for(up: Up, page: Page) -> None:
    log_in(page, up, up.admin)
    status, body = up.call("/v1/experiments", up.admin, {"spec": {
        "name": "chain",
        "experiments": [
            {"name": "train", "command": fake_job(4)},
            {"name": "eval", "command": fake_job(0.2), "after": [{"experiment": "train"}]},
        ]}})
    assert status == 200, body
    page.click("#tabs button[data-tab=queue]")
    row = "#queue-pending tbody tr"
    until(page, "the eval job's reason", lambda: any(
        "chain.eval" in r.inner_text() and "waits for 1 job of chain.train to succeed" in r.inner_text()
        for r in page.query_selector_all(row)))
    shot(page, "queue-waits-for")
    for v in body["variants"]:
        exp = v["experiment"]
        wait_for("the study to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 1,
                 timeout=60)


def put_user(up: Up, name: str, **limits: int) -> str:
    """Makes a user with a fair-share weight and caps (`headroom user create NAME --share N
    --max-jobs N ...`); their token."""
    status, body = up.call(f"/v1/users/{name}", up.admin, {"role": "user", **limits}, method="PUT")
    assert status == 200, body
    assert {k: body[k] for k in limits} == limits, body
    return up.token(name)


def test_the_usage_view_shows_fair_share_and_what_each_user_used(up: Up, page: Page, watched: str) -> None:
    hana = put_user(up, "hana", share=3)
    exp = submit(up, hana, {"name": "hana-usage", "command": fake_job(0.2)})
    wait_for("hana's job to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 1,
             timeout=60)
    log_in(page, up, hana)
    page.click("#tabs button[data-tab=usage]")
    page.wait_for_selector("#usage-rows")
    api = up.get("/v1/usage?since=30d&by=user", hana)
    # Fair share's order as the API gives it (lowest usage per share first), with each share.
    shares = [(tr.get_attribute("data-user"), tr.get_attribute("data-share"))
              for tr in page.query_selector_all("#usage-shares tbody tr")]
    assert shares == [(s["user"], str(s["share"])) for s in api["shares"]], (shares, api["shares"])
    assert ("hana", "3") in shares and "admin" in {u for u, _ in shares}, shares
    assert "me" in (page.get_attribute("#usage-shares tr[data-user=hana]", "class") or "")
    # What each user used over the last 30 days: the admin's watched jobs, hana's one.
    rows = {tr.get_attribute("data-key"): tr for tr in page.query_selector_all("#usage-rows tbody tr")}
    assert set(rows) == {r["key"] for r in api["rows"]}, (list(rows), api["rows"])
    mine = next(r for r in api["rows"] if r["key"] == "hana")
    assert rows["hana"].get_attribute("data-attempts") == str(mine["attempts"]) == "1"
    assert "succeeded 1" in rows["hana"].inner_text()
    assert int(rows["admin"].get_attribute("data-attempts") or "0") >= 6
    shot(page, "usage")
    # By experiment: one row each, named.
    page.select_option("#usage-by", "experiment")
    until(page, "the rows by experiment", lambda: page.get_attribute("#usage", "data-by") == "experiment"
          and page.query_selector(f"#usage-rows tr[data-key='{exp}']") is not None)
    assert "hana-usage" in page.inner_text(f"#usage-rows tr[data-key='{exp}']")
    assert page.query_selector(f"#usage-rows tr[data-key='{watched}']") is not None


def test_the_queue_says_a_user_s_cap_holds_a_job_back(up: Up, page: Page) -> None:
    ivo = put_user(up, "ivo", max_jobs=1)
    # Two GPUs free, but ivo may run one job at once: the other waits, saying why.
    exp = submit(up, ivo, {"name": "capped", "command": fake_job(6), "runs_per_config": 2})
    capped = {"reason": "user_cap", "user": "ivo", "cap": "jobs", "limit": 1, "held": 1}
    wait_for("the API's reason", lambda: capped in [j["pending_reason"] for j in
                                                    up.get(f"/v1/jobs?experiment={exp}&state=queued")])
    log_in(page, up, ivo)
    page.click("#tabs button[data-tab=queue]")
    until(page, "the capped job's reason", lambda: any(
        "capped" in r.inner_text() and "ivo's cap: holds 1 job, at most 1" in r.inner_text()
        for r in page.query_selector_all("#queue-pending tbody tr")))
    shot(page, "queue-user-cap")
    # The other reasons, as the server words them (`headroom ls`).
    said = page.evaluate("""[
        reasonText({reason: "user_cap", user: "alice", cap: "gpus", limit: 2, held: 2}),
        reasonText({reason: "user_cap", user: "alice", cap: "gpu_memory", limit: 24576, held: 20480}),
        reasonText({reason: "fair_share", user: "alice", used_mib_h: 12288, share: 1, ahead: "bob",
                    ahead_used_mib_h: 512, ahead_share: 1}),
    ]""")
    assert said == ["alice's cap: holds 2 GPUs, at most 2",
                    "alice's cap: holds 20 GiB of GPU memory, at most 24 GiB",
                    "fair share: alice used 12.0 GiB-h (share 1), bob 0.5 GiB-h (share 1) and goes first"], said
    wait_for("ivo's jobs to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 2,
             timeout=60)


def test_the_runs_table_is_the_export_and_filters(up: Up, page: Page, watched: str) -> None:
    log_in(page, up, up.admin)
    exp = watched
    api_rows = export_rows(up, exp)
    n = len(api_rows)
    show_runs(page, exp, n)
    assert page.inner_text("#runs-count") == f"{n} of {n} attempts"
    # The parameter's column is the rows' `params`, by name; the fixed columns say what they
    # hold (the export's description and unit) when pointed at.
    head, body = table(page)
    assert head[:2] == ["job_index", "params.util"], head
    assert sorted(r[1] for r in body) == sorted(str(r["params"]["util"]) for r in api_rows)
    assert page.get_attribute("th[data-column=duration_s]", "title") == "From start to end (s)"
    page.fill("#runs-filter", "util=60")
    until(page, "the filtered rows", lambda: rows(page) == 2)
    assert page.inner_text("#runs-count") == f"2 of {n} attempts"
    for row in page.query_selector_all("#runs-table tbody tr"):
        assert "60" in row.inner_text()
    page.fill("#runs-filter", "params.util=90")
    until(page, "the rows filtered by params.util", lambda: rows(page) == 2)
    page.fill("#runs-filter", "util=60")
    until(page, "the filtered rows again", lambda: rows(page) == 2)
    page.click("th[data-column='params.util']")
    shot(page, "runs")
    # An attempt's own telemetry and log, from its row.
    page.click("#runs-table tbody tr")
    page.wait_for_selector("#plot-attempt-mem")
    until(page, "the attempt's log", lambda: "training at 60" in (page.text_content("#run-log") or ""))
    # A redraw of the same experiment keeps the chosen attempt shown.
    shown = page.query_selector("#run-log")
    page.click("#runs-refresh")
    until(page, "the redrawn view", lambda: shown is not None and not shown.is_visible())
    until(page, "the attempt's log again", lambda: "training at 60" in (page.text_content("#run-log") or ""))
    page.fill("#runs-filter", "")


@pytest.fixture(scope="module")
def sweep(up: Up) -> str:
    """An experiment over a learning rate spanning four decades and a grid axis named `node`,
    like the export's own column, run to its end."""
    exp = submit(up, up.admin, {"name": "sweep",
                                "command": fake_job(0.2) + ["--print", "lr {lr} on {node}"],
                                "grid": {"lr": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1], "node": ["left", "right"]}})
    wait_for("the sweep to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 10,
             timeout=90)
    return exp


def test_parameters_come_from_params_even_one_named_like_a_column(up: Up, page: Page, sweep: str) -> None:
    log_in(page, up, up.admin)
    api_rows = export_rows(up, sweep)
    show_runs(page, sweep, 10)
    head, body = table(page)
    # Both: the attempt's node, and the grid's `node`, each under its own header.
    assert "node" in head and "params.node" in head and "params.lr" in head, head
    by_id = {r["attempt_id"]: r for r in api_rows}
    ids = [tr.get_attribute("data-attempt") for tr in page.query_selector_all("#runs-table tbody tr")]
    for attempt, cells in zip(ids, body):
        row = by_id[attempt or ""]
        cell = dict(zip(head, cells))
        assert cell["params.node"] == row["params"]["node"] in ("left", "right"), cell
        assert cell["node"] == row["node"] and cell["node"] not in ("left", "right"), cell
        assert float(cell["params.lr"]) == row["params"]["lr"], cell
        assert cell["job_index"] == str(row["job_index"])
    # `node=` is the fixed column, `params.node=` the parameter.
    page.fill("#runs-filter", "params.node=left")
    until(page, "the left half", lambda: rows(page) == 5)
    assert all(dict(zip(head, r))["params.node"] == "left" for r in table(page)[1])
    page.fill("#runs-filter", "node=left")
    until(page, "no attempt ran on a node named left", lambda: rows(page) == 0)
    page.fill("#runs-filter", f"node={api_rows[0]['node']} params.node=right")
    until(page, "the right half on its node",
          lambda: rows(page) == sum(r["node"] == api_rows[0]["node"] and r["params"]["node"] == "right" for r in api_rows))
    # Sorted by the learning rate as a number (1e-05 before 0.0001).
    page.fill("#runs-filter", "params.node=left")
    until(page, "the left half again", lambda: rows(page) == 5)
    page.click("th[data-column='params.lr']")
    lrs = [float(dict(zip(head, r))["params.lr"]) for r in table(page)[1]]
    assert lrs == sorted(lrs) and len(set(lrs)) == 5, lrs
    shot(page, "runs-params")
    page.fill("#runs-filter", "")


def uplot(pg: Page, sel: str, expr: str) -> Any:
    """A property of the uPlot chart drawn in `sel` (`expr` of `u`, e.g. `u.scales.x.distr`)."""
    return pg.evaluate(f"(() => {{ const el = document.querySelector({json.dumps(sel)}); "
                       f"const u = el && el.uplot; return u ? ({expr}) : null; }})()")


def test_a_parameter_spanning_decades_is_drawn_on_a_log_axis_that_zooms(up: Up, page: Page, sweep: str) -> None:
    log_in(page, up, up.admin)
    page.click("#tabs button[data-tab=plots]")
    page.wait_for_selector("#plot-exp-pick")
    page.select_option("#plot-exp-pick", sweep)
    until(page, "the sweep's chart", lambda: page.get_attribute("#plot-exp", "data-experiment") == sweep)
    page.select_option("#plot-exp-x", "lr")
    page.select_option("#plot-exp-y", "duration_s")
    until(page, "the chart of duration against lr", lambda: page.get_attribute("#plot-exp", "data-x") == "lr"
          and uplot(page, "#plot-exp", "u.series.length") is not None)
    assert page.get_attribute("#plot-exp", "data-x-scale") == "log"
    assert uplot(page, "#plot-exp", "u.scales.x.distr") == 3
    lo, hi = uplot(page, "#plot-exp", "[u.scales.x.min, u.scales.x.max]")
    assert 1e-6 <= lo <= 1e-5 and 0.1 <= hi <= 1, (lo, hi)
    # A label at every decade, not only the ends.
    ticks = (page.get_attribute("#plot-exp", "data-x-ticks") or "").split()
    assert {"1e-5", "1e-4", "0.001", "0.01", "0.1"} <= set(ticks), ticks
    # Every attempt is a point (the fake GPUs' figures are clean).
    assert page.get_attribute("#plot-exp", "data-points") == "10"
    assert uplot(page, "#plot-exp", "u.data[1].filter((y) => y !== null).length") == 10
    shot(page, "plots-log")
    # Drag across the middle to zoom in on x; a double click zooms back out.
    box = page.locator("#plot-exp .u-over").bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.7, y, steps=5)
    page.mouse.up()
    until(page, "the zoom", lambda: (uplot(page, "#plot-exp", "u.scales.x.min") or 0) > lo * 5)
    zoomed = uplot(page, "#plot-exp", "[u.scales.x.min, u.scales.x.max]")
    assert lo < zoomed[0] < zoomed[1] < hi, zoomed
    assert uplot(page, "#plot-exp", "u.scales.x.distr") == 3
    shot(page, "plots-zoomed")
    page.mouse.dblclick(box["x"] + box["width"] / 2, y)
    until(page, "the zoom out", lambda: uplot(page, "#plot-exp", "[u.scales.x.min, u.scales.x.max]") == [lo, hi])


def test_a_user_reads_no_other_users_log(up: Up, page: Page, watched: str) -> None:
    log_in(page, up, up.token("carol"))
    exp = watched
    show_runs(page, exp, 6)
    page.click("#runs-table tbody tr")
    until(page, "the refusal", lambda: "`admin`'s: only they or an admin may read it"
          in (page.text_content("#run-log") or ""))
    assert "training at" not in (page.text_content("#run-log") or "")


def test_plots_show_a_gpu_and_a_metric_against_a_parameter(up: Up, page: Page, watched: str) -> None:
    log_in(page, up, up.admin)
    exp = watched
    page.click("#tabs button[data-tab=plots]")
    page.wait_for_selector("#plot-gpu")
    assert int(page.get_attribute("#plot-gpu", "data-points") or "0") > 0
    page.select_option("#plot-exp-pick", exp)
    until(page, "the experiment's chart", lambda: page.get_attribute("#plot-exp", "data-experiment") == exp)
    page.select_option("#plot-exp-x", "util")
    page.select_option("#plot-exp-y", "duration_s")
    until(page, "the chart of duration against util",
          lambda: page.get_attribute("#plot-exp", "data-y") == "duration_s"
          and page.get_attribute("#plot-exp", "data-x") == "util")
    clean = export_rows(up, exp, clean_only=True)
    assert clean, "the fake GPUs' figures are clean"
    assert page.get_attribute("#plot-exp", "data-points") == str(len(clean))
    # Utilizations from 20 to 90: a linear axis, drawn by uPlot with the time series above.
    assert page.get_attribute("#plot-exp", "data-x-scale") == "linear"
    until(page, "the charts drawn", lambda: uplot(page, "#plot-exp", "u.scales.x.distr") == 1
          and uplot(page, "#plot-gpu", "u.scales.x.time") is True)
    page.uncheck("#plot-exp-clean")
    assert page.get_attribute("#plot-exp", "data-points") == "6"
    assert page.get_attribute("#plot-exp", "data-y") == "duration_s"
    shot(page, "plots")


# Four steps of a metric, printed as the job goes: `acc` grows with `width` (0.12 to 0.30), and
# a wider job sleeps longer (so uses more energy). `{{`/`}}` are the template's literal braces.
LEARN = ("for s in 1 2 3 4; do printf 'HEADROOM_METRIC {{\"step\": %d, \"acc\": 0.%d}}\\n' $s $((10 + s * {width})); "
         "sleep 0.{width}; done")


@pytest.fixture(scope="module")
def learned(up: Up) -> str:
    """An experiment whose jobs report a metric (`HEADROOM_METRIC` lines), over a learning rate
    spanning two decades and a width, run to its end."""
    exp = submit(up, up.admin, {"name": "learned", "command": ["sh", "-c", LEARN],
                                "grid": {"lr": [0.001, 0.01, 0.1], "width": [2, 5]},
                                "resources": {"memory": "1GiB"}})
    wait_for("the learning to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 6,
             timeout=120)
    return exp


Point = tuple[int, float, float]


def pareto(points: list[Point], mode: str) -> list[Point]:
    """The Pareto front of (job index, energy, value) by its definition: the points no other
    dominates (as much energy or less and a value as good or better, one of them strictly), in
    order of energy."""
    sign = 1 if mode == "max" else -1

    def dominates(q: Point, p: Point) -> bool:
        return q[1] <= p[1] and sign * q[2] >= sign * p[2] and (q[1] < p[1] or sign * q[2] > sign * p[2])

    return sorted((p for p in points if not any(dominates(q, p) for q in points)), key=lambda p: (p[1], p[0]))


def front_table(pg: Page) -> list[Point]:
    """The Pareto front as the page lists it: each row's exact numbers."""
    return [(int(tr.get_attribute("data-job-index") or "-1"), float(tr.get_attribute("data-energy") or "nan"),
             float(tr.get_attribute("data-value") or "nan")) for tr in pg.query_selector_all("#results-front tbody tr")]


def test_results_show_learning_curves_a_parameter_and_the_energy_front(up: Up, page: Page, learned: str) -> None:
    api = up.get(f"/v1/experiments/{learned}/metrics")
    assert len(api) == 6 and not any(a["live"] for a in api), api
    assert all(len(a["series"]["acc"]) == 4 and a["ignored"] == 0 for a in api), api
    by_id = {a["attempt"]: a for a in api}
    log_in(page, up, up.admin)
    # From the experiment's card to its results.
    page.click("#tabs button[data-tab=experiments]")
    page.click(f"[data-results='{learned}']")
    until(page, "the experiment's results", lambda: page.get_attribute("#results", "data-experiment") == learned)
    page.select_option("#results-metric", "acc")
    until(page, "the learning curves drawn", lambda: uplot(page, "#results-curves", "u.series.length") is not None)

    # One line per attempt, each with the API's points exactly (a gap where it has no step).
    ids = (page.get_attribute("#results-curves", "data-attempts") or "").split()
    assert sorted(ids) == sorted(by_id), ids
    assert uplot(page, "#results-curves", "u.series.length") == len(api) + 1
    xs, *ys = uplot(page, "#results-curves", "u.data")
    assert len(ys) == len(api)
    for attempt, y in zip(ids, ys):
        drawn = [(x, v) for x, v in zip(xs, y) if v is not None]
        assert drawn == [(p["step"], p["value"]) for p in by_id[attempt]["series"]["acc"]], attempt
    labels = uplot(page, "#results-curves", "u.series.slice(1).map((s) => s.label)")
    for attempt, label in zip(ids, labels):
        a = by_id[attempt]
        assert label.startswith(f"#{a['index']} ") and f"width={a['params']['width']}" in label, label
        assert "pruned" not in label
    assert page.query_selector("#results-rungs") is None, "no early_stop, no rungs"
    shot(page, "results")

    # The final value against the learning rate: 0.001 to 0.1, two decades, a log axis.
    rows = export_rows(up, learned)
    assert all(r["metrics"]["acc"] == r["metric.acc"] == by_id[r["attempt_id"]]["finals"]["acc"] for r in rows), rows
    page.select_option("#results-param", "lr")
    until(page, "acc against lr", lambda: page.get_attribute("#results-param-plot", "data-x") == "lr"
          and uplot(page, "#results-param-plot", "u.scales.x.distr") is not None)
    assert page.get_attribute("#results-param-plot", "data-x-scale") == "log"
    assert uplot(page, "#results-param-plot", "u.scales.x.distr") == 3
    assert page.get_attribute("#results-param-plot", "data-points") == str(len(rows))

    # Against energy: the Pareto front of the clean rows (the export's clean_only), both ways.
    clean = export_rows(up, learned, clean_only=True)
    assert {r["attempt_id"] for r in clean} == {r["attempt_id"] for r in rows if r["clean"]}
    points = [(r["job_index"], r["energy_j"], r["metrics"]["acc"]) for r in clean if r["energy_j"] is not None]
    assert len(points) >= 2, clean
    for mode in ("max", "min"):
        page.select_option("#results-mode", mode)
        until(page, f"the {mode} front", lambda: page.get_attribute("#results-front", "data-mode") == mode)
        assert front_table(page) == pareto(points, mode), (mode, front_table(page), points)
        assert page.get_attribute("#results-energy", "data-points") == str(len(points))
        until(page, "the energy chart drawn", lambda: uplot(page, "#results-energy", "u.series.length") is not None)
        assert f"Pareto front ({mode})" in uplot(page, "#results-energy", "u.series.map((s) => s.label)")
    assert len(pareto(points, "max")) >= 1 and len(pareto(points, "min")) == 1
    shot(page, "results-energy")
    # Flagged rows too, when asked (hollow): every row with an energy.
    page.check("#results-flagged")
    every = [(r["job_index"], r["energy_j"], r["metrics"]["acc"]) for r in rows if r["energy_j"] is not None]
    until(page, "every row", lambda: page.get_attribute("#results-energy", "data-points") == str(len(every)))
    assert front_table(page) == pareto(every, "min")
    page.uncheck("#results-flagged")
    page.select_option("#results-mode", "max")


def test_results_follow_live_attempts_and_show_early_stoppings_decisions(up: Up, page: Page) -> None:
    # Eight steps each, the best widths first: the narrow ones, behind them at the rung of
    # step 2, are pruned (which of the first two goes on depends on which reports first).
    log_in(page, up, up.admin)
    exp = submit(up, up.admin, {"name": "halving", "command": ["sh", "-c", LEARN.replace("1 2 3 4", "1 2 3 4 5 6 7 8")
                                                                .replace("sleep 0.{width}", "sleep 0.6")],
                                "grid": {"width": [9, 8, 2, 1]}, "resources": {"memory": "1GiB"},
                                "early_stop": {"metric": "acc", "mode": "max", "grace_steps": 2, "reduction_factor": 2}})
    asked: list[str] = []
    # Without the query string: the view asks for thinned series (`?points=...`).
    page.on("request", lambda q: asked.append(q.url.split("?", 1)[0]))
    page.click("#tabs button[data-tab=experiments]")
    page.click(f"[data-results='{exp}']")
    until(page, "the experiment's results", lambda: page.get_attribute("#results", "data-experiment") == exp)
    metrics_url = f"{up.url}/v1/experiments/{exp}/metrics"
    # No reload and no Refresh: the view reads the attempts again until every job has ended.
    counts = wait_for("the experiment to end", lambda: (lambda c: c if c["succeeded"] + c["pruned"] == 4 else None)(
        up.get(f"/v1/progress?experiment={exp}")["counts"]), timeout=120)
    assert counts["pruned"] >= 2, counts
    api = up.get(f"/v1/experiments/{exp}/metrics")
    by_id = {a["attempt"]: a for a in api}

    def curves_are_the_api_s() -> bool:
        # The page reads the attempts every few seconds: it has the ended ones' whole series
        # once it read them after their end.
        ids = (page.get_attribute("#results-curves", "data-attempts") or "").split()
        # One read of one chart: the view draws its chart again each time it reads the
        # attempts, and between two reads there may be none.
        drawn = uplot(page, "#results-curves", "[u.series.length, u.data]")
        if sorted(ids) != sorted(by_id) or drawn is None or drawn[0] != len(api) + 1:
            return False
        xs, *ys = drawn[1]
        return all([(x, v) for x, v in zip(xs, y) if v is not None]
                   == [(p["step"], p["value"]) for p in by_id[a]["series"]["acc"]] for a, y in zip(ids, ys))

    until(page, "every attempt's whole curve", lambda: curves_are_the_api_s()
          and page.query_selector_all("#results-rungs tbody tr"), timeout=30)
    assert asked.count(metrics_url) >= 2, asked
    ids = (page.get_attribute("#results-curves", "data-attempts") or "").split()
    xs, *ys = uplot(page, "#results-curves", "u.data")
    dashes = uplot(page, "#results-curves", "u.series.slice(1).map((s) => s.dash || null)")
    labels = uplot(page, "#results-curves", "u.series.slice(1).map((s) => s.label)")
    for attempt, y, dash, label in zip(ids, ys, dashes, labels):
        a = by_id[attempt]
        assert [(x, v) for x, v in zip(xs, y) if v is not None] == [(p["step"], p["value"]) for p in a["series"]["acc"]]
        pruned = any(r["pruned"] for r in a["rungs"])
        assert pruned == (a["state"] == "pruned"), a
        # Pruned: dashed (and faded), and said so in the legend.
        assert (dash is not None) == pruned and ("(pruned)" in label) == pruned, (label, dash, a)
    # The rung decisions listed are the API's, attempt by attempt.
    shown = [(tr.get_attribute("data-attempt"), int(tr.get_attribute("data-rung") or "-1"),
              int(tr.get_attribute("data-step") or "-1"), float(tr.get_attribute("data-value") or "nan"),
              tr.get_attribute("data-cutoff"), "pruned" in (tr.get_attribute("class") or ""))
             for tr in page.query_selector_all("#results-rungs tbody tr")]
    want = [(a["attempt"], r["rung"], r["step"], r["value"], None if r["cutoff"] is None else str(float(r["cutoff"])), r["pruned"])
            for a in sorted(api, key=lambda a: (a["index"], a["number"])) for r in a["rungs"]]
    assert [s[:4] + (None if s[4] is None else str(float(s[4])), s[5]) for s in shown] == want, (shown, want)
    shot(page, "results-pruned")
    # Its card counts the pruned jobs among the finished, in their own colour.
    page.click("#tabs button[data-tab=experiments]")
    card = f".card[data-experiment='{exp}']"
    page.wait_for_selector(card)
    assert page.get_attribute(card, "data-finished") == "4"
    assert page.inner_text(f"{card} [data-state=pruned]") == f"pruned {counts['pruned']}"
    assert float((page.get_attribute(f"{card} .st-pruned", "style") or "width: 0%").split(":")[1].strip(" %;")) > 0
    # The view closed, its reading stops.
    page.wait_for_timeout(4000)
    before = asked.count(metrics_url)
    page.wait_for_timeout(7000)
    assert asked.count(metrics_url) == before, "the results view still reads after it closed"


def test_a_quarantined_gpu_is_released_by_an_admin_and_not_by_a_user(up: Up, page: Page) -> None:
    # Both GPUs' process lists break while the job runs (set by the fake GPUs' own user: a
    # job's control file does not count): its cleanup cannot be verified.
    started = up.root / "breaks.started"
    exp = submit(up, up.admin, {"name": "breaks", "command": ["sh", "-c",
                 f"touch {started}; sleep 1"], "resources": {"memory": "1GiB"}})
    fake = up.root / "data" / "fake-gpus"
    wait_for("the job to start", started.exists)
    for g in (0, 1):
        (fake / f"gpu{g}.fail-processes").write_text("GPU has fallen off the bus")
    wait_for("the job to end", lambda: up.get(f"/v1/progress?experiment={exp}")["counts"]["failed"]
             + up.get(f"/v1/progress?experiment={exp}")["counts"]["succeeded"] == 1)
    quarantined = wait_for("a quarantine", lambda: [f"{n}/{g['index']}" for n, g in up.gpus(up.admin) if g["quarantine"]])
    assert len(quarantined) == 1, quarantined
    target = quarantined[0]
    node, gpu = target.split("/")
    # The other GPU reads again. The quarantined one stays unreadable until it is released
    # (read again and found empty, it would be lifted by itself).
    broken = sorted(fake.glob("gpu*.fail-processes"))
    assert len(broken) == 2, broken
    (fake / f"gpu{1 - int(gpu)}.fail-processes").unlink()

    alice = up.token("alice")
    log_in(page, up, alice)
    page.wait_for_selector(f"[data-gpu='{target}'] .quarantine")
    assert "GPU has fallen off the bus" in page.inner_text(f"[data-gpu='{target}']")
    assert page.query_selector("[data-release]") is None, "a user is offered the release"
    status, body = up.call(f"/v1/nodes/{node}/gpus/{gpu}/release", alice, {})
    assert status == 403, body
    shot(page, "gpus-user")

    page.click("#logout")
    log_in(page, up, up.admin)
    button = f"[data-release='{target}']"
    page.wait_for_selector(button)
    shot(page, "gpus-quarantined")
    page.click(button)
    until(page, "the quarantine to go",
          lambda: page.query_selector(f"[data-gpu='{target}'] .quarantine") is None)
    assert not dict((f"{n}/{g['index']}", g) for n, g in up.gpus(up.admin))[target]["quarantine"]
    (fake / f"gpu{gpu}.fail-processes").unlink()
    wait_for("the GPU to read again", lambda: not dict((f"{n}/{g['index']}", g) for n, g in up.gpus(up.admin))[target].get("error"))


def test_an_expired_token_sends_the_page_back_to_the_login_form(up: Up, page: Page) -> None:
    brief = up.token("brief", expires_in="3s")
    log_in(page, up, brief)
    page.wait_for_selector("[data-gpu]")
    # The GPUs' view redraws every 5 s: the first redraw past the expiry is refused.
    page.wait_for_selector("#login:not([hidden])", timeout=20000)
    assert "expired" in page.inner_text("#login-message")
    assert not page.is_visible("#tabs")
    shot(page, "expired")


def test_the_page_serves_under_a_strict_policy(up: Up) -> None:
    with urllib.request.urlopen(up.url + "/", timeout=10) as r:
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert r.headers["referrer-policy"] == "no-referrer"
    with urllib.request.urlopen(up.url + "/ui/app.js", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/javascript")
    try:
        urllib.request.urlopen(up.url + "/ui/../v1/nodes", timeout=10)
        raise AssertionError("no token needed for the API through /ui/")
    except urllib.error.HTTPError as e:
        assert e.code in (401, 404)


def test_owners_cancel_and_retry_their_experiments_and_no_one_else(up: Up, page: Page) -> None:
    dave, erin = up.token("dave"), up.token("erin")
    # One GPU for each (plan 1 on two GPUs).
    long = submit(up, dave, {"name": "long", "command": fake_job(60)})
    broken = submit(up, dave, {"name": "broken", "command": fake_job(0.1) + ["--exit", "3"]})
    wait_for("the broken job to fail", lambda: up.get(f"/v1/progress?experiment={broken}")["counts"]["failed"] == 1)
    log_in(page, up, erin)
    page.click("#tabs button[data-tab=experiments]")
    page.wait_for_selector(f"[data-experiment='{long}']")
    assert page.query_selector(f"[data-cancel='{long}']") is None, "offered to another user"
    assert page.query_selector(f"[data-retry='{broken}']") is None, "offered to another user"
    status, _ = up.call(f"/v1/experiments/{long}/cancel", erin, {})
    assert status == 403
    page.click("#logout")

    log_in(page, up, dave)
    page.click("#tabs button[data-tab=experiments]")
    page.wait_for_selector(f"[data-cancel='{long}']")
    assert "failures: nonzero 1" in page.inner_text(f"[data-experiment='{broken}']").replace("\n", " ")
    shot(page, "experiments-owner")
    page.click(f"[data-cancel='{long}']")
    wait_for("the cancel", lambda: up.get(f"/v1/progress?experiment={long}")["counts"]["cancelled"] == 1)
    page.click(f"[data-retry='{broken}']")
    wait_for("the retry", lambda: up.get(f"/v1/jobs?experiment={broken}")[0]["attempts"] == 2)
    # One request retried the experiment's failed jobs; the page says how many.
    wait_for("the retry's note", lambda: "1 failed job of broken queued again" in page.inner_text("#status"))


def test_the_charting_library_comes_from_the_binary_under_the_same_policy(up: Up, page: Page, watched: str) -> None:
    with urllib.request.urlopen(up.url + "/", timeout=10) as r:
        csp = r.headers["content-security-policy"]
        assert "unsafe" not in csp and "style-src 'self'" in csp
    for file, kind, start in [("uPlot.iife.min.js", "text/javascript", "/*! https://github.com/leeoniya/uPlot (v1.6.32) */"),
                              ("uPlot.min.css", "text/css", ".uplot"),
                              ("uPlot.LICENSE", "text/plain", "The MIT License (MIT)")]:
        with urllib.request.urlopen(f"{up.url}/ui/{file}", timeout=10) as r:
            assert r.headers["content-type"].startswith(kind), file
            assert r.headers["content-security-policy"] == csp, file
            assert r.headers["x-content-type-options"] == "nosniff", file
            assert r.read().decode().startswith(start), file
    # The page with its charts drawn: nothing asked of anywhere else, and no error on the
    # console (what the policy refuses is said there; the fixture fails on it too).
    asked: list[str] = []
    errors: list[str] = []
    page.on("request", lambda q: asked.append(q.url))
    # (but the page's first question, whether this coordinator runs without tokens: no, 401)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not (
        "401" in m.text and m.location.get("url", "").endswith("/v1/whoami")) else None)
    log_in(page, up, up.admin)
    page.click("#tabs button[data-tab=plots]")
    page.wait_for_selector("#plot-exp-pick")
    page.select_option("#plot-exp-pick", watched)
    until(page, "both charts drawn", lambda: page.get_attribute("#plot-exp", "data-experiment") == watched
          and uplot(page, "#plot-exp", "u.series.length") is not None
          and uplot(page, "#plot-gpu", "u.series.length") is not None)
    assert page.evaluate("typeof uPlot") == "function"
    # uPlot's own style sheet is in force (its legend as a table), and its canvases are drawn.
    assert page.eval_on_selector("#plot-exp .u-wrap", "el => getComputedStyle(el).position") == "relative"
    assert page.eval_on_selector("#plot-exp canvas", "el => el.width") > 0
    assert f"{up.url}/ui/uPlot.iife.min.js" in asked and f"{up.url}/ui/uPlot.min.css" in asked
    elsewhere = [u for u in asked if not u.startswith(up.url + "/") and not u.startswith("data:")]
    assert not elsewhere, elsewhere
    assert not errors, errors
