"""The whole typed config tree of a PPO/GRPO run, with verl's key names and defaults (verl `ppo_trainer.yaml`).

Only plain dataclasses live here (no torch, no OmegaConf), so building, copying and checking a config
takes microseconds. ``ppolab.config.loader`` merges YAML presets and ``key=value`` overrides into this tree
and validates it. A field that verl inherits from elsewhere (the critic's batching and loss assembly,
chapter §8) is ``None`` here and filled by :meth:`PPOConfig.resolve`.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ppolab.config.actor import ActorConfig, OptimConfig, RolloutCorrectionConfig
from ppolab.vocab import GROUP_ADV_ESTIMATORS  # noqa: F401 (re-exported)

#: LoRA targets of a Llama/Qwen-style decoder: every attention and MLP projection.
DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]



class ConfigError(ValueError):
    """A config that cannot run: unknown key, wrong type or an illegal value; the message names the field."""

    def __init__(self, message: str, errors: Optional[list[str]] = None) -> None:
        super().__init__(message)
        self.errors = errors if errors is not None else [message]


class ConfigNotice(UserWarning):
    """A legal but usually unintended combination (e.g. both KL paths on, chapter §7.4)."""


# ------------------------------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    """verl's ``data``: which prompts, how many per step, and how long prompt and response may be."""

    train_files: list[str] = field(default_factory=list)
    """Parquet files of training prompts (verl format: prompt, reward_model.ground_truth, data_source)."""
    val_files: list[str] = field(default_factory=list)
    """Parquet files of validation prompts."""
    train_batch_size: int = 1024
    """Prompts per training step; each gets rollout.n trajectories (chapter §11.1)."""
    val_max_samples: Optional[int] = None
    """Evaluate only the first N validation prompts; None = all of them."""
    max_prompt_length: int = 512
    """Prompt tokens kept (longer prompts are filtered out)."""
    max_response_length: int = 512
    """Maximum generated tokens per trajectory."""
    shuffle: bool = True
    """Shuffle the training prompts every epoch."""
    seed: Optional[int] = None
    """Seed of the prompt shuffler; None = trainer.seed."""


# ------------------------------------------------------------------------------------ actor_rollout_ref


@dataclass
class ModelConfig:
    """verl's ``actor_rollout_ref.model``: the one base model shared by actor, rollout and reference."""

    path: str = ""
    """Local directory of a HF causal LM (checked by the trainer when it loads, not by validate)."""
    lora_rank: int = 0
    """LoRA rank of the actor adapter; 0 = full fine-tuning (then the reference is a frozen copy)."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = lora_alpha / lora_rank)."""
    target_modules: Any = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    """Module names LoRA wraps: a list of names or the string "all-linear"."""
    dtype: str = "float32"
    """Parameter dtype: float32 (CPU default), bfloat16 or float16."""
    enable_gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of storing them (non-reentrant): activation
    memory of the actor (and a full-fine-tuning critic) drops to one layer's input per layer, for ~30% more compute.
    Gradients are unchanged. verl's key, default off."""
    use_remove_padding: bool = False
    """verl's key: the actor's and the reference's forwards run on packed rows — a micro-batch's real tokens end to
    end in one row, position ids restarting with each sequence — so no slot is spent on padding (chapter §9,
    §11.5; ``ppolab.algos.remove_padding``). The same numbers as the padded forward to float rounding. verl 0.9.1's
    default is true (``model/hf_model.yaml``); ppolab's stays false until its shipped runs are re-recorded packed,
    since a run replays with the setting it was trained with."""


@dataclass
class ValKwargsConfig:
    """Sampling used for validation (verl ``rollout.val_kwargs``): greedy by default."""

    top_k: int = -1
    """Top-k for validation; -1 = off."""
    top_p: float = 1.0
    """Nucleus threshold for validation."""
    temperature: float = 0.0
    """Validation temperature; 0 = greedy."""
    n: int = 1
    """Responses per validation prompt."""
    do_sample: bool = False
    """Sample (True) or decode greedily (False) during validation."""


@dataclass
class MultiTurnConfig:
    """verl's ``rollout.multi_turn``: the tool-calling agent loop (tool tokens get response_mask 0)."""

    enable: bool = False
    """Run the multi-turn agent loop instead of a single generation."""
    max_assistant_turns: Optional[int] = None
    """Assistant turns per trajectory; required (≥ 1) when enable."""
    max_tool_response_length: int = 32
    """Tokens of each tool response kept in the context."""


@dataclass
class AgentConfig:
    """verl's ``rollout.agent``: which agent loop generates a trajectory."""

    default_agent_loop: str = "single_turn_agent"
    """Agent loop name: single_turn_agent or tool_agent."""


@dataclass
class RolloutConfig:
    """verl's ``actor_rollout_ref.rollout``: the generation engine and the old-log-prob forward."""

    name: str = "hf"
    """Generation engine: hf (transformers generate) or vllm (a vLLM engine; CUDA, or vLLM's CPU build)."""
    n: int = 1
    """Trajectories sampled per prompt (the group size of GRPO-like estimators)."""
    temperature: float = 1.0
    """Sampling temperature; the update divides logits by the same value (verl `prepare_model_outputs`)."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1]."""
    top_k: int = -1
    """Top-k sampling; -1 = off."""
    dtype: Optional[str] = None
    """Compute dtype of generation; None = actor_rollout_ref.model.dtype. hf engine on float32 weights:
    bfloat16/float16 generate under torch.autocast, a real rollout/trainer numerics gap (verl's default pairs a
    bf16 vLLM rollout with an fp32 trainer)."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Rows per forward when recomputing old log-probs; required unless log_prob_use_dynamic_bsz."""
    log_prob_use_dynamic_bsz: bool = False
    """Pack the old-log-prob forward by token budget instead of row count."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget of the old-log-prob forward when log_prob_use_dynamic_bsz."""
    calculate_log_probs: bool = True
    """Return the engine's own log-probs (needed by rollout correction and bypass mode)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take for weights and KV cache."""
    enforce_eager: bool = False
    """vLLM: disable CUDA graphs (slower, less memory, faster start)."""
    free_cache_engine: bool = True
    """vLLM: sleep after each generate (free the KV cache, offload weights) so training gets the memory back."""
    max_model_len: Optional[int] = None
    """vLLM: longest sequence the engine serves; None = data.max_prompt_length + data.max_response_length."""
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    """Sampling settings for validation."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn tool loop settings."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Agent loop selection."""


@dataclass
class RefConfig:
    """verl's ``actor_rollout_ref.ref``: the reference-policy forward (LoRA: the actor with adapters off)."""

    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Rows per forward when computing ref log-probs; required unless log_prob_use_dynamic_bsz."""
    log_prob_use_dynamic_bsz: bool = False
    """Pack the ref forward by token budget instead of row count."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget of the ref forward when log_prob_use_dynamic_bsz."""


@dataclass
class ActorRolloutRefConfig:
    """verl's ``actor_rollout_ref``: the policy in its three roles."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Base model and adapter."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The trained policy: loss, batching, optimiser."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation and old log-probs."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy forward."""


# ---------------------------------------------------------------------------------------------- critic


@dataclass
class CriticModelConfig:
    """verl's ``critic.model``: the value model; every None inherits the actor's model setting."""

    path: Optional[str] = None
    """Base model of the critic; None = actor_rollout_ref.model.path."""
    lora_rank: Optional[int] = None
    """Critic LoRA rank; None = the actor's lora_rank."""
    lora_alpha: Optional[int] = None
    """Critic LoRA alpha; None = the actor's lora_alpha."""
    target_modules: Any = None
    """Critic LoRA targets; None = the actor's target_modules."""
    use_remove_padding: bool = False
    """The critic's forwards on packed rows, as ``actor_rollout_ref.model.use_remove_padding`` for the actor: verl's
    own key, set apart from the actor's (verl 0.9.1's default is true there too; ppolab's false for the same
    reason)."""


@dataclass
class CriticConfig:
    """verl's ``critic``: the value model, its clipped loss (chapter §8) and its batching."""

    enable: Optional[bool] = None
    """Train a critic; None = on iff algorithm.adv_estimator == gae (as verl)."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """Value model settings."""
    ppo_mini_batch_size: Optional[int] = None
    """Mini-batch size in prompts (×rollout.n); None = the actor's."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """verl's top-level key, accepted and **ignored by the V1 critic** (chapter §8, §11.6, §14.1; verl
    `trainer_base.py` does not pass it to the critic engine, which packs by ``ppo_infer_max_token_len_per_gpu``).
    verl's CriticConfig still requires it unless use_dynamic_bsz, so ppolab does too; a ConfigNotice says it is
    ignored when it would cut a mini-batch into smaller micro-batches."""
    use_dynamic_bsz: bool = False
    """verl's top-level key, **ignored by the V1 critic**: its engine always packs micro-batches by token budget
    (EngineConfig's default ``use_dynamic_bsz=True``). Only verl's config checks read it: false needs
    ppo_micro_batch_size_per_gpu and train_batch_size ≥ ppo_mini_batch_size. §14.1 sets it true so that no fixed
    critic micro-batch looks like a knob."""
    ppo_max_token_len_per_gpu: int = 32768
    """verl's top-level key, **ignored by the V1 critic** (a ConfigNotice says so when it is changed): the token
    budget that acts is ``ppo_infer_max_token_len_per_gpu``."""
    ppo_infer_max_token_len_per_gpu: int = 32768
    """The critic's token budget per micro-batch per rank, for both its value forward (stage 6) and its update
    (stage 8): verl V1 `trainer_base.py` writes it into the critic engine's ``infer_max_token_len_per_gpu`` and
    ``max_token_len_per_gpu`` (chapter §11.6), so despite "infer" in its name it also cuts the critic's training
    micro-batches. A mini-batch of B rows with ΣL tokens becomes min(B, ceil(ΣL / budget)) micro-batches, more if
    one would overflow (verl `rearrange_micro_batches`, §11.5); the update is the same up to float rounding (§13),
    so it is a memory knob. Not in verl's critic YAML: its dataclass default (32768) applies unless given on verl's
    command line as ``+critic.ppo_infer_max_token_len_per_gpu=…`` (the '+' adds a key; ppolab takes it with or
    without)."""
    ppo_epochs: Optional[int] = None
    """Critic passes per training step; None = the actor's ppo_epochs."""
    shuffle: Optional[bool] = None
    """Shuffle rows before cutting critic mini-batches; None = the actor's shuffle."""
    data_loader_seed: int = 42
    """Seed of the critic mini-batch shuffler."""
    cliprange_value: float = 0.5
    """ε_v: how far a new value may move from the old one before the clipped error takes over."""
    loss_agg_mode: Optional[str] = None
    """Aggregation of the value loss; None = the actor's loss_agg_mode."""
    loss_scale_factor: Optional[float] = None
    """C_norm of seq-mean-token-sum-norm for the critic; None = the actor's."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Optimiser of the critic (lr 1e-5 as verl)."""


# ------------------------------------------------------------------------------------------- algorithm


@dataclass
class KLCtrlConfig:
    """verl's ``algorithm.kl_ctrl``: the coefficient of the reward-side KL penalty (verl `core_algos` KL
    controllers)."""

    type: str = "fixed"
    """fixed (β constant) or adaptive (β moves toward target_kl)."""
    kl_coef: float = 0.001
    """β: initial / fixed reward-KL coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon in rows."""
    target_kl: float = 0.1
    """Adaptive controller target KL."""


@dataclass
class AlgorithmConfig:
    """verl's ``algorithm``: advantage estimator and reward-side KL."""

    adv_estimator: str = "gae"
    """Advantage estimator registry name (gae needs a critic; grpo/rloo/... need rollout.n ≥ 2)."""
    gamma: float = 1.0
    """Discount factor γ of GAE / returns."""
    lam: float = 1.0
    """GAE λ."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO divides by the group std (False = Dr.GRPO)."""
    use_kl_in_reward: bool = False
    """Reward-side KL: subtract β·KL(old‖ref) from the token rewards (chapter §7.1)."""
    kl_penalty: str = "kl"
    """Estimator of the reward-side KL (kl/k1, abs, mse/k2, low_var_kl/k3, optional '+')."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """Reward-KL coefficient controller."""
    rollout_correction: RolloutCorrectionConfig = field(
        default_factory=lambda: RolloutCorrectionConfig(rollout_is=None))
    """Rollout/old policy mismatch correction (verl's ppo_trainer.yaml: ``rollout_is: null`` here)."""
    gdpo_reward_keys: Optional[list[str]] = None
    """gdpo: the reward components (keys of the dict compute_score returns) normalised one by one; required."""
    gdpo_reward_weights: Optional[list[float]] = None
    """gdpo: weight of each component in gdpo_reward_keys order; None = all 1."""


@dataclass
class CustomRewardFunctionConfig:
    """verl's ``custom_reward_function``: a user ``compute_score`` instead of the built-in scorers."""

    path: Optional[str] = None
    """Python file defining the function; None = built-in scorer by data_source."""
    name: str = "compute_score"
    """Function name inside that file (verl signature)."""
    timeout_s: Optional[float] = 300.0
    """ppolab's, not verl's (verl waits forever): seconds one reward call may take before the run stops with an error
    naming the function; None = no limit. Either way a call still running after ``min(10, timeout_s / 2)`` s prints
    one line naming the function and the response it is scoring."""


@dataclass
class TrainerConfig:
    """verl's ``trainer``: loop length, logging, recording and devices."""

    total_training_steps: Optional[int] = 100
    """Training steps to run (one rollout batch each); None = ``total_epochs`` passes over train_files."""
    total_epochs: Optional[int] = None
    """Passes over train_files (each ⌊len(train_files) / train_batch_size⌋ steps: the tail is dropped). Training
    stops at whichever of the two limits comes first, as verl's loop does (an outer loop over total_epochs that
    returns at total_training_steps); None = no epoch limit."""
    seed: int = 1
    """Global seed (torch, sampling, data shuffle unless data.seed)."""
    run_dir: Optional[str] = None
    """Output directory; None = runs/<experiment_name>-<timestamp> (-2, -3 … if taken), chosen by the trainer. A
    directory that already holds a run is refused unless ``resume`` is true: runs are never mixed or overwritten."""
    project_name: str = "ppolab"
    """Project name: tensorboard logs go to ``<run_dir>/tensorboard/<project_name>/<experiment_name>`` (verl's
    ``tensorboard_log/{project_name}/{experiment_name}``), so runs of one project group together."""
    experiment_name: str = "run"
    """Run name (default run_dir prefix)."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """Metric sinks: console, tensorboard."""
    save_freq: int = -1
    """Save a checkpoint every N steps; -1 = never."""
    test_freq: int = -1
    """Validate every N steps; -1 = never."""
    record_freq: int = 1
    """Record the step's tensors for the labs every N steps; -1 = never."""
    record_update_state: bool = False
    """ppolab only: with each recorded step, also record the actor's trainable weights and optimizer state (Adam's
    moments, its step count, the learning-rate schedule) as they were before that step's update, so lab 18 can
    replay any recorded step's optimizer steps, not only step 1's. Costs 3 × 4 bytes per trainable weight and
    recorded step (LoRA: ≈ 0.55 MB at the tiny shape); off by default."""
    device: str = "auto"
    """auto (cuda if available), cpu or cuda."""
    resume: bool = False
    """Resume from the latest complete checkpoint in run_dir (a damaged latest one is named, and the previous
    complete one is taken with a warning); the run's files are untouched if the resume fails."""
    val_before_train: bool = True
    """Validate once before the first step."""
    critic_warmup: int = 0
    """Steps during which only the critic is updated."""
    n_gpus_per_node: Optional[int] = None
    """Processes (GPUs) per node. ppolab's ranks come from the launcher (torchrun / accelerate), so this is a check:
    when given, nnodes × n_gpus_per_node must equal the launched world size. None = whatever was launched."""
    nnodes: Optional[int] = None
    """Number of nodes (a check, as n_gpus_per_node); None = whatever was launched."""


# ----------------------------------------------------------------------------------------------- root


@dataclass
class PPOConfig:
    """The whole run: verl's ``ppo_trainer.yaml`` tree, restricted to what ppolab implements."""

    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and lengths."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy: model, actor, rollout, ref."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage and reward KL."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """Optional user scorer."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop and output."""

    @property
    def use_critic(self) -> bool:
        """Whether a critic is trained: critic.enable, or (when None) adv_estimator == gae (as verl)."""
        if self.critic.enable is not None:
            return bool(self.critic.enable)
        return self.algorithm.adv_estimator == "gae"

    def padding_multiple(self, dp_size: int) -> int:
        """What stage 3 (balance_batch) pads a step's rows to with synthetic samples: lcm(dp_size, actor
        ppo_mini_batch_size × n, and the critic's when there is one) — every rank then holds whole mini-batches
        (chapter §9, §12; verl V1 `trainer_base.py`). The one place this is computed; torch-free."""
        n = self.actor_rollout_ref.rollout.n
        minis = [self.actor_rollout_ref.actor.ppo_mini_batch_size * n]
        if self.use_critic:
            minis.append(self.critic.ppo_mini_batch_size * n)
        return math.lcm(dp_size, *minis)

    @property
    def use_reference_policy(self) -> bool:
        """Whether ref log-probs are needed: either KL path is on (verl ``need_reference_policy``)."""
        return bool(self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward)

    def resolve(self) -> PPOConfig:
        """Fill inherited ``None`` fields (critic ← actor, actor ← model, data.seed ← trainer.seed) in place;
        idempotent."""
        actor, model, critic = self.actor_rollout_ref.actor, self.actor_rollout_ref.model, self.critic
        # Chapter §8: the critic's batching and loss assembly default to the actor's, so PPO with a
        # critic updates both on the same mini-batch grid unless the user says otherwise.
        for name in ("ppo_mini_batch_size", "ppo_epochs", "shuffle", "loss_agg_mode", "loss_scale_factor"):
            if getattr(critic, name) is None:
                setattr(critic, name, getattr(actor, name))
        for name in ("path", "lora_rank", "lora_alpha", "target_modules"):
            if getattr(critic.model, name) is None:
                setattr(critic.model, name, copy.deepcopy(getattr(model, name)))
        if actor.use_remove_padding is None:
            actor.use_remove_padding = model.use_remove_padding
        if self.data.seed is None:
            self.data.seed = self.trainer.seed
        return self
