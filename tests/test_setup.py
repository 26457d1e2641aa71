"""`make`'s set-up recovers from an interruption: a run killed in the middle of `pip install` leaves
a `.venv` that the next run recognises as unfinished and rebuilds, instead of trusting it.

The test runs the Makefile's own recipe (`make venv`) on a tiny package list (one wheel it builds,
served from a local HTTP server on 127.0.0.1) into a temporary `VENV`. The first run is killed
while pip waits for the server; the second run must start again and finish.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG, VERSION = "coursesetupprobe", "1.0"


def build_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel: ``coursesetupprobe`` with ``VALUE = 42``."""
    wheel = folder / f"{PKG}-{VERSION}-py3-none-any.whl"
    dist = f"{PKG}-{VERSION}.dist-info"
    files = {
        f"{PKG}/__init__.py": "VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {PKG}\nVersion: {VERSION}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{dist}/RECORD", "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n")
    return wheel


class Index:
    """A find-links page for the wheel on 127.0.0.1; while ``hold`` is set, requests wait."""

    def __init__(self, folder: Path) -> None:
        self.hold = threading.Event()
        self.requested = threading.Event()
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(folder), **k)

            def do_GET(self):  # noqa: N802 - the http.server API
                index.requested.set()
                while index.hold.is_set():
                    time.sleep(0.05)
                super().do_GET()

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # the killed pip hangs up mid-request: expected, not worth a traceback

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hold.clear()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    build_wheel(served)
    idx = Index(served)
    yield idx
    idx.close()


def make_venv(tmp_path: Path, index: Index) -> subprocess.Popen:
    reqs, model = tmp_path / "requirements.txt", tmp_path / "requirements-model.txt"
    if not reqs.exists():  # written once: a newer list would rightly make make redo the set-up
        reqs.write_text(f"{PKG}=={VERSION}\n")
        model.write_text("# nothing\n")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=index.url,
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    return subprocess.Popen(
        ["make", "--no-print-directory", "venv", f"VENV={tmp_path / 'venv'}",
         f"REQUIREMENTS={reqs}", f"MODEL_REQUIREMENTS={model}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )


def test_a_set_up_killed_during_pip_install_is_redone(tmp_path, index):
    venv = tmp_path / "venv"
    index.hold.set()
    first = make_venv(tmp_path, index)
    assert index.requested.wait(60), "pip never asked the index for the package"
    os.killpg(first.pid, signal.SIGKILL)  # as hard as it gets: no clean-up runs
    first.wait()
    assert (venv / "bin" / "python").exists(), "the first run had created the venv"
    assert not (venv / ".installed").exists(), "a killed set-up must not be stamped complete"
    assert (venv / ".installing").exists()

    index.hold.clear()
    second = make_venv(tmp_path, index)
    out, _ = second.communicate(timeout=180)
    assert second.returncode == 0, out
    assert "interrupted set-up: starting it again" in out
    assert (venv / ".installed").exists() and not (venv / ".installing").exists()
    value = subprocess.run([venv / "bin" / "python", "-c", f"import {PKG}; print({PKG}.VALUE)"],
                           capture_output=True, text=True, check=True).stdout
    assert value.strip() == "42"

    third = make_venv(tmp_path, index)  # complete now: nothing to do
    out, _ = third.communicate(timeout=60)
    assert third.returncode == 0 and "Nothing to be done" in out, out


def test_a_venv_without_pip_is_rebuilt(tmp_path, index):
    """Killed while `python -m venv` was still copying pip in: no .installing yet, but no pip."""
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = make_venv(tmp_path, index)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "interrupted set-up: starting it again" in out
    assert (venv / ".installed").exists()
