"""pretrain-tiny end to end on a tiny budget: the same code path that builds the shipped
model (data, renamed copies, tokenizer, SFT, evaluation, manifest), in well under a minute."""

import json

import torch
from labkit.config import from_dict
from labkit.env.tasks import load_tasks
from labkit.policy.pretrain import PretrainConfig, pretrain_tiny
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_pretrain_tiny_builds_a_loadable_model_and_an_honest_manifest(tmp_path):
    out = tmp_path / "tiny"
    cfg = from_dict(PretrainConfig, {
        "out": str(out), "synthetic_problems": 6, "multi_hunk_problems": 4, "renamed_copies": 2,
        "bugs_per_problem": 1, "humaneval_bugs_per_problem": 1, "data_procs": 1, "vocab_size": 320,
        "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "num_key_value_heads": 2},
        "sft": {"max_steps": 3, "batch_size": 4, "warmup_steps": 1, "log_every": 1},
        "eval_synthetic_tasks": 2, "eval_humaneval_tasks": 1, "eval_k": 2,
    })
    assert cfg.rename_style == "compound"  # the shipped model's renaming
    manifest = pretrain_tiny(cfg, argv=["--set", f"out={out}"])

    assert manifest == json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == f"python -m labkit pretrain-tiny --set out={out}"
    assert manifest["config"]["rename_style"] == "compound"
    data = manifest["data"]
    assert data["renamed_pairs"] == 2 * data["synthetic_train_pairs"] > 0
    assert data["sft_examples"] + data["dropped_too_long"] == (
        data["synthetic_train_pairs"] + data["renamed_pairs"] + data["humaneval_train_pairs"])
    assert manifest["training"]["steps"] == 3 and len(manifest["loss_curve"]) == 3

    # SFT saw no held-out template (what `tasks overlap` checks on the shipped model)
    held_out = {t.meta["template"] for split in ("val", "test")
                for t in load_tasks("synthetic", split, n=40, seed=0)}
    assert manifest["sft_templates"] and not held_out & set(manifest["sft_templates"])

    # the folder is a plain Hugging Face model whose embeddings match its tokenizer
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert model.get_input_embeddings().weight.shape[0] == len(tok) == manifest["model"]["vocab"]
    assert sum(p.numel() for p in model.parameters()) == manifest["model"]["parameters"]

    test = manifest["quality"]["synthetic_test"]
    assert test["tasks"] == 2 and test["samples_per_task"] == 2
    for key in ("pass_at_1", "pass_at_2", "token_entropy", "zero_var_groups_frac", "name_kept_rate"):
        assert key in test
    assert 0.0 <= test["pass_at_1"] <= test["pass_at_2"] <= 1.0
    assert manifest["quality"]["humaneval_test"]["tasks"] == 1
    # the balanced row: as many tasks, at most eval_per_template (12) of any one template
    assert manifest["quality"]["synthetic_test_balanced"]["tasks"] == 2
    assert manifest["config"]["eval_per_template"] == 12
    # a set with no task at this size (two-bug tasks often fail validation) is left out
    assert all(q["tasks"] > 0 for q in manifest["quality"].values())

    # measured again at another temperature: the quality is rewritten, the rest kept
    from labkit.policy.pretrain import remeasure_quality

    weights = (out / "model.safetensors").read_bytes()
    again = remeasure_quality(from_dict(PretrainConfig, {**manifest["config"],
                                                         "eval_temperature": 1.5, "eval_k": 3}),
                              argv=["--set", "eval_temperature=1.5"])
    assert again == json.loads((out / "manifest.json").read_text())
    assert again["quality_measured"]["eval_temperature"] == 1.5
    assert again["quality_measured"]["command"] == "python -m labkit pretrain-tiny --evaluate-only --set eval_temperature=1.5"
    assert again["quality"]["synthetic_test"]["samples_per_task"] == 3
    assert {k: v for k, v in again.items() if k not in ("quality", "quality_measured")} == {
        k: v for k, v in manifest.items() if k != "quality"}
    assert (out / "model.safetensors").read_bytes() == weights

    # continued SFT from that folder, with generated programs added: same tokenizer and
    # shape, new weights, and no SFT program of a held-out template's shape (measured)
    more = tmp_path / "more"
    cont = pretrain_tiny(from_dict(PretrainConfig, {
        **manifest["config"], "out": str(more), "init_from": str(out), "generated_problems": 3,
        "generated_bugs": 1, "sft": {**manifest["config"]["sft"], "max_steps": 2}}))
    data = cont["data"]
    assert data["generated_pairs"] > 0 and data["held_out_shapes_in_sft"] == 0
    assert data["sft_examples"] + data["dropped_too_long"] == (
        data["synthetic_train_pairs"] + data["renamed_pairs"] + data["humaneval_train_pairs"]
        + data["generated_pairs"])
    assert any(t.startswith("generated/") for t in cont["sft_templates"])
    assert cont["config"]["init_from"] == str(out)
    assert (more / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    assert cont["model"] == manifest["model"]
    assert (more / "model.safetensors").read_bytes() != weights


def test_evaluate_only_needs_a_built_model(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "labkit", "pretrain-tiny", "--evaluate-only",
                        "--set", f"out={tmp_path / 'none'}"], capture_output=True, text=True)
    assert r.returncode != 0 and "no manifest here; build the model first" in r.stderr
    assert "Traceback" not in r.stderr
