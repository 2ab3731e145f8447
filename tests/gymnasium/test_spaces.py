from __future__ import annotations

import gymnasium
from gymnasium.vector.utils import batch_space
from rollbox.sandbox import ExecResult
from rollbox_gymnasium.observation import render_result, truncate
from rollbox_gymnasium.spaces import SAMPLE_CHARSET, UnicodeText

LLM_COMMAND = 'grep -rn "TODO → fix" src/ | head -n 5  # 检查 ✓ 😀\n\tcd ~/projets/été && ls'


def test_text_space_accepts_real_llm_output() -> None:
    space = UnicodeText(16_384)
    assert space.contains(LLM_COMMAND)
    assert space.contains("")
    assert space.contains("x" * 16_384)
    assert space.contains("\U0001f9ea unicode beyond the sampling charset \u0f00")


def test_text_space_rejects_what_cannot_reach_a_sandbox() -> None:
    space = UnicodeText(100)
    assert not space.contains("ls\0-la")
    assert not space.contains("lone surrogate \ud800")
    assert not space.contains("x" * 101)
    assert not space.contains(b"ls")
    assert not UnicodeText(10, min_length=1).contains("")


def test_samples_are_members_and_wide() -> None:
    space = UnicodeText(2000, seed=7)
    samples = [space.sample() for _ in range(20)]
    assert all(space.contains(s) for s in samples)
    drawn = set("".join(samples))
    assert any(ord(c) > 127 for c in drawn)
    assert drawn <= set(SAMPLE_CHARSET)


def test_space_equality_and_batching() -> None:
    assert UnicodeText(10) == UnicodeText(10)
    assert UnicodeText(10) != UnicodeText(11)
    assert UnicodeText(10) != gymnasium.spaces.Text(10, min_length=0, charset=SAMPLE_CHARSET)
    batched = batch_space(UnicodeText(50), 3)
    assert batched.contains(("a", "é", "😀"))


def test_truncate_keeps_head_and_tail_within_limit() -> None:
    text = "HEAD" + "m" * 10_000 + "TAIL"
    for limit in (40, 100, 999):
        cut, truncated = truncate(text, limit)
        assert truncated and len(cut) <= limit
        assert cut.startswith("HE") and cut.endswith("IL")
        dropped = len(text) - (len(cut) - len(cut.split("\n")[1]) - 2)
        assert f"{dropped} characters truncated" in cut
    assert truncate("short", 10) == ("short", False)


def test_render_merges_streams_and_cleans() -> None:
    result = ExecResult(1, stdout=b"out\0put", stderr=b"err \xff\n")
    rendered = render_result(result, 100)
    assert rendered.text == "out\ufffdput\nerr \ufffd\n"
    assert not rendered.truncated
    capped = render_result(ExecResult(0, stdout=b"abc", stdout_truncated=True), 100)
    assert capped.truncated and capped.text == "abc"
    timed = render_result(ExecResult(-9, stdout=b"partial\n", duration_s=2.0), 100,
                          timed_out=True)
    assert timed.text.startswith("partial\n") and "timed out after 2s" in timed.text
