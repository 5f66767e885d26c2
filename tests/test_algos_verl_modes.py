"""The verl loss modes and advantage estimators beyond vanilla/GRPO, on hand-computed cases: dppo_tv, dppo_kl,
clip_cov, kl_cov, geo_mean, dro, bypass_mode; gdpo, grpo_vectorized, rloo_vectorized, (tir_)optimal_token_baseline;
Σπ²; registry semantics; config fields and validation. Parity with verl itself: tests/parity/."""
from __future__ import annotations

import math
import types
import warnings

import numpy as np
import pytest
import torch

import ppolab.algos as A
from ppolab.config import ConfigError, ConfigNotice, load_config
from ppolab.config.actor import ActorConfig, RolloutCorrectionConfig, PolicyLossConfig

pytestmark = pytest.mark.usefixtures("float64_by_default")  # tests/conftest.py

VERL_LOSSES = ["bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "gspo", "kl_cov",
               "sapo", "vanilla"]
VERL_ESTIMATORS = ["gae", "gdpo", "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "optimal_token_baseline",
                   "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized",
                   "tir_optimal_token_baseline"]
L = math.log
t = torch.tensor


def cfg(**kw) -> ActorConfig:
    pl = {k: kw.pop(k) for k in list(kw) if k in PolicyLossConfig.__dataclass_fields__}
    return ActorConfig(**kw, policy_loss=PolicyLossConfig(**pl))


def run(name, old, lp, adv, mask=None, mode="token-mean", config=None, w=None, **kw):
    lp = lp.clone().requires_grad_()
    mask = torch.ones_like(old) if mask is None else mask
    loss, metrics = A.get_policy_loss_fn(name)(old, lp, adv, mask, mode, config or cfg(), w, **kw)
    loss.backward()
    return loss.item(), metrics, lp.grad


# -------------------------------------------------------------------------------------------------- registries


def test_registries_hold_exactly_verls_names():
    assert sorted(A.POLICY_LOSS_REGISTRY) == VERL_LOSSES
    assert sorted(A.ADV_ESTIMATOR_REGISTRY) == VERL_ESTIMATORS


@pytest.mark.parametrize("registry, register", [(A.POLICY_LOSS_REGISTRY, A.register_policy_loss),
                                                (A.ADV_ESTIMATOR_REGISTRY, A.register_adv_est)])
def test_registering_twice(registry, register):
    name = next(iter(registry))
    fn = registry[name]
    assert register(name)(fn) is fn and registry[name] is fn  # the same function again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register(name)(lambda *a, **k: None)
    assert registry[name] is fn
    try:
        def mine(*a, **k):
            return None

        register("my_test_entry")(mine)
        register("my_test_entry")(mine)
        assert registry["my_test_entry"] is mine
    finally:
        registry.pop("my_test_entry", None)


# ------------------------------------------------------------------------------------------------------- DPPO


def test_dppo_tv_hand_case():
    # p_old = 0.5 everywhere; p = 0.8 (up 0.3), 0.6 (up 0.1), 0.2 (down 0.3); δ = 0.2
    old, lp, adv = t([[L(.5)] * 3]), t([[L(.8), L(.6), L(.2)]]), t([[1.0, 1.0, -1.0]])
    loss, m, grad = run("dppo_tv", old, lp, adv)
    # valid: A>0 needs p − p_old ≤ 0.2 → [no, yes]; A≤0 needs p − p_old ≥ −0.2 → no. Only token 2 counts:
    assert loss == pytest.approx(-1.2 * L(.6) / 3)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["actor/pg_clipfrac_lower"] == 0.0
    assert m["actor/ppo_kl"] == pytest.approx(-(L(1.6) + L(1.2) + L(.4)) / 3)
    assert torch.allclose(grad, t([[0.0, -1.2 / 3, 0.0]]))  # −A·sg(r)/N on the valid token only


def test_dppo_truncation_uses_the_config_clip_ratio_c_3_not_20():
    # A < 0 and p rises 0.1 → 0.5 (r = 5): valid (p − p_old ≥ −δ), truncated at c
    old, lp, adv = t([[L(.1)]]), t([[L(.5)]]), t([[-1.0]])
    loss3, m3, _ = run("dppo_tv", old, lp, adv)  # ActorConfig default clip_ratio_c = 3.0 wins
    assert loss3 == pytest.approx(3 * L(.5)) and m3["actor/pg_clipfrac_lower"] == pytest.approx(1.0)
    loss20, m20, _ = run("dppo_tv", old, lp, adv, config=cfg(clip_ratio_c=20.0))
    assert loss20 == pytest.approx(5 * L(.5)) and m20["actor/pg_clipfrac_lower"] == 0.0
    # a config object without the key falls back to 20, as verl's config.get("clip_ratio_c", 20.0)
    bare = types.SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, global_batch_info={})
    bare.get = lambda key, default=None: getattr(bare, key, default)
    assert run("dppo_tv", old, lp, adv, config=bare)[0] == pytest.approx(5 * L(.5))


def test_dppo_kl_hand_case():
    p_old = 0.5
    probs = [0.8, 0.6, 0.1, 0.2]
    adv = t([[1.0, 1.0, 1.0, -1.0]])
    old, lp = t([[L(p_old)] * 4]), t([[L(p) for p in probs]])

    def bkl(p):
        return p_old * (L(p_old) - L(p)) + (1 - p_old) * L((1 - p_old + 1e-8) / (1 - p + 1e-8))

    assert bkl(.8) > 0.2 and bkl(.6) < 0.2 and bkl(.2) > 0.2
    # 0.8: too far up → dropped; 0.6: close → kept; 0.1: moved against A>0 → always kept; 0.2 with A<0: too far down
    valid = [0, 1, 1, 0]
    expected = sum(-a * min(p / p_old, 3.0) * L(p) * v for a, p, v in zip(adv[0].tolist(), probs, valid)) / 4
    loss, m, _ = run("dppo_kl", old, lp, adv)
    assert loss == pytest.approx(expected)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------- clip_cov / kl_cov


def cov_case():
    # A − mean A = [3, −1, −1, −1]; lp − mean lp = [1, −0.5, −0.25, −0.25] → cov = [3, 0.5, 0.25, 0.25]
    # (the masked means divide by N + 1e-8: keep every cov clear of the bounds)
    adv = t([[3.0, -1.0, -1.0, -1.0]])
    lp = t([[-0.5, -2.0, -1.75, -1.75]])
    return adv, lp


def test_clip_cov_zeroes_the_token_inside_lb_ub():
    adv, lp = cov_case()
    loss, m, grad = run("clip_cov", lp.clone(), lp, adv)  # r = 1: nothing clipped by PPO
    # only cov = 3 lies strictly in (1, 5); k = max(int(2e-4·4), 1) = 1
    assert loss == pytest.approx((0 + 1 + 1 + 1) / 4)
    assert m == {"actor/pg_clipfrac": pytest.approx(0.25), "actor/ppo_kl": pytest.approx(0.0)}
    assert grad[0, 0] == 0.0 and grad[0, 1] == pytest.approx(0.25)
    # a token the PPO clip already clipped is not a candidate: nothing left to zero
    old = lp.clone()
    old[0, 0] -= 0.5  # r = e^0.5 > 1.2 with A > 0 → clipped
    loss, m, _ = run("clip_cov", old, lp, adv)
    assert m["actor/pg_clipfrac"] == 0.0
    assert loss == pytest.approx((-3 * 1.2 + 3) / 4)


def test_clip_cov_draw_is_reproducible_with_a_generator():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 10, generator=g) * 3
    lp = old + 0.05 * torch.randn(6, 10, generator=g)
    adv = torch.randn(6, 10, generator=g) * 4
    c = cfg(clip_cov_ratio=0.1, clip_cov_lb=0.01, clip_cov_ub=50.0)
    state = torch.get_rng_state()
    runs = [run("clip_cov", old, lp, adv, config=c, generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][2], runs[1][2])
    assert runs[0][1]["actor/pg_clipfrac"] == pytest.approx(6 / 60)  # k = int(0.1·60) of many candidates
    assert not torch.equal(runs[0][2], runs[2][2])  # another seed, another draw
    # the same seed through the global RNG (verl's way) draws the same tokens
    torch.manual_seed(7)
    assert run("clip_cov", old, lp, adv, config=c)[0] == runs[0][0]


def test_kl_cov_penalises_the_top_covariance_token():
    adv, lp = cov_case()
    old = lp - t([[0.2, -0.1, 0.0, 0.0]])
    r = [math.exp(0.2), math.exp(-0.1), 1.0, 1.0]
    base = [-a * x for a, x in zip(adv[0].tolist(), r)]
    loss, m, _ = run("kl_cov", old, lp, adv)  # k = max(1, int(4·2e-4)) = 1 → token 0, ppo_kl_coef 0.1
    assert loss == pytest.approx((sum(base) + 0.1 * 0.2) / 4)
    assert m == {"actor/ppo_kl": pytest.approx(0.3 / 4)}  # mean |lp − old|
    loss_none, _, _ = run("kl_cov", old, lp, adv, config=cfg(ppo_kl_coef=None))  # fallback 1.0 only for None
    assert loss_none == pytest.approx((sum(base) + 0.2) / 4)


# ---------------------------------------------------------------------------------------------- geo_mean / dro


def test_geo_mean_hand_case_ignores_agg_mode():
    adv = t([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    d = t([[0.5, -0.1], [0.5, -0.5], [0.0, 0.0]])
    old = t([[-1.0, -1.0]] * 3)
    mask = t([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    # row 0 (A>0): d* = min(d, clip(d)) = [0.2, −0.1]; row 1 (A<0): d* = max(d, clip(d)) = [0.5, −0.2]
    expected = (-math.exp(0.05) + math.exp(0.15) + 0.0) / 3  # the empty row still counts in torch.mean
    for mode in ("token-mean", "seq-mean-token-sum-norm"):
        c = cfg(loss_agg_mode=mode, global_batch_info={"dp_size": 4, "batch_num_tokens": 99})
        loss, m, _ = run("geo_mean", old, old + d, adv, mask, mode, c)
        assert loss == pytest.approx(expected, abs=1e-7)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 4) and m["actor/pg_clipfrac_lower"] == pytest.approx(2 / 4)
    w = t([[4.0, 1.0], [1.0, 1.0], [1.0, 1.0]])  # geometric mean of row 0's weights: 2
    assert run("geo_mean", old, old + d, adv, mask, config=cfg(), w=w)[0] == pytest.approx(
        (-2 * math.exp(0.05) + math.exp(0.15)) / 3, abs=1e-7)


def test_dro_hand_case_and_missing_beta():
    old, lp, adv = t([[-1.5]]), t([[-1.0]]), t([[2.0]])
    loss, m, grad = run("dro", old, lp, adv, config=cfg(dro_beta=0.5))
    assert loss == pytest.approx(2.0 + 0.5 * 0.5 * 0.25)  # −(lp·A − ½β(lp − old)²)
    assert m == {"actor/ppo_kl": pytest.approx(-0.5)}
    assert grad.item() == pytest.approx(-2.0 + 0.5 * 0.5)
    for beta in (None, 0.0):
        with pytest.raises(ValueError, match="dro_beta"):
            run("dro", old, lp, adv, config=cfg(dro_beta=beta))


# ------------------------------------------------------------------------------------------------ bypass_mode


def bypass_cfg(**rc):
    c = cfg()
    c.policy_loss.rollout_correction = RolloutCorrectionConfig(**rc)
    return c


def test_bypass_ppo_clip_is_vanilla_on_the_rejection_mask_without_is_weights():
    rollout = t([[L(.5), L(.5), L(.5)]])
    lp = t([[L(.6), L(.9), L(.45)]])  # token 1 ratio 1.8: rejected by token_k1 with [1/1.5, 1.5]
    adv = t([[1.0, -1.0, 2.0]])
    c = bypass_cfg(rollout_is="token", rollout_is_threshold=1.2, rollout_rs="token_k1", rollout_rs_threshold=1.5)
    loss, m, grad = run("bypass_mode", rollout, lp, adv, config=c, w=torch.full_like(lp, 9.0))
    vanilla, vm, _ = run("vanilla", rollout, lp, adv, t([[1.0, 0.0, 1.0]]))
    assert loss == pytest.approx(vanilla)  # the IS weights (1.2, 1.2, 0.9) are not applied
    assert m["actor/pg_clipfrac"] == vm["actor/pg_clipfrac"]
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((1.2 + 1.2 + 0.9) / 3)
    assert grad[0, 1] == 0.0


def test_bypass_reinforce_uses_is_weights_against_the_current_log_probs():
    rollout = t([[L(.5), L(.5)]])
    lp = t([[L(.6), L(.2)]])
    adv = t([[1.0, -1.0]])
    c = bypass_cfg(rollout_is="token", rollout_is_threshold=2.0, loss_type="reinforce")
    loss, m, grad = run("bypass_mode", rollout, lp, adv, config=c)
    w = [1.2, 0.4]
    assert loss == pytest.approx((-1 * L(.6) * w[0] + 1 * L(.2) * w[1]) / 2)
    assert m["actor/ppo_kl"] == pytest.approx((L(.5 / .6) + L(.5 / .2)) / 2)  # mean of rollout − lp
    assert set(m) >= {"rollout_corr/kl", "rollout_corr/chi2_seq", "rollout_corr/rollout_is_eff_sample_size"}
    assert torch.allclose(grad, t([[-1.2 / 2, 0.4 / 2]]))  # the weights are detached
    # no IS: plain −A·lp
    c = bypass_cfg(rollout_is=None, loss_type="reinforce")
    assert run("bypass_mode", rollout, lp, adv, config=c)[0] == pytest.approx((-L(.6) + L(.2)) / 2)


def test_bypass_errors():
    x = t([[-1.0]])
    with pytest.raises(ValueError, match="loss_type"):
        run("bypass_mode", x, x, x, config=bypass_cfg(loss_type="ppo"))
    with pytest.raises(ValueError, match="valid token"):
        run("bypass_mode", x, x, x, t([[0.0]]), config=bypass_cfg())
    c = cfg()
    c.policy_loss.rollout_correction = None
    with pytest.raises(ValueError, match="rollout_correction"):
        run("bypass_mode", x, x, x, config=c)


# ------------------------------------------------------------------------------------------------ estimators


def test_rloo_vectorized_singletons_get_zero_but_rloo_keeps_the_score():
    rewards, mask = t([[1.0], [3.0], [5.0]]), torch.ones(3, 1)
    index = ["a", "a", "b"]
    loop = A.compute_advantage("rloo", rewards, mask, index=index)[0]
    vec = A.compute_advantage("rloo_vectorized", rewards, mask, index=index)[0]
    assert loop[:, 0].tolist() == [-2.0, 2.0, 5.0]
    assert vec[:, 0].tolist() == [-2.0, 2.0, 0.0]


def test_grpo_vectorized_matches_grpo_to_float32_precision():
    g = torch.Generator().manual_seed(1)
    rewards, mask = torch.rand(9, 4, generator=g), torch.ones(9, 4)
    index = [0, 0, 0, 1, 1, 2, 2, 2, 3]  # group 3 is a singleton: s/(1+1e-6)
    for norm in (True, False):
        loop = A.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)[0]
        vec = A.compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)[0]
        assert torch.allclose(loop, vec, atol=1e-5) and not torch.equal(loop, vec)  # float32 statistics
    # the dispatcher does not pass norm_adv_by_std_in_grpo to grpo_vectorized (verl): it stays True
    assert torch.equal(A.compute_advantage("grpo_vectorized", rewards, mask, index=index,
                                           norm_adv_by_std_in_grpo=False)[0],
                       A.compute_grpo_vectorized_outcome_advantage(rewards, mask, index)[0])


def test_gdpo_normalises_each_component_then_whitens():
    mask = torch.ones(4, 2)
    index = ["a", "a", "b", "b"]
    comps = {"fmt": np.array([1.0, 0.0, 1.0, 1.0]), "acc": np.array([0.0, 0.0, 1.0, 0.0])}
    config = types.SimpleNamespace(gdpo_reward_keys=["fmt", "acc"], gdpo_reward_weights=None)
    adv, ret = A.compute_advantage("gdpo", torch.zeros(4, 2), mask, index=index, config=config,
                                   non_tensor_batch=comps)
    a = 0.5 ** 0.5 / (0.5 ** 0.5 + 1e-6)  # (1 − 0.5)/(std + ε) with the unbiased std of {0, 1}
    summed = torch.tensor([a, -a, a, -a])  # fmt decides group a, acc decides group b
    var = (summed.repeat_interleave(2) ** 2).sum() / 7  # unbiased over the 8 tokens, mean 0
    assert torch.allclose(adv[:, 0], summed / torch.sqrt(var + 1e-8), atol=1e-6)
    assert torch.equal(adv, ret)
    config.gdpo_reward_weights = [2.0, 0.0]  # only fmt: group b is all equal in fmt → 0
    adv, _ = A.compute_advantage("gdpo", torch.zeros(4, 2), mask, index=index, config=config,
                                 non_tensor_batch=comps)
    assert adv[2:].abs().max() == 0 and adv[0, 0] > 0
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        A.compute_advantage("gdpo", torch.zeros(4, 2), mask, index=index, config=types.SimpleNamespace())
    with pytest.raises(ValueError, match="'acc' not found"):
        A.compute_advantage("gdpo", torch.zeros(4, 2), mask, index=index, config=config,
                            non_tensor_batch={"fmt": comps["fmt"]})


def otb(name, rewards, mask, index, **kw):
    old = torch.full_like(rewards, L(.5))  # π_t = 0.5 and Σπ² = 0.5 → w_t = 1 − 1 + 0.5 = 0.5
    return A.compute_advantage(name, rewards, mask, index=index, sum_pi_squared=torch.full_like(rewards, 0.5),
                               old_log_probs=old, **kw)


def test_optimal_token_baseline_hand_case():
    rewards, mask = t([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0]]), torch.ones(3, 2)
    adv, ret = otb("optimal_token_baseline", rewards, mask, ["g", "g", "single"])
    # W = [0.5, 1.0] in both rows → B_t = Σ G·W / Σ W = [0.5, 0.5]; the singleton keeps A = G
    assert torch.allclose(adv, t([[0.5, 0.5], [-0.5, -0.5], [3.0, 3.0]]), atol=1e-7)
    assert torch.equal(ret, t([[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]))
    # IS weights scale w by ρ̄²: row 1 weighs 4× as much
    adv, _ = otb("optimal_token_baseline", rewards[:2], mask[:2], ["g", "g"],
                 rollout_is_weights=t([[1.0, 1.0], [2.0, 2.0]]))
    assert torch.allclose(adv[0], torch.full((2,), 0.8), atol=1e-7)  # B = 1·1/(1 + 4)
    # zero tail: row 0 is the only one reaching t = 1 → its baseline there is 0 → A = G
    adv, _ = otb("optimal_token_baseline", rewards[:2], t([[1.0, 1.0], [1.0, 0.0]]), ["g", "g"])
    assert adv[0, 1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="calculate_sum_pi_squared"):
        A.compute_advantage("optimal_token_baseline", rewards, mask, index=[0, 0, 1])


def test_tir_optimal_token_baseline_aligns_valid_tokens():
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = t([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # row 0 has a tool observation at t = 1
    tir, ret = otb("tir_optimal_token_baseline", rewards, mask, ["g", "g"])
    col, _ = otb("optimal_token_baseline", rewards, mask, ["g", "g"])
    # k-th valid token: G = [1, 1] and [2, 2], W = [0.5, 1] for both → B = [1.5, 1.5]
    assert torch.allclose(tir, t([[-0.5, 0.0, -0.5], [0.5, 0.5, 0.0]]), atol=1e-7)
    # by column: t = 1 and t = 2 each have a single valid row → B = its own G → A = 0
    assert torch.allclose(col, t([[-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]), atol=1e-7)
    assert torch.equal(ret, t([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))


def test_sum_pi_squared_from_logits():
    logits = t([[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    got = A.calculate_sum_pi_squared_from_logits(logits)
    assert got[0] == pytest.approx(0.25) and got[1] == pytest.approx(1.0)
    assert got[2] == pytest.approx(float((torch.softmax(logits[2], -1) ** 2).sum()))
    scaled = A.calculate_sum_pi_squared_from_logits(logits, temperature=2.0)
    assert torch.allclose(scaled, A.calculate_sum_pi_squared_from_logits(logits / 2))


# -------------------------------------------------------------------------------------------------- config


def test_policy_loss_config_defaults_and_dicts():
    pl = ActorConfig().policy_loss
    assert (pl.clip_cov_ratio, pl.clip_cov_lb, pl.clip_cov_ub, pl.kl_cov_ratio, pl.ppo_kl_coef, pl.dro_beta) == (
        2e-4, 1.0, 5.0, 2e-4, 0.1, None)
    rc = pl.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.loss_type, rc.rollout_rs) == ("sequence", 2.0, "ppo_clip", None)
    assert ActorConfig().calculate_sum_pi_squared is False
    c = ActorConfig(policy_loss={"loss_mode": "bypass_mode", "rollout_correction": {"loss_type": "reinforce"}})
    assert isinstance(c.policy_loss.rollout_correction, RolloutCorrectionConfig)
    assert c.policy_loss.rollout_correction.loss_type == "reinforce"


def load(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNotice)
        return load_config("grpo_tiny", list(overrides))


PL = "actor_rollout_ref.actor.policy_loss"


def test_validation_accepts_the_new_modes_and_checks_their_knobs():
    for mode in VERL_LOSSES:
        extra = [f"{PL}.dro_beta=0.1"] if mode == "dro" else []
        assert load(f"{PL}.loss_mode={mode}", *extra).actor_rollout_ref.actor.policy_loss.loss_mode == mode
    with pytest.raises(ConfigError, match="dro_beta"):
        load(f"{PL}.loss_mode=dro")
    with pytest.raises(ConfigError, match="clip_cov_lb"):
        load(f"{PL}.loss_mode=clip_cov", f"{PL}.clip_cov_lb=6.0")
    with pytest.raises(ConfigError, match="loss_type"):
        load(f"{PL}.loss_mode=bypass_mode", f"{PL}.rollout_correction.loss_type=ppo")
    with pytest.raises(ConfigError, match="calculate_sum_pi_squared"):
        load("algorithm.adv_estimator=optimal_token_baseline")
    cfg_ = load("algorithm.adv_estimator=tir_optimal_token_baseline",
                "actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    assert cfg_.algorithm.adv_estimator == "tir_optimal_token_baseline"
    with pytest.raises(ConfigError, match="gdpo_reward_keys is empty"):
        load("algorithm.adv_estimator=gdpo")
    with pytest.raises(ConfigError, match="one weight per key"):
        load("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[fmt,acc]",
             "algorithm.gdpo_reward_weights=[1]")
    assert load("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[fmt,acc]").algorithm.gdpo_reward_keys == [
        "fmt", "acc"]
    with pytest.warns(ConfigNotice, match="geo_mean"):
        load_config("grpo_tiny", [f"{PL}.loss_mode=geo_mean"])
    with pytest.warns(ConfigNotice, match="clip_ratio_c=3.0"):
        load_config("grpo_tiny", [f"{PL}.loss_mode=dppo_tv"])
