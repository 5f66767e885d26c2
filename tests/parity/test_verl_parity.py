"""Parity of ppolab.algos with verl itself (0.9.1), on random inputs, to 1e-6.

Skipped unless ``verl`` is importable. verl cannot share the project's environment (it pulls ray and
pins its own stack), so it runs from a separate one — ``.ci/run``'s verl phase:

    python3 -m venv .venv-verl && .venv-verl/bin/pip install torch==2.13.0 -e ".[verl,dev]"
    .venv-verl/bin/python -m pytest -n 0 tests/parity
"""
import warnings

import pytest
import torch

verl = pytest.importorskip("verl")
warnings.filterwarnings("ignore")

import verl.trainer.ppo.core_algos as V  # noqa: E402
import verl.utils.torch_functional as VF  # noqa: E402
from verl.workers.config import ActorConfig as VActorConfig  # noqa: E402

import ppolab.algos as P  # noqa: E402
from ppolab.config import LOSS_AGG_MODES, ActorConfig  # noqa: E402



pytestmark = pytest.mark.usefixtures("float64_by_default")  # tests/conftest.py

TOL = 1e-6


def batch(seed, bs=12, width=9, group=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (bs,), generator=g)
    lengths[-1] = 0  # a padding row
    mask = (torch.arange(width)[None] < lengths[:, None]).double()
    old = -torch.rand(bs, width, generator=g) * 4
    lp = old + 0.6 * torch.randn(bs, width, generator=g)
    lp[0, 0] = old[0, 0] + 25.0  # exercise the ±20 clamp
    ref = old + 0.3 * torch.randn(bs, width, generator=g)
    scores = (torch.rand(bs, generator=g) > 0.5).double()
    rewards = torch.zeros(bs, width)
    rewards[torch.arange(bs), (lengths - 1).clamp(min=0)] = scores
    adv = torch.randn(bs, 1, generator=g).expand(bs, width).contiguous() * mask
    values = torch.randn(bs, width, generator=g)
    index = [i // group for i in range(bs)]
    return dict(old=old, lp=lp, ref=ref, mask=mask, rewards=rewards, adv=adv, values=values, index=index)


def configs(mode, global_info):
    kw = dict(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    ours = ActorConfig(**kw, global_batch_info=dict(global_info))
    theirs = VActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)
    theirs.global_batch_info.update(global_info)
    return ours, theirs


GLOBAL_INFOS = [{}, {"dp_size": 2, "batch_num_tokens": 41, "global_batch_size": 24, "loss_scale_factor": 16}]


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg", "sapo"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("info", range(len(GLOBAL_INFOS)))
@pytest.mark.parametrize("with_is", [False, True])
def test_policy_losses(name, mode, info, with_is):
    b = batch(seed=hash((name, mode, info)) % 1000)
    ours_cfg, their_cfg = configs(mode, GLOBAL_INFOS[info])
    w = torch.rand_like(b["lp"]) * 2 if with_is else None
    lp1, lp2 = b["lp"].clone().requires_grad_(), b["lp"].clone().requires_grad_()
    ours, om = P.get_policy_loss_fn(name)(b["old"], lp1, b["adv"], b["mask"], mode, ours_cfg, w)
    theirs, tm = V.get_policy_loss_fn(name)(b["old"], lp2, b["adv"], b["mask"], mode, their_cfg, w)
    assert ours.item() == pytest.approx(theirs.item(), abs=TOL)
    assert om.keys() == tm.keys()
    for k in om:
        assert om[k] == pytest.approx(float(tm[k]), abs=TOL), k
    ours.backward()
    theirs.backward()
    assert torch.allclose(lp1.grad, lp2.grad, atol=TOL)


def test_registry_has_no_name_verl_lacks():
    assert set(P.POLICY_LOSS_REGISTRY) <= set(V.POLICY_LOSS_REGISTRY)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("info", range(len(GLOBAL_INFOS)))
def test_agg_loss(mode, info):
    b = batch(seed=3)
    x = torch.randn_like(b["lp"])
    assert P.agg_loss(x, b["mask"], mode, **GLOBAL_INFOS[info]).item() == pytest.approx(
        V.agg_loss(x, b["mask"], mode, **GLOBAL_INFOS[info]).item(), abs=TOL)


@pytest.mark.parametrize("name", list(P.KL_PENALTY_TYPES))
def test_kl_penalty_value_and_gradient(name):
    b = batch(seed=5)
    lp1, lp2 = b["lp"].clone().requires_grad_(), b["lp"].clone().requires_grad_()
    ours, theirs = P.kl_penalty(lp1, b["ref"], name), V.kl_penalty(lp2, b["ref"], name)
    assert torch.allclose(ours, theirs, atol=TOL)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.allclose(lp1.grad, lp2.grad, atol=TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss(mode):
    b = batch(seed=9)
    vpreds = b["values"] + 0.5 * torch.randn_like(b["values"])
    returns = torch.randn_like(b["values"])
    info = GLOBAL_INFOS[1]
    ours = P.compute_value_loss(vpreds, returns, b["values"], b["mask"], 0.3, mode, **info)
    theirs = V.compute_value_loss(vpreds, returns, b["values"], b["mask"], 0.3, mode, **info)
    assert ours[0].item() == pytest.approx(theirs[0].item(), abs=TOL)
    assert ours[1].item() == pytest.approx(theirs[1].item(), abs=TOL)


def test_masked_helpers_and_logits_functions():
    b = batch(seed=11)
    x, m = b["lp"], b["mask"]
    assert torch.allclose(P.masked_mean(x, m), VF.masked_mean(x, m))
    assert torch.allclose(P.masked_mean(x, m, axis=-1), VF.masked_mean(x, m, axis=-1))
    assert torch.allclose(P.masked_var(x, m), VF.masked_var(x, m))
    assert torch.allclose(P.masked_whiten(x, m), VF.masked_whiten(x, m))
    logits = torch.randn(4, 6, 13, dtype=torch.float32)
    labels = torch.randint(0, 13, (4, 6))
    assert torch.allclose(P.entropy_from_logits(logits), VF.entropy_from_logits(logits), atol=TOL)
    assert torch.allclose(P.logprobs_from_logits(logits, labels), VF.logprobs_from_logits(logits, labels), atol=TOL)


# gdpo, the vectorized and the OTB estimators need the dispatcher's extra inputs: test_verl_parity_modes.py
@pytest.mark.parametrize("name", [n for n in P.ADV_ESTIMATOR_REGISTRY if n not in (
    "gdpo", "grpo_vectorized", "optimal_token_baseline", "tir_optimal_token_baseline")])
@pytest.mark.parametrize("norm", [True, False])
def test_advantage_estimators(name, norm):
    from verl.trainer.config import AlgoConfig

    b = batch(seed=13)
    mask = b["mask"].clone()
    mask[0, 1] = 0.0  # an observation-like hole inside a response
    cfg = AlgoConfig(gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=norm)
    index = __import__("numpy").array(b["index"])
    kwargs = dict(token_level_rewards=b["rewards"], response_mask=mask, config=cfg, index=index,
                  reward_baselines=torch.rand(mask.shape[0]))
    if name == "gae":
        theirs = V.compute_gae_advantage_return(b["rewards"], b["values"], mask, 0.9, 0.8)
    elif name == "grpo":
        theirs = V.compute_grpo_outcome_advantage(b["rewards"], mask, index, norm_adv_by_std_in_grpo=norm)
    else:
        theirs = V.get_adv_estimator_fn(name)(**kwargs)
    ours = P.compute_advantage(name, b["rewards"], mask, index=b["index"], values=b["values"],
                               reward_baselines=kwargs["reward_baselines"], gamma=0.9, lam=0.8,
                               norm_adv_by_std_in_grpo=norm, config=cfg)
    assert torch.allclose(ours[0], theirs[0], atol=TOL)
    assert torch.allclose(ours[1], theirs[1], atol=TOL)


def test_kl_controllers_and_apply_kl_penalty():
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty as v_apply

    b = batch(seed=17)
    ours_ctrl = P.AdaptiveKLController(0.05, target_kl=0.02, horizon=500)
    their_ctrl = V.AdaptiveKLController(0.05, target_kl=0.02, horizon=500)
    for step in range(3):
        data = DataProto.from_dict(tensors={
            "token_level_scores": b["rewards"], "old_log_probs": b["old"] + 0.1 * step, "ref_log_prob": b["ref"],
            "response_mask": b["mask"], "responses": torch.zeros_like(b["mask"]).long(),
            "attention_mask": torch.ones_like(b["mask"]).long()})
        data, their_metrics = v_apply(data, their_ctrl, kl_penalty="k3")
        ours, our_metrics = P.apply_kl_penalty(b["rewards"], b["old"] + 0.1 * step, b["ref"], b["mask"], ours_ctrl,
                                               "k3")
        assert torch.allclose(ours, data.batch["token_level_rewards"], atol=TOL)
        for k, v in our_metrics.items():
            assert v == pytest.approx(float(their_metrics[k]), abs=TOL), k
        assert ours_ctrl.value == pytest.approx(their_ctrl.value, abs=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 1.2, "0.5_1.5"])
def test_rollout_is_weights(level, threshold):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    b = batch(seed=19)
    rollout = b["old"] + 0.05 * torch.randn_like(b["old"])
    theirs, _ = compute_rollout_correction_weights(b["old"] - rollout, b["mask"], level, threshold)
    ours = P.rollout_is_weights(b["old"], rollout, b["mask"], level, threshold)
    assert torch.allclose(ours, theirs, atol=TOL)


@pytest.mark.parametrize("rs, threshold", [
    ("token_k1", 1.05), ("token_k1", "0.9_1.2"), ("seq_mean_k1", 1.02), ("seq_sum_k1", "0.8_1.3"),
    ("token_k2,seq_max_k3", "0.002,0.01"), ("seq_sum_k2,seq_sum_k3,seq_max_k2,token_k3,seq_mean_k2,seq_mean_k3", 0.05),
])
def test_rollout_rejection_mask(rs, threshold):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    b = batch(seed=23)
    rollout = b["old"] + 0.05 * torch.randn_like(b["old"])
    theirs, their_metrics = compute_rollout_rejection_mask(b["old"] - rollout, b["mask"], rs, threshold)
    ours, our_metrics = P.rollout_rejection_mask(b["old"], rollout, b["mask"], rs, threshold)
    assert torch.equal(ours, theirs)
    assert set(our_metrics) == {f"rollout_corr/{k}" for k in their_metrics}
    for k, v in their_metrics.items():
        assert our_metrics[f"rollout_corr/{k}"] == pytest.approx(float(v), abs=TOL), k


@pytest.mark.parametrize("seed", range(20))
def test_karmarkar_karp_and_dynamic_micro_batches(seed):
    import verl.utils.seqlen_balancing as SB
    from tensordict import TensorDict

    from ppolab import batching

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 60, (24,), generator=g).tolist()
    for k, equal in ((2, True), (4, True), (3, False), (5, False)):
        assert (batching.get_seqlen_balanced_partitions(lens, k, equal)
                == SB.get_seqlen_balanced_partitions(lens, k, equal))
    width = max(lens)
    mask = (torch.arange(width)[None] < torch.tensor(lens)[:, None]).long()
    td = TensorDict({"input_ids": torch.zeros_like(mask), "attention_mask": mask}, batch_size=[len(lens)])
    for budget, vpp in ((80, None), (150, None), (60, 2)):
        _, theirs = SB.rearrange_micro_batches(td, max_token_len=budget, num_batches_divided_by=vpp)
        assert batching.plan_dynamic_micro_batches(lens, budget, num_batches_divided_by=vpp) == theirs


def _verl_rank_plan(rank, lens_per_rank, budget, port, out):
    """One DP rank of a 2-process gloo group: verl's rearrange_micro_batches with the dp_group (count all-reduced)."""
    import os

    import torch.distributed as dist
    from tensordict import TensorDict
    from verl.utils import seqlen_balancing as sb

    sb.get_device_name = lambda: "cpu"  # verl exchanges the count on its accelerator; gloo on CPU tensors here
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(lens_per_rank))
    try:
        lens = lens_per_rank[rank]
        width = max(max(x) for x in lens_per_rank)
        mask = (torch.arange(width)[None] < torch.tensor(lens)[:, None]).long()
        td = TensorDict({"input_ids": torch.zeros_like(mask), "attention_mask": mask}, batch_size=[len(lens)])
        _, idx = sb.rearrange_micro_batches(td, max_token_len=budget, dp_group=dist.group.WORLD)
        out.put((rank, idx))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("lens_per_rank, budget", [
    ([[100] * 4, [250] * 4], 500),           # the count differs alone (1 vs 2): all-reduce MAX
    ([[50] * 10, [100] * 10], 250),          # one rank's fit loop (4 → 5) keeps the other in step
    ([[7, 30, 12, 45, 3, 22], [40, 41, 5, 9, 33, 2]], 60),
])
def test_dynamic_micro_batches_agreed_over_ranks_equal_verls(lens_per_rank, budget):
    import socket

    import torch.multiprocessing as mp

    from ppolab import batching

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_verl_rank_plan, args=(r, lens_per_rank, budget, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    theirs = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert batching.plan_dynamic_micro_batches_dp(lens_per_rank, budget) == [theirs[0], theirs[1]]
