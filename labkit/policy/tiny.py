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
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int = 6
    max_position_embeddings: int = 768
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True


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
