"""experiments/bench.py `input`: a tiny run reports every rate it names."""
import math

from experiments import bench


def test_tiny_input_bench_reports_rates_and_loop_times():
  out = bench.bench_input(["--batch", "2", "--seq", "32", "--batches", "2", "--read-threads", "0,2",
                           "--model", "tiny", "--loop-steps", "2", "--rounds", "2"])
  keys = ["input_tokens_per_s.threads_0", "input_tokens_per_s.threads_2", "loop_step_s_overlapped",
          "loop_step_s_serial", "loop_speedup"]
  assert all(math.isfinite(out[k]) and out[k] > 0 for k in keys), out
