"""The advantage estimators are called as verl's trainer calls them (issue 24 §3; verl
`ray_trainer.py::compute_advantage`): every registered function has verl 0.9.1's signature, a keyword an
estimator does not declare raises instead of vanishing, and gdpo reads its components from ``non_tensor_batch``
and their positions from ``batch["attention_mask"]``. tests/parity/test_verl_parity_modes.py checks the same
against verl itself."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import ppolab.algos as A
from ppolab.config import AlgorithmConfig

_E = inspect.Parameter.empty
_KW = "**kwargs"
_GROUP = [("token_level_rewards", _E), ("response_mask", _E), ("index", _E), ("epsilon", 1e-6)]
_OTB = [("token_level_rewards", _E), ("response_mask", _E), ("index", _E), ("old_log_probs", _E),
        ("sum_pi_squared", _E), ("rollout_is_weights", None), ("handle_zero_tail", True), ("epsilon", 1e-8), _KW]

#: verl 0.9.1 `core_algos.py`, read off the wheel: (name, default) in order, and "**kwargs" where verl has it.
VERL_SIGNATURES = {
    "gae": [("token_level_rewards", _E), ("values", _E), ("response_mask", _E), ("gamma", _E), ("lam", _E)],
    "grpo": [*_GROUP, ("norm_adv_by_std_in_grpo", True), ("config", None)],
    "grpo_vectorized": [*_GROUP, ("norm_adv_by_std_in_grpo", True), ("config", None)],
    "gdpo": [*_GROUP, ("norm_adv_by_std_in_grpo", True), ("config", None), ("non_tensor_batch", None),
             ("batch", None), _KW],
    "grpo_passk": [*_GROUP, ("norm_adv_by_std_in_grpo", True), ("config", None), _KW],
    "reinforce_plus_plus_baseline": [*_GROUP, ("config", None), _KW],
    "rloo": [*_GROUP, ("config", None), _KW],
    "rloo_vectorized": [*_GROUP, ("config", None), _KW],
    "opo": [*_GROUP, ("config", None), _KW],
    "reinforce_plus_plus": [("token_level_rewards", _E), ("response_mask", _E), ("config", None), _KW],
    "remax": [("token_level_rewards", _E), ("reward_baselines", _E), ("response_mask", _E), ("config", None), _KW],
    "gpg": [*_GROUP, ("f_norm", 1.0), ("alpha", 1.0), ("config", None), _KW],
    "optimal_token_baseline": _OTB,
    "tir_optimal_token_baseline": _OTB,
}


def signature_of(fn) -> list:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append(_KW if p.kind is p.VAR_KEYWORD else (p.name, p.default))
    return out


def test_the_registry_is_verls():
    assert set(A.ADV_ESTIMATOR_REGISTRY) == set(VERL_SIGNATURES)


@pytest.mark.parametrize("name", sorted(VERL_SIGNATURES))
def test_every_registered_estimator_keeps_verls_signature(name):
    assert signature_of(A.ADV_ESTIMATOR_REGISTRY[name]) == VERL_SIGNATURES[name]


def batch(seed: int = 0, bs: int = 8, width: int = 5, prompt: int = 3):
    """A verl-shaped batch: left-padded prompts, right-padded responses, 4 groups of 2, two reward components."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (bs,), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    attention = torch.cat([torch.ones(bs, prompt, dtype=torch.long), mask.long()], dim=1)
    fmt = torch.rand(bs, generator=g).numpy().astype(np.float64)
    acc = torch.randint(0, 2, (bs,), generator=g).numpy().astype(np.float64)
    total = torch.as_tensor(fmt + acc, dtype=torch.float32)
    rewards = torch.zeros(bs, width)
    rewards[torch.arange(bs), lengths - 1] = total  # the summed score, where the trainer puts it
    uid = [i // 2 for i in range(bs)]
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "prompts": torch.zeros(bs, prompt).long(),
               "attention_mask": attention, "old_log_probs": torch.zeros(bs, width)}
    return tensors, {"uid": uid, "format_reward": fmt, "accuracy_reward": acc}


def hand_gdpo(rows: dict, mask: torch.Tensor, keys: list[str], weights: list[float]) -> np.ndarray:
    """GDPO by hand: each component normalised in its group ((s − mean)/(unbiased std + 1e-6)), weighted sum,
    then whitened over the valid tokens of the batch (unbiased var, 1e-8), × mask (verl-facts §7, chapter §5.1)."""
    uid, m = np.asarray(rows["uid"]), mask.double().numpy()
    summed = np.zeros(len(uid))
    for key, w in zip(keys, weights):
        s = np.asarray(rows[key], dtype=np.float32).astype(np.float64)
        a = np.zeros_like(s)
        for u in set(uid.tolist()):
            sel = uid == u
            a[sel] = (s[sel] - s[sel].mean()) / (s[sel].std(ddof=1) + 1e-6)
        summed += w * a
    tok = summed[:, None] * m  # the advantage broadcast over each row's response tokens
    n = m.sum()
    mean = (tok * m).sum() / n
    var = (((tok - mean) ** 2) * m).sum() / n * n / (n - 1)
    return (tok - mean) / np.sqrt(var + 1e-8) * m


@pytest.mark.parametrize("weights", [None, [0.3, 1.7]])
def test_gdpo_with_verls_keyword_arguments_is_gdpo_not_grpo_on_the_sum(weights):
    tensors, rows = batch()
    keys = ["format_reward", "accuracy_reward"]
    cfg = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=keys, gdpo_reward_weights=weights)
    # exactly the keywords verl's trainer builds for gdpo
    adv, ret = A.compute_gdpo_outcome_advantage(
        token_level_rewards=tensors["token_level_rewards"], response_mask=tensors["response_mask"], config=cfg,
        index=rows["uid"], non_tensor_batch=rows, batch=tensors)
    expected = hand_gdpo(rows, tensors["response_mask"], keys, weights or [1.0, 1.0])
    assert np.allclose(adv.double().numpy(), expected, atol=1e-5)
    assert torch.equal(adv, ret)
    grpo_on_sum = A.compute_grpo_outcome_advantage(tensors["token_level_rewards"], tensors["response_mask"],
                                                   rows["uid"])[0]
    assert (adv - grpo_on_sum).abs().max() > 0.1
    # the trainer's dispatch (verl's compute_advantage) hands gdpo the same two halves
    via_dispatch = A.compute_advantage_from_data(tensors, rows, "gdpo", config=cfg)[0]
    assert torch.equal(via_dispatch, adv)


def test_gdpo_puts_each_component_at_the_last_attended_response_token():
    tensors, rows = batch(seed=3)
    placed = A.scores_at_last_valid_response_token(rows["format_reward"], tensors["attention_mask"], 3,
                                                   tensors["response_mask"])
    last = tensors["response_mask"].sum(-1).long() - 1
    assert torch.equal(placed.argmax(-1)[placed.sum(-1) > 0], last[placed.sum(-1) > 0])
    assert torch.allclose(placed.sum(-1), torch.as_tensor(rows["format_reward"], dtype=torch.float32))
    # a row with no attended response token: verl's index −1, the last column
    empty = tensors["attention_mask"].clone()
    empty[0, 3:] = 0
    assert A.scores_at_last_valid_response_token([5.0] * 8, empty, 3, tensors["response_mask"])[0, -1] == 5.0


def test_gdpo_falls_back_to_the_summed_reward_only_as_verl_does():
    """verl uses the components only when config, non_tensor_batch and batch are all given; the trainer gives all
    three, so its gdpo run is never GRPO-on-the-sum-then-whitened."""
    tensors, rows = batch(seed=1)
    cfg = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=["format_reward", "accuracy_reward"])
    r, m, uid = tensors["token_level_rewards"], tensors["response_mask"], rows["uid"]
    fallback = A.compute_gdpo_outcome_advantage(r, m, uid)[0]
    assert torch.equal(A.compute_gdpo_outcome_advantage(r, m, uid, config=cfg, non_tensor_batch=rows)[0], fallback)
    assert not torch.allclose(A.compute_gdpo_outcome_advantage(r, m, uid, config=cfg, non_tensor_batch=rows,
                                                               batch=tensors)[0], fallback, atol=1e-3)
    with pytest.raises(ValueError, match="'accuracy_reward' not found in non_tensor_batch"):
        A.compute_gdpo_outcome_advantage(r, m, uid, config=cfg, non_tensor_batch={"format_reward": [0.0] * 8},
                                         batch=tensors)


def test_an_estimator_without_a_keyword_it_is_given_raises_as_in_verl():
    """verl's trainer passes index=uid to every registry estimator: one that does not declare it (and has no
    **kwargs) raises TypeError there — and here, instead of the keyword being dropped."""
    @A.register_adv_est("test_no_index_estimator")
    def no_index(token_level_rewards, response_mask, config=None):
        return token_level_rewards, token_level_rewards

    tensors, rows = batch()
    try:
        with pytest.raises(TypeError, match="index"):
            A.compute_advantage_from_data(tensors, rows, "test_no_index_estimator")
        # grpo_vectorized has no **kwargs in verl either: a reward_baselines tensor in the batch reaches it and raises
        with pytest.raises(TypeError, match="reward_baselines"):
            A.compute_advantage_from_data({**tensors, "reward_baselines": torch.zeros(8)}, rows, "grpo_vectorized")
    finally:
        del A.ADV_ESTIMATOR_REGISTRY["test_no_index_estimator"]


@pytest.mark.parametrize("name, unused", [
    ("rloo", {"epsilon": 0.3}), ("rloo_vectorized", {"epsilon": 0.3}), ("opo", {"epsilon": 0.3}),
    ("reinforce_plus_plus_baseline", {"epsilon": 0.3}), ("gpg", {"epsilon": 0.3}), ("gpg", {"alpha": 7.0}),
    ("grpo_passk", {"norm_adv_by_std_in_grpo": False}),
    ("optimal_token_baseline", {"config": AlgorithmConfig(gamma=0.5)}),
    ("tir_optimal_token_baseline", {"config": AlgorithmConfig(gamma=0.5)}),
])
def test_arguments_verl_declares_but_does_not_read_change_nothing(name, unused):
    """Each is unused in verl too (tests/parity/test_verl_parity_modes.py checks verl with the same cases)."""
    tensors, rows = batch(seed=2)
    kw = dict(token_level_rewards=tensors["token_level_rewards"], response_mask=tensors["response_mask"],
              index=rows["uid"])
    if name.endswith("optimal_token_baseline"):
        kw.update(old_log_probs=-torch.rand(8, 5), sum_pi_squared=torch.rand(8, 5))
    else:
        kw["config"] = AlgorithmConfig(gamma=0.9)
    fn = A.ADV_ESTIMATOR_REGISTRY[name]
    base, changed = fn(**kw), fn(**{**kw, **unused})
    assert torch.equal(base[0], changed[0]) and torch.equal(base[1], changed[1])


def test_the_trainers_gdpo_reads_the_reward_components_of_its_batch():
    """Stage 7 of a real step with adv_estimator=gdpo: the advantages are GDPO of the rows' ``acc`` and ``format``
    components (verl's non_tensor_batch), not GRPO of the summed score."""
    from ppolab.train import resolve_config
    from ppolab.trainer import PPOTrainer

    from helpers import NO_VAL

    t = PPOTrainer(resolve_config("grpo_tiny", [
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,format]",
        "algorithm.gdpo_reward_weights=[1.0,0.5]", "actor_rollout_ref.rollout.temperature=1.5", *NO_VAL]))
    batch = t.compute_reward(t.generate_sequences(t.next_prompts()))
    batch, _ = t.balance_batch(batch)
    batch, _ = t.compute_old_log_prob(batch)
    batch = t.compute_ref_log_prob(batch)
    batch, _ = t.compute_advantage(batch)
    _, rows = t.verl_data(batch)
    expected = hand_gdpo(rows, batch["response_mask"], ["acc", "format"], [1.0, 0.5])
    assert np.allclose(batch["advantages"].double().numpy(), expected, atol=1e-5)
    fallback = A.compute_gdpo_outcome_advantage(batch["token_level_rewards"], batch["response_mask"], rows["uid"])[0]
    assert not np.allclose(fallback.double().numpy(), expected, atol=1e-3)  # GRPO of the sum, whitened: another thing
