"""Stage 2: rendering, the parent-dictionary parser and validator, and the stage over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import datasets
import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer
from tests.test_components import (
    FIXTURE_OK,
    SERVER_CASES,
    by_question,
    good_answer,
    load_traces,
    question_in,
    records_of,
    run_stage1,
    write_jsonl,
)

from sprint.cli import main as cli_main
from sprint.curation.dag import (
    DagError,
    create_dag,
    dag_from_json,
    dag_to_json,
    parse_dag_answer,
    render_components,
    validate_dag,
)
from sprint.core.errors import UserError

MODEL = "test-model"

# --- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{1: [], 2: [1], 3: [1, 2]}",
        "```python\n{1: [], 2: [1], 3: [1, 2]}\n```",
        "```json\n{\"1\": [], \"2\": [1], \"3\": [1, 2]}\n```",
        '{"1": [], "2": ["1"], "3": ["1", "2"]}',
        "Component 3 needs both earlier results, e.g. $\\boxed{2}$ from {2}.\nDAG:\n{1: [], 2: [1], 3: [2, 1, 1]}\nThat is all.",
        "For example {1: [], 2: []} would mean independence. Here:\n{1: [], 2: [1], 3: [1, 2],}",
        "dag = {\n    1: [],\n    2: [1],\n    3: [1, 2],\n}",
        "{1: (), 2: (1,), 3: [1, 2]}",
    ],
)
def test_parse_dag_accepts(text: str) -> None:
    assert parse_dag_answer(text) == {1: [], 2: [1], 3: [1, 2]}


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("There are no dependencies.", "no dictionary"),
        ("[[], [1], [1, 2]]", "list of lists"),
        ("{}", "empty dictionary"),
        ("{1: [], 2: 1}", "parents of 2 are 1, not a list"),
        ("{1: [], 2: None}", "not a list"),
        ("{1: [], 2: {1}}", "not a list"),
        ("{1: [], 'two': [1]}", "key 'two' is not a component number"),
        ("{1: [], 2: ['one']}", "parent of 2 'one' is not a component number"),
        ("{1: [], 2: [__import__('os').getpid()]}", "no dictionary"),  # never evaluated
    ],
)
def test_parse_dag_rejects(text: str, message: str) -> None:
    with pytest.raises(DagError, match=message):
        parse_dag_answer(text)


def test_validate_dag() -> None:
    assert validate_dag({1: [], 2: [1], 3: [1, 2]}, 3) == ({1: [], 2: [1], 3: [1, 2]}, [])
    full, errors = validate_dag({2: [1], 3: []}, 3)  # component 1 may be left out
    assert errors == [] and full == {1: [], 2: [1], 3: []}
    assert validate_dag({1: [], 2: [3], 3: [1]}, 3)[1] == ["component 2 has parent 3, which is not an earlier component"]
    assert validate_dag({1: [2], 2: [1]}, 2)[1] == ["component 1 has parent 2, which is not an earlier component"]
    assert validate_dag({1: [], 2: [2]}, 2)[1] == ["component 2 has parent 2, which is not an earlier component"]
    assert validate_dag({1: [], 2: [1], 4: [1]}, 3)[1] == [
        "unknown component(s) 4 (there are 3)",
        "component(s) 3 missing from the DAG",
    ]
    assert "component 2 has unknown parent 0" in validate_dag({1: [], 2: [0]}, 2)[1]


def test_json_round_trip() -> None:
    dag = {1: [], 2: [1], 3: [1, 2]}
    assert dag_to_json(dag) == {"1": [], "2": [1], "3": [1, 2]}
    assert dag_from_json(json.loads(json.dumps(dag_to_json(dag)))) == dag
    assert dag_from_json({"1": [], "2": [1], "3": None}) == {1: [], 2: [1]}  # datasets fills absent keys


def test_render_components() -> None:
    text = render_components([
        {"number": 1, "description": "Factor", "plan_text": "First, factor 36.", "prompt": "Factor 36.",
         "execution_text": "36 = 2^2 * 3^2.", "comment_text": "Good."},
        {"number": 2, "description": "Answer", "plan_text": "So 91.", "prompt": None, "execution_text": None},
    ])
    assert text == (
        "<Component_1>\n<description> Factor </description>\n<plan> First, factor 36. </plan>\n"
        "<prompt> Factor 36. </prompt>\n<execution> 36 = 2^2 * 3^2. </execution>\n</Component_1>\n\n"
        "<Component_2>\n<description> Answer </description>\n<plan> So 91. </plan>\n"
        "<prompt> not found </prompt>\n<execution> not found </execution>\n</Component_2>"
    )
    assert "Good." not in text  # comments are not shown


# --- the stage over HTTP ------------------------------------------------------------------

FIVE_OK = "{1: [], 2: [1], 3: [1], 4: [2, 3], 5: [2, 3]}"


def dag_cases() -> dict[str, Callable[[dict], Any]]:
    calls: dict[str, int] = {}

    def once_500_then_good(row: dict) -> Any:
        calls[row["id"]] = calls.get(row["id"], 0) + 1
        return Reply(status=500, headers={"Retry-After": "0"}) if calls[row["id"]] == 1 else FIVE_OK

    return {
        "forward-edge": lambda r: "{1: [], 2: [1], 3: [4], 4: [2], 5: [4]}",
        "cycle": lambda r: "{1: [2], 2: [1], 3: [3], 4: [3], 5: [4]}",
        "unknown-node": lambda r: "{1: [], 2: [1], 3: [1], 4: [2], 5: [3], 6: [5]}",
        "missing-node": lambda r: "{1: [], 2: [1], 4: [2], 5: [4]}",
        "missing-first": lambda r: "{2: [1], 3: [1], 4: [2, 3], 5: [4]}",
        "list": lambda r: "[[], [1], [1], [2, 3], [4]]",
        "non-list": lambda r: "{1: [], 2: 1, 3: [1], 4: [2], 5: [4]}",
        "prose-braces": lambda r: f"As \\boxed{{2}} shows, the order is:\n{FIVE_OK}\nNote {{that}} 4 and 5 share parents.",
        "blank": lambda r: "",
        "empty": lambda r: Reply(empty=True),
        "500-then-ok": once_500_then_good,
        "timeout": lambda r: Reply(text=FIVE_OK, delay=5),
        "truncated": lambda r: Reply(text=FIVE_OK, finish_reason="length"),
        "single": lambda r: pytest.fail("no request expected for a single component"),
    }


EXPECTED = {
    **FIXTURE_OK,
    **SERVER_CASES,
    "case-forward-edge": ("invalid", "component 3 has parent 4, which is not an earlier component"),
    "case-cycle": ("invalid", "component 1 has parent 2, which is not an earlier component; component 3 has parent 3"),
    "case-unknown-node": ("invalid", "unknown component(s) 6 (there are 5)"),
    "case-missing-node": ("invalid", "component(s) 3 missing from the DAG"),
    "case-missing-first": ("ok", None),
    "case-list": ("unparseable", "list of lists"),
    "case-non-list": ("unparseable", "the parents of 2 are 1, not a list"),
    "case-prose-braces": ("ok", None),
    "case-single": ("ok", None),
}


@pytest.fixture
def stage1_dir(tmp_path: Path) -> tuple[Path, list[dict]]:
    """A real stage-1 folder: the fixture traces plus copies of the first, and one stage-1 failure."""
    traces = load_traces()
    base = traces[0]
    rows = [dict(t) for t in traces]
    for name in dag_cases():
        rows.append({**base, "id": f"case-{name}", "question": f"{base['question']} [{name}]"})
    rows.append({**base, "id": "stage1-failure", "question": f"{base['question']} [stage1-failure]"})
    single = json.dumps([{"description": "All", "plan": "1-14", "prompt": "not found", "execution": "not found"}])

    def answer(row: dict) -> str:
        return {"case-single": single, "stage1-failure": "no json"}.get(row["id"]) or good_answer(row)

    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "components"
    with FakeServer(by_question(rows, answer)) as srv:
        run_stage1(inp, out, srv.base_url)
    assert records_of(out)["stage1-failure"]["status"] == "unparseable"
    return out, rows


def run_stage2(inp: Path, out: Path, url: str, **kw: Any):
    # 2.5 s: half the scripted timeout reply's delay (5 s), far above an ordinary reply on a loaded machine
    settings = dict(model=MODEL, server_url=url, num_workers=4, timeout=2.5, max_retries=1, progress=False)
    settings.update(kw)
    return create_dag(str(inp), out, **settings)


def test_stage_records_every_item_with_a_clear_status(tmp_path: Path, stage1_dir: tuple[Path, list[dict]],
                                                      scripted_server: ScriptedServer) -> None:
    components_dir, rows = stage1_dir
    cases = dag_cases()
    replies = {f"case-{name}": fn for name, fn in cases.items()}
    out = tmp_path / "dag"
    handler = by_question(rows, lambda row: replies.get(row["id"], lambda r: r["scripted_dag"])(row))
    srv = scripted_server(handler)
    outcome = run_stage2(components_dir, out, srv.base_url)
    asked = {question_in(body) for _, body in srv.completion_requests}
    first_prompt = next(b for _, b in srv.completion_requests if "[forward-edge]" in question_in(b))
    assert not srv.errors
    records = records_of(out)
    assert set(records) == set(EXPECTED)  # stage 1's failure is not carried into stage 2
    for item_id, (status, message) in EXPECTED.items():
        rec = records[item_id]
        assert rec["status"] == status, (item_id, rec["status"], rec["error"])
        assert (rec["error"] is None) if message is None else (message in rec["error"]), (item_id, rec["error"])
        assert rec["retryable"] == (status in ("llm_empty", "llm_timeout")), item_id
        assert (rec["dag"] is not None) == (status == "ok"), item_id
    assert all("[single]" not in q for q in asked)

    assert records["remainder-2-3-pow"]["dag"] == {"1": [], "2": [1], "3": [1], "4": [2, 3], "5": [2, 3]}
    assert records["rectangle-area"]["dag"] == {"1": [], "2": [1], "3": [1], "4": [2]}
    assert records["sum-of-divisors-36"]["dag"] == {"1": [], "2": [1], "3": [], "4": [2, 3]}
    assert records["circle-circumference"]["dag"] == {"1": [], "2": [1], "3": [2], "4": [2, 3]}
    assert records["case-missing-first"]["dag"]["1"] == []
    assert records["case-single"]["dag"] == {"1": []} and records["case-single"]["dag_usage"]["prompt_tokens"] == 0

    # everything from stage 1 is carried over
    stage1 = records_of(components_dir)
    rem = records["remainder-2-3-pow"]
    for key in ("question", "solution", "answer", "thought", "num_lines", "components", "uncovered_lines", "components_usage"):
        assert rem[key] == stage1["remainder-2-3-pow"][key], key
    assert rem["dag_answer"].startswith("Looking at the components") and rem["dag_usage"]["completion_tokens"] > 0

    content = first_prompt["messages"][0]["content"]
    assert "<Component_4>\n<description> Check with Fermat's little theorem </description>" in content
    assert "<execution> Since 5 is prime and doesn't divide 2 or 3, a^4 is 1 mod 5. </execution>" in content
    assert "every component from 1 to 5 as a key" in content and first_prompt["temperature"] == 0.0

    assert outcome.counts["ok"] == 8
    ds = datasets.load_dataset("json", data_files=str(out / "records.jsonl"), split="train")
    assert len(ds) == len(EXPECTED)
    ok = [r for r in ds if r["status"] == "ok"]
    assert all(dag_from_json(r["dag"])[1] == [] for r in ok)


def test_rerun_retries_only_transient_failures(tmp_path: Path, stage1_dir: tuple[Path, list[dict]],
                                               scripted_server: ScriptedServer) -> None:
    components_dir, rows = stage1_dir
    replies = {f"case-{name}": fn for name, fn in dag_cases().items()}
    out = tmp_path / "dag"
    handler = by_question(rows, lambda row: replies.get(row["id"], lambda r: r["scripted_dag"])(row))
    srv = scripted_server(handler)
    run_stage2(components_dir, out, srv.base_url)
    replies["case-empty"] = replies["case-timeout"] = lambda r: FIVE_OK
    srv = scripted_server(handler)
    outcome = run_stage2(components_dir, out, srv.base_url)
    asked = sorted(question_in(b).rsplit(" ", 1)[-1] for _, b in srv.completion_requests)
    assert asked == ["[empty]", "[timeout]"] and outcome.processed == 2
    records = records_of(out)
    assert records["case-empty"]["status"] == records["case-timeout"]["status"] == "ok"


def test_input_must_be_a_components_folder(tmp_path: Path) -> None:
    inp = write_jsonl(tmp_path / "traces.jsonl", load_traces())
    with pytest.raises(UserError, match="has no components"):
        run_stage2(inp, tmp_path / "dag", "http://127.0.0.1:9/v1")


def test_cli(tmp_path: Path, stage1_dir: tuple[Path, list[dict]], capsys: pytest.CaptureFixture[str],
             scripted_server: ScriptedServer) -> None:
    components_dir, rows = stage1_dir
    out = tmp_path / "dag"
    srv = scripted_server(by_question(rows, lambda r: r["scripted_dag"]))
    code = cli_main([
        "dag", "--input", str(components_dir), "--out-dir", str(out), "--model", MODEL,
        "--server-url", srv.base_url, "--range", "0:4", "--no-progress",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "dag: 4 items" in printed and "ok: 4" in printed
    assert len(records_of(out)) == 4
