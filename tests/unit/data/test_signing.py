"""Signed calls to the job's data server: only the key signs, a call is good once and for a minute, an answer
stands only for the call it answers (the servers that use them: tests/unit/data/test_flight_trust.py)."""

from __future__ import annotations

import json

import pytest

from shoal.data.signing import (
    WINDOW_SECONDS,
    Refused,
    RequestCheck,
    _mac,
    answer_mac,
    answered_with_key,
    signed_request,
    stream_key,
)

KEY = stream_key("the job's secret")
NOW = 1_700_000_000.0


def test_the_stream_key_is_the_secrets_own_and_not_the_secret():
    assert stream_key("the job's secret") == KEY and len(KEY) == 32
    assert stream_key("another secret") != KEY and b"the job's secret" not in KEY


def test_a_signed_call_is_answered_once_with_its_exact_fields():
    check = RequestCheck(KEY)
    wire, identity = signed_request(KEY, "rows", {"path": "/job/set", "start": 0, "stop": 40}, now=NOW)
    request, answered = check(wire, "rows", now=NOW + 1)
    assert (request["path"], request["start"], request["stop"], answered) == ("/job/set", 0, 40, identity)
    with pytest.raises(Refused, match="answered once already"):
        check(wire, "rows", now=NOW + 2)
    again, _ = signed_request(KEY, "rows", {"path": "/job/set", "start": 0, "stop": 40}, now=NOW)
    assert check(again, "rows", now=NOW + 2)[0]["nonce"] != request["nonce"]  # the same call signed anew


def test_an_altered_call_a_wrong_key_and_a_malformed_one_are_refused():
    check = RequestCheck(KEY)
    wire, _ = signed_request(KEY, "rows", {"path": "/job/set", "start": 0, "stop": 40}, now=NOW)
    for altered in (wire.replace(b'"stop":40', b'"stop":400'), wire.replace(b"/job/set", b"/job/sex"),
                    signed_request(stream_key("a guess"), "rows", {"path": "/job/set"}, now=NOW)[0], b"", b"x y"):
        with pytest.raises(Refused, match="not signed with this job's secret"):
            check(altered, "rows", now=NOW)
    with pytest.raises(Refused, match="signed for 'rows', not 'meta'"):
        check(wire, "meta", now=NOW)
    for body in (b"[]", b"{}", json.dumps({"method": "rows", "nonce": "ab", "time": NOW}).encode(),
                 b'{"method":"rows","nonce":"' + b"0" * 32 + b'","time":NaN}'):
        with pytest.raises(Refused, match="not a method, a nonce and a time"):
            check(_mac(KEY, b"request", body).hex().encode() + b" " + body, "rows", now=NOW)


def test_a_call_is_good_for_the_window_either_side_and_its_nonce_is_forgotten_after():
    check = RequestCheck(KEY)
    for offset in (-WINDOW_SECONDS - 1, WINDOW_SECONDS + 1):
        with pytest.raises(Refused, match=r"signed [-+]61 s from the data server's clock, beyond the 60 s"):
            check(signed_request(KEY, "meta", {}, now=NOW + offset)[0], "meta", now=NOW)
    for offset in (-WINDOW_SECONDS, WINDOW_SECONDS):
        check(signed_request(KEY, "meta", {}, now=NOW + offset)[0], "meta", now=NOW)
    assert len(check._seen) == 2
    check(signed_request(KEY, "meta", {}, now=NOW + 3 * WINDOW_SECONDS)[0], "meta", now=NOW + 3 * WINDOW_SECONDS)
    assert len(check._seen) == 1  # the memory of nonces holds one window's calls, not the job's


def test_an_answer_stands_only_for_its_own_call_and_content():
    _, first = signed_request(KEY, "meta", {"path": "/job/set"})
    _, second = signed_request(KEY, "meta", {"path": "/job/set"})
    mac = answer_mac(KEY, first, b"meta.json's content")
    assert answered_with_key(KEY, first, mac, b"meta.json's content")
    assert not answered_with_key(KEY, second, mac, b"meta.json's content")
    assert not answered_with_key(KEY, first, mac, b"meta.json's content!")
    assert not answered_with_key(KEY, first, mac, b"meta.json's", b" content")  # parts are length-prefixed
    assert not answered_with_key(stream_key("a guess"), first, mac, b"meta.json's content")
