"""Ready for a real GPU, proven on a CPU (issue 18): device and backend choice per rank, log-probs at a real
vocabulary without full-size float32 copies, token budgets that count tokens as verl does (not padded slots),
sampling exactly as configured, the GPU smoke script and the CI workflow. Nothing here needs a GPU;
``.github/workflows/ci.yml`` runs the GPU side on a GPU runner."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppolab import distributed
from ppolab.config import ConfigError
from ppolab.algos import entropy_from_logits, logprobs_from_logits, scale_logits
from ppolab.algos.logprob import CHUNK_LOGITS, CHUNK_LOGITS_THRESHOLD, chunked_logprobs_entropy, top_k_top_p_filter

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "tiny-arith"
QWEN_VOCAB = 151936
sys.path.insert(0, str(ROOT / "bench"))


# ------------------------------------------------------------------------------------------------ 1. devices
@pytest.mark.parametrize("requested,local_rank,cuda,world,device,backend", [
    ("cpu", 0, True, 1, "cpu", "gloo"),
    ("auto", 0, False, 1, "cpu", "gloo"),
    ("auto", 0, True, 1, "cuda:0", "cpu:gloo,cuda:nccl"),
    ("auto", 1, True, 2, "cuda:1", "cpu:gloo,cuda:nccl"),  # today's bug: every rank on cuda:0 over gloo
    ("cuda", 3, True, 4, "cuda:3", "cpu:gloo,cuda:nccl"),
    ("cuda:1", 0, True, 1, "cuda:1", "cpu:gloo,cuda:nccl"),
])
def test_each_rank_gets_its_own_gpu_and_cuda_tensors_go_over_nccl(requested, local_rank, cuda, world, device,
                                                                   backend):
    got_device, got_backend = distributed.select_device(requested, local_rank, cuda, world)
    assert (str(got_device), got_backend) == (device, backend)


def test_impossible_device_requests_are_named():
    with pytest.raises(ConfigError, match="trainer.device=cuda but torch sees no CUDA"):
        distributed.select_device("cuda", 0, cuda_available=False)
    with pytest.raises(ValueError, match="every rank on one GPU"):
        distributed.select_device("cuda:0", 1, cuda_available=True, world_size=2)
    with pytest.raises(ValueError, match="trainer.device='gpu'"):
        distributed.select_device("gpu", 0, cuda_available=True)


def test_init_from_env_binds_the_rank_to_its_gpu_before_the_group_forms(monkeypatch):
    """torchrun's environment on a 2-GPU node, rank 1: the process group is formed with NCCL for CUDA tensors after
    cuda:1 became the current device (CUDA itself is stubbed: this is the decision, not the driver)."""
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    info = distributed.init_from_env("auto")
    assert calls == [("set_device", "cuda:1"), ("init", "cpu:gloo,cuda:nccl")]
    assert (info.rank, info.world_size, info.local_rank) == (1, 2, 1)


def test_the_device_a_run_asks_for_command_line_then_environment_then_file():
    env = {"PPOLAB_DEVICE": "cuda"}
    assert distributed.requested_device("cpu", [], env) == "cuda"  # a preset's cpu yields to the environment
    assert distributed.requested_device("cpu", ["trainer.device=cpu"], env) == "cpu"  # what the caller typed wins
    assert distributed.requested_device("auto", ["data.train_batch_size=4"], {}) == "auto"
    assert distributed.requested_device("cpu", [], {"PPOLAB_DEVICE": " "}) == "cpu"  # blank = unset
    with pytest.raises(ValueError, match="PPOLAB_DEVICE='gpu0'"):
        distributed.requested_device("cpu", [], {"PPOLAB_DEVICE": "gpu0"})


# ------------------------------------------------------------------------------ 2. log-probs at a real vocabulary
def tiny_qwen(vocab: int = QWEN_VOCAB, seed: int = 0):
    from logprob_memory import tiny_qwen as build  # bench/logprob_memory.py

    return build(vocab, seed=seed)


def test_chunked_log_probs_entropy_and_gradients_equal_the_plain_formulas():
    """A random Qwen2 with the real 151,936-token vocabulary: forward_response's chunked path gives the plain path's
    log-probs, entropy and Σπ² and the same gradients (in the model's weights and in the logits themselves), with a
    temperature per row and chunks that split rows (17 positions of 151,936 logits per chunk here)."""
    from ppolab.models import forward_response

    model = tiny_qwen()
    ids = torch.randint(0, QWEN_VOCAB, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # a left-padded prompt
    temperature = torch.tensor([1.0, 0.6, 1.3])
    weights = torch.randn(3, 24, generator=torch.Generator().manual_seed(1))  # arbitrary upstream gradients
    results = {}
    for chunked in (False, True):
        model.zero_grad()
        logits_grad = []
        hook = model.lm_head.register_full_backward_hook(lambda m, gi, go: logits_grad.append(go[0].clone()))
        out = forward_response(model, ids, mask, 24, temperature, True, True, want_sum_pi_squared=True,
                               chunked=chunked)
        ((out.log_probs * weights).sum() + (out.entropy * weights.flip(0)).sum()).backward()
        hook.remove()
        results[chunked] = (out.log_probs.detach(), out.entropy.detach(), out.sum_pi_squared,
                            logits_grad[0], model.model.layers[0].mlp.up_proj.weight.grad.clone())
    names = ("log_probs", "entropy", "sum_pi_squared", "d/dlogits", "d/dW")
    for name, plain, chunked in zip(names, results[False], results[True]):
        torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5, msg=name)
    assert results[True][3].abs().max() > 0 and results[True][4].abs().max() > 0  # gradients really flowed


def test_chunked_function_on_half_precision_logits_matches_the_plain_float32_path():
    logits = torch.randn(2, 9, 1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    labels = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(1))
    lp, ent, _ = chunked_logprobs_entropy(logits, labels, 0.7, chunk_logits=3000)  # 3 positions per chunk
    plain = scale_logits(logits[:, :-1].float(), 0.7)
    torch.testing.assert_close(lp, logprobs_from_logits(plain, labels), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, entropy_from_logits(plain), rtol=1e-5, atol=1e-5)


def run_memory_bench(chunked: str) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "logprob_memory.py"), "--chunked", chunked],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a real vocabulary's forward and backward (≈ 27 s): .ci/run runs it after the README command
def test_one_micro_batch_at_a_real_vocabulary_stays_within_two_logit_copies_and_four_chunks():
    """Peak memory of one micro-batch's log-prob + entropy forward and backward (4 rows × 65 positions × 151,936,
    a 151 MiB float32 logits tensor), measured as the rise of the peak RSS of a fresh process.

    Bound: 2 logit copies + 4 chunks + 48 MiB. The model's own float32 logits and their gradient are unavoidable
    without a fused LM-head kernel (2 copies); the chunked formulas add a few float32 chunks at a time (here a
    chunk is one row: 65 × 151,936 × 4 B = 38 MiB; the backward holds two, the forward three); 48 MiB covers
    the small rest (hidden states, allocator slack). The plain formulas keep several full-size float32 copies
    for backward and must exceed the same bound — the measurement tells the two apart."""
    chunked = run_memory_bench("on")
    logits = chunked["logits_mib"]
    chunk = min(chunked["positions"], CHUNK_LOGITS // QWEN_VOCAB) * QWEN_VOCAB * 4 / 2**20
    bound = 2 * logits + 4 * chunk + 48
    assert chunked["peak_mib"] <= bound, (chunked, bound)
    plain = run_memory_bench("off")  # the control: the plain formulas must land above the same bound
    assert plain["peak_mib"] > bound, (plain, bound)


@pytest.mark.slow  # three fresh processes at a real vocabulary (≈ 10 s)
def test_the_fused_head_makes_no_logits_at_a_real_vocabulary():
    """The same micro-batch through the fused LM head (log-probs and entropy from the hidden states over vocabulary
    chunks, ppolab/algos/fused_head.py): its peak stays under half of one float32 copy of the logits it never
    makes — the chunked logits path, which must hold the model's logits, lands above that."""
    fused = run_memory_bench("fused")
    assert fused["peak_mib"] < 0.5 * fused["logits_mib"], fused
    assert run_memory_bench("on")["peak_mib"] > 0.5 * fused["logits_mib"]


def test_the_shipped_runs_never_reach_the_chunked_path(monkeypatch):
    """Chunking starts above CHUNK_LOGITS_THRESHOLD logits. Every tiny preset's largest possible forward — the
    whole step batch at the longest response, on the 29-token model — stays far below it, so shipped runs keep the
    plain formulas bit for bit; forward_response on the shipped model indeed never calls the chunked function."""
    from ppolab.models import load_tokenizer
    from ppolab.roles import PolicyModels
    from ppolab.models import forward_response
    from ppolab.train import resolve_config

    for preset in ("grpo_tiny", "grpo_tool_tiny", "ppo_fire_tiny", "ppo_gae_tiny"):
        cfg = resolve_config(preset)
        vocab = len(load_tokenizer(cfg.actor_rollout_ref.model.path))
        rows = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        assert rows * (cfg.data.max_response_length + 1) * vocab < CHUNK_LOGITS_THRESHOLD / 10, preset

    import ppolab.models as model_module

    def refuse(*args, **kwargs):
        raise AssertionError("the chunked path ran on the tiny model")

    monkeypatch.setattr(model_module, "chunked_logprobs_entropy", refuse)
    models = PolicyModels(str(TINY), 0, 16, ["q_proj"], use_reference=False)
    ids = torch.randint(4, 20, (8, 30))
    out = forward_response(models.model, ids, torch.ones_like(ids), 16, 1.0, True, True)
    assert out.log_probs.shape == out.entropy.shape == (8, 16)


@pytest.mark.parametrize("lora_rank", [8, 0])
def test_gradient_checkpointing_recomputes_layers_and_keeps_the_gradients(lora_rank):
    """actor_rollout_ref.model.enable_gradient_checkpointing: each decoder layer runs again in backward
    (forward calls double) and the gradients of the trainable weights (the LoRA adapter, or every weight) are
    the same as without it."""
    from ppolab.roles import PolicyModels
    from ppolab.models import forward_response

    ids = torch.randint(4, 20, (4, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    grads, calls = {}, {}
    for ckpt in (False, True):
        models = PolicyModels(str(TINY), lora_rank, 16, ["q_proj", "v_proj"], seed=0, use_reference=False,
                              gradient_checkpointing=ckpt)
        if lora_rank:  # B starts at zero: move it so the adapter's A matrices get a gradient too
            with torch.no_grad():
                for name, p in models.model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
        mlp = next(m for n, m in models.model.named_modules() if n.endswith("layers.0.mlp"))
        # a module inside the checkpointed layer is entered again when backward replays the layer (a pre-hook:
        # the replay stops as soon as it has what backward needs, before the MLP's forward returns)
        count = [0]
        mlp.register_forward_pre_hook(lambda *a: count.__setitem__(0, count[0] + 1))
        with models.actor() as actor:
            out = forward_response(actor, ids, mask, 12, 1.0, True, True)
            (out.log_probs.sum() + out.entropy.sum()).backward()
        calls[ckpt] = count[0]
        grads[ckpt] = [p.grad.clone() for p in models.actor_parameters()]
    assert (calls[False], calls[True]) == (1, 2)
    assert len(grads[True]) == len(grads[False]) and any(g.abs().max() > 0 for g in grads[True])
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_the_config_field_is_verls_key_and_off_by_default():
    from ppolab.config.schema import ModelConfig

    assert ModelConfig().enable_gradient_checkpointing is False
    assert "enable_gradient_checkpointing" in ModelConfig.__dataclass_fields__


# ------------------------------------------------------------------- 3. token budgets count tokens, as verl's do
def test_a_padded_micro_batch_over_the_budget_is_not_cut_further():
    """verl's budget bounds the token sum (it removes padding). Four rows whose sum (66) fits a 70-token budget are
    one micro-batch there; ppolab pads them to the longest prompt (30) and response (30), 4 × 60 = 240 slots, and
    still runs them as one micro-batch (the count, the partitions and the per-micro-batch metrics stay verl's): the
    forward bounds its memory inside the micro-batch."""
    from types import SimpleNamespace

    from ppolab.batching import plan_dynamic_micro_batches
    from ppolab.update_plan import micro_batches

    p_lens, r_lens = [1, 1, 1, 30], [30, 1, 1, 1]
    lens = [a + b for a, b in zip(p_lens, r_lens)]
    assert plan_dynamic_micro_batches(lens, 70) == [[0, 1, 2, 3]]
    batch = SimpleNamespace(__len__=lambda: 4, lengths=lambda: (p_lens, r_lens))
    assert micro_batches(batch, None, 70, dp_lengths=[(p_lens, r_lens)]) == [[0, 1, 2, 3]]


def test_the_critic_engine_cuts_verls_count_at_the_smallest_budget():
    """Exercise 12.5's case (ppo_fire_tiny, step 1, rank 0's first critic mini-batch: 8 rows, 181 tokens) at a
    48-token budget: verl 0.9.1's rearrange_micro_batches cuts 4 micro-batches (ceil(181 / 48) = 4, and the KK
    partitions fit); a planner that also bounded the padded size cut 6."""
    from ppolab.exercises.lab12 import critic_budget_case
    from ppolab.numbers.critic_engine import critic_micro_batches

    case = critic_budget_case("ppo_fire_tiny")
    assert (case["rows"], case["tokens"], case["budget"]) == (8, 181, 48)
    parts = critic_micro_batches("ppo_fire_tiny", update=0, rank=0, step=1, max_token_len=48)
    assert len(parts) == 4
    assert sorted(i for p in parts for i in p) == list(range(8))


# ----------------------------------------------------------------------- 4. sampling is what the config says
@pytest.fixture(scope="module")
def opinionated_model(tmp_path_factory):
    """A random tiny Qwen2 (the shipped tokenizer) whose generation_config.json is full of opinions."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from ppolab.models import load_tokenizer, tiny_qwen2_config

    out = tmp_path_factory.mktemp("opinionated")
    tok = load_tokenizer(TINY)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen2_config(tok, hidden=32, layers=1, heads=2))
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0, 0.05)  # greedy repeats a token; a draw is rarely the argmax
    model.generation_config = GenerationConfig(  # as real checkpoints ship them (Qwen2.5: top_k 20, penalty 1.05)
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=True,
        top_k=1, top_p=0.5, repetition_penalty=100.0, no_repeat_ngram_size=1, min_new_tokens=12, temperature=0.3)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def teacher_forced_logits(model, out):
    from ppolab.models import position_ids_from_mask

    ids = torch.cat([out.prompts, out.responses], 1)
    mask = torch.cat([out.prompt_mask, out.response_mask.long()], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    return logits[:, out.prompts.shape[1] - 1:-1]


def test_the_hf_engine_ignores_the_models_generation_config(opinionated_model):
    """top_k=1, repetition_penalty=100, no_repeat_ngram_size=1, min_new_tokens=12 in the checkpoint's
    generation_config: plain ``generate`` obeys them (the control), the rollout engine does not — its greedy answer
    is the argmax of every teacher-forced step, its samples are not, and it stops at EOS before 12 tokens."""
    from ppolab.roles import PolicyModels
    from ppolab.rollout import HFRollout, SamplingParams

    models = PolicyModels(str(opinionated_model), 0, 16, ["q_proj"], use_reference=False)
    engine = HFRollout(models)
    prompts = [[2, 5, 9, 10, 6], [2, 5, 11, 12, 13, 6]]
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="min_new_tokens"):  # the checkpoint's min_new_tokens=12 applies here
        control = models.model.generate(input_ids=torch.tensor([prompts[0]]), do_sample=True, max_new_tokens=10)
    assert len(set(control[0, len(prompts[0]):].tolist())) == 10  # no_repeat_ngram / penalty bit: no repeats

    greedy = engine.generate(prompts, 1, SamplingParams(do_sample=False), 16)
    m = greedy.response_mask.bool()
    assert torch.equal(teacher_forced_logits(models.model, greedy).argmax(-1)[m], greedy.responses[m])
    assert len(set(greedy.responses[0][m[0]].tolist())) < int(m[0].sum())  # it repeats: no penalty applied

    torch.manual_seed(0)
    sampled = engine.generate(prompts, 16, SamplingParams(temperature=1.0), 16)
    m = sampled.response_mask.bool()
    argmax = teacher_forced_logits(models.model, sampled).argmax(-1)
    assert (argmax[m] != sampled.responses[m]).float().mean() > 0.2  # top_k=1 would make this 0
    assert int(sampled.response_mask.sum(-1).min()) < 12  # min_new_tokens=12 would forbid an earlier EOS


def test_the_filter_is_hugging_faces_top_k_then_top_p():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 3
    for k, p in [(5, 1.0), (-1, 0.8), (10, 0.7), (0, 0.3), (50, 0.95)]:
        expected = logits
        if k > 0:
            expected = TopKLogitsWarper(k)(None, expected)
        if p < 1:
            expected = TopPLogitsWarper(p)(None, expected)
        assert torch.equal(torch.isinf(top_k_top_p_filter(logits, k, p)), torch.isinf(expected)), (k, p)


def test_with_top_p_and_top_k_rollout_log_probs_are_the_filtered_ones_and_the_trainer_sees_the_gap():
    """rollout.top_p=0.7, top_k=6: the engine's log-probs are those of the filtered distribution it sampled from
    (vLLM's processed_logprobs); the trainer recomputes on the full distribution, as verl does. On every token
    rollout − trainer = −log(kept probability mass) ≥ 0 — zero where the filter kept (almost) everything, large
    where it cut a flat distribution. rollout_is sees this gap; it is a sampling choice, not an engine bug."""
    from ppolab.roles import PolicyModels
    from ppolab.models import forward_response
    from ppolab.rollout import HFRollout, SamplingParams

    models = PolicyModels(str(TINY), 0, 16, ["q_proj"], use_reference=False)
    torch.manual_seed(0)
    out = HFRollout(models).generate([[2, 5, 9, 10, 6], [2, 5, 11, 12, 13, 6]], 8,
                                     SamplingParams(temperature=1.2, top_p=0.7, top_k=6), 12)
    ids = torch.cat([out.prompts, out.responses], 1)
    mask = torch.cat([out.prompt_mask, out.response_mask.long()], 1)
    m = out.response_mask.bool()
    with torch.no_grad():
        trainer = forward_response(models.model, ids, mask, out.responses.shape[1], 1.2).log_probs
        z = scale_logits(teacher_forced_logits(models.model, out), 1.2)
    kept = torch.softmax(z, -1).masked_fill(torch.isinf(top_k_top_p_filter(z, 6, 0.7)), 0).sum(-1)
    gap = out.rollout_log_probs - trainer
    torch.testing.assert_close(gap[m], -torch.log(kept)[m], rtol=1e-4, atol=1e-5)
    assert gap[m].min() > -1e-5 and gap[m].max() > 0.01  # fp32 rounding alone is ~1e-6
    assert torch.isfinite(out.rollout_log_probs[m]).all()  # every sampled token was inside the filter


# ------------------------------------------------------------------------------ 5. the gpu extra, the smoke script
def test_the_gpu_extra_installs_what_the_gpu_preset_uses_and_pins_vllm_to_the_engines_range():
    import tomllib

    from ppolab.rollout.vllm import SUPPORTED_VLLM

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in extras["gpu"]}
    assert gpu["vllm"] == f"vllm{SUPPORTED_VLLM}"
    assert "tensorboard" in gpu  # grpo_qwen_gpu logs to [console, tensorboard]
    from ppolab.train import resolve_config

    assert "tensorboard" in resolve_config("grpo_qwen_gpu").trainer.logger


def test_gpu_smoke_dry_run_builds_the_config_and_prints_the_command(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "tools" / "gpu_smoke.sh"), "--dry-run", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in out.stdout.splitlines() if ":" in line}
    model = json.loads(lines["model"].split("built at run time: ", 1)[1])
    assert model["vocab_size"] == QWEN_VOCAB and model["num_hidden_layers"] == 24 and model["hidden_size"] == 896
    assert lines["config"].strip().startswith("valid; 3 steps")
    command = shlex.split(lines["command"])
    assert command[:5] == ["python", "-m", "ppolab.train", "--preset", "grpo_qwen_gpu"]
    assert f"actor_rollout_ref.model.path={tmp_path / 'model'}" in command
    assert "trainer.total_training_steps=3" in command and "trainer.device=cuda" in command
    assert not (tmp_path / "model").exists()  # a dry run builds no weights


def test_gpu_smoke_refuses_a_model_dir_without_a_config(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_smoke.py"), "--dry-run", "--model",
                          str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0 and "no config.json" in out.stderr


# ------------------------------------------------------------------------------------------ 6. the CI workflow
def workflow() -> dict:
    import yaml

    return yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())


def test_every_script_and_path_the_workflow_runs_exists():
    """Every ``run:`` line of every job: each word that names a repository file or folder (a path with a slash,
    or a .sh/.py/.ipynb file) exists; each ``pip install -e ".[a,b]"`` names extras pyproject defines; a
    ``pytest`` target exists."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    made_here = {".venv", ".venv-gpu", "runs"}  # created by the workflow itself
    checked = 0
    for job in workflow()["jobs"].values():
        for step in job["steps"]:
            for line in step.get("run", "").splitlines():
                for word in shlex.split(line):
                    word = word.split("=", 1)[1] if word.startswith("PYTHON=") else word
                    if match := re.fullmatch(r"\.?\[([\w,-]+)\]", word.lstrip("-e").strip()):
                        assert set(match.group(1).split(",")) <= extras, word
                        continue
                    if word.startswith("-") or "://" in word or "=" in word:
                        continue
                    looks_like_path = "/" in word or word.endswith((".sh", ".py", ".ipynb")) or word in (
                        "labs", "tests")
                    if not looks_like_path or word.split("/")[0] in made_here:
                        continue
                    assert (ROOT / word).exists(), f"{word!r} in {line!r}"
                    checked += 1
    assert checked >= 5  # .ci/run, tools/gpu_smoke.sh, two test files, labs


def test_the_gpu_job_runs_the_smoke_script_and_the_labs_on_cuda():
    jobs = workflow()["jobs"]
    assert any("bash .ci/run" in s.get("run", "") for s in jobs["cpu"]["steps"])
    gpu = jobs["gpu"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"])
    assert gpu["env"]["PPOLAB_DEVICE"] == "cuda"
    runs = "\n".join(s.get("run", "") for s in gpu["steps"])
    assert '.[gpu,dev]' in runs and "tools/gpu_smoke.sh" in runs and re.search(r"pytest .*\blabs\b", runs)
