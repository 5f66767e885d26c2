"""Packed sequences (verl ``use_remove_padding``): the same numbers as the padded forward, on real rows.

The pure layout (``ppolab.algos.remove_padding``) by hand; the forward on the shipped model, every output path
(plain logits, chunked logits, fused head, value head), with gradients; one real update per role and per
aggregation mode, packed against padded, on the shipped runs' recorded batches; and the config key read as verl
reads it (the actor's from the model's, the critic's its own).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from ppolab.algos import remove_padding
from ppolab.algos.remove_padding import pack_bins, pack_rows, pad_responses, padded_slots
from ppolab.config import load_config
from ppolab.models import ValueHead, forward_response
from ppolab.replay import gradients, max_abs_diff, replay_actor_update, replay_forward, restore, run_models
from ppolab.run.reader import Run
from ppolab.update_plan import InferBatching
from ppolab.widgets.common import SHIPPED_RUNS
from ppolab.worker import CriticWorker

GRPO, GAE = Run(SHIPPED_RUNS["grpo_tiny"]), Run(SHIPPED_RUNS["ppo_gae_tiny"])
#: |packed − padded| allowed for a log-prob, entropy or value: the same weights and tokens, matrices of other
#: shapes (one row of nnz tokens instead of bs rows) — float32 rounding, measured ≤ 3e-8 on the shipped model.
ATOL = 1e-5


def batch_of_rows() -> tuple[torch.Tensor, torch.Tensor, int]:
    """Three rows as every stage builds them (prompt left-padded ‖ response right-padded), P = 3, R = 4."""
    ids = torch.tensor([[0, 11, 12, 21, 22, 23, 24],
                        [13, 14, 15, 25, 0, 0, 0],
                        [0, 0, 16, 26, 27, 0, 0]])
    mask = (ids != 0).long()
    return ids, mask, 4


def test_packing_lays_the_real_tokens_end_to_end_and_finds_the_positions_that_score_them():
    ids, mask, r = batch_of_rows()
    p = pack_rows(ids, mask, r)  # one row: verl's layout
    assert p.input_ids.tolist() == [[11, 12, 21, 22, 23, 24, 13, 14, 15, 25, 16, 26, 27]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1, 2]]
    # position i predicts token i + 1: 21 is scored by 12 (packed 1), 25 by 15 (packed 8), 26 by 16 (packed 10)
    assert p.scoring.tolist() == [1, 2, 3, 4, 8, 10, 11]
    assert p.labels.tolist() == [21, 22, 23, 24, 25, 26, 27]
    assert p.input_ids.flatten()[p.scoring + 1].tolist() == p.labels.tolist()  # never across a sequence's end
    grid = pad_responses(torch.arange(1.0, 8.0), p.real)
    assert grid.tolist() == [[1, 2, 3, 4], [5, 0, 0, 0], [6, 7, 0, 0]]
    assert padded_slots(mask) == (21, 13)
    assert padded_slots(mask, packed=True) == (13, 13)  # one row of the real tokens


def test_packed_rows_of_a_capacity_hold_whole_sequences_longest_first():
    assert pack_bins([6, 4, 3, 2, 5], 7) == [[0], [4, 3], [1, 2]]
    ids, mask, r = batch_of_rows()
    p = pack_rows(ids, mask, r, capacity=7)  # rows of 6, 4 and 3 tokens: [6] and [4, 3]
    assert p.input_ids.tolist() == [[11, 12, 21, 22, 23, 24, 0], [13, 14, 15, 25, 16, 26, 27]]
    # the filler slot comes after every real token of its row: no real token attends to it
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0], [0, 1, 2, 3, 0, 1, 2]]
    assert p.scoring.tolist() == [1, 2, 3, 4, 9, 11, 12]
    assert p.input_ids.flatten()[p.scoring + 1].tolist() == p.labels.tolist()


@pytest.fixture(scope="module")
def model():
    return run_models(GRPO).model


def rows_of(run: Run, n: int = 16) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first ``n`` recorded rows of step 1 as prompt ‖ response with their own right padding; the shipped
    prompts all have 17 tokens, so row b's prompt is cut by its first 4 · (b % 4) tokens (left padding, as a
    shorter prompt has): short rows share a packed row with others."""
    t = run.step(1).tensors
    prompts, responses = t["prompts"][:n].clone(), t["responses"][:n]
    prompt_mask = t["prompt_mask"][:n].long().clone()
    for b in range(n):
        prompt_mask[b, :4 * (b % 4)] = 0
    mask = torch.cat([prompt_mask, t["response_mask"][:n].long()], dim=1)
    return torch.cat([prompts, responses], dim=1), mask, responses.shape[1]


@pytest.fixture(params=["one row", "rows of 30 tokens"])
def layout(request, monkeypatch):
    """verl's one packed row, or (a micro-batch over the row budget) several rows, each holding several sequences."""
    if request.param != "one row":
        monkeypatch.setattr(remove_padding, "PACKED_ROW_TOKENS", 30)
    return request.param


@pytest.mark.parametrize("path", ["logits", "chunked", "fused"])
def test_a_packed_forward_equals_the_padded_one_on_every_path(model, path, layout):
    ids, mask, r = rows_of(GRPO)
    real = mask[:, -r:].bool()
    assert (~real).any() and (mask[:, :-r] == 0).any(), "the rows must carry both kinds of padding"
    bins = pack_bins(mask.sum(-1).tolist(), remove_padding.row_capacity(mask.sum(-1)))
    assert len(bins) == 1 if layout == "one row" else 1 < len(bins) and any(len(rows) > 1 for rows in bins)
    kw = {"logits": {}, "chunked": {"chunked": True, "fused": False}, "fused": {"chunked": True}}[path]
    head = ValueHead(model.config.hidden_size, seed=3) if path == "logits" else None
    padded = forward_response(model, ids, mask, r, 0.7, True, True, head, **kw)
    packed = forward_response(model, ids, mask, r, 0.7, True, True, head, remove_padding=True, **kw)
    for name in ("log_probs", "entropy") + (("values",) if head is not None else ()):
        a, b = getattr(padded, name), getattr(packed, name)
        assert (a[real] - b[real]).abs().max() <= ATOL, name
        assert (b[~real] == 0).all(), f"{name}: a padded slot of the packed result is not 0"
    sp_a = forward_response(model, ids, mask, r, 0.7, False, False, want_sum_pi_squared=True, **kw).sum_pi_squared
    if path != "fused":
        sp_b = forward_response(model, ids, mask, r, 0.7, False, False, want_sum_pi_squared=True,
                                remove_padding=True, **kw).sum_pi_squared
        assert (sp_a[real] - sp_b[real]).abs().max() <= ATOL


def test_a_packed_row_keeps_each_sequence_to_itself_and_its_gradients(model, layout):
    ids, mask, r = rows_of(GRPO, 8)
    lengths = mask.sum(-1).tolist()
    shared = next(rows for rows in pack_bins(lengths, remove_padding.row_capacity(mask.sum(-1))) if len(rows) > 1)
    first = shared[0]  # laid first in its packed row: the sequences after it would read it if the mask leaked
    other = ids.clone()
    other[first, -r:] = (other[first, -r:] + 7) % model.config.vocab_size  # another response in that row only
    a = forward_response(model, ids, mask, r, 1.0, remove_padding=True).log_probs
    b = forward_response(model, other, mask, r, 1.0, remove_padding=True).log_probs
    rest = [i for i in range(len(ids)) if i != first]
    assert torch.equal(a[rest], b[rest]) and not torch.equal(a[first], b[first])
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    grads = []
    for packs in (False, True):
        model.zero_grad(set_to_none=True)
        lp = forward_response(model, ids, mask, r, 1.0, remove_padding=packs).log_probs
        lp[mask[:, -r:].bool()].sum().backward()
        grads.append(gradients(params))
    model.zero_grad(set_to_none=True)
    restore(params, saved)
    assert max(float(g.abs().max()) for g in grads[0]) > 1e-2
    assert max_abs_diff(grads[0], grads[1]) <= 1e-4 * max(float(g.abs().max()) for g in grads[0])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_the_actor_update_is_the_same_packed_and_padded_in_every_aggregation_mode(mode):
    padded = replay_actor_update(GRPO, loss_agg_mode=mode, remove_padding=False, micro_batch_size=8)
    packed = replay_actor_update(GRPO, loss_agg_mode=mode, remove_padding=True, micro_batch_size=8)
    assert padded["settings"]["remove_padding"] is False and packed["settings"]["remove_padding"] is True
    scale = max(float(g.abs().max()) for g in padded["grads"])
    assert scale > 1e-3  # the update does something
    assert max_abs_diff(packed["grads"], padded["grads"]) <= 1e-4 * scale
    for key, value in padded["metrics"].items():
        assert packed["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("reference", [False, True])
def test_stage_4_and_5_forwards_packed_match_what_the_run_recorded(reference):
    out = replay_forward(GRPO, reference=reference, remove_padding=True)
    real = out["response_mask"].bool()
    assert (out["log_probs"][real] - out["recorded"][real]).abs().max() <= 1e-4  # recorded on another CPU


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_the_critic_update_is_the_same_packed_and_padded(mode):
    from ppolab.numbers.update_effect import one_process, step_batch

    cfg = GAE.ppo_config()
    batch = step_batch(GAE, 1)
    opt = one_process(GAE.step(1).plan("critic").steps[0])
    results = []
    models = run_models(GAE)
    params = models.critic_parameters()
    saved = [p.detach().clone() for p in params]
    try:
        for packs in (False, True):
            critic = dataclasses.replace(cfg.critic, loss_agg_mode=mode,
                                         model=dataclasses.replace(cfg.critic.model, use_remove_padding=packs))
            worker = CriticWorker(critic, models, temperature=cfg.actor_rollout_ref.rollout.temperature,
                                  rollout_n=cfg.actor_rollout_ref.rollout.n,
                                  optimizer=torch.optim.SGD(params, lr=1.0))
            assert worker.remove_padding is packs
            values = worker.infer(batch, InferBatching(len(batch)), log_probs=False, values=True)["values"]
            metrics = worker.optimizer_step_of(batch, opt, params)
            results.append((values, metrics, gradients(params)))
            restore(params, saved)
    finally:
        restore(params, saved)
    (v0, m0, g0), (v1, m1, g1) = results
    real = batch["response_mask"].bool()
    assert (v0[real] - v1[real]).abs().max() <= ATOL
    scale = max(float(g.abs().max()) for g in g0)
    assert scale > 1e-4 and max_abs_diff(g0, g1) <= 1e-4 * scale
    for key, value in m0.items():
        assert m1[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_the_key_is_read_as_verl_reads_it():
    cfg = load_config("grpo_tiny")
    assert cfg.actor_rollout_ref.model.use_remove_padding is False  # ppolab's default until its runs are re-recorded
    assert cfg.actor_rollout_ref.actor.use_remove_padding is False  # resolved from the model's
    cfg = load_config("ppo_gae_tiny", ["actor_rollout_ref.model.use_remove_padding=true"])
    assert cfg.actor_rollout_ref.actor.use_remove_padding is True
    assert cfg.critic.model.use_remove_padding is False  # verl's critic has a key of its own
    cfg = load_config("grpo_tiny", ["actor_rollout_ref.model.use_remove_padding=true",
                                    "actor_rollout_ref.actor.use_remove_padding=false"])
    assert cfg.actor_rollout_ref.actor.use_remove_padding is False


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["grpo_tiny", "ppo_gae_tiny", "grpo_tool_tiny", "grpo_temp_tiny", "ppo_fire_tiny"])
def test_a_run_trained_packed_logs_the_padded_runs_metrics(preset, tmp_path):
    """Two steps of a preset trained packed and padded from the same seed: every logged metric the same to rounding
    (the rollouts are the same: the hf engine samples before any update, and the updates agree)."""
    import ppolab

    small = ["trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
             "critic.ppo_micro_batch_size_per_gpu=4", "data.val_max_samples=8", "trainer.test_freq=2"]
    runs = {packs: ppolab.train(preset, [*small, f"trainer.run_dir={tmp_path / str(packs)}",
                                         f"actor_rollout_ref.model.use_remove_padding={packs}",
                                         f"critic.model.use_remove_padding={packs}"], progress=False)
            for packs in ("false", "true")}
    assert runs["true"].ppo_config().actor_rollout_ref.actor.use_remove_padding is True
    padded, packed = runs["false"].metrics, runs["true"].metrics
    compared = 0
    for key in padded.columns:
        if key.startswith(("timing", "perf")) or "rollout_probs_diff" in key or key not in packed.columns:
            continue  # wall time; and π_rollout − π_old, itself a difference at rounding
        for a, b in zip(padded[key], packed[key]):
            if isinstance(a, float) and a == a:
                assert b == pytest.approx(a, rel=1e-3, abs=1e-5), key
                compared += 1
    assert compared > 40


@pytest.mark.parametrize("replay", [replay_actor_update, replay_forward])
def test_a_replays_layout_switch_is_a_bool_or_none(replay):
    from ppolab.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"remove_padding='no' is not True, False or None"):
        replay(GRPO, remove_padding="no")


def _tiny(arch: str):
    import transformers

    small = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    return {"llama": lambda: transformers.LlamaConfig(**small, num_key_value_heads=2),
            "gpt_neox": lambda: transformers.GPTNeoXConfig(**small),
            "gpt2": lambda: transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4),
            "gemma2": lambda: transformers.Gemma2Config(**small, num_key_value_heads=2, head_dim=16)}[arch]()


@pytest.mark.parametrize("arch, attention", [("llama", "sdpa"), ("llama", "eager"), ("gpt_neox", "sdpa"),
                                             ("gpt2", "sdpa"), ("gemma2", "eager")])
def test_packing_holds_for_other_architectures_and_attentions(arch, attention):
    """An own model is not Qwen2: each architecture reads the packed position ids through transformers' mask builder
    (GPT-2's learned positions too; Gemma 2's soft-capped logits take the logits path, not the fused head)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tiny(arch), attn_implementation=attention).eval()
    ids = torch.randint(1, 300, (6, 20))
    mask = torch.ones_like(ids)
    for b, (p, r) in enumerate([(8, 12), (5, 3), (8, 1), (2, 7), (6, 12), (3, 4)]):
        mask[b, :8 - p], mask[b, 8 + r:] = 0, 0
    real = mask[:, 8:].bool()
    with torch.no_grad():
        padded = forward_response(model, ids, mask, 12, 0.9, True, True)
        packed = forward_response(model, ids, mask, 12, 0.9, True, True, remove_padding=True)
    assert (padded.log_probs - packed.log_probs)[real].abs().max() <= ATOL
    assert (padded.entropy - packed.entropy)[real].abs().max() <= ATOL


def test_filler_slots_stay_within_a_learned_position_table(monkeypatch):
    """GPT-2 looks its positions up in a table of n_positions rows: a packed row may be longer than any sequence, so
    the filler that ends it must not carry a position past the longest sequence's."""
    import transformers
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(remove_padding, "PACKED_ROW_TOKENS", 30)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4,
                                                                     n_positions=24)).eval()
    ids = torch.randint(1, 300, (6, 20))
    mask = torch.ones_like(ids)
    for b, (p, r) in enumerate([(8, 12), (5, 3), (8, 1), (2, 7), (6, 12), (3, 4)]):
        mask[b, :8 - p], mask[b, 8 + r:] = 0, 0
    packed = pack_rows(ids, mask, 12)
    assert packed.input_ids.shape[1] > 24 > int(packed.position_ids.max())  # rows longer than the table, positions not
    with torch.no_grad():
        a = forward_response(model, ids, mask, 12, 1.0)
        b = forward_response(model, ids, mask, 12, 1.0, remove_padding=True)
    assert (a.log_probs - b.log_probs)[mask[:, 8:].bool()].abs().max() <= ATOL
