r"""The project and every extra install on each CPython version it claims.

For each ``Programming Language :: Python :: 3.X`` classifier of ``pyproject.toml``
uv's resolver runs for that interpreter on x86-64 Linux (``uv pip compile
--python-version 3.X --python-platform x86_64-manylinux_2_28``, so no such interpreter
is needed) over ``.[<every extra>]`` with ``--only-binary :all:``, against PyPI: the
check fails if any dependency of any extra has no wheel for that version (uv matches
wheel tags against the target's) or a ``Requires-Python`` that excludes it. Such a
dependency needs an environment marker in ``pyproject.toml`` (and the code a fallback),
or the classifier must go. uv evaluates environment markers (``python_version <
"3.12"``) for the target version; a test below checks that, and that wheel tags decide.

Details:

- ``--only-binary :all:`` takes no sdist, so this project and the dependencies published
  only as sdists (:data:`PURE_PYTHON_SDISTS`) are first built here into wheels, and the
  check asserts that they are pure Python (``py3-none-any``), i.e. that they install from
  source on any CPython 3.
- uv judges a ``Requires-Python`` lower bound against the target but ignores upper bounds
  (``<3.13``) by design, which a pure-Python wheel would slip through: the check reads
  the ``Requires-Python`` of every chosen wheel (PyPI's JSON simple API, PEP 691; the
  local wheels' metadata) and asserts that it admits the version.
- Nothing is installed or downloaded but metadata: the resolutions are written as
  ``pylock.toml`` files (PEP 751), whose packages name the wheels chosen. uv comes with
  the ``dev`` extra (and with ``flwr``); it runs without ``UV_*`` variables and
  configuration files, so it resolves against PyPI and the local wheels only (pip's own
  configuration, which ``make`` uses, may add local indexes and constraints: this check
  is about what ``pip install "botorch-fed[all]"`` finds on PyPI).
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
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
PURE_PYTHON_SDISTS = ("optproblems",)
"""Dependencies published only as source distributions, all pure Python."""
MUST_RESOLVE_EVERYWHERE = ("tenseal", "cryptography", "botorch")
"""Packages whose absence on a claimed version would break a README promise."""
PLATFORM = "x86_64-manylinux_2_28"
"""The platform resolved for: x86-64 Linux with glibc 2.28 or newer (the machines
README's set-up targets; torch's Linux wheels need the same)."""
PYPI = "https://pypi.org/simple"
"""The index resolved against (uv's default), read again for ``Requires-Python``."""
_UV_ENV = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
"""The environment uv runs in: without ``UV_*`` settings (another index, say)."""
_NETWORK_ERRORS = (
    "error sending request",
    "dns error",
    "failed to lookup address",
    "Connection refused",
    "Network is unreachable",
    "operation timed out",
    "Failed to fetch",
    "tcp connect error",
)


def _claimed_pythons() -> list[str]:
    pattern = re.compile(r"Programming Language :: Python :: (3\.\d+)$")
    found = [m.group(1) for c in PYPROJECT["project"]["classifiers"] if (m := pattern.match(c))]
    return sorted(found, key=lambda v: tuple(map(int, v.split("."))))


PYTHONS = _claimed_pythons()
EXTRAS = sorted(PYPROJECT["project"]["optional-dependencies"])


def _uv_bin() -> str:
    try:
        import uv
    except ImportError:
        pytest.fail(
            "this check resolves with uv, which the dev extra installs: pip install -e '.[dev]'"
        )
    return uv.find_uv_bin()


def _compile(requirements: Path, version: str, out: Path, *args: str) -> list[str]:
    r"""uv's command line resolving ``requirements`` for CPython ``version`` into ``out``."""
    return [
        _uv_bin(), "pip", "compile", "--quiet", "--no-cache", "--no-config",
        # no interpreter of that version is needed (or fetched from the internet)
        "--no-python-downloads", "--python-version", version, "--python-platform", PLATFORM,
        "--only-binary", ":all:", "--format", "pylock.toml", "--output-file", str(out),
        *args, str(requirements),
    ]  # fmt: skip


def _resolve(requirements: Path, version: str, out: Path, *args: str):
    r"""Run :func:`_compile`'s command (in :data:`_UV_ENV`); the finished process."""
    cmd = _compile(requirements, version, out, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_UV_ENV)


def _explain(proc: subprocess.CompletedProcess | subprocess.Popen, stderr: str, what: str) -> str:
    tail = stderr[-6000:]
    if any(marker in stderr for marker in _NETWORK_ERRORS):
        return (
            f"{what}: could not reach the package index. This check resolves the "
            "dependencies against the index and needs network access to it (CI has "
            f"it); it does not pass silently without.\n{tail}"
        )
    return f"{what} failed (exit code {proc.returncode}):\n{tail}"


def _packages(lock: Path) -> dict[str, dict]:
    r"""The packages of a ``pylock.toml`` by canonical name."""
    packages = tomllib.loads(lock.read_text())["packages"]
    return {canonicalize_name(p["name"]): p for p in packages}


def _wheel_requires_python(path: Path) -> str | None:
    r"""The ``Requires-Python`` of a wheel file's metadata (None: none declared)."""
    with zipfile.ZipFile(path) as wheel:
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        headers = HeaderParser().parsestr(wheel.read(metadata).decode())
    return headers.get("Requires-Python")


def _index_requires_python(name: str) -> dict[str, str | None]:
    r"""``{file name: Requires-Python}`` of every file of ``name`` on :data:`PYPI`."""
    request = urllib.request.Request(
        f"{PYPI}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    return {f["filename"]: f.get("requires-python") for f in files}


def requires_python(packages: list[dict]) -> dict[str, str | None]:
    r"""``{wheel url: Requires-Python}`` of every wheel of ``packages`` (pylock entries):
    read from local wheel files, and from PyPI's JSON simple API for PyPI's files.

    Raises:
        AssertionError: A wheel from elsewhere, or one its index does not list.
    """
    out, remote = {}, {}
    for package in packages:
        for wheel in package.get("wheels", []):
            url = wheel["url"]
            parsed = urlparse(url)
            if parsed.scheme == "file":
                out[url] = _wheel_requires_python(Path(unquote(parsed.path)))
            else:
                assert parsed.netloc == "files.pythonhosted.org", f"a wheel not from PyPI: {url}"
                remote.setdefault(canonicalize_name(package["name"]), []).append(url)
    with ThreadPoolExecutor(8) as pool:
        listed = dict(zip(remote, pool.map(_index_requires_python, remote), strict=True))
    for name, urls in remote.items():
        for url in urls:
            filename = unquote(PurePosixPath(urlparse(url).path).name)
            assert filename in listed[name], f"{PYPI}/{name}/ does not list {filename}"
            out[url] = listed[name][filename]
    return out


def admits(specifier: str | None, version: str) -> bool:
    r"""Whether a ``Requires-Python`` admits some release of CPython ``version`` (3.X)."""
    if specifier is None:
        return True
    spec = SpecifierSet(specifier)
    return any(spec.contains(f"{version}.{patch}", prereleases=True) for patch in (0, 99))


@pytest.fixture(scope="module")
def local_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project's wheel and the sdist-only dependencies' (checked pure Python).

    Built once, here, so that the per-version resolutions need no build step; the
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
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    proc = subprocess.run(
        [*pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(src), *requirements],
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
    """uv's resolution (packages by canonical name) for each claimed Python version."""
    tmp = tmp_path_factory.mktemp("resolutions")
    name = canonicalize_name(PYPROJECT["project"]["name"]).replace("-", "_")
    (project,) = local_wheels.glob(f"{name}-*.whl")
    target = f"{PYPROJECT['project']['name']}[{','.join(EXTRAS)}] @ {project.as_uri()}"
    requirements = tmp / "requirements.in"
    requirements.write_text(target + "\n")
    running = {}
    for version in PYTHONS:
        lock = tmp / f"pylock.cp{version.replace('.', '')}.toml"
        cmd = _compile(requirements, version, lock, "--find-links", str(local_wheels))
        stderr = open(tmp / f"stderr-{version}.txt", "w+")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=_UV_ENV)
        running[version] = (proc, stderr, lock)
    results, failures = {}, []
    for version, (proc, stderr, lock) in running.items():
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr.seek(0)
        text = stderr.read()
        stderr.close()
        if proc.returncode != 0:
            failures.append(_explain(proc, text, f"resolving {target} for CPython {version}"))
            continue
        results[version] = _packages(lock)
    if failures:
        pytest.fail("\n\n".join(failures))
    return results


@pytest.fixture(scope="module")
def wheel_requires_python(resolutions: dict) -> dict[str, str | None]:
    r""":func:`requires_python` of every wheel that some version's resolution chose."""
    packages = [p for packages in resolutions.values() for p in packages.values()]
    try:
        return requires_python(packages)
    except urllib.error.URLError as exc:
        pytest.fail(
            f"reading Requires-Python from {PYPI} failed ({exc}): this check needs the "
            "package index (CI has it); it does not pass silently without."
        )


def test_claims_python_3_11_to_3_13() -> None:
    assert {"3.11", "3.12", "3.13"} <= set(PYTHONS)
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"


def test_torch_is_a_range_not_a_pin() -> None:
    torch = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    torch = [r for r in torch if r.name == "torch"]
    assert len(torch) == 1 and all(s.operator == ">=" for s in torch[0].specifier)


def test_the_resolver_evaluates_markers_and_wheel_tags_for_the_target(tmp_path) -> None:
    # what the per-version check relies on: a marker is judged for the target version,
    # not for the interpreter running uv (`packaging` and `six` are pure Python, on the
    # index for every version) ...
    requirements = tmp_path / "markers.in"
    requirements.write_text(
        'packaging; python_version < "3.12"\nsix; python_full_version >= "3.12.0"\n'
    )
    got = {}
    for version in ("3.11", "3.12"):
        lock = tmp_path / f"pylock.markers{version.replace('.', '')}.toml"
        proc = _resolve(requirements, version, lock)
        if proc.returncode != 0:
            pytest.fail(_explain(proc, proc.stderr, f"resolving markers for {version}"))
        got[version] = set(_packages(lock))
    assert got == {"3.11": {"packaging"}, "3.12": {"six"}}
    # ... and a package without a wheel for the target does not resolve: NumPy 1.24.4
    # has CPython wheels up to 3.11
    requirements = tmp_path / "tags.in"
    requirements.write_text("numpy==1.24.4\n")
    proc = _resolve(requirements, "3.11", tmp_path / "pylock.tags311.toml")
    if proc.returncode != 0:
        pytest.fail(_explain(proc, proc.stderr, "resolving numpy==1.24.4 for 3.11"))
    proc = _resolve(requirements, "3.12", tmp_path / "pylock.tags312.toml")
    assert proc.returncode != 0 and "numpy" in proc.stderr and "wheels" in proc.stderr, proc.stderr


def _pure_wheel(folder: Path, name: str, requires_python: str) -> Path:
    r"""A minimal pure-Python wheel ``name-1.0`` declaring ``requires_python``."""
    info = f"{name}-1.0.dist-info"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "")
        wheel.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
            f"Requires-Python: {requires_python}\n",
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_a_requires_python_upper_bound_that_excludes_the_target_is_caught(tmp_path) -> None:
    # uv resolves a pure-Python wheel whose Requires-Python excludes the target by an
    # upper bound; the check's own reading of Requires-Python refuses it
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _pure_wheel(wheels, "capped", ">=3.8,<3.12")
    requirements = tmp_path / "capped.in"
    requirements.write_text("capped\n")
    lock = tmp_path / "pylock.capped.toml"
    proc = _resolve(requirements, "3.12", lock, "--find-links", str(wheels), "--no-index")
    assert proc.returncode == 0, proc.stderr
    found = requires_python(list(_packages(lock).values()))
    assert list(found.values()) == [">=3.8,<3.12"], found
    assert admits(">=3.8,<3.12", "3.11") and not admits(">=3.8,<3.12", "3.12")
    assert admits(">=3.11.4", "3.11") and admits(None, "3.13")
    assert not admits("!=3.13.*,>=3.11", "3.13")


def test_requires_python_is_read_from_pypi_for_its_wheels(tmp_path) -> None:
    # SciPy 1.7.3 declares an upper bound (<3.11) on PyPI
    requirements = tmp_path / "scipy.in"
    requirements.write_text("scipy==1.7.3\n")
    lock = tmp_path / "pylock.scipy.toml"
    proc = _resolve(requirements, "3.10", lock, "--no-deps")
    if proc.returncode != 0:
        pytest.fail(_explain(proc, proc.stderr, "resolving scipy==1.7.3 for 3.10"))
    found = requires_python([_packages(lock)["scipy"]])
    assert len(found) == 1, found
    (spec,) = found.values()
    assert SpecifierSet(spec) == SpecifierSet(">=3.7,<3.11")
    assert admits(spec, "3.10") and not admits(spec, "3.11")


@pytest.mark.parametrize("version", PYTHONS)
def test_every_extra_resolves_to_wheels(
    resolutions: dict, wheel_requires_python: dict, version: str
) -> None:
    installed = resolutions[version]
    # every requirement of the project and of each extra (markers evaluated for this
    # Python) is in the resolution, at a version its specifier admits, as a wheel whose
    # Requires-Python admits this Python
    env = {"python_version": version, "python_full_version": f"{version}.0"}
    own = canonicalize_name(PYPROJECT["project"]["name"])
    requirements = [(r, "") for r in PYPROJECT["project"]["dependencies"]] + [
        (r, extra) for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()
        for r in reqs
    ]  # fmt: skip
    for text, extra in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name == own:
            continue  # the `all` extra: botorch-fed[secure,plot,...]
        assert name in installed, f"{text!r} ({extra or 'core'}) not resolved on {version}"
        got = installed[name]["version"]
        assert req.specifier.contains(got, prereleases=True), (name, got, str(req.specifier))
    for name, package in installed.items():
        if name == own:
            continue
        wheels = [w["url"] for w in package.get("wheels", [])]
        assert wheels, f"{name} on {version} is not a wheel: {package}"
        for url in wheels:
            spec = wheel_requires_python[url]
            assert admits(spec, version), f"{url} requires Python {spec}, not {version}"
    missing = [n for n in MUST_RESOLVE_EVERYWHERE if canonicalize_name(n) not in installed]
    assert not missing, f"{missing} not in the resolution for CPython {version}"
