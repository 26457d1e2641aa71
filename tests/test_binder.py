"""Binder: environment.yml is a valid conda / repo2docker environment whose pip section installs
exactly the pins of requirements.txt, and the README carries a Binder badge for the configured repo.

How repo2docker reads it (jupyterhub/repo2docker, buildpacks/conda): it looks in `binder/` or
`.binder/` first and then ignores the root; it picks the Python version with the pattern
`python\\s*=+\\s*([\\d.]*)`; it runs `mamba env update --file environment.yml`; a `-r` line in the
pip section makes it copy the repository before installing, and conda's pip runs next to the file,
so `-r requirements.txt` is resolved relative to environment.yml.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import InvalidRequirement, Requirement

from tools import course

ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = ROOT / "environment.yml"
REPO2DOCKER_PYTHON = re.compile(r"python\s*=+\s*([\d\.]*)")  # as in repo2docker's CondaBuildPack
MIN_PYTHON = (3, 10)  # pyproject's requires-python


def binder_badge() -> str:
    """The README line: launch JupyterLab on Binder at notebook 01 of the configured repo/branch."""
    cfg = course.config()
    return (
        "[![Binder](https://mybinder.org/badge_logo.svg)]"
        f"(https://mybinder.org/v2/gh/{cfg['github']}/{cfg['branch']}"
        "?labpath=notebooks%2F01_simplified_self_attention.ipynb)"
    )


def load_env() -> dict:
    env = yaml.safe_load(ENV_FILE.read_text(encoding="utf-8"))
    assert isinstance(env, dict), f"environment.yml must be a mapping, got {type(env).__name__}"
    return env


def pip_section(env: dict) -> list[str]:
    sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, f"expected one pip section, found {len(sections)}"
    assert isinstance(sections[0], list) and all(isinstance(x, str) for x in sections[0])
    return sections[0]


def expand(lines: list[str], base: Path, seen: tuple[Path, ...] = ()) -> list[str]:
    """Requirement lines after following `-r`/`--requirement` (relative to `base`), comments gone."""
    out = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        m = re.fullmatch(r"(?:-r|--requirement)(?:\s+|=)(\S+)", line)
        if m:
            target = (base / m.group(1)).resolve()
            assert target.is_file(), f"{raw!r}: {target.name} not found next to {base}"
            assert target not in seen, f"requirement files include each other: {target.name}"
            out += expand(target.read_text(encoding="utf-8").splitlines(), target.parent, (*seen, target))
        else:
            assert not line.startswith("-"), f"pip option {line!r}: keep options out of the pin list"
            out.append(line)
    return out


def exact_pins(lines: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as e:  # pragma: no cover - message is the point
            raise AssertionError(f"pip cannot parse {line!r}: {e}") from None
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==" and "*" not in spec[0].version, (
            f"{line!r} is not an exact pin"
        )
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name not in pins, f"{name} is listed twice"
        pins[name] = spec[0].version
    return pins


def test_environment_yml_is_a_conda_environment():
    env = load_env()
    assert set(env) <= {"name", "channels", "dependencies", "prefix", "variables"}, set(env)
    assert isinstance(env.get("name"), str) and re.fullmatch(r"[A-Za-z0-9_.-]+", env["name"])
    assert "prefix" not in env, "a prefix ties the file to one machine"
    channels = env.get("channels")
    assert isinstance(channels, list) and channels and "conda-forge" in channels, channels
    deps = env["dependencies"]
    assert isinstance(deps, list) and deps
    strings = [d for d in deps if isinstance(d, str)]
    assert all(isinstance(d, (str, dict)) for d in deps)
    assert "pip" in [re.split(r"[=<>! ]", d)[0] for d in strings], "pip must be a conda dependency"


def test_repo2docker_sees_it_with_a_supported_python():
    for folder in ("binder", ".binder"):
        assert not (ROOT / folder).exists(), f"{folder}/ would make repo2docker ignore environment.yml"
    versions = [m.group(1) for d in load_env()["dependencies"] if isinstance(d, str)
                if (m := REPO2DOCKER_PYTHON.match(d))]
    assert len(versions) == 1, f"one python=X.Y dependency expected, found {versions}"
    major_minor = tuple(int(x) for x in versions[0].split(".")[:2])
    assert len(major_minor) == 2 and major_minor >= MIN_PYTHON, versions[0]


def test_pip_section_resolves_to_exactly_the_pins_of_requirements_txt():
    section = pip_section(load_env())
    assert section == ["-r requirements.txt"], section
    from_env = exact_pins(expand(section, ENV_FILE.parent))
    from_requirements = exact_pins(expand(["-r requirements.txt"], ROOT))
    assert from_env == from_requirements
    assert {"numpy", "torch", "matplotlib", "seaborn", "jupyterlab", "ipykernel"} <= set(from_env)
    conda_names = {re.split(r"[=<>! ]", d)[0] for d in load_env()["dependencies"] if isinstance(d, str)}
    assert not (conda_names - {"python", "pip"}) & set(from_env), "pinned by conda and pip both"


def test_the_resolver_can_fail(tmp_path):
    (tmp_path / "a.txt").write_text("numpy==2.4.6\n-r b.txt\n")
    (tmp_path / "b.txt").write_text("torch>=2\n")
    with pytest.raises(AssertionError, match="not an exact pin"):
        exact_pins(expand(["-r a.txt"], tmp_path))
    with pytest.raises(AssertionError, match="not found"):
        expand(["-r missing.txt"], tmp_path)
    (tmp_path / "b.txt").write_text("-r a.txt\n")
    with pytest.raises(AssertionError, match="include each other"):
        expand(["-r a.txt"], tmp_path)


def test_readme_has_the_binder_badge():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert binder_badge() in readme, f"add this line to README.md:\n{binder_badge()}"
