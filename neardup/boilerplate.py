"""Blocks that read as site furniture on one page alone, whatever the layout.

A site template repeats some blocks on every page: a footer with a report hotline and
licence numbers, a stock-quote disclaimer, a blog's self-introduction, a forum's pinned
post, rules list and "Powered by" line, a post-date line with view and reply counters, a
related-headline line. Such a block may be longer than a short article beside it, and
its sentences need not end in 。, so neither paragraph scoring nor the learned period-string
filter sees it for what it is. ``is_boilerplate`` tells from the text alone; the extractor
asks it of the paragraphs of the blocks that compete to be the article and of the lines
it keeps. Markers are specific (registration numbers, labels at the start of a block),
so that an article that merely mentions a hotline keeps its sentences.
"""

from __future__ import annotations

import re
from typing import Final

from neardup.traditional import S2T, rx

#: The longest block this module judges: a template block is at most a few hundred
#: characters; a longer text is an article that may quote any of the markers.
MAX_CHARS: Final = 1000
# A footer or a disclaimer is a few hundred characters at most.
_SITE_TEXT_MAX: Final = 600

# A label that opens a furniture block: "置顶：", "博主简介：", "学校简介：", "风险提示：",
# "【公告】", "旧帖重温：", "讨论区守则 |".
_LABEL_AT_START = rx(
    r"[【\[（(]?\s*(?:置顶|公告|博主介绍|关于我|关于博主|关于本站|风险提示|风险揭示|免责条款|"
    r"温馨提示|重要提示|旧帖重温|旧帖|往期回顾|相关新闻|相关阅读|相关链接|相关文章|相关报道|"
    r"延伸阅读|热点新闻|热点关注|推荐阅读)\s*[】\]）)]?\s*[：:】\]|｜]"
)
# "学校简介：", "本版版规：", "讨论区守则 |": a word of up to four characters before the
# label. Tried only when the label is among the first characters (``_NAMED_LABEL``): the
# open prefix makes the pattern slow to fail.
_NAMED_LABEL_AT_START = rx(
    r"[【\[（(]?\s*[\u4e00-\u9fff]{0,4}(?:简介|版规|规则|守则|须知)\s*[】\]）)]?\s*[：:】\]|｜]"
)
_NAMED_LABEL = rx(r"简介|版规|规则|守则|须知")
# Site registration and reporting: each names the site, never an article's subject.
# Two distinct ones make a footer; one is enough in a short line that is no sentence.
# Plain substrings: ``in`` over a line is ten times faster than a regex alternation.
_REGISTRATION: Final = (
    "ICP备", "ICP证", "ICP證", "公网安备", "许可证编号", "许可证号", "举报电话", "举报邮箱",
    "举报中心", "违法和不良信息", "主办单位", "承办单位", "主办：", "承办：", "联系电话",
    "聯繫電話", "新闻热线", "Powered by", "powered by", "Discuz", "技术支持：", "技术支持:",
)  # fmt: skip
# "版权所有" as a marker, but not "版权所有人" (a legal term in ordinary sentences).
_COPYRIGHT = rx(r"版权所有(?![人者权])")
# Investment disclaimers under quote pages.
_DISCLAIMER: Final = (
    "股市有风险", "投资需谨慎", "入市需谨慎", "不构成投资建议", "不构成任何投资建议", "风险自担",
    "仅供参考",
)  # fmt: skip
# A character of every marker above but 联系电话, 技术支持 and 不构成投资建议, which count
# only beside another: one class search rules out most lines at memchr-like speed,
# before the markers are looked for one by one.
_MARKER_CHARS = re.compile(r"[备備證证举舉许許违違办辦线線版PpD谨謹险險仅僅]")
_DIGIT = re.compile(r"\d")
# A sentence's marks: a short line with one marker is a footer's line only without them
# ("市场监管部门公布了投诉举报电话，消费者……" is news).
_SENTENCE = re.compile(r"[，。！？]")
# View, reply and like counters: "浏览：1234", "查看: 1234", "回复 56", "阅读(89)".
_COUNTER = rx(r"(?:浏览|阅读|查看|点击|评论|回复|人气|点赞|收藏)(?:量|数|次数)?\s*[：:(（]?\s*\d+")
# A numbered rule: "1. 禁止发布广告", "三、标题应简明，不得使用……", "6. 版主有权删帖".
_RULE = rx(
    r"\s*(?:\d{1,2}|[一二三四五六七八九十]{1,2})\s*[.、．）)].*?"
    r"(?:禁止|不得|严禁|请勿|谢绝|违者|违规|版主|删帖|禁言|注明出处)"
)
# Forum and blog widget rows: "回复 引用 举报 顶部", "只看该作者 倒序浏览".
_WIDGETS = rx(
    r"(?:(?:回复|引用|举报|顶部|返回顶部|只看该作者|倒序浏览|电梯直达|楼主|沙发|板凳|地板|"
    r"使用道具|收藏|分享|支持|反对|编辑|删除)\s*[|｜]?\s*){3,}$"
)
# A decorative heading framed by full-width brackets: "【 今日要闻 】", "〖 图片新闻 〗".
_FRAMED = re.compile(r"[【〖［\[『]\s*[^，。！？；,.!?;]{1,12}?\s*[】〗］\]』]$")


def is_boilerplate(text: str) -> bool:
    """Whether ``text`` (one block or line, stripped) reads as template furniture."""
    n = len(text)
    if n > MAX_CHARS or n == 0:
        return False
    return bool(
        _LABEL_AT_START.match(text)
        or (_NAMED_LABEL.search(text, 0, 12) and _NAMED_LABEL_AT_START.match(text))
        or (n <= _SITE_TEXT_MAX and _MARKER_CHARS.search(text) and _names_the_site(text, n))
        or (n <= 100 and _short_furniture(text, n))
    )


def _traditional(marker: str) -> str:
    return "".join(S2T.get(ch, ch)[0] for ch in marker)


# Each marker in both scripts: two substring tests cost less than translating the text.
_REGISTRATION_BOTH: Final = tuple(
    dict.fromkeys(_REGISTRATION + tuple(map(_traditional, _REGISTRATION)))
)
_DISCLAIMER_BOTH: Final = tuple(dict.fromkeys(_DISCLAIMER + tuple(map(_traditional, _DISCLAIMER))))


def _names_the_site(text: str, n: int) -> bool:
    """Registration and reporting markers, or an investment disclaimer."""
    registrations = sum(marker in text for marker in _REGISTRATION_BOTH)
    if _COPYRIGHT.search(text):
        registrations += 1
    if registrations >= 2 or (registrations and n <= 80 and not _SENTENCE.search(text)):
        return True
    return sum(marker in text for marker in _DISCLAIMER_BOTH) >= 2


def _short_furniture(text: str, n: int) -> bool:
    """Counter lines, numbered rules, widget rows and framed decorative headings."""
    if _DIGIT.search(text) and len(_COUNTER.findall(text)) >= 2:
        return True
    if _RULE.match(text) and n <= 60:
        return True
    return bool(_WIDGETS.match(text) or _FRAMED.match(text))
