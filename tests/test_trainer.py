"""The trainer end to end on the shipped tiny model (CPU, seconds each): issue 4's acceptance tests."""
import copy
import dataclasses
import json

import pytest
import torch

import ppolab
from ppolab.config import ConfigError
from ppolab.models import load_tokenizer_and_model
from ppolab.models import forward_response
from ppolab.train import resolve_config
from ppolab.trainer import PPOTrainer
from ppolab.worker import ActorWorker

from helpers import logged, stable

# 4 prompts × 4 answers = 16 rows; one mini-batch of all 16 rows, one epoch, micro-batches of 4.
SMALL = [
    "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.ppo_epochs=1",
    "data.val_max_samples=16", "trainer.test_freq=2", "trainer.record_freq=1",
]


def prepared(overrides=(), preset="grpo_tiny"):
    """A trainer and a batch that went through stages 1–7 (everything before the updates)."""
    t = PPOTrainer(resolve_config(preset, [*SMALL, *overrides]))
    batch = t.compute_reward(t.generate_sequences(t.next_prompts()))
    batch, _ = t.balance_batch(batch)
    batch, _ = t.compute_old_log_prob(batch)
    if t.use_ref:
        batch = t.compute_ref_log_prob(batch)
    if t.use_critic:
        batch = t.compute_values(batch)
    batch, _ = t.compute_advantage(batch)
    return t, batch


# ====================================================================== micro-batch invariance
@pytest.fixture(scope="module")
def grpo():
    return prepared()


@pytest.mark.parametrize("mode, scale", [("token-mean", None), ("seq-mean-token-mean", None),
                                         ("seq-mean-token-sum-norm", 16.0)])
def test_one_update_gives_the_same_lora_weights_for_any_micro_batching(grpo, mode, scale):
    t, batch = grpo
    a = t.config.actor_rollout_ref.actor
    params = t.models.actor_parameters()
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(p.shape, generator=g) * 0.05 for p in params]  # B ≠ 0, so A gets gradient too
    original = [p.detach().clone() for p in params]
    results = {}
    try:
        for name, dynamic, micro in (("micro=1", False, 1), ("micro=mini", False, 16), ("dynamic", True, None)):
            with torch.no_grad():
                for p, s in zip(params, start):
                    p.copy_(s)
            # A changed copy of the actor config (~2 sequences per dynamic micro-batch); the trainer's stays as is.
            cfg = dataclasses.replace(a, loss_agg_mode=mode, loss_scale_factor=scale, use_dynamic_bsz=dynamic,
                                      ppo_micro_batch_size_per_gpu=micro, ppo_max_token_len_per_gpu=60)
            # SGD, not Adam: Adam's first step is ~sign(g), which would magnify float noise on tiny gradients.
            worker = ActorWorker(cfg, t.models, temperature=t.actor.temperature, rollout_n=t.actor.rollout_n,
                                 optimizer=torch.optim.SGD(params, lr=1.0))
            metrics, histories, _ = worker.update(batch)
            assert histories["actor_log_probs"].shape[0] == 1  # one mini-batch, one epoch: one optimizer step
            results[name] = [p.detach().clone() for p in params]
    finally:
        with torch.no_grad():
            for p, o in zip(params, original):
                p.copy_(o)
    assert t.config.actor_rollout_ref.actor == a  # nothing was written into the trainer's config
    moved = max(float((w - s).abs().max()) for w, s in zip(results["micro=1"], start))
    assert moved > 1e-3  # the update did something
    for name in ("micro=mini", "dynamic"):
        for w, ref in zip(results[name], results["micro=1"]):
            torch.testing.assert_close(w, ref, atol=1e-5, rtol=0)


# ====================================================================== old / ref log-probs
def test_bypass_mode_copies_the_rollout_log_probs():
    t, batch = prepared(["algorithm.rollout_correction.bypass_mode=true"])
    assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])


def test_first_ratio_is_one_and_comes_from_the_recomputed_old_log_probs(grpo):
    t, batch = grpo
    batch = copy.deepcopy(batch)
    mask = batch["response_mask"].bool()
    # Spoil the engine's log-probs: decoupled mode must not use them for the ratio.
    batch["rollout_log_probs"] = batch["rollout_log_probs"] - 0.7 * mask
    batch, _ = t.compute_old_log_prob(batch)
    assert (batch["old_log_probs"] - batch["rollout_log_probs"])[mask].abs().max() > 0.5
    state = [p.detach().clone() for p in t.models.actor_parameters()]
    opt_state = copy.deepcopy(t.actor.optimizer.state_dict())
    metrics, histories, _ = t.update_actor(batch)
    with torch.no_grad():
        for p, s in zip(t.models.actor_parameters(), state):
            p.copy_(s)
    t.actor.optimizer.load_state_dict(opt_state)
    # The log-probs the first (and only) optimizer step saw equal old_log_probs: ratio exp(0) = 1.
    first = histories["actor_log_probs"][0]
    torch.testing.assert_close(first[mask], batch["old_log_probs"][mask], atol=1e-5, rtol=0)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_reference_log_probs_are_the_base_models():
    t, batch = prepared()
    for _ in range(2):  # move the actor away from the base
        t.update_actor(batch)
    batch = t.compute_ref_log_prob(t.compute_old_log_prob(batch)[0])
    mask = batch["response_mask"].bool()
    assert (batch["old_log_probs"] - batch["ref_log_prob"])[mask].abs().max() > 1e-3
    _, base = load_tokenizer_and_model(t.config.actor_rollout_ref.model.path, "float32", "cpu")
    ids = torch.cat([batch["prompts"], batch["responses"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["response_mask"].long()], 1)
    with torch.no_grad():
        lp = forward_response(base, ids, attn, batch["responses"].shape[1],
                              t.config.actor_rollout_ref.rollout.temperature).log_probs
    torch.testing.assert_close(batch["ref_log_prob"][mask], lp[mask], atol=1e-5, rtol=0)


def test_response_masks_exclude_padding(grpo):
    t, batch = grpo
    eos, pad = t.tokenizer.eos_token_id, t.tokenizer.pad_token_id
    real = ~batch["is_pad"]
    for resp, mask in zip(batch["responses"][real], batch["response_mask"][real]):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # one contiguous run from the start
        tokens = resp.tolist()
        if eos in tokens:
            assert n == tokens.index(eos) + 1  # up to and including the first EOS
        else:
            assert n == len(tokens)  # cut by max_response_length
        assert all(tok == pad for tok in tokens[n:])
    assert torch.equal(batch["loss_mask"], batch["response_mask"])
    assert (batch["rollout_log_probs"][batch["response_mask"] == 0] == 0).all()


def test_scores_sit_on_the_last_valid_token(grpo):
    _, batch = grpo
    scores = batch["token_level_scores"]
    last = batch["response_mask"].sum(-1).long() - 1
    off_last = scores.clone()
    off_last[torch.arange(len(scores)), last] = 0
    assert (off_last == 0).all()


def test_padding_samples_fill_the_batch_and_carry_no_loss(grpo):
    t, _ = grpo
    # 13 rows (as if 3 had been filtered out) do not divide into mini-batches of 4 × 4 = 16 rows:
    # balance_batch adds 3 padding samples (facts §9.3) with response_mask 0 in a group of their own.
    batch = t.compute_reward(t.generate_sequences(t.next_prompts())).select(range(13))
    batch, _ = t.balance_batch(batch)
    assert len(batch) == 16 and int(batch["is_pad"].sum()) == 3
    batch, _ = t.compute_old_log_prob(batch)
    batch, _ = t.compute_advantage(t.compute_ref_log_prob(batch))
    pad = batch["is_pad"]
    assert (batch["response_mask"][pad] == 0).all() and (batch["advantages"][pad] == 0).all()
    assert not set(batch["uid"][pad].tolist()) & set(batch["uid"][~pad].tolist())
    assert torch.isfinite(batch["advantages"]).all()


# ====================================================================== every trainable tensor learns
def test_every_trainable_tensor_of_actor_and_critic_gets_updated():
    t, batch = prepared(preset="ppo_gae_tiny", overrides=["actor_rollout_ref.rollout.n=1",
                                                          "data.train_batch_size=16",
                                                          "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                                                          "critic.ppo_mini_batch_size=16"])
    for role, params, update in (("critic", t.models.critic_parameters(), t.update_critic),
                                 ("actor", t.models.actor_parameters(), t.update_actor)):
        before = [p.detach().clone() for p in params]
        _, histories, _ = update(batch)
        history = histories["actor_log_probs" if role == "actor" else "critic_vpreds"]
        assert history.shape[0] >= 1 and history.shape[1:] == batch["responses"].shape
        frozen = [i for i, (p, b) in enumerate(zip(params, before)) if torch.equal(p, b)]
        assert not frozen, f"{role}: {len(frozen)} of {len(params)} trainable tensors never changed"


# ====================================================================== whole runs
def test_train_records_a_loadable_run(tmp_path):
    seen = []
    run = ppolab.train("grpo_tiny", [*SMALL, "trainer.total_training_steps=2", f"trainer.run_dir={tmp_path}"],
                       on_step=lambda step, metrics, record: seen.append((step, record)), progress=False)
    assert [s for s, _ in seen] == [0, 1, 2] and seen[0][1] is None  # step 0: the validation before training
    assert all(r is not None for _, r in seen[1:])
    assert run.path == tmp_path and run.steps == [1, 2]
    loaded = ppolab.load_run(tmp_path)
    assert loaded.steps == [1, 2] and list(loaded.metrics.index) == [0, 1, 2]
    rec = loaded.step(2)
    for key in ("prompts", "responses", "response_mask", "loss_mask", "rollout_log_probs", "old_log_probs",
                "ref_log_prob", "token_level_scores", "token_level_rewards", "advantages", "returns", "entropy",
                "uid", "actor_log_probs"):
        assert key in rec.tensors, key
    n, r = rec["responses"].shape
    assert rec["actor_log_probs"].shape == (1, n, r)
    assert len(rec.texts["responses"]) == n
    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy",
                 "actor/kl_loss", "actor/kl_coef", "actor/grad_norm", "actor/lr", "critic/score/mean",
                 "critic/advantages/max", "response_length/clip_ratio", "timing_s/gen", "timing_s/update_actor",
                 "perf/throughput", "val/accuracy"):
        assert name in loaded.metrics.columns, name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["config"]["algorithm"]["adv_estimator"] == "grpo" and "versions" in config
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.pkl"))


def test_same_seed_same_metrics(tmp_path):
    runs = [ppolab.train("grpo_tiny", [*SMALL, "trainer.total_training_steps=2", f"trainer.run_dir={tmp_path / s}"],
                         progress=False) for s in "ab"]
    a, b = ([stable(m) for m in logged(r)] for r in runs)
    assert a == b


def test_resume_continues_exactly(tmp_path):
    base = [*SMALL, "trainer.test_freq=-1", "trainer.save_freq=2"]
    full = ppolab.train("grpo_tiny", [*base, "trainer.total_training_steps=4", f"trainer.run_dir={tmp_path / 'full'}"],
                        progress=False)
    part = tmp_path / "part"
    ppolab.train("grpo_tiny", [*base, "trainer.total_training_steps=2", f"trainer.run_dir={part}"], progress=False)
    resumed = ppolab.train("grpo_tiny", [*base, "trainer.total_training_steps=4", f"trainer.run_dir={part}",
                                         "trainer.resume=true"], progress=False)
    a = [stable(m) for m in logged(full)]
    b = [stable(m) for m in logged(resumed)]
    assert len(a) == len(b) == 5
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-7), k


def test_keyboard_interrupt_leaves_a_loadable_run(tmp_path):
    def stop(step, metrics, record):
        if step == 2:
            raise KeyboardInterrupt

    from ppolab.errors import TrainingInterrupted

    with pytest.raises(TrainingInterrupted) as e:  # a KeyboardInterrupt: a loop of runs stops
        ppolab.train("grpo_tiny", [*SMALL, "trainer.total_training_steps=5", f"trainer.run_dir={tmp_path}"],
                     on_step=stop, progress=False)
    assert isinstance(e.value, KeyboardInterrupt) and str(tmp_path) in str(e.value)
    run = e.value.run
    loaded = ppolab.load_run(tmp_path)
    assert loaded.summary["interrupted_at_step"] == 2 and loaded.steps == [1, 2]
    assert list(run.metrics.index) == [0, 1, 2]


def test_config_errors_come_before_any_model_loads(tmp_path):
    missing = f"actor_rollout_ref.model.path={tmp_path / 'no-model'}"
    for bad in (["actor_rollout_ref.actor.loss_agg_mode=token-avg"], ["algorithm.adv_estimator=grpo",
                                                                      "actor_rollout_ref.rollout.n=1"],
                ["actor_rollout_ref.actor.ppo_mini_batch_size=3"], ["actor_rollout_ref.actor.clip_ratoi=0.1"]):
        with pytest.raises(ConfigError):  # not FileNotFoundError: the model path is never reached
            ppolab.train("grpo_tiny", [missing, *bad], progress=False)
    with pytest.raises(FileNotFoundError, match="tiny-arith"):
        ppolab.train("grpo_tiny", [missing], progress=False)


def test_cli_reports_config_errors_with_exit_code_2(capsys):
    from ppolab.train import main

    assert main(["actor_rollout_ref.actor.kl_loss_type=k9"]) == 2
    assert "kl_loss_type" in capsys.readouterr().err


def test_full_fine_tuning_uses_a_frozen_reference_copy_and_a_separate_critic():
    t, batch = prepared(preset="ppo_gae_tiny", overrides=[
        "actor_rollout_ref.model.lora_rank=0", "actor_rollout_ref.rollout.n=1", "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "critic.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.optim.lr=1e-4"])
    models = t.models
    assert not models.lora and models.ref_model is not models.model and models.critic_model is not models.model
    n_base = sum(p.numel() for p in models.ref_model.parameters())
    assert sum(p.numel() for p in models.actor_parameters()) == n_base  # every weight trains
    assert not any(p.requires_grad for p in models.ref_model.parameters())
    ref_before = batch["ref_log_prob"].clone()
    t.update_critic(batch)
    t.update_actor(batch)
    batch = t.compute_ref_log_prob(t.compute_old_log_prob(batch)[0])
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(batch["ref_log_prob"], ref_before, atol=1e-6, rtol=0)  # the copy stayed frozen
    assert (batch["old_log_probs"] - batch["ref_log_prob"])[mask].abs().max() > 1e-4  # the actor moved
