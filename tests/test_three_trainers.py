"""Lab 13's three trainers (ppolab/numbers/three_trainers.py, ppolab/widgets/three_trainers.py): verl's rule is
ppolab's agg_loss, so its invariance is the replay's; the explorer moves; bad splits are named. The parity with TRL's
and OpenRLHF's own code is tests/parity/test_trainers_parity.py (.ci/run's other-trainers phase)."""
from __future__ import annotations

import pytest
import torch

from ppolab.algos import LOSS_AGG_MODES
from ppolab.numbers import three_trainers as tt


def _mask():
    lengths = [5, 1, 3, 4, 2, 5]
    m = torch.zeros(6, 5, dtype=torch.float64)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_verls_rule_is_invariant_exactly_where_agg_loss_is(mode):
    """§13: with the global counts every mode is invariant, except sum-norm with loss_scale_factor=None, whose
    divisor is the width each micro-batch is trimmed to."""
    mask = _mask()
    f = tt.split_factors(mask, tt.verl_rule(mode, None), tt.Split(1), max_length=5)
    moves = bool((f - 1).abs().max() > 1e-12)
    assert moves == (mode == "seq-mean-token-sum-norm")
    fixed = tt.split_factors(mask, tt.verl_rule(mode, 5.0), tt.Split(1), max_length=5)
    torch.testing.assert_close(fixed, torch.ones_like(fixed))


def test_the_weights_are_the_gradient_of_the_summed_losses():
    """token_weights against a direct sum: TRL's bnpo, two rows a micro-batch, one rank (accumulation 3)."""
    mask = _mask()
    w = tt.token_weights(mask, tt.TRL_RULES["bnpo"], tt.Split(2), max_length=5)
    for k in range(3):
        rows = slice(2 * k, 2 * k + 2)
        want = mask[rows] / mask[rows].sum() / 3
        torch.testing.assert_close(w[rows], want)


def test_a_split_that_does_not_divide_the_rows_is_named():
    with pytest.raises(ValueError, match=r"Split\(micro=4, ranks=1\).*must divide the optimizer step's 6 rows"):
        tt.token_weights(_mask(), tt.verl_rule(), tt.Split(4), max_length=5)


def test_the_explorer_opens_on_the_run_and_tells_the_moving_rule():
    from ppolab.widgets import trainers_explorer

    w = trainers_explorer("ppo_fire_tiny")
    assert w.result["TRL 1.16 · loss_type=bnpo"]["split_max"] > 1 > w.result["TRL 1.16 · loss_type=bnpo"]["split_min"]
    assert "bnpo" in w.children[1].value
    w.controls["micro"].value = max(w.controls["micro"].options)  # the whole step in one micro-batch
    assert all(abs(v["split_max"] - 1) < 1e-12 and abs(v["split_min"] - 1) < 1e-12 for v in w.result.values())
    w.controls["ranks"].value = 2
    assert max(w.controls["micro"].options) == 8 and w.controls["micro"].value in w.controls["micro"].options
    with pytest.raises(ValueError, match="micro must divide each rank's 16 rows"):
        trainers_explorer("ppo_fire_tiny", micro=3)
    with pytest.raises(ValueError, match="ranks must be one of"):
        trainers_explorer("ppo_fire_tiny", ranks=3)


def test_13_4s_row_tells_bnpo_apart():
    """The case's row weighs neither the token mean's 1 nor what one row a micro-batch would give it."""
    from ppolab.exercises.lab13 import _e4, bnpo_case

    for run in ("grpo_tiny", "ppo_fire_tiny", "grpo_tool_tiny"):
        c = bnpo_case(run)
        mask = tt.step_mask(run, 1)["mask"]
        per_row = tt.versus_token_mean(mask, tt.TRL_RULES["bnpo"], tt.Split(1), max_length=16)
        truth = _e4(run)
        assert abs(truth - 1) > 1e-3 and c["micro"] > 1
        row_tokens = int(mask[:c["row"]].sum())
        assert abs(float(per_row[row_tokens]) - truth) > 1e-6
