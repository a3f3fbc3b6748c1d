"""The noise filter: lines that reprinting sites and site templates add to an article.

``strip_noise`` runs over every extractor's lines: it drops editor, source and copyright
lines, share widgets, related-link lists, and lines that read as site furniture
(``neardup.boilerplate``); ``is_noise`` is the per-line test, which the density
extractor also asks of each paragraph it scores.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from neardup.boilerplate import is_boilerplate
from neardup.traditional import rx as _rx

# Every pattern below matches both scripts (``neardup.traditional``).


# One row per kind of line that reprinting sites add: (longest line it may drop,
# pattern). The length cap is what keeps the filter conservative: a real sentence that
# merely mentions 来源 or 转载 is long and survives. Rows in _NOISE_AT_START must match
# at the start of the line; rows in _NOISE_ANYWHERE may match anywhere in it.
_OPEN = r"[【\[（(]?\s*"  # an optional opening bracket: "【责任编辑：张三】"
_LABELS = (
    r"责任编辑|编辑|责编|实习编辑|值班编辑|主编|编审|审校|校对|审核|监制|"
    r"来源|本文来源|文章来源|稿件来源|新闻来源|消息来源|信息来源|图片来源|图源|资料来源|"
    r"原标题|本文原标题|原题|作者|出品|策划|排版|制图|设计|标签|关键词|关键字"
)
_NOISE_AT_START: Final[tuple[tuple[int, re.Pattern[str]], ...]] = (
    # Editor/source/author bylines: "责任编辑：张三", "来源：新华社", "原标题：……".
    (60, _rx(rf"{_OPEN}(?:{_LABELS})\s*[：:]")),
    # The same labels in brackets with a space instead of a colon: "（编辑 张三）".
    (40, _rx(rf"[【\[（(]\s*(?:{_LABELS})\s*[^】\]）)]{{0,30}}[】\]）)]$")),
    # "（原题为《……》）": the pre-edit headline, a title, not text.
    (100, _rx(rf"{_OPEN}(?:本文)?原(?:标)?题(?:为|是)?\s*[：:《“]")),
    # A date line carrying the source: "2019-08-28 09:20 来源：红周刊 作者：李四".
    (80, _rx(r"\d{4}[-年/.]\d{1,2}[-月/.]\d{1,2}.{0,24}(?:来源|作者|编辑)\s*[：:]")),
    # Provenance: "本文为某某原创", "（本文系……独家稿件）", "（本文来自澎湃新闻）".
    (100, _rx(rf"{_OPEN}本文(?:为|系|是|由)[^。]{{0,40}}(?:原创|独家|授权|稿件|首发)")),
    (100, _rx(rf"{_OPEN}本文(?:来自|转自|转载自|选自|摘自|首发于|首发自)")),
    # Disclaimers: "免责声明：本文仅代表作者本人观点……", "本文仅代表作者观点，不代表网易意见",
    # "平台声明：该文观点仅代表作者本人……", "声明：本站力求信息真实……".
    (200, _rx(rf"{_OPEN}(?:免责|版权|特别|郑重|平台)?声明\s*[：:】\]]")),
    (150, _rx(rf"{_OPEN}(?:本文|以上|文章|此文|该文)[^。]{{0,30}}(?:仅代表|不代表)")),
    # Share widgets: "分享到：微信 微博 QQ空间", or the bare row of targets.
    (60, _rx(r"(?:分享到|分享至|一键分享)")),
    (
        60,
        _rx(
            r"(?:(?:微信|朋友圈|微博|新浪微博|腾讯微博|QQ空间|QQ好友|QQ|豆瓣|人人网|复制链接|"
            r"二维码|Facebook|WhatsApp|Twitter|Line|更多)\s*)+$"
        ),
    ),
    # Page widgets: "调整字体", "字号：大 中 小", "【打印】【关闭】", "点赞 在看 分享 收藏".
    (
        30,
        _rx(
            r"(?:[【\[]?(?:调整字体|字号|字体|打印|关闭|收藏|纠错|举报|点赞|在看|分享|赞|"
            r"转发|留言|评论)[：:\s大中小\d]*[】\]]?\s*)+$"
        ),
    ),
    # Calls to follow or install: "扫码关注我们", "扫二维码上移动长江网", "关注微信公众号",
    # "点击上方蓝字关注我们".
    (60, _rx(r"扫码|(?:扫一扫|扫描|长按|识别|扫)[^。]{0,16}二维码")),
    (50, _rx(r"(?:欢迎)?关注(?:我们|本站|微信|官方微信|公众号|微信公众号)")),
    (30, _rx(r"点击上方.{0,8}关注")),
    # Anchored at both ends: "用户可下载该APP预约" is a sentence, "下载网易新闻客户端" is not.
    (40, _rx(r"(?:点击|立即|马上)?(?:下载|打开)[^，。！]{0,10}(?:客户端|APP|App|app)\S{0,8}$")),
    # Navigation leftovers: "返回搜狐，查看更多", "返回腾讯网首页>>", "展开全文", "上一篇：……",
    # WeChat's "预览时标签不可点".
    (
        40,
        _rx(
            r"返回\S{1,8}[，,]\s*查看更多|返回\S{0,8}首页|返回顶部|查看更多|点击查看|展开全文|"
            r"阅读全文|查看原文|阅读原文|点击阅读|上一篇|下一篇|打印本页|关闭窗口|预览时标签不可点"
        ),
    ),
    # Counters, stamps and end marks with no words: "157", "2019-09-06 107", "— END —".
    (20, _rx(r"[\d\s:/.\-年月日]+$")),
    (12, _rx(r"[-—–\s]*END[-—–\s]*$")),
)
_NOISE_ANYWHERE: Final[tuple[tuple[int, re.Pattern[str]], ...]] = (
    # Copyright footers: "版权所有 ©2019 某某网", "Copyright 2019 ... All Rights Reserved".
    # "版权所有人" is a legal term in ordinary sentences, hence the look-ahead.
    (
        120,
        _rx(r"版权所有(?![人者权權])|©|Copyright|All Rights Reserved|\(c\)\s*\d{4}", re.I),
    ),
    # Reprint notices. Both need an imperative (禁止/不得/请注明), so "未经授权转载原告作品"
    # in a court report does not match.
    (120, _rx(r"未经.{0,16}(?:授权|许可|同意).{0,6}(?:禁止|不得|严禁|谢绝|请勿)")),
    (120, _rx(r"(?:转载|转发|引用)[^，。]{0,8}(?:请|须|务必|必须)[^，。]{0,4}注明")),
)
_NOISE_MAX: Final = max(limit for limit, _ in _NOISE_AT_START + _NOISE_ANYWHERE)


def _union(rows: tuple[tuple[int, re.Pattern[str]], ...]) -> re.Pattern[str]:
    return re.compile(
        "|".join(
            f"(?i:{pat.pattern})" if pat.flags & re.IGNORECASE else f"(?:{pat.pattern})"
            for _, pat in rows
        )
    )


# Each table as one pattern: one match and one search rule out nearly every line before
# the rows are tried one by one for their length caps.
_ANY_AT_START: Final = _union(_NOISE_AT_START)
_ANY_ANYWHERE: Final = _union(_NOISE_ANYWHERE)
# The characters an _NOISE_ANYWHERE match can start with. A one-character-class search
# runs at memchr speed; the union above costs 6 µs on a 100-character paragraph, and every
# paragraph is checked while the article container is being chosen.
_ANYWHERE_FIRST: Final = re.compile(r"[版©未转轉引(cCaA]")


def is_noise(line: str) -> bool:
    """Whether ``line`` is one of the template lines of the tables above."""
    if len(line) > _NOISE_MAX:
        return False
    if _ANY_AT_START.match(line) and any(
        len(line) <= limit and pat.match(line) for limit, pat in _NOISE_AT_START
    ):
        return True
    return bool(_ANYWHERE_FIRST.search(line) and _ANY_ANYWHERE.search(line)) and any(
        len(line) <= limit and pat.search(line) for limit, pat in _NOISE_ANYWHERE
    )


# Headings of link lists: "相关阅读", "延伸 · 推荐", "APP精彩推荐：", "点击进入专题>>". Only
# the heading alone or followed by a colon/arrow: "推荐阅读这本书的理由" is a sentence.
_RELATED_HEADING: Final = _rx(
    r"^[【\[]?\w{0,4}?(?:(?:相关|延伸|推荐|精彩|热门|热点|更多|猜你|往期|今日)\s*[·•]?\s*"
    r"(?:阅读|新闻|文章|报道|链接|推荐|内容|资讯|专题|视频|图集|喜欢|回顾|热点)|"
    r"(?:点击)?进入专题|喜欢此内容的人还喜欢)[】\]]?\s*(?:[：:>＞》»]|&gt;|$)"
)
_RELATED_HEADING_MAX: Final = 40
# A line after such a heading is a link title while it is short and has no sentence
# punctuation; at most this many are dropped, so that a heading cannot eat an article.
_LINK_TITLE: Final = re.compile(r"^[^，。；,;]{1,40}$")
_LINK_TITLES_AFTER_HEADING: Final = 12


def strip_noise(paragraphs: Iterable[str]) -> tuple[str, ...]:
    """Drop the template lines reprinting sites add, and lines that read as site
    furniture (``neardup.boilerplate``); keep everything else in order."""
    kept: list[str] = []
    skipping = 0  # link-title lines still allowed to drop after a related heading
    for line in paragraphs:
        if len(line) <= _RELATED_HEADING_MAX and _RELATED_HEADING.match(line):
            skipping = _LINK_TITLES_AFTER_HEADING
            continue
        if skipping and _LINK_TITLE.match(line):
            skipping -= 1
            continue
        skipping = 0
        if not (is_noise(line) or is_boilerplate(line)):
            kept.append(line)
    return tuple(kept)
