r"""The project and every extra install on each CPython version it claims.

For each ``Programming Language :: Python :: 3.X`` classifier of ``pyproject.toml``
pip's resolver runs as if on that interpreter (``--python-version``, so no such
interpreter is needed) over ``.[<every extra>]`` with ``--only-binary=:all:``: the
check fails if any dependency of any extra has no wheel for that version (or a
``Requires-Python`` that excludes it). Such a dependency needs an environment marker
in ``pyproject.toml`` (and the code a fallback), or the classifier must go.

Details:

- ``--python-version`` alone is not enough: pip evaluates environment markers
  (``python_version < "3.12"``) for the interpreter running it, not the target
  (pypa/pip#11010, #13296), so a marker meant for 3.12 would be judged as on 3.11.
  pip therefore runs through :data:`_PIP_FOR_TARGET`, which makes its marker
  environment report the target version (and checks that it took effect).
- pip cannot resolve source distributions for another interpreter, so this project
  and the dependencies published only as sdists (:data:`PURE_PYTHON_SDISTS`) are
  first built here into wheels, and the check asserts that they are pure Python
  (``py3-none-any``), i.e. that they install from source on any CPython 3.
- ``--dry-run`` installs nothing. The index this project resolves against serves no
  PEP 658 metadata files, so plain pip would download every wheel (torch's CUDA build
  and its NVIDIA libraries: several GB per version); ``--use-feature=fast-deps`` reads
  each wheel's metadata with HTTP range requests instead (about 40 MB per version;
  the three run in parallel: ~22 s alone, 50-60 s on 2 busy cores).
- It needs the package index (CI has it); without it the test fails, saying so.
- TenSEAL (the ``ckks`` backend) must resolve on every version too: README promises
  CKKS on CPython 3.11-3.13.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
PURE_PYTHON_SDISTS = ("optproblems",)
"""Dependencies published only as source distributions, all pure Python."""
MUST_RESOLVE_EVERYWHERE = ("tenseal", "cryptography", "botorch")
"""Packages whose absence on a claimed version would break a README promise."""
_NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
)


_PIP_FOR_TARGET = """
import sys

version = sys.argv.pop(1)
from pip._vendor.packaging import markers

_default_environment = markers.default_environment


def _target_environment():
    env = _default_environment()
    full = version + ".0"
    env.update(python_version=version, python_full_version=full, implementation_version=full)
    return env


markers.default_environment = _target_environment
if not markers.Marker(f"python_version == '{version}'").evaluate():
    sys.exit("could not point pip's marker evaluation at Python " + version)
from pip._internal.cli.main import main

sys.exit(main())
"""
"""Runs pip (arguments after the version) with markers evaluated for that version."""


def _claimed_pythons() -> list[str]:
    pattern = re.compile(r"Programming Language :: Python :: (3\.\d+)$")
    found = [m.group(1) for c in PYPROJECT["project"]["classifiers"] if (m := pattern.match(c))]
    return sorted(found, key=lambda v: tuple(map(int, v.split("."))))


PYTHONS = _claimed_pythons()
EXTRAS = sorted(PYPROJECT["project"]["optional-dependencies"])


def _pip(*args: str, python: str | None = None) -> list[str]:
    """pip's command line; with ``python``, markers are evaluated for that version."""
    if python is None:
        return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return [sys.executable, "-c", _PIP_FOR_TARGET, python, "--disable-pip-version-check", *args]


def _explain(proc: subprocess.CompletedProcess | subprocess.Popen, stderr: str, what: str) -> str:
    tail = stderr[-6000:]
    if any(marker in stderr for marker in _NETWORK_ERRORS):
        return (
            f"{what}: could not reach the package index. This check resolves the "
            "dependencies against the index and needs network access to it (CI has "
            f"it); it does not pass silently without.\n{tail}"
        )
    if "fast-deps" in stderr and ("invalid choice" in stderr or "no such" in stderr.lower()):
        return (
            f"{what}: this pip no longer has --use-feature=fast-deps; without it a dry "
            "run downloads every wheel (several GB of torch/CUDA). Switch the check to "
            f"a resolver that reads wheel metadata lazily.\n{tail}"
        )
    return f"{what} failed (exit code {proc.returncode}):\n{tail}"


@pytest.fixture(scope="module")
def local_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project's wheel and the sdist-only dependencies' (checked pure Python).

    Built once, here, so that the per-version dry runs need no build step; the
    project is built from a copy of its packaging files and package, so nothing is
    written into the working tree.
    """
    out = tmp_path_factory.mktemp("local-wheels")
    src = tmp_path_factory.mktemp("project") / "src"
    shutil.copytree(ROOT / "botorch_fed", src / "botorch_fed", ignore=_IGNORE)
    for name in ("pyproject.toml", "README.md", "setup.cfg"):
        shutil.copy2(ROOT / name, src / name)
    declared = {
        canonicalize_name(Requirement(r).name): r
        for reqs in PYPROJECT["project"]["optional-dependencies"].values()
        for r in reqs
    }
    requirements = [declared[canonicalize_name(name)] for name in PURE_PYTHON_SDISTS]
    proc = subprocess.run(
        _pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(src), *requirements),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(_explain(proc, proc.stderr, f"pip wheel . {requirements}"))
    for name in (PYPROJECT["project"]["name"], *PURE_PYTHON_SDISTS):
        wheels = list(out.glob(f"{canonicalize_name(name).replace('-', '_')}-*.whl"))
        assert len(wheels) == 1, f"no wheel built for {name}: {list(out.iterdir())}"
        assert wheels[0].name.endswith("-py3-none-any.whl"), (
            f"{name} built {wheels[0].name}, not a pure-Python wheel: it no longer "
            "installs from source on every CPython; give it a marker or a wheel"
        )
    return out


@pytest.fixture(scope="module")
def resolutions(local_wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """pip's dry-run report for each claimed Python version (run in parallel)."""
    tmp = tmp_path_factory.mktemp("pip-reports")
    name = canonicalize_name(PYPROJECT["project"]["name"]).replace("-", "_")
    (project,) = local_wheels.glob(f"{name}-*.whl")
    target = f"{project}[{','.join(EXTRAS)}]"
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_PROGRESS_BAR": "off"}
    running = {}
    for version in PYTHONS:
        report = tmp / f"report-{version}.json"
        cmd = _pip(
            "install", "--dry-run", "--ignore-installed", "--quiet",
            "--use-feature=fast-deps",
            "--python-version", version, "--implementation", "cp",
            "--only-binary=:all:", "--find-links", str(local_wheels),
            "--report", str(report), target,
            python=version,
        )  # fmt: skip
        stderr = open(tmp / f"stderr-{version}.txt", "w+")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        running[version] = (proc, stderr, report)
    results, failures = {}, []
    for version, (proc, stderr, report) in running.items():
        try:
            proc.wait(timeout=480)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr.seek(0)
        text = stderr.read()
        stderr.close()
        if proc.returncode != 0:
            failures.append(_explain(proc, text, f"resolving {target} for CPython {version}"))
            continue
        results[version] = json.loads(report.read_text())
    if failures:
        pytest.fail("\n\n".join(failures))
    return results


def test_claims_python_3_11_to_3_13() -> None:
    assert {"3.11", "3.12", "3.13"} <= set(PYTHONS)
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"


def test_torch_is_a_range_not_a_pin() -> None:
    torch = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    torch = [r for r in torch if r.name == "torch"]
    assert len(torch) == 1 and all(s.operator == ">=" for s in torch[0].specifier)


@pytest.mark.parametrize("version", PYTHONS)
def test_every_extra_resolves_to_wheels(resolutions: dict, version: str) -> None:
    report = resolutions[version]
    installed = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    # every requirement of the project and of each extra (markers evaluated for this
    # Python) is in the resolution, at a version its specifier admits
    env = {"python_version": version, "python_full_version": f"{version}.0"}
    own = installed[canonicalize_name(PYPROJECT["project"]["name"])]
    assert set(own["requested_extras"]) == set(EXTRAS)
    requirements = [(r, "") for r in PYPROJECT["project"]["dependencies"]] + [
        (r, extra) for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()
        for r in reqs
    ]  # fmt: skip
    for text, extra in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name == canonicalize_name(PYPROJECT["project"]["name"]):
            continue  # the `all` extra: botorch-fed[secure,plot,...]
        assert name in installed, f"{text!r} ({extra or 'core'}) not resolved on {version}"
        got = installed[name]["metadata"]["version"]
        assert req.specifier.contains(got, prereleases=True), (name, got, str(req.specifier))
        if name not in {canonicalize_name(n) for n in PURE_PYTHON_SDISTS}:
            url = installed[name]["download_info"]["url"]
            assert url.endswith(".whl"), f"{name} on {version} is not a wheel: {url}"
    missing = [n for n in MUST_RESOLVE_EVERYWHERE if canonicalize_name(n) not in installed]
    assert not missing, f"{missing} not in the resolution for CPython {version}"
