"""ppolab's account of how TRL and OpenRLHF aggregate one batch (ppolab/numbers/three_trainers.py) against their own
installed code: TRL 1.16's ``GRPOTrainer._compute_loss`` and OpenRLHF 0.11.2's ``aggregate_loss`` with
``_optimizer_step_loss_norm``. Run by .ci/run's "other trainers" phase in a venv holding both (TRL with its
dependencies; OpenRLHF without them — its DeepSpeed, Ray and flash-attn do not install on a CPU machine, and the two
files read here import none of them); skipped where they are not installed.

Each side gives the weight of every token in the optimizer step's gradient: the test differentiates the trainer's
micro-batch losses with respect to the token log-probs (at ratio 1, advantage −1, so ∂loss/∂log π is the weight),
sums a rank's micro-batches, averages the ranks, and compares with :func:`three_trainers.token_weights`.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from ppolab.numbers import three_trainers as tt

SPLITS = [tt.Split(8), tt.Split(1), tt.Split(2), tt.Split(4, 2), tt.Split(1, 4), tt.Split(2, 2)]
MAX_LENGTH = 7


def _mask() -> torch.Tensor:
    """8 rows of 7 slots, ragged, one row with no loss token and one with a hole (a tool's tokens)."""
    lengths = [7, 1, 3, 0, 5, 2, 6, 4]
    m = torch.zeros(8, 7, dtype=torch.float64)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    m[6, 2] = 0
    return m


# ------------------------------------------------------------------------------------------------------------ TRL
class _Accelerator:
    def __init__(self, ranks):
        self.num_processes = ranks
        self.sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _trl_weights(loss_type: str, mask: torch.Tensor, split: tt.Split, steps_per_generation: int | None):
    from trl import GRPOTrainer

    rows = mask.shape[0]
    acc = split.accumulation(rows)
    spg = steps_per_generation or acc
    logps = torch.zeros_like(mask, requires_grad=True)
    total = logps.new_zeros(())
    for rank in tt.micro_batches(rows, split):
        for r in rank:
            mb = mask[r.start:r.stop]
            on = mb.nonzero()
            width = int(on[:, 1].max()) + 1 if len(on) else 1
            trainer = object.__new__(GRPOTrainer)
            trainer.__dict__.update(
                loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.2, beta=0.0, top_entropy_quantile=1.0,
                off_policy_mask_threshold=None, importance_sampling_level="token", use_vllm=False,
                vllm_importance_sampling_correction=False, aux_loss_enabled=False, _entropy_bonus_enabled=False,
                current_gradient_accumulation_steps=acc, accelerator=_Accelerator(split.ranks),
                args=SimpleNamespace(delta=None, steps_per_generation=spg, use_bias_correction_kl=False),
                model=SimpleNamespace(training=True), max_completion_length=MAX_LENGTH,
                _metrics=defaultdict(lambda: defaultdict(list)))
            lp = logps[r.start:r.stop, :width]
            trainer._get_per_token_logps_and_entropies = lambda *a, lp=lp, **k: (lp, torch.zeros_like(lp), None)
            n = r.stop - r.start
            inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1),
                      "completion_ids": torch.zeros(n, width, dtype=torch.long), "completion_mask": mb[:, :width],
                      "advantages": -torch.ones(n, dtype=torch.float64),
                      # every process's completion tokens of the generation batch (spg micro-steps)
                      "num_items_in_batch": torch.tensor(float(mask.sum()) * spg / acc)}
            total = total + trainer._compute_loss(trainer.model, inputs)
    (total / split.ranks).backward()  # DDP averages the ranks' gradients
    return logps.grad * mask


@pytest.mark.parametrize("loss_type", sorted(tt.TRL_RULES))
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"micro{s.micro}-ranks{s.ranks}")
def test_trl_weights_are_what_grpo_trainer_computes(loss_type, split):
    pytest.importorskip("trl")
    from trl import GRPOTrainer

    # the Trainer divides by nothing more: GRPOTrainer scales for accumulation itself
    assert GRPOTrainer.loss_is_scaled_for_ga is True
    mask = _mask()
    ours = tt.token_weights(mask, tt.TRL_RULES[loss_type], split, MAX_LENGTH)
    theirs = _trl_weights(loss_type, mask, split, None)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("spg", [1, 2, 8])
def test_trl_dapo_with_another_steps_per_generation(spg):
    """#6024's setting: the generation batch spans steps_per_generation micro-steps, not the accumulation's."""
    pytest.importorskip("trl")
    mask, split = _mask(), tt.Split(2)  # accumulation 4
    ours = tt.token_weights(mask, tt.TRL_RULES["dapo"], split, MAX_LENGTH, steps_per_generation=spg)
    torch.testing.assert_close(ours, _trl_weights("dapo", mask, split, spg), rtol=1e-12, atol=1e-15)
    before = tt.token_weights(mask, tt.TRL_DAPO_BEFORE_6024, split, MAX_LENGTH, steps_per_generation=spg)
    # the PR's account of the bug: off by gradient_accumulation_steps / steps_per_generation
    torch.testing.assert_close(before, ours * (4 / spg), rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------------------------------------- OpenRLHF
def _openrlhf():
    """OpenRLHF's two files, imported without its package __init__ (which imports DeepSpeed and Ray)."""
    if "openrlhf" not in sys.modules:
        spec = importlib.util.find_spec("openrlhf")
        if spec is None:
            pytest.skip("OpenRLHF is not installed (.ci/run's other-trainers venv installs it without dependencies)")
        root = spec.submodule_search_locations[0]
        for name, sub in (("openrlhf", ""), ("openrlhf.models", "/models"), ("openrlhf.utils", "/utils")):
            pkg = types.ModuleType(name)
            pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            pkg.__path__ = pkg.__spec__.submodule_search_locations = [root + sub]
            sys.modules[name] = pkg
    stub = "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None
    if stub:  # models/utils.py imports DeepSpeed at the top; what is read here never calls it
        sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    try:
        return importlib.import_module("openrlhf.models.loss"), importlib.import_module("openrlhf.utils.loss_utils")
    finally:
        if stub:  # nothing after this test may take DeepSpeed for installed
            del sys.modules["deepspeed"]


@pytest.mark.parametrize("token_level", [True, False], ids=["token", "sample"])
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"micro{s.micro}-ranks{s.ranks}")
def test_openrlhf_weights_are_what_aggregate_loss_computes(token_level, split):
    loss_mod, utils = _openrlhf()
    mask = _mask()
    rows = mask.shape[0]
    acc = split.accumulation(rows)
    losses = torch.zeros_like(mask, requires_grad=True)
    ranks = tt.micro_batches(rows, split)
    # one optimizer step's window: every rank's micro-batches (the all-reduce over ranks, summed here)
    info = utils._optimizer_step_loss_norm([mask[r.start:r.stop] for rank in ranks for r in rank], None,
                                          split.ranks, acc)
    total = losses.new_zeros(())
    for rank in ranks:
        for r in rank:
            mb = mask[r.start:r.stop]
            on = mb.nonzero()
            width = int(on[:, 1].max()) + 1 if len(on) else 1
            loss = loss_mod.aggregate_loss(losses[r.start:r.stop, :width], mb[:, :width], token_level_loss=token_level,
                                           **info)
            total = total + loss / acc  # DeepSpeed scales each backward by 1 / gradient accumulation steps
    (total / split.ranks).backward()  # and averages the data-parallel ranks
    rule = tt.OPENRLHF_RULES["token" if token_level else "sample"]
    torch.testing.assert_close(tt.token_weights(mask, rule, split, MAX_LENGTH), losses.grad * mask,
                               rtol=1e-6, atol=1e-12)  # OpenRLHF counts in float32


def test_verl_token_mean_is_invariant_and_trl_bnpo_is_not():
    """The lab's claim, on the mask above: verl's token-mean weighs every token 1/N under every split; TRL's bnpo
    with one row a micro-batch weighs a row's tokens N / (its tokens × accumulation) times as much."""
    mask = _mask()
    for split in SPLITS:
        f = tt.split_factors(mask, tt.verl_rule("token-mean"), split, MAX_LENGTH)
        torch.testing.assert_close(f, torch.ones_like(f))
    v = tt.versus_token_mean(mask, tt.TRL_RULES["bnpo"], tt.Split(1), MAX_LENGTH)
    lengths = mask.sum(-1)
    expected = torch.cat([torch.full((int(n),), float(mask.sum()) / (float(n) * 8), dtype=torch.float64)
                          for n in lengths if n > 0])
    torch.testing.assert_close(v, expected)
