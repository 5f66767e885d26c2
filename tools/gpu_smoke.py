"""The GPU smoke run: the ``grpo_qwen_gpu`` preset for a few recorded steps on one GPU, with numbers to read.

    python tools/gpu_smoke.py [--model DIR] [--steps 3] [--engine auto|vllm|hf] [--out DIR] [--dry-run]

``--model``: a local model directory (e.g. Qwen2.5-0.5B-Instruct). Without it a Qwen2.5-0.5B-shaped model is
built from a config — 24 layers, hidden 896, 14 query / 2 KV heads, MLP 4864, tied embeddings and the real
151,936-token vocabulary — with random weights, next to the shipped tiny model's 29-token tokenizer. The
vocabulary is padded past the tokenizer, as Qwen2.5's own (151,936 rows for 151,665 tokens): the logits, the
log-prob and entropy memory and the LM-head cost are the real ones. The init makes the random model sample real
tokens, as a trained one does: every residual branch starts at zero (``o_proj`` and ``down_proj``; the layers still
run, at full cost), the padding rows of the tied embedding are zero (logit 0) and the real rows share one large
coordinate (a common logit of ~30) plus small noise, so each step draws nearly uniformly from the 29 real tokens
and never a padding id. Data are the shipped arithmetic prompts; the reward is the share of digits in a response
(it varies inside a group, so GRPO advantages are non-zero and the adapter really moves).

The engine: vLLM when it imports (``auto``), else the hf engine, saying so. Prints the command, then per-stage
seconds, peak GPU memory, and the rollout-vs-trainer log-prob gap of every step (``training/rollout_probs_diff_*``
from the recorded run). ``--dry-run`` builds only the model config and prints the command (no GPU, no weights).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "tiny-arith"
QWEN_VOCAB = 151936

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of digit characters in the response: varies inside a group even for a random model."""
    text = solution_str.strip()
    return sum(ch.isdigit() for ch in text) / max(1, len(text))
'''


def qwen_shape_config(tokenizer, vocab_size: int = QWEN_VOCAB):
    """Qwen2.5-0.5B-Instruct's architecture with ``tokenizer``'s special ids and a vocabulary of ``vocab_size``."""
    from transformers import Qwen2Config

    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=2048, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_model(out: Path, dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Save a random Qwen2.5-0.5B-shaped model plus the tiny tokenizer to ``out``; return a short description."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from ppolab.models import load_tokenizer

    tok = load_tokenizer(TINY)
    cfg = qwen_shape_config(tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # a sampler of real tokens (see the docstring): measured, real-token mass > 0.9999
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.get_input_embeddings().weight
        emb.zero_()
        emb[:len(tok)].normal_(0.0, 0.005)
        emb[:len(tok), 0] = 1.0
    model = model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": cfg.vocab_size,
            "tokenizer_tokens": len(tok), "dtype": dtype}


def choose_engine(requested: str) -> tuple[str, str]:
    """(engine, why): vllm when asked or importable, else hf with the reason."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    if requested == "vllm" and not has_vllm:
        raise SystemExit("--engine vllm but vllm is not installed: pip install -e '.[gpu]'")
    if requested == "hf":
        return "hf", "asked for"
    if has_vllm:
        return "vllm", "vllm is installed"
    return "hf", "vllm is not installed (pip install -e '.[gpu]'), falling back to the hf engine"


def overrides_for(model_dir: Path, work: Path, engine: str, steps: int, device: str) -> list[str]:
    """The preset's overrides: paths (a user must set them anyway), engine, device, length and a small batch."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files=[{ROOT / 'data/arith/train.parquet'}]",
        f"data.val_files=[{ROOT / 'data/arith/test.parquet'}]",
        "data.max_prompt_length=64", "data.max_response_length=64",
        "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        f"actor_rollout_ref.rollout.name={engine}",
        f"custom_reward_function.path={work / 'reward.py'}",
        f"trainer.device={device}", f"trainer.total_training_steps={steps}", "trainer.record_freq=1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1",
        "trainer.logger=[console,tensorboard]", f"trainer.run_dir={work / 'run'}",
    ]


def report(run_dir: Path) -> list[str]:
    """Per-stage seconds and the rollout/trainer gap per step, from the run's metrics (``Run.metrics``)."""
    from ppolab import load_run

    frame = load_run(run_dir).metrics
    if "training/rollout_probs_diff_max" not in frame:
        return []
    steps = frame[frame["training/rollout_probs_diff_max"].notna()]
    lines = [f"  {k:<30} {steps[k].mean():8.2f} s/step" for k in sorted(steps.columns)
             if k.startswith("timing_s/") and steps[k].notna().any()]
    for step, r in steps.iterrows():
        lines.append(f"  step {step}: rollout_probs_diff mean "
                     f"{r['training/rollout_probs_diff_mean']:.2e} max {r['training/rollout_probs_diff_max']:.2e}"
                     f"  score {r.get('critic/score/mean', float('nan')):.3f}  "
                     f"grad_norm {r.get('actor/grad_norm', float('nan')):.3g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a local model directory; default: build a Qwen2.5-0.5B-shaped random model")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(ROOT / "runs" / f"gpu-smoke-{time.strftime('%Y%m%d-%H%M%S')}"))
    ap.add_argument("--dry-run", action="store_true", help="print the model config and the command; run nothing")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for the preset")
    args = ap.parse_intermixed_args(argv)
    work = Path(args.out)
    engine, why = choose_engine(args.engine)
    model_dir = Path(args.model) if args.model else work / "model"
    overrides = overrides_for(model_dir, work, engine, args.steps, args.device) + list(args.overrides)
    command = "python -m ppolab.train --preset grpo_qwen_gpu " + " ".join(shlex.quote(o) for o in overrides)
    if args.model and not (model_dir / "config.json").is_file():
        raise SystemExit(f"--model {model_dir}: no config.json there (a local model directory is needed)")
    if args.dry_run:
        from ppolab.models import load_tokenizer

        if args.model:
            print(f"model: {model_dir} (local)")
        else:
            cfg = qwen_shape_config(load_tokenizer(TINY))
            print("model: Qwen2.5-0.5B shapes, random weights, built at run time: " + json.dumps(
                {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads", "intermediate_size",
                                              "tie_word_embeddings")}))
        from ppolab.train import resolve_config

        cfg = resolve_config("grpo_qwen_gpu", overrides)  # the overrides parse and validate (paths are not checked)
        print(f"engine: {engine} ({why})")
        print(f"config: valid; {cfg.trainer.total_training_steps} steps, "
              f"{cfg.data.train_batch_size} prompts x {cfg.actor_rollout_ref.rollout.n}, device {cfg.trainer.device}")
        print(f"command: {command}")
        return 0

    import torch

    import ppolab

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch; this is the GPU smoke run (try --dry-run)")
    work.mkdir(parents=True, exist_ok=True)
    (work / "reward.py").write_text(REWARD)
    print(f"engine: {engine} ({why})")
    if not args.model:
        start = time.perf_counter()
        built = build_model(model_dir)
        print(f"model: Qwen2.5-0.5B shapes, random weights, {built} ({time.perf_counter() - start:.0f} s to build)")
    print(f"command: {command}", flush=True)
    start = time.perf_counter()
    run = ppolab.train("grpo_qwen_gpu", overrides, progress=False)
    wall = time.perf_counter() - start
    print(f"{args.steps} steps in {wall:.0f} s (model load and engine start included); run dir {run.path}")
    for line in report(Path(run.path)):
        print(line)
    if torch.cuda.is_available():
        print(f"peak GPU memory (torch allocator, this process): {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB "
              f"allocated, {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved"
              + ("; vLLM's own pool (cumem, sleep mode) is not counted there" if engine == "vllm" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
