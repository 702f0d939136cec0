"""The content signature keeps its rule whatever the text: the BLAKE2b-128 of the lowercased
words (runs of letters and digits), each word that holds a digit dropped. A signature stored by
one release is compared by the next, so a faster implementation must give the same digest."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st

from consumers.signature import text_signature


def _reference(text: str) -> str:
    words = []
    for token in re.findall(r"[^\W_]+", text.lower()):
        if not any(ch.isdigit() for ch in token):
            words.append(token)
    return hashlib.blake2b(" ".join(words).encode(), digest_size=16).hexdigest()


_PIECES = st.sampled_from(["news", "État", "naïve", "2024", "v1", "x9y", "½", "\u0663",
                           "\uff12\uff10", "under_score", "12:03", "四", "\u0301", " ", "\n",
                           "-", "'", "_"])


@given(st.lists(_PIECES, max_size=40).map("".join))
def test_the_signature_is_the_rules_digest(text: str) -> None:
    assert text_signature(text) == _reference(text)


@given(st.text(max_size=200))
def test_any_text_gives_the_rules_digest(text: str) -> None:
    assert text_signature(text) == _reference(text)


_ASCII_PIECES = st.sampled_from(["news", "Bridge", "2024", "v1", "x9y", "9x", "a1b2c3", "_",
                                 "under_score", "12:03", " ", "\n", "-", "'", ".", "\t",
                                 "\x00", "\x7f", "A"])


@given(st.lists(_ASCII_PIECES, max_size=60).map("".join))
def test_ascii_text_takes_the_bytes_path_to_the_same_digest(text: str) -> None:
    assert text.isascii()
    assert text_signature(text) == _reference(text)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_any_ascii_text_gives_the_rules_digest(text: str) -> None:
    assert text_signature(text) == _reference(text)
