"""Unit tests of ppolab.algos against the facts sheet's semantics (clamps, epsilons, edge cases)."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ppolab.algos as A
from ppolab.config import ActorConfig



pytestmark = pytest.mark.usefixtures("float64_by_default")  # tests/conftest.py



# ---------------------------------------------------------------- masked helpers (facts §1)
def test_masked_mean_empty_mask_is_zero_and_ignores_nan_outside():
    x = torch.tensor([[1.0, float("nan")], [3.0, 5.0]])
    m = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert A.masked_mean(x, m).item() == pytest.approx(2.0)
    assert A.masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert A.masked_mean(x, m, axis=-1).tolist() == pytest.approx([1.0, 3.0])


def test_masked_var_is_unbiased_and_raises_on_zero_or_one_token():
    x = torch.tensor([1.0, 2.0, 4.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert A.masked_var(x, m).item() == pytest.approx(torch.tensor([1.0, 2.0, 4.0]).var().item())
    with pytest.raises(ValueError):
        A.masked_var(x, torch.zeros(4))
    with pytest.raises(ValueError):
        A.masked_var(x, torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_masked_whiten_standardises_valid_tokens_and_touches_masked_ones():
    x = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = A.masked_whiten(x, m)
    assert A.masked_mean(w, m).item() == pytest.approx(0.0, abs=1e-7)
    assert A.masked_var(w, m).item() == pytest.approx(1.0, abs=1e-6)
    assert w[0, 3].item() != 0.0  # not re-masked


# ---------------------------------------------------------------- log-probs and entropy
def test_logprobs_and_entropy_match_torch_distributions():
    logits = torch.randn(3, 5, 11)
    labels = torch.randint(0, 11, (3, 5))
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(A.logprobs_from_logits(logits, labels), dist.log_prob(labels))
    assert torch.allclose(A.entropy_from_logits(logits), dist.entropy())
    half = logits.to(torch.bfloat16)
    assert torch.allclose(A.logprobs_from_logits(half, labels).double(), dist.log_prob(labels), atol=0.1)


def test_scale_logits_divides_by_clamped_temperature_per_sample():
    logits = torch.ones(2, 3, 4)
    out = A.scale_logits(logits, torch.tensor([0.5, 0.0]))
    assert out[0].unique().item() == 2.0
    assert out[1].unique().item() == pytest.approx(1e8)
    assert logits.unique().item() == 1.0  # not in place


# ---------------------------------------------------------------- aggregation (facts §3)
def test_agg_loss_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert A.agg_loss(loss, m, "token-mean").item() == pytest.approx(10 / 4)
    assert A.agg_loss(loss, m, "token-sum").item() == pytest.approx(10)
    assert A.agg_loss(loss, m, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert A.agg_loss(loss, m, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert A.agg_loss(loss, m, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 4) / 2 / 3)
    assert A.agg_loss(loss, m, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.5)
    # global normalisation: divide by the global count, multiply by dp_size
    assert A.agg_loss(loss, m, "token-mean", dp_size=2, batch_num_tokens=8).item() == pytest.approx(10 / 8 * 2)
    assert A.agg_loss(loss, m, "seq-mean-token-mean", dp_size=2, global_batch_size=4).item() == pytest.approx(6 / 4 * 2)


def test_agg_loss_unknown_mode_names_the_five():
    with pytest.raises(ValueError) as err:
        A.agg_loss(torch.ones(1, 1), torch.ones(1, 1), "mean")
    for mode in A.LOSS_AGG_MODES:
        assert mode in str(err.value)


def test_agg_loss_requires_global_counts_when_dp_gt_1():
    with pytest.raises(ValueError, match="batch_num_tokens"):
        A.agg_loss(torch.ones(1, 1), torch.ones(1, 1), "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        A.agg_loss(torch.ones(1, 1), torch.ones(1, 1), "seq-mean-token-mean", dp_size=2)


def test_agg_loss_all_zero_mask_edge_cases():
    loss, m = torch.ones(2, 3), torch.zeros(2, 3)
    assert math.isnan(A.agg_loss(loss, m, "token-mean").item())
    assert math.isnan(A.agg_loss(loss, m, "seq-mean-token-mean").item())
    assert A.agg_loss(loss, m, "token-sum").item() == 0.0


def test_nan_at_masked_positions_follows_verl():
    loss = torch.tensor([[1.0, float("nan")]])
    m = torch.tensor([[1.0, 0.0]])
    assert A.agg_loss(loss, m, "token-mean").item() == 1.0
    assert A.agg_loss(loss, m, "token-sum").item() == 1.0
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert math.isnan(A.agg_loss(loss, m, mode).item()), mode


# ---------------------------------------------------------------- policy losses (facts §2, §8)
def test_registry_lists_names_on_unknown():
    with pytest.raises(ValueError) as err:
        A.get_policy_loss_fn("ppo")
    for name in ("vanilla", "gspo", "cispo", "gpg", "sapo"):
        assert name in str(err.value)


def test_reinforce_is_not_a_loss_mode_as_in_verl():
    # verl 0.9.1 has no "reinforce" loss mode: REINFORCE-style updates are bypass_mode with its loss_type
    assert "reinforce" not in A.POLICY_LOSS_REGISTRY


def test_vanilla_asymmetric_clip_uses_low_and_high():
    cfg = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.1, clip_ratio_high=0.3)
    old = torch.zeros(1, 4)
    lp = torch.tensor([[math.log(0.85), math.log(0.95), math.log(1.25), math.log(1.35)]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    terms = A.ppo_clip_terms(old, lp, adv, 0.1, 0.3)
    # A<0, r=0.85 < 1-0.1 → clipped to 0.9; A>0, r=1.35 > 1.3 → clipped
    assert terms["clipped"].tolist() == [[1.0, 0.0, 0.0, 1.0]]
    _, metrics = A.compute_policy_loss_vanilla(old, lp, adv, torch.ones_like(adv), config=cfg)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_vanilla_asserts_dual_clip_constant_above_one():
    with pytest.raises(AssertionError):
        A.compute_policy_loss_vanilla(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                      config=ActorConfig(clip_ratio_c=1.0))


def test_vanilla_log_ratio_clamp_at_20_saturates_gradient():
    old = torch.zeros(1, 2)
    lp = torch.tensor([[25.0, 0.1]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0]])
    terms = A.ppo_clip_terms(old, lp, adv, 0.2, 0.2, 3.0)
    assert terms["ratio"][0, 0].item() == pytest.approx(math.exp(20))
    terms["pg_losses1"].sum().backward()
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 1].item() != 0.0


def test_rollout_is_weights_multiply_after_clipping_and_leave_metrics():
    old, lp = torch.zeros(1, 2), torch.tensor([[0.5, -0.1]])
    adv, m = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    w = torch.tensor([[2.0, 0.5]])
    cfg = ActorConfig()
    base, base_metrics = A.compute_policy_loss_vanilla(old, lp, adv, m, config=cfg)
    weighted, weighted_metrics = A.compute_policy_loss_vanilla(old, lp, adv, m, config=cfg, rollout_is_weights=w)
    per_token = A.ppo_clip_terms(old, lp, adv, 0.2, 0.2)["pg_losses"]
    assert weighted.item() == pytest.approx((per_token * w).mean().item())
    assert weighted_metrics == base_metrics and weighted.item() != base.item()


def test_global_batch_info_reaches_agg_loss():
    cfg = ActorConfig(global_batch_info={"dp_size": 2, "batch_num_tokens": 8})
    loss, _ = A.compute_policy_loss_vanilla(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2),
                                            config=cfg)
    assert loss.item() == pytest.approx(-2 / 8 * 2)


def test_gpg_is_minus_a_log_pi():
    lp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    adv, m, cfg = torch.tensor([[1.0, -2.0]]), torch.ones(1, 2), ActorConfig()
    for name in ("gpg",):
        loss, _ = A.get_policy_loss_fn(name)(torch.zeros(1, 2), lp, adv, m, config=cfg)
        assert loss.item() == pytest.approx(((0.5 * 1) + (-2.0 * 2)) / 2)
        (grad,) = torch.autograd.grad(loss, lp)
        assert grad.tolist() == [[-0.5, 1.0]]


def test_gspo_uses_one_sequence_ratio_and_per_token_gradient():
    old = torch.zeros(2, 3)
    lp = torch.tensor([[0.1, 0.2, 9.0], [0.05, -0.05, 0.0]], requires_grad=True)
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    cfg = ActorConfig(clip_ratio_low=0.5, clip_ratio_high=0.5)
    loss, metrics = A.compute_policy_loss_gspo(old, lp, adv, m, config=cfg)
    s0 = math.exp(0.15)  # the masked 9.0 does not count
    assert loss.item() == pytest.approx((-(s0 * 2) + 1.0 * 3) / 5, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[0, 0].item() == pytest.approx(-s0 / 5) and grad[0, 2].item() == 0.0
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_cispo_keeps_gradient_on_clipped_tokens():
    old = torch.zeros(1, 1)
    lp = torch.tensor([[0.5]], requires_grad=True)  # ratio 1.65 > 1.2
    adv = torch.ones(1, 1)
    loss, metrics = A.compute_policy_loss_cispo(old, lp, adv, torch.ones(1, 1), config=ActorConfig())
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad.item() == pytest.approx(-1.2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1.0)
    van, _ = A.compute_policy_loss_vanilla(old, lp, adv, torch.ones(1, 1), config=ActorConfig())
    assert torch.autograd.grad(van, lp)[0].item() == 0.0


def test_sapo_gate_and_forced_seq_mean_token_mean():
    old = torch.zeros(2, 2)
    lp = torch.tensor([[0.2, 0.0], [-0.1, 0.3]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    m = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    cfg = ActorConfig()
    loss, _ = A.compute_policy_loss_sapo(old, lp, adv, m, loss_agg_mode="token-mean", config=cfg)

    def gate(r, tau):
        return torch.sigmoid(torch.tensor(tau * (r - 1))).item() * 4 / tau

    row0 = -gate(math.exp(0.2), 1.0)
    row1 = (gate(math.exp(-0.1), 1.05) + gate(math.exp(0.3), 1.05)) / 2
    assert loss.item() == pytest.approx((row0 + row1) / 2)


# ---------------------------------------------------------------- KL (facts §4, §11)
def test_kl_estimators_values():
    lp, ref = torch.tensor([-1.0, -3.0]), torch.tensor([-1.5, -1.0])
    d = lp - ref
    assert torch.allclose(A.kl_penalty(lp, ref, "k1"), d)
    assert torch.allclose(A.kl_penalty(lp, ref, "kl"), d)
    assert torch.allclose(A.kl_penalty(lp, ref, "abs"), d.abs())
    assert torch.allclose(A.kl_penalty(lp, ref, "k2"), 0.5 * d**2)
    assert torch.allclose(A.kl_penalty(lp, ref, "low_var_kl"), torch.exp(-d) + d - 1)


def test_k3_clamps_inside_and_outside():
    lp, ref = torch.tensor([0.0, 0.0]), torch.tensor([30.0, -3.0])
    out = A.kl_penalty(lp, ref, "k3")
    assert out[0].item() == 10.0  # exp(20) - 20 - 1 clamped at 10
    assert out[1].item() == pytest.approx(math.exp(-3) + 3 - 1)


@pytest.mark.parametrize("name", ["k1+", "abs+", "k3+", "low_var_kl+", "k2+", "mse+"])
def test_straight_through_value_of_estimator_gradient_of_k2(name):
    lp = torch.tensor([-1.0, -2.0, -0.3], requires_grad=True)
    ref = torch.tensor([-1.4, -1.0, -0.3])
    out = A.kl_penalty(lp, ref, name)
    assert torch.allclose(out, A.kl_penalty_forward(lp, ref, name[:-1]))
    (grad,) = torch.autograd.grad(out.sum(), lp)
    assert torch.allclose(grad, (lp - ref).detach())


def test_full_and_unknown_kl_raise():
    with pytest.raises(NotImplementedError, match="vocabulary"):
        A.kl_penalty(torch.zeros(1), torch.zeros(1), "full")
    with pytest.raises(NotImplementedError):
        A.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_adaptive_controller_update_is_clipped_proportional():
    ctrl = A.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=1.0, n_steps=10)  # error clipped to +0.2
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    ctrl.update(current_kl=0.045, n_steps=10)  # error -0.1
    assert ctrl.value == pytest.approx(0.1 * 1.02 * (1 - 0.1 * 10 / 100))
    fixed = A.FixedKLController(0.3)
    fixed.update(5.0, 10)
    assert fixed.value == 0.3


def test_get_kl_controller_from_config():
    class Cfg:
        type, kl_coef, horizon, target_kl = "adaptive", 0.2, 10, 0.1

    assert isinstance(A.get_kl_controller(Cfg), A.AdaptiveKLController)
    Cfg.type = "pid"
    with pytest.raises(NotImplementedError, match="fixed or adaptive"):
        A.get_kl_controller(Cfg)


def test_apply_kl_penalty_uses_old_log_probs_and_reads_beta_before_update():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0], [-2.0, -2.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ctrl = A.AdaptiveKLController(0.5, target_kl=0.01, horizon=10)
    rewards, metrics = A.apply_kl_penalty(scores, old, ref, m, ctrl, "kl")
    assert torch.allclose(rewards, torch.tensor([[-0.25, 0.5], [0.0, 0.0]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.75 + 0.0) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert ctrl.value == pytest.approx(0.5 * (1 + 0.2 * 2 / 10))


# ---------------------------------------------------------------- value loss (facts §5)
def test_value_loss_clipfrac_and_global_args():
    vpreds = torch.tensor([[0.9, 0.5]])
    returns = torch.tensor([[1.0, 0.5]])
    values = torch.tensor([[0.4, 0.5]])
    m = torch.ones(1, 2)
    loss, frac = A.compute_value_loss(vpreds, returns, values, m, 0.2)
    assert loss.item() == pytest.approx(0.5 * 0.16 / 2)
    assert frac.item() == pytest.approx(0.5)
    g, _ = A.compute_value_loss(vpreds, returns, values, m, 0.2, dp_size=2, batch_num_tokens=4)
    assert g.item() == pytest.approx(0.5 * 0.16 / 4 * 2)


# ---------------------------------------------------------------- advantages (facts §7)
def test_gae_by_hand_with_masked_observation_span():
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, 0.6, 0.7]])
    m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])  # position 1 is a tool observation
    g, lam = 0.9, 0.8
    # backwards: t=3: δ=1-0.7=0.3 ; t=2: δ=0+0.9*0.7-0.6=0.03, gae=0.03+0.72*0.3 ; t=1 skipped ; t=0 uses V_next=0.6
    gae3 = 0.3
    gae2 = 0.03 + g * lam * gae3
    gae0 = (0 + g * 0.6 - 0.5) + g * lam * gae2
    raw = torch.tensor([[gae0, gae2, gae2, gae3]])
    adv, ret = A.compute_gae_advantage_return(r, v, m, gamma=g, lam=lam)
    assert torch.allclose(ret, raw + v)
    assert torch.allclose(adv, A.masked_whiten(raw, m))


def test_gae_single_valid_token_raises():
    with pytest.raises(ValueError):
        A.compute_gae_advantage_return(torch.ones(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 1.0, 1.0)


def test_grpo_groups_singleton_and_equal_scores():
    r = torch.zeros(6, 2)
    r[:, 1] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 3.0])
    m = torch.ones(6, 2)
    index = ["a", "a", "a", "b", "b", "c"]
    adv, ret = A.compute_grpo_outcome_advantage(r, m, index)
    a = torch.tensor([1.0, 0.0, 1.0])
    expected_a = (a - a.mean()) / (a.std() + 1e-6)
    assert torch.allclose(adv[:3, 0], expected_a)
    assert adv[3:5].abs().max().item() == 0.0
    assert adv[5, 0].item() == pytest.approx(3.0 / (1 + 1e-6))
    assert torch.equal(adv, ret)
    adv_nostd, _ = A.compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv_nostd[:3, 0], a - a.mean())


def test_rloo_leave_one_out_and_singleton_keeps_score():
    r = torch.tensor([[1.0], [0.0], [0.0], [5.0]])
    adv, _ = A.compute_rloo_outcome_advantage(r, torch.ones(4, 1), [0, 0, 0, 1])
    assert adv[:, 0].tolist() == pytest.approx([1.0, -0.5, -0.5, 5.0])


def test_opo_length_weighted_baseline():
    r = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, _ = A.compute_opo_outcome_advantage(r, m, [7, 7])
    b = (3 * 1.0 + 1 * 0.0) / 4
    assert adv[0, 0].item() == pytest.approx(1 - b) and adv[1, 0].item() == pytest.approx(-b)
    assert adv[1, 1].item() == 0.0


def test_gpg_alpha_scales_by_nonzero_share():
    r = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    adv, _ = A.compute_gpg_outcome_advantage(r, torch.ones(4, 1), [0, 0, 1, 1])
    assert adv[:, 0].tolist() == pytest.approx([4 * 0.5, -4 * 0.5, 0.0, 0.0])


def test_grpo_passk_only_best_sample_and_needs_two():
    class Cfg:
        norm_adv_by_std_in_grpo = False

    r = torch.tensor([[0.2], [1.0], [0.5]])
    adv, _ = A.compute_grpo_passk_outcome_advantage(r, torch.ones(3, 1), [0, 0, 0], config=Cfg)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="at least 2"):
        A.compute_grpo_passk_outcome_advantage(r, torch.ones(3, 1), [0, 0, 1], config=Cfg)


def test_reinforce_plus_plus_carries_return_across_masked_span():
    class Cfg:
        gamma = 0.5

    r = torch.tensor([[0.0, 0.0, 0.0, 4.0]])
    m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv, ret = A.compute_reinforce_plus_plus_outcome_advantage(r, m, config=Cfg)
    # t3: 4, t2: 2, t1 (masked): new = 1 but not carried, returns 0; t0: 0 + 0.5*2 = 1
    assert torch.allclose(ret, torch.tensor([[1.0, 0.0, 2.0, 4.0]]))
    assert torch.allclose(adv, A.masked_whiten(ret, m) * m)


def test_reinforce_plus_plus_baseline_and_remax():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]])
    m = torch.ones(3, 2)
    adv, _ = A.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, [0, 0, 1])
    tiled = torch.tensor([[0.5, 0.5], [-0.5, -0.5], [2.0, 2.0]])
    assert torch.allclose(adv, A.masked_whiten(tiled, m))
    adv, ret = A.compute_remax_outcome_advantage(r, torch.tensor([1.0, 1.0, 1.0]), m)
    assert ret.tolist() == [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]
    assert adv.tolist() == [[0.0, 0.0], [-1.0, -1.0], [1.0, 1.0]]


def test_compute_advantage_dispatch_and_unknown_estimator():
    r, m = torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.ones(2, 2)
    adv, _ = A.compute_advantage("grpo", r, m, index=[0, 0])
    assert torch.allclose(adv, A.compute_grpo_outcome_advantage(r, m, [0, 0])[0])
    with pytest.raises(ValueError, match="grpo"):
        A.compute_advantage("ppo", r, m, index=[0, 0])
    with pytest.raises(ValueError, match="critic"):
        A.compute_advantage("gae", r, m)


# ---------------------------------------------------------------- rollout IS weights (facts §13)
def test_rollout_is_weights_token_sequence_tis_icepop():
    old = torch.tensor([[0.0, 0.5, 9.0]])
    rollout = torch.tensor([[0.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    w = A.rollout_is_weights(old, rollout, m, "token", threshold=1.5)
    assert torch.allclose(w, torch.tensor([[1.0, 1.5, 0.0]]))
    seq = A.rollout_is_weights(old, rollout, m, "sequence", threshold=100.0)
    assert torch.allclose(seq, torch.tensor([[math.exp(0.5), math.exp(0.5), 0.0]]))
    ice = A.rollout_is_weights(old, rollout, m, "token", threshold="0.9_1.5")
    assert torch.allclose(ice, torch.tensor([[1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="token, sequence"):
        A.rollout_is_weights(old, rollout, m, "batch")
    weights, mask, metrics = A.rollout_correction_and_rejection_mask(old, rollout, m, "token", 1.5)
    assert torch.equal(weights, w) and torch.equal(mask, m)  # the one call gives the same weights
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.25)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(1.5)


# ---------------------------------------------------------------- the package itself
def test_import_is_fast_and_torch_only():
    code = (
        "import time, sys, torch; t = time.perf_counter(); import ppolab.algos; "
        "print(time.perf_counter() - t, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) < 1.0
    assert out[1] == "False"


def test_no_algos_module_over_400_lines():
    for path in Path(A.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name


def test_value_clip_terms_chapter_example():
    t = lambda x: torch.tensor([[x]])  # noqa: E731
    vclip, unclipped, clipped, used = A.value_clip_terms(t(0.9), t(1.0), t(0.4), 0.2)
    assert [round(float(x), 6) for x in (vclip, unclipped, clipped, used)] == [0.6, 0.01, 0.16, 0.16]
    loss, _ = A.compute_value_loss(t(0.9), t(1.0), t(0.4), torch.ones(1, 1), 0.2)
    assert float(loss) == pytest.approx(0.5 * float(used))


def test_explained_variance_matches_the_flat_formula_and_its_extremes():
    g = torch.Generator().manual_seed(0)
    returns, values = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    r, v = returns[mask.bool()], values[mask.bool()]
    expected = 1 - torch.var(r - v) / (torch.var(r) + 1e-5)
    assert float(A.explained_variance(returns, values, mask)) == pytest.approx(float(expected), rel=1e-9)
    assert float(A.explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert float(A.explained_variance(returns, torch.full_like(returns, 3.0), mask)) == pytest.approx(0.0, abs=1e-4)


def test_rollout_probs_diff():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    roll = torch.log(torch.tensor([[0.4, 0.2, 0.1]]))
    m = A.rollout_probs_diff(old, roll, torch.tensor([[1.0, 1.0, 0.0]]))
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.1)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.05)
