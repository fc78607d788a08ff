"""The benchmark's arithmetic and command line, without starting any process."""

from __future__ import annotations

import pytest

from tfdist.bench import cli, ps, report, train
from tfdist.probe import allreduce, machine


def test_allreduce_summary_takes_slowest_rank_then_median_and_nccl_busbw() -> None:
    mib = 1 << 20
    ranks = {f"worker:{r}": {"sizes": {str(mib): {
        "allreduce_s": [0.001 * (1 + r), 0.002, 0.004], "tcp_s": [0.0005, 0.0005 + r * 1e-4, 1],
        "copy_s": [1e-4, 1e-4, 2e-4 * (1 + r)]}}}
        for r in range(4)}
    [row] = allreduce.summarize("tf", ranks, n=4)
    assert row["time_ms"] == pytest.approx(4.0)  # slowest per repeat: 4, 2, 4 ms -> median 4
    assert row["algbw_GBps"] == pytest.approx(mib / 0.004 / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * 3 / 4)
    assert row["limit_GBps"] == pytest.approx(mib / 0.0008 / 1e9)
    assert row["busbw_over_limit"] == pytest.approx(row["busbw_GBps"] / row["limit_GBps"])
    assert row["copy_GBps"] == pytest.approx(mib / 1e-4 / 1e9)


def test_allreduce_summary_names_missing_ranks() -> None:
    with pytest.raises(RuntimeError, match="1 of 2 ranks reported"):
        allreduce.summarize("horovod", {"rank:0": {"sizes": {}}}, n=2)


def test_train_overhead_is_paired_median_and_scaling_uses_one_replica() -> None:
    one = train.summarize("horovod", 1, {"seconds": {"tfdist": [1.0, 1.2], "raw": [1.0, 1.0]},
                                         "samples_per_fit": {"tfdist": 100, "raw": 100}})
    two = train.summarize("horovod", 2, {"seconds": {"tfdist": [1.0, 1.0], "raw": [1.0, 1.0]},
                                         "samples_per_fit": {"tfdist": 150, "raw": 150}})
    rows = one + two
    train._add_scaling(rows)
    assert rows[0]["overhead"] == pytest.approx(0.1) and rows[1]["overhead"] is None
    assert rows[2]["scaling"] == pytest.approx(150 / (2 * rows[0]["samples_per_s"]))
    assert rows[2]["scaling_vs_default"] is None  # no default job in this run


def test_ps_speedup_is_relative_to_first_spe() -> None:
    rows = ps.summarize("ps", 2, 2, {"seconds": {"spe1": [2.0], "spe10": [0.5]},
                                     "samples_per_fit": {"spe1": 1000, "spe10": 1000}})
    assert [r["spe_speedup"] for r in rows] == [1.0, 4.0]
    assert rows[1]["samples_per_s"] == 2000 and rows[1]["mode"] == "async PS"


def test_quick_flags_shrink_every_section_and_explicit_flags_win() -> None:
    quick = cli.configs(cli.parse_args(["--quick", "--repeats", "3", "--threads", "1,1"]))
    assert quick["allreduce"].sizes == allreduce.default_sizes(quick=True)
    assert quick["allreduce"].repeats == 3 and quick["train"].steps == 10
    assert quick["train"].env == {"TFDIST_BENCH_THREADS": "1,1"}
    full = cli.configs(cli.parse_args(["train", "--env", "HOROVOD_CYCLE_TIME=0.1"]))
    assert full["allreduce"].sizes[0] == 4 << 10 and full["allreduce"].sizes[-1] == 64 << 20
    assert full["train"].jobs() == [("default", 1), ("multi_worker", 1), ("multi_worker", 2),
                                     ("horovod", 1), ("horovod", 2)]
    assert full["train"].env == {"HOROVOD_CYCLE_TIME": "0.1"}


def test_bad_env_flag_says_what_was_received() -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--env", "NOEQUALS"])


def test_machine_note_and_table() -> None:
    info = machine.machine()
    assert info["cores"] >= 1 and "tensorflow" in info["versions"]
    assert "cores" in machine.machine_note(info)
    table = report.markdown_table([{"x": 0.5}], [("x", "X", "{:.0%}")])
    assert table.splitlines()[-1] == "| 50% |"


@pytest.mark.parametrize("module", [allreduce, cli, ps, report, train])
def test_docstring_examples_run(module) -> None:
    import doctest

    failures, _ = doctest.testmod(module)
    assert failures == 0


def test_tensor_rows_give_tokens_per_second_the_weight_ratio_and_the_bound() -> None:
    from tfdist.bench import tensor

    config = tensor.TensorBenchConfig(quick=True)  # batch 16, seq 16, 2 blocks, T=2
    single = {"step_s": 0.4, "weight_bytes": 1000}
    results = {"worker:0": {"step_s": 0.3, "weight_bytes": 510, "allreduce_s": 0.01,
                            "planned_bytes": 510},
               "worker:1": {"step_s": 0.5, "weight_bytes": 510, "allreduce_s": 0.02,
                            "planned_bytes": 510}}
    row = tensor._row(config, "tensor", results, single)
    assert row["step_s"] == 0.5 and row["processes"] == 2  # the slowest process
    assert row["tokens_per_s"] == pytest.approx(16 * 16 / 0.5)
    assert row["weight_ratio"] == pytest.approx(0.51)
    assert row["bound_s"] == pytest.approx(0.4 / 2 + 4 * 2 * 0.02)
    assert row["measured_over_bound"] == pytest.approx(0.5 / row["bound_s"])
    assert config.args("tensor", "gpt2")[:4] == ["--mode", "tensor", "--model", "gpt2"]
