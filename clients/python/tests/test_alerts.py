"""Alerts from a notebook: a user subscribes a webhook (a real HTTP server on loopback) to
their experiments' ends, runs one, and the receiver gets the coordinator's POST with its
idempotency key; ``alerts()`` shows the delivery; a host the admin did not allow is refused
naming the field; another user neither sees nor removes the subscription."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List

import httpx
import pytest

from headroom_client import AlertsView, Client, ForbiddenError, InvalidError, NotFoundError

from .conftest import free_port, running_cluster

ADMIN = "py-alerts-admin-token-0123456789abcdef"


class Receiver:
    """A webhook receiver: answers 200 and keeps each POST's idempotency key and body."""

    def __init__(self) -> None:
        self.port = free_port()
        self.got: List[Dict[str, Any]] = []
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                key = self.headers.get("Idempotency-Key")  # case-insensitive
                got.append({"key": key, "body": json.loads(body)})
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def lab() -> Iterator[Dict[str, Any]]:
    receiver = Receiver()
    flags = ("--alert-webhook-hosts", f"127.0.0.1:{receiver.port}")
    with running_cluster("py-alerts", "1x24GiB", None, *flags, admin_token=ADMIN) as url:
        tokens: Dict[str, Any] = {"url": url, "receiver": receiver}
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN}"}) as http:
            for name in ["alice", "bob"]:
                assert http.put(f"/v1/users/{name}", json={"role": "user"}).status_code == 200
                made = http.post("/v1/tokens", json={"name": name, "role": "user"})
                assert made.status_code == 200, made.text
                tokens[name] = made.json()["token"]
        yield tokens
    receiver.server.shutdown()


def test_a_subscribed_webhook_hears_of_the_experiment_s_end(lab: Dict[str, Any]) -> None:
    receiver: Receiver = lab["receiver"]
    with Client(lab["url"], lab["alice"]) as alice:
        sub = alice.subscribe(["experiment-ended"], webhook=receiver.url("/hooks/secret"))
        assert sub.owner == "alice" and sub.on == ["experiment-ended"]
        assert "secret" not in json.dumps(sub.target), sub.target
        exp = alice.submit({"name": "py-alerts", "command": ["true"], "resources": {"gpus": 1}})
        exp.wait(timeout=60)
        deadline = time.monotonic() + 20
        while not receiver.got and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(receiver.got) == 1, receiver.got
        got = receiver.got[0]
        assert got["body"]["kind"] == "experiment-ended"
        assert got["body"]["details"]["experiment"] == exp.id
        assert got["key"] == got["body"]["id"]
        view = alice.alerts()
        assert isinstance(view, AlertsView)
        assert [d.state for d in view.deliveries] == ["delivered"], view
        assert view.deliveries[0].id == got["body"]["id"]

        # A host the admin did not list is refused, naming the field.
        with pytest.raises(InvalidError) as refused:
            alice.subscribe(["node-lost"], webhook="http://198.51.100.7/x")
        assert refused.value.field == "target.webhook.url"
        with pytest.raises(ValueError):
            alice.subscribe(["node-lost"])

        # Bob neither sees nor removes it.
        with Client(lab["url"], lab["bob"]) as bob:
            assert bob.alerts().subscriptions == []
            with pytest.raises(ForbiddenError):
                bob.unsubscribe(sub.id)
        assert alice.unsubscribe(sub.id).id == sub.id
        assert alice.alerts().subscriptions == []
        with pytest.raises(NotFoundError):
            alice.unsubscribe(sub.id)
