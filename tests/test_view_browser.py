"""The viewer in a real browser: headless Chromium opens the generated site from file://.

Checks the DOM after the page's own script ran (row count, sorting and filtering set from the
URL, bars in the timeline, a `<script>` payload in model text shown as text and never run), that
the console stays silent, and saves screenshots (into $SPRINT_SCREENSHOT_DIR when set, so a
person can look at them). Skips only when no Chromium is installed (`.ci/run` installs the
Debian package `chromium` with apt-get when it is missing).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.test_view import BARRIER, STREAM, write_baseline, write_view_run

from sprint.viewer.site import ViewConfig, build

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Model text that would change the DOM if the page ever ran it.
ATTACK = ('<script>document.body.setAttribute("data-pwned","script")</script>'
          '<img src=x onerror="document.body.setAttribute(\'data-pwned\',\'img\')">')


def browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip("no Chromium installed (apt-get install chromium; .ci/run does it when apt-get is available)")
    return found


def run_chromium(exe: str, profile: Path, url: str, *args: str) -> tuple[str, list[str]]:
    """(stdout, console lines) of one headless Chromium run on `url`, offline and without a profile."""
    command = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", *args, url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("browser")
    from tests import test_view

    original = test_view.PAYLOAD
    test_view.PAYLOAD = ATTACK  # the runs' model text carries a live payload
    try:
        write_view_run(root / "barrier", "barrier", BARRIER, n=12)
        write_view_run(root / "stream", "stream", STREAM, n=12)
        write_baseline(root / "base", n=12)
    finally:
        test_view.PAYLOAD = original
    build(ViewConfig(runs=[str(root / "barrier"), str(root / "stream")], baseline=[str(root / "base")],
                     planner_tokenizer=str(tok_dir), out=str(root / "site"), bootstrap=0))
    return root / "site"


def rows(dom: str) -> list[str]:
    """The <tr> elements of the first problem table's body, as serialised by Chromium."""
    table = re.search(r'<table class="problems".*?</table>', dom, re.S)
    assert table, "no problem table in the DOM"
    body = re.search(r"<tbody>(.*?)</tbody>", table.group(0), re.S).group(1)
    return re.findall(r"<tr\b[^>]*>.*?</tr>", body, re.S)


def shots_dir(tmp: Path) -> Path:
    out = Path(os.environ.get("SPRINT_SCREENSHOT_DIR") or tmp)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_index_in_chromium(site: Path, tmp_path: Path) -> None:
    exe = browser()
    index = (site / "index.html").resolve().as_uri()
    dom, console = run_chromium(exe, tmp_path / "profile", index, "--dump-dom")
    assert console == [], console
    found = rows(dom)
    assert len(found) == 12
    assert "24 of 24 rows shown" in dom  # the script ran and counted both runs' tables
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]
    assert re.search(r'<img src="evaluation/[a-z_]+\.png"', dom)  # the evaluation's plots, local files

    # sorting and filtering from the URL: by sequential tokens, descending; then only wrong answers
    dom, console = run_chromium(exe, tmp_path / "profile", index + "#sort=id&desc=1", "--dump-dom")
    assert console == []
    ids = [re.search(r'data-v="(p\d+)"', r).group(1) for r in rows(dom)]
    assert ids == sorted(ids, key=lambda s: int(s[1:]), reverse=True)
    assert 'aria-sort="descending"' in dom
    dom, _ = run_chromium(exe, tmp_path / "profile", index + "#show=wrong", "--dump-dom")
    hidden = [r for r in rows(dom) if re.match(r"<tr[^>]*\bhidden\b", r)]
    assert len(hidden) == 12 and "0 of 24 rows shown" in dom  # every answer is right: nothing wrong shown

    shot = shots_dir(tmp_path) / "view-index.png"
    run_chromium(exe, tmp_path / "profile", index, f"--screenshot={shot}", "--window-size=1280,1800")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_problem_page_in_chromium(site: Path, tmp_path: Path) -> None:
    exe = browser()
    page = (site / "problems" / "p0.html").resolve().as_uri()
    dom, console = run_chromium(exe, tmp_path / "profile", page, "--dump-dom")
    assert console == [], console
    body_tag = dom.split("<body", 1)[1].split(">", 1)[0]
    assert "data-pwned" not in body_tag  # neither the <script> nor the onerror ran
    assert "&lt;script&gt;document.body.setAttribute" in dom  # shown as text
    assert not re.search(r"<img src=\"?x", dom)
    svgs = re.findall(r'<svg class="timeline".*?</svg>', dom, re.S)
    assert len(svgs) == 2
    bars = [len(re.findall(r'<rect class="bar ', s)) for s in svgs]
    assert bars == [7, 8]  # barrier: 6 calls + baseline; stream: 7 calls (one thrown away) + baseline
    assert len(re.findall(r'<rect class="bar [a-z ]*\bcrit\b', svgs[0])) == 5
    assert "stream ends 1.20 s earlier than barrier" in dom
    shot = shots_dir(tmp_path) / "view-problem.png"
    run_chromium(exe, tmp_path / "profile", page, f"--screenshot={shot}", "--window-size=1280,1400")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
