"""Policy loading from a real local HF folder (a random tiny Llama built in the test)."""

import json

import pytest
import torch

from labkit.policy.loading import PolicyLoadError, load_policy

CODE = ["def f(x):\n    return x + 1\n"]


@pytest.fixture
def model_dir(random_model_dir):
    return random_model_dir


def test_full_finetune_has_frozen_reference(model_dir):
    pol = load_policy(str(model_dir))
    assert pol.device.type == "cpu" and pol.dtype == torch.float32
    assert pol.tokenizer.is_fast and pol.tokenizer.pad_token is not None
    with pol.reference() as ref:
        assert ref is not pol.model
        assert not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in pol.model.parameters())


def test_lora_reference_is_adapters_disabled(model_dir):
    pol = load_policy(str(model_dir), lora=True, lora_r=4)
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = pol.tokenizer(CODE[0], return_tensors="pt").input_ids
    # make the adapters do something, then check the reference ignores them
    for n, p in pol.model.named_parameters():
        if "lora_B" in n:
            p.data.fill_(0.1)
    with torch.no_grad():
        with_adapters = pol.model(ids).logits
        with pol.reference() as ref:
            without = ref(ids).logits
    assert not torch.allclose(with_adapters, without)
    assert pol._frozen_ref is None  # no second copy of the weights


def test_ema_baseline(model_dir):
    pol = load_policy(str(model_dir))
    p0 = next(pol.baseline().parameters()).clone()
    with torch.no_grad():
        for p in pol.model.parameters():
            p.add_(1.0)
    pol.update_baseline(beta=0.9)
    assert torch.allclose(next(pol.baseline().parameters()), p0 + 0.1, atol=1e-6)


def test_bad_inputs(model_dir, tmp_path):
    with pytest.raises(PolicyLoadError, match="no such folder"):
        load_policy(str(tmp_path / "nope"))
    with pytest.raises(PolicyLoadError, match="has no config.json"):
        load_policy(str(tmp_path))
    with pytest.raises(PolicyLoadError, match=r"LoRA targets \['nope'\] do not exist"):
        load_policy(str(model_dir), lora=True, lora_targets=("nope",))
    with pytest.raises(PolicyLoadError, match="unknown policy option 'lr'"):
        load_policy(str(model_dir), lr=1)
    # a folder holding a model that is not a causal LM
    bad = tmp_path / "bert"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(PolicyLoadError):
        load_policy(str(bad))


def test_weights_fingerprint_names_the_weights(model_dir, tmp_path):
    """The fingerprint results record is stable for one folder and moves with any weight byte."""
    import shutil

    from labkit.policy.loading import weights_fingerprint

    a = weights_fingerprint(str(model_dir))
    assert a == weights_fingerprint(str(model_dir)) and len(a) == 12
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert weights_fingerprint(str(copy)) == a
    w = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert weights_fingerprint(str(copy)) != a
    w.unlink()
    with pytest.raises(PolicyLoadError, match="no weight files"):
        weights_fingerprint(str(copy))
