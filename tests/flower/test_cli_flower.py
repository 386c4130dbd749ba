r"""``botorch-fed flower ...``: what it refuses before any process starts, and ``keys``.
(tests/flower/test_loopback.py runs ``flower run`` on a real federation.)"""

from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("flwr")

from botorch_fed.cli import main  # noqa: E402


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")


def _out(capsys) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--checkpoint", "ck"], "--checkpoint is not available on Flower"),
        (["--resume", "ck"], "--resume is not available on Flower"),
        (["--rounds", "0"], "must be a positive integer"),
        (["--timeout", "0"], "--timeout must be > 0 seconds"),
        (["--on-dropout", "ignore"], "invalid choice: 'ignore'"),
    ],
)
def test_flower_run_refuses_bad_options_before_anything_runs(extra, message, tmp_path, capsys):
    argv = ["flower", "run", "local", "--problem", "branin", "--clients", "3"]
    code = main([*argv, "--state-dir", str(tmp_path), *extra])
    assert code == 2
    assert message in _out(capsys)


def test_flower_run_without_a_federation_says_how_to_start_one(tmp_path, capsys):
    argv = ["flower", "run", "local", "--problem", "branin", "--clients", "3"]
    assert main([*argv, "--num-rounds", "1", "--state-dir", str(tmp_path)]) == 1
    text = _out(capsys)
    assert "no live federation" in text and str(tmp_path) in text


def test_flower_up_refuses_no_clients(tmp_path, capsys):
    assert main(["flower", "up", "--clients", "0", "--state-dir", str(tmp_path)]) == 2
    assert "--clients must be >= 1" in _out(capsys)


def test_flower_down_and_status_with_nothing_running(tmp_path, capsys):
    assert main(["flower", "down", "--state-dir", str(tmp_path)]) == 0
    assert "nothing running" in _out(capsys)
    assert main(["flower", "status", "--state-dir", str(tmp_path)]) == 0
    assert "no federation in" in _out(capsys)


def test_flower_keys_writes_one_private_file_per_party(tmp_path, capsys):
    code = main(["flower", "keys", "--aggregator", "masking", "--clients", "3",
                 "--key-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    (folder,) = tmp_path.iterdir()
    assert folder.name.startswith("masking-") and folder.name in _out(capsys)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["client-0.key", "client-1.key", "client-2.key", "server.key"]
    for p in folder.iterdir():
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    keys = [(folder / f"client-{i}.key").read_bytes() for i in range(3)]
    assert len(set(keys)) == 3 and all(keys)  # each party's own secret material
