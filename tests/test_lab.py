"""`make lab` really serves JupyterLab: on localhost only, with its access token, and it stops."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"http://(?:localhost|127\.0\.0\.1):(\d+)/lab\?token=([0-9a-f]{32,})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def lab(tmp_path):
    """Start `make lab --no-browser` on a free port; yield (process, port, token); always stop it."""
    port = free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), BROWSER="true")
    log = (tmp_path / "lab.log").open("w+")
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_ARGS=--no-browser --port={port} --ServerApp.port_retries=0"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )
    try:
        deadline, match = time.monotonic() + 90, None
        while time.monotonic() < deadline and match is None:
            time.sleep(0.5)
            log.seek(0)
            text = log.read()
            match = URL_LINE.search(text)
            assert proc.poll() is None, f"make lab exited early:\n{text[-3000:]}"
        assert match, f"no 'http://localhost:PORT/lab?token=...' line within 90 s:\n{text[-3000:]}"
        assert int(match.group(1)) == port
        yield proc, port, match.group(2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in the terminal
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


@pytest.mark.skipif(sys.platform != "linux", reason="process/socket inspection written for Linux CI")
def test_make_lab_serves_jupyterlab_on_localhost_with_a_token(lab):
    proc, port, token = lab
    base = f"http://127.0.0.1:{port}"

    status, body = get(f"{base}/lab?token={token}")
    assert status == 200 and b"JupyterLab" in body

    status, body = get(f"{base}/api/kernelspecs", token)
    assert status == 200
    specs = json.loads(body)
    assert "python3" in specs["kernelspecs"]

    status, _ = get(f"{base}/api/kernelspecs")  # no token: refused
    assert status == 403

    status, body = get(f"{base}/api/contents", token)  # served from notebooks/
    names = {item["name"] for item in json.loads(body)["content"]}
    assert "01_simplified_self_attention.ipynb" in names

    listening = set()
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:  # short-lived helper processes may exit while we look
            conns = child.net_connections(kind="inet")
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
        listening |= {
            c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        }
    assert listening and listening <= {"127.0.0.1", "::1"}, f"listening on {listening}"


def test_make_lab_stops_cleanly(tmp_path, lab):
    proc, port, _ = lab
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=20)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the server still answers after Ctrl-C"
