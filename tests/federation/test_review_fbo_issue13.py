r"""Review of the FBO-FedGP presets / options of issue 13 and the CLI defaults.

Each test is a defect found in review (fixed since): presets that did not follow
``dataclasses.replace`` or explicit settings, a batch rule silently ignored, and nullable
choice options that refused ``none``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from botorch_fed.cli import build_parser
from botorch_fed.federation import FBOFedGPConfig, build_federation
from botorch_fed.federation.fbo_fedgp import PRESET_VALUES, FBOFedGPClient
from tests.federation.test_fbo_fedgp import _config as _base_config
from tests.federation.test_fbo_fedgp import _setup

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


def _config(**kwargs) -> FBOFedGPConfig:
    return _base_config(**{"num_rounds": 1, **kwargs})


def _global_points(clients) -> torch.Tensor:
    r"""The ``k x d`` points the clients evaluated in their (single) global step."""
    rows = [
        torch.tensor(h["x"], dtype=torch.float64)
        for c in clients.values()
        for h in c.history
        if h["step"] == "global"
    ]
    return torch.stack(rows)


def test_default_preset_with_pitc_model_does_not_make_all_clients_evaluate_one_point():
    cfg = _config(global_model="pitc")
    assert cfg.resolved().mixing == "global"  # every client steps on the shared model
    server, clients, _ = build_federation("fbo-fedgp", _setup(), cfg)
    server.run()
    X = _global_points(clients)
    assert len(X) == 3
    # three clients, three evaluations of the one shared model: they must not coincide
    assert (torch.cdist(X, X) + torch.eye(3)).min() > 1e-6


def test_dataclasses_replace_of_preset_gives_the_new_presets_algorithm():
    paper = dataclasses.replace(FBOFedGPConfig(), preset="paper")
    assert paper.preset == "paper"
    for name, value in PRESET_VALUES["paper"].items():
        assert getattr(paper.resolved(), name) == value, name
    # the same root cause: a KG config derived from the default one is refused, while
    # FBOFedGPConfig(acquisition="kg") is valid
    dataclasses.replace(FBOFedGPConfig(), acquisition="kg").validate()


def test_paper_preset_with_pic_model_is_accepted():
    cfg = FBOFedGPConfig.paper(global_model="pic")
    cfg.validate()
    assert cfg.resolved().global_batch == "independent"


def test_expected_mixing_with_batch_rule_is_refused_or_honoured(monkeypatch):
    cfg = _config(mixing="expected", global_batch="batch")
    try:
        cfg.validate()
    except ValueError:
        return  # refusing the combination is a fix too
    calls = []
    original = FBOFedGPClient._batch_point

    def recording(self, model, t, *args):
        calls.append(self.client_id)
        return original(self, model, t, *args)

    monkeypatch.setattr(FBOFedGPClient, "_batch_point", recording)
    server, clients, _ = build_federation("fbo-fedgp", _setup(), cfg)
    server.run()
    assert len(calls) == 3, "the 'batch' rule was not used by the global clients"


def test_nullable_preset_options_accept_none_on_the_command_line():
    parser = build_parser()
    args = parser.parse_args(
        ["run", "fbo-fedgp", "--problem", "branin", "--mixing", "none", "--global-model", "none"]
    )
    assert getattr(args, "settings.mixing") is None
    assert getattr(args, "settings.global_model") is None
