r"""A config file's text is read as the file is (a Flower run carries the text, not the
path), and a run imports only the user's functions it is asked to: the others are
:class:`RemoteObjective`, which describe themselves as the imported ones do and refuse
to be evaluated."""

from __future__ import annotations

import argparse

import pytest
import torch

from botorch_fed.runs.black_box import (
    ImportedObjective,
    ObjectiveImportError,
    ObjectiveTables,
    RemoteObjective,
    check_imports,
    make_objectives,
    objective_name,
    objective_tables,
)
from botorch_fed.runs.config import (
    FromConfig,
    config_sources,
    load_config,
    load_config_text,
    read_config,
)
from botorch_fed.runs.parser import build_run_parser

HERE = __name__


def loss(X):
    return (X**2).sum(-1)


def scaled(X, scale=1.0):
    return scale * X.sum(-1)


TEXT = f"""\
bounds = [[0, 1], [-2, 2]]
seed = 7
[[objectives]]
function = "{HERE}:loss"
[[objectives]]
function = "{HERE}:scaled"
kwargs = {{ scale = 2.0 }}
[[objectives]]
function = "{HERE}:loss"
name = "third"
[settings]
num_rounds = 4
"""


def _options(algorithm: str = "local"):
    return build_run_parser().run_parsers[algorithm][1]


def test_the_text_reads_as_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TEXT)
    from_file = load_config(str(path), "local", _options())
    from_text = load_config_text(TEXT, "local", _options(), "the run's config")
    assert {k: v.value for k, v in from_file[0].items()} == {
        k: v.value for k, v in from_text[0].items()
    }
    assert from_file[1].objectives == from_text[1].objectives
    assert from_file[1].folder == str(tmp_path) and from_text[1].folder is None
    assert from_text[0]["seed"].label == "`seed` in the run's config"
    with pytest.raises(ValueError, match="^the run's config is not valid TOML"):
        load_config_text("x = = 1", "local", _options(), "the run's config")
    with pytest.raises(ValueError, match=f"^--config {path} is not valid TOML"):
        load_config_text("x = = 1", "local", _options(), str(path), file=str(path))


def test_read_config_refuses_what_is_not_a_small_utf8_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_bytes(b"seed = 1\n")
    assert read_config(str(path), max_bytes=9) == "seed = 1\n"
    with pytest.raises(ValueError, match="larger than the 8 bytes"):
        read_config(str(path), max_bytes=8)
    path.write_bytes(b"name = '\xff'\n")
    with pytest.raises(ValueError, match="not valid TOML: not UTF-8"):
        read_config(str(path))
    with pytest.raises(ValueError, match="no such file"):
        read_config(str(tmp_path / "nope.toml"))


def test_config_sources_unwraps_the_file_values():
    args = argparse.Namespace(seed=FromConfig(3, "`seed` in f"), clients=2)
    assert config_sources(args) == {"seed": "`seed` in f"}
    assert args.seed == 3 and args.clients == 2


def _specs():
    tables = [
        {"function": f"{HERE}:loss"},
        {"function": f"{HERE}:scaled", "kwargs": {"scale": 2.0}},
        {"function": "no_such_module_xyz:f", "name": "third"},
    ]
    return [(t, f"`objectives[{i}].function` in f") for i, t in enumerate(tables)]


ARGS = argparse.Namespace(bounds="0,1;-2,2", maximize=False)


def test_only_the_named_clients_functions_are_imported():
    specs = _specs()
    for imports, imported in ((0, [0]), (1, [1]), (None, [])):
        objectives = make_objectives(specs, ARGS, "--bounds", imports)
        kinds = [ImportedObjective if i in imported else RemoteObjective for i in range(3)]
        assert [type(o) for o in objectives] == kinds
    with pytest.raises(ObjectiveImportError, match="no_such_module_xyz"):
        make_objectives(specs, ARGS, "--bounds", "all")
    with pytest.raises(ValueError, match="3 client objectives: none for client 3"):
        make_objectives(specs, ARGS, "--bounds", 3)
    # one shared spec is every client's own
    shared = make_objectives(specs[:1], ARGS, "--bounds", 5, shared=True)
    assert isinstance(shared[0], ImportedObjective) and shared[0].fn is loss


def test_a_remote_objective_is_described_as_the_imported_one_and_never_evaluated():
    specs = _specs()[:2]
    imported = make_objectives(specs, ARGS, "--bounds", "all")
    remote = make_objectives(specs, ARGS, "--bounds", None)
    assert [o.describe() for o in imported] == [o.describe() for o in remote]
    assert remote[1].name == f"{HERE}:scaled(scale=2.0)" == objective_name(specs[1][0])
    assert remote[1].source == imported[1].source == f"{HERE}:scaled"
    assert "RemoteObjective" in repr(remote[0])
    X = torch.rand(3, 2, dtype=torch.float64)
    assert torch.equal(imported[1].evaluate(X)[0], 2.0 * imported[1].to_domain(X).sum(-1))
    with pytest.raises(RuntimeError, match="evaluated by its own client only"):
        remote[1].evaluate(X)


def test_a_function_that_cannot_take_its_kwargs_is_an_import_error(monkeypatch):
    r"""Its message quotes the user's code: an agent reports it by type only."""
    specs = [({"function": f"{HERE}:loss", "kwargs": {"secret_arg": 1}}, "`objective` in f")]
    with pytest.raises(ObjectiveImportError, match="secret_arg"):
        make_objectives(specs, ARGS, "--bounds")


def test_objective_tables_choose_what_a_run_imports():
    tables = ObjectiveTables(tuple(_specs()), shared=False)
    assert tables.imported("all") == list(tables.tables)
    assert tables.imported(2) == [tables.tables[2]] and tables.imported(None) == []
    with pytest.raises(ValueError, match="3 \\[\\[objectives\\]\\] tables .* none for client 4"):
        tables.imported(4)
    shared = ObjectiveTables(tuple(_specs()[:1]), shared=True)
    assert shared.imported(9) == [shared.tables[0]]
    for bad in ("some", -1, True, 1.0):
        with pytest.raises(ValueError, match="`imports` must be"):
            check_imports(bad)


def test_objective_tables_follow_the_command_line_precedence():
    _, config = load_config_text(TEXT, "local", _options(), "f")
    args = argparse.Namespace(problem=None, objective=None)
    tables = objective_tables(args, {}, config)
    assert tables is not None and not tables.shared and len(tables.tables) == 3
    # the command line's --objective or --problem replaces the file's tables
    assert objective_tables(argparse.Namespace(problem=None, objective="m:f"), {}, config) is None
    assert (
        objective_tables(argparse.Namespace(problem="branin", objective=None), {}, config) is None
    )
    assert objective_tables(argparse.Namespace(problem=None, objective=None), {}, None) is None
