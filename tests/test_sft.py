"""SFT: the loss is on completion tokens only, the schedule is right, and it learns."""

import pytest
import torch

from labkit.policy.loading import load_policy
from labkit.policy.sft import SFTConfig, _collate, lr_at, tokenize_pairs, train_sft

PAIRS = [("### Buggy\ndef f(x):\n    return x - 1\n### Fixed\n", "def f(x):\n    return x + 1\n"),
         ("### Buggy\ndef g(x):\n    return x * 3\n### Fixed\n", "def g(x):\n    return x * 2\n")]


def test_labels_cover_completion_and_eos_only(random_model_dir):
    pol = load_policy(str(random_model_dir), reference="none")
    ex, dropped = tokenize_pairs(pol.tokenizer, PAIRS, max_len=200)
    assert dropped == 0
    batch = _collate(ex, [0, 1], pol.tokenizer.pad_token_id)
    for b, (ids, p) in enumerate(ex):
        labels = batch["labels"][b]
        assert (labels[:p] == -100).all()
        assert labels[p:len(ids)].tolist() == ids[p:]
        assert ids[-1] == pol.tokenizer.eos_token_id
        assert (labels[len(ids):] == -100).all()


def test_schedule_golden():
    cfg = SFTConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg, 110) == pytest.approx(0.1)
    assert lr_at(9, cfg, 110) == pytest.approx(1.0)
    assert lr_at(10, cfg, 110) == pytest.approx(1.0)
    assert lr_at(60, cfg, 110) == pytest.approx(0.55)  # half way down the cosine
    assert lr_at(110, cfg, 110) == pytest.approx(0.1)


def test_sft_learns_the_pairs(random_model_dir):
    pol = load_policy(str(random_model_dir), reference="none")
    before = [p.detach().clone() for p in pol.model.parameters()]
    out = train_sft(pol.model, pol.tokenizer, PAIRS * 8,
                    SFTConfig(lr=3e-3, batch_size=8, max_steps=60, warmup_steps=5, log_every=10),
                    progress=False)
    assert out["steps"] == 60
    first, last = out["history"][0]["loss"], out["history"][-1]["loss"]
    assert last < 0.5 * first, (first, last)
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.model.parameters()))
