import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CODE_SAMPLES = ["def f(x):\n    return x + 1\n", "def g(xs):\n    return [x * 2 for x in xs]\n",
                "### Fix the bug in this Python function.\n### Buggy\n### Fixed\n"] * 40


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A real HF folder holding a randomly initialised, very small Llama and its BPE."""
    from labkit.policy import tiny

    tok = tiny.train_tokenizer(CODE_SAMPLES, vocab_size=300)
    model = tiny.init_model(tok, tiny.TinyModelConfig(hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=2,
                                                      num_key_value_heads=2))
    return tiny.save(model, tok, tmp_path_factory.mktemp("m") / "tiny")
