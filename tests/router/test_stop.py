"""StopSequenceMatcher over incremental text: hold-back, split matches, the stop text is kept."""

from __future__ import annotations

import random

from pytgi.router.stop import StopSequenceMatcher


def feed_all(matcher, pieces):
    released = []
    for piece in pieces:
        text, match = matcher.feed(piece)
        released.append(text)
        if match:
            return released, match
    released.append(matcher.flush())
    return released, None


def test_stop_split_over_pieces_is_found_and_kept():
    released, match = feed_all(StopSequenceMatcher(["END"]), ["Hello E", "N", "D and more"])
    assert match.stop == "END" and match.trailing == " and more"
    assert released == ["Hello ", "", "END"]


def test_partial_prefix_is_held_then_released():
    m = StopSequenceMatcher(["stop!"])
    assert m.feed("a st") == ("a ", None)
    assert m.held == "st"
    assert m.feed("ory") == ("story", None)
    assert m.flush() == ""


def test_flush_releases_held_text():
    m = StopSequenceMatcher(["\n\nUser:"])
    assert m.feed("answer\n\nUs") == ("answer", None)
    assert m.flush() == "\n\nUs"


def test_earliest_completed_stop_wins():
    released, match = feed_all(StopSequenceMatcher(["long stop", "on"]), ["a long stop"])
    assert match.stop == "on" and released == ["a lon"] and match.trailing == "g stop"


def test_no_stops_releases_everything():
    m = StopSequenceMatcher(["", ""])
    assert m.stop_sequences == ()
    assert m.feed("abc") == ("abc", None)


def test_overlapping_prefixes():
    released, match = feed_all(StopSequenceMatcher(["aab"]), ["a", "a", "a", "b"])
    assert match.stop == "aab"
    assert "".join(released) == "aaab"


def test_random_pieces_property():
    """Released text + held text always equals what was fed; a stop is found iff it occurs."""
    rng = random.Random(0)
    for _ in range(500):
        stops = ["".join(rng.choice("ab ") for _ in range(rng.randint(1, 4))) for _ in range(2)]
        text = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(1, 6))))
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)], strict=True)]
        released, match = feed_all(StopSequenceMatcher(stops), pieces)
        joined = "".join(released)
        if match is None:
            assert joined == text and not any(s in text for s in stops)
        else:
            first_end = min(text.find(s) + len(s) for s in stops if s in text)
            assert joined == text[:first_end]
            assert joined.endswith(match.stop)
