"""ppolab against TRL's GRPOTrainer on the main job's task, side by side: completions per second and accuracy.

    python bench/trl_side_by_side.py [--budget 30] [--seeds 1 2] [--threads 2]

Needs TRL, which ppolab never depends on: run it from a venv that has both, e.g.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 -e . trl
    .venv-trl/bin/python bench/trl_side_by_side.py

The same task on both sides: the shipped tiny model (data/models/tiny-arith), the arithmetic prompts of
data/arith/train.parquet in the same order, ppolab's rule reward (``ppolab.rewards.compute_score``), a LoRA adapter of
rank 8 / alpha 16 on the same seven projections, GRPO with 8 responses a prompt and 16 prompts a generation (128
completions), temperature 1.0, responses up to 16 tokens, AdamW lr 3e-4 with weight decay 0.01 and clip 1.0, two
passes over each generation in mini-batches of 64 completions (4 optimizer steps), the k3 KL loss at 0.001 and ε 0.2
— ``grpo_tiny``'s settings, written in TRL's names. Each side trains for ``--budget`` seconds of wall time (its model
already loaded), then greedy accuracy on the first 500 prompts of data/arith/test.parquet is measured by the same
function (``ppolab.eval.evaluate``). Every run is a fresh process; the sides alternate, seed by seed, and each seed's
order is swapped, so neither always runs on a warm machine.

Prints one line per run and, per seed and overall, ppolab's completions per second over TRL's. Numbers, not asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "models" / "tiny-arith"
TRAIN, TEST = ROOT / "data" / "arith" / "train.parquet", ROOT / "data" / "arith" / "test.parquet"
PROMPTS, N, MINI, EPOCHS, RESPONSE, LR, KL, EPS = 16, 8, 64, 2, 16, 3e-4, 0.001, 0.2
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"]}
EVAL_PROMPTS = 500


def accuracy(model, tokenizer) -> float:
    """Greedy accuracy on the first EVAL_PROMPTS test prompts, by ppolab's evaluation (the same for both sides)."""
    from ppolab.data import load_rl_dataset
    from ppolab.eval import evaluate

    data = load_rl_dataset([str(TEST)], tokenizer, 32)[:EVAL_PROMPTS]
    model.eval()
    return float(evaluate(model, tokenizer, data, RESPONSE, do_sample=False, n_examples=0)["accuracy"])


def run_ppolab(seed: int, budget: float) -> dict:
    from ppolab.train import resolve_config
    from ppolab.trainer import PPOTrainer

    cfg = resolve_config("grpo_tiny", [f"trainer.seed={seed}", "trainer.test_freq=-1", "trainer.record_freq=-1",
                                       "trainer.val_before_train=false", "trainer.total_training_steps=100000"])
    trainer = PPOTrainer(cfg)
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < budget:
        trainer.step()
        steps += 1
    seconds = time.perf_counter() - start
    with trainer.models.actor() as model:
        acc = accuracy(model, trainer.tokenizer)
    return {"side": "ppolab", "seed": seed, "completions": steps * PROMPTS * N, "seconds": seconds, "accuracy": acc}


def run_trl(seed: int, budget: float) -> dict:
    import pandas as pd
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ppolab.rewards import compute_score

    frame = pd.read_parquet(TRAIN)
    data = Dataset.from_dict({"prompt": [list(p) for p in frame["prompt"]],
                              "ground_truth": [r["ground_truth"] for r in frame["reward_model"]]})
    made = {"completions": 0}

    def reward(completions, ground_truth, **_):
        made["completions"] += len(completions)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(compute_score("arith", t, g)["score"]) for t, g in zip(texts, ground_truth)]

    clock = {}

    class Budget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            clock["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if time.perf_counter() - clock["start"] >= budget:
                control.should_training_stop = True

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, seed=seed, use_cpu=True, report_to=[], save_strategy="no", logging_steps=10**6,
            per_device_train_batch_size=MINI, gradient_accumulation_steps=1, steps_per_generation=PROMPTS * N // MINI,
            num_generations=N, num_iterations=EPOCHS, max_completion_length=RESPONSE, temperature=1.0,
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0,
            beta=KL, epsilon=EPS, loss_type="dapo", max_steps=10**6, shuffle_dataset=False)
        tokenizer = AutoTokenizer.from_pretrained(MODEL)
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype="float32")
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                              processing_class=tokenizer, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
                              callbacks=[Budget()])
        trainer.train()
        seconds = time.perf_counter() - clock["start"]
        acc = accuracy(trainer.model, tokenizer)
    return {"side": "trl", "seed": seed, "completions": made["completions"], "seconds": seconds, "accuracy": acc}


def child(side: str, seed: int, budget: float, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    out = (run_ppolab if side == "ppolab" else run_trl)(seed, budget)
    print("RESULT " + json.dumps(out), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=30.0, help="seconds of training on each side")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, default=2, help="torch threads on each side")
    p.add_argument("--child", nargs=2, metavar=("SIDE", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.budget, args.threads)
        return
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("TRL is not installed in this environment; see the top of bench/trl_side_by_side.py for a venv "
                 "that has both")
    import trl as _trl

    print(f"budget {args.budget:g} s a side, torch threads {args.threads}, TRL {_trl.__version__}")
    results = []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    for i, seed in enumerate(args.seeds):
        for side in (("ppolab", "trl") if i % 2 == 0 else ("trl", "ppolab")):
            proc = subprocess.run([sys.executable, __file__, "--child", side, str(seed), "--budget", str(args.budget),
                                   "--threads", str(args.threads)], capture_output=True, text=True, env=env,
                                  cwd=ROOT)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{side}, seed {seed}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
                continue
            r = json.loads(line[len("RESULT "):])
            results.append(r)
            print(f"{side:7s} seed {seed}: {r['completions']:6d} completions in {r['seconds']:5.1f} s = "
                  f"{r['completions'] / r['seconds']:6.1f} /s, greedy accuracy {r['accuracy']:.3f}", flush=True)
    rate = {(r["side"], r["seed"]): r["completions"] / r["seconds"] for r in results}
    ratios = {s: rate[("ppolab", s)] / rate[("trl", s)] for s in args.seeds
              if ("ppolab", s) in rate and ("trl", s) in rate}
    for s, ratio in ratios.items():
        print(f"seed {s}: ppolab / TRL completions per second = {ratio:.2f}×")
    if ratios:
        print(f"mean ratio {sum(ratios.values()) / len(ratios):.2f}× over {len(ratios)} seed(s)")


if __name__ == "__main__":
    main()
