"""benchmarks/kernels.py: its logic runs on the CPU and it explains why it needs CUDA."""

from __future__ import annotations

import pytest
import torch

from benchmarks import kernels as bench


def _table_rows(text: str, header_start: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cpu_smoke_prints_both_tables(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    if backend == "triton":
        triton_attention = pytest.importorskip("paged_llm.kernels.triton.attention")
        if not triton_attention.INTERPRETED:
            pytest.skip("needs TRITON_INTERPRET=1 (scripts/test sets it)")
    assert bench.main(["--cpu-smoke", "--backend", backend, "--contexts", "40"]) == 0
    text = capsys.readouterr().out
    assert f"backend {backend}, float32" in text
    decode = _table_rows(text, "| batch | context |")
    assert [row[:2] for row in decode] == [["1", "40"], ["3", "40"]]
    prefill = _table_rows(text, "| chunk | context |")
    assert [row[:2] for row in prefill] == [["16", "48"], ["32", "32"]]
    for row in decode + prefill:
        assert all(cell != "nan" for cell in row)
        assert float(row[3 if row in decode else 2]) > 0  # kernel milliseconds


def test_traffic_and_flops_count_what_a_step_moves() -> None:
    shape = bench.Shape(8, 2, 64, 16, torch.bfloat16)
    case = bench.Case(batch=4, q_len=1, ctx=100)
    kv = 2 * 4 * 100 * 2 * 64 * 2
    assert bench.traffic_bytes(shape, case) == kv + 2 * 4 * 8 * 64 * 2
    chunk = bench.Case(batch=1, q_len=3, ctx=10)
    assert bench.attention_flops(shape, chunk) == 4.0 * (8 + 9 + 10) * 8 * 64


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_it_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
