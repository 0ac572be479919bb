"""The verl side of tests/test_integrations_verl.py, run in a subprocess with verl's folder
(.venv/verl, `make verl-extra`) on PYTHONPATH so that verl's packages never enter the test
process. Prints one JSON object: what verl's own classes and functions made of labkit's
dataset rows, reward functions and DiDPO credit on a hand-made batch."""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset

from labkit.integrations import verl as lv
from labkit.policy.loading import TINY_DIR

sys.path.insert(0, str(Path(__file__).parent))
from verl_cases import batch_rows, completions, tasks

out_dir = Path(sys.argv[1])
tok = AutoTokenizer.from_pretrained(str(TINY_DIR))
report = {}

# 1. the parquet rows load with verl's own dataset class
path = lv.write_parquet(tasks(), out_dir / "train.parquet")
ds = RLHFDataset(data_files=str(path), tokenizer=tok,
                 config=OmegaConf.create({"filter_overlong_prompts": False,
                                          "cache_dir": str(out_dir / "cache")}))
report["dataset"] = {"len": len(ds), "rows": [
    {"prompt": ds[i]["raw_prompt"][0]["content"], "task_id": ds[i]["extra_info"]["task_id"],
     "ground_truth": ds[i]["reward_model"]["ground_truth"], "data_source": ds[i]["data_source"]}
    for i in range(len(ds))]}

# 2. the reward functions, one response at a time and as a batch
rows = [dict(r) for r in lv.task_rows(tasks())]
by_id = {r["reward_model"]["ground_truth"]: r for r in rows}
cases = completions()
single, batch = {}, {}
for feedback, recipe in (("dense", "raw"), ("binary", "reshaped_grpo")):
    key = f"{feedback}/{recipe}"
    single[key] = [lv.compute_score(lv.DATA_SOURCE, text, tid, by_id[tid]["extra_info"],
                                    feedback=feedback, recipe=recipe) for tid, text in cases]
    batch[key] = lv.compute_score_batch([lv.DATA_SOURCE] * len(cases), [t for _, t in cases],
                                        [tid for tid, _ in cases],
                                        [by_id[tid]["extra_info"] for tid, _ in cases],
                                        feedback=feedback, recipe=recipe)
report["scores"] = {"single": single, "batch": batch}
# verl's own loader, as a launch config names the function (pkg:// path, reward_kwargs)
fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
    "path": "pkg://labkit.integrations.verl", "name": "compute_score",
    "reward_kwargs": {"feedback": "binary", "recipe": "reshaped_grpo"}}}}))
report["scores"]["loaded"] = [fn(data_source=lv.DATA_SOURCE, solution_str=text, ground_truth=tid,
                                 extra_info=by_id[tid]["extra_info"]) for tid, text in cases]

# 3. advantages on a hand-made verl batch: responses right-padded, rows not grouped in order
b = batch_rows(tok)
data = DataProto.from_dict(
    tensors={"responses": torch.tensor(b["responses"]),
             "response_mask": torch.tensor(b["mask"], dtype=torch.float32),
             "token_level_rewards": torch.tensor(b["token_rewards"], dtype=torch.float32)},
    non_tensors={"uid": np.array(b["uid"], dtype=object),
                 "extra_info": np.array([by_id[t]["extra_info"] for t in b["task_ids"]],
                                        dtype=object)})
didpo = lv.compute_advantage(data, lv.DIDPO, tokenizer=tok).batch["advantages"]
grpo = lv.compute_advantage(data, "grpo", num_repeat=1, norm_adv_by_std_in_grpo=True,
                            config=None).batch["advantages"].clone()
verl_own = ray_trainer.compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=True)
report["advantages"] = {"didpo": didpo.tolist(), "grpo_via_labkit": grpo.tolist(),
                        "grpo_verl": verl_own.batch["advantages"].tolist()}
try:
    lv.compute_advantage(data, lv.DIDPO)
except ValueError as e:
    report["no_tokenizer_error"] = str(e)
print(json.dumps(report))
