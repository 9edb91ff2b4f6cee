"""The run viewer: timeline geometry and critical path on hand-made runs with known call times,
the static site built from run folders (rows, escaping, barrier vs stream, modelled timelines)."""

from __future__ import annotations

import builtins
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from tests.helpers import write_run

from sprint.viewer import timeline as TL
from sprint.core.errors import UserError
from sprint.evaluation.runs import run_fingerprint
from sprint.format import trajectory
from sprint.latency.model import LatencyModel
from sprint.latency.simulate import critical_path_timeline
from sprint.format.trajectory import Execution, Phase, Trajectory, parse, render_prompt
from sprint.viewer.pages import ProblemView, _row, plan_html
from sprint.viewer.site import ViewConfig, build

T0 = 1_700_000_000.0  # an epoch origin: records store time.time()


def call(role: str, phase: int, prompt: str | None, start: float, end: float, *, kept: bool = True,
         draw: int = 1, error: str | None = None) -> dict:
    """One call as orchestration stores it in records.jsonl (sprint.core.calls.CallRecord's keys)."""
    return {"role": role, "phase": phase, "prompt": prompt, "prompt_tokens": 10, "completion_tokens": 20,
            "finish_reason": "stop", "start": T0 + start, "end": T0 + end, "cached": False, "draw": draw,
            "run": 1, "kept": kept, "error": error}


# A two-phase problem: phase 1 has prompts 1.1 (3 s) and 1.2 (1 s), phase 2 one prompt, then a
# forced final answer. Barrier: executors start when the plan ends.
BARRIER = [
    call("planner", 1, None, 0, 2), call("executor", 1, "1.1", 2, 5), call("executor", 1, "1.2", 2, 3),
    call("planner", 2, None, 5, 6), call("executor", 2, "2.1", 6, 7), call("planner", 3, "final", 7, 8),
]
# Stream: 1.1 starts while plan 1 is still written (at 0.8 s), 1.2 at 1.5 s; a thrown-away
# execution of an earlier prompt text; plan 2 starts when 1.1 ends.
STREAM = [
    call("planner", 1, None, 0, 2), call("executor", 1, "1.1", 0.8, 3.8), call("executor", 1, "1.2", 1.5, 2.5),
    call("executor", 1, "1.2", 1.2, 1.4, kept=False, error="cancelled"),
    call("planner", 2, None, 3.8, 4.8), call("executor", 2, "2.1", 4.8, 5.8), call("planner", 3, "final", 5.8, 6.8),
]


def lanes_of(t: TL.Timeline, critical_only: bool = False) -> list[str]:
    return [b.lane for b in t.bars if b.critical or not critical_only]


def test_bar_positions_follow_the_recorded_times() -> None:
    t = TL.from_calls(BARRIER, "barrier", origin=T0)
    boxes, names, px = TL.layout(t, scale_s=8.0)
    assert names == ["plan 1", "exec 1.1", "exec 1.2", "plan 2", "exec 2.1", "final"]
    assert px == pytest.approx((TL.WIDTH - TL.LABEL_W - TL.RIGHT_PAD) / 8.0)
    by_lane = {b.lane: box for b, box in zip(t.bars, boxes)}
    assert by_lane["plan 1"].x == pytest.approx(TL.LABEL_W)
    assert by_lane["exec 1.1"].x == pytest.approx(TL.LABEL_W + 2 * px, abs=0.01)
    assert by_lane["exec 1.1"].w == pytest.approx(3 * px, abs=0.01)
    assert by_lane["exec 1.2"].w == pytest.approx(1 * px, abs=0.01)
    assert by_lane["final"].x + by_lane["final"].w == pytest.approx(TL.WIDTH - TL.RIGHT_PAD, abs=0.02)
    rows = [by_lane[n].y for n in names]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)  # one row per lane, in lane order
    assert t.total == pytest.approx(8.0)


def test_time_scale_gives_simulated_seconds() -> None:
    t = TL.from_calls(BARRIER, "x", origin=T0, time_scale=0.1)
    assert t.total == pytest.approx(80.0)
    assert [b.start for b in t.bars][:2] == pytest.approx([0.0, 20.0])


def test_barrier_critical_path_goes_through_the_slowest_executor() -> None:
    t = TL.from_calls(BARRIER, "barrier", origin=T0, schedule="barrier")
    assert lanes_of(t, critical_only=True) == ["plan 1", "exec 1.1", "plan 2", "exec 2.1", "final"]
    assert not next(b for b in t.bars if b.lane == "exec 1.2").critical


def test_stream_critical_path_and_discarded_call() -> None:
    t = TL.from_calls(STREAM, "stream", origin=T0, schedule="stream")
    crit = [b for b in t.bars if b.critical]
    assert [b.lane for b in crit] == ["plan 1", "exec 1.1", "plan 2", "exec 2.1", "final"]
    # exec 1.1 waited for a prompt inside plan 1, not for its end
    assert crit[1].start < crit[0].end
    thrown = [b for b in t.bars if not b.kept]
    assert len(thrown) == 1 and thrown[0].lane == "exec 1.2" and not thrown[0].critical
    svg = TL.svg(t)
    assert svg.count('class="bar executor discarded"') == 1
    assert len(re.findall(r'class="bar [a-z ]*\bcrit\b', svg)) == 5  # five bars drawn as critical
    stream_total, barrier_total = t.total, TL.from_calls(BARRIER, "b", origin=T0).total
    assert barrier_total - stream_total == pytest.approx(1.2)


def test_redrawn_plan_and_retried_executor_are_on_the_path() -> None:
    calls = [
        call("planner", 1, None, 0, 1, kept=False), call("planner", 1, None, 1, 3, draw=2),
        call("executor", 1, "1.1", 3, 4, kept=False, error="server_error: 500"),
        call("executor", 1, "1.1", 4, 6, draw=2), call("executor", 1, "1.2", 3, 5),
        call("planner", 2, None, 6, 7),
    ]
    t = TL.from_calls(calls, "x", origin=T0)
    crit = [(b.lane, b.call.draw) for b in t.bars if b.critical]
    assert crit == [("plan 1", 1), ("plan 1", 2), ("exec 1.1", 1), ("exec 1.1", 2), ("plan 2", 1)]


def test_modelled_timeline_matches_the_latency_model() -> None:
    traj = Trajectory("What is 2+2?", [
        Phase(1, "Split it. " + render_prompt("1.1", "add two") + " and " + render_prompt("1.2", "add two again"),
              [Execution("1.1", "two plus two is four"), Execution("1.2", "four")]),
    ], "So \\boxed{4}.")
    words = lambda s: len(s.split())  # noqa: E731 - a word counter keeps the arithmetic visible
    model = LatencyModel.simple(ttft_base_s=0.0, ttft_per_prompt_token_s=0.0, s_per_token=1.0, batch_slowdown=0.0)
    # words: the plan is 12 (tags count as words) + </Plan_1>; execution 1.1 is 5 + its closing tag, 1.2 is 1 + 1.
    # barrier: both start at 13, 1.1 ends last (19). stream: 1.1 starts after 6 plan words and ends at 12,
    # 1.2 starts after 12 and ends at 14, so 1.2 is on the path. The final answer adds 2 words + its tag.
    for schedule, critical, total in (("barrier", [True, True, False, True], 19 + 3),
                                      ("stream", [True, False, True, True], 14 + 3)):
        path = critical_path_timeline(traj, model, words, schedule)
        t = TL.from_path(path, schedule)
        assert t.total == pytest.approx(path.total) == pytest.approx(total)
        assert [b.lane for b in t.bars] == ["plan 1", "exec 1.1", "exec 1.2", "final"]
        assert [b.critical for b in t.bars] == critical
    barrier = TL.from_path(critical_path_timeline(traj, model, words, "barrier"), "b")
    stream = TL.from_path(critical_path_timeline(traj, model, words, "stream"), "s")
    assert stream.bars[1].start < barrier.bars[1].start == barrier.bars[0].end


def test_modelled_paths_count_like_the_tokenizer(tok_dir: Path) -> None:
    """The batched line counting of the viewer's modelled timelines matches exact counts (to 0.1%)."""
    from sprint.format.trajectory import token_counter

    plan = ("First, the multiples of 3.\n" + render_prompt("1.1", "Count multiples of 3 up to 500.") + "\n"
            "Next, the multiples of 7.\n" + render_prompt("1.2", "Count multiples of 7 up to 500."))
    traj = Trajectory("How many integers from 1 to 500 are divisible by 3 or 7?", [
        Phase(1, plan, [Execution("1.1", "500 / 3 = 166.67, so 166.\nThat is |A| = 166."),
                        Execution("1.2", "500 / 7 = 71.4, so 71.")]),
        Phase(2, "Based on execution_1.1, execution_1.2:\nAdd them and subtract the overlap.", []),
    ], "So the answer is \\boxed{214}.")
    model, exact = LatencyModel(), token_counter(str(tok_dir))
    fast = TL.modelled_paths([traj], str(tok_dir), model)[0]
    for schedule in ("barrier", "stream"):
        want = critical_path_timeline(traj, model, exact, schedule)
        assert fast[schedule].total == pytest.approx(want.total, rel=0.001)
        assert [c.label for c in fast[schedule].calls] == [c.label for c in want.calls]


def test_baseline_bar_is_not_part_of_the_path() -> None:
    t = TL.with_baseline(TL.from_calls(BARRIER, "x", origin=T0), 12.0, 500)
    assert t.total == pytest.approx(8.0) and t.span == pytest.approx(12.0)
    base = [b for b in t.bars if b.role == "baseline"]
    assert len(base) == 1 and not base[0].critical
    assert TL.lanes(t.bars)[-1] == "baseline"


def test_missing_figures_show_a_dash() -> None:
    row = _row(ProblemView("p1", "run", None, None, {"id": "p1", "sequential": 10, "correct": True}), "p1.html")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[4] == "10" and cells[5] == "–" and cells[6] == "–" and cells[7] == "–"  # decoded, baseline, reduction
    assert cells[9] == "no text"


def test_plan_html_highlights_and_escapes_prompts() -> None:
    phase = Phase(1, "Try <b>x</b>. " + render_prompt("1.1", "compute <script>alert(1)</script>") + " then")
    html = plan_html(phase)
    assert '<span class="pnum">1.1</span>' in html
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and html.endswith(" then")


# --------------------------------------------------------------------------- the site

PAYLOAD = "<script>window.PWNED=1</script>"


def sprint_text(question: str, k: int) -> str:
    plan = "Plan the work " + PAYLOAD + ". " + " ".join(render_prompt(f"1.{i}", f"part {i}") for i in range(1, k + 1))
    traj = Trajectory(question, [Phase(1, plan, [Execution(f"1.{i}", f"result {i} is {i}") for i in range(1, k + 1)])],
                      "So the answer is \\boxed{4}.")
    return traj.render()


def write_view_run(folder: Path, schedule: str | None, calls: list[dict] | None, n: int = 3) -> None:
    """`n` problems with PAYLOAD in their model text and these `calls`, as a `schedule` run writes them."""
    rows = []
    for i in range(n):
        q = f"Problem {i}: what is 2+2? {PAYLOAD}"
        text = sprint_text(q, 2)
        rows.append({"id": f"p{i}", "index": i, "task": "math", "question": q, "gold": "4", "trajectory": text,
                     "calls": calls or [], "start": T0, "status": "ok", "error": None, "forced_final": False})
    write_run(folder, rows, config={"schedule": schedule})


def write_baseline(folder: Path, n: int = 3) -> None:
    rows = [{"id": f"p{i}", "index": i, "task": "math", "question": f"Problem {i}", "gold": "4",
             "generation": "two and two " * 40 + "so \\boxed{4}", "calls": [call("baseline", 0, None, 0, 20)],
             "start": T0, "status": "ok", "error": None} for i in range(n)]
    write_run(folder, rows, stage="baseline", config={})


@pytest.fixture
def site(tmp_path: Path, tok_dir: Path) -> Path:
    write_view_run(tmp_path / "barrier", "barrier", BARRIER)
    write_view_run(tmp_path / "stream", "stream", STREAM)
    write_baseline(tmp_path / "base")
    cfg = ViewConfig(runs=[str(tmp_path / "barrier"), str(tmp_path / "stream")], baseline=[str(tmp_path / "base")],
                     planner_tokenizer=str(tok_dir), out=str(tmp_path / "site"), bootstrap=0)
    result = build(cfg)
    assert result.pages == 3 and result.index.is_file()
    return tmp_path / "site"


def test_site_index_rows_and_escaping(site: Path) -> None:
    index = (site / "index.html").read_text()
    for table in re.findall(r'<table class="problems".*?</table>', index, re.S):
        assert len(re.findall(r"<tr data-correct", table)) == 3
    assert index.count('href="problems/p1.html"') == 2  # one row per run
    # seq. as decoded (the evaluation's, tags included) follows seq. tokens and is larger wherever both exist
    rows = [re.findall(r'<td data-v="([^"]*)"', tr) for tr in re.findall(r"<tr data-correct.*?</tr>", index, re.S)]
    pairs = [(int(r[4]), int(r[5])) for r in rows if r[4] and r[5]]
    assert pairs and all(dec > seq for seq, dec in pairs)
    for page in (site / "problems").glob("*.html"):
        html = page.read_text()
        assert PAYLOAD not in html and "&lt;script&gt;window.PWNED=1&lt;/script&gt;" in html
        assert len(re.findall(r"<script", html)) == 1  # only the viewer's own script tag
    assert not list(site.rglob("*.tmp"))
    assert 'src="assets/view.js"' in index and (site / "assets" / "view.js").is_file()
    assert "http://" not in index and "https://" not in index  # nothing fetched from the network


def test_site_problem_page_shows_barrier_vs_stream(site: Path) -> None:
    html = (site / "problems" / "p0.html").read_text()
    svgs = re.findall(r"<svg class=\"timeline\".*?</svg>", html, re.S)
    assert len(svgs) == 2
    for svg in svgs:  # 6 SPRINT calls (+1 thrown away in stream) and the baseline's call
        assert svg.count("<rect class=\"bar") in (7, 8)
        assert svg.count('class="bar baseline"') == 1
    assert "stream ends 1.20 s earlier than barrier" in html
    assert "recorded, barrier schedule" in html and "recorded, stream schedule" in html
    # both charts share one time scale (the baseline's 20 s): the same bar is at the same x
    xs = [re.search(r'class="bar planner crit" x="([\d.]+)"', s).group(1) for s in svgs]
    assert xs[0] == xs[1]
    widths = [float(m) for m in re.findall(r'class="bar baseline" x="[\d.]+" y="[\d.]+" width="([\d.]+)"', html)]
    assert widths[0] == pytest.approx(TL.WIDTH - TL.LABEL_W - TL.RIGHT_PAD, abs=0.05)


def test_authors_logs_get_a_modelled_timeline(tmp_path: Path, tok_dir: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "planner_trajectory_7.txt").write_text(sprint_text("What is 2+2?", 3))
    (logs / "base_model_trajectory_7.txt").write_text("<Question>\nWhat is 2+2?\n</Question>\n\n" + "think " * 300
                                                      + "\\boxed{4}")
    (tmp_path / "gold.csv").write_text("id,answer\n7,4\n")
    result = build(ViewConfig(runs=[str(logs)], gold=str(tmp_path / "gold.csv"), planner_tokenizer=str(tok_dir),
                              out=str(tmp_path / "site"), bootstrap=0, plots=False))
    html = (tmp_path / "site" / "problems" / "7.html").read_text()
    assert "modelled from token counts" in html
    assert "gold answer: <code>4</code>" in html  # from the gold CSV, as evaluate read it
    label = "modelled: NVIDIA H200, one problem at a time"
    assert f"{label}, barrier schedule" in html and f"{label}, stream schedule" in html
    svgs = re.findall(r"<svg class=\"timeline\".*?</svg>", html, re.S)
    assert len(svgs) == 2 and all(s.count('class="bar executor') == 3 for s in svgs)
    assert result.pages == 1
    parsed = parse((logs / "planner_trajectory_7.txt").read_text())
    assert parsed.prompt_count == 3


def test_view_needs_a_sprint_run(tmp_path: Path, tok_dir: Path) -> None:
    write_baseline(tmp_path / "base")
    with pytest.raises(UserError, match="no SPRINT trajectories"):
        build(ViewConfig(runs=[str(tmp_path / "base")], planner_tokenizer=str(tok_dir), out=str(tmp_path / "s")))


def test_cli_writes_the_site_and_prints_where(tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture) -> None:
    from sprint.cli import main

    write_view_run(tmp_path / "run", "barrier", BARRIER, n=2)
    code = main(["view", str(tmp_path / "run"), "--planner-tokenizer", str(tok_dir), "--bootstrap", "0", "--no-plots"])
    out = capsys.readouterr().out
    assert code == 0
    assert (tmp_path / "run" / "view" / "index.html").is_file()  # default: <run>/view
    assert (tmp_path / "run" / "view" / "index.html").resolve().as_uri() in out
    assert "2 problem pages" in out


def test_bad_time_scale_is_a_user_error(tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture) -> None:
    from sprint.cli import main

    write_view_run(tmp_path / "run", "barrier", BARRIER, n=1)
    code = main(["view", str(tmp_path / "run"), "--planner-tokenizer", str(tok_dir), "--time-scale", "0"])
    assert code == 2 and "--time-scale must be above 0" in capsys.readouterr().err


def test_site_is_self_contained(site: Path) -> None:
    """Every link and source of every page is a file inside the site: nothing to fetch, nothing missing."""
    pages = [site / "index.html", *sorted((site / "problems").glob("*.html"))]
    checked = 0
    for page in pages:
        for target in re.findall(r'(?:href|src)="([^"#]+)"', page.read_text()):
            assert "://" not in target and not target.startswith("//"), (page.name, target)
            resolved = (page.parent / target).resolve()
            assert resolved.is_file(), (page.name, target)
            assert site.resolve() in resolved.parents
            checked += 1
    assert checked >= 3 * len(pages)  # stylesheet, script and navigation at least
    assert re.search(r'<img src="evaluation/reduction_by_bucket\.png"', (site / "index.html").read_text())


def test_reusing_an_evaluation_copies_its_figures(site: Path, tmp_path: Path, tok_dir: Path) -> None:
    runs = [str(tmp_path / "barrier"), str(tmp_path / "stream")]
    again = build(ViewConfig(runs=runs, planner_tokenizer=str(tok_dir), evaluation=str(site / "evaluation"),
                             out=str(tmp_path / "again")))
    assert again.steps["evaluation"] < 1.0  # read back, not recomputed
    assert {p.name for p in (tmp_path / "again" / "evaluation").glob("*.png")} == \
        {p.name for p in (site / "evaluation").glob("*.png")} != set()
    assert not (tmp_path / "again" / "evaluation" / "metrics.json").exists()
    with pytest.raises(UserError, match="holds no metrics.json"):
        build(ViewConfig(runs=runs, planner_tokenizer=str(tok_dir), evaluation=str(tmp_path), out=str(tmp_path / "x")))


def test_evaluation_report_links_to_the_viewer(site: Path, tmp_path: Path, tok_dir: Path) -> None:
    """The viewer's own evaluation links back to it; a later `evaluate` of the run finds `<run>/view`."""
    from sprint.evaluation.evaluate import evaluate
    from sprint.evaluation.report import viewer_link

    assert "[the run viewer](../index.html)" in (site / "evaluation" / "report.md").read_text()
    run = tmp_path / "barrier"
    assert viewer_link(tmp_path / "elsewhere", [run]) is None  # no viewer at <run>/view yet
    build(ViewConfig(runs=[str(run)], planner_tokenizer=str(tok_dir), bootstrap=0, plots=False))
    ev = evaluate([run], planner_tokenizer=str(tok_dir), out_dir=str(tmp_path / "eval"), resamples=0, plots=False)
    report = ev.files["report"].read_text()
    assert "[the run viewer](../barrier/view/index.html)" in report
    assert (tmp_path / "eval" / "../barrier/view/index.html").resolve().is_file()


@pytest.mark.parametrize("reuse", [False, True], ids=["evaluating", "reusing-an-evaluation"])
def test_view_reads_records_once_and_parses_each_trajectory_once(
        site: Path, tmp_path: Path, tok_dir: Path, monkeypatch: pytest.MonkeyPatch, reuse: bool) -> None:
    """`sprint view` builds on the evaluation it runs (or reuses): every records.jsonl is opened once,
    every SPRINT text parsed once, whichever module would do it; the manifest's fingerprints are
    still those of the files on disk."""
    opened: Counter[str] = Counter()
    parsed: Counter[str] = Counter()
    real_open, real_parse = io.open, trajectory.parse

    def counting_open(file, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - open()'s own signature
        if str(file).endswith("records.jsonl"):
            opened[str(Path(file).parent.name)] += 1
        return real_open(file, *args, **kwargs)

    def counting_parse(text: str, strict: bool = True) -> trajectory.Trajectory:
        parsed[text] += 1
        return real_parse(text, strict)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    for name, module in list(sys.modules.items()):  # every module that took `parse` by name
        if name.startswith("sprint") and getattr(module, "parse", None) is real_parse:
            monkeypatch.setattr(module, "parse", counting_parse)
    runs = [str(tmp_path / "barrier"), str(tmp_path / "stream")]
    out = tmp_path / ("again" if reuse else "fresh")
    build(ViewConfig(runs=runs, baseline=[str(tmp_path / "base")], planner_tokenizer=str(tok_dir), out=str(out),
                     bootstrap=0, evaluation=str(site / "evaluation") if reuse else None))
    assert opened == {"barrier": 1, "stream": 1, "base": 1}
    texts = [json.loads(line)["trajectory"] for run in runs for line in Path(run, "records.jsonl").read_text().splitlines()]
    assert sum(parsed[t] for t in set(texts)) == len(texts) == 6  # each run's problem once (the runs share texts)
    assert (out / "problems" / "p0.html").is_file()
    if not reuse:
        monkeypatch.undo()
        manifest = json.loads((out / "evaluation" / "manifest.json").read_text())
        assert manifest["inputs"]["runs"] == [run_fingerprint(r) for r in runs]
        assert manifest["inputs"]["baselines"] == [run_fingerprint(tmp_path / "base")]


def test_time_replay_measurements_are_drawn_as_measured_timelines(tmp_path: Path, tok_dir: Path) -> None:
    """A time-replay folder's calls (times from each problem's start) become extra timelines on the page."""
    write_view_run(tmp_path / "barrier", "barrier", BARRIER)
    measured = [dict(c, start=c["start"] - T0, end=c["end"] - T0) for c in BARRIER]  # timing.json's clock
    timing = {"model": "tiny", "methods": {
        "barrier": {"problems": [{"id": "p1", "calls": measured}]},
        "baseline": {"problems": [{"id": "p1", "calls": [call("baseline", 0, None, 0 - T0, 9 - T0)]}]},
    }}
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing" / "timing.json").write_text(json.dumps(timing))
    cfg = ViewConfig(runs=[str(tmp_path / "barrier")], planner_tokenizer=str(tok_dir), out=str(tmp_path / "site"),
                     bootstrap=0, timing=str(tmp_path / "timing"))
    build(cfg)
    page = (tmp_path / "site" / "problems" / "p1.html").read_text()
    other = (tmp_path / "site" / "problems" / "p0.html").read_text()
    svgs = re.findall(r'<svg class="timeline".*?</svg>', page, re.S)
    assert len(svgs) == 2  # the recorded run and its measured replay
    assert "barrier — measured on tiny</b>: 8.00 s" in page
    assert svgs[1].count('class="bar baseline"') == 1  # the measured baseline (9 s) as the reference bar
    assert "measured on" not in other  # only the problems that were timed
    timelines = TL.from_timing(tmp_path / "timing")
    assert [(t.source, t.baseline_source, t.span) for t in timelines["p1"]] == [("measured", "measured", 9.0)]
    assert lanes_of(timelines["p1"][0], critical_only=True) == lanes_of(TL.from_calls(BARRIER, "x"), critical_only=True)
    with pytest.raises(UserError, match="time-replay"):
        TL.from_timing(tmp_path / "nothing")
