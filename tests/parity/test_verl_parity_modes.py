"""Parity with verl 0.9.1 of the loss modes and advantage estimators beyond vanilla/GRPO: values, metrics and
gradients to 1e-6 on random inputs, edge cases included.

Skipped unless ``verl`` is importable; run it from verl's own environment (see test_verl_parity.py):

    PYTHONPATH=. tmp/verlenv/bin/python -m pytest tests/parity -q
"""
import warnings

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl")
warnings.filterwarnings("ignore")

import verl.trainer.ppo.core_algos as V  # noqa: E402
import verl.utils.torch_functional as VF  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig as VRolloutCorrectionConfig  # noqa: E402
from verl.workers.config import ActorConfig as VActorConfig  # noqa: E402
from verl.workers.config import PolicyLossConfig as VPolicyLossConfig  # noqa: E402

import ppolab.algos as P  # noqa: E402
from ppolab.config import LOSS_AGG_MODES, ActorConfig  # noqa: E402
from ppolab.config.actor import RolloutCorrectionConfig, PolicyLossConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("float64_by_default")  # tests/conftest.py

TOL = 1e-6
NEW_LOSSES = ["dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "geo_mean", "dro"]
GLOBAL_INFOS = [{}, {"dp_size": 2, "batch_num_tokens": 41, "global_batch_size": 24, "loss_scale_factor": 16}]


def batch(seed, bs=12, width=9, probs=True):
    """Random (bs, T) tensors with a padding row, a hole in one response, mixed-sign token advantages;
    ``probs`` keeps lp ≤ 0 (real log-probs) apart from one token at old + 25 (the ±20 clamp)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (bs,), generator=g)
    lengths[-1] = 0
    mask = (torch.arange(width)[None] < lengths[:, None]).double()
    mask[0, 1] = 0.0
    old = -torch.rand(bs, width, generator=g) * 3 - 0.01
    lp = old + 0.5 * torch.randn(bs, width, generator=g)
    if probs:
        lp = lp.clamp(max=-1e-4)
    lp[1, 0] = old[1, 0] + 25.0
    adv = (torch.randn(bs, 1, generator=g) + 0.3 * torch.randn(bs, width, generator=g)) * mask
    adv[2, :2] = 0.0  # A = 0 tokens
    return dict(old=old, lp=lp, mask=mask, adv=adv, g=g)


def configs(mode, info, clip_ratio_c=3.0, **policy_loss):
    kw = dict(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.28, clip_ratio_c=clip_ratio_c,
              loss_agg_mode=mode)
    ours = ActorConfig(**kw, policy_loss=PolicyLossConfig(**{k: v for k, v in policy_loss.items()
                                                             if k != "rollout_correction"}),
                       global_batch_info=dict(info))
    their_pl = dict(policy_loss)
    if "rollout_correction" in policy_loss:
        ours.policy_loss.rollout_correction = RolloutCorrectionConfig(**policy_loss["rollout_correction"])
        their_pl["rollout_correction"] = VRolloutCorrectionConfig(**policy_loss["rollout_correction"])
    theirs = VActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                          policy_loss=VPolicyLossConfig(**their_pl), **kw)
    theirs.global_batch_info.update(info)
    return ours, theirs


def run_both(name, b, ours_cfg, their_cfg, mode, w=None, seed=None, generator=None):
    lp1, lp2 = b["lp"].clone().requires_grad_(), b["lp"].clone().requires_grad_()
    kwargs = {"generator": generator} if generator is not None else {}
    if seed is not None:
        torch.manual_seed(seed)
    ours, om = P.get_policy_loss_fn(name)(b["old"], lp1, b["adv"], b["mask"], mode, ours_cfg, w, **kwargs)
    if seed is not None:
        torch.manual_seed(seed)
    theirs, tm = V.get_policy_loss_fn(name)(b["old"], lp2, b["adv"], b["mask"], mode, their_cfg, w)
    assert ours.item() == pytest.approx(theirs.item(), abs=TOL, nan_ok=True)
    assert om.keys() == tm.keys()
    for k in om:
        assert om[k] == pytest.approx(float(tm[k]), abs=TOL, nan_ok=True), k
    ours.backward()
    theirs.backward()
    assert torch.allclose(lp1.grad, lp2.grad, atol=TOL, equal_nan=True)
    return ours, om


def test_registries_equal_verls():
    assert sorted(P.POLICY_LOSS_REGISTRY) == sorted(V.POLICY_LOSS_REGISTRY)
    assert sorted(P.ADV_ESTIMATOR_REGISTRY) == sorted(V.ADV_ESTIMATOR_REGISTRY)


def test_policy_loss_config_defaults_equal_verls():
    ours, theirs = PolicyLossConfig(), VPolicyLossConfig()
    for k in ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta"):
        assert getattr(ours, k) == getattr(theirs, k), k
    for k in ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
              "rollout_rs_threshold", "bypass_mode", "loss_type"):
        assert getattr(ours.rollout_correction, k) == getattr(theirs.rollout_correction, k), k
    assert ActorConfig().calculate_sum_pi_squared == VActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1).calculate_sum_pi_squared


@pytest.mark.parametrize("name", NEW_LOSSES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("info", range(len(GLOBAL_INFOS)))
@pytest.mark.parametrize("with_is", [False, True])
def test_new_policy_losses(name, mode, info, with_is):
    b = batch(seed=hash((name, mode, info, with_is)) % 1000)
    extra = {"dro_beta": 0.3} if name == "dro" else {}
    ours_cfg, their_cfg = configs(mode, GLOBAL_INFOS[info], **extra)
    w = torch.rand(b["lp"].shape, generator=b["g"]) * 2 if with_is else None
    run_both(name, b, ours_cfg, their_cfg, mode, w, seed=1234 if name == "clip_cov" else None)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("clip_ratio_c", [1.5, 3.0, 20.0])
@pytest.mark.parametrize("probs", [True, False])
def test_dppo_truncation_and_unbounded_log_probs(name, clip_ratio_c, probs):
    b = batch(seed=31, probs=probs)  # probs=False: p > 1 makes the binary KL NaN, which must behave as verl's
    ours_cfg, their_cfg = configs("token-mean", {}, clip_ratio_c=clip_ratio_c)
    run_both(name, b, ours_cfg, their_cfg, "token-mean")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio, lb, ub", [(0.0002, 1.0, 5.0), (0.2, 0.05, 5.0), (0.5, -1.0, 2.0), (0.1, 4.0, 4.5)])
def test_clip_cov_selection_with_seeded_generator(seed, ratio, lb, ub):
    b = batch(seed=40 + seed)
    b["adv"] = b["adv"] * 3
    ours_cfg, their_cfg = configs("token-mean", {}, clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub)
    # verl draws from the global RNG; ours from an explicit generator with the same seed gives the same draw
    run_both("clip_cov", b, ours_cfg, their_cfg, "token-mean", seed=seed,
             generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("ratio, coef", [(0.0002, 0.1), (0.1, 0.1), (0.3, None), (0.999, 2.0)])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_kl_cov_top_k(ratio, coef, mode):
    b = batch(seed=50)
    ours_cfg, their_cfg = configs(mode, {}, kl_cov_ratio=ratio, ppo_kl_coef=coef)
    run_both("kl_cov", b, ours_cfg, their_cfg, mode)


def test_geo_mean_ignores_agg_mode_and_global_info():
    b = batch(seed=60)
    values = set()
    for mode in LOSS_AGG_MODES:
        for info in GLOBAL_INFOS:
            ours_cfg, their_cfg = configs(mode, info)
            loss, _ = run_both("geo_mean", b, ours_cfg, their_cfg, mode)
            values.add(round(loss.item(), 12))
    assert len(values) == 1


def test_dro_without_beta_raises_like_verl():
    b = batch(seed=61)
    for beta in (None, 0.0, -1.0):
        ours_cfg, their_cfg = configs("token-mean", {}, dro_beta=beta)
        with pytest.raises(ValueError, match="dro_beta"):
            V.compute_policy_loss_dro(b["old"], b["lp"], b["adv"], b["mask"], "token-mean", their_cfg)
        with pytest.raises(ValueError, match="dro_beta"):
            P.compute_policy_loss_dro(b["old"], b["lp"], b["adv"], b["mask"], "token-mean", ours_cfg)


BYPASS_CASES = [
    dict(),  # verl's dataclass default: sequence IS, threshold 2.0
    dict(rollout_is=None),
    dict(rollout_is="token", rollout_is_threshold=1.5),
    dict(rollout_is="token", rollout_is_threshold="0.8_1.25"),
    dict(rollout_is="sequence", rollout_is_threshold="0.5_3.0", rollout_is_batch_normalize=True),
    dict(rollout_is="token", rollout_is_batch_normalize=True, rollout_rs="token_k1", rollout_rs_threshold=1.3),
    dict(rollout_is="sequence", rollout_rs="seq_mean_k3,token_k2", rollout_rs_threshold="0.05,0.1"),
    dict(rollout_is=None, rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),
]


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("case", range(len(BYPASS_CASES)))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_bypass_mode(loss_type, case, mode):
    b = batch(seed=70 + case)
    b["lp"] = b["old"] + 0.15 * torch.randn(b["old"].shape, generator=b["g"])  # a realistic rollout/train gap
    rc = dict(BYPASS_CASES[case], loss_type=loss_type)
    ours_cfg, their_cfg = configs(mode, GLOBAL_INFOS[1], rollout_correction=rc)
    ignored = torch.full_like(b["lp"], 7.0)  # bypass recomputes the weights: the argument must be ignored
    _, metrics = run_both("bypass_mode", b, ours_cfg, their_cfg, mode, w=ignored)
    assert "actor/ppo_kl" in metrics and "rollout_corr/kl" in metrics


def test_bypass_mode_errors_like_verl():
    b = batch(seed=80)
    ours_cfg, their_cfg = configs("token-mean", {}, rollout_correction=dict(loss_type="bogus"))
    for fn, cfg in ((V.compute_policy_loss_bypass_mode, their_cfg), (P.compute_policy_loss_bypass_mode, ours_cfg)):
        with pytest.raises(ValueError, match="loss_type"):
            fn(b["old"], b["lp"], b["adv"], b["mask"], "token-mean", cfg)
    ours_cfg, their_cfg = configs("token-mean", {})
    for fn, cfg in ((V.compute_policy_loss_bypass_mode, their_cfg), (P.compute_policy_loss_bypass_mode, ours_cfg)):
        with pytest.raises(ValueError, match="valid token"):
            fn(b["old"], b["lp"], b["adv"], torch.zeros_like(b["mask"]), "token-mean", cfg)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_reinforce_helper(mode):
    b = batch(seed=81)
    ours_cfg, their_cfg = configs(mode, GLOBAL_INFOS[1])
    w = torch.rand(b["lp"].shape, generator=b["g"])
    for weights in (None, w):
        ours = P.compute_policy_loss_reinforce(b["old"], b["lp"], b["adv"], b["mask"], mode, ours_cfg, weights)
        theirs = V.compute_policy_loss_reinforce(b["old"], b["lp"], b["adv"], b["mask"], mode, their_cfg, weights)
        assert ours[0].item() == pytest.approx(theirs[0].item(), abs=TOL)
        assert ours[1] == pytest.approx(theirs[1], abs=TOL)


# ------------------------------------------------------------------------------------------ advantages


def adv_batch(seed, bs=14, width=8):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (bs,), generator=g)
    lengths[3] = width  # a unique longest trajectory in group 0 (OTB zero tail)
    lengths[-1] = 0  # a padding row, alone in its group
    mask = (torch.arange(width)[None] < lengths[:, None]).double()
    mask[4, 1:3] = 0.0  # a tool-observation hole
    scores = torch.randint(0, 3, (bs,), generator=g).double() + 0.25 * torch.rand(bs, generator=g)
    rewards = torch.zeros(bs, width)
    rewards[torch.arange(bs), (lengths - 1).clamp(min=0)] = scores
    rewards[5, 0] += 0.5  # a process reward
    # groups: 0 ×5, 1 ×4, 2 ×3 with identical scores, 3 singleton, pad singleton
    uid = np.array(["a"] * 5 + ["b"] * 4 + ["c"] * 3 + ["d", "pad"], dtype=object)
    rewards[9:12] = 0.0
    rewards[9:12, 0] = 1.0
    old = -torch.rand(bs, width, generator=g) * 3
    logits = torch.randn(bs, width, 11, generator=g) * 2
    sum_pi2 = VF.calculate_sum_pi_squared_from_logits(logits)
    ris = torch.rand(bs, width, generator=g) * 2 * mask
    fmt = np.array(torch.rand(bs, generator=g).tolist())
    acc = np.array(torch.randint(0, 2, (bs,), generator=g).tolist(), dtype=np.float64)
    return dict(rewards=rewards, mask=mask, uid=uid, old=old, sum_pi2=sum_pi2, ris=ris, lengths=lengths,
                values=torch.randn(bs, width, generator=g), baselines=torch.rand(bs, generator=g),
                components={"format_reward": fmt, "accuracy_reward": acc})


def verl_data(b, with_is, with_baselines):
    """The two halves of the DataProto verl's trainer hands compute_advantage: tensors and per-row values (uid and the
    reward components, as verl merges reward_extra_info into non_tensor_batch)."""
    bs, width = b["mask"].shape
    prompt_len = 3
    attention = torch.cat([torch.ones(bs, prompt_len), (torch.arange(width)[None] < b["lengths"][:, None]).double()],
                          dim=1).long()
    tensors = {"token_level_rewards": b["rewards"], "response_mask": b["mask"], "values": b["values"],
               "sum_pi_squared": b["sum_pi2"], "old_log_probs": b["old"], "prompts": torch.zeros(bs, prompt_len),
               "attention_mask": attention}
    if with_is:
        tensors["rollout_is_weights"] = b["ris"]
    if with_baselines:
        tensors["reward_baselines"] = b["baselines"]
    return tensors, {"uid": b["uid"], **b["components"]}


def verl_compute_advantage(name, b, cfg, with_is, with_baselines, norm):
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    tensors, non_tensors = verl_data(b, with_is, with_baselines)
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    out = compute_advantage(data, name, gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=norm, config=cfg)
    return out.batch["advantages"], out.batch["returns"]


@pytest.mark.parametrize("name", sorted(V.ADV_ESTIMATOR_REGISTRY))
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("with_is", [False, True])
def test_every_estimator_through_compute_advantage(name, norm, with_is):
    b = adv_batch(seed=90 + int(norm) + 2 * int(with_is))
    if name == "grpo_passk":  # needs ≥ 2 samples per group
        keep = [i for i, u in enumerate(b["uid"]) if u not in ("d", "pad")]
        b = {k: (v[keep] if isinstance(v, (torch.Tensor, np.ndarray)) else v) for k, v in b.items()}
        b["components"] = {k: v[keep] for k, v in b["components"].items()}
    kw = dict(gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=norm)
    if name == "gdpo":
        kw.update(gdpo_reward_keys=["format_reward", "accuracy_reward"], gdpo_reward_weights=[0.3, 1.7])
    cfg = AlgoConfig(**kw)
    with_baselines = name == "remax"
    if name == "gae" and not norm:
        pytest.skip("gae does not read norm_adv_by_std_in_grpo")
    theirs = verl_compute_advantage(name, b, cfg, with_is, with_baselines, norm)
    tensors, non_tensors = verl_data(b, with_is, with_baselines)
    # the trainer's call (the same DataProto halves verl's trainer reads) and the labs' flat call
    ours_data = P.compute_advantage_from_data(tensors, non_tensors, name, gamma=0.9, lam=0.8,
                                              norm_adv_by_std_in_grpo=norm, config=cfg)
    ours = P.compute_advantage(name, b["rewards"], b["mask"], index=b["uid"], values=b["values"],
                               reward_baselines=b["baselines"] if with_baselines else None, gamma=0.9, lam=0.8,
                               norm_adv_by_std_in_grpo=norm, config=cfg, non_tensor_batch=b["components"],
                               sum_pi_squared=b["sum_pi2"], old_log_probs=b["old"],
                               rollout_is_weights=b["ris"] if with_is else None)
    for mine in (ours_data, ours):
        assert torch.allclose(mine[0], theirs[0], atol=TOL), (mine[0] - theirs[0]).abs().max()
        assert torch.allclose(mine[1], theirs[1], atol=TOL)
        assert mine[0].dtype == theirs[0].dtype


def test_gdpo_fallback_and_default_weights():
    b = adv_batch(seed=95)
    tensors, non_tensors = verl_data(b, False, False)
    keyed = AlgoConfig(gdpo_reward_keys=["accuracy_reward", "format_reward"])
    # (config, non_tensor_batch, batch): verl falls back to token_level_rewards unless all three are given
    for args in ((None, None, None), (keyed, None, None), (keyed, non_tensors, None), (None, non_tensors, tensors),
                 (keyed, non_tensors, tensors)):
        kw = dict(config=args[0], non_tensor_batch=args[1], batch=args[2])
        ours = P.compute_gdpo_outcome_advantage(b["rewards"], b["mask"], b["uid"], **kw)
        theirs = V.compute_gdpo_outcome_advantage(b["rewards"], b["mask"], b["uid"], **kw)
        assert torch.allclose(ours[0], theirs[0], atol=TOL)
    theirs = verl_compute_advantage("gdpo", b, keyed, False, False, True)
    ours = P.compute_advantage("gdpo", b["rewards"], b["mask"], index=b["uid"], config=keyed,
                               non_tensor_batch=b["components"])
    assert torch.allclose(ours[0], theirs[0], atol=TOL)


def test_gdpo_called_as_verls_trainer_calls_it():
    """The keyword arguments verl's ray_trainer.compute_advantage builds for gdpo, passed to both functions: ppolab
    reads the components from non_tensor_batch and their positions from batch["attention_mask"], as verl does —
    and that is not GRPO on the summed reward."""
    b = adv_batch(seed=97)
    tensors, non_tensors = verl_data(b, False, False)
    cfg = AlgoConfig(gdpo_reward_keys=["format_reward", "accuracy_reward"], gdpo_reward_weights=[0.3, 1.7])
    kw = dict(token_level_rewards=b["rewards"], response_mask=b["mask"], config=cfg, index=non_tensors["uid"],
              non_tensor_batch=non_tensors, batch=tensors)
    ours, theirs = P.compute_gdpo_outcome_advantage(**kw), V.compute_gdpo_outcome_advantage(**kw)
    assert torch.allclose(ours[0], theirs[0], atol=TOL) and torch.allclose(ours[1], theirs[1], atol=TOL)
    fallback = V.compute_gdpo_outcome_advantage(b["rewards"], b["mask"], b["uid"], config=cfg)[0]
    assert (theirs[0] - fallback).abs().max() > 0.1


def _param_table(fn):
    import inspect

    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", sorted(V.ADV_ESTIMATOR_REGISTRY))
def test_every_registered_estimator_has_verls_signature(name):
    """Names, order, defaults and **kwargs (or its absence) as in verl: the trainer's keywords land where verl's
    land, and one an estimator does not declare raises TypeError in both."""
    assert _param_table(P.ADV_ESTIMATOR_REGISTRY[name]) == _param_table(V.ADV_ESTIMATOR_REGISTRY[name])


@pytest.mark.parametrize("name, unused", [
    ("rloo", {"epsilon": 0.3}), ("rloo_vectorized", {"epsilon": 0.3}), ("opo", {"epsilon": 0.3}),
    ("reinforce_plus_plus_baseline", {"epsilon": 0.3}), ("gpg", {"epsilon": 0.3}), ("gpg", {"alpha": 7.0}),
    ("grpo_passk", {"norm_adv_by_std_in_grpo": False}),
    ("optimal_token_baseline", {"config": AlgoConfig(gamma=0.5)}),
    ("tir_optimal_token_baseline", {"config": AlgoConfig(gamma=0.5)}),
])
def test_arguments_ppolab_does_not_read_verl_does_not_read_either(name, unused):
    b = adv_batch(seed=98)
    if name == "grpo_passk":
        keep = [i for i, u in enumerate(b["uid"]) if u not in ("d", "pad")]
        b = {k: (v[keep] if isinstance(v, (torch.Tensor, np.ndarray)) else v) for k, v in b.items()}
    kw = dict(token_level_rewards=b["rewards"], response_mask=b["mask"], index=b["uid"])
    if name.endswith("optimal_token_baseline"):
        kw.update(old_log_probs=b["old"], sum_pi_squared=b["sum_pi2"])
    else:
        kw["config"] = AlgoConfig(gamma=0.9)
    for lib in (P, V):
        fn = lib.ADV_ESTIMATOR_REGISTRY[name]
        base, changed = fn(**kw), fn(**{**kw, **unused})
        assert torch.equal(base[0], changed[0]) and torch.equal(base[1], changed[1]), (lib.__name__, name, unused)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_otb_direct(name, zero_tail, seed):
    b = adv_batch(seed=100 + seed)
    kw = dict(token_level_rewards=b["rewards"], response_mask=b["mask"], index=b["uid"], old_log_probs=b["old"],
              sum_pi_squared=b["sum_pi2"], rollout_is_weights=b["ris"], handle_zero_tail=zero_tail)
    ours, theirs = P.get_adv_estimator_fn(name)(**kw), V.get_adv_estimator_fn(name)(**kw)
    assert torch.allclose(ours[0], theirs[0], atol=TOL)
    assert torch.allclose(ours[1], theirs[1], atol=TOL)


@pytest.mark.parametrize("seed", range(5))
def test_vectorized_with_integer_and_string_ids(seed):
    b = adv_batch(seed=110 + seed)
    for index in (b["uid"], np.array([hash(u) % 97 for u in b["uid"]]), [str(i % 4) for i in range(14)]):
        for name in ("grpo_vectorized", "rloo_vectorized"):
            for norm in (True, False):
                kw = dict(token_level_rewards=b["rewards"], response_mask=b["mask"], index=index)
                if name == "grpo_vectorized":
                    kw["norm_adv_by_std_in_grpo"] = norm
                ours, theirs = P.get_adv_estimator_fn(name)(**kw), V.get_adv_estimator_fn(name)(**kw)
                assert torch.allclose(ours[0], theirs[0], atol=TOL)


def test_sum_pi_squared():
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64):
        logits = (torch.randn(3, 5, 17, generator=g) * 4).to(dtype)
        assert torch.allclose(P.calculate_sum_pi_squared_from_logits(logits),
                              VF.calculate_sum_pi_squared_from_logits(logits), atol=TOL)
        t = torch.tensor([0.7, 1.0, 1.3], dtype=dtype)
        assert torch.allclose(P.calculate_sum_pi_squared_from_logits(logits, t),
                              VF.calculate_sum_pi_squared_from_logits(logits / t[:, None, None]), atol=TOL)


def test_the_critic_budget_key_is_verls_with_its_default_and_outside_its_yaml():
    """critic.ppo_infer_max_token_len_per_gpu: verl's CriticConfig field (default 32768, what applies when the YAML
    does not name it — hence '+critic.…=' on verl's command line), which V1 writes into both token budgets of the
    critic engine (trainer_base.py)."""
    import dataclasses
    from pathlib import Path

    from verl.workers.config import CriticConfig as VCriticConfig

    from ppolab.config import PPOConfig

    default = {f.name: f.default for f in dataclasses.fields(VCriticConfig)}["ppo_infer_max_token_len_per_gpu"]
    assert default == PPOConfig().critic.ppo_infer_max_token_len_per_gpu == 32768
    yaml = Path(verl.__file__).parent / "trainer" / "config" / "critic" / "critic.yaml"
    assert "ppo_infer_max_token_len_per_gpu" not in yaml.read_text()
    src = (Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py").read_text()  # imports ray
    for engine_key in ("infer_max_token_len_per_gpu", "max_token_len_per_gpu"):
        assert f"critic_cfg.engine.{engine_key} = critic_cfg.ppo_infer_max_token_len_per_gpu" in src
