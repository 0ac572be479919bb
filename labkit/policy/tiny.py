"""The embedded tiny model: a byte-level BPE tokenizer and a small Llama-style causal LM,
built from scratch and offline, saved as a normal Hugging Face folder.

This module holds the building blocks (tokenizer training, model config, saving);
``python -m labkit pretrain-tiny`` trains the shipped model with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>")


@dataclass
class TinyModelConfig:
    """Shape of the tiny Llama-style model (defaults: about 2-3M parameters)."""

    vocab_size: int = 1024
    """BPE vocabulary size for code that trains a tokenizer from this config
    (``labkit.bench.rollout``). :func:`init_model` sizes the embeddings by ``len(tokenizer)``
    instead, so the model always matches its tokenizer."""
    hidden_size: int = 192
    """Width d of the residual stream and the embeddings; the per-head width is
    ``hidden_size / num_attention_heads`` (32 at the defaults). Parameters grow with d squared."""
    intermediate_size: int = 512
    """Width of each SwiGLU MLP (``3 x hidden_size x intermediate_size`` weights per layer)."""
    num_hidden_layers: int = 4
    """Transformer blocks, about ``4 d^2 + 3 d x intermediate_size`` weights each (0.44M at the
    defaults); depth adds cost per generated token."""
    num_attention_heads: int = 6
    """Query heads; must divide ``hidden_size``."""
    num_key_value_heads: int = 6
    """Key/value heads; fewer than ``num_attention_heads`` (which it must divide) is
    grouped-query attention: a smaller KV cache for sampling and forking, at some quality."""
    max_position_embeddings: int = 768
    """Longest sequence (prompt + completion) in tokens. The lab treats it as the context limit
    (multi-turn episodes, which HumanEval tasks fit); at 768 many HumanEval prompts do not."""
    rope_theta: float = 10000.0
    """Base of the rotary position frequencies; larger rotates more slowly, for longer
    contexts."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the LM head: saves ``vocab x hidden_size`` parameters
    (about 0.2M of the 2M)."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE (``tokenizers``) wrapped as a fast HF tokenizer with offsets."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL_TOKENS[0],
                                   bos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[1],
                                   model_max_length=4096)


def init_model(tokenizer, cfg: TinyModelConfig | None = None, seed: int = 0):
    """A randomly initialised ``LlamaForCausalLM`` sized by ``cfg`` for ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = cfg or TinyModelConfig()
    torch.manual_seed(seed)
    hf = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(hf)


def save(model, tokenizer, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
