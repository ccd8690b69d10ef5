"""The protocol's per-class specs (protocol._spec, issue 74): a frame decodes to the very message, or is refused with
the very error, that field-by-field conforming (protocol._conform for every field) gives, for every message type
and every kind of value JSON can bring; encode writes the frames json.dumps wrote."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from air.sandbox.warden import protocol as p

VALUES = [None, True, False, 0, 7, -1, 1.5, "", "text", [], ["a", "b"], [1], ["a", 1], {}, {"k": "v"}, {"k": 1},
          {"k": None}, {"k": ["v"]}, [["a", 1]], b"raw"]
"""What a header's field (or, for bytes, a part) may hold."""


def _slow(monkeypatch) -> None:
    """Every field through _conform, as before the specs."""
    specs = {}
    for cls in list(p.REQUESTS.values()) + list(p.REPLIES.values()):
        names, order = p._spec(cls)
        specs[cls] = (names, tuple((name, tp, meta, None) for name, tp, meta, _ in order))
    monkeypatch.setattr(p, "_SPECS", specs)


def _outcome(head: bytes, body: bytes, kinds: dict):
    try:
        ident, message = p.decode(head, body, kinds)
    except p.ProtocolError as exc:
        return "refused", str(exc)
    return ident, type(message), {f.name: (type(getattr(message, f.name)), getattr(message, f.name))
                                  for f in fields(message)}


def _valid(tp, meta):
    """The first of VALUES that the field takes."""
    for value in VALUES:
        try:
            p._conform(value, tp, "", meta)
            return value
        except p.ProtocolError:
            continue
    raise AssertionError(tp)


def _frames():
    for kinds in (p.REQUESTS, p.REPLIES):
        for op, cls in kinds.items():
            order = p._spec(cls)[1]
            for name, _, _, _ in order:
                for value in VALUES:  # this field gets a value of each kind, the others one they take
                    header: dict = {"op": op, "id": 3, "parts": []}
                    body = b""
                    for other, tp, meta, _ in order:
                        got = value if other == name else _valid(tp, meta)
                        if isinstance(got, bytes):
                            header["parts"].append([other, len(got)])
                            body += got
                        else:
                            header[other] = got
                    yield kinds, json.dumps(header).encode(), body


def test_a_frame_decodes_as_conforming_every_field_decodes_it(monkeypatch):
    frames = list(_frames())
    fast = [_outcome(head, body, kinds) for kinds, head, body in frames]
    with monkeypatch.context() as m:
        _slow(m)
        slow = [_outcome(head, body, kinds) for kinds, head, body in frames]
    assert fast == slow
    # The control: the frames hold both kinds, messages made and frames refused.
    assert sum(1 for o in fast if o[0] == "refused") > 100 and sum(1 for o in fast if o[0] != "refused") > 20


def test_real_messages_round_trip_with_their_types():
    exec_ = p.Exec(argv=["/bin/sh", "-c", "exec python3 tmp.py"], stdin=b"in", cwd="/home/agent/sf/1",
                   env={"HOME": "/home/agent", "PATH": "/usr/bin"}, timeout=10, limit=1 << 20, files=b"tar",
                   files_dest="/home/agent", warm=["", "python3", "tmp.py"])
    reset = p.Reset(env={"A": "b"}, profile=True, settle=True)
    for message in (exec_, reset, p.Ping()):
        ident, got = p.decode(*p.FrameReader().feed(p.encode(5, message))[0], p.REQUESTS)
        assert ident == 5 and got == message and type(got.timeout if hasattr(got, "timeout") else 0.0) is float
    # A header as json.dumps with those separators writes it.
    frame = p.encode(5, reset)
    head_len = int.from_bytes(frame[:4], "big")
    assert frame[8:8 + head_len] == json.dumps({"op": "reset", "id": 5, "env": {"A": "b"}, "profile": True,
                                                 "settle": True, "parts": []}, separators=(",", ":")).encode()


@pytest.mark.parametrize("value, why", [(True, "expected int"), ("1", "expected int"), (1.5, "expected int")])
def test_a_wrong_type_is_still_refused_with_its_field(value, why):
    frame = p.encode(1, p.Exec(argv=[], stdin=b"", cwd="/", env={}, timeout=1, limit=1))
    header = json.loads(frame[8:8 + int.from_bytes(frame[:4], "big")])
    header["limit"] = value
    with pytest.raises(p.ProtocolError, match=f"exec.limit: {why}"):
        p.decode(json.dumps(header).encode(), b"", p.REQUESTS)
    header["limit"] = 1  # the control: the same frame with an int is an Exec
    assert p.decode(json.dumps(header).encode(), b"", p.REQUESTS)[1].limit == 1
