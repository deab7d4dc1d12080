"""The install paths agree: environment.yml (conda), pyproject.toml, constraints.txt, Makefile, CI, README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

packaging = pytest.importorskip("packaging")
from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from packaging.version import InvalidVersion, Version  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
CONDA_ALIASES = {"pytorch": "torch", "pyyaml": "pyyaml", "py-opencv": "opencv-python"}


# ----------------------------------------------------------------------------------------- helpers

def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))


def _pyproject_requirements(pp: dict) -> dict[str, SpecifierSet]:
    """Every requirement of pyproject (core + all extras), by canonical name."""
    proj = pp["project"]
    reqs = list(proj.get("dependencies", []))
    for extra in proj.get("optional-dependencies", {}).values():
        reqs += extra
    out: dict[str, SpecifierSet] = {}
    for r in reqs:
        req = Requirement(r)
        out[canonicalize_name(req.name)] = out.get(canonicalize_name(req.name), SpecifierSet()) & req.specifier
    return out


def conda_spec(spec: str) -> tuple[str, list[tuple[str, str]]]:
    """``"numpy>=1.24,<3"`` / ``"python=3.11"`` / ``"pytorch 2.4.*"`` -> (name, [(op, version), ...]).

    Conda's single ``=`` (prefix match) is returned as ``"="``; build strings are ignored.
    """
    spec = spec.strip()
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    assert m, f"cannot parse conda spec {spec!r}"
    name, rest = m.group(1), m.group(2).strip()
    rest = rest.split()[0] if rest else ""  # drop a build string
    constraints = []
    for part in filter(None, (p.strip() for p in rest.split(","))):
        pm = re.match(r"^(==|>=|<=|!=|~=|=|>|<)?\s*([0-9][0-9A-Za-z.*+\-]*)$", part)
        assert pm, f"cannot parse version constraint {part!r} of {spec!r}"
        op = pm.group(1) or "="
        constraints.append((op, pm.group(2).rstrip(".*")))
    return name, constraints


def compatible(constraints: list[tuple[str, str]], allowed: SpecifierSet) -> bool:
    """True when each version an environment pins or starts from (==, =, >=, ~=) is allowed."""
    for op, ver in constraints:
        if op in ("==", "=", ">=", "~=", "==="):
            try:
                if not allowed.contains(Version(ver), prereleases=True):
                    return False
            except InvalidVersion:
                return False
    return True


def _pip_section(env: dict) -> list[str]:
    for dep in env.get("dependencies", []):
        if isinstance(dep, dict) and "pip" in dep:
            return [str(x).strip() for x in dep["pip"]]
    return []


_SELF_RE = re.compile(r"^(?:(?:-e|--editable)\s+)?[\"']?\.(?:\[([^\]]*)\])?[\"']?$")
_CONSTRAINT_RE = re.compile(r"^(?:-c|--constraint)(?:\s+|=)(\S+)$")


def _makefile_install() -> tuple[set[str], set[str]]:
    """(constraint files, extras) of the Makefile's ``pip install`` of the package."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    files, extras = set(), set()
    for line in text.splitlines():
        if "pip install" not in line or line.lstrip().startswith("#"):
            continue
        files |= set(re.findall(r"(?:-c|--constraint)[ =](\S+)", line))
        for m in re.finditer(r"[\"']?\.\[([^\]]*)\][\"']?", line):
            extras |= {e.strip() for e in m.group(1).split(",") if e.strip()}
    return files, extras


# ------------------------------------------------------------------------------------- the helpers

def test_conda_spec_and_compatible_helpers():
    assert conda_spec("python=3.11") == ("python", [("=", "3.11")])
    assert conda_spec("numpy >=1.26,<3") == ("numpy", [(">=", "1.26"), ("<", "3")])
    assert conda_spec("pytorch 2.4.*") == ("pytorch", [("=", "2.4")])
    assert conda_spec("pip") == ("pip", [])
    allowed = SpecifierSet(">=2.4,<2.15")
    assert compatible([("=", "2.14")], allowed)
    assert not compatible([("==", "2.15.0")], allowed)
    assert not compatible([(">=", "2.0")], allowed)
    assert compatible([("<", "2.10")], allowed)


# ------------------------------------------------------------------------------------- the project

def test_environment_python_satisfies_requires_python():
    env, pp = _environment(), _pyproject()
    requires = SpecifierSet(pp["project"]["requires-python"])
    pythons = [conda_spec(d) for d in env["dependencies"]
               if isinstance(d, str) and conda_spec(d)[0] == "python"]
    assert pythons, "environment.yml must pin a python version"
    for _, constraints in pythons:
        assert constraints, "environment.yml's python needs a version"
        assert compatible(constraints, requires), \
            f"environment.yml python {constraints} violates requires-python {requires}"


def test_environment_installs_the_package_like_make_install():
    env, pp = _environment(), _pyproject()
    pip = _pip_section(env)
    assert any(conda_spec(d)[0] == "pip" for d in env["dependencies"] if isinstance(d, str)), \
        "environment.yml needs pip to run its pip section"
    selves = [m for m in map(_SELF_RE.match, pip) if m]
    assert len(selves) == 1, f"the pip section must install the package itself once: {pip}"
    env_extras = {e.strip() for e in (selves[0].group(1) or "").split(",") if e.strip()}
    known = set(pp["project"].get("optional-dependencies", {}))
    assert env_extras <= known, f"unknown extras {env_extras - known}; pyproject has {known}"

    env_constraints = {m.group(1) for m in map(_CONSTRAINT_RE.match, pip) if m}
    make_constraints, make_extras = _makefile_install()
    assert make_constraints, "the Makefile installs with a constraints file"
    assert env_constraints == make_constraints, \
        f"environment.yml uses constraints {env_constraints}, the Makefile {make_constraints}"
    for c in env_constraints:
        assert (ROOT / c).is_file(), f"constraints file {c} is missing"
    assert env_extras == make_extras, \
        f"environment.yml installs extras {env_extras}, `make install` {make_extras}"


def test_other_environment_packages_match_pyproject():
    env, pp = _environment(), _pyproject()
    allowed = _pyproject_requirements(pp)
    problems = []
    named: list[tuple[str, list[tuple[str, str]], str]] = []
    for d in env["dependencies"]:
        if isinstance(d, str):
            name, cons = conda_spec(d)
            if name not in ("python", "pip"):
                named.append((CONDA_ALIASES.get(name, name), cons, d))
    for line in _pip_section(env):
        if line.startswith("-") or _SELF_RE.match(line) or line.startswith("#"):
            continue
        req = Requirement(line)
        named.append((req.name, [(s.operator, s.version) for s in req.specifier], line))
    for name, cons, original in named:
        key = canonicalize_name(name)
        if key not in allowed:
            problems.append(f"{original!r} is not a dependency in pyproject.toml")
        elif not compatible(cons, allowed[key]):
            problems.append(f"{original!r} is outside pyproject's {name}{allowed[key]}")
    assert not problems, "; ".join(problems)


def test_constraints_pins_are_inside_pyproject_ranges():
    allowed = _pyproject_requirements(_pyproject())
    problems = []
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        key = canonicalize_name(req.name)
        pins = [(s.operator, s.version) for s in req.specifier]
        if key in allowed and not compatible(pins, allowed[key]):
            problems.append(f"{line} is outside pyproject's {req.name}{allowed[key]}")
    assert not problems, "; ".join(problems)


def test_ci_runs_make_test():
    ci = ROOT / ".ci" / "run"
    assert ci.is_file(), ".ci/run is the CI entry point"
    lines = [ln.strip() for ln in ci.read_text(encoding="utf-8").splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    assert any(re.search(r"(^|[;&|\s])make\s+test(\s|$)", ln) for ln in lines), \
        ".ci/run must call `make test`"


def test_readme_names_the_two_commands():
    readme = ROOT / "README.md"
    if not readme.is_file():
        pytest.skip("README.md not written yet")
    text = readme.read_text(encoding="utf-8")
    assert "make figures" in text and "make test" in text
