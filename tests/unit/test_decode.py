"""Charset decoding: each layer wins when it should, mislabels are caught, nothing raises."""

from __future__ import annotations

import codecs
import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.charset import codec_for, meta_charset, prose_share, reads_as_chinese
from neardup.decode import bad_share, decode, not_html
from neardup.records import Decoded, RawPage, Reason, Rejected

# Sentences written for these tests; simplified for GB, traditional for Big5.
SIMPLIFIED = (
    "今天上午，市政府召开新闻发布会，介绍了今年城市交通建设的最新进展。"
    "据介绍，新建的地铁线路预计将在明年年底前全部通车，沿线居民出行将更加方便。"
    "记者在现场看到，工人们正在紧张有序地进行施工，各项安全措施落实到位。"
)
TRADITIONAL = (
    "今天上午，市政府召開新聞發布會，介紹了今年城市交通建設的最新進展。"
    "據介紹，新建的地鐵線路預計將在明年年底前全部通車，沿線居民出行將更加方便。"
    "記者在現場看到，工人們正在緊張有序地進行施工，各項安全措施落實到位。"
)


def html(text: str = SIMPLIFIED, meta: str | None = None) -> str:
    head = f'<meta charset="{meta}">' if meta else ""
    return f"<html><head>{head}<title>城市交通</title></head><body><p>{text}</p></body></html>"


def page(body: bytes | str, content_type: str = "text/html") -> RawPage:
    return RawPage("p1", "https://example.cn/a", "2024-01-01T00:00:00Z", content_type, body)


def decoded(result: Decoded | Rejected, layer: str, charset: str | None = None) -> Decoded:
    assert isinstance(result, Decoded), result
    assert result.layer == layer, (result.layer, result.charset)
    if charset is not None:
        assert result.charset == charset
    return result


# --- each layer wins when it should -----------------------------------------------------


def test_text_body_is_taken_as_is() -> None:
    result = decoded(decode(page(html())), "text")
    assert result.html == html()


def test_text_body_lone_surrogates_replaced() -> None:
    result = decoded(decode(page(html() + "\ud800")), "text")
    assert result.html == html() + "\ufffd"  # the page kept, the surrogate replaced


def test_header_wins() -> None:
    result = decoded(decode(page(html().encode("gbk"), "text/html; charset=GBK")), "header")
    assert result.charset == "gb18030" and result.html == html()


def test_header_big5_decoded_as_hkscs() -> None:
    body = html(TRADITIONAL).encode("big5")
    result = decoded(decode(page(body, 'text/html; charset="big5"')), "header", "big5hkscs")
    assert result.html == html(TRADITIONAL)


def test_header_big5_with_eten_kana_falls_back_to_cp950() -> None:
    # Taiwanese Big5 pages may hold kana from the ETEN extension, which HKSCS lacks.
    text = html(TRADITIONAL + "校長に忠告")
    body = text.encode("cp950")
    result = decoded(decode(page(body, "text/html; charset=big5")), "header", "cp950")
    assert result.html == text


@pytest.mark.parametrize(
    ("bom", "codec"),
    [(b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be")],
)
def test_bom_wins_even_over_a_header(bom: bytes, codec: str) -> None:
    body = bom + html().encode(codec)
    result = decoded(decode(page(body, "text/html; charset=gbk")), "bom", codec)
    assert result.html == html()


@pytest.mark.parametrize(
    "declaration",
    [
        '<meta charset="gbk">',
        "<meta charset=gb2312>",
        '<meta http-equiv="Content-Type" content="text/html; charset=gb2312">',
        "<META CONTENT='text/html;charset=GBK' HTTP-EQUIV='content-type'>",
        '<?xml version="1.0" encoding="gbk"?>',
    ],
)
def test_meta_wins_without_header(declaration: str) -> None:
    text = f"<html><head>{declaration}</head><body>{SIMPLIFIED}</body></html>"
    result = decoded(decode(page(text.encode("gbk"))), "meta", "gb18030")
    assert result.html == text


def test_meta_beyond_4k_is_not_seen() -> None:
    text = "<html><head>" + " " * 5000 + f'<meta charset="gbk"></head><body>{SIMPLIFIED}</body>'
    assert decoded(decode(page(text.encode("gbk"))), "detector").html == text


def test_header_and_meta_disagree_header_first() -> None:
    body = html(meta="big5").encode("gbk")
    decoded(decode(page(body, "text/html; charset=gbk")), "header", "gb18030")


def test_header_and_meta_disagree_wrong_header_then_meta() -> None:
    body = html(meta="gbk").encode("gbk")
    result = decoded(decode(page(body, "text/html; charset=utf-8")), "meta", "gb18030")
    assert result.html == html(meta="gbk")


def test_utf8_wins_without_labels() -> None:
    assert decoded(decode(page(html().encode("utf-8"))), "utf8", "utf-8").html == html()


def test_utf8_labelled_gbk_is_read_as_utf8() -> None:
    result = decoded(decode(page(html().encode(), "text/html; charset=gbk")), "utf8")
    assert result.html == html()


@pytest.mark.parametrize(
    ("text", "codec", "expected"),
    [(SIMPLIFIED, "gbk", "gb18030"), (TRADITIONAL, "big5", "big5hkscs")],
)
def test_detector_finds_chinese_without_labels(text: str, codec: str, expected: str) -> None:
    result = decoded(decode(page(html(text).encode(codec))), "detector", expected)
    assert result.html == html(text)


def test_detector_finds_cyrillic() -> None:
    text = (
        "<html><body><p>Сегодня утром в городе прошла пресс-конференция, на которой "
        "рассказали о строительстве новых линий метро. Жители района ждут открытия "
        "станций уже несколько лет.</p></body></html>"
    )
    assert decoded(decode(page(text.encode("cp1251"))), "detector").html == text


def test_replace_when_nothing_fits() -> None:
    # A UTF-8 page with a GBK fragment pasted in: neither charset reads it all.
    body = html(SIMPLIFIED * 5).encode("utf-8") + "<p>城市交通建设</p>".encode("gbk")
    result = decoded(decode(page(body)), "replace", "utf-8")
    assert SIMPLIFIED in result.html and "\ufffd" in result.html


# --- mislabels --------------------------------------------------------------------------


def test_gbk_labelled_utf8() -> None:
    result = decoded(decode(page(html().encode("gbk"), "text/html; charset=utf-8")), "detector")
    assert result.charset == "gb18030" and result.html == html()


def test_gbk_labelled_utf8_mostly_ascii() -> None:
    # A few Chinese characters among kilobytes of ASCII still fail as UTF-8.
    text = "<html><head><script>" + "var x = 1;\n" * 2000 + "</script></head><body>城市交通</body>"
    result = decode(page(text.encode("gbk"), "text/html; charset=utf-8"))
    assert isinstance(result, Decoded) and result.layer != "header"
    assert "\ufffd" not in result.html


def test_big5_labelled_gb2312_in_header_and_meta() -> None:
    # Big5 bytes decode as GB18030 without a single error, into nonsense.
    body = html(TRADITIONAL, meta="gb2312").encode("big5")
    result = decoded(decode(page(body, "text/html; charset=gb2312")), "detector", "big5hkscs")
    assert result.html == html(TRADITIONAL, meta="gb2312")


def test_gbk_labelled_big5_no_meta() -> None:
    body = html(SIMPLIFIED).encode("gbk")
    result = decoded(decode(page(body, "text/html; charset=big5")), "detector", "gb18030")
    assert result.html == html(SIMPLIFIED)


def test_gbk_labelled_latin1_is_read_as_chinese() -> None:
    body = html().encode("gbk")
    result = decoded(decode(page(body, "text/html; charset=ISO-8859-1")), "detector")
    assert result.html == html()


def test_latin1_label_believed_for_western_text() -> None:
    text = "<p>Le café de la gare a rouvert; les habitués retrouvent leur crème brûlée.</p>"
    result = decoded(
        decode(page(text.encode("latin-1"), "text/html; charset=iso-8859-1")), "header", "cp1252"
    )
    assert result.html == text


def test_truncated_multibyte_tail_tolerated() -> None:
    body = html().encode("utf-8")[:-30]  # cuts a character in half
    cut = body[: len(body) - 1]
    result = decoded(decode(page(cut, "text/html; charset=utf-8")), "header")
    assert result.html.endswith("\ufffd")
    truncated_gbk = html().encode("gbk")[:101]
    decoded(decode(page(truncated_gbk, "text/html; charset=gbk")), "header", "gb18030")


def test_a_few_bad_bytes_tolerated_many_not() -> None:
    good = html(SIMPLIFIED * 40).encode("utf-8")
    at = good.index(b"<p>")  # between characters
    few = good[:at] + b"\xff" + good[at:]
    result = decoded(decode(page(few, "text/html; charset=utf-8")), "header")
    assert result.html.count("\ufffd") == 1
    many = b"\xff".join(good[i : i + 100] for i in range(0, len(good), 100))
    assert getattr(decode(page(many, "text/html; charset=utf-8")), "layer", None) != "header"


@pytest.mark.parametrize("label", ["x-foobar", "rot13", "base64", "unicode_escape", "hz", "zlib"])
def test_unknown_or_unsafe_labels_fall_through(label: str) -> None:
    body = html().encode("utf-8")
    assert codec_for(label) is None
    decoded(decode(page(body, f"text/html; charset={label}")), "utf8")
    assert decoded(decode(page(html(meta=label).encode())), "utf8").html == html(meta=label)


@pytest.mark.parametrize(
    ("label", "codec"),
    [
        ("GBK", "gb18030"),
        ("gb2312", "gb18030"),
        ("GB_2312-80", "gb18030"),
        ("x-gbk", "gb18030"),
        ("cp936", "gb18030"),
        ("big5", "big5hkscs"),
        ("Big5-HKSCS", "big5hkscs"),
        ("x-x-big5", "big5hkscs"),
        ("UTF8", "utf-8"),
        ("latin-1", "cp1252"),
        ("shift_jis", "cp932"),
    ],
)
def test_codec_for(label: str, codec: str) -> None:
    assert codec_for(label) == codec


def test_meta_utf16_means_utf8() -> None:
    assert meta_charset(b'<meta charset="utf-16">') == "utf-8"


def test_reads_as_chinese() -> None:
    assert reads_as_chinese(html(SIMPLIFIED))
    assert reads_as_chinese(html(TRADITIONAL))
    assert not reads_as_chinese(html(TRADITIONAL).encode("big5").decode("gb18030"))
    assert not reads_as_chinese(html(SIMPLIFIED).encode("utf-8").decode("gb18030", "replace"))


# --- labels that agree, navigation of rare characters -----------------------------------

# Navigation bars written for these tests: kana, Cyrillic and rare or dialect characters,
# so that the first few hundred non-ASCII characters of the page are not common Chinese.
RARE_NAV_GB = ["ニュース", "スポーツ", "Новости", "Спорт", "㐀㐁㐂", "鑫淼焱垚", "犇骉麤", "ゲーム"]
RARE_NAV_BIG5 = ["嘅啲咗冇", "睇佢哋", "ニュース", "Новости", "乜嘢", "喺度", "嚟緊", "㗎"]
SHORT_SIMPLIFIED = "今天上午，市政府召开新闻发布会，介绍了今年城市交通建设的最新进展。"
SHORT_TRADITIONAL = "今天上午，市政府召開新聞發布會，介紹了今年城市交通建設的最新進展。"


def nav_page(nav: list[str], text: str, label: str, repeat: int = 4) -> str:
    links = "".join(f'<li><a href="/c/{i}">{item}</a></li>' for i, item in enumerate(nav * repeat))
    return (
        f'<html><head><meta http-equiv="Content-Type" content="text/html; charset={label}">'
        f"<title>t</title></head><body><ul>{links}</ul><p>{text}</p></body></html>"
    )


@pytest.mark.parametrize("label", ["gb18030", "gbk", "gb2312"])
def test_agreed_gb_label_beats_a_navigation_of_rare_characters(label: str) -> None:
    text = nav_page(RARE_NAV_GB, SHORT_SIMPLIFIED, label)
    body = text.encode("gb18030")
    assert not reads_as_chinese(body.decode("gb18030"))  # the sample alone is fooled
    result = decoded(decode(page(body, f"text/html; charset={label}")), "header", "gb18030")
    assert result.html == text


@pytest.mark.parametrize("label", ["big5", "big5-hkscs"])
def test_agreed_big5_label_beats_a_navigation_of_rare_characters(label: str) -> None:
    text = nav_page(RARE_NAV_BIG5, SHORT_TRADITIONAL, label)
    body = text.encode("big5hkscs")
    result = decoded(decode(page(body, f"text/html; charset={label}")), "header", "big5hkscs")
    assert result.html == text


def test_agreed_labels_with_a_long_rare_navigation_and_a_short_article() -> None:
    text = nav_page(RARE_NAV_GB, SHORT_SIMPLIFIED[:20], "gbk", repeat=12)
    result = decoded(decode(page(text.encode("gb18030"), "text/html; charset=gbk")), "header")
    assert result.html == text


def test_agreed_gb_labels_on_big5_bytes_with_rare_navigation_still_caught() -> None:
    # Byte for byte valid GB18030: only the prose, read in both families, tells.
    text = nav_page(RARE_NAV_BIG5, SHORT_TRADITIONAL * 2, "gb2312")
    body = text.encode("big5hkscs")
    result = decoded(decode(page(body, "text/html; charset=gb2312")), "detector", "big5hkscs")
    assert result.html == text


def test_agreed_gbk_labels_on_a_utf8_body_give_way_to_utf8() -> None:
    text = nav_page(RARE_NAV_GB, SHORT_SIMPLIFIED * 3, "gbk")
    result = decoded(decode(page(text.encode("utf-8"), "text/html; charset=gbk")), "utf8")
    assert result.html == text


def test_one_label_alone_is_not_trusted_beyond_the_sample() -> None:
    # Header GBK, meta Big5: no agreement, so the header is judged by its sample as
    # before, and the detector, reading the prose, finds the charset all the same.
    text = nav_page(RARE_NAV_GB, SHORT_SIMPLIFIED, "big5")
    result = decoded(decode(page(text.encode("gb18030"), "text/html; charset=gbk")), "detector")
    assert result.charset == "gb18030" and result.html == text


@pytest.mark.parametrize(
    ("nav", "text", "codec"),
    [(RARE_NAV_GB, SHORT_SIMPLIFIED, "gb18030"), (RARE_NAV_BIG5, SHORT_TRADITIONAL, "big5hkscs")],
    ids=["gb18030", "big5hkscs"],
)
def test_unlabelled_page_with_rare_navigation_is_read_by_its_prose(
    nav: list[str], text: str, codec: str
) -> None:
    html_text = nav_page(nav, text, "x").replace(
        '<meta http-equiv="Content-Type" content="text/html; charset=x">', ""
    )
    result = decoded(decode(page(html_text.encode(codec))), "detector", codec)
    assert result.html == html_text


def test_prose_share() -> None:
    assert prose_share("") == 1.0
    assert prose_share(nav_page(RARE_NAV_GB, SHORT_SIMPLIFIED, "gbk")) == 1.0
    wrong = nav_page(RARE_NAV_BIG5, SHORT_TRADITIONAL, "x").encode("big5hkscs").decode("gb18030")
    assert prose_share(wrong) < 0.6


# --- not HTML, not text ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", "PDF"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "PNG"),
        (b"GIF89a\x01\x00", "GIF"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "JPEG"),
        (b"PK\x03\x04\x14\x00", "ZIP"),
        (gzip.compress(html().encode()), "gzip"),
    ],
)
def test_magic_numbers_are_not_html(body: bytes, what: str) -> None:
    result = decode(page(body, "text/html; charset=utf-8"))
    assert isinstance(result, Rejected) and result.reason is Reason.NOT_HTML
    assert what in result.detail
    assert result.page_id == "p1" and result.url == "https://example.cn/a"


@pytest.mark.parametrize(
    "content_type", ["application/pdf", "image/png", "video/mp4", "application/json; charset=x"]
)
def test_non_text_content_types_are_not_html(content_type: str) -> None:
    result = decode(page(html().encode(), content_type))
    assert isinstance(result, Rejected) and result.reason is Reason.NOT_HTML


@pytest.mark.parametrize(
    "content_type",
    ["", "text/plain", "application/xhtml+xml", "application/octet-stream", "garbage"],
)
def test_html_ish_content_types_are_decoded(content_type: str) -> None:
    assert isinstance(decode(page(html().encode(), content_type)), Decoded)
    assert not_html(content_type, html().encode()) is None


def test_binary_junk_is_a_decode_rejection() -> None:
    junk = bytes(range(0, 32)) * 100
    result = decode(page(junk, "text/html; charset=utf-8"))
    assert isinstance(result, Rejected) and result.reason is Reason.DECODE


def test_text_full_of_replacement_characters_is_rejected() -> None:
    result = decode(page("<p>" + "\ufffd" * 100 + "</p>"))
    assert isinstance(result, Rejected) and result.reason is Reason.DECODE


def test_bad_share() -> None:
    assert bad_share("") == 0.0
    assert bad_share("abc\n\t\r") == 0.0
    assert bad_share("\ufffd" * 10) == pytest.approx(1.0)
    assert bad_share("\x00" * 80) == pytest.approx(1.0)


# --- nothing raises -------------------------------------------------------------------

CHARSETS = ["utf-8", "gbk", "gb2312", "big5", "latin-1", "utf-16", "x-nonsense", "rot13", ""]
content_types = st.one_of(
    st.text(max_size=40),
    st.sampled_from(CHARSETS).map(lambda c: f"text/html; charset={c}"),
)
prefixes = st.sampled_from(
    [
        b"",
        b"\xef\xbb\xbf",
        b"\xff\xfe",
        b"\xfe\xff",
        b"%PDF",
        b'<meta charset="big5">',
        b"<meta charset=gbk>",
        html(TRADITIONAL).encode("big5")[:50],
    ]
)


@settings(max_examples=300, deadline=None)
@given(prefix=prefixes, body=st.binary(max_size=400), content_type=content_types)
def test_decode_never_raises_on_bytes(prefix: bytes, body: bytes, content_type: str) -> None:
    result = decode(page(prefix + body, content_type))
    assert isinstance(result, Decoded | Rejected)
    if isinstance(result, Decoded):
        result.html.encode("utf-8")  # always valid text
        # a codec, or two for a body of mixed UTF-8 and GB or Big5 runs ("utf-8+gb18030")
        assert all(codecs.lookup(part) for part in result.charset.split("+"))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200), content_type=content_types)
def test_decode_never_raises_on_text(text: str, content_type: str) -> None:
    assert isinstance(decode(page(text, content_type)), Decoded | Rejected)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=SIMPLIFIED + TRADITIONAL + "<p>abc ", min_size=1, max_size=300))
def test_utf8_round_trips(text: str) -> None:
    result = decode(page(text.encode("utf-8"), "text/html; charset=utf-8"))
    assert isinstance(result, Decoded) and result.html == text
