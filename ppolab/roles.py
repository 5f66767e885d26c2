"""One frozen base model, three roles: actor, reference and critic (issue: "one frozen base, three roles").

With LoRA (``lora_rank > 0``) everything shares one copy of the base weights:
* actor  = base + LoRA adapter ``actor``;
* ref    = the same model with adapters disabled (exactly the base model's log-probs);
* critic = base + LoRA adapter ``critic`` + a value head (one linear layer on the last hidden state).
With full fine-tuning (``lora_rank = 0``) the actor trains every weight, the reference is a frozen
copy and the critic is a separate model + value head, as verl does. The forward pass every role runs is
:func:`ppolab.models.forward_response`, beside the models it runs.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Iterator

import torch
from torch import nn

from ppolab.models import (ValueHead, check_target_modules, check_vocab_fits, enable_gradient_checkpointing,
                           load_tokenizer_and_model, model_skeleton)


class PolicyModels:
    """Holds the tokenizer and the three roles; switches LoRA adapters as a stage needs them."""

    def __init__(
        self,
        path: str,
        lora_rank: int,
        lora_alpha: int,
        target_modules,
        dtype: str = "float32",
        device: str = "cpu",
        use_critic: bool = False,
        use_reference: bool = True,
        critic_lora_rank: int | None = None,
        critic_lora_alpha: int | None = None,
        critic_path: str | None = None,
        critic_target_modules=None,
        seed: int = 0,
        gradient_checkpointing: bool = False,
    ):
        critic_targets = target_modules if critic_target_modules is None else critic_target_modules
        # LoRA targets are checked on the model built from its config alone, before a weight is read (a large model
        # takes half a minute to load); a config transformers cannot build that way is checked after the load
        skeleton = model_skeleton(path) if lora_rank > 0 else None
        if skeleton is not None:
            self._check_targets(skeleton, target_modules, critic_targets, use_critic)
        self.tokenizer, base = load_tokenizer_and_model(path, dtype, device)
        check_vocab_fits(base, self.tokenizer, "actor_rollout_ref.model.path", path)
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            enable_gradient_checkpointing(base)
        self.path, self.dtype = path, dtype  # a vLLM engine loads the same base weights
        self.device = torch.device(device)
        self.lora, self.lora_rank = lora_rank > 0, lora_rank
        self.use_critic = use_critic
        base.requires_grad_(False)
        self.value_head: ValueHead | None = None
        if self.lora:
            from peft import LoraConfig, get_peft_model

            if skeleton is None:
                self._check_targets(base, target_modules, critic_targets, use_critic)

            def lora_config(rank: int, alpha: int, targets) -> LoraConfig:
                return LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")

            torch.manual_seed(seed)  # LoRA A matrices are random; B is zero, so actor == base at step 0
            with warnings.catch_warnings():  # peft calls a transformers API deprecated in v5; not ours to fix
                warnings.simplefilter("ignore", FutureWarning)
                self.model = get_peft_model(base, lora_config(lora_rank, lora_alpha, target_modules),
                                            adapter_name="actor")
            if use_critic:
                self.model.add_adapter("critic", lora_config(critic_lora_rank or lora_rank,
                                                             critic_lora_alpha or lora_alpha, critic_targets))
            self._lora_params = {name: [p for n, p in self.model.named_parameters() if f".{name}." in n]
                                 for name in (("actor", "critic") if use_critic else ("actor",))}
            self._activate("actor")
            self.ref_model = None
            self.critic_model = self.model
        else:
            self.model = base
            base.requires_grad_(True)
            self.ref_model = copy.deepcopy(base).requires_grad_(False) if use_reference else None
            self.critic_model = None
            if use_critic:
                critic_tok, critic = load_tokenizer_and_model(critic_path or path, dtype, device)
                if critic_tok.get_vocab() != self.tokenizer.get_vocab():  # values of other tokens: meaningless
                    from ppolab.config import ConfigError

                    raise ConfigError(
                        f"critic.model.path={critic_path!r} has a different vocabulary ({len(critic_tok)} tokens) "
                        f"from the actor's {path!r} ({len(self.tokenizer)} tokens): the critic reads the actor's "
                        "token ids; give a critic built on the same tokenizer, or leave critic.model.path unset")
                check_vocab_fits(critic, self.tokenizer, "critic.model.path", critic_path or path)
                self.critic_model = critic.requires_grad_(True)
                if gradient_checkpointing:
                    enable_gradient_checkpointing(critic)
        if use_critic:
            hidden = self.critic_model.config.hidden_size if not self.lora else base.config.hidden_size
            self.value_head = ValueHead(hidden, seed=seed).to(self.device)
        if gradient_checkpointing:  # HF checkpoints only in train mode; forward-only stages switch to eval
            for m in (self.model, self.critic_model):
                if m is not None:
                    m.train()

    @staticmethod
    def _check_targets(model: nn.Module, target_modules, critic_targets, use_critic: bool) -> None:
        check_target_modules(model, target_modules)
        if use_critic:
            check_target_modules(model, critic_targets, key="critic.model.target_modules")

    def _activate(self, adapter: str) -> None:
        """Route the forward through ``adapter``. peft's ``set_adapter`` also clears ``requires_grad`` on
        every other adapter; a loss built inside the critic context is back-propagated after the context
        has switched back to the actor, so both adapters must stay trainable (the base stays frozen)."""
        self.model.set_adapter(adapter)
        for params in self._lora_params.values():
            for p in params:
                p.requires_grad_(True)

    # ------------------------------------------------------------------ parameters per role
    def actor_parameters(self) -> list[nn.Parameter]:
        """The trainable actor weights: the ``actor`` adapter, or every base weight without LoRA."""
        if self.lora:
            return self._lora_params["actor"]
        return list(self.model.parameters())

    def critic_parameters(self) -> list[nn.Parameter]:
        """The ``critic`` adapter (or the whole critic model) plus the value head."""
        if self.lora:
            params = list(self._lora_params["critic"])
        else:
            params = list(self.critic_model.parameters())
        return params + list(self.value_head.parameters())

    # ------------------------------------------------------------------ role contexts
    @contextlib.contextmanager
    def actor(self) -> Iterator[nn.Module]:
        """The actor model, with the ``actor`` adapter active (also the rollout policy)."""
        if self.lora:
            self._activate("actor")
        yield self.model

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy: adapters disabled (LoRA) or the frozen copy (full fine-tuning)."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
            self._activate("actor")  # leaving disable_adapter re-enables only the active adapter's grads
        else:
            yield self.ref_model

    @contextlib.contextmanager
    def critic(self) -> Iterator[nn.Module]:
        """The critic trunk, with the ``critic`` adapter active; pair it with ``value_head``."""
        if self.lora:
            self._activate("critic")
            try:
                yield self.model
            finally:
                self._activate("actor")
        else:
            yield self.critic_model

    # ------------------------------------------------------------------ checkpoints
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Every trainable tensor by a stable name (adapters, or full weights, and the value head)."""
        state = {f"actor.{i}": p.detach() for i, p in enumerate(self.actor_parameters())}
        if self.use_critic:
            state.update({f"critic.{i}": p.detach() for i, p in enumerate(self.critic_parameters())})
        return state

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`trainable_state`."""
        with torch.no_grad():
            for i, p in enumerate(self.actor_parameters()):
                p.copy_(state[f"actor.{i}"])
            if self.use_critic:
                for i, p in enumerate(self.critic_parameters()):
                    p.copy_(state[f"critic.{i}"])

    def save_adapters(self, directory) -> None:
        """``save_pretrained`` of the adapters (LoRA) or the full actor, for use outside ppolab."""
        if self.lora:
            self.model.save_pretrained(str(directory), selected_adapters=None)
        else:
            self.model.save_pretrained(str(directory), safe_serialization=True)
