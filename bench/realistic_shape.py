"""GRPO at a realistic shape on CPU: Qwen2.5's 151,936-token vocabulary, 256-token responses, 64 rows a step, 2 ranks.

    python bench/realistic_shape.py [--out DIR] [--steps 2] [--rows 64] [--response-length 256] [--ranks 2] \
        [key=value ...]

No download. The script builds, in ``DIR/model``:

* a byte-level BPE tokenizer trained here with ``tokenizers`` on the arithmetic dataset's text (Qwen2's split regex
  and byte-level pipeline; a few hundred learned tokens), with Qwen's specials appended after them —
  ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS) — and a ChatML chat template;
* a small Qwen2 (hidden 64, 2 layers, GQA, tied embeddings) whose embedding is padded to **151,936** rows, as
  Qwen2.5 pads its 151,665 tokenizer tokens; saved with ``save_pretrained`` and checked to load through
  ``ppolab.models.load_tokenizer_and_model`` and to round-trip text;
* a few SFT steps on long arithmetic text with no EOS in it, so sampled tokens are real text and EOS stays rare:
  responses run to the full ``--response-length``.

Then ``torchrun --standalone --nproc_per_node RANKS -m ppolab.train`` (OMP_NUM_THREADS=1) runs the grpo_tiny preset
on it with the hf engine, recording every step into ``DIR/run``, and the script prints each rank's peak resident
set (``VmHWM`` of /proc/<pid>/status, polled while it runs — it never goes down), seconds per step and the bytes of
each recorded ``steps/step_*.safetensors``. Rewards are the share of digit characters in the response (a bench
reward: it varies inside every group, so GRPO advantages are non-zero). Numbers, not asserts.
``DIR`` defaults to a fresh folder under /tmp and is kept; a model already built there with the same build options
is reused.
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
ARITH = ROOT / "data" / "arith"
QWEN_VOCAB = 151936  # Qwen2.5's embedding rows; its tokenizer has 151,665 tokens
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of digit characters in the response: varies inside a group, so GRPO advantages are non-zero."""
    text = solution_str.strip()
    return sum(ch.isdigit() for ch in text) / max(1, len(text))
'''


# ----------------------------------------------------------------------------- building the model directory
def arith_texts() -> list[str]:
    """Every question and answer of ``data/arith/*.parquet`` as one line of text: ``What is 56+68? #### 124``."""
    import pyarrow.parquet as pq

    lines = []
    for f in sorted(ARITH.glob("*.parquet")):
        for row in pq.read_table(f, columns=["prompt", "reward_model"]).to_pylist():
            lines.append(f"{row['prompt'][-1]['content']} #### {row['reward_model']['ground_truth']}")
    return lines


def train_tokenizer(texts: list[str], vocab_size: int = 2048):
    """A byte-level BPE trained on ``texts`` (Qwen2's pre-tokenizer), Qwen's specials appended after the learned
    tokens, as a ``PreTrainedTokenizerFast`` with a ChatML template; EOS ``<|im_end|>``, pad ``<|endoftext|>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ppolab.tokenizer import _QWEN2_SPLIT

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # the chat template's role names belong to the text the tokenizer sees, as in any chat corpus
    corpus = [f"user\n{t}\nassistant\n" for t in texts]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([ENDOFTEXT, IM_START, IM_END])  # after the learned ids, as Qwen's 151643–151645
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
                                   chat_template=CHATML, clean_up_tokenization_spaces=False, model_max_length=32768,
                                   padding_side="left")


def build_model(tokenizer, hidden: int, layers: int, seed: int = 0):
    """A random Qwen2ForCausalLM with ``QWEN_VOCAB`` embedding rows (more than the tokenizer has: the rest is
    padding, never a target), Qwen2.5-style ids and generation config."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    cfg = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad)
    return model


def long_text_batch(tokenizer, texts: list[str], rows: int, length: int, rng):
    """(ids, labels), each (rows, length): a ChatML prompt, then arithmetic lines run on past ``length`` with no
    ``<|im_end|>``; labels are -100 on the prompt, so EOS is never a target and the SFT teaches text that never
    stops (the prompt's own ``<|im_end|>`` would otherwise be learnt as what follows a question)."""
    import torch

    ids, labels = [], []
    for _ in range(rows):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": rng.choice(texts).split(" ####")[0]}],
                                               add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
        row = list(prompt)
        while len(row) < length:
            row += tokenizer(rng.choice(texts) + " ", add_special_tokens=False)["input_ids"]
        ids.append(row[:length])
        labels.append(([-100] * len(prompt) + row[len(prompt):])[:length])
    return torch.tensor(ids), torch.tensor(labels)


def sft(model, tokenizer, texts: list[str], steps: int, rows: int = 4, length: int = 128, lr: float = 3e-3) -> float:
    """``steps`` AdamW steps of next-token loss on :func:`long_text_batch`; returns the last loss."""
    import random

    import torch

    rng, opt = random.Random(0), torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = float("nan")
    for _ in range(steps):
        ids, labels = long_text_batch(tokenizer, texts, rows, length, rng)
        out = model(input_ids=ids, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        loss = out.loss.item()
    model.eval()
    return loss


def check_loader(model_dir: Path, texts: list[str]) -> tuple[int, str]:
    """Load ``model_dir`` with ``ppolab.models.load_tokenizer_and_model`` and check the tokenizer round-trips text
    and the chat template; returns (tokenizer length, one-line verdict)."""
    from ppolab.models import load_tokenizer_and_model

    tok, model = load_tokenizer_and_model(model_dir)
    bad = [t for t in texts[:200] if tok.decode(tok(t, add_special_tokens=False)["input_ids"]) != t]
    chat = tok.apply_chat_template([{"role": "user", "content": texts[0]}], add_generation_prompt=True, tokenize=False)
    ok = (not bad and model.config.vocab_size == QWEN_VOCAB and tok.eos_token == IM_END
          and tok.pad_token == ENDOFTEXT and chat.endswith(f"{IM_START}assistant\n"))
    verdict = (f"loader round-trip ok ({type(tok).__name__})" if ok else
               f"loader round-trip FAILED: {len(bad)} texts differ (first {bad[:1]}), eos {tok.eos_token!r}, "
               f"pad {tok.pad_token!r}, vocab {model.config.vocab_size}, template ends {chat[-30:]!r}")
    return len(tok), verdict


def response_lengths(model_dir: Path, texts: list[str], rows: int, length: int) -> list[int]:
    """Lengths of ``rows`` responses sampled at T=1 (``generate_tokens``), to see EOS is rare."""
    import torch

    from ppolab.models import load_tokenizer_and_model
    from ppolab.rollout.base import SamplingParams, eos_token_ids
    from ppolab.rollout.hf import generate_tokens

    tok, model = load_tokenizer_and_model(model_dir)
    prompts = [tok.apply_chat_template([{"role": "user", "content": t.split(" ####")[0]}], add_generation_prompt=True,
                                       tokenize=False) for t in texts[:rows]]
    contexts = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    torch.manual_seed(0)
    _, _, mask = generate_tokens(model, tok, contexts, length, SamplingParams(), eos_token_ids(model, tok))
    return mask.sum(-1).long().tolist()


def build(out: Path, hidden: int, layers: int, sft_steps: int) -> dict:
    """The model directory ``out`` (reused when built before with the same options); returns its build facts."""
    import torch

    from ppolab.models import count_parameters

    options = {"hidden": hidden, "layers": layers, "sft_steps": sft_steps, "vocab": QWEN_VOCAB}
    facts_file = out / "bench_build.json"
    if facts_file.is_file() and json.loads(facts_file.read_text()).get("options") == options:
        return {**json.loads(facts_file.read_text()), "reused": True}
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    start = time.perf_counter()
    texts = arith_texts()
    tok = train_tokenizer(texts)
    model = build_model(tok, hidden, layers)
    loss = sft(model, tok, texts, sft_steps)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    tokens, verdict = check_loader(out, texts)
    facts = {"options": options, "tokenizer_tokens": tokens, "parameters": count_parameters(model),
             "sft_loss": loss, "loader": verdict, "build_s": time.perf_counter() - start}
    facts_file.write_text(json.dumps(facts, indent=2) + "\n")
    return facts


# ----------------------------------------------------------------------------- the distributed run
def overrides(model_dir: Path, run_dir: Path, reward: Path, steps: int, rows: int, response_length: int) -> list[str]:
    """grpo_tiny at the bench's shape: ``rows`` = 4 answers × rows/4 prompts, record every step, micro-batches
    small enough that one micro-batch's (rows × 257 × 151,936) float32 logits stay near 0.6 / 1.2 GB."""
    n = 4
    return [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=hf",
        f"data.train_batch_size={rows // n}", f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, rows // n // 2)}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "data.max_prompt_length=32", f"data.max_response_length={response_length}",
        f"custom_reward_function.path={reward}",
        f"trainer.total_training_steps={steps}", "trainer.record_freq=1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[console]",
        f"trainer.run_dir={run_dir}",
    ]


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident set of process ``pid`` in MiB (``VmHWM``), None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def rank_of(pid: int) -> int | None:
    """The ``RANK`` torchrun gave process ``pid``, None for processes that are no rank (the agent, helpers)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"RANK="):
            return int(kv[5:])
    return None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (/proc/<pid>/task/*/children), depth first."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            out += [k, *descendants(k)]
    return out


def launch(ranks: int, train_args: list[str], log: Path, poll_s: float = 0.5) -> tuple[int, dict[int, float], float]:
    """Run ``torchrun … -m ppolab.train`` to the end, polling each rank's VmHWM; (exit code, {rank: peak MiB},
    wall seconds)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "ppolab.train", *train_args]
    peaks: dict[int, float] = {}
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            for pid in descendants(proc.pid):
                rank, hwm = rank_of(pid), vm_hwm_mib(pid)
                if rank is not None and hwm is not None:
                    peaks[rank] = max(peaks.get(rank, 0.0), hwm)
            time.sleep(poll_s)
    return proc.returncode, peaks, time.perf_counter() - start


def rooflines(threads: int = 1, n: int = 1024, copy_mib: int = 512) -> tuple[float, float]:
    """(GFLOP/s of a square fp32 matmul, GB/s of a large copy) on ``threads`` threads of this machine — the
    rooflines each stage is held against (the ranks run with OMP_NUM_THREADS=1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        start = time.perf_counter()
        for _ in range(3):
            a @ b
        flops = 3 * 2 * n ** 3 / (time.perf_counter() - start) / 1e9
        x = torch.empty(copy_mib * 2**18)
        y = torch.empty_like(x)
        y.copy_(x)
        start = time.perf_counter()
        for _ in range(3):
            y.copy_(x)
        gbs = 3 * 2 * x.numel() * 4 / (time.perf_counter() - start) / 1e9
    finally:
        torch.set_num_threads(before)
    return flops, gbs


def stage_work(m: dict, parameters: int, hidden: int, vocab: int, rows: int, epochs: int = 1) -> dict[str, tuple]:
    """Per stage (FLOPs, bytes): the arithmetic of a decoder step at this shape. Per token the LM head costs
    2·H·V FLOPs and the trunk 2·(parameters − V·H) (tied embedding); forward passes score the response tokens
    with the head and run the trunk over prompt + response; an update is forward + backward (×3) per epoch — the
    plain computation's arithmetic, the yardstick the stages are measured against (the fused head itself makes 2
    head products a token where the head is frozen and no entropy term trains, 4 where the backward recomputes).
    Bytes: the head's weight read once per 256-token block (the fused path's row block) or per decode step, plus
    each token's hidden state per layer — a lower bound."""
    length = float(m.get("response_length/mean", 0.0))
    prompt = float(m.get("prompt_length/mean", 0.0))
    trunk, head = 2.0 * (parameters - vocab * hidden), 2.0 * hidden * vocab
    weight = vocab * hidden * 4
    tokens, scored = rows * (prompt + length), rows * length
    fwd = (tokens * trunk + scored * head, weight * scored / 256 + tokens * hidden * 4 * 8)
    return {
        "gen": (tokens * trunk + scored * head, weight * length + tokens * hidden * 4 * 8),
        "old_log_prob": fwd, "ref": fwd,
        "update_actor": (epochs * 3 * (tokens * trunk + scored * head), epochs * 3 * fwd[1]),
    }


def report(run_dir: Path, peaks: dict[int, float], wall: float) -> None:
    """Print per-rank peaks, per-step seconds (with the stage split) and recorded bytes per step."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "perf/time_per_step" in m]
    for rank in sorted(peaks):
        print(f"  rank {rank} peak RSS (VmHWM)    {peaks[rank]:8.0f} MiB")
    print(f"  wall, launch to exit         {wall:8.1f} s (model load, every step and recording)")
    for m in steps:
        k = int(m.get("training/global_step", m.get("step", 0)))
        stages = "  ".join(f"{key[9:]} {v:.1f}" for key, v in m.items()
                           if key.startswith("timing_s/") and key != "timing_s/step")
        print(f"  step {k}: {m['perf/time_per_step']:7.1f} s/step ({stages}); response length "
              f"{m.get('response_length/mean', float('nan')):.0f} mean, score {m.get('critic/score/mean', 0):.3f}")
    for f in sorted((run_dir / "steps").glob("step_*.safetensors")):
        print(f"  recorded {f.name:<28} {f.stat().st_size:12,d} bytes ({f.stat().st_size / 2**20:.1f} MiB)")
    config = json.loads((run_dir / "config.json").read_text())["config"]
    model = json.loads((Path(config["actor_rollout_ref"]["model"]["path"]) / "config.json").read_text())
    hidden, vocab, layers = model["hidden_size"], model["vocab_size"], model["num_hidden_layers"]
    inter = model["intermediate_size"]
    kv = hidden // model["num_attention_heads"] * model["num_key_value_heads"]
    parameters = vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter)
    rows = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    epochs = config["actor_rollout_ref"]["actor"]["ppo_epochs"]
    flops_peak, gbs_peak = rooflines()
    print(f"  rooflines here, 1 thread: {flops_peak:.0f} GFLOP/s (square fp32 matmul), {gbs_peak:.1f} GB/s (copy)")
    last = steps[-1]
    work = stage_work(last, parameters, hidden, vocab, rows // max(1, len(peaks)), epochs)
    print(f"  {'stage':<14}{'s':>8}{'GFLOP':>9}{'GB':>8}{'GFLOP/s':>10}{'× compute roofline':>20}")
    total = 0.0
    for stage, (flops, moved) in work.items():
        sec = float(last.get(f"timing_s/{stage}", float("nan")))
        total += flops / 1e9 / flops_peak
        print(f"  {stage:<14}{sec:8.1f}{flops / 1e9:9.0f}{moved / 1e9:8.2f}{flops / 1e9 / sec:10.1f}"
              f"{sec / (flops / 1e9 / flops_peak):20.1f}")
    print(f"  the step's compute at the roofline: {total:.1f} s; measured {last['perf/time_per_step']:.1f} s "
          f"({last['perf/time_per_step'] / total:.1f}×)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="work folder (model/, run/); default a new one in /tmp")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rows", type=int, default=64, help="trajectories per step (prompts × 4 answers)")
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=40)
    p.add_argument("overrides", nargs="*", help="more key=value overrides for ppolab.train")
    args = p.parse_intermixed_args(argv)
    if args.rows % 4 or (args.rows // 4) % args.ranks:
        p.error("--rows must be 4 × a multiple of --ranks (4 answers per prompt, prompts split over ranks)")
    out = args.out or Path(tempfile.mkdtemp(prefix="ppolab-realistic-shape-"))
    if out.resolve().is_relative_to((ROOT / "data").resolve()):
        p.error("--out must not be inside data/ (shipped runs and models live there)")
    model_dir, run_dir = out / "model", out / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    model_dir.mkdir(parents=True, exist_ok=True)

    facts = build(model_dir, args.hidden, args.layers, args.sft_steps)
    how = "reused" if facts.get("reused") else f"built in {facts['build_s']:.0f} s"
    print(f"model {model_dir}: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {QWEN_VOCAB} "
          f"({facts['tokenizer_tokens']} tokenizer tokens), {facts['parameters'] / 1e6:.1f}M parameters; "
          f"SFT {args.sft_steps} steps, loss {facts['sft_loss']:.2f}; "
          f"{how}")
    print(f"  {facts['loader']}")
    lengths = response_lengths(model_dir, arith_texts(), 8, args.response_length)
    print(f"  8 responses at T=1: lengths {lengths} (of {args.response_length})")

    reward = out / "reward.py"
    reward.write_text(REWARD)
    train_args = overrides(model_dir, run_dir, reward, args.steps, args.rows, args.response_length) + args.overrides
    log = out / f"{run_dir.name}.log"
    print(f"torchrun --nproc_per_node {args.ranks} -m ppolab.train: {args.rows} rows × {args.response_length} "
          f"tokens, {args.steps} steps, log {log}")
    code, peaks, wall = launch(args.ranks, train_args, log)
    if code != 0:
        print(f"  FAILED with exit code {code}; last lines of {log}:")
        print("\n".join(log.read_text().splitlines()[-25:]))
        return code
    report(run_dir, peaks, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
