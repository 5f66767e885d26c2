"""The critic is micro-batched as verl V1 wires it (issue 24 §3; chapter §8 last paragraph, §11.6, §14.1; verl
`trainer/ppo/v1/trainer_base.py`): its engine packs both the value forward (stage 6) and the critic update (stage 8)
by ``critic.ppo_infer_max_token_len_per_gpu``; the top-level ``critic.use_dynamic_bsz``,
``ppo_micro_batch_size_per_gpu`` and ``ppo_max_token_len_per_gpu`` never reach it."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import ppolab.worker
from ppolab.config import ConfigError, ConfigNotice, load_config
from ppolab.train import resolve_config
from ppolab.trainer import PPOTrainer
from ppolab.worker import CriticWorker

from helpers import NO_VAL, TINY

# ppo_gae_tiny at 2 prompts × 2 answers: 4 rows, one critic mini-batch of all 4, one optimizer step per step.
BASE = ["trainer.total_training_steps=2"]
# The smallest budget validation allows: max_prompt_length + max_response_length = 32 + 16.
SMALL_BUDGET = 48


class CriticForwards:
    """Spy on the critic's model forwards (the calls that pass the value head): rows per call, and whether it was
    the update (gradients on) or the value pass (inference mode)."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, int]] = []
        real = ppolab.worker.forward_response

        def spy(model, ids, *args, **kwargs):
            if len(args) > 5 and args[5] is not None:  # value_head: only the critic passes one
                self.calls.append(("update" if torch.is_grad_enabled() else "values", ids.shape[0]))
            return real(model, ids, *args, **kwargs)

        monkeypatch.setattr(ppolab.worker, "forward_response", spy)

    def rows(self, kind: str) -> list[int]:
        return [n for k, n in self.calls if k == kind]


def train(overrides, steps=2):
    """``steps`` whole training steps: (per step: critic metrics, values), with the config's notices silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNotice)
        t = PPOTrainer(resolve_config("ppo_gae_tiny", [*TINY, *NO_VAL, *BASE, *overrides]))
    out = []
    for _ in range(steps):
        metrics, batch, histories, _ = t.step()
        out.append(({k: v for k, v in metrics.items() if k.startswith("critic/")}, batch["values"].clone(),
                    histories["critic_vpreds"].clone()))
    return out


IGNORED = {
    "preset (micro 16)": [],
    "micro 1": ["critic.ppo_micro_batch_size_per_gpu=1"],
    "micro 3, budget 48": ["critic.ppo_micro_batch_size_per_gpu=3", f"critic.ppo_max_token_len_per_gpu={SMALL_BUDGET}"],
    "dynamic, budget 48": ["critic.use_dynamic_bsz=true", "critic.ppo_micro_batch_size_per_gpu=null",
                           f"critic.ppo_max_token_len_per_gpu={SMALL_BUDGET}"],
}


def test_the_top_level_critic_micro_batch_keys_change_nothing(monkeypatch):
    """Under the legacy reading these would cut the 4-row mini-batch into 4, 2 or ~3 micro-batches; V1's critic
    engine ignores them, so every value, vpred and critic metric of two whole steps is bit-identical, and the
    critic's forwards are the same calls."""
    results, forwards = {}, {}
    for name, overrides in IGNORED.items():
        spy = CriticForwards(monkeypatch)
        results[name] = train(overrides)
        forwards[name] = spy.calls
        monkeypatch.undo()
    ref = results["preset (micro 16)"]
    assert forwards["preset (micro 16)"] == [("values", 4), ("update", 4)] * 2  # one forward each: 4 rows ≪ 32768
    for name, got in results.items():
        assert forwards[name] == forwards["preset (micro 16)"], name
        for (m, v, h), (m0, v0, h0) in zip(got, ref):
            assert m == m0, name
            assert torch.equal(v, v0) and torch.equal(h, h0), name
    assert ref[0][0]["critic/vf_loss"] > 0 and ref[1][0]["critic/grad_norm"] > 0  # the critic did learn


@pytest.fixture(scope="module")
def stages_1_to_7():
    """A ppo_gae_tiny trainer and its step-1 batch after stage 7 (values with the default budget)."""
    t = PPOTrainer(resolve_config("ppo_gae_tiny", [*TINY, *NO_VAL, *BASE]))
    batch = t.compute_reward(t.generate_sequences(t.next_prompts()))
    batch, _ = t.balance_batch(batch)
    batch, _ = t.compute_old_log_prob(batch)
    batch = t.compute_ref_log_prob(batch)
    batch = t.compute_values(batch)
    batch, _ = t.compute_advantage(batch)
    return t, batch


def with_budget(t: PPOTrainer, budget: int, optimizer=None) -> CriticWorker:
    cfg = dataclasses.replace(t.config.critic, ppo_infer_max_token_len_per_gpu=budget)
    return CriticWorker(cfg, t.models, temperature=t.critic.temperature, rollout_n=t.critic.rollout_n,
                        optimizer=optimizer)


def test_the_budget_cuts_the_value_forward_and_the_values_stay(stages_1_to_7, monkeypatch):
    t, batch = stages_1_to_7
    assert sum(batch.seq_lens()) > SMALL_BUDGET  # the small budget must cut this batch
    values = {}
    for budget in (32768, SMALL_BUDGET):
        spy = CriticForwards(monkeypatch)
        t.critic = with_budget(t, budget)
        values[budget] = t.compute_values(batch)["values"].clone()
        values[budget, "rows"] = spy.rows("values")
        monkeypatch.undo()
    assert values[32768, "rows"] == [4]
    assert len(values[SMALL_BUDGET, "rows"]) >= 2 and sum(values[SMALL_BUDGET, "rows"]) == 4
    torch.testing.assert_close(values[SMALL_BUDGET], values[32768], atol=1e-5, rtol=0)


def test_the_budget_cuts_the_critic_update_and_the_update_stays(stages_1_to_7, monkeypatch):
    """Micro-batch invariance (chapter §13): the same critic weights after one update, whether the engine takes the
    mini-batch in one micro-batch or in several."""
    t, batch = stages_1_to_7
    params = t.models.critic_parameters()
    g = torch.Generator().manual_seed(0)
    start = [p.detach() + torch.randn(p.shape, generator=g) * 0.05 for p in params]  # LoRA B ≠ 0: A gets gradient
    original = [p.detach().clone() for p in params]
    out = {}
    try:
        for budget in (32768, SMALL_BUDGET):
            with torch.no_grad():
                for p, s in zip(params, start):
                    p.copy_(s)
            spy = CriticForwards(monkeypatch)
            # SGD, not Adam: Adam's first step is ~sign(g), which would magnify float noise on tiny gradients.
            worker = with_budget(t, budget, optimizer=torch.optim.SGD(params, lr=1.0))
            metrics, histories, _ = worker.update(batch)
            out[budget] = metrics, histories["critic_vpreds"], [p.detach().clone() for p in params], spy.rows("update")
            monkeypatch.undo()
    finally:
        with torch.no_grad():
            for p, o in zip(params, original):
                p.copy_(o)
    (m_one, h_one, w_one, rows_one), (m_cut, h_cut, w_cut, rows_cut) = out[32768], out[SMALL_BUDGET]
    assert rows_one == [4] and len(rows_cut) >= 2 and sum(rows_cut) == 4
    assert max(float((w - s).abs().max()) for w, s in zip(w_one, start)) > 1e-3  # the update did something
    for w, ref in zip(w_cut, w_one):
        torch.testing.assert_close(w, ref, atol=1e-5, rtol=0)
    for key in ("critic/vf_loss", "critic/loss", "critic/grad_norm"):  # globally normalised: the same sum
        assert m_cut[key] == pytest.approx(m_one[key], abs=1e-5), key
    torch.testing.assert_close(h_cut, h_one, atol=1e-5, rtol=0, equal_nan=True)


# ====================================================================== config: the field, its notices
P = "ppo_gae_tiny"


def test_the_budget_field_is_verls_and_takes_hydras_plus():
    cfg = load_config(P, ["+critic.ppo_infer_max_token_len_per_gpu=4096"])
    assert cfg.critic.ppo_infer_max_token_len_per_gpu == 4096
    assert load_config(P).critic.ppo_infer_max_token_len_per_gpu == 32768  # verl's CriticConfig default
    with pytest.raises(ConfigError, match="critic.ppo_infer_max_token_len_per_gpu=40 is smaller"):
        load_config(P, ["critic.ppo_infer_max_token_len_per_gpu=40"])


@pytest.mark.parametrize("overrides, says", [
    (["critic.ppo_micro_batch_size_per_gpu=5"], r"critic.ppo_micro_batch_size_per_gpu=5 \(with "
     r"critic.use_dynamic_bsz=false\) is ignored: verl V1 .* critic.ppo_infer_max_token_len_per_gpu=32768"),
    (["critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=1024"],
     r"critic.ppo_max_token_len_per_gpu=1024 is ignored: .*critic.ppo_infer_max_token_len_per_gpu=32768"),
    (["critic.ppo_max_token_len_per_gpu=2048", "critic.ppo_infer_max_token_len_per_gpu=4096"],
     r"critic.ppo_max_token_len_per_gpu=2048 is ignored: .*critic.ppo_infer_max_token_len_per_gpu=4096"),
])
def test_the_ignored_keys_say_so_and_name_the_effective_one(overrides, says):
    with pytest.warns(ConfigNotice, match=says):
        load_config(P, overrides)  # a notice, not an error: 5 need not divide the 16-row mini-batch


@pytest.mark.parametrize("overrides", [
    [],  # the preset: micro 16 = the local mini-batch, what verl's CriticConfig requires
    ["critic.use_dynamic_bsz=true", "critic.ppo_micro_batch_size_per_gpu=null"],  # chapter §14.1's form
    ["critic.ppo_max_token_len_per_gpu=4096", "critic.ppo_infer_max_token_len_per_gpu=4096"],  # the same budget
])
def test_keys_that_ask_for_nothing_v1_does_not_do_are_quiet(overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigNotice)
        load_config(P, overrides)


def test_verls_critic_config_check_stays():
    """verl's CriticConfig still needs a micro-batch size unless use_dynamic_bsz, although V1 does not use it."""
    with pytest.raises(ConfigError, match="critic.ppo_micro_batch_size_per_gpu is unset.*verl's CriticConfig"):
        load_config(P, ["critic.ppo_micro_batch_size_per_gpu=null"])


@pytest.mark.parametrize("key", ["critic.ppo_infer_micro_batch_size_per_gpu",
                                 "critic.forward_micro_batch_size_per_gpu"])
def test_critic_micro_batch_keys_v1_never_wires_are_refused_with_the_reason(key):
    with pytest.raises(ConfigError, match=rf"unknown config key {key}: .*critic.ppo_infer_max_token_len_per_gpu"):
        load_config(P, [f"+{key}=4"])
