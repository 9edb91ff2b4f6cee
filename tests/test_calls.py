"""The one call record: the records.jsonl shape it writes, and reading old and foreign rows back."""

from __future__ import annotations

import json

from sprint.core.calls import FINAL, RECORD_KEYS, CallRecord
from sprint.latency.model import LatencyModel
from sprint.latency.simulate import critical_path_timeline
from sprint.format.trajectory import Execution, Phase, Trajectory, render_prompt


def test_records_jsonl_rows_keep_their_keys_in_order() -> None:
    call = CallRecord("executor", 2, "2.1", 120, 40, "stop", 10.0, 12.5, False, draw=2, cached_tokens=96,
                      server="http://a/v1")
    row = call.as_dict()
    assert tuple(row) == RECORD_KEYS  # no first_token unless it is known
    assert json.loads(json.dumps(row)) == row
    assert CallRecord.from_dict(row) == call
    timed = CallRecord("planner", 1, start=1.0, end=3.0, first_token=1.5)
    assert tuple(timed.as_dict()) == (*RECORD_KEYS, "first_token") and timed.ttft == 0.5


def test_old_and_partial_rows_read_back() -> None:
    old = CallRecord.from_dict({"role": "final", "phase": 3, "start": 5, "end": 6, "completion_tokens": None})
    assert (old.role, old.prompt, old.kind, old.label) == ("planner", FINAL, FINAL, FINAL) and old.is_final
    assert old.completion_tokens == 0 and old.kept and old.draw == 1 and old.run == 1
    # timing.json rows carry extra keys (forced_tokens, ttft, problem): ignored
    measured = CallRecord.from_dict({"role": "executor", "phase": 1, "prompt": "1.2", "start": 0.1, "end": 0.4,
                                     "first_token": 0.2, "forced_tokens": 7, "ttft": 0.1, "problem": "p0"})
    assert measured.label == "1.2" and measured.first_token == 0.2
    assert CallRecord.from_dict({"role": "planner", "phase": 2}).label == "2"
    assert CallRecord.from_dict({"role": "baseline", "start": True}).start == 0.0  # a boolean is not a time


def test_modelled_calls_speak_the_record_vocabulary() -> None:
    traj = Trajectory("q", [Phase(1, "go " + render_prompt("1.1", "do it"), [Execution("1.1", "done")])], "\\boxed{1}")
    calls = critical_path_timeline(traj, LatencyModel(), lambda s: len(s.split())).calls
    assert [(c.role, c.phase, c.prompt) for c in calls] == [("planner", 1, None), ("executor", 1, "1.1"),
                                                            ("planner", 2, FINAL)]
    assert [c.kind for c in calls] == ["planner", "executor", "final"]
