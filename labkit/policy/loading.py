"""Load a policy from a spec: ``"tiny"`` (the shipped default) or a local HF folder.

:func:`load_policy` returns a :class:`Policy`: the causal LM, its tokenizer, the device,
and the two other policies RL needs without paying for needless copies:

* the **reference** policy for the KL term: with LoRA, the same weights with the adapters
  disabled (no second copy); with full fine-tuning, a frozen copy;
* an **EMA baseline** policy for counterfactual forking: ``theta_b <- beta * theta_b +
  (1 - beta) * theta`` over the trainable parameters, created on first use.

Everything loads offline with ``from_pretrained`` from a local folder.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import torch

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_DIR = REPO_ROOT / "data" / "models" / "tiny"

# LoRA targets by ``config.model_type`` (attention projections; MLPs optional).
DEFAULT_LORA_TARGETS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "qwen3": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mistral": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "gemma": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "phi3": ("qkv_proj", "o_proj"),
    "gpt2": ("c_attn", "c_proj"),
    "gpt_neox": ("query_key_value", "dense"),
    "gpt_bigcode": ("c_attn", "c_proj"),
    "starcoder2": ("q_proj", "k_proj", "v_proj", "o_proj"),
}


class PolicyLoadError(ValueError):
    """The spec, folder or options cannot make a policy; the message says what to do."""


@dataclass
class PolicyConfig:
    """How to load a policy."""

    spec: str = "tiny"
    """``"tiny"`` (``data/models/tiny``) or a path to a local Hugging Face causal-LM folder."""
    lora: bool = False
    """Train LoRA adapters (peft) instead of all weights."""
    lora_r: int = 16
    """LoRA rank r of the adapters (trainable parameters grow linearly with it)."""
    lora_alpha: int = 32
    """LoRA scaling alpha: the adapters' update is scaled by alpha / r."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input during training (0 = none)."""
    lora_targets: tuple[str, ...] = ()
    """Module names to adapt; empty = the default for the architecture (attention projections)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """``auto``: bfloat16 on CUDA, float32 on CPU."""
    device: str = "auto"
    """``auto``: ``cuda`` when available, else ``cpu``."""
    reference: Literal["auto", "none"] = "auto"
    """``auto``: adapters disabled under LoRA, a frozen copy otherwise; ``none``: no KL reference."""


def resolve_spec(spec: str) -> Path:
    """The model folder of a spec, checked: it exists and holds a readable ``config.json``."""
    if spec == "tiny":
        if not (TINY_DIR / "config.json").is_file():
            raise PolicyLoadError(
                f"the embedded tiny model is missing from {TINY_DIR}; "
                "train it with `python -m labkit pretrain-tiny` (about 20 minutes on 2 cores)")
        check_config_json(TINY_DIR)
        return TINY_DIR
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise PolicyLoadError(f"policy {spec!r}: no such folder; give 'tiny' or a local folder "
                              "holding a Hugging Face causal LM (config.json + weights)")
    if not (path / "config.json").is_file():
        raise PolicyLoadError(f"policy folder {str(path)!r} has no config.json; it is not a "
                              "Hugging Face model folder (save one with model.save_pretrained)")
    check_config_json(path)
    return path


def weights_fingerprint(spec: str) -> str:
    """The first 12 hex digits of the SHA-256 of a policy folder's weight files (their names
    and bytes, in name order): which model a result was measured on, e.g. after the shipped
    tiny model is rebuilt."""
    import hashlib

    folder = resolve_spec(spec)
    suffixes = (".safetensors", ".bin", ".pt", ".pth")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in suffixes)
    if not files:
        raise PolicyLoadError(f"policy folder {str(folder)!r} holds no weight files "
                              f"({', '.join('*' + x for x in suffixes)})")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:12]


def check_config_json(folder: Path) -> None:
    """Raise :class:`PolicyLoadError` naming ``config.json`` when it is not a JSON object:
    transformers reads it first, for the tokenizer too, and would blame the tokenizer."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise PolicyLoadError(f"{str(path)!r}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError:
        raise PolicyLoadError(f"{str(path)!r} is corrupt: not UTF-8 text; restore it or "
                              "save the model again (model.save_pretrained)") from None
    except json.JSONDecodeError as e:
        raise PolicyLoadError(f"{str(path)!r} is corrupt: not valid JSON ({e.msg} at line "
                              f"{e.lineno}, column {e.colno}); restore it or save the model "
                              "again (model.save_pretrained)") from None
    if not isinstance(config, dict):
        raise PolicyLoadError(f"{str(path)!r} is corrupt: it holds a JSON "
                              f"{type(config).__name__}, not an object; restore it or save the "
                              "model again (model.save_pretrained)")


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""``config.json`` keys that say how many positions a model has (the first one present)."""


def model_positions(spec: str) -> int | None:
    """How many token positions the policy ``spec`` has (prompt and completion share them),
    read from its ``config.json`` without loading it; ``None`` when it does not say."""
    config = json.loads((resolve_spec(spec) / "config.json").read_text())
    for key in POSITION_KEYS:
        if isinstance(config.get(key), int):
            return config[key]
    return None


def check_completion_length(spec: str, max_new_tokens: int, where: str) -> None:
    """Raise :class:`PolicyLoadError` when ``max_new_tokens`` (the option called ``where``)
    leaves no position of policy ``spec`` for the prompt."""
    positions = model_positions(spec)
    if positions is not None and max_new_tokens >= positions:
        raise PolicyLoadError(f"{where}={max_new_tokens} does not fit policy {spec!r}: it has "
                              f"{positions} positions for the prompt and the completion together; "
                              f"set {where} well below {positions} (e.g. {positions // 2})")


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                       else ("cpu" if device == "auto" else device))
    if dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        dt = getattr(torch, dtype)
    return dev, dt


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise PolicyLoadError(f"cannot load a tokenizer from {str(path)!r}: {e}") from None
    if not getattr(tok, "is_fast", False):
        raise PolicyLoadError(f"tokenizer in {str(path)!r} is not a fast tokenizer; labkit needs "
                              "offset mappings (tokenizer.json) to map code spans to tokens")
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise PolicyLoadError(f"tokenizer in {str(path)!r} has neither a pad nor an eos "
                                  "token; add a pad token (tokenizer.add_special_tokens) and save it")
        tok.pad_token = tok.eos_token
        log.info("tokenizer has no pad token; using eos %r for padding", tok.eos_token)
    tok.padding_side = "left"  # generation appends on the right
    return tok


def lora_targets_for(model, requested: tuple[str, ...]) -> list[str]:
    """The LoRA target names, checked against the model's linear-like modules."""
    targets = list(requested) or list(DEFAULT_LORA_TARGETS.get(model.config.model_type, ()))
    if not targets:
        raise PolicyLoadError(
            f"no default LoRA targets for model_type {model.config.model_type!r}; "
            "pass lora_targets (names of the linear layers to adapt)")
    leaf_names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"}
    missing = [t for t in targets if t not in leaf_names]
    if missing:
        raise PolicyLoadError(f"LoRA targets {missing} do not exist in this "
                              f"{model.config.model_type} model; its linear layers are "
                              f"{sorted(leaf_names)}")
    return targets


class Policy:
    """A causal LM with its tokenizer, reference policy and (lazily) an EMA baseline."""

    def __init__(self, model, tokenizer, config: PolicyConfig, device: torch.device,
                 dtype: torch.dtype, path: Path):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.device = device
        self.dtype = dtype
        self.path = path
        self._frozen_ref = None
        self._baseline = None
        if config.reference == "auto" and not config.lora:
            self._frozen_ref = self._frozen_copy()

    # --------------------------------------------------------------------- reference
    def _frozen_copy(self):
        ref = copy.deepcopy(self.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @property
    def is_lora(self) -> bool:
        return self.config.lora

    @contextlib.contextmanager
    def reference(self) -> Iterator:
        """Yields the reference model for KL: adapters disabled (LoRA) or the frozen copy."""
        if self.config.reference == "none":
            raise RuntimeError("this policy was loaded with reference='none' (no KL reference)")
        if self.is_lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self._frozen_ref

    # --------------------------------------------------------------------- EMA baseline
    def baseline(self):
        """The EMA baseline policy (a frozen copy, created on first use)."""
        if self._baseline is None:
            self._baseline = self._frozen_copy()
        return self._baseline

    @torch.no_grad()
    def update_baseline(self, beta: float = 0.99) -> None:
        """``theta_b <- beta * theta_b + (1 - beta) * theta`` over all parameters."""
        base = self.baseline()
        for pb, p in zip(base.parameters(), self.model.parameters()):
            pb.mul_(beta).add_(p.detach().to(pb.dtype), alpha=1 - beta)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        t = sum(p.numel() for p in self.trainable_parameters())
        return (f"Policy({self.config.spec!r}, {self.model.config.model_type}, {n:,} params, "
                f"{t:,} trainable, {'LoRA' if self.is_lora else 'full'}, {self.device}, {self.dtype})")


def load_policy(spec: str | PolicyConfig = "tiny", **overrides) -> Policy:
    """Load a policy: ``load_policy("tiny")``, ``load_policy("/models/qwen", lora=True)``."""
    cfg = spec if isinstance(spec, PolicyConfig) else PolicyConfig(spec=spec)
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise PolicyLoadError(f"unknown policy option {k!r}; options: "
                                  f"{sorted(PolicyConfig.__dataclass_fields__)}")
        setattr(cfg, k, v)
    path = resolve_spec(cfg.spec)
    device, dtype = resolve_device_dtype(cfg.device, cfg.dtype)
    tok = load_tokenizer(path)

    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    except ValueError as e:
        raise PolicyLoadError(f"{str(path)!r} does not hold a causal LM that transformers can "
                              f"load with AutoModelForCausalLM: {e}") from None
    except OSError as e:
        raise PolicyLoadError(f"cannot load model weights from {str(path)!r}: {e}") from None
    model.to(device)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    if cfg.lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(model, cfg))
    return Policy(model, tok, cfg, device, dtype, path)


def lora_config(model, cfg: PolicyConfig):
    """peft's ``LoraConfig`` of ``cfg`` (rank, alpha, dropout, targets checked against
    ``model``): the one labkit's policy and TRL's trainer (``peft_config``) both wrap a model
    with, so their adapters' parameters have the same names."""
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=lora_targets_for(model, tuple(cfg.lora_targets)),
                      task_type="CAUSAL_LM")
