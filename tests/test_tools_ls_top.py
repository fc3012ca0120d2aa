"""python -m torchneuron.fidelity.ls / top, the per-process stats files, and memory_summary's
rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from torchneuron.device import stats_publisher
from torchneuron.fidelity import ls, top


def test_ls_lists_every_logical_core(capsys) -> None:  # type: ignore[no-untyped-def]
    assert ls.main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == torch.neuron.device_count() == 4  # trn2, LNC=2, one chip
    assert [r["physical_core_first"] for r in rows] == [0, 2, 4, 6]
    assert all(r["hbm_bytes"] == 24 << 30 and r["chip"] == "trn2" for r in rows)
    assert ls.main([]) == 0
    assert "LNC=2, 4 logical cores" in capsys.readouterr().out


def test_stats_file_round_trip_and_op_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = stats_publisher.write_once(tmp_path)
    before = top.read_all(tmp_path)
    x = torch.ones(256, 256, device="neuron")
    for _ in range(20):
        x = x + 1
    time.sleep(0.05)
    stats_publisher.write_once(tmp_path)
    after = top.read_all(tmp_path)
    assert first.name == f"{os.getpid()}.json" and set(after) == {os.getpid()}
    table = top.rows(before, after)
    dev0 = next(r for r in table if r["device"] == 0)
    assert dev0["allocated"] >= x.numel() * 4 and dev0["ops_per_s"] > 0
    assert after[os.getpid()]["ops"] - before[os.getpid()]["ops"] >= 20
    assert "OPS/S" in top.format_table(table)


def test_top_sees_another_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = dict(
        os.environ,
        TORCHNEURON_STATS="1",
        TORCHNEURON_STATS_INTERVAL="0.1",
        XDG_RUNTIME_DIR=str(tmp_path),
    )
    code = (
        "import sys, time, torch\n"
        "x = torch.zeros(1 << 20, device='neuron')\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    x.add_(1); time.sleep(0.01)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        directory = tmp_path / "torchneuron"
        before = top.read_all(directory)
        # The child writes its file every 0.1 s when it gets the CPU; on a loaded host the
        # first write after the allocation can come late, so wait for it (bounded).
        deadline = time.monotonic() + 60
        mine: list = []
        while time.monotonic() < deadline:
            time.sleep(0.2)
            table = top.rows(before, top.read_all(directory))
            mine = [r for r in table if r["pid"] == child.pid and r["device"] == 0]
            if mine and mine[0]["allocated"] >= 4 << 20 and mine[0]["ops_per_s"] > 0:
                break
        assert mine and mine[0]["allocated"] >= 4 << 20 and mine[0]["ops_per_s"] > 0, mine
    finally:
        child.kill()
        child.wait()
    assert top.read_all(tmp_path / "torchneuron") == {}  # a dead process's file is skipped


def test_memory_summary_has_cuda_rows() -> None:
    keep = torch.ones(1000, device="neuron")
    summary = torch.neuron.memory_summary()
    for row in (
        "Allocated memory",
        "Requested memory",
        "Non-releasable allocs",
        "Oversize allocations",
        "from small_pool",
        "OOMs",
    ):
        assert row in summary
    del keep
