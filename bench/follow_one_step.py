"""Which files one optimizer step passes through: from ``PPOTrainer.update_actor`` (stage 9 of
``PPOTrainer.step``) to the actor's first ``optimizer.step()``, traced on a real step of a preset. Prints each
ppolab file in the order the step first enters it, with the function it entered first. Goal (issue 51): a reader
follows one optimizer step in at most 8 files.

    python bench/follow_one_step.py [PRESET] [key=value ...]    # default grpo_tiny
    python bench/follow_one_step.py grpo_tiny actor_rollout_ref.actor.use_kl_loss=true
"""
from __future__ import annotations

import sys
from pathlib import Path

import ppolab
import ppolab.worker as worker
from ppolab.train import resolve_config
from ppolab.trainer import PPOTrainer


def main(argv: list[str]) -> None:
    preset = argv[0] if argv and "=" not in argv[0] else "grpo_tiny"
    trainer = PPOTrainer(resolve_config(preset, [a for a in argv if "=" in a]))
    root = Path(ppolab.__file__).parent
    entered: dict[str, str] = {}
    state = {"on": False, "done": False}

    def profile(frame, event, arg):
        if event == "call" and state["on"] and not state["done"]:
            name = frame.f_code.co_filename
            if name.startswith(str(root)):
                entered.setdefault(str(Path(name).relative_to(root.parent)), frame.f_code.co_name)

    update_actor, optimizer_step = PPOTrainer.update_actor, worker.Worker.optimizer_step

    def traced_update(self, batch):
        state["on"] = True
        return update_actor(self, batch)

    def first_optimizer_step(self, params):
        out = optimizer_step(self, params)
        state["done"] = state["done"] or state["on"]
        return out

    PPOTrainer.update_actor, worker.Worker.optimizer_step = traced_update, first_optimizer_step
    sys.setprofile(profile)
    try:
        trainer.step()
    finally:
        sys.setprofile(None)
        PPOTrainer.update_actor, worker.Worker.optimizer_step = update_actor, optimizer_step
    print(f"{preset}: {len(entered)} files from update_actor to the first optimizer.step()")
    for name, function in entered.items():
        print(f"  {name:32s} first entered at {function}")


if __name__ == "__main__":
    main(sys.argv[1:])
