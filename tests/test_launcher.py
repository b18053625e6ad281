"""run_eval.sh: validates once in one process, then launches torchrun with restarts."""

from __future__ import annotations

import subprocess

from conftest import REPO, _env, assert_ok, metric_values, metrics_of, single


def run_eval_sh(args: list[str], cwd, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "run_eval.sh"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env(env))


def test_bad_flag_fails_once_before_any_worker_starts(tiny_model, data23, tmp_path):
    proc = run_eval_sh(["--model_name", str(tiny_model), "--data_dir", str(data23), "--num_beem", "4",
                        "--save_dir", str(tmp_path / "out")], cwd=tmp_path, env={"NPROC": "2", "MAX_RESTARTS": "3"})
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == ["seq2seq_eval: error: unknown generate option --num_beem; expected a model.generate() "
                      "setting such as --num_beams, --max_length, --max_new_tokens, --length_penalty, "
                      "--no_repeat_ngram_size"]
    assert "torch.distributed" not in proc.stderr  # no worker was launched, so nothing was retried


def test_launcher_runs_two_ranks_and_matches_one_process(tiny_model, data23, tmp_path):
    args = ["--model_name", str(tiny_model), "--data_dir", str(data23), "--bs", "4"]
    proc = run_eval_sh(args + ["--save_dir", str(tmp_path / "sh")], cwd=tmp_path, env={"NPROC": "2"})
    assert_ok(proc)
    assert "rank 0: " in proc.stdout and "rank 1: " in proc.stdout  # the dry run's plan for 2 ranks
    assert metrics_of(tmp_path / "sh")["n_gpus"] == 2
    assert_ok(single(args + ["--save_dir", str(tmp_path / "one")], cwd=tmp_path))
    assert (tmp_path / "sh" / "test_generations.txt").read_bytes() == (tmp_path / "one" / "test_generations.txt").read_bytes()
    assert metric_values(metrics_of(tmp_path / "sh")) == metric_values(metrics_of(tmp_path / "one"))
