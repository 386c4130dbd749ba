r"""The real task's tests, as ``benchmarks/which_method_plan.md`` ("The real task") fixes them.

Reads the cross-validated federated-HPO runs (``federated_hpo_cv_<dataset>_runs.jsonl``,
written by ``python benchmarks/federated_hpo.py --cv-folds 5 --dataset <dataset> ...``) and
writes ``federated_hpo_cv_tests.md`` and ``.json``:

- per data set, every method of the plan (FBO-FedGP's default, central, FTS, random) against
  local BO on the primary metric, the client-mean test log-loss, paired by seed: mean
  difference, wins, the two-sided Wilcoxon signed-rank p, and Holm over the plan's 2 x 4
  comparisons;
- the "not worse" bound: the 95% percentile-bootstrap upper bound (10,000 resamples of the
  seeds, generator seed 0; as C3 of the plan) of the mean over seeds of
  ``log10(loss_method / loss_local)``, against ``log10(1.25)``;
- the paper's FBO-FedGP preset (``fbo-fedgp/plaintext``) and the secondary metric (the
  federation's test loss) beside them, outside the family: descriptive.

Usage::

    python benchmarks/federated_hpo_cv_tests.py
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from which_method import _bootstrap_upper, _holm, _wilcoxon  # the plan's helpers

RESULTS = Path(__file__).parent / "results"
DATASETS = ("breast_cancer", "wine")
FAMILY = ("fbo-fedgp-default/plaintext", "central", "fts", "random")  # the plan's methods
DESCRIPTIVE = ("fbo-fedgp/plaintext",)  # the paper's preset: reported, decides nothing
MARGIN = math.log10(1.25)


def _runs(path: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out.setdefault(r["variant"], {})[int(r["seed"])] = r
    return out


def _compare(runs, variant: str) -> dict:
    local, other = runs["local"], runs.get(variant, {})
    seeds = sorted(set(local) & set(other))
    primary = np.array([np.mean(other[s]["client_test"]) for s in seeds])
    base = np.array([np.mean(local[s]["client_test"]) for s in seeds])
    fed = np.array([other[s]["federation_test"] for s in seeds])
    fed_base = np.array([local[s]["federation_test"] for s in seeds])
    d, ratio = primary - base, np.log10(primary / base)
    return {
        "variant": variant,
        "seeds": len(seeds),
        "mean_loss": float(primary.mean()) if len(seeds) else None,
        "local_loss": float(base.mean()) if len(seeds) else None,
        "mean_d": float(d.mean()) if len(seeds) else None,
        "wins": int((d < 0).sum()),
        "losses": int((d > 0).sum()),
        "p": _wilcoxon(d),
        "log_ratio_mean": float(ratio.mean()) if len(seeds) else None,
        "log_ratio_upper": _bootstrap_upper(ratio) if len(seeds) else None,
        "federation_loss": float(fed.mean()) if len(seeds) else None,
        "federation_d": float((fed - fed_base).mean()) if len(seeds) else None,
        "federation_p": _wilcoxon(fed - fed_base),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for dataset in DATASETS:
        runs = _runs(args.results / f"federated_hpo_cv_{dataset}_runs.jsonl")
        for variant in (*FAMILY, *DESCRIPTIVE):
            if runs.get(variant):  # a method not run (yet) is left out, and said so
                rows.append({"dataset": dataset, **_compare(runs, variant)})
            else:
                print(f"{dataset}: no runs of {variant}")
    family = [r for r in rows if r["variant"] in FAMILY]
    for r, adjusted in zip(family, _holm([r["p"] for r in family]), strict=True):
        r["p_holm"] = float(adjusted)
    for r in rows:
        r.setdefault("p_holm", None)
        r["better"] = bool(r["p_holm"] is not None and r["p_holm"] < 0.05 and r["mean_d"] < 0)
        r["not_worse"] = bool(r["log_ratio_upper"] is not None and r["log_ratio_upper"] < MARGIN)
    default = [r for r in rows if r["variant"] == FAMILY[0]]
    pays = len(default) == len(DATASETS) and all(r["better"] for r in default)
    lines = [
        "# The real task's tests (issue 36; plan: `benchmarks/which_method_plan.md`)",
        "",
        "Command: `python benchmarks/federated_hpo_cv_tests.py`, on the runs of "
        "`federated_hpo_cv_breast_cancer_runs.jsonl` and `federated_hpo_cv_wine_runs.jsonl` "
        "(their reports: `federated_hpo_cv_<dataset>.md`). Primary metric: the client-mean "
        "test log-loss (each client deploys its own incumbent); `d` = method - local BO, paired "
        "by seed (negative: better); two-sided Wilcoxon signed-rank p, Holm over the plan's "
        f"{len(family)} comparisons (`fbo-fedgp/plaintext`, the paper's preset, is outside the "
        "family: descriptive); *not worse*: the 95% bootstrap upper bound of the mean "
        f"`log10(loss / loss_local)` below log10(1.25) = {MARGIN:.4f}. Secondary: the "
        "federation's test loss (the run's best configuration deployed by every client).",
        "",
        "| data set | method | seeds | loss | local | mean d | wins/losses | p | p (Holm) | "
        "log-ratio, 95% upper | better | not worse | federation d (p) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        holm = "-" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
        lines.append(
            f"| {r['dataset']} | {r['variant']} | {r['seeds']} | {r['mean_loss']:.4f} | "
            f"{r['local_loss']:.4f} | {r['mean_d']:+.4f} | {r['wins']}/{r['losses']} | "
            f"{r['p']:.3g} | {holm} | {r['log_ratio_mean']:+.3f}, {r['log_ratio_upper']:+.3f} | "
            f"{'yes' if r['better'] else 'no'} | {'yes' if r['not_worse'] else 'no'} | "
            f"{r['federation_d']:+.4f} ({r['federation_p']:.3g}) |"
        )
    lines += [
        "",
        f'"Federating pays on the real task" for FBO-FedGP (its default better than local BO '
        f"after Holm on both data sets): {'holds' if pays else 'does not hold'}.",
    ]
    text = "\n".join(lines) + "\n"
    (args.results / "federated_hpo_cv_tests.md").write_text(text)
    (args.results / "federated_hpo_cv_tests.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
