"""The course in a real browser: JupyterLab from .venv driven through headless Chromium.

What a learner sees, checked where only a browser can check it, on a budget (nbval, not this test,
executes every notebook and compares every output):

* every numbered notebook (found at run time) opens with its **stored** outputs rendered: as many
  figures as the notebook stores, each decoded (nonzero natural width); LaTeX typeset by MathJax
  with no MathJax error; no "Error rendering" or traceback anywhere;
* the first notebook, with its outputs cleared, runs end to end through **Run > Run All Cells**
  from the menu bar: no error, every cell numbered in order, its figures rendered;
* a notebook broken on purpose shows its error (so the checks above can fail).

A screenshot of each notebook goes to `.artifacts/screenshots/` (git-ignored), with the server's
log and, when something times out, a `<name>-failed.png` of what the browser showed. The server
runs on 127.0.0.1 on a free port with a token and temporary runtime/config/data/settings/workspace
folders, serving copies with autosave off (a test checks the copies were never saved).

The browser: `CHROMIUM` and `CHROMEDRIVER` from the environment, else Debian's `/usr/bin/chromium`
and `/usr/bin/chromedriver` (`make browser` installs them), else `chromium`/`google-chrome` and
`chromedriver` on PATH. Without one, the test is skipped with one line saying how to enable it;
with `CI=true` a missing browser is a failure, not a skip. Nothing is downloaded by a test tool.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import nbformat
import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SCREENSHOTS = ROOT / ".artifacts" / "screenshots"
RUN_FIRST = NOTEBOOKS[:1]  # run end to end through the UI (nbval executes all of them)
RUN_TIMEOUT = 180  # seconds for one notebook's "Run All Cells" (it takes a few seconds)
ENABLE_HINT = ("run `make browser` (Debian/Ubuntu: installs chromium and chromium-driver) or set "
               "CHROMIUM=/path/to/chrome CHROMEDRIVER=/path/to/chromedriver")


def find_browser() -> tuple[Path | None, Path | None]:
    """(chromium, chromedriver): from the environment, Debian's paths, or PATH; None if absent."""

    def first(env: str, paths: list[str], names: list[str]) -> Path | None:
        given = [os.environ[env]] if os.environ.get(env) else []  # given: only that one counts
        for candidate in given or [*paths, *(shutil.which(n) or "" for n in names)]:
            if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
                return Path(candidate)
        return None

    return (
        first("CHROMIUM", ["/usr/bin/chromium", "/usr/bin/chromium-browser"],
              ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]),
        first("CHROMEDRIVER", ["/usr/bin/chromedriver"], ["chromedriver"]),
    )


CHROMIUM, CHROMEDRIVER = find_browser()
MISSING = " and ".join(n for n, p in (("Chromium/Chrome", CHROMIUM), ("chromedriver", CHROMEDRIVER))
                       if p is None)
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")
if MISSING and not IN_CI:  # one skipped module, one line in the summary (in CI: a failure below)
    pytest.skip(f"browser test skipped: no {MISSING} found; to enable it, {ENABLE_HINT}",
                allow_module_level=True)

# JupyterLab user settings for the test server: render every cell (no virtual scrolling, so the
# DOM holds all outputs), never save, and no news/update toasts over the notebook.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
        "doNotDisturbMode": True,
    },
}



# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, token: str, path: str, method: str = "GET") -> tuple[int, object]:
    req = urllib.request.Request(
        f"{base}{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        return e.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


def copy_course(dest: Path, notebooks: list[Path], stored: list[Path]) -> Path:
    """Copy what the notebooks import (shared/, data/), the ``notebooks`` with outputs cleared, and
    the ``stored`` ones as they are into ``stored/`` below them.

    Clearing the outputs means every figure and number the browser shows after a run was computed
    in this run, not read back from the stored notebook. Returns the notebooks folder of the copy."""
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for folder in ("shared", "data"):
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    nb_dir = dest / "notebooks"
    nb_dir.mkdir(parents=True)
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = []
                cell.execution_count = None
        nbformat.write(nb, nb_dir / path.name)
    (nb_dir / "stored").mkdir()
    for path in stored:
        shutil.copy(path, nb_dir / "stored" / path.name)
    return nb_dir


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Lab:
    base: str
    token: str
    root_dir: Path
    proc: subprocess.Popen
    log: Path


def start_lab(tmp: Path, root_dir: Path) -> Lab:
    """JupyterLab from this interpreter's environment (.venv under make) on 127.0.0.1:<free port>."""
    token = secrets.token_hex(24)
    settings = tmp / "lab-settings"
    for rel, values in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(values))
    env = dict(
        os.environ,
        JUPYTER_TOKEN=token,  # kept: the server refuses requests without it
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp / "config"),  # no user config changes what we test
        JUPYTER_DATA_DIR=str(tmp / "data"),  # the notebook-signing key etc. stay in tmp too
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        BROWSER="true",
        PYTHONHASHSEED="0",
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    port = free_port()
    args = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root_dir}", "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # window.jupyterapp: the stored notebooks open one after another in one loaded app, as a
        # learner opens files, instead of reloading JupyterLab (seconds of CPU) for each
        "--LabApp.expose_app_in_browser=True",
    ]
    if os.geteuid() == 0:
        args.append("--allow-root")
    log = tmp / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            args, cwd=root_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, root_dir, proc, log)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited early:\n{log.read_text()[-3000:]}")
        if api(lab.base, token, "/api/status")[0] == 200:
            return lab
        time.sleep(0.3)
    stop_lab(lab)
    raise RuntimeError(f"JupyterLab did not answer within 90 s:\n{log.read_text()[-3000:]}")


def stop_lab(lab: Lab) -> None:
    """Shut the kernels down, stop the server, and kill whatever it started that is still alive."""
    try:
        spawned = psutil.Process(lab.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        spawned = []
    shut_down_kernels(lab)
    if lab.proc.poll() is None:
        lab.proc.send_signal(signal.SIGTERM)
        try:
            lab.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.proc.pid, signal.SIGKILL)
            lab.proc.wait()
    for p in spawned:  # kernels run in their own sessions: end them by pid if still there
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


# --------------------------------------------------------------------------------------------
# The browser
# --------------------------------------------------------------------------------------------


def start_browser(tmp: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    tmp.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp}",
        # no network but this machine: what renders here renders for a reader offline
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ]:
        options.add_argument(flag)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    return driver


@dataclass
class RunResult:
    """What the learner sees after "Run All Cells"."""

    prompts: list[str] = field(default_factory=list)  # "[1]:" ... per non-empty code cell
    errors: list[str] = field(default_factory=list)  # tracebacks / error outputs, as shown
    image_widths: list[int] = field(default_factory=list)  # naturalWidth of output images
    open_seconds: float = 0.0  # page load until the kernel is idle
    run_seconds: float = 0.0  # "Run All Cells" until the kernel is idle again


# One JS read of the notebook's state; cheap enough to poll.
STATE_JS = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) { return null; }
const cells = [...panel.querySelectorAll('.jp-Notebook .jp-CodeCell')];
// A cell whose input is hidden (the collapsed setup cell) shows no editor and no prompt: read
// its execution count from the notebook model instead ("[ ]:" until it has run).
const widget = window.jupyterapp
  ? Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.node === panel) : null;
const codeModels = widget && widget.content
  ? widget.content.widgets.filter(w => w.model.type === 'code').map(w => w.model) : [];
const prompts = cells
  .map((c, i) => {
    const editor = c.querySelector('.jp-InputArea-editor');
    if (editor) {
      const text = (editor.textContent || '').trim();
      return text === '' ? null : (c.querySelector('.jp-InputPrompt')?.textContent || '').trim();
    }
    const model = codeModels[i];
    if (!model || model.sharedModel.getSource().trim() === '') { return null; }
    return model.executionCount ? `[${model.executionCount}]:` : '[ ]:';
  })
  .filter(p => p !== null);
const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
return {
  ncells: panel.querySelectorAll('.jp-Notebook .jp-Cell').length,
  prompts: prompts,
  status: indicator ? indicator.getAttribute('data-status') : null,
};
"""

RESULT_JS = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
const errors = [...panel.querySelectorAll(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"],' +
    '.jp-RenderedText[data-mime-type*="error"]')]
  .map(e => e.innerText)
  .filter(t => /Traceback|Error|Exception/.test(t));
const imgs = [...panel.querySelectorAll('.jp-OutputArea-output img')];
return {errors: errors, widths: imgs.map(i => i.complete ? i.naturalWidth : 0)};
"""


def wait_for(driver, condition, timeout: float, what: str, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition(driver)
        if value:
            return value
        time.sleep(poll)
    last = driver.execute_script(STATE_JS)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; notebook state: {last}")


class Steady:
    """Called with a condition each poll; True once it has held for `seconds` in a row."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.since = seconds, None

    def __call__(self, ok: bool) -> bool:
        if not ok:
            self.since = None
            return False
        self.since = self.since or time.monotonic()
        return time.monotonic() - self.since >= self.seconds


def kernel_idle(lab: Lab, name: str) -> bool:
    """The server's view: this notebook has a session whose kernel is idle."""
    status, sessions = api(lab.base, lab.token, "/api/sessions")
    return status == 200 and any(
        s.get("path") == name and s.get("kernel", {}).get("execution_state") == "idle"
        for s in sessions or []
    )


def click_menu(driver, menu: str, item: str) -> None:
    """Click a top menu-bar entry, then an item of the menu it opens (as a learner does)."""
    from selenium.webdriver.common.by import By

    top = driver.find_element(
        By.XPATH, f"//li[contains(@class,'lm-MenuBar-item')][.//*[normalize-space(text())='{menu}']]"
    )
    top.click()
    entry = wait_for(
        driver,
        lambda d: [
            e
            for e in d.find_elements(
                By.XPATH,
                "//ul[contains(@class,'lm-Menu-content')]/li[contains(@class,'lm-Menu-item')]"
                f"[.//*[contains(@class,'lm-Menu-itemLabel') and normalize-space(text())='{item}']]",
            )
            if e.is_displayed()
        ],
        10,
        f"menu item {menu} > {item}",
    )[0]
    assert "lm-mod-disabled" not in (entry.get_attribute("class") or ""), f"{item} is disabled"
    entry.click()


def run_all_in_lab(driver, lab: Lab, name: str, workspace: str, screenshot: Path) -> RunResult:
    """Open `name` in a fresh workspace, Run > Run All Cells, wait for idle, read the result.

    If anything times out, the browser's view is saved as `<screenshot>-failed.png` first."""
    try:
        return _run_all_in_lab(driver, lab, name, workspace, screenshot)
    except Exception:
        with contextlib.suppress(Exception):
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot.with_name(f"{screenshot.stem}-failed.png")))
        shut_down_kernels(lab)
        raise


def _run_all_in_lab(driver, lab: Lab, name: str, workspace: str, screenshot: Path) -> RunResult:
    from selenium.webdriver.common.by import By

    expected_cells = len(nbformat.read(lab.root_dir / name, as_version=4).cells)
    t0 = time.monotonic()
    if driver.execute_script("return Boolean(window.jupyterapp);"):  # JupyterLab already loaded
        opened = driver.execute_async_script(OPEN_JS, name)
        assert opened is True, f"{name}: JupyterLab could not open it: {opened}"
    else:
        driver.get(f"{lab.base}/lab/workspaces/{workspace}/tree/{quote(name)}?token={lab.token}")

    def ready(d):
        # The toolbar says "idle" even before a kernel exists: also ask the server that this
        # notebook's kernel is up and idle, and let both hold for a second.
        state = d.execute_script(STATE_JS)
        up = (
            state
            and state["ncells"] == expected_cells
            and state["status"] == "idle"
            and kernel_idle(lab, name)
        )
        return steady_open(bool(up))

    steady_open, steady_done = Steady(1.0), Steady(1.0)
    wait_for(driver, ready, 90, f"{name} to open with an idle kernel")
    t1 = time.monotonic()
    driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click()
    click_menu(driver, "Run", "Run All Cells")

    def started(d):
        prompts = d.execute_script(STATE_JS)["prompts"]
        return any(p == "[*]:" or re.fullmatch(r"\[\d+\]:", p) for p in prompts)

    wait_for(driver, started, 20, f"{name}: Run All Cells to start (no cell got queued)")

    def finished(d):
        state = d.execute_script(STATE_JS)
        done = (
            state
            and state["status"] == "idle"
            and not any(p.startswith("[*]") for p in state["prompts"])
            and kernel_idle(lab, name)
        )
        return state if steady_done(bool(done)) else None

    state = wait_for(driver, finished, RUN_TIMEOUT, f"{name}: all cells to run and the kernel to idle")
    # Give images up to 15 s to decode, then read what is on screen (the test judges it).
    deadline = time.monotonic() + 15
    out = driver.execute_script(RESULT_JS)
    while not all(w > 0 for w in out["widths"]) and time.monotonic() < deadline:
        time.sleep(0.25)
        out = driver.execute_script(RESULT_JS)
    t2 = time.monotonic()
    result = RunResult(state["prompts"], out["errors"], out["widths"], t1 - t0, t2 - t1)

    driver.execute_script(
        "const img = document.querySelector("
        "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img');"
        "if (img) { img.scrollIntoView({block: 'center'}); }"
    )
    time.sleep(0.3)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(screenshot))
    shut_down_kernels(lab)  # one kernel at a time: the next notebook starts its own
    return result


def shut_down_kernels(lab: Lab) -> None:
    status, kernels = api(lab.base, lab.token, "/api/kernels")
    for k in kernels if status == 200 and kernels else []:
        api(lab.base, lab.token, f"/api/kernels/{k['id']}", method="DELETE")


# --------------------------------------------------------------------------------------------
# Fixtures and tests
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser_available():
    """Reached without a browser only with CI=true (otherwise the module was skipped above)."""
    if MISSING:
        pytest.fail(f"CI=true needs the browser test, but no {MISSING} was found: {ENABLE_HINT}")


@pytest.fixture(scope="module")
def session(tmp_path_factory, browser_available):
    """One JupyterLab server (on copies of the notebooks) and one browser for the whole module."""
    tmp = tmp_path_factory.mktemp("ui")
    nb_dir = copy_course(tmp / "course", RUN_FIRST, NOTEBOOKS)
    before = {p.relative_to(nb_dir): sha256(p) for p in nb_dir.rglob("*.ipynb")}
    lab = start_lab(tmp, nb_dir)
    driver = None
    try:
        driver = start_browser(tmp / "chrome")
        yield lab, driver, before
    finally:
        if driver is not None:
            driver.quit()
        stop_lab(lab)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(lab.log, SCREENSHOTS / "jupyterlab.log")  # the server's log, for CI artefacts


RENDERED_JS = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) { return null; }
const imgs = [...panel.querySelectorAll('.jp-OutputArea-output img')];
const text = panel.innerText;
return {
  ncells: panel.querySelectorAll('.jp-Notebook .jp-Cell').length,
  widths: imgs.map(i => i.complete ? i.naturalWidth : 0),
  math: panel.querySelectorAll('.jp-MarkdownOutput mjx-container').length,
  math_errors: panel.querySelectorAll('mjx-merror').length,
  raw_dollars: [...panel.querySelectorAll('.jp-MarkdownOutput')]
    .filter(m => /\\$[^$\\s][^$]*\\$/.test(m.innerText)).length,
  render_errors: (text.match(/Error rendering|Javascript Error|Traceback/g) || []).length,
};
"""


# Is the stored-notebooks workspace of JupyterLab loaded in this tab?
STORED_APP_JS = ("return Boolean(window.jupyterapp) && "
                 "location.pathname.includes('/workspaces/ui-stored/');")

# Close every open tab without saving (a notebook that ran is "changed", and closing it would ask),
# then open arguments[0] with the notebook view (File > Open does the same).
OPEN_JS = """
const path = arguments[0], done = arguments[arguments.length - 1];
const app = window.jupyterapp;
for (const w of Array.from(app.shell.widgets('main'))) {
  if (w.context) { w.context.model.dirty = false; }
  w.close();
}
app.commands.execute('docmanager:open', {path: path, factory: 'Notebook'})
  .then(() => done(true), e => done(String(e)));
"""


def stored_pngs(path: Path) -> int:
    return sum(
        "image/png" in out.get("data", {})
        for cell in nbformat.read(path, as_version=4).cells
        if cell.cell_type == "code"
        for out in cell.outputs
    )


def has_math(path: Path) -> bool:
    return any(
        cell.cell_type == "markdown" and re.search(r"\$[^$\s][^$]*\$", cell.source)
        for cell in nbformat.read(path, as_version=4).cells
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_outputs_render(session, path):
    """Open the notebook as committed: its figures, LaTeX and outputs render without errors."""
    lab, driver, _ = session
    name = f"stored/{path.name}"
    expected_cells = len(nbformat.read(path, as_version=4).cells)
    images, math = stored_pngs(path), has_math(path)
    steady = Steady(1.0)

    def rendered(d):
        r = d.execute_script(RENDERED_JS)
        done = (
            r is not None
            and r["ncells"] == expected_cells
            and len(r["widths"]) == images
            and all(w > 0 for w in r["widths"])
            and (r["math"] > 0 or not math)
        )
        return r if steady(bool(done)) else None

    shot = SCREENSHOTS / f"{path.stem}.png"
    if driver.execute_script(STORED_APP_JS):  # JupyterLab is loaded: open it there (close the last)
        opened = driver.execute_async_script(OPEN_JS, name)
        assert opened is True, f"{path.name}: JupyterLab could not open it: {opened}"
    else:
        driver.get(f"{lab.base}/lab/workspaces/ui-stored/tree/{quote(name)}?token={lab.token}")
    try:
        result = wait_for(driver, rendered, 60, f"{path.name}: {images} figures and its LaTeX to render")
    except AssertionError:
        with contextlib.suppress(Exception):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(shot.with_name(f"{shot.stem}-failed.png")))
        raise
    finally:
        shut_down_kernels(lab)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(shot))
    assert result["render_errors"] == 0, f"{path.name}: 'Error rendering' or a traceback is shown"
    assert result["math_errors"] == 0, f"{path.name}: MathJax could not typeset some LaTeX"
    assert result["raw_dollars"] == 0, f"{path.name}: some $...$ LaTeX was left untypeset"


@pytest.mark.parametrize("path", RUN_FIRST, ids=[p.stem for p in RUN_FIRST])
def test_run_all_cells_in_jupyterlab(session, path):
    lab, driver, _ = session
    shot = SCREENSHOTS / f"{path.stem}.png"
    result = run_all_in_lab(driver, lab, path.name, f"ui-{path.stem[:2]}", shot)
    print(
        f"\n{path.name}: opened in {result.open_seconds:.1f} s, ran all cells in "
        f"{result.run_seconds:.1f} s; screenshot {shot.relative_to(ROOT)}"
    )

    assert not result.errors, f"{path.name} shows errors in JupyterLab:\n" + "\n".join(result.errors)
    expected = [f"[{i}]:" for i in range(1, len(result.prompts) + 1)]
    assert result.prompts == expected, (
        f"{path.name}: execution counts after Run All are {result.prompts}; "
        "a cell did not run (or ran out of order)"
    )
    assert result.image_widths, f"{path.name}: no figure rendered in an output area"
    assert result.image_widths[0] > 0, f"{path.name}: the first figure did not load"
    stored = stored_pngs(path)
    assert len(result.image_widths) == stored, (
        f"{path.name}: the browser shows {len(result.image_widths)} figures, the stored notebook {stored}"
    )
    assert shot.stat().st_size > 10_000


@pytest.mark.skipif(sys.platform != "linux", reason="psutil's listening-socket view: Linux")
def test_server_is_local_and_keeps_its_token(session):
    lab, _, _ = session
    assert api(lab.base, lab.token, "/api/kernelspecs")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab.base}/api/kernelspecs", timeout=10)
    assert refused.value.code == 403
    listening = {
        c.laddr.ip
        for c in psutil.Process(lab.proc.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening == {"127.0.0.1"}, listening


def test_a_failing_cell_is_caught(session, tmp_path):
    """The checks above can fail: a notebook whose third cell raises shows the error and stops."""
    lab, driver, _ = session
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A broken notebook"),
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\nplt.imshow([[0, 1], [1, 0]])\nplt.show()"
        ),
        nbformat.v4.new_code_cell("raise ValueError('expected (3, 4), got (4, 3)')"),
        nbformat.v4.new_code_cell("print('never runs')"),
    ]
    name = "zz_broken_on_purpose.ipynb"
    nbformat.write(nb, lab.root_dir / name)
    try:
        result = run_all_in_lab(driver, lab, name, "ui-broken", tmp_path / "broken.png")
    finally:
        (lab.root_dir / name).unlink()
    assert any("ValueError" in e and "expected (3, 4)" in e for e in result.errors), result.errors
    assert result.prompts[:2] == ["[1]:", "[2]:"] and result.prompts[2] != "[3]:", result.prompts
    assert result.image_widths and result.image_widths[0] > 0


def test_nothing_was_saved(session):
    """Running in the browser saved nothing: the served copies are byte-identical, no checkpoints.

    (The repository's notebooks are never served, so they cannot change through this test.)"""
    lab, _, before = session
    after = {p.relative_to(lab.root_dir): sha256(p) for p in lab.root_dir.rglob("*.ipynb")
             if ".ipynb_checkpoints" not in p.parts}
    assert after == before



# --------------------------------------------------------------------------------------------
# The book site (make html), read in the same browser with the network blocked
# --------------------------------------------------------------------------------------------
SITE_PAGE_JS = """
const main = document.querySelector('main') || document.body;
const imgs = [...main.querySelectorAll('img')].filter(i => i.src.includes('/_images/'));
return {
  math: main.querySelectorAll('mjx-container').length,
  math_errors: main.querySelectorAll('mjx-merror').length,
  widths: imgs.map(i => i.complete ? i.naturalWidth : 0),
  alts: imgs.map(i => i.alt),
  colab: [...document.querySelectorAll('a[href*="colab.research.google.com/github/"]')].length,
  binder: [...document.querySelectorAll('a[href*="mybinder.org/v2/gh/"]')].length,
  download: [...document.querySelectorAll('a[href$=".ipynb"]')].map(a => a.href),
};
"""


@pytest.fixture(scope="module")
def served_site(browser_available):
    """The site (built once per state of the course), served from 127.0.0.1 on a free port."""
    import functools
    import http.server
    import threading

    from tests.site_build import built_site

    out = built_site()
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no request log in the test output
            pass

    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_the_site_searches_typesets_and_shows_figures_offline(session, served_site):
    """Search for "softmax" finds notebook 01; its page typesets its math with the site's own
    MathJax and decodes every figure, each with its alt text; launch and download links are there."""
    _, driver, _ = session
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.get(f"{served_site}/search.html?q=softmax")

    def results(d):
        hrefs = d.execute_script(
            "return [...document.querySelectorAll('#search-results li a')].map(a => a.href);")
        return hrefs if any("01_simplified_self_attention" in h for h in hrefs) else None

    wait_for(driver, results, 30, 'search results for "softmax" listing notebook 01')
    driver.save_screenshot(str(SCREENSHOTS / "site-search.png"))

    first = NOTEBOOKS[0]
    driver.get(f"{served_site}/notebooks/{first.stem}.html")
    images = stored_pngs(first)

    def page(d):
        r = d.execute_script(SITE_PAGE_JS)
        ok = r["math"] > 0 and len(r["widths"]) == images and all(w > 0 for w in r["widths"])
        return r if ok else None

    r = wait_for(driver, page, 30, f"{first.name} on the site: typeset math and {images} figures")
    driver.save_screenshot(str(SCREENSHOTS / "site-01.png"))
    assert r["math_errors"] == 0
    assert all(len(a.split()) >= 5 for a in r["alts"]), r["alts"]
    assert r["colab"] and r["binder"], "no launch buttons"
    assert any(h.endswith(f"_sources/notebooks/{first.name}") for h in r["download"]), r["download"]
