"""Progress reporting: plain periodic lines off a terminal, a rich bar on one."""

from __future__ import annotations

import io

import pytest

from krea2.infra.progress import format_duration, progress, track


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_have_count_percent_rate_eta_and_fields(monkeypatch):
    monkeypatch.delenv("KREA2_PROGRESS", raising=False)
    out = io.StringIO()
    with progress("train 32px", total=10, unit="step", interval_s=0.0, stream=out) as bar:
        for _ in range(4):
            bar.advance(loss="0.5000")
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 4  # one per update at interval 0; the end repeats no line
    assert lines[0].startswith("train 32px: 1/10 step (10%)")
    assert "step/s" in lines[-1] and "eta " in lines[-1] and "loss=0.5000" in lines[-1]
    assert lines[-1].startswith("train 32px: 4/10 step (40%)")


def test_plain_lines_are_throttled_and_marked_when_stopped(monkeypatch):
    monkeypatch.delenv("KREA2_PROGRESS", raising=False)
    out = io.StringIO()
    with (
        pytest.raises(KeyboardInterrupt),
        progress("sample", total=1000, interval_s=3600, stream=out) as bar,
    ):
        for _ in range(500):
            bar.advance()
        raise KeyboardInterrupt
    lines = out.getvalue().strip().splitlines()
    assert lines == [lines[-1]]
    assert lines[-1].startswith("sample: 500/1000 it (50%)")
    assert lines[-1].endswith("(stopped)")


def test_terminal_draws_a_bar(monkeypatch):
    monkeypatch.delenv("KREA2_PROGRESS", raising=False)
    out = FakeTerminal()
    items = list(track(range(7), "curate", stream=out))
    assert items == list(range(7))
    text = out.getvalue()
    assert "curate" in text and "7/7" in text


def test_unknown_total_and_off_mode(monkeypatch):
    out = io.StringIO()
    with progress("ingest", interval_s=0.0, stream=out) as bar:
        bar.advance(3)
    assert out.getvalue().strip().splitlines()[-1].startswith("ingest: 3 it,")
    monkeypatch.setenv("KREA2_PROGRESS", "off")
    quiet = io.StringIO()
    with progress("ingest", total=3, stream=quiet) as bar:
        bar.advance(3)
    assert quiet.getvalue() == ""


def test_the_environment_sets_every_loops_line_spacing(monkeypatch):
    monkeypatch.setenv("KREA2_PROGRESS", "plain")
    monkeypatch.setenv("KREA2_PROGRESS_INTERVAL", "0")
    out = io.StringIO()
    with progress("export", total=3, interval_s=3600, stream=out) as bar:
        for _ in range(3):
            bar.advance()
    assert len(out.getvalue().strip().splitlines()) == 3
    monkeypatch.setenv("KREA2_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ValueError, match="KREA2_PROGRESS_INTERVAL='soon'"):
        progress("export", total=3, stream=out)


@pytest.mark.parametrize(("seconds", "text"), [(12.34, "12.3s"), (75, "1m15s"), (4000, "1h06m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
