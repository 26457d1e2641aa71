"""`make lab` really serves JupyterLab: on localhost only, with its access token, and it stops."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
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


# The same non-root identity for every test that needs one: uid/gid 65534 ("nobody"). The course's
# .venv may live under a folder only root can traverse (/root/.pyenv on CI), so the process keeps
# one capability, CAP_DAC_READ_SEARCH (read any file), and nothing else of root's: its uid is not 0,
# so `id -u`, `--allow-root` and every ownership check behave as for an ordinary user.
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
          "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def as_ordinary_user(cmd: list[str]) -> list[str]:
    """`cmd` run as an ordinary user: unchanged if we are not root, else through setpriv."""
    if os.geteuid() != 0:
        return cmd
    if not shutil.which("setpriv"):
        pytest.fail("running as root, and setpriv (util-linux) is missing to test as a non-root user")
    return [*NOBODY, *cmd]


JUPYTER_VARS = ("JUPYTER_", "JUPYTERLAB_", "IPYTHONDIR")


def start_lab(tmp_path: Path, port: int, ordinary_user: bool, sigint_ignored: bool):
    """`make lab --no-browser` on `port`, or (as an ordinary user, when we are root) the exact
    command `make -n lab` prints, run by that user. With ``sigint_ignored`` it starts the way a
    background job of a non-interactive shell does: with SIGINT ignored."""
    args = f"LAB_ARGS=--no-browser --port={port} --ServerApp.port_retries=0"
    cmd = ["make", "--no-print-directory", "lab", args]
    if ordinary_user and os.geteuid() == 0:
        # GNU make refuses to exec .venv/bin/python when only a capability grants the access, so
        # the ordinary user runs the recipe make would run (recipes are made by make, not by us).
        recipe = subprocess.run(["make", "--no-print-directory", "-n", "lab", args], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
        cmd = as_ordinary_user(["sh", "-c", recipe])
    home = tmp_path / "home"
    home.mkdir()
    tmp_path.chmod(0o777)
    home.chmod(0o777)
    # Jupyter's own locations are left to `make lab` (it keeps them in the course folder), except
    # for an ordinary user, who may not write there when root owns the checkout.
    env = {k: v for k, v in os.environ.items() if not k.startswith(JUPYTER_VARS)}
    env.update(HOME=str(home), BROWSER="true")
    if ordinary_user:
        env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    log = (tmp_path / "lab.log").open("w+")

    def before_exec():
        signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.SIG_DFL)

    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True, preexec_fn=before_exec,
    )
    return proc, log


@contextlib.contextmanager
def running_lab(tmp_path: Path, ordinary_user: bool = False, sigint_ignored: bool = False):
    """Start it; yield (process, port, token) once it prints its URL; always stop it."""
    port = free_port()
    proc, log = start_lab(tmp_path, port, ordinary_user, sigint_ignored)
    try:
        deadline, match, text = time.monotonic() + 90, None, ""
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
        if proc.poll() is None:  # a clean stop (no runtime files left), then a forced one
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


@pytest.fixture
def lab(tmp_path):
    with running_lab(tmp_path) as started:
        yield started


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


@pytest.mark.skipif(sys.platform != "linux", reason="setpriv and process groups: Linux CI")
@pytest.mark.parametrize(
    "ordinary_user, sigint_ignored",
    [(False, False), (True, True)],
    ids=["this-user", "non-root-started-with-sigint-ignored"],
)
def test_make_lab_stops_on_the_first_ctrl_c(tmp_path, ordinary_user, sigint_ignored):
    """One Ctrl-C (SIGINT to the process group, as a terminal sends it) and the server is gone
    within seconds: no confirmation prompt, whoever started it, even if SIGINT was inherited as
    ignored (a background job of a non-interactive shell)."""
    with running_lab(tmp_path, ordinary_user, sigint_ignored) as (proc, port, _):
        servers = psutil.Process(proc.pid).children(recursive=True)
        server_pids = [p.pid for p in servers]
        if ordinary_user:
            uids = {p.uids().effective for p in psutil.Process(proc.pid).children(recursive=True)}
            assert 0 not in uids, f"the server runs as root: {uids}"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("make lab was still running 15 s after one Ctrl-C")
        # make may exit before the server it started has finished its clean-up
        _, alive = psutil.wait_procs(servers, timeout=15)
        assert not alive, f"the server was still running 15 s after one Ctrl-C: {alive}"
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the server still answers after Ctrl-C"
    if not ordinary_user:  # started with Jupyter's default locations: nothing in the home folder
        left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "home").rglob("*"))
        assert not left, f"make lab wrote outside the course folder: {left}"
        runtime = ROOT / ".jupyter" / "runtime"
        assert runtime.is_dir(), "make lab should keep Jupyter's runtime files in .jupyter/"
        left = [p.name for pid in server_pids for p in runtime.glob(f"jpserver-{pid}*")]
        assert server_pids and not left, f"runtime files left behind: {left}"
