"""NATS subjects: which ones a message can be published to, and which a pattern matches."""

from __future__ import annotations

import re

_NOT_PUBLISHABLE = re.compile(r"\s|(^|\.)[*>](\.|$)|^\.|\.\.|\.$")


def is_publish_subject(subject: str) -> bool:
    """A subject a message can be published to: no whitespace, no wildcard or empty token."""
    return bool(subject) and not _NOT_PUBLISHABLE.search(subject)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    pat = pattern.split(".")
    sub = subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)
