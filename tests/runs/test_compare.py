r"""``compare_algorithms`` and ``botorch-fed compare``: the same federation and seeds for
every algorithm, scores against each run's own result, statistics against scipy and a
hand-written Holm correction, resumption, bad input."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import FBOFedGPSettings, run_federated
from botorch_fed.cli import main
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup
from botorch_fed.runs import compare as compare_module
from botorch_fed.runs.compare import compare_algorithms, summarize

TINY = BOSettings(num_init=2, num_rounds=1)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


def _holm(pvalues):
    r"""Holm's step-down adjustment, written out."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def _exact_wilcoxon(d):
    r"""Two-sided exact signed-rank p by enumerating every sign pattern (zeros dropped,
    no ties among the sizes)."""
    d = d[d != 0]
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    t = ranks[d > 0].sum()
    signs = np.array(list(itertools.product([0, 1], repeat=len(d))))
    null = signs @ ranks
    return min(1.0, 2 * min((null <= t).mean(), (null >= t).mean()))


def test_summary_statistics_match_an_independent_computation():
    rng = np.random.default_rng(0)
    seeds = list(range(8))
    base = rng.lognormal(size=8)
    scores = {"a": base, "b": base * rng.lognormal(0.5, 0.3, 8), "c": base * rng.lognormal(0, 1, 8)}
    scores["c"][3] = base[3]  # a tie
    records = {
        a: {
            s: {"score": float(v[s]), "worst_client": float(2 * v[s]), "metric": "x"} for s in seeds
        }
        for a, v in scores.items()
    }
    summary = summarize(["a", "b", "c"], seeds, records)
    ps = []
    for name, v in scores.items():
        st = summary["algorithms"][name]
        assert st["mean"] == pytest.approx(v.mean(), rel=1e-12)
        assert st["se"] == pytest.approx(v.std(ddof=1) / math.sqrt(8), rel=1e-12)
        assert st["median"] == pytest.approx(np.median(v), rel=1e-12)
        assert st["worst_client_mean"] == pytest.approx(2 * v.mean(), rel=1e-12)
        if name == "a":
            assert "p" not in st
            continue
        assert (st["wins"], st["losses"], st["ties"]) == (
            int((v < base).sum()),
            int((v > base).sum()),
            int((v == base).sum()),
        )
        p = _exact_wilcoxon(v - base)
        assert st["p"] == pytest.approx(p, rel=1e-12)
        ps.append(p)
    for name, adjusted in zip(["b", "c"], _holm(ps), strict=True):
        assert summary["algorithms"][name]["p_holm"] == pytest.approx(adjusted, rel=1e-12)
    assert summary["scores"]["b"] == {str(s): float(scores["b"][s]) for s in seeds}
    # equal scores everywhere: p = 1, no test of zero differences
    same = summarize(["a", "a2"], seeds, {"a": records["a"], "a2": records["a"]})
    assert same["algorithms"]["a2"]["p"] == 1.0 and same["algorithms"]["a2"]["ties"] == 8


def test_every_algorithm_runs_the_same_federation_and_seeds(tmp_path):
    setup = FederationSetup(problem="branin", num_clients=2, seed=3)
    comparison = compare_algorithms(
        {"random": TINY, "local": TINY}, setup, seeds=2, out=tmp_path / "c"
    )
    assert comparison.seeds == [3, 4]
    for seed in (3, 4):
        records = {a: comparison.records[a][seed] for a in ("random", "local")}
        # the same initial designs: the same best value before the first round
        assert records["random"]["score_per_round"][0] == records["local"]["score_per_round"][0]
        for algorithm, rec in records.items():
            own = run_federated(
                algorithm, FederationSetup(problem="branin", num_clients=2, seed=seed), TINY
            )
            assert rec["metric"] == "federation regret"
            assert rec["score"] == abs(own.best_value - own.optimal_value)
            assert rec["score_per_round"] == own.regret_per_round
            worst = max(abs(v - own.optimal_value) for v in own.best_per_client.values())
            assert rec["worst_client"] == worst
    stored = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert stored["scores"] == {
        a: {str(s): comparison.records[a][s]["score"] for s in (3, 4)} for a in ("random", "local")
    }
    assert (tmp_path / "c" / "summary.md").read_text().count("| random |") == 1


def test_a_heterogeneous_federation_scores_each_client_on_its_own_function():
    setup = FederationSetup(problem="hartmann", num_clients=3, seed=0, shift=0.05, rotation=0.1)
    rec = compare_algorithms(["random"], setup, seeds=1).records["random"][0]
    assert rec["metric"] == "mean client regret"
    optima = [o.optimal_value for o in setup.make_objectives()]
    regrets = [abs(rec["client_best"][str(c)] - optima[c]) for c in range(3)]
    assert rec["score"] == pytest.approx(float(np.mean(regrets)), rel=1e-15)
    assert rec["worst_client"] == max(regrets)
    assert rec["score_per_round"] is None


def test_an_unknown_optimum_scores_the_best_value_lower_is_better():
    def f(X):
        return -(X - 0.3).pow(2).sum(-1)

    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    own = CallableObjective(f, bounds, minimize=False)
    setup = FederationSetup(objectives=own, num_clients=2, seed=1)
    rec = compare_algorithms(["random"], setup, seeds=1).records["random"][1]
    assert rec["metric"] == "best value" and rec["optimal_value"] is None
    assert rec["score"] == -rec["best_value"]  # maximised: negated


def test_a_comparison_continues_from_its_stored_runs(tmp_path, monkeypatch):
    setup = FederationSetup(problem="branin", num_clients=2, seed=0)
    first = compare_algorithms({"random": TINY}, setup, seeds=2, out=tmp_path)
    calls = []
    real = compare_module.run_record

    def counted(algorithm, setup, settings):
        calls.append((algorithm, setup.seed))
        return real(algorithm, setup, settings)

    monkeypatch.setattr(compare_module, "run_record", counted)
    again = compare_algorithms({"random": TINY}, setup, seeds=2, out=tmp_path)
    assert calls == [] and again.summary == first.summary
    more = compare_algorithms({"random": TINY, "local": TINY}, setup, seeds=3, out=tmp_path)
    assert sorted(calls) == [("local", 0), ("local", 1), ("local", 2), ("random", 2)]
    assert more.records["random"][0] == first.records["random"][0]
    # an unreadable record is run again
    (tmp_path / "runs" / "random" / "seed-1.json").write_text("{")
    calls.clear()
    compare_algorithms({"random": TINY}, setup, seeds=2, out=tmp_path)
    assert calls == [("random", 1)]
    # other settings or another problem in the same folder: refused, naming what differs
    with pytest.raises(
        ValueError, match=r"holds runs of random with other options \(settings.num_rounds\)"
    ):
        compare_algorithms({"random": BOSettings(num_init=2, num_rounds=2)}, setup, 1, out=tmp_path)
    with pytest.raises(ValueError, match=r"setup.problem"):
        compare_algorithms(
            {"random": TINY}, FederationSetup(problem="levy", num_clients=2), 1, out=tmp_path
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"algorithms": []}, "distinct algorithms"),
        ({"algorithms": ["local", "local"]}, "distinct algorithms"),
        ({"algorithms": ["lcoal"]}, "Unknown algorithm 'lcoal'"),
        ({"seeds": 0}, r"`seeds`=0 must be >= 1"),
        ({"seeds": [1, 1]}, "distinct seeds"),
        ({"seeds": True}, "a count or a list"),
        ({"jobs": 0}, r"`jobs`=0 must be an integer >= 1"),
        (
            {
                "setup": {
                    "local": FederationSetup(problem="branin", seed=1),
                    "random": FederationSetup(problem="branin", seed=2),
                }
            },
            "different seeds",
        ),  # fmt: skip
        ({"algorithms": {"local": BOSettings(num_rounds=0)}}, "num_rounds"),
        (
            {"algorithms": {"local": FBOFedGPSettings()}},
            "local takes BOSettings, got FBOFedGPSettings",
        ),
        ({"algorithms": {"x": ("lcoal", TINY)}}, "Unknown algorithm 'lcoal'"),
    ],
)
def test_bad_comparisons_are_refused_by_name(kwargs, match):
    args = {"algorithms": ["local", "random"], "setup": FederationSetup(problem="branin")}
    with pytest.raises(ValueError, match=match):
        compare_algorithms(**(args | kwargs))


def test_out_must_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        compare_algorithms(["random"], FederationSetup(problem="branin"), 1, out=tmp_path / "file")


def test_the_command_compares_in_parallel_processes_and_writes_every_run(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "fbo-fedgp", "random", "--problem", "branin", "--clients", "3",
            "--rounds", "1", "--init", "3", "--support", "4", "--aggregator", "masking",
            "--seeds", "2", "--jobs", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "random does not take --support, --aggregator (ignored for it)" in text
    assert "random against fbo-fedgp: lower on" in text
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["scores"]) == {"fbo-fedgp", "random"}
    assert all(set(v) == {"0", "1"} for v in summary["scores"].values())
    assert (out / "summary.png").stat().st_size > 0
    rec = json.loads((out / "runs" / "fbo-fedgp" / "seed-1.json").read_text())
    assert rec["fingerprint"]["settings"]["support_size"] == 4
    assert rec["fingerprint"]["setup"]["aggregator"] == "masking"
    # the same command again runs nothing and prints the same table
    assert main(argv) == 0
    assert "random against fbo-fedgp: lower on" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text()) == summary


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--problme", "branin"], "--problme is not an option of `run` for local, random"),
        (["--plot", "x.png"], "--plot: compare draws its own plot"),
        (["--checkpoint", "d"], "--checkpoint: compare keeps every finished run"),
        (["--rounds"], "--rounds expects a value"),
        (["branin"], "unexpected argument 'branin'"),
        (["--rounds", "0"], "local: `--num-rounds`/`--rounds`=0 must be >= 1"),
        (["--seeds", "0"], "--seeds 0 must be >= 1"),
        (["--jobs", "0"], "--jobs 0 must be >= 1"),
        (["--rotation", "-1"], "rotation"),
    ],
)
def test_bad_compare_arguments_exit_2_naming_the_flag(tmp_path, capsys, extra, message):
    argv = ["compare", "local", "random", "--problem", "branin", "--out", str(tmp_path / "o")]
    assert main(argv + extra) == 2
    captured = capsys.readouterr()
    assert message in captured.out + captured.err
    assert not (tmp_path / "o" / "runs").exists()


def test_a_client_whose_optimum_moved_away_is_scored_against_the_functions_optimum():
    setup = FederationSetup(problem="hartmann", num_clients=4, seed=1, shift=0.3, rotation=1.0)
    objectives = setup.make_objectives()
    assert objectives[1].optimal_value is None  # rotated out of the cube at this seed
    rec = compare_algorithms(["random"], setup, seeds=1).records["random"][1]
    assert rec["client_optimum_bound_only"] == ["1"]
    f_star = objectives[1].optimum_bound
    assert f_star == objectives[0].optimal_value == pytest.approx(-3.32237)
    assert rec["client_score"]["1"] == rec["client_best"]["1"] - f_star > 0
    assert rec["metric"] == "mean client regret"


def test_two_configurations_of_one_algorithm_compare_under_their_labels():
    setup = FederationSetup(problem="branin", num_clients=2, seed=0)
    ei = BOSettings(num_init=2, num_rounds=1, acquisition="ei")
    c = compare_algorithms({"ucb": ("local", TINY), "ei": ("local", ei)}, setup, 2)
    assert list(c.summary["algorithms"]) == ["ucb", "ei"]
    for seed in (0, 1):
        ucb, ei_ = c.records["ucb"][seed], c.records["ei"][seed]
        assert ei_["algorithm"] == "ei" and ei_["fingerprint"]["settings"]["acquisition"] == "ei"
        own = run_federated(
            "local", FederationSetup(problem="branin", num_clients=2, seed=seed), ei
        )
        assert ei_["score_per_round"] == own.regret_per_round
        # the same seed: the same initial designs
        assert ucb["score_per_round"][0] == ei_["score_per_round"][0]


def test_a_rotated_federation_scores_the_clients_own_regrets():
    setup = FederationSetup(problem="branin", num_clients=2, seed=0, rotation=0.3)
    rec = compare_algorithms({"random": TINY}, setup, 1).records["random"][0]
    assert rec["metric"] == "mean client regret" and rec["score_per_round"] is None


def test_a_regret_below_the_declared_optimum_stays_negative_and_is_flagged():
    bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    own = CallableObjective(lambda X: X.sum(-1), bounds, name="line")
    own.optimal_value = 1.0  # declared above the true minimum 0
    rec = compare_algorithms({"random": TINY}, FederationSetup(objectives=own, num_clients=2), 1)
    rec = rec.records["random"][0]
    assert rec["metric"] == "federation regret"
    assert rec["score"] == rec["best_value"] - 1.0 < 0
    assert rec["below_optimum"] == ["0", "1", "federation"]


def test_runs_are_reused_only_with_their_fingerprint_even_without_the_manifest(
    tmp_path, monkeypatch
):
    setup = FederationSetup(problem="branin", num_clients=2, seed=0)
    compare_algorithms({"random": TINY}, setup, 1, out=tmp_path)
    (tmp_path / "compare.json").unlink()
    calls = []
    real = compare_module.run_record
    monkeypatch.setattr(compare_module, "run_record", lambda *a: calls.append(a[0]) or real(*a))
    longer = BOSettings(num_init=2, num_rounds=2)
    compare_algorithms({"random": longer}, setup, 1, out=tmp_path)
    assert calls == ["random"]  # the stored run had other settings: run again


def test_several_jobs_run_in_a_process_pool(monkeypatch):
    submitted = []

    class InlinePool:  # stands for ProcessPoolExecutor: runs each job at once
        def __init__(self, workers, mp_context):
            assert workers == 2 and mp_context.get_start_method() == "spawn"

        def submit(self, fn, job):
            from concurrent.futures import Future

            submitted.append(job[0])
            future = Future()
            future.set_result(fn(job))
            return future

        def shutdown(self, **kwargs):
            pass

    monkeypatch.setattr(compare_module, "ProcessPoolExecutor", InlinePool)
    setup = FederationSetup(problem="branin", num_clients=2)
    c = compare_algorithms({"random": TINY, "local": TINY}, setup, seeds=1, jobs=2)
    assert sorted(submitted) == ["local", "random"] and set(c.records) == {"random", "local"}


def test_a_failing_run_names_its_algorithm_and_seed_and_the_finished_runs_stay(tmp_path):
    calls = []

    def closes_after_the_first_run(X):  # random's run: 2 clients x 3 evaluations
        calls.append(len(X))
        if sum(calls) > 6:
            raise ZeroDivisionError("the lab is closed")
        return X.sum(-1)

    bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    own = CallableObjective(closes_after_the_first_run, bounds, name="lab")
    setup = FederationSetup(objectives=own, num_clients=2, evaluation_errors="raise")
    with pytest.raises(
        compare_module.ComparisonRunError, match="the run of local at seed 0 failed"
    ):
        compare_algorithms({"random": TINY, "local": TINY}, setup, 1, out=tmp_path)
    assert (tmp_path / "runs" / "random" / "seed-0.json").exists()
    assert not (tmp_path / "runs" / "local").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"setup": {"local": FederationSetup(problem="branin"),
                    "random": FederationSetup(problem="levy")}},
         r"differ between local and random \(setup.problem\)"),
        ({"algorithms": {"local": BOSettings(num_rounds=3), "random": BOSettings(num_rounds=4)}},
         r"`num_rounds` differs between the algorithms \(local 3, random 4\)"),
        ({"algorithms": {"a/b": ("local", TINY)}}, "the label 'a/b'"),
        ({"algorithms": {"x": ("local", TINY, 1)}}, r"settings or \(algorithm, settings\)"),
    ],
)  # fmt: skip
def test_a_comparison_is_one_federation_with_one_budget(kwargs, match):
    args = {"algorithms": ["local", "random"], "setup": FederationSetup(problem="branin")}
    with pytest.raises(ValueError, match=match):
        compare_algorithms(**(args | kwargs))


def test_mixed_metrics_and_unscored_runs_in_a_summary():
    rec = {"score": 1.0, "worst_client": 1.0, "metric": "federation regret"}
    other = {**rec, "metric": "best value"}
    with pytest.raises(ValueError, match="different metrics"):
        summarize(["a", "b"], [0], {"a": {0: rec}, "b": {0: other}})
    none = {**rec, "score": None, "worst_client": None}
    b = {0: none, 1: {**rec, "score": 0.5}, 2: none}
    s = summarize(["a", "b"], [0, 1, 2], {"a": {0: rec, 1: rec, 2: none}, "b": b})
    st = s["algorithms"]["b"]
    assert (st["runs"], st["scored"], st["paired"]) == (3, 1, 1)
    assert (st["wins"], st["losses"], st["ties"]) == (1, 1, 1)  # unscored loses; both: a tie
    assert s["algorithms"]["a"]["mean"] == 1.0 and st["mean"] == 0.5


def test_a_comparisons_repr_is_short():
    c = compare_algorithms(["random"], FederationSetup(problem="branin", num_clients=2), 2)
    assert repr(c).startswith("Comparison(2 seeds; mean final federation regret: random: ")
    assert len(repr(c)) < 120


def test_seed_is_the_first_seed_and_shared_budgets_must_apply_to_all(tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["compare", "random", "--problem", "branin", "--clients", "2", "--rounds", "1",
            "--init", "2", "--seeds", "2", "--seed", "7", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert sorted(p.name for p in (out / "runs" / "random").iterdir()) == [
        "seed-7.json",
        "seed-8.json",
    ]
    capsys.readouterr()
    argv = ["compare", "fbo-fedgp", "ldp-tgp", "--problem", "branin", "--init", "3", "--out",
            str(tmp_path / "x")]  # fmt: skip
    assert main(argv) == 2
    assert "ldp-tgp does not take --init" in capsys.readouterr().err
    argv = ["compare", "fbo-fedgp", "local", "--problem", "branin", "--aggregator", "ckk",
            "--out", str(tmp_path / "y")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "argument --aggregator: invalid choice: 'ckk'" in err and "usage:" not in err
    argv = ["compare", "local", "local", "--problem", "branin", "--out", str(tmp_path / "z")]
    assert main(argv) == 2
    assert "local given more than once" in capsys.readouterr().err


def test_a_config_files_output_keys_are_refused(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('problem = "branin"\nclients = 2\nplot = "x.png"\n')
    argv = ["compare", "random", "--config", str(config), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "compare writes its own files into --out DIR" in err and "plot" in err
