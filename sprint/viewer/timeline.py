"""Call timelines of one SPRINT problem: bars, lanes, the critical path, and an SVG Gantt chart.

Reviewers ask where the time of a SPRINT run goes. A timeline answers it: one bar per model call
(planner, executors, forced final; a sequential baseline's one call as a reference), placed by
its start and end. Three sources:

- recorded: the `calls` of an orchestration record (`start`/`end` wall-clock times, `kept`,
  `draw`, `run`), so redrawn plans, retried and thrown-away (stream) executions show too;
- modelled: `sprint.latency.simulate.critical_path_timeline` turns a trajectory's token counts into
  seconds, for runs that recorded no times (the authors' logs);
- measured: the calls `sprint time-replay` timed on a real engine (`from_timing`).

The critical path is the chain of calls that fixed the problem's end time: walking back from
the call that ended last, each call's predecessor is what it waited for — an executor waits
for its phase's planner (barrier: its end; stream: the streamed prompt inside it) or for its own
earlier failed draw; a planner (or the final answer) waits for the last call of the previous
phase to end, or for its own earlier draw. Everything here is pure geometry: no I/O, no HTML
page, so the tests can check positions on hand-made runs (`from_timing` only reads timing.json).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from html import escape
from pathlib import Path
from typing import Any, Iterable, Sequence

from sprint.core.calls import BASELINE, EXECUTOR, FINAL, PLANNER, CallRecord
from sprint.core.errors import UserError
from sprint.latency.model import LatencyModel
from sprint.latency.simulate import SCHEDULES, PathTiming, modelled_timelines
from sprint.format.trajectory import Trajectory

KIND_ORDER = {PLANNER: 0, EXECUTOR: 1, FINAL: 2, BASELINE: 3}  # by CallRecord.kind

# SVG geometry (pixels): a label column, then the plot; one row per lane.
WIDTH = 980
LABEL_W = 92
RIGHT_PAD = 16
AXIS_H = 22
ROW_H = 15
BAR_H = 11


@dataclass
class Bar:
    """One call drawn on a timeline: its record, with times in seconds from the problem's origin,
    and what only the drawing knows, whether it lies on the critical path."""

    call: CallRecord
    critical: bool = False

    @property
    def role(self) -> str:
        return self.call.role

    @property
    def kind(self) -> str:
        """planner | executor | final | baseline: the bar's colour (CSS class) and lane order."""
        return self.call.kind

    @property
    def start(self) -> float:
        return self.call.start

    @property
    def end(self) -> float:
        return self.call.end

    @property
    def kept(self) -> bool:
        """False: failed, cancelled, redrawn for length, or thrown away (stream)."""
        return self.call.kept and not self.call.error

    @property
    def lane(self) -> str:
        if self.kind == PLANNER:
            return f"plan {self.call.label}"
        if self.kind == EXECUTOR:
            return f"exec {self.call.label}"
        return self.kind

    @property
    def duration(self) -> float:
        return self.call.duration

    def describe(self) -> str:
        """The bar's tooltip: what the call was, when, and how it ended."""
        c = self.call
        parts = [f"{self.lane} (draw {c.draw}" + (f", attempt {c.run}" if c.run > 1 else "") + ")",
                 f"{self.start:.3f}–{self.end:.3f} s ({self.duration:.3f} s)"]
        if c.prompt_tokens or c.completion_tokens:  # 0 and 0: a failed call, or counts not known
            parts.append(f"prompt {c.prompt_tokens or '?'} tokens, generated {c.completion_tokens}")
        if c.cached:
            parts.append("answered from the response cache")
        if not self.kept:
            parts.append("discarded" + (f": {c.error}" if c.error else " (redrawn or thrown away)"))
        if self.critical:
            parts.append("on the critical path")
        return "\n".join(parts)


@dataclass
class Timeline:
    """The calls of one problem in one run."""

    label: str  # e.g. the run's name and schedule
    source: str  # "recorded" | "modelled" | "measured" (time-replay on a real engine)
    bars: list[Bar] = field(default_factory=list)
    schedule: str | None = None
    baseline_source: str = ""  # "recorded" | "modelled" | "measured" when a baseline bar was added

    @property
    def calls(self) -> list[Bar]:
        """The SPRINT calls (the baseline reference bar left out)."""
        return [b for b in self.bars if b.role != BASELINE]

    @property
    def total(self) -> float:
        """Seconds from the origin to the end of the last SPRINT call (0 without calls)."""
        return max((b.end for b in self.calls), default=0.0)

    @property
    def span(self) -> float:
        """Seconds the drawing must show: the SPRINT calls and the baseline bar."""
        return max((b.end for b in self.bars), default=0.0)

    @property
    def critical(self) -> list[Bar]:
        return [b for b in self.bars if b.critical]


# ---------------------------------------------------------------------------------------------
# Building timelines.


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def from_calls(
    calls: Iterable[dict],
    label: str,
    *,
    origin: float | None = None,
    schedule: str | None = None,
    time_scale: float = 1.0,
) -> Timeline:
    """A recorded timeline from the `calls` of an orchestration (or baseline) record.

    `origin` is the problem's start (default: the first call's start). Times are divided by
    `time_scale`, so a replay server run at `--time-scale 0.1` reads in simulated seconds.
    Calls without numeric times are left out.
    """
    rows = [CallRecord.from_dict(c) for c in calls
            if isinstance(c, dict) and _num(c.get("start")) is not None and _num(c.get("end")) is not None]
    if origin is None:
        origin = min((c.start for c in rows), default=0.0)
    bars = [Bar(c.shifted(origin, time_scale)) for c in rows]
    bars.sort(key=lambda b: (b.start, KIND_ORDER.get(b.kind, 9), b.call.label))
    timeline = Timeline(label, "recorded", bars, schedule)
    mark_critical(timeline.bars)
    return timeline


def from_timing(path: str | Path) -> dict[str, list[Timeline]]:
    """{problem id: measured timelines} from a `sprint time-replay` folder (or its timing.json).

    Each SPRINT schedule replayed on a real engine becomes one timeline per problem, in measured
    seconds, with the measured baseline call as its reference bar (a different clock from the
    recorded run's, so no bar from the recording is laid over it).
    """
    file = Path(path) / "timing.json" if Path(path).is_dir() else Path(path)
    try:
        timing = json.loads(file.read_text(encoding="utf-8"))
        methods = timing["methods"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read time-replay measurements from {file} ({exc}); pass the output folder "
                        "of `sprint time-replay`") from None
    baseline = {str(p["id"]): max((float(c["end"]) for c in p.get("calls") or [] if _num(c.get("end")) is not None),
                                  default=None)
                for p in (methods.get("baseline") or {}).get("problems") or []}
    out: dict[str, list[Timeline]] = {}
    for method, data in methods.items():
        if method == "baseline":
            continue  # drawn as the reference bar of each schedule's timeline, on the same clock
        for prob in data.get("problems") or []:
            pid = str(prob["id"])
            timeline = from_calls(prob.get("calls") or [], f"{method} — measured on {timing.get('model', 'the server')}",
                                  origin=0.0, schedule=method if method in SCHEDULES else None)
            timeline = replace(timeline, source="measured")
            if baseline.get(pid) is not None:
                timeline = with_baseline(timeline, baseline[pid])
                timeline.baseline_source = "measured"
            out.setdefault(pid, []).append(timeline)
    return out


def from_path(path: PathTiming, label: str) -> Timeline:
    """A modelled timeline from `sprint.latency.simulate.critical_path_timeline` (token counts -> seconds)."""
    timeline = Timeline(label, "modelled", [Bar(c) for c in path.calls], path.schedule)
    mark_critical(timeline.bars)
    return timeline


def modelled_paths(trajs: Sequence[Trajectory], tokenizer: str, model: LatencyModel,
                   **options: Any) -> list[dict[str, PathTiming]]:
    """Per trajectory, {schedule: critical-path timeline} under the latency model, for runs that
    recorded no call times (`sprint.latency.simulate.modelled_timelines`, the evaluation's own
    modelled seconds; `options`: those of `critical_path_timeline`)."""
    return modelled_timelines(list(trajs), tokenizer, model, **options)[0]


def with_baseline(timeline: Timeline, seconds: float | None, tokens: int | None = None) -> Timeline:
    """A copy of `timeline` with the sequential baseline's one call as a reference bar from 0."""
    if seconds is None:
        return timeline
    bar = Bar(CallRecord(BASELINE, 0, completion_tokens=tokens or 0, start=0.0, end=float(seconds)))
    return replace(timeline, bars=[b for b in timeline.bars if b.role != BASELINE] + [bar])


# ---------------------------------------------------------------------------------------------
# The critical path.


def _predecessor(i: int, bars: Sequence[Bar], tol: float) -> int | None:
    """The call bar `i` waited for before it started (see the module docstring), or None."""
    x = bars[i].call
    if x.kind == EXECUTOR:
        retries = [j for j, b in enumerate(bars) if j != i and b.kind == EXECUTOR and b.call.label == x.label
                   and b.call.run == x.run and b.call.draw < x.draw and b.end <= x.start + tol]
        if retries:
            return max(retries, key=lambda j: bars[j].end)
        planners = [j for j, b in enumerate(bars) if b.kind == PLANNER and b.call.phase == x.phase
                    and b.call.run == x.run and b.start <= x.start + tol]
        if planners:  # the latest draw that had started: barrier waits for its end, stream for a prompt in it
            return max(planners, key=lambda j: (bars[j].start, bars[j].end))
        return None
    # a planner or the final answer: the last call that ended before it started, from an earlier
    # phase (or attempt), or an earlier draw of its own phase
    cands = []
    for j, bar in enumerate(bars):
        b = bar.call
        if j == i or b.role == BASELINE or b.end > x.start + tol:
            continue
        earlier = (b.run, b.phase) < (x.run, x.phase)
        same_phase_redraw = b.run == x.run and b.phase == x.phase and b.kind == x.kind and b.draw < x.draw
        final_after_phase = x.is_final and b.run == x.run and b.phase == x.phase and not b.is_final
        if earlier or same_phase_redraw or final_after_phase:
            cands.append(j)
    if not cands:
        return None
    return max(cands, key=lambda j: (bars[j].end, bars[j].kept))


def critical_indices(bars: Sequence[Bar]) -> list[int]:
    """Indices of the critical path, first call first: the chain of waits behind the last end."""
    calls = [i for i, b in enumerate(bars) if b.role != BASELINE]
    if not calls:
        return []
    kept = [i for i in calls if bars[i].kept] or calls
    last = max(kept, key=lambda i: (bars[i].end, KIND_ORDER.get(bars[i].kind, 9)))
    span = max(bars[i].end for i in calls) - min(bars[i].start for i in calls)
    tol = 1e-6 * max(1.0, span)
    path, seen = [last], {last}
    while True:
        j = _predecessor(path[-1], bars, tol)
        if j is None or j in seen:
            break
        path.append(j)
        seen.add(j)
    return path[::-1]


def mark_critical(bars: list[Bar]) -> list[int]:
    """Set `critical` on the bars of the critical path; returns their indices."""
    path = critical_indices(bars)
    on = set(path)
    for i, b in enumerate(bars):
        b.critical = i in on
    return path


# ---------------------------------------------------------------------------------------------
# Geometry and SVG.


@dataclass(frozen=True)
class Box:
    """Where a bar is drawn: pixels in the SVG."""

    x: float
    y: float
    w: float
    h: float
    lane: int


def lanes(bars: Sequence[Bar]) -> list[str]:
    """Lane names, top to bottom: each phase's plan then its executions, the final answer, the baseline."""
    def key(name: str) -> tuple:
        bar = next(b for b in bars if b.lane == name)
        order = {PLANNER: 0, EXECUTOR: 1}.get(bar.kind)
        if order is None:
            return (math.inf, KIND_ORDER.get(bar.kind, 9), 0)
        sub = [int(p) if p.isdigit() else 0 for p in bar.call.label.split(".")[1:]] or [0]
        return (bar.call.phase, order, *sub)

    return sorted({b.lane for b in bars}, key=key)


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick step (1, 2 or 5 × 10^k) giving at most about `ticks` ticks over `span`."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def layout(timeline: Timeline, scale_s: float | None = None, width: int = WIDTH) -> tuple[list[Box], list[str], float]:
    """Boxes of the timeline's bars (same order as `timeline.bars`), lane names and px per second.

    `scale_s` is the time the plot's width stands for (pass the longest of several timelines to
    draw them on one scale); a bar of zero length (a cached call) is drawn 1 px wide.
    """
    names = lanes(timeline.bars)
    index = {n: k for k, n in enumerate(names)}
    span = scale_s if scale_s and scale_s > 0 else (timeline.span or 1.0)
    px = (width - LABEL_W - RIGHT_PAD) / span
    boxes = []
    for b in timeline.bars:
        k = index[b.lane]
        x = LABEL_W + b.start * px
        w = max(1.0, b.duration * px)
        boxes.append(Box(round(x, 2), AXIS_H + k * ROW_H + (ROW_H - BAR_H) / 2, round(w, 2), BAR_H, k))
    return boxes, names, px


def _fmt_s(t: float) -> str:
    return f"{t:.0f}" if t >= 10 or t == 0 else f"{t:.2g}"


def svg(timeline: Timeline, scale_s: float | None = None, width: int = WIDTH) -> str:
    """An inline SVG Gantt chart; every text is escaped. Styling comes from the page's CSS classes."""
    boxes, names, px = layout(timeline, scale_s, width)
    height = AXIS_H + len(names) * ROW_H + 6
    span = scale_s if scale_s and scale_s > 0 else (timeline.span or 1.0)
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(timeline.label)}">']
    step = nice_step(span)
    t = 0.0
    while t <= span * 1.0001:
        x = LABEL_W + t * px
        out.append(f'<line class="tick" x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" y2="{height - 4}"/>'
                   f'<text class="ticklabel" x="{x:.1f}" y="{AXIS_H - 8}">{_fmt_s(t)} s</text>')
        t += step
    for k, name in enumerate(names):
        y = AXIS_H + k * ROW_H
        if k % 2:
            out.append(f'<rect class="stripe" x="0" y="{y}" width="{width}" height="{ROW_H}"/>')
        out.append(f'<text class="lane" x="{LABEL_W - 6}" y="{y + ROW_H - 4}">{escape(name)}</text>')
    crit = [(b, box) for b, box in zip(timeline.bars, boxes) if b.critical]
    for b, box in zip(timeline.bars, boxes):
        cls = ["bar", b.kind]
        if b.critical:
            cls.append("crit")
        if not b.kept:
            cls.append("discarded")
        if b.call.cached:
            cls.append("cached")
        out.append(f'<rect class="{" ".join(cls)}" x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" '
                   f'data-lane="{escape(b.lane)}" data-start="{b.start:.6g}" data-end="{b.end:.6g}">'
                   f'<title>{escape(b.describe())}</title></rect>')
    if crit:  # a staircase along the critical path: along each call until the next one starts
        first = crit[0][1]
        pts = [(first.x, first.y + first.h / 2)]
        for _, box in crit[1:]:
            pts += [(box.x, pts[-1][1]), (box.x, box.y + box.h / 2)]
        last = crit[-1][1]
        pts.append((last.x + last.w, last.y + last.h / 2))
        out.append('<polyline class="critline" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
    out.append("</svg>")
    return "".join(out)


def length_svg(items: Sequence[tuple[str, float, str]], width: int = WIDTH) -> str:
    """Horizontal bars of token lengths, one per (label, tokens, CSS class), on one scale."""
    top = max(v for _, v, _ in items) or 1
    label_w, h = 300, 18
    rows = []
    for k, (name, v, cls) in enumerate(items):
        w = max(1.0, (width - label_w - 90) * v / top)
        y = 4 + k * (h + 4)
        rows.append(f'<text class="lane" x="{label_w - 6}" y="{y + 13}">{escape(name)}</text>'
                    f'<rect class="len {escape(cls)}" x="{label_w}" y="{y}" width="{w:.1f}" height="{h}">'
                    f'<title>{v:,.0f} tokens</title></rect>'
                    f'<text class="val" x="{label_w + w + 6:.1f}" y="{y + 13}">{v:,.0f} tokens</text>')
    height = 8 + len(items) * (h + 4)
    return (f'<svg class="lengths" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(rows)}</svg>')
