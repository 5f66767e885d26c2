"""Write data/verl_checkpoints/grpo_tiny/: two checkpoints of a short grpo_tiny run in the layout verl 0.9.1's
``FSDPCheckpointManager.save_checkpoint`` gives a LoRA job saved with ``hf_model`` in
``actor_rollout_ref.actor.checkpoint.save_contents`` — what ``ppolab.verl_checkpoints`` reads and lab 18 compares.

    python tools/make_verl_checkpoints.py [OUT]      # default data/verl_checkpoints/grpo_tiny

The weights go through the calls verl's writer makes for ``huggingface/`` (``utils/checkpoint/
fsdp_checkpoint_manager.py``): the model class built from its config in bfloat16 without weights, ``to_empty``,
then ``save_pretrained(path, state_dict=...)`` with the full state dict of the peft-wrapped actor (peft's key
names, the adapter named ``default`` as verl's single adapter is; a tied head dropped), and
``lora_train_meta.json`` beside them. verl's ``model_world_size_*_rank_*.pt`` shards (pickles) are not written:
ppolab never reads them.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
STEPS = (2, 4)


def main(out: Path) -> None:
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    import ppolab
    from ppolab.roles import PolicyModels
    from ppolab.run.checkpoints import read_checkpoint
    from ppolab.run.files import STEP_FILE

    with tempfile.TemporaryDirectory() as tmp:
        run = ppolab.train("grpo_tiny", overrides=[f"trainer.total_training_steps={STEPS[-1]}",
                                                   f"trainer.save_freq={STEPS[0]}", f"trainer.run_dir={tmp}/run",
                                                   "trainer.record_freq=-1"], progress=False)
        cfg = run.ppo_config()
        model_cfg = cfg.actor_rollout_ref.model
        base = str(Path(model_cfg.path))
        if out.exists():
            shutil.rmtree(out)
        for step in STEPS:
            models = PolicyModels(base, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules)
            saved = read_checkpoint(Path(run.path) / "checkpoints" / STEP_FILE.format(step))
            models.load_trainable_state(saved["weights"])
            with models.actor() as actor:
                state = {k.replace(".actor.", ".default."): v.detach().to(torch.bfloat16).contiguous()
                         for k, v in actor.state_dict().items()}
            actor_dir = out / f"global_step_{step}" / "actor"
            hf = actor_dir / "huggingface"
            hf.mkdir(parents=True)
            config = AutoConfig.from_pretrained(base)
            if getattr(config, "tie_word_embeddings", False):  # verl's drop_tied_target_keys: head = embedding
                state = {k: v for k, v in state.items() if not k.endswith("lm_head.weight")}
            with init_empty_weights():
                save_model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
            save_model.to_empty(device="cpu")
            save_model.save_pretrained(str(hf), state_dict=state)
            models.tokenizer.save_pretrained(str(hf))
            (actor_dir / "lora_train_meta.json").write_text(json.dumps(
                {"r": model_cfg.lora_rank, "lora_alpha": model_cfg.lora_alpha, "task_type": "CAUSAL_LM"}, indent=4))
    print(f"wrote {out}: global_step_{STEPS[0]} and global_step_{STEPS[-1]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "data" / "verl_checkpoints" / "grpo_tiny")
