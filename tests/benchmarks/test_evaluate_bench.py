"""The evaluate benchmark runs end to end on the bundled model and prints its table."""

from __future__ import annotations

import pytest

from benchmarks.evaluate import QUESTIONS, home_state, main, task


def test_the_task_is_three_questions_of_four_options_over_a_tagged_state() -> None:
    assert len(QUESTIONS) == 3
    assert all(len(q["criteria"]) == 4 for q in QUESTIONS.values())
    state = home_state(12, "r1")
    assert next(iter(state.items())) == ("round", "r1")
    assert len(state) == 14
    assert task(12, "a").state != task(12, "b").state


def test_the_benchmark_prints_its_table_on_the_bundled_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--rounds", "1", "--entities", "4", "--answer-tokens", "2", "--kv-budget-mib", "96"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    assert "ratio (target <= 1.3)" in lines[0]
    cells = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert int(cells[1]) > 50  # the state prompt's tokens
    assert all(float(cells[i]) > 0 for i in (2, 3))
    assert float(cells[4].removesuffix("x")) > 0
    # Every question's probabilities sum to 1.
    assert float(cells[7]) <= 1e-6
