"""The step benchmark counts the arithmetic it compares with (no timing is asserted)."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest


def test_forward_flops_golden():
    from labkit.bench.step import forward_flops

    cfg = SimpleNamespace(hidden_size=4, num_hidden_layers=2, intermediate_size=8, vocab_size=10,
                          num_attention_heads=2, num_key_value_heads=1)
    # block: q, o 2*16; k, v 2*4*2; gate, up, down 3*4*8 -> 32 + 16 + 96 = 144 per layer
    per_token = 2 * 2 * 144 + 4 * 2 * 4 * 3.0  # context 3
    assert forward_flops(cfg, 5, 3.0, 2) == pytest.approx(5 * per_token + 2 * 2 * 4 * 10)


@pytest.mark.slow
def test_step_bench_runs_and_reports_phases_and_the_floor():
    p = subprocess.run([sys.executable, "-m", "labkit.bench", "step", "--steps", "2", "--tasks", "1",
                        "--group", "2", "--sampler", "inverse_cdf", "--temperature", "1.3"],
                       capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(out["phases"]) == {"prefill", "decode", "sandbox", "reward", "update_reference",
                                  "update_forward", "update_backward", "update_optimizer"}
    assert out["flops"] > 0 and out["matmul_gflops"] > 0 and out["floor_s"] > 0
    assert out["ratio"] == pytest.approx(out["step_s"] / out["floor_s"], rel=0.02)
    # the floor takes the better of the two throughputs measured around the steps
    assert out["matmul_gflops"] == max(out["matmul_gflops_before_after"])
    assert out["decode_positions_incl_padding"] >= out["completion_tokens"] > 0
    assert out["sampler"] == "inverse_cdf"  # the flag reaches the experiments' sampling config
    assert out["temperature"] == 1.3
    assert 1 <= out["distinct_programs_per_step"] <= 2  # one task x 2 samples per step


@pytest.mark.slow
def test_fork_bench_runs_and_reports_its_bound(tmp_path):
    """... and ``--record`` appends its JSON line, command and machine to a record file, from
    which the benchmarks table is generated."""
    from labkit.docs.findings import benchmarks

    records = tmp_path / "records.jsonl"
    p = subprocess.run([sys.executable, "-m", "labkit.bench", "fork", "--tasks", "2", "--group", "2",
                        "--max-new-tokens", "12", "--repeats", "1", "--fork-batch", "4",
                        "--record", str(records)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    rec = json.loads(records.read_text())
    assert rec["result"] == out and rec["bench"] == "fork" and rec["machine"]["cores"] >= 1
    assert rec["command"].endswith("fork --tasks 2 --group 2 --max-new-tokens 12 --repeats 1 --fork-batch 4")
    row = next(line for line in benchmarks(records).splitlines() if line.startswith("| `fork`"))
    verdict = "met" if out["wall_ratio"] <= 0.5 else "missed"
    assert f"`wall_ratio` {out['wall_ratio']} ({verdict})" in row
    # greedy forks: the kept cache (prompt shared, lean decode), the rebuilt one and naive
    # re-encoding continue every fork with the same tokens
    assert out["identical_fraction"] == 1.0 and out["rebuilt_identical_fraction"] == 1.0
    assert out["forks"] > 0 and out["generated_tokens"] > 0
    assert 0 < out["recomputed_positions_ratio"] < 1
    assert 0 < out["decode_bound_ratio"] and out["reuse_decode_s"] > 0


def test_benchmarks_table_shows_each_command_latest_record_and_skips_other_figures(tmp_path):
    from labkit.docs.findings import benchmarks

    def rec(command, **result):
        return json.dumps({"bench": "sandbox", "command": command, "result": result,
                           "machine": {"cores": 2, "load_1min": 0.1}})

    plain, short = "python -m labkit.bench sandbox", "python -m labkit.bench sandbox --test-timeout 0.25"
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join([rec(plain, ratio=1.2, ratio_all_tests=1.3),
                                   rec(short, ratio=2.7, ratio_all_tests=2.8),
                                   rec(plain, ratio=1.4, ratio_all_tests=2.6),
                                   rec(plain + " --costs", filter_ms_per_check=0.7)]) + "\n")
    rows = [line for line in benchmarks(records).splitlines() if line.startswith("| `sandbox`")]
    assert len(rows) == 2 and f"`{plain}`" in rows[0] and f"`{short}`" in rows[1]
    assert "`ratio` 1.4 (missed); `ratio_all_tests` 2.6 (met)" in rows[0]
    assert "`ratio` 2.7 (met); `ratio_all_tests` 2.8 (met)" in rows[1]


def test_record_needs_a_file_and_a_json_line(tmp_path):
    from labkit.bench.__main__ import main, record

    assert main(["fork", "--record"]) == 2
    with pytest.raises(ValueError, match="printed no JSON line"):
        record(tmp_path / "r.jsonl", "fork", [], "a report\nwith no record\n")


def test_dense_share_golden():
    from labkit.bench.step import dense_share

    self_us = {"aten::mm": 30.0, "aten::bmm": 10.0, "aten::mul": 40.0, "aten::copy_": 20.0,
               "aten::_fused_adamw_": 0.0}
    assert dense_share(self_us) == pytest.approx(0.4)
    # naive second computation: the dense names spelled out
    dense = self_us["aten::mm"] + self_us["aten::bmm"] + self_us["aten::_fused_adamw_"]
    assert dense_share(self_us) == pytest.approx(dense / sum(self_us.values()))
    with pytest.raises(ValueError, match="no CPU time"):
        dense_share({})


@pytest.mark.slow
def test_step_bench_dense_share_reports_a_bound_and_trains_as_without_it():
    def run(*extra):
        p = subprocess.run([sys.executable, "-m", "labkit.bench", "step", "--steps", "3", "--tasks",
                            "1", "--group", "2", *extra], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    plain, dense = run(), run("--dense-share")
    assert "dense_bound_s" not in plain
    assert set(dense["dense_share"]) == {"sample", "update"}
    assert all(0 < v < 1 for v in dense["dense_share"].values())
    assert 0 < dense["dense_bound_s"] < dense["step_s"]
    assert dense["dense_bound_ratio"] == pytest.approx(dense["dense_bound_s"] / dense["floor_s"],
                                                       rel=0.02)
    # the profiled update is undone: the run trains and samples as a run without the flag
    assert dense["weights_digest"] == plain["weights_digest"]
    assert dense["completion_tokens"] == plain["completion_tokens"]
    assert dense["decode_positions_incl_padding"] == plain["decode_positions_incl_padding"]


def test_sandbox_cost_bench_reports_both_costs_from_its_runs():
    p = subprocess.run([sys.executable, "-m", "labkit.bench", "sandbox", "--costs", "--workers",
                        "1", "--rounds", "1", "--checks", "5"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["bench"] == "sandbox_costs" and out["rounds"] == 1
    assert out["seccomp"]["without"] is False
    rates = out["checks_per_s_median"]
    assert all(rates[k] > 0 for k in ("filter", "no_filter", "io_cases", "asserts"))
    # the rates are printed to 0.1 check/s, so 1000 / rate is known to 1000 * 0.05 / (rate - 0.05)^2
    slack = sum(1000 * 0.05 / (rates[k] - 0.05) ** 2 for k in ("asserts", "io_cases")) + 0.0005
    assert out["asserts_ms_per_check"] == pytest.approx(
        1000 / rates["asserts"] - 1000 / rates["io_cases"], abs=slack)
