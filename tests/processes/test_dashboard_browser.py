"""The dashboard in a real browser over a real cluster.

A ``berth up`` cluster (:class:`~berth.processes.up.LocalCluster`: nats-server, three agent
processes with the fake runtime, a scheduler serving the API) gets an image, three workloads
and a cordoned node through the operator's client; then Debian's headless Chromium opens the
URL ``berth up`` prints (``/?token=…``: the cookie, the redirect), runs the page's script and
dumps the DOM it built — the nodes, workloads and placements must be there, a command with
markup in it shown as text — and takes a screenshot.  The screenshot's path is printed
(``pytest -s`` shows it); ``BERTH_DASHBOARD_PNG=docs/dashboard.png`` also copies it there (the
README's picture).  Then the attack the review found: a page on another port of the same host
(a workload's own web server) that holds the visitor's dashboard session posts a cordon with
it — the API must refuse it (another origin, no CSRF value), so the node stays uncordoned.
Last, on a cluster whose nodes run processes, a workload's ``logs`` link opens its output.

Skipped only where ``/usr/bin/chromium`` is absent; ``.ci/run`` installs it, so CI runs it.
"""

from __future__ import annotations

import contextlib
import html
import http.server
import json
import os
import re
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from berth.api.client import ApiClient, ApiLocation
from berth.errors import NoCapacity
from berth.processes.up import LocalCluster

CHROMIUM = Path("/usr/bin/chromium")
NODES = ("node-00", "node-01", "node-02")
WINDOW = (1400, 820)
MARKUP = "<b>not-bold</b>"

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)"
    ),
    pytest.mark.slow,  # starts a whole berth up
]


@dataclass
class Running:
    url: str
    token: str
    workloads: list[str]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Running]:
    with LocalCluster(3, heartbeat_s=0.5, runtime="fake", http=("127.0.0.1", 0)) as up:
        assert up.api_url is not None and up.api_token is not None
        with ApiClient(ApiLocation(up.api_url, up.api_token, "test")) as api:
            api.add_image({"name": "hello", "layers": [{"id": "sha256:1111", "size": "28MiB"}]})
            ids = [
                api.create_workload(
                    {"name": name, "image": "hello", "type": kind, "command": command, **more}
                ).id
                for name, kind, command, more in (
                    ("web", "micro", ["python", "-m", "http.server"], {}),
                    ("batch", "milli", ["echo", MARKUP], {}),
                    ("cache", "centi", ["redis-server", "--port", "6380"], {}),
                    ("train", "base", ["python", "train.py"], {"platforms": ["linux/arm64"]}),
                )
            ]
            with pytest.raises(NoCapacity):  # a refusal, for the placements table
                api.create_workload(
                    {"name": "huge", "image": "hello", "type": "kilo", "command": ["true"]}
                )
            api.cordon("node-01")
        yield Running(up.api_url, up.api_token, ids)


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a fresh profile; ``--virtual-time-budget`` lets the page's
    script fetch and draw before the DOM is dumped or the screenshot taken."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_the_page_shows_the_cluster(cluster: Running, tmp_path: Path) -> None:
    dom = chromium(tmp_path / "profile", "--dump-dom", f"{cluster.url}/?token={cluster.token}")
    page = dom.stdout
    assert 'data-state="live"' in page, page[:3000]  # the script ran and the API answered
    polls = re.search(r'data-polls="(\d+)"', page)
    assert polls and int(polls.group(1)) >= 2, page[:500]  # and redrew again, a second later
    for name in NODES:
        assert f'<tr data-node="{name}"' in page, name
    assert 'data-node="node-01" class="cordoned"' in page
    for workload in cluster.workloads:
        assert f'<tr data-workload="{workload}"' in page, workload
    assert "python -m http.server" in page and "redis-server --port 6380" in page
    assert html.escape(MARKUP, quote=False) in page and MARKUP not in page  # text, not markup
    assert page.count('<span class="badge ok">placed</span>') == 4
    assert '<span class="badge warn">no_capacity</span>' in page
    assert "booted" in page  # the placements' explanations
    for workload in cluster.workloads:  # each row links to the workload's output
        assert f'<a href="#logs={workload}">logs</a>' in page, workload
    assert '<section id="logs" hidden="">' in page  # closed until a link is followed


def test_a_workloads_logs_link_opens_its_output(tmp_path: Path) -> None:
    lines = ["first line", MARKUP, "ünïcode"]
    script = "; ".join(f"echo '{line}'" for line in lines) + "; sleep 60"
    with LocalCluster(1, heartbeat_s=0.5, runtime="process", http=("127.0.0.1", 0)) as up:
        assert up.api_url is not None and up.api_token is not None
        with ApiClient(ApiLocation(up.api_url, up.api_token, "test")) as api:
            layers = [{"id": "sha256:1111", "size": "1MiB"}]
            body = {"name": "talks", "type": "micro", "command": ["sh", "-c", script]}
            workload_id = api.create_workload({**body, "layers": layers}).id
            for _ in range(100):  # its three lines are on its node
                if api.logs(workload_id).text.count("\n") == len(lines):
                    break
                time.sleep(0.1)
            url = f"{up.api_url}/?token={up.api_token}#logs={workload_id}"
            page = chromium(tmp_path / "profile", "--dump-dom", url).stdout
            api.stop(workload_id, grace_s=0)
    assert 'data-state="live"' in page, page[:3000]
    assert '<section id="logs">' in page, page[-3000:]  # the link's panel is open
    shown = re.search(r'<pre id="logs-text">(.*?)</pre>', page, re.S)
    assert shown is not None, page[-3000:]
    assert html.unescape(shown.group(1)) == "".join(f"{line}\n" for line in lines)
    assert html.escape(MARKUP, quote=False) in shown.group(1)  # text, not markup
    assert f"following (berth logs {workload_id} -f)" in page


def test_a_wrong_token_gets_no_cluster(cluster: Running, tmp_path: Path) -> None:
    # (no token at all: test_dashboard.py, in process)
    page = chromium(tmp_path / "profile", "--dump-dom", f"{cluster.url}/?token=wrong").stdout
    assert "not authorized" in page and "node-00" not in page


def test_screenshot(cluster: Running, tmp_path: Path) -> None:
    shot = tmp_path / "dashboard.png"
    chromium(
        tmp_path / "profile",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--hide-scrollbars",
        f"--screenshot={shot}",
        f"{cluster.url}/?token={cluster.token}",
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == WINDOW
    assert len(data) > 20_000  # a drawn page, not a blank one (that is ~5 kB)
    print(f"\ndashboard screenshot: {shot}")
    wanted = os.environ.get("BERTH_DASHBOARD_PNG")
    if wanted:
        shutil.copyfile(shot, wanted)
        print(f"copied to {wanted}")


ATTACK = """<!doctype html><html><body data-done="no"><script>
(async () => {
  const api = %(api)s;
  // the visitor's session: in life, the dashboard they opened earlier in this browser
  await fetch(api + "/?token=" + %(token)s, {mode: "no-cors", credentials: "include"});
  await fetch(api + "/v1/nodes/node-02/cordon",
    {method: "POST", mode: "no-cors", credentials: "include"});
  document.body.dataset.done = "yes";
})();
</script></body></html>"""


@contextlib.contextmanager
def attacker_site(page: str) -> Iterator[str]:
    """``page`` served at ``http://127.0.0.1:<another port>/``: the other site's URL."""
    body = page.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join()


def test_a_page_on_another_port_cannot_cordon_with_the_visitors_session(
    cluster: Running, tmp_path: Path
) -> None:
    page = ATTACK % {"api": json.dumps(cluster.url), "token": json.dumps(cluster.token)}
    with ApiClient(ApiLocation(cluster.url, cluster.token, "test")) as api:
        assert not api.node("node-02").cordoned
        try:
            with attacker_site(page) as url:
                dom = chromium(tmp_path / "profile", "--dump-dom", url).stdout
            assert 'data-done="yes"' in dom, dom[:2000]  # the page's script ran to its end
            assert not api.node("node-02").cordoned  # and its forged cordon changed nothing
        finally:
            api.uncordon("node-02")
