"""Extraction on layouts unlike the dev templates: table portals, forums, blogs, footers.

Each page pairs a short article with a block a site template repeats on every page (a
stale forum post, a blog's self-introduction, a footer with a hotline and licence
numbers, a stock-quote disclaimer, a related-headline line). One page alone must give the
article wherever the page itself shows what is furniture; a host's pages together must
never be merged through the block they share, even where one page alone cannot tell.
All texts are written for these tests.
"""

from __future__ import annotations

from collections.abc import Callable

import opencc
import pytest

from neardup.boilerplate import is_boilerplate
from neardup.config import EngineConfig
from neardup.engine import Analysed, Engine, Outcome, analyse, for_decision
from neardup.extract import extract, strip_noise
from neardup.flow.analysed_wire import analysed_from_json, analysed_to_json
from neardup.normalise import normalise
from neardup.records import Decoded, Extracted, RawPage
from neardup.store import MemoryKV

# Short articles, one per page of a host; each is about one event.
ARTICLES = [
    "镇文化站本周六在河边广场举办露天电影放映，放映两部老电影，现场免费提供板凳和茶水，欢迎居民带孩子参加。",
    "县农技中心派出六名技术员进村指导春耕，重点讲解水稻育秧和病虫害防治，发放技术手册三百余份。",
    "社区卫生服务站下周一起延长服务时间，工作日晚上八点前均可就诊，并新增儿童疫苗预约窗口。",
    "市体育馆游泳池完成换水和设备检修，将于本月十五日重新开放，暑期学生凭证件可享受半价优惠。",
    "区图书馆分馆在老街口开门迎客，馆内藏书一万二千册，设有少儿阅读角和自习区，每天开放到晚上九点。",
    "城南菜市场改造完工，摊位由八十个增加到一百二十个，地面铺设防滑砖，并安装了公平秤和排风设备。",
]
TITLES = ["河边广场放映露天电影", "技术员进村指导春耕", "卫生服务站延长服务时间",
          "体育馆游泳池重新开放", "图书馆分馆开门迎客", "城南菜市场改造完工"]  # fmt: skip

# A stale post pinned above every thread, in prose that ends its sentences in "~~~".
STALE_POST = (
    "置顶：去年冬天论坛组织的登山活动圆满结束啦~~~感谢各位坛友的积极参与，活动当天一共来了四十多人~~~"
    "大家从山脚出发走了五个多小时，一路上互相照顾，没有一个人掉队~~~下山后在农家乐聚餐，"
    "老板还送了一锅自家熬的羊肉汤~~~照片已经上传到相册区，欢迎大家去留言~~~明年我们还会组织类似活动，"
    "请关注论坛公告~~~"
)
FORUM_RULES = [
    "本版版规：",
    "1. 禁止发布广告和与本版无关的内容",
    "2. 禁止人身攻击和发布不实信息",
    "3. 转载文章请注明出处",
]
# A blog's self-introduction in the sidebar, with Latin full stops.
SELF_INTRO = (
    "博主简介：我是一名在小城生活了三十年的普通教师. 平时喜欢记录身边的小事, 写写家乡的风土人情. "
    "这个博客开了十年, 写了八百多篇文章, 感谢每一位来访的朋友. 欢迎留言交流, 也欢迎转发分享. "
    "本博客所有文字均为原创, 如需转载请与我联系."
)
# A footer of a portal: a hotline, a licence and a registration number, cut by "|".
FOOTER = (
    "主办单位：某某县融媒体中心 | 违法和不良信息举报电话：0000-12345678 | 举报邮箱：jubao@example.cn | "
    "互联网新闻信息服务许可证编号：00000000000 | 某ICP备00000000号-1 | 某公网安备00000000000000号 | "
    "地址：某某县人民路一号 | 邮编：000000 | 本网站由某某县融媒体中心版权所有"
)
# A stock-quote disclaimer under every finance page, its clauses cut by "；".
DISCLAIMER = (
    "风险提示：本页面所载行情数据仅供参考，不构成任何投资建议；投资者据此操作，风险自担；"
    "股市有风险，投资需谨慎；本站力求数据准确，但对其准确性、完整性不作任何保证；"
    "如有疑问请联系客服热线，工作时间为每个交易日上午九点至下午五点；行情数据由第三方提供，可能存在延迟"
)
STALE_HEADLINE = "相关新闻：我县召开夏季防汛工作部署会议，要求各乡镇做好防汛物资储备工作"
COUNTERS = "发布时间：2024-05-01 10:20 浏览：1234 次 评论：56 条"


def decoded(html: str, url: str) -> Decoded:
    page = RawPage("p", url, "2024-05-01T00:00:00Z", "text/html; charset=utf-8", html)
    return Decoded(page, html, "utf-8", "header")


def table_portal(n: int) -> str:
    """An old table-layout portal: the stale related-headline block and the footer sit in
    cells beside the article's cell; nothing has a class name."""
    return (
        f"<html><head><title>{TITLES[n]}_某某县新闻网</title></head><body>"
        '<table width="960"><tr><td><a href="/">首页</a> <a href="/n">本地新闻</a> '
        '<a href="/t">通知公告</a></td></tr></table>'
        '<table width="960"><tr><td width="700" valign="top">'
        f'<table><tr><td align="center"><font size="5"><b>{TITLES[n]}</b></font></td></tr>'
        f"<tr><td>{COUNTERS}</td></tr>"
        f"<tr><td>{ARTICLES[n]}</td></tr></table></td>"
        f'<td width="260" valign="top">{STALE_HEADLINE}<br>{STALE_POST.replace("~~~", "。")}</td>'
        f'</tr></table><table width="960"><tr><td>{FOOTER}</td></tr></table></body></html>'
    )


def forum(n: int) -> str:
    """A forum thread: a stale pinned post above the thread, a rules list and a footer."""
    rules = "".join(f"<li>{r}</li>" for r in FORUM_RULES)
    return (
        f"<html><head><title>{TITLES[n]} - 本地生活 - 某某论坛</title></head><body>"
        '<div id="wp"><div class="z"><a href="/">论坛</a> › <a href="/f">本地生活</a></div>'
        f'<div class="pinned"><div class="t_f">{STALE_POST}</div></div>'
        f'<div id="postlist"><h1 class="ts">{TITLES[n]}</h1>'
        f'<div class="authi">楼主 发表于 2024-05-01 10:20 | 查看: 1234 | 回复: 56</div>'
        f'<div class="t_f">{ARTICLES[n]}</div></div>'
        f'<div class="rules"><ul>{rules}</ul></div>'
        '<div id="ft">Powered by Discuz! X3.4 | 联系我们 | 手机版 | 小黑屋 | 某ICP备00000000号</div>'
        "</div></body></html>"
    )


def blog(n: int) -> str:
    """A personal blog: the self-introduction comes first in the markup."""
    return (
        f"<html><head><title>{TITLES[n]}_小城故事_博客</title></head><body>"
        f'<div class="col"><div class="widget"><p>{SELF_INTRO}</p></div></div>'
        f'<div class="col2"><h2>{TITLES[n]}</h2><div class="meta">{COUNTERS}</div>'
        f"<p>{ARTICLES[n]}</p></div></body></html>"
    )


def footer_page(n: int) -> str:
    """A plain page whose footer is longer than its article."""
    return (
        f"<html><head><title>{TITLES[n]}</title></head><body>"
        f"<div><div><h3>{TITLES[n]}</h3></div><div>{ARTICLES[n]}</div></div>"
        f"<div><div>{FOOTER}</div></div></body></html>"
    )


def finance(n: int) -> str:
    """A quote page: the disclaimer is longer than the article beside it."""
    return (
        f"<html><head><title>{TITLES[n]}_财经频道</title></head><body>"
        f"<div><h1>{TITLES[n]}</h1><div><p>{ARTICLES[n]}</p></div></div>"
        f"<div><p>{DISCLAIMER}</p></div></body></html>"
    )


LAYOUTS: dict[str, Callable[[int], str]] = {
    "table_portal": table_portal,
    "forum": forum,
    "blog": blog,
    "footer": footer_page,
    "finance": finance,
}
FURNITURE = [STALE_POST[:20], "去年冬天论坛组织的登山活动", "博主简介", "举报电话", "ICP备",
             "许可证", "风险提示", "股市有风险", "相关新闻", "本版版规", "禁止人身攻击",
             "Powered by", "浏览：1234", "查看: 1234"]  # fmt: skip


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_page_gives_its_article_without_furniture(layout: str) -> None:
    for n in (0, 3):
        result = extract(decoded(LAYOUTS[layout](n), f"https://{layout}.example.cn/{n}.html"))
        assert isinstance(result, Extracted), result
        assert ARTICLES[n] in result.text, (layout, result.paragraphs)
        leaked = [f for f in FURNITURE if f in result.text]
        assert not leaked, (layout, leaked, result.paragraphs)


def test_decorative_heading_beside_a_short_article() -> None:
    """A 60-character article next to a heading framed by full-width punctuation."""
    text = "街道今天组织志愿者清理河道垃圾，共清出塑料袋和废弃物两百多公斤，河水明显变清。"
    html = (
        "<html><head><title>志愿者清理河道</title></head><body>"
        "<div><span>【 今日要闻 】</span></div>"
        f"<div><span>{text}</span></div>"
        '<div><a href="/1">首页</a> <a href="/2">下一页</a></div></body></html>'
    )
    result = extract(decoded(html, "https://brief.example.cn/1.html"))
    assert isinstance(result, Extracted), result
    assert result.paragraphs == (text,)


def test_one_line_article_with_ascii_punctuation() -> None:
    text = "Town hall: water supply resumes at 6 pm today, Zone B."  # under 60, ASCII only
    short = "今晚六点起恢复供水. 请居民提前储水! 详情见社区通知."  # 27 characters
    for line in (text, short):
        html = (
            "<html><head><title>通知</title></head><body>"
            '<div><a href="/">首页</a> | <a href="/n">通知</a></div>'
            f"<div>{line}</div></body></html>"
        )
        result = extract(decoded(html, "https://notice.example.cn/1.html"))
        assert isinstance(result, Extracted), (line, result)
        assert result.paragraphs == (line,)


def test_template_lines_beside_the_article_are_dropped() -> None:
    """Forum footers, a rules list, a stale headline line and a counters line in the same
    container as the article."""
    html = (
        "<html><head><title>河边广场放映露天电影</title></head><body><div class='post'>"
        f"<p>{COUNTERS}</p><p>{STALE_HEADLINE}</p><p>{ARTICLES[0]}</p>"
        + "".join(f"<p>{r}</p>" for r in FORUM_RULES)
        + "<p>回复 引用 举报 顶部</p></div></body></html>"
    )
    result = extract(decoded(html, "https://bbs.example.cn/1.html"))
    assert isinstance(result, Extracted), result
    assert result.paragraphs == (ARTICLES[0],)


CFG = EngineConfig(extract_timeout_s=0)


def _generic(n: int) -> str:
    """A layout whose one page cannot tell the stale block from the article: both are
    plain prose in plain <div>s, and the block comes first."""
    stale = STALE_POST.removeprefix("置顶：").replace("~~~", "；")
    return (
        f"<html><head><title>{TITLES[n]}</title></head><body>"
        f"<div><div>{stale}</div></div><div><div>{ARTICLES[n]}</div></div></body></html>"
    )


@pytest.mark.parametrize("layout", [*sorted(LAYOUTS), "generic"])
def test_a_hosts_pages_are_not_merged_through_their_shared_block(layout: str) -> None:
    """Six pages of one host, each with its own article and the same stale block: no two
    are merged, and the article is what is decided. Where one page cannot tell (the
    generic layout), the host's counts tell from the block's third page on; its first two
    pages are the shortfall that a host's first pages leave."""
    make = LAYOUTS.get(layout, _generic)
    first = 2 if layout == "generic" else 0
    eng = Engine(MemoryKV(), CFG)
    for n in range(len(ARTICLES)):
        raw = RawPage(
            f"{layout}-{n}",
            f"https://{layout}.example.cn/{n}.html",
            f"2024-05-01T00:0{n}:00Z",
            "text/html; charset=utf-8",
            make(n),
        )
        out = eng.process(raw)
        assert isinstance(out, Outcome), out
        if n >= first:
            assert out.decision["decision"] == "unique", (layout, n, out.decision)
            # the decided text is the article (the block is 200 characters or more)
            assert abs(out.decision["text_chars"] - len(ARTICLES[n])) <= 2, (layout, n)


def test_a_page_seen_again_keeps_its_decision_after_the_block_gave_way() -> None:
    """The decision reports the fingerprint of the text as extracted, so that the same
    page delivered again is recognised as the same content, not as a conflict."""
    eng = Engine(MemoryKV(), CFG)
    raws = [
        RawPage(f"g-{n}", f"https://g.example.cn/{n}.html", f"2024-05-01T00:0{n}:00Z",
                "text/html; charset=utf-8", _generic(n))
        for n in range(4)
    ]  # fmt: skip
    outs = [eng.process(r) for r in raws]
    again = eng.process(raws[3])
    assert isinstance(again, Outcome) and isinstance(outs[3], Outcome)
    assert again.repeated and not again.conflict
    assert again.decision == outs[3].decision


FURNITURE_LINES = [
    FOOTER,
    DISCLAIMER,
    SELF_INTRO,
    STALE_POST,
    STALE_HEADLINE,
    COUNTERS,
    *FORUM_RULES,
    "回复 引用 举报 顶部",
    "【 今日要闻 】",
    "学校简介：本校创办于上世纪五十年代，现有教学班三十个，在校学生一千余人。",
]
# Real sentences that merely mention a hotline, a licence, a rule or an introduction.
ARTICLE_LINES = [
    "市场监管部门公布了投诉举报电话，消费者遇到价格欺诈可以随时反映。",
    "简介显示，该公司成立于二〇〇一年，主营业务为农业机械制造。",
    "本院规则规定，当事人应当按时到庭，无正当理由拒不到庭的按撤诉处理。",
    "他在信中写道：股市有风险，但长期持有优质资产的回报依然可观。",
    "据介绍，新版许可证将于明年起在全省推行，申请人可在网上办理。",
]


@pytest.mark.parametrize("config", ["", "s2t", "s2hk", "s2tw"])
def test_furniture_lines_are_told_in_either_script(config: str) -> None:
    convert = opencc.OpenCC(config).convert if config else str
    missed = [x for x in FURNITURE_LINES if strip_noise([convert(x)])]
    assert missed == []
    wrong = [x for x in ARTICLE_LINES if not strip_noise([convert(x)])]
    assert wrong == []
    assert not any(is_boilerplate(convert(x)) for x in ARTICLE_LINES)


def test_the_text_the_template_stage_needs_travels_between_stages() -> None:
    """The Kafka worker's analyse stage and its template stage are apart: the main text,
    the runner-up block and their block keys go in the analysed message, and an older
    message without them still reads (the page then keeps its text as extracted)."""
    raw = RawPage("w", "https://w.example.cn/1.html", "2024-05-01T00:00:00Z",
                  "text/html; charset=utf-8", _generic(1))  # fmt: skip
    a = analyse(raw, CFG)
    assert isinstance(a, Analysed)
    assert a.alt_text == normalise(ARTICLES[1]) and a.text and any(a.line_keys) and any(a.alt_keys)
    obj = analysed_to_json(a)
    back = analysed_from_json(obj)
    assert (back.text, back.alt_text, back.line_keys, back.alt_keys, back.prose_keys) == (
        a.text, a.alt_text, a.line_keys, a.alt_keys, a.prose_keys,
    )  # fmt: skip
    old = {k: v for k, v in obj.items() if k not in ("text", "alt_text", "line_keys")}
    assert analysed_from_json(old).text == ""
    slim = for_decision(a)
    assert not (slim.text or slim.alt_text or slim.line_keys or slim.prose_keys)


def test_a_heading_that_repeats_the_title_is_not_the_article() -> None:
    """A blog puts the title in a <div> of its own and again as the first paragraph <div>,
    above a one-line article: the heading scores like prose but is no text, so it must
    not win (it would leave nothing once the title line is dropped: `no_text`)."""
    title = "Title of the work：长河落日"
    html = (
        f"<html><head><title>{title}</title></head><body>"
        f'<div id="article"><div class="t">{title}</div><div class="time">2024-05-01 阅读 12</div>'
        f'<div class="c"><div>{title}</div><div>Artist：Lin Studio</div></div></div>'
        "</body></html>"
    )
    result = extract(decoded(html, "https://blog.example.cn/1.html"))
    assert isinstance(result, Extracted), result
    assert result.paragraphs == ("Artist：Lin Studio",)
