"""Text and JSON from outside air (a model's reply, a trajectory file, a server's answer), made safe once, where
they arrive, so that nothing downstream meets what it cannot print, write or parse:

- `clean(text)`: a lone surrogate (JSON's `"\\ud800"` decodes to one; no UTF-8 holds it, so writing or printing
  it fails) becomes U+FFFD, the replacement character. Paired surrogates are real characters and stay.
- `loads(text)`: json.loads, but every way the text can fail is a JSONDecodeError (a ValueError): an integer
  longer than Python converts (4300 digits, refused by a `parse_int` hook as it is read) and nesting deeper than
  its recursion limit included, which json raises as other errors. Strings in the value are cleaned. Every
  decoding point of text from a model, a client or a file uses it (tool-call arguments, trajectories, what
  `air debug` reads), so a crafted value is one format error where it arrives, never an exception later.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LONE = re.compile(r"[\ud800-\udfff]")
_ESCAPED = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a surrogate: the only way one gets into a value (UTF-8 text cannot hold them)."""


def clean(text: str) -> str:
    """`text` with its lone surrogates replaced by U+FFFD."""
    if not _LONE.search(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


MAX_DIGITS = 4300
"""The longest integer a JSON value may hold here: Python's own limit on converting one (sys.int_info's default),
said where the text is decoded, not as a ValueError wherever the number is next used."""


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_DIGITS})")
    return int(digits)


def loads(text: str | bytes) -> Any:
    """The JSON value of `text`; JSONDecodeError (naming why) for anything Python's json cannot make a value of."""
    try:
        value = json.loads(text, parse_int=_bounded_int)
        return _cleaned(value) if _ESCAPED.search(_str(text)) else value
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", _str(text), 0) from None
    except ValueError as exc:  # an integer of more digits than int() converts, ...
        raise json.JSONDecodeError(str(exc).split(";")[0], _str(text), 0) from None


def _str(text: str | bytes) -> str:
    return text if isinstance(text, str) else text.decode("utf-8", "replace")


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    if isinstance(value, dict):
        return {clean(k): _cleaned(v) for k, v in value.items()}
    return value


__all__ = ["clean", "loads"]
