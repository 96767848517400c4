"""benchmarks.common.write_result: a second run of a day writes beside the first, never over it."""

from __future__ import annotations

import json

from benchmarks import common


def test_a_later_run_of_the_same_day_writes_beside_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    first = common.write_result("plan", "first\n", {"run": 1})
    common.write_result("plan-quick", "quick\n", {"run": 0})  # another name that starts alike takes nothing
    second = common.write_result("plan", "second\n", {"run": 2})
    third = common.write_result("plan", "third\n", {"run": 3})
    assert second.stem == f"{first.stem}-2" and third.stem == f"{first.stem}-3"
    assert first.read_text() == "first\n" and json.loads(first.with_suffix(".json").read_text()) == {"run": 1}
    assert second.read_text() == "second\n"


def test_a_run_that_writes_as_it_goes_replaces_its_own_result(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    kept = common.write_result("plan", "kept\n", {})
    mine = common.write_result("plan", "after one link\n", {"links": 1})
    again = common.write_result("plan", "after two links\n", {"links": 2}, replacing=mine)
    assert again == mine and mine.read_text() == "after two links\n" and kept.read_text() == "kept\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [kept.name, kept.with_suffix(".json").name, mine.name, mine.with_suffix(".json").name])
