"""Stored outputs do not depend on the machine: the notebooks print the same on a learner's laptop
with a CUDA build of torch and the CUDA toolkit but no GPU, or on a Mac whose torch offers MPS, run
by an ordinary (non-root) user.

The tests choose the device: `make test` sets COURSE_DEVICE=cpu, which
`shared.benchmark.pick_device` honours, so a machine with MPS (or a GPU) still reproduces the stored
CPU outputs, while a learner in JupyterLab or Colab gets the accelerator.

That machine is simulated: a stub `nvcc` on PATH, `CUDA_HOME` set, and `tests/fake_cuda/` on
PYTHONPATH, whose sitecustomize makes the CPU build of torch look like a CUDA build without a GPU.
On such a machine torch logs "No CUDA runtime is found" to stderr when `torch.utils.benchmark` is
imported, which strict nbval reports as an unexpected output. The first test proves the simulation
really provokes that notice; the second runs notebook 05 (devices, timing, torch.utils.benchmark)
there under strict nbval, as a non-root user when we are root. The fix, in the setup cell that
every notebook shares (a test checks they are identical), covers the other notebooks the same way;
nbval already runs each of them once, and running all of them twice would double the budget.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_lab import as_ordinary_user

ROOT = Path(__file__).resolve().parent.parent
DEVICE_NOTEBOOK = ROOT / "notebooks" / "05_attention_on_the_gpu.ipynb"
NOTICE = "No CUDA runtime is found"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="setpriv and stub nvcc: Linux")


@pytest.fixture(scope="module")
def laptop(tmp_path_factory) -> dict[str, str]:
    """The environment of a CUDA-toolkit machine without a GPU, with a writable HOME."""
    # not under pytest's own temporary folder, which only root may enter
    tmp = Path(tempfile.mkdtemp(prefix="laptop-"))
    cuda = tmp / "cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text('#!/bin/sh\necho "Cuda compilation tools, release 12.8"\n')
    nvcc.chmod(0o755)
    home = tmp / "home"
    home.mkdir()
    for p in (tmp, home):
        p.chmod(0o777)
    yield dict(
        os.environ,
        PATH=f"{cuda / 'bin'}{os.pathsep}{os.environ['PATH']}",
        CUDA_HOME=str(cuda),
        PYTHONPATH=str(ROOT / "tests" / "fake_cuda"),
        HOME=str(home),
        MPLCONFIGDIR=str(home / "mpl"),
        IPYTHONDIR=str(home / "ipython"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        PYTHONHASHSEED="0",
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        FAKE_MPS="1",  # and torch offers Apple's MPS, as on a Mac
        COURSE_DEVICE="cpu",  # as `make test` sets it
    )
    shutil.rmtree(tmp, ignore_errors=True)


def test_the_simulated_laptop_provokes_the_notice(laptop):
    """Without the setup cell's fix, importing torch.utils.benchmark there prints the notice."""
    out = subprocess.run([sys.executable, "-c", "import torch.utils.benchmark"], env=laptop,
                         capture_output=True, text=True, check=True)
    assert NOTICE in out.stderr, out.stderr


@pytest.mark.parametrize("course_device, expected", [("", "mps"), ("cpu", "cpu")])
def test_the_simulated_laptop_offers_mps_unless_the_tests_choose_the_cpu(laptop, course_device,
                                                                         expected):
    """Without COURSE_DEVICE the course would pick MPS there: the nbval run below is meaningful."""
    env = dict(laptop, COURSE_DEVICE=course_device)
    out = subprocess.run([sys.executable, "-c", "from shared.benchmark import pick_device; "
                          "print(pick_device().type)"], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == expected, out.stderr


def test_the_device_notebook_passes_strict_nbval_there(laptop):
    """Notebook 05 (devices, timing, torch.utils.benchmark) in full, as an ordinary user."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
           "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
           str(DEVICE_NOTEBOOK.relative_to(ROOT))]
    out = subprocess.run(as_ordinary_user(cmd), env=laptop, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-2000:]
