"""Lab 14 — the two recommended configurations, and §14.2's tool agent (chapter §14, §14.1, §14.2, §11.5, §9)."""
from __future__ import annotations

from ppolab.exercises import exercise

#: The shipped runs of the three configurations: GRPO + KL loss, PPO + GAE + reward KL, the §14.2 tool agent.
DEFAULT_RUNS = ("grpo_tiny", "ppo_gae_tiny")
TOOL_RUN = "grpo_tool_tiny"


@exercise("14.1", "For each configuration (GRPO + KL loss, then PPO + GAE + reward KL): how many trajectories does "
                  "one training step produce, and how many optimizer steps does the actor take per training step? "
                  "Answer ((GRPO trajectories, GRPO optimizer steps), (PPO trajectories, PPO optimizer steps)).",
          kind="lookup",
          hints=("Trajectories = data.train_batch_size × rollout.n. One optimizer step takes "
                 "ppo_mini_batch_size × rollout.n of them, and the batch is walked ppo_epochs times.",
                 "steps = (train_batch_size·n) / (ppo_mini_batch_size·n) × ppo_epochs, per config; the recorded "
                 "runs hold it as info['batch_plan'] and as actor_log_probs.shape[0]."),
          context=("run",))
def _e1(run=None) -> tuple[tuple[int, int], tuple[int, int]]:
    from ppolab.run.reader import resolve_run

    out = []
    # the question compares the two configurations: a single run (the lab's RUN) does not change it
    for name in (run if isinstance(run, (tuple, list)) else DEFAULT_RUNS):
        r = resolve_run(name)
        rec = r.step(r.steps[0])
        out.append((int(rec.info["batch_plan"]["n_trajectories"]), len(rec.plan("actor").steps)))
    return tuple(out)


@exercise("14.2", "Take the PPO configuration and switch the reward-side KL off (algorithm.use_kl_in_reward=false), "
                  "leaving use_kl_loss off. Which recorded tensor disappears from the batch, and which trainer stage "
                  "(the PPOTrainer method name) stops running? Answer (tensor name, stage method name).",
          kind="lookup",
          hints=("With neither KL path on, which of the four policies is never needed?",
                 "config.use_reference_policy is use_kl_loss or use_kl_in_reward; PPOTrainer.step runs each "
                 "optional stage under one switch (if self.use_ref: …, if self.use_critic: …): which switch flips, "
                 "which stage does it guard, and which batch key does that stage write?"))
def _e2() -> tuple[str, str]:
    from ppolab.train import resolve_config

    on = resolve_config("ppo_gae_tiny")
    off = resolve_config("ppo_gae_tiny", ["algorithm.use_kl_in_reward=false"])
    (stage, tensor), = skipped_stages(on, off)
    return tensor, stage


def skipped_stages(on, off) -> list[tuple[str, str]]:
    """(PPOTrainer method, the batch key it writes) of every stage that config ``on`` runs and ``off`` skips, read
    from ppolab's trainer source with ``ast`` (``ppolab/trainer.py`` is parsed, not imported: no model library is
    loaded): the trainer's switches (``self.use_ref, … = cfg.use_reference_policy, …`` in ``__init__``), the stages
    ``PPOTrainer.step`` runs under each (``if self.use_ref: … self.compute_ref_log_prob(batch)``), and the keys each
    writes (``batch["…"] = …``). Layout and formatting do not matter; a ``step`` without any switch-guarded stage
    is an error, not an empty answer."""
    import ast
    from pathlib import Path

    import ppolab

    tree = ast.parse((Path(ppolab.__file__).parent / "trainer.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PPOTrainer")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}

    def attr_of(node: ast.AST, owner: str) -> str | None:
        ok = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == owner
        return node.attr if ok else None

    switches: dict[str, str] = {}  # self.use_ref → use_reference_policy (an attribute of the resolved config)
    for node in ast.walk(methods["__init__"]):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            lhs, rhs = node.targets[0], node.value
            pairs = zip(lhs.elts, rhs.elts) if isinstance(lhs, ast.Tuple) and isinstance(rhs, ast.Tuple) else \
                [(lhs, rhs)]
            for t, v in pairs:
                if attr_of(t, "self") and attr_of(v, "cfg"):
                    switches[attr_of(t, "self")] = attr_of(v, "cfg")
    out, gates = [], 0
    for node in ast.walk(methods["step"]):
        flag = attr_of(node.test, "self") if isinstance(node, ast.If) else None
        gates += flag in switches
        if flag not in switches or not (getattr(on, switches[flag]) and not getattr(off, switches[flag])):
            continue
        called = [attr_of(c.func, "self") for c in ast.walk(node) if isinstance(c, ast.Call)]
        for method in (m for m in called if m in methods):
            keys = [t.slice.value for a in ast.walk(methods[method]) if isinstance(a, ast.Assign)
                    for t in a.targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                    and t.value.id == "batch" and isinstance(t.slice, ast.Constant)]
            out += [(method, key) for key in keys]
    if not gates:
        raise RuntimeError("ppolab/trainer.py: no optional stage found behind a switch (PPOTrainer.__init__ / step)")
    return out


def _tool_record(run=None, step: int = 1):
    from ppolab.run.reader import resolve_run

    return resolve_run(run, default=TOOL_RUN).step(step)


@exercise("14.3", "The tool agent's recorded step 1: how many response tokens of the real trajectories are tool "
                  "observations — attended by the model but outside the loss mask?",
          kind="compute",
          hints=("Two masks describe a multi-turn response: response_attention_mask (what the model attends to) "
                 "and response_mask (what the loss trains on). A tool observation is in one and not the other.",
                 "((response_attention_mask == 1) & (response_mask == 0)) summed over the real rows "
                 "(is_pad == 0)."),
          context=("run",), needs=("step1", "tool_obs"), default_run=TOOL_RUN)
def _e3(run=None) -> int:
    t = _tool_record(run).tensors
    real = ~t["is_pad"].bool()
    obs = t["response_attention_mask"].bool() & ~t["response_mask"].bool()
    return int(obs[real].sum())


@exercise("14.4", "Predict, then verify: the tool agent's recorded step 1, mini-batch 0, use_dynamic_bsz with the "
                  "run's ppo_max_token_len_per_gpu. How many micro-batches does the engine cut that mini-batch into?",
          kind="predict",
          hints=("Start from ceil(Σ L_i / budget). L_i is every token the forward pass holds for row i: prompt "
                 "tokens and all attended response tokens — tool observations included, although the loss ignores "
                 "them. Then 0.9.1's fit loop may add micro-batches until each fits.",
                 "len(ppolab.update_plan.micro_batches(batch.select(mini_batch_rows(run, 1, 0)), None, "
                 "ppo_max_token_len_per_gpu)); Batch.seq_lens() = prompt_mask + response_attention_mask sums."),
          context=("run",), needs=("step1", "tool_obs"), default_run=TOOL_RUN)
def _e4(run=None) -> int:
    # the micro-batches rank 0's worker cut optimizer step 0 (epoch 0, mini-batch 0) into, as the step recorded them
    return len(_tool_record(run).opt_step(0, "actor").step.micro_batches[0])
