"""The chapter's worked numbers, computed by ppolab.algos (chapter §3.1, §4.2–4.4, §8.1, §10.6)."""
import math

import pytest
import torch

from ppolab.algos import agg_loss, compute_policy_loss_vanilla, compute_value_loss, ppo_clip_terms
from ppolab.config import ActorConfig


def one_token(x: float) -> torch.Tensor:
    return torch.tensor([[x]], dtype=torch.float64)


def test_ratio_from_log_probs_section_3_1():
    terms = ppo_clip_terms(one_token(-1.2), one_token(-1.0), one_token(1.0), 0.2, 0.2)
    assert terms["ratio"].item() == pytest.approx(math.exp(0.2))
    assert round(terms["ratio"].item(), 3) == 1.221


def test_positive_advantage_is_clipped_section_4_2():
    mask = one_token(1.0)
    loss, metrics = compute_policy_loss_vanilla(one_token(-1.2), one_token(-1.0), one_token(1.0), mask,
                                                config=ActorConfig())
    terms = ppo_clip_terms(one_token(-1.2), one_token(-1.0), one_token(1.0), 0.2, 0.2)
    assert -terms["pg_losses1"].item() == pytest.approx(1.2214, abs=1e-4)  # ratio·A
    assert -terms["pg_losses2"].item() == pytest.approx(1.2)  # clip(ratio)·A
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1.0)


def test_negative_advantage_is_not_clipped_section_4_3():
    loss, metrics = compute_policy_loss_vanilla(
        one_token(-1.2), one_token(-1.0), one_token(-1.0), one_token(1.0), config=ActorConfig()
    )
    assert loss.item() == pytest.approx(1.2214, abs=1e-4)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_dual_clip_example_section_4_4():
    ratio = torch.tensor([[5.0, 0.5, 1.1]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    old = torch.zeros_like(ratio)
    terms = ppo_clip_terms(old, ratio.log(), adv, 0.2, 0.2, 3.0)
    assert terms["pg_losses"].tolist()[0] == pytest.approx([3.0, 0.8, -1.1])
    loss, metrics = compute_policy_loss_vanilla(old, ratio.log(), adv, torch.ones_like(adv), config=ActorConfig())
    assert loss.item() == pytest.approx((3.0 + 0.8 - 1.1) / 3)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_value_clip_example_section_8_1():
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds=one_token(0.9), returns=one_token(1.0), values=one_token(0.4), response_mask=one_token(1.0),
        cliprange_value=0.2,
    )
    assert vf_loss.item() == pytest.approx(0.08)
    assert vf_clipfrac.item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "mode, expected_share_a",
    [("token-mean", 2 / 8), ("seq-mean-token-sum", 2 / 8), ("seq-mean-token-mean", 1 / 2)],
)
def test_length_weighting_example_section_10_6(mode, expected_share_a):
    # Trajectory A has 2 valid tokens, B has 6; every token loss is 1.
    mask = torch.zeros(2, 6, dtype=torch.float64)
    mask[0, :2] = 1
    mask[1, :] = 1
    losses = torch.ones(2, 6, dtype=torch.float64, requires_grad=True)
    agg_loss(losses, mask, mode).backward()
    per_traj = (losses.grad * mask).sum(dim=1)
    assert (per_traj[0] / per_traj.sum()).item() == pytest.approx(expected_share_a)
