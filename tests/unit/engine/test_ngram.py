"""The n-gram drafter proposes what followed the longest earlier match."""

from __future__ import annotations

from openjarvis.engine.ngram import NgramDrafter


def test_proposes_continuation_of_longest_most_recent_match() -> None:
    d = NgramDrafter(max_draft=4)
    ctx = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    draft = d.propose(ctx, max_len=10)
    assert draft is not None
    # [1, 2, 3] matched at the start (3 tokens beat the more recent [2, 3]).
    assert draft.tokens == (4, 5, 9, 2)
    assert draft.match == 3 and draft.key == "ngram:3" and draft.probs is None


def test_no_match_no_draft_and_max_len() -> None:
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 4], max_len=8) is None
    assert d.propose([1, 2, 1, 2], max_len=0) is None
    draft = d.propose([1, 2, 5, 6, 7, 1, 2], max_len=2)
    assert draft is not None and draft.tokens == (5, 6)


def test_copies_from_corpus_and_follows_the_growing_context() -> None:
    d = NgramDrafter(corpus=[[10, 11, 12, 13, 14, 15]])
    d.reset([1, 2])
    assert d.propose([1, 2, 10, 11], max_len=3).tokens == (12, 13, 14)
    # The context itself now repeats differently; the most recent occurrence wins.
    draft = d.propose([1, 2, 10, 11, 99, 10, 11], max_len=3)
    assert draft is not None and draft.tokens == (99, 10, 11)
    # A different conversation (not an extension) resets the live context, keeps the corpus.
    assert d.propose([7, 10, 11], max_len=2).tokens == (12, 13)


def test_a_match_reaching_far_back_is_bucketed_as_copying() -> None:
    """The bucket follows how far back the match goes, not just the indexed n-gram length."""
    text = list(range(100, 140))  # a 40-token "file" in the prompt
    d = NgramDrafter(max_draft=8)
    draft = d.propose(text + [7] + text[:20], max_len=8)  # the answer is copying it
    assert draft is not None and draft.tokens == tuple(text[20:28])
    assert draft.match >= 16 and draft.key == "ngram:16"
    fresh = d.propose(text + [7, 1, 2] + text[:5], max_len=8)
    assert fresh is not None and fresh.key in ("ngram:4", "ngram:8") and fresh.match < 16
