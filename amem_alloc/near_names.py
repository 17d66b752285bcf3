"""A near name for a mistyped one, said the same way by every command: `--gpus` -> `--gpu`,
`RTX4090` -> `RTX-4090`, `gtp` -> `gpt` (difflib's similarity, on names compared without case,
`-` or `_`)."""
from __future__ import annotations

import difflib
from typing import Iterable

CUTOFF = 0.6  # difflib's default similarity: "gpus"/"gpu" 0.86, "H1000"/"H100" 0.89, "bogus"/"torch" 0.2


def _plain(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to `word`, or None when none is near."""
    by_plain: dict[str, str] = {}
    for choice in choices:
        by_plain.setdefault(_plain(choice), choice)
    found = difflib.get_close_matches(_plain(word), list(by_plain), n=1, cutoff=CUTOFF)
    return by_plain[found[0]] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest choice, or '' when none is near (appended to a message)."""
    found = nearest(word, choices)
    return f" (did you mean {found}?)" if found and found != word else ""
