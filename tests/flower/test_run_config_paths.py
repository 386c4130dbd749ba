r"""The run config names files only inside the ServerApp's own folder.

Whoever submits a run writes its run config; the ServerApp's operator gives it a folder
(``BOTORCH_FED_SERVER_DIR``, which ``botorch-fed flower up`` sets to its state folder on
the SuperLink). ``out`` is a results file under ``<folder>/results/`` and
``server-key`` a key set under ``<folder>/keys/``: an absolute path, ``..``, a path
separator or a link out of the folder is refused before the run asks any party
anything, so a run config can neither write nor read a file elsewhere on the server's
machine. (``flower run --out PATH``, the submitter's own file: test_cli_flower.py.)

The ServerApp runs over an in-memory Flower grid (tests/helpers/fake_grid.py)."""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from botorch_fed.flower import server_app  # noqa: E402
from botorch_fed.flower.keys import write_keyset  # noqa: E402
from botorch_fed.flower.run_options import (  # noqa: E402
    RESULTS_WRITTEN,
    SERVER_DIR_ENV,
    prepare,
    results_files,
    server_dir,
    server_key_file,
)
from botorch_fed.protocol.registry import get_algorithm  # noqa: E402
from botorch_fed.protocol.runner import build_context  # noqa: E402
from tests.helpers.fake_grid import FakeGrid  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

ESCAPES = ["/tmp/elsewhere.json", "../elsewhere.json", "results/../../x", "a/b", "..", ""]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    r"""The ServerApp's folder, as its operator gives it (and the file a run must not
    reach, beside it)."""
    path = tmp_path / "server"
    path.mkdir(mode=0o700)
    monkeypatch.setenv(SERVER_DIR_ENV, str(path))
    (tmp_path / "victim").write_text("keep")
    return path


@pytest.mark.parametrize("name", ESCAPES)
def test_out_and_server_key_are_names_not_paths(name, folder):
    with pytest.raises(ValueError, match="`out` must name a results file"):
        results_files(folder, name)
    with pytest.raises(ValueError, match="`server-key` must name a key set"):
        server_key_file(folder, name)


def test_a_link_out_of_the_folder_is_refused(folder):
    victim = folder.parent / "victim"
    (folder / "results").mkdir()
    (folder / "results" / "r.json").symlink_to(victim)
    with pytest.raises(ValueError, match="`out` leads out of the server's folder"):
        results_files(folder, "r.json")
    (folder / "results" / "r.json").unlink()
    (folder / "results" / "r.json.error").symlink_to(victim)
    with pytest.raises(ValueError, match="`out` leads out of the server's folder"):
        results_files(folder, "r.json")
    (folder / "results" / "r.json.error").unlink()
    assert results_files(folder, "r.json") == (
        folder / "results" / "r.json",
        folder / "results" / "r.json.error",
    )
    # a key set that is a link (to another folder of keys), or whose server.key is one
    elsewhere = folder.parent / "keys"
    (elsewhere / "ks").mkdir(parents=True)
    (elsewhere / "ks" / "server.key").write_bytes(b"")
    (folder / "keys").mkdir()
    (folder / "keys" / "ks").symlink_to(elsewhere / "ks")
    with pytest.raises(ValueError, match="`server-key` leads out of the server's folder"):
        server_key_file(folder, "ks")
    (folder / "keys" / "ks").unlink()
    (folder / "keys" / "ks").mkdir()
    (folder / "keys" / "ks" / "server.key").symlink_to(victim)
    with pytest.raises(ValueError, match="`server-key` leads out of the server's folder"):
        server_key_file(folder, "ks")
    (folder / "keys" / "ks" / "server.key").unlink()
    assert server_key_file(folder, "ks") == folder / "keys" / "ks" / "server.key"
    # and a results folder that is itself a link
    (folder / "results").rmdir()
    (folder / "results").symlink_to(folder.parent)
    with pytest.raises(ValueError, match="`out` leads out of the server's folder"):
        results_files(folder, "victim")


def test_the_folder_comes_from_the_operator(folder, monkeypatch):
    assert server_dir() == folder.resolve()
    monkeypatch.delenv(SERVER_DIR_ENV)
    with pytest.raises(ValueError, match=f"no folder of its own: start the SuperLink with "
                       f"{SERVER_DIR_ENV}="):  # fmt: skip
        server_dir()
    monkeypatch.setenv(SERVER_DIR_ENV, "relative/folder")
    with pytest.raises(ValueError, match="not an absolute path of a folder"):
        server_dir()


def _grid(tmp_path, config: dict) -> FakeGrid:
    grid = FakeGrid(3, str(tmp_path), key_dir=tmp_path / "keys")  # the parties' keys
    grid.run_config = config
    return grid


def _main(grid: FakeGrid) -> None:
    server_app.main(grid, SimpleNamespace(run_config=dict(grid.run_config)))


def _local(out: str) -> dict:
    return {"argv": json.dumps(short_argv("random")), "out": out, "clients": 3}


@pytest.mark.parametrize("out", ["/ABS/r.json", "../r.json", "results/r.json"])
def test_the_serverapp_writes_no_file_outside_its_folder(out, folder, tmp_path):
    out = out.replace("/ABS", str(tmp_path))
    grid = _grid(tmp_path, _local(out))
    with pytest.raises(ValueError, match="`out` must name a results file"):
        _main(grid)
    assert grid.pushed == []  # refused before any party is asked anything
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.json.error").exists()
    assert not list((folder / "results").iterdir())


def test_the_serverapp_does_not_write_through_a_link(folder, tmp_path):
    victim = tmp_path / "victim"
    (folder / "results").mkdir()
    (folder / "results" / "r.json").symlink_to(victim)
    grid = _grid(tmp_path, _local("r.json"))
    with pytest.raises(ValueError, match="`out` leads out of the server's folder"):
        _main(grid)
    assert grid.pushed == [] and victim.read_text() == "keep"


def test_a_plain_name_gets_the_results_in_the_folder(folder, tmp_path, capsys):
    grid = _grid(tmp_path, _local("r.json"))
    _main(grid)
    results = folder / "results" / "r.json"
    data = json.loads(results.read_text())
    assert data["algorithm"] == "random" and data["evaluations"]
    assert stat.S_IMODE(os.stat(results).st_mode) == 0o600
    assert f"{RESULTS_WRITTEN}results/r.json" in capsys.readouterr().out
    # a failed run: its reason beside it, in the folder too
    grid = _grid(tmp_path, {**_local("bad.json"), "timeout": 0.0})
    with pytest.raises(ValueError, match="`timeout` must be > 0"):
        _main(grid)
    error = (folder / "results" / "bad.json.error").read_text()
    assert error.startswith("ValueError: The run config's `timeout` must be > 0")
    assert sorted(os.listdir(folder / "results")) == ["bad.json.error", "r.json"]


def _secure(tmp_path, keys) -> tuple[list[str], str]:
    argv = short_argv("fbo-fedgp", "plaintext") + ["--hyperparameters", "average"]
    run = prepare(argv)
    ids = build_context(get_algorithm(run.algorithm), run.setup, run.settings).client_ids
    keyset, _ = write_keyset(run.setup, ids, keys)
    return argv, keyset


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_the_server_key_is_read_from_the_folder_only(how, folder, tmp_path):
    # the parties' key folder is the grid's (tmp_path/keys); the server's is its own
    argv, keyset = _secure(tmp_path, tmp_path / "keys")
    server_key = {
        "absolute": str(tmp_path / "keys" / keyset / "server.key"),
        "dotdot": f"../keys/{keyset}",
        "link": keyset,
    }[how]
    if how == "link":  # the server's key set is a link to a folder outside
        (folder / "keys").mkdir()
        (folder / "keys" / keyset).symlink_to(tmp_path / "keys" / keyset)
    config = {"argv": json.dumps(argv), "server-key": server_key, "keyset": keyset}
    grid = _grid(tmp_path, config)
    with pytest.raises(ValueError, match="`server-key` (must name a key set|leads out)"):
        server_app.run_on_flower(grid, config, log=lambda line: None)
    assert grid.pushed == []  # refused before any party is asked anything


def test_a_key_set_name_reads_the_servers_key_in_the_folder(folder, tmp_path):
    argv, keyset = _secure(tmp_path, tmp_path / "keys")
    (folder / "keys").mkdir()
    os.rename(tmp_path / "keys" / keyset / "server.key", tmp_path / "server.key")
    (folder / "keys" / keyset).mkdir()
    os.rename(tmp_path / "server.key", folder / "keys" / keyset / "server.key")
    config = {"argv": json.dumps(argv), "server-key": keyset, "keyset": keyset}
    result = server_app.run_on_flower(_grid(tmp_path, config), config, log=lambda line: None)
    assert result.evaluations  # the operator's folder, from the environment
