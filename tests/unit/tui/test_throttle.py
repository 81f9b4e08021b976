"""The paint throttle: the first piece at once, then at most one emit per interval, the last one never lost."""

from __future__ import annotations

import asyncio

from openjarvis.tui.throttle import Throttle


def test_bursts_are_collapsed_and_the_tail_is_flushed() -> None:
    async def scenario() -> list[str]:
        out: list[str] = []
        t = Throttle(out.append, 0.05)
        for piece in "abcde":
            t.add(piece)
        assert out == ["a"]  # at once, then held back
        await asyncio.sleep(0.12)
        assert out == ["a", "abcde"]  # the trailing timer painted the rest
        t.add("f")
        t.close()  # the final text comes with the result; nothing fires after close
        await asyncio.sleep(0.08)
        return out

    out = asyncio.run(scenario())
    assert out[-1] in ("abcde", "abcdef")
