"""The verifier: both losses against hand-computed numbers and a naive loop, the ranking
metrics against brute force, and the model (value head, sequence classifier, LoRA) learning
a separable toy ranking."""

import math
import random

import pytest
import torch

from labkit.mucode.verifier import (VERIFIER_LOSSES, VerifierConfig, VerifierExample, auc,
                                    best_of_n_hit_rate, bt_loss, bt_pairs, build_verifier,
                                    bce_loss, evaluate_verifier, examples_from, pairwise_accuracy,
                                    ranking_metrics, train_verifier, heldin_loss)

# ----------------------------------------------------------------------------- losses


def test_bce_golden():
    # -log sigma(0) = log 2; -log(1 - sigma(2)) = log(1 + e^2); mean of the two
    loss = bce_loss(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert loss.item() == pytest.approx((math.log(2) + math.log(1 + math.e ** 2)) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(1.4100376, abs=1e-6)


def test_bt_golden():
    r, y = torch.tensor([1.0, 0.0, 3.0]), torch.tensor([1.0, 0.0, 0.0])
    # pairs (0,1): log(1+e^-1) + 1e-3 (1 + 0) = 0.3142617; (0,2): log(1+e^2) + 1e-3 (1 + 9) = 2.1369280
    assert bt_loss(r, y, torch.tensor([0, 0, 0])).item() == pytest.approx(1.2255948, abs=1e-6)
    # task 1 holds candidate 2 alone: only the pair (0, 1) remains
    assert bt_loss(r, y, torch.tensor([0, 0, 1])).item() == pytest.approx(0.3142617, abs=1e-6)
    # no pair at all: only the regulariser, 1e-3 * mean r^2
    assert bt_loss(r, torch.zeros(3), torch.tensor([0, 0, 0])).item() == pytest.approx(1e-3 * 10 / 3)
    # zero scores: every pair costs log 2
    assert bt_loss(torch.zeros(3), y, torch.zeros(3)).item() == pytest.approx(math.log(2))


def _bt_naive(r, y, g, reg=1e-3):
    terms = []
    for i in range(len(r)):
        for j in range(len(r)):
            if g[i] == g[j] and y[i] > y[j]:
                terms.append(-math.log(1 / (1 + math.exp(-(r[i] - r[j])))) + reg * (r[i] ** 2 + r[j] ** 2))
    return sum(terms) / len(terms)


def test_bt_matches_a_naive_loop():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(3, 12)
        r = [rng.gauss(0, 2) for _ in range(n)]
        y = [float(rng.random() < 0.4) for _ in range(n)]
        g = [rng.randint(0, 2) for _ in range(n)]
        if not bt_pairs(y, g):
            continue
        got = bt_loss(torch.tensor(r), torch.tensor(y), torch.tensor(g), reg=0.01).item()
        assert got == pytest.approx(_bt_naive(r, y, g, 0.01), rel=1e-5)


def test_loss_registry():
    assert VERIFIER_LOSSES.names() == ["bce", "bt"]
    assert VERIFIER_LOSSES.get("bt") is bt_loss
    with pytest.raises(ValueError, match="already registered"):
        VERIFIER_LOSSES.register("bt")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="unknown verifier loss"):
        VerifierConfig(loss="hinge").validate()


# ----------------------------------------------------------------------------- metrics


def test_metrics_golden():
    s = [0.9, 0.1, 0.5, 0.3, 0.3, 0.8]
    y = [1, 0, 0, 1, 0, 0]
    g = ["a", "a", "a", "b", "b", "b"]
    # pairs a: (0,1) win, (0,2) win; b: (3,4) tie, (3,5) loss -> (1 + 1 + 0.5 + 0) / 4
    assert pairwise_accuracy(s, y, g) == pytest.approx(0.625)
    # all pos/neg pairs: 0.9 beats all 4 negatives; 0.3 beats 0.1, ties 0.3, loses to 0.5, 0.8
    assert auc(s, y) == pytest.approx((4 + 1.5) / 8)
    assert best_of_n_hit_rate(s, y, g) == (0.5, pytest.approx(1 / 3), 2)
    assert math.isnan(auc([1.0, 2.0], [1, 1]))
    m = ranking_metrics(s, y, g)
    assert m["verifier/pos_frac"] == pytest.approx(1 / 3) and m["verifier/bon_tasks"] == 2


def test_auc_matches_brute_force():
    rng = random.Random(1)
    for _ in range(30):
        n = rng.randint(2, 15)
        s = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(n)]
        y = [rng.randint(0, 1) for _ in range(n)]
        pos = [a for a, b in zip(s, y) if b]
        neg = [a for a, b in zip(s, y) if not b]
        if not pos or not neg:
            continue
        brute = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))
        assert auc(s, y) == pytest.approx(brute)


# ----------------------------------------------------------------------------- the model


def _toy_examples():
    """Separable by a word: programs with 'return x + 1' pass, others fail."""
    from conftest import toy_tasks

    tasks = toy_tasks()
    good = [f"def {t.entry_point}(x):\n    return x + 1\n" for t in tasks]
    bad = [f"def {t.entry_point}(x):\n    return x * 7\n" for t in tasks]
    return examples_from(tasks + tasks + tasks[:1], good + bad + good[:1], [1.0] * 4 + [0.0] * 4 + [1.0])


@pytest.mark.parametrize("loss", ["bt", "bce"])
def test_value_head_verifier_learns_a_separable_ranking(random_model_dir, loss):
    ex = _toy_examples()
    assert len(ex) == 8  # the duplicate (task, code) was dropped
    cfg = VerifierConfig(backbone=str(random_model_dir), loss=loss, epochs=15, lr=5e-3,
                         tasks_per_batch=4, max_len=64)
    v = build_verifier(cfg)
    assert v.score_texts([e.text for e in ex]) == [0.0] * 8  # zero-initialised head
    before = [p.detach().clone() for p in v.parameters()]
    info = train_verifier(v, ex, cfg)
    assert info["pairs_per_batch"] == 4  # one pair per task, all four tasks in a batch
    assert info["losses"][-1] < info["losses"][0]
    assert any(not torch.equal(a, b) for a, b in zip(before, v.parameters()))
    m = evaluate_verifier(v, ex)
    assert m["verifier/pairwise_acc"] == 1.0 and m["verifier/auc"] == 1.0
    assert m["verifier/bon_hit"] == 1.0


def test_verifier_trains_until_the_heldin_loss_stops_falling(random_model_dir):
    ex = _toy_examples()
    flipped = [VerifierExample(e.group, e.text, 1.0 - e.label) for e in ex]
    cfg = VerifierConfig(backbone=str(random_model_dir), loss="bt", epochs=15, lr=5e-3,
                         tasks_per_batch=4, max_len=64, patience=2)
    v = build_verifier(cfg)
    info = train_verifier(v, ex, cfg, validation=flipped)
    # learning the training ranking raises the loss on its flip from the first pass on
    assert info["best_epoch"] == 1 and info["epochs"] == 1 + cfg.patience
    assert len(info["heldin_losses"]) == info["epochs"]
    # the weights kept are the best pass's: its loss, computed again
    assert heldin_loss(v, flipped, cfg) == pytest.approx(min(info["heldin_losses"]), abs=1e-6)
    # held in on its own training data, the loss falls for longer
    v2 = build_verifier(cfg)
    info2 = train_verifier(v2, ex, cfg, validation=ex)
    assert info2["epochs"] > info["epochs"]
    assert info2["heldin_losses"][info2["best_epoch"] - 1] == min(info2["heldin_losses"])
    with pytest.raises(ValueError, match="patience"):
        VerifierConfig(patience=-1).validate()


def test_seqcls_and_lora_verifiers(random_model_dir):
    v = build_verifier(VerifierConfig(backbone=str(random_model_dir), kind="seqcls", max_len=64))
    ex = _toy_examples()
    s = v.score_texts([e.text for e in ex])
    assert len(s) == 8 and all(math.isfinite(x) for x in s)
    lv = build_verifier(VerifierConfig(backbone=str(random_model_dir), lora=True, max_len=64))
    names = [n for n, p in lv.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n or n.startswith("head.") for n in names)
    assert any(n.startswith("head.") for n in names)
    info = train_verifier(lv, ex, VerifierConfig(epochs=2, lr=1e-2, max_len=64))
    assert info["steps"] == 2


def test_train_verifier_rejects_empty_data(random_model_dir):
    v = build_verifier(VerifierConfig(backbone=str(random_model_dir), max_len=64))
    with pytest.raises(ValueError, match="no examples"):
        train_verifier(v, [], VerifierConfig())
    assert isinstance(_toy_examples()[0], VerifierExample)
