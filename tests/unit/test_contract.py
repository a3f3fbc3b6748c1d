"""The message contract: schemas, page ids and every way a raw message is rejected."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from neardup.contract import (
    SCHEMA_FILES,
    derive_page_id,
    load_schema,
    max_line_bytes,
    parse_raw,
    schema_dir,
    validate,
)
from neardup.records import RawPage, Reason, Rejected

URL = "https://news.example.cn/2024/0101/a1.html"
HTML = "<html><head><title>新闻</title></head><body><p>今天天气很好。</p></body></html>"
LIMIT = 10_000


def message(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "url": URL,
        "fetched_at": "2024-01-01T08:00:00Z",
        "content_type": "text/html; charset=utf-8",
        "html": HTML,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def line(**fields: Any) -> bytes:
    return json.dumps(message(**fields), ensure_ascii=False).encode("utf-8")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def rejected(result: RawPage | Rejected, reason: Reason) -> Rejected:
    assert isinstance(result, Rejected), result
    assert result.reason is reason, result
    assert validate("rejected", result.to_json()) == []
    return result


# --- page ids -------------------------------------------------------------------------


def test_page_id_is_pinned() -> None:
    # Stored indexes and dead letters refer to pages by this id: it must never change.
    assert derive_page_id(URL) == "7bf7e1824fac9121"
    assert len(derive_page_id("")) == 16


def test_page_id_derived_when_absent_and_kept_when_given() -> None:
    page = parse_raw(line(), LIMIT)
    assert isinstance(page, RawPage)
    assert page.page_id == derive_page_id(URL)
    page = parse_raw(line(page_id="site-42"), LIMIT)
    assert isinstance(page, RawPage)
    assert page.page_id == "site-42"


# --- accepted messages ----------------------------------------------------------------


def test_html_message() -> None:
    page = parse_raw(line(site="example.cn"), LIMIT)
    assert page == RawPage(
        page_id=derive_page_id(URL),
        url=URL,
        fetched_at="2024-01-01T08:00:00Z",
        content_type="text/html; charset=utf-8",
        body=HTML,
        site="example.cn",
    )


def test_body_b64_message_gives_exact_bytes() -> None:
    raw = HTML.encode("gb18030")
    page = parse_raw(line(html=None, body_b64=b64(raw)), LIMIT)
    assert isinstance(page, RawPage)
    assert page.body == raw


def test_str_line_and_unknown_fields_accepted() -> None:
    text = json.dumps(message(crawler="heritrix", depth=3, headers={"x": "y"}))
    assert isinstance(parse_raw(text, LIMIT), RawPage)


def test_body_exactly_at_limit_accepted() -> None:
    raw = b"x" * LIMIT
    assert isinstance(parse_raw(line(html=None, body_b64=b64(raw)), LIMIT), RawPage)
    assert isinstance(parse_raw(line(html="x" * LIMIT), LIMIT), RawPage)


# --- rejections -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [b'{"url": "x"', b"not json", b"", b"[1, 2,]", b'{"a": NaN}', b"[" * 100_000],
)
def test_bad_json(bad: bytes) -> None:
    rejected(parse_raw(bad, 10 * 100_000), Reason.BAD_JSON)


def test_bad_json_detail_has_position_and_url_is_recovered() -> None:
    truncated = line()[:-20]
    result = rejected(parse_raw(truncated, LIMIT), Reason.BAD_JSON)
    assert "column" in result.detail and "char" in result.detail
    assert result.url == URL
    assert result.page_id == derive_page_id(URL)


def test_non_utf8_line_is_bad_json() -> None:
    result = rejected(
        parse_raw(line().replace("新闻".encode(), "新闻".encode("gbk")), LIMIT), Reason.BAD_JSON
    )
    assert "UTF-8" in result.detail


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"url": None}, "'url'"),
        ({"url": ""}, "$.url"),
        ({"url": 42}, "$.url"),
        ({"fetched_at": "yesterday"}, "$.fetched_at"),
        ({"fetched_at": "2024-02-30T00:00:00Z"}, "$.fetched_at"),
        ({"fetched_at": "2024-01-01 08:00:00"}, "$.fetched_at"),
        ({"content_type": None}, "'content_type'"),
        ({"html": None}, "exactly one of"),
        ({"body_b64": "eA=="}, "exactly one of"),
        ({"html": ["<p>"]}, "$.html"),
        ({"page_id": ""}, "$.page_id"),
        ({"page_id": "p" * 257}, "$.page_id"),
        ({"site": 7}, "$.site"),
    ],
)
def test_schema(fields: dict[str, Any], where: str) -> None:
    result = rejected(parse_raw(line(**fields), LIMIT), Reason.SCHEMA)
    assert where in result.detail
    if isinstance(fields.get("url", URL), str) and fields.get("url", URL):
        assert result.url == URL  # kept whenever it could be read
        assert result.page_id is not None


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None])
def test_schema_non_object(value: object) -> None:
    result = rejected(parse_raw(json.dumps(value), LIMIT), Reason.SCHEMA)
    assert result.url is None and result.page_id is None


def test_schema_detail_never_quotes_a_whole_page() -> None:
    result = rejected(parse_raw(line(html={"p": "字" * 5000}), 100_000), Reason.SCHEMA)
    assert len(result.detail) <= 300


@pytest.mark.parametrize("encoded", ["e A==", "eA=", "eA", "中文", "eA==\n", "****"])
def test_bad_base64(encoded: str) -> None:
    result = rejected(
        parse_raw(line(html=None, body_b64=encoded, page_id="p1"), LIMIT), Reason.BAD_BASE64
    )
    assert result.page_id == "p1" and result.url == URL


def test_too_large_line_before_parsing() -> None:
    huge = line(html="x" * (max_line_bytes(LIMIT) + 1))
    result = rejected(parse_raw(huge, LIMIT), Reason.TOO_LARGE)
    assert result.url == URL  # recovered from the head of the line


def test_too_large_body_b64() -> None:
    result = rejected(
        parse_raw(line(html=None, body_b64=b64(b"x" * (LIMIT + 1))), LIMIT), Reason.TOO_LARGE
    )
    assert result.url == URL


def test_too_large_html_counts_utf8_bytes() -> None:
    # 4,000 characters but 12,000 UTF-8 bytes.
    rejected(parse_raw(line(html="字" * 4000), LIMIT), Reason.TOO_LARGE)
    assert isinstance(parse_raw(line(html="字" * 3000), LIMIT), RawPage)


@given(st.binary(max_size=300))
def test_parse_raw_never_raises_on_bytes(data: bytes) -> None:
    assert isinstance(parse_raw(data, LIMIT), RawPage | Rejected)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_parse_raw_never_raises_on_json(value: object) -> None:
    assert isinstance(parse_raw(json.dumps(value), LIMIT), RawPage | Rejected)


@given(
    st.dictionaries(
        st.sampled_from(
            ["url", "fetched_at", "content_type", "html", "body_b64", "page_id", "site"]
        ),
        st.text(max_size=30) | st.none() | st.integers(),
    )
)
def test_parse_raw_never_raises_on_near_misses(fields: dict[str, object]) -> None:
    assert isinstance(parse_raw(json.dumps(fields), LIMIT), RawPage | Rejected)


# --- the schema files -----------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SCHEMA_FILES))
def test_schema_file_is_a_valid_documented_schema(kind: str) -> None:
    schema = load_schema(kind)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    for key in ("$id", "title", "description", "examples"):
        assert schema[key], key
    for name, prop in schema["properties"].items():
        assert prop.get("description"), f"{kind}.{name} has no description"


@pytest.mark.parametrize("kind", sorted(SCHEMA_FILES))
def test_schema_examples_validate(kind: str) -> None:
    for example in load_schema(kind)["examples"]:
        assert validate(kind, example) == []


def test_raw_examples_parse() -> None:
    for example in load_schema("raw")["examples"]:
        assert isinstance(parse_raw(json.dumps(example, ensure_ascii=False), LIMIT), RawPage)


def test_schemas_found_in_repo_or_package() -> None:
    names = {p.name for p in schema_dir().iterdir()}
    assert set(SCHEMA_FILES.values()) <= names


def test_rejected_reasons_match_records() -> None:
    enum = load_schema("rejected")["properties"]["reason"]["enum"]
    assert sorted(enum) == sorted(r.value for r in Reason)


@pytest.mark.parametrize("reason", list(Reason))
def test_every_rejected_record_validates(reason: Reason) -> None:
    assert validate("rejected", Rejected(reason, "why", "p", URL).to_json()) == []
    assert validate("rejected", Rejected(reason, "why").to_json()) == []


def decision(**fields: Any) -> dict[str, Any]:
    base = dict(load_schema("decision")["examples"][1])
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"decision": "unique"}, "$.duplicate_of"),
        ({"decision": "maybe"}, "$.decision"),
        ({"duplicate_of": None}, "$.duplicate_of"),
        ({"duplicate_of_url": None}, "$.duplicate_of_url"),
        ({"duplicate_of_url": ""}, "$.duplicate_of_url"),
        (
            {"decision": "unique", "duplicate_of": None, "distance": None, "similarity": None},
            "$.duplicate_of_url",
        ),
        ({"distance": None}, "$.distance"),
        ({"distance": 65}, "$.distance"),
        ({"distance": 2.5}, "$.distance"),
        ({"similarity": 1.5}, "$.similarity"),
        ({"fingerprint": "9F86D081884C7D61"}, "$.fingerprint"),
        ({"fingerprint": "9f86d081884c7d6"}, "$.fingerprint"),
        ({"text_chars": -1}, "$.text_chars"),
        ({"decided_at": "soon"}, "$.decided_at"),
        ({"engine": {"version": "0.1.0"}}, "'params'"),
        ({"engine": {"version": "0.1.0", "params": "", "x": 1}}, "'x'"),
        ({"extra": 1}, "'extra'"),
    ],
)
def test_decision_schema_rejects(fields: dict[str, Any], where: str) -> None:
    errors = validate("decision", decision(**fields))
    assert errors and any(where in e for e in errors), errors


def test_decision_unique_has_nulls() -> None:
    unique = decision(
        decision="unique", duplicate_of=None, duplicate_of_url=None, distance=None, similarity=None
    )
    assert validate("decision", unique) == []
    assert validate("decision", decision(decision="contained")) == []


# Each schema's fields, by the schema's $id. A consumer that validates with a schema
# refuses fields it does not know (additionalProperties is false), so a change to the
# fields is a new version: a new $id, pinned here beside the old one's fields.
SCHEMA_FIELDS = {
    "urn:neardup:schema:decision:v2": (
        "page_id url decision duplicate_of duplicate_of_url cluster_id distance similarity "
        "fingerprint title text_chars charset decided_at engine"
    ),
    "urn:neardup:schema:cluster-merge:v1": "from_cluster into_cluster page_id at",
    "urn:neardup:schema:rejected-page:v1": "page_id url reason detail at",
    "urn:neardup:schema:raw-page:v1": "url fetched_at content_type html body_b64 page_id site",
}


@pytest.mark.parametrize("kind", sorted(SCHEMA_FILES))
def test_schema_fields_change_only_with_the_version(kind: str) -> None:
    schema = load_schema(kind)
    assert schema["$id"] in SCHEMA_FIELDS, f"{kind}: pin the fields of {schema['$id']}"
    assert sorted(schema["properties"]) == sorted(SCHEMA_FIELDS[schema["$id"]].split())


def test_merge_and_rejected_schemas_reject_extras_and_gaps() -> None:
    merge = dict(load_schema("merge")["examples"][0])
    assert validate("merge", merge) == []
    assert validate("merge", {**merge, "why": "x"})
    del merge["at"]
    assert validate("merge", merge)
    assert validate("rejected", {**Rejected(Reason.SCHEMA, "d").to_json(), "reason": "nope"})


def test_validate_unknown_kind_is_a_bug() -> None:
    with pytest.raises(ValueError, match="unknown schema kind"):
        validate("page", {})
