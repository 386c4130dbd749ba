r"""Sphinx configuration of botorch-fed's documentation site (``make docs``).

Sphinx, as BoTorch's own reference is built: autodoc + napoleon read the Google-style
docstrings with shapes, intersphinx links BoTorch's types to BoTorch's reference, and
MyST-NB renders the Markdown pages and executes the tutorials (in smoke mode) at build
time. Generated at build time into ``docs/generated/`` (not committed): one API page per
name of the curated public API (``botorch_fed._API``), the tutorials copied from
``tutorials/``, and each benchmark result file's page.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import botorch_fed  # noqa: E402

project = "botorch-fed"
author = "botorch-fed developers"
release = version = botorch_fed.__version__
copyright = "2026, botorch-fed developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "myst_nb",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
html_theme = "furo"
html_title = f"botorch-fed {release}"
html_static_path: list[str] = []
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3
# docs/*.md are also read on GitHub (h1 then h3 is fine there); a notebook's captured
# terminal output may hold escape sequences Pygments cannot lex (shown as plain text)
suppress_warnings = ["myst.header", "misc.highlighting_failure"]

# --- API reference ------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# BoTorch's reference (an inventory file committed beside this one: the build machine has
# no internet; `python docs/botorch_inventory.py` rewrites it from the installed BoTorch)
intersphinx_mapping = {
    "botorch": ("https://botorch.readthedocs.io/en/stable/", str(DOCS / "botorch.inv")),
}

# --- tutorials --------------------------------------------------------------------------
# executed at build time in smoke mode (small budgets); a failing cell fails the build
os.environ.setdefault("SMOKE_TEST", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("NO_COLOR", "1")  # plain command output in the pages (rich honours it)
nb_execution_mode = os.environ.get("BOTORCH_FED_DOCS_EXECUTE", "force")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True

GENERATED = DOCS / "generated"


def _write(path: Path, text: str) -> None:
    r"""Write ``text`` unless the file holds it already (Sphinx rereads changed files), by
    an atomic rename (another build reading the folder never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _prune(folder: Path, keep: set[str], pattern: str) -> None:
    r"""Remove the generated files of ``folder`` no longer generated (a removed API name,
    tutorial or result file would otherwise break the build)."""
    for stale in folder.glob(pattern):
        if stale.name not in keep:
            stale.unlink()


def _api_pages() -> None:
    r"""One page per name of the curated API, grouped by the module that defines it."""
    groups: dict[str, list[str]] = {}
    for name, module in botorch_fed._API.items():
        groups.setdefault(module, []).append(name)
    index = ["# API reference", "", "The public API: every name `import botorch_fed` gives.", ""]
    for module, names in groups.items():
        index += [f"## `{module}`", ""]
        index += [f"- [`{n}`](api/{n}.rst)" for n in names]
        index.append("")
    index += ["```{toctree}", ":hidden:", "", *(f"api/{n}" for n in botorch_fed._API), "```", ""]
    _write(GENERATED / "api.md", "\n".join(index))
    for name in botorch_fed._API:
        obj = getattr(botorch_fed, name)
        kind = "autoclass" if isinstance(obj, type) else "autofunction"
        title = f"``{name}``"
        text = f"{title}\n{'=' * len(title)}\n\n.. {kind}:: botorch_fed.{name}\n"
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            # a settings class: the fields its botorch-fed bases document (their
            # ``Attributes`` sections, which autodoc does not carry over)
            for base in obj.__mro__[1:]:
                if base.__module__.startswith("botorch_fed") and "Attributes:" in (
                    base.__doc__ or ""
                ):
                    where = f"{base.__module__}.{base.__qualname__}"
                    text += f"\nFields from ``{base.__name__}``:\n\n.. autoclass:: {where}\n"
                    text += "   :no-index:\n   :no-members:\n   :no-show-inheritance:\n"
        elif isinstance(obj, type) and _OWN_BASES.get(name):
            # what the class inherits from botorch-fed's own bases (the PITC snapshot's
            # methods); not what torch, gpytorch, BoTorch give it
            text += f"   :inherited-members: {_OWN_BASES[name]}\n"
        _write(GENERATED / "api" / f"{name}.rst", text)
    _prune(GENERATED / "api", {f"{n}.rst" for n in botorch_fed._API}, "*.rst")


def _foreign_bases(cls: type) -> str:
    r"""The bases of ``cls`` from outside botorch-fed (autodoc leaves their members out)."""
    names = {b.__name__ for b in cls.__mro__[1:] if not b.__module__.startswith("botorch_fed")}
    return ", ".join(sorted(names))


_OWN_BASES = {
    name: _foreign_bases(obj)
    for name in botorch_fed._API
    if isinstance(obj := getattr(botorch_fed, name), type)
    and any(b.__module__.startswith("botorch_fed") for b in obj.__mro__[1:])
}


def _tutorials() -> None:
    r"""The notebooks of ``tutorials/``, copied (the source directory must hold them)."""
    target = GENERATED / "tutorials"
    target.mkdir(parents=True, exist_ok=True)
    names = []
    for path in sorted((ROOT / "tutorials").glob("*.ipynb")):
        copy = target / path.name
        if not copy.exists() or copy.read_bytes() != path.read_bytes():
            shutil.copyfile(path, copy)
        names.append(path.stem)
    _prune(target, {f"{n}.ipynb" for n in names}, "*.ipynb")


def _benchmarks() -> None:
    r"""Each benchmark result file (``benchmarks/results/*.md``) as a page."""
    results = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
    for path in results:
        rel = os.path.relpath(path, GENERATED / "benchmarks")
        _write(GENERATED / "benchmarks" / path.name, f"```{{include}} {rel}\n```\n")
    _prune(GENERATED / "benchmarks", {p.name for p in results}, "*.md")
    lines = ["```{toctree}", ":maxdepth: 1", ""]
    lines += [f"benchmarks/{p.stem}" for p in results] + ["```", ""]
    _write(GENERATED / "benchmarks.md", "# Result files\n\n" + "\n".join(lines))


_api_pages()
_tutorials()
_benchmarks()
