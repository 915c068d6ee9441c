"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real
`headroom up` on fake GPUs: log in, see the GPUs, watch an experiment reach its end, filter
the runs table, plot, release a quarantined GPU as admin and be refused as a user, and be sent
back to the login form when a token expires. What the page shows is checked against what the
API returns. Each view's screenshot is saved under target/screenshots/ for a person to look at.

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

    def call(self, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, method="POST" if body is not None else "GET")
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


def test_the_runs_table_is_the_export_and_filters(up: Up, page: Page, watched: str) -> None:
    log_in(page, up, up.admin)
    exp = watched
    csv_rows = up.get(f"/v1/export?experiment={exp}").strip().splitlines()[1:]
    show_runs(page, exp, len(csv_rows))
    assert page.inner_text("#runs-count") == f"{len(csv_rows)} of {len(csv_rows)} attempts"
    page.fill("#runs-filter", "util=60")
    until(page, "the filtered rows", lambda: rows(page) == 2)
    assert page.inner_text("#runs-count") == f"2 of {len(csv_rows)} attempts"
    for row in page.query_selector_all("#runs-table tbody tr"):
        assert "60" in row.inner_text()
    page.click("th[data-column=util]")
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
    clean = up.get(f"/v1/export?experiment={exp}&clean_only=true").strip().splitlines()[1:]
    assert clean, "the fake GPUs' figures are clean"
    assert page.get_attribute("#plot-exp", "data-points") == str(len(clean))
    page.uncheck("#plot-exp-clean")
    assert page.get_attribute("#plot-exp", "data-points") == "6"
    assert page.get_attribute("#plot-exp", "data-y") == "duration_s"
    shot(page, "plots")


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
