"""Secrets stay out of what air prints and records. A URL may carry a password (`http://user:PASS@host/v1`) or a
key in its query (`?api_key=...`); air still uses the URL as given, but every place that shows or writes one (the
terminal, an error line, summary.json, a trajectory's start record, which travels with shared runs) shows
`redact_url(url)`, and the CLI's error line passes through `redact_text` whatever it quotes."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

from air import variables

HIDDEN = "***"
_SECRET_KEY = re.compile(r"(key|token|secret|pass|password|passwd|pwd|auth|credential|signature|sig)$", re.I)
_QUERY_PAIR = re.compile(r"([^&;=]+)=([^&;]*)")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def _query(query: str) -> str:
    def hide(match: re.Match[str]) -> str:
        name = match.group(1)
        words = re.split(r"[-_.]", name)
        return f"{name}={HIDDEN}" if match.group(2) and any(_SECRET_KEY.search(w) for w in words) else match.group(0)

    return _QUERY_PAIR.sub(hide, query)


def redact_url(url: str) -> str:
    """`url` with its password (or a lone user part, often a token) and its query's secret-looking values as ***;
    a URL with neither comes back unchanged."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:  # not a URL Python can split: show nothing of what might be a credential
        return re.sub(r"//[^/@]*@", f"//{HIDDEN}@", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:{HIDDEN}@{host}" if has_password else f"{HIDDEN}@{host}"
    query = _query(parts.query) if parts.query else parts.query
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def known_secrets() -> list[str]:
    """What this process was given as a secret, as text: the secret variables' values (air.variables) and the
    password of a URL in DOCKER_HOST or AIR_BASE_URL. A library's error may quote one outside any URL (the docker
    SDK's `Host='admin:PW@...'`), so what is printed is searched for the values themselves too."""
    found = list(variables.secret_values())
    for name in ("DOCKER_HOST", "AIR_BASE_URL"):
        try:
            parts = urlsplit(os.environ.get(name) or "")
            found += [parts.password or "", (parts.username or "") if parts.password is None else ""]
        except ValueError:
            continue
    # A short value would hide ordinary words: a secret of fewer than 4 characters is not searched for.
    return sorted({value for value in found if len(value) >= 4}, key=len, reverse=True)


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted, and every known secret (known_secrets) wherever it stands: an error
    line or a report row that quotes one, whoever wrote it."""
    text = _URL.sub(lambda m: redact_url(m.group(0)), text) if "://" in text else text
    for value in known_secrets():
        text = text.replace(value, HIDDEN)
    return text


__all__ = ["HIDDEN", "known_secrets", "redact_text", "redact_url"]
