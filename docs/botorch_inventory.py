r"""Write ``docs/botorch.inv``: a Sphinx inventory of the installed BoTorch's public
classes and functions, pointing into BoTorch's reference (https://botorch.readthedocs.io),
for intersphinx on a machine without internet.

BoTorch's reference has one page per subpackage (``models.html``, ``acquisition.html``,
...), each object anchored at its defining module's path. Every public class and function
is listed under that path and under the subpackage that re-exports it
(``botorch.models.SingleTaskGP`` and ``botorch.models.gp_regression.SingleTaskGP``).

Usage::

    python docs/botorch_inventory.py        # after upgrading BoTorch
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import zlib
from pathlib import Path

import botorch

TARGET = Path(__file__).parent / "botorch.inv"


def entries() -> dict[str, tuple[str, str]]:
    r"""``{name: (role, uri)}`` of every public class and function of BoTorch."""
    out: dict[str, tuple[str, str]] = {}
    modules = [botorch]
    for info in pkgutil.walk_packages(botorch.__path__, "botorch."):
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # noqa: BLE001  # optional dependencies (e.g. NumPyro) absent
            continue
    for module in modules:
        parts = module.__name__.split(".")
        if any(p.startswith("_") for p in parts):
            continue
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            home = getattr(obj, "__module__", "") or ""
            if not home.startswith("botorch") or any(p.startswith("_") for p in home.split(".")):
                continue  # not BoTorch's, or defined in a private module (not in its reference)
            page = home.split(".")[1] if "." in home else "index"
            role = "class" if inspect.isclass(obj) else "function"
            uri = f"{page}.html#{home}.{obj.__qualname__}"
            out.setdefault(f"{home}.{obj.__qualname__}", (role, uri))
            out.setdefault(f"{module.__name__}.{name}", (role, uri))
    return out


def main() -> None:
    lines = [f"{name} py:{role} 1 {uri} -" for name, (role, uri) in sorted(entries().items())]
    header = (
        "# Sphinx inventory version 2\n# Project: BoTorch\n"
        f"# Version: {botorch.__version__}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    TARGET.write_bytes(header.encode() + zlib.compress(("\n".join(lines) + "\n").encode()))
    print(f"{TARGET}: {len(lines)} objects of BoTorch {botorch.__version__}")


if __name__ == "__main__":
    main()
