"""One frozen base model, three roles: actor, reference and critic (issue: "one frozen base, three roles").

With LoRA (``lora_rank > 0``) everything shares one copy of the base weights:
* actor  = base + LoRA adapter ``actor``;
* ref    = the same model with adapters disabled (exactly the base model's log-probs);
* critic = base + LoRA adapter ``critic`` + a value head (one linear layer on the last hidden state).
With full fine-tuning (``lora_rank = 0``) the actor trains every weight, the reference is a frozen
copy and the critic is a separate model + value head, as verl does.

:func:`forward_response` is the one forward pass every stage uses: it returns per-token log-probs,
entropy and/or values for the response positions, aligned by the one-token shift (chapter §9).
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ppolab.algos import calculate_sum_pi_squared_from_logits, entropy_from_logits, logprobs_from_logits, scale_logits
from ppolab.algos.fused_head import fused_head_logprobs_entropy
from ppolab.algos.logprob import chunked_logprobs_entropy, logit_rows_per_pass, use_chunked_logits
from ppolab.models import check_target_modules, check_vocab_fits, load_tokenizer_and_model, model_skeleton


@dataclass
class ResponseOutputs:
    """Per-token outputs on the response positions, each (bs, R) or None."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: cumsum(mask) − 1, clamped at 0 (as HF ``generate`` does)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def forward_response(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float,
    want_log_probs: bool = True,
    want_entropy: bool = False,
    value_head: nn.Module | None = None,
    want_sum_pi_squared: bool = False,
    chunked: bool | None = None,
    fused: bool | None = None,
) -> ResponseOutputs:
    """Run ``model`` on prompt ‖ response and read the response positions.

    Shapes: input_ids, attention_mask (bs, P + R) with prompts left-padded and responses right-padded;
    R = ``response_length``. The logits at position t predict token t+1, so the response tokens are
    predicted by the last R+1 positions minus the final one (the one-token shift, chapter §9). Logits
    are divided by the temperature before log-probs and entropy (verl `prepare_model_outputs`). Values are the value
    head on the hidden state at the same shifted positions (the value of the state *before* each token).

    ``chunked``: the path for a real vocabulary (151,936 tokens), where the logits are the largest tensor of the
    step. Where the head allows it (:func:`_fusable_head`) and Σπ² is not asked for, log-probs and entropy come from
    the decoder's hidden states and the head's weight over vocabulary chunks, never making the logits
    (:func:`ppolab.algos.fused_head.fused_head_logprobs_entropy`); otherwise from the model's logits a slice of
    positions at a time (:func:`ppolab.algos.logprob.chunked_logprobs_entropy`), with no full-size float32 copy.
    None decides by size (above ``CHUNK_LOGITS_THRESHOLD`` logits, or from ``CHUNK_VOCAB`` tokens at any batch),
    which the shipped tiny model never reaches — its runs keep the plain formulas below, bit for bit.
    ``fused=False`` keeps a chunked forward on the logits (a bench's or a test's comparison); None fuses where the
    head allows it. Without gradients
    (a reading, an inference pass) the rows go through the model a few at a time
    (:func:`ppolab.algos.logprob.logit_rows_per_pass`), so no pass holds more than 2^27 logits (512 MiB in fp32);
    the shipped model never needs more than one pass.
    """
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if chunked is None and vocab:
        chunked = use_chunked_logits(input_ids.shape[0], response_length, int(vocab))
    wanted = (want_log_probs or want_entropy) and not want_sum_pi_squared
    head = _fusable_head(model) if chunked and wanted and fused is not False else None
    if head is not None:  # the fused path makes no logits at all: no pass needs to be split by rows
        return _forward_fused(model, head, input_ids, attention_mask, response_length, temperature, want_log_probs,
                              want_entropy, value_head)
    per_pass = logit_rows_per_pass(response_length + 1, int(vocab)) if vocab else input_ids.shape[0]
    if not torch.is_grad_enabled() and input_ids.shape[0] > per_pass:
        parts = [forward_response(model, input_ids[s:s + per_pass], attention_mask[s:s + per_pass], response_length,
                                  temperature, want_log_probs, want_entropy, value_head, want_sum_pi_squared, chunked,
                                  fused)
                 for s in range(0, input_ids.shape[0], per_pass)]
        return ResponseOutputs(**{f: None if getattr(parts[0], f) is None else torch.cat([getattr(p, f) for p in parts])
                                  for f in ("log_probs", "entropy", "values", "sum_pi_squared")})
    out = _forward(model, input_ids, attention_mask, response_length, hidden=value_head is not None)
    result = ResponseOutputs()
    responses = input_ids[:, -response_length:]
    if chunked is None:
        chunked = use_chunked_logits(input_ids.shape[0], response_length, out.logits.shape[-1])
    if chunked and (want_log_probs or want_entropy or want_sum_pi_squared):
        # the model's logits as they are (R+1 positions, model dtype): the function reads the first R
        log_probs, entropy, spi2 = chunked_logprobs_entropy(out.logits, responses, temperature, want_entropy,
                                                            want_sum_pi_squared)
        result.log_probs = log_probs if want_log_probs else None
        result.entropy, result.sum_pi_squared = entropy, spi2
    elif want_log_probs or want_entropy or want_sum_pi_squared:
        logits = scale_logits(out.logits[:, :-1, :].float(), temperature)
        if want_log_probs:
            result.log_probs = logprobs_from_logits(logits, responses)
        if want_entropy:
            result.entropy = entropy_from_logits(logits)
        if want_sum_pi_squared:  # logits are already temperature-scaled
            result.sum_pi_squared = calculate_sum_pi_squared_from_logits(logits)
    if value_head is not None:
        hidden = out.hidden_states[-1][:, -response_length - 1 : -1, :]
        result.values = value_head(hidden.to(value_head.weight.dtype)).squeeze(-1)
    return result


def _fusable_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head where log-probs and entropy can be computed from the hidden states without making the
    logits (:func:`ppolab.algos.fused_head.fused_head_logprobs_entropy`): a plain ``nn.Linear`` head (tied or
    not; not a LoRA-wrapped one) of a causal LM whose forward is decoder → head with nothing in between — no logit
    soft-capping or scaling (Gemma 2, Cohere) — and whose decoder is reachable. Else None: the logits path."""
    get_head, get_decoder = getattr(model, "get_output_embeddings", None), getattr(model, "get_decoder", None)
    if get_head is None or get_decoder is None:
        return None
    try:
        head, decoder = get_head(), get_decoder()
    except (AttributeError, NotImplementedError):
        return None
    cfg = getattr(model, "config", None)
    if type(head) is not nn.Linear or decoder is None or decoder is model:
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return None
    return head


def _forward_fused(model: nn.Module, head: nn.Linear, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   response_length: int, temperature: float, want_log_probs: bool, want_entropy: bool,
                   value_head: nn.Module | None) -> ResponseOutputs:
    """:func:`forward_response` through the decoder alone: its last hidden states at the R positions that score the
    response (the one-token shift) go to the fused head computation, and to the value head where there is one."""
    out = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    hidden = out.last_hidden_state[:, -response_length - 1: -1, :]
    log_probs, entropy = fused_head_logprobs_entropy(hidden, head.weight, input_ids[:, -response_length:],
                                                     temperature, want_entropy, head.bias)
    result = ResponseOutputs(log_probs=log_probs if want_log_probs else None, entropy=entropy)
    if value_head is not None:
        result.values = value_head(hidden.to(value_head.weight.dtype)).squeeze(-1)
    return result


def _forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
             hidden: bool = False):
    """The model on prompt ‖ response, keeping the logits of the last R + 1 positions (the first R score the
    response tokens: the one-token shift)."""
    return model(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids_from_mask(attention_mask), output_hidden_states=hidden,
                 logits_to_keep=response_length + 1, use_cache=False)


def response_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    response_length: int) -> torch.Tensor:
    """(bs, R, V) raw logits (model dtype, no temperature) that score each response token — the same forward and
    one-token shift as :func:`forward_response`, for readings over the full distribution (chapter §7.3)."""
    return _forward(model, input_ids, attention_mask, response_length).logits[:, :-1, :]


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them (verl
    ``actor_rollout_ref.model.enable_gradient_checkpointing``): memory per layer drops to its input, for ~30% more
    compute. Non-reentrant checkpointing (``use_reentrant=False``) back-propagates into LoRA weights without the
    embedding output having to require grad, which the reentrant variant needs with a frozen base. HF applies it only
    in train mode; Qwen2 has no dropout, so train mode changes no number."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x's name; the old one warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class ValueHead(nn.Linear):
    """V(s) = w·h + b on the last hidden state (verl's critic: a token-classification head, 1 label)."""

    def __init__(self, hidden_size: int, seed: int = 0):
        super().__init__(hidden_size, 1)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.weight.shape, generator=g) * 0.02)
            self.bias.zero_()


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
