"""Small random Llama-family models for tests of the lean paths (decode step, update tail):
a Llama with as many key heads as query heads, a Qwen2 with grouped-query attention and
attention bias, and LoRA layers on top of either."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def qwen2():
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                      rope_theta=1000.0, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


def llama():
    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def lora(model, targets=("q_proj", "v_proj", "up_proj")):
    from peft import LoraConfig, get_peft_model

    m = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets),
                                         lora_dropout=0.0, init_lora_weights=False))
    return m.eval()
