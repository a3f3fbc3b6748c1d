"""The dev stream's transformations, applied to paragraphs: light edits, excerpts,
abridgement, reordering, Traditional/Simplified conversion, title rewrites, boilerplate."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache

Paragraphs = tuple[str, ...]

# Width swaps a reprinting site's editor or software makes.
_WIDTH = {"，": ",", "。": ".", "：": ":", "；": ";", "？": "?", "！": "!", "（": "(", "）": ")"}
# Characters an edit may put in: common ones, so an edit is not a signal of its own.
_FILLER = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    "同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自"
    "二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日"
    "那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变"
    "条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总"
    "次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指"
    "几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器"
    "压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安"
    "场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集"
    "温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连"
    "断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精"
    "值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属"
    "圆包火住调满县局照参红细引听该铁价严"
)
_BOILERPLATE = (
    "责任编辑：王晓明",
    "本文来源：综合报道",
    "点击进入专题：今日关注",
    "相关阅读：更多精彩内容请关注本站",
)
_SOURCES = ("新华网", "人民网", "中国新闻网", "央视网", "综合报道", "本地日报")


@lru_cache(maxsize=2)
def _converter(config: str) -> Callable[[str], str]:
    import opencc

    convert: Callable[[str], str] = opencc.OpenCC(config).convert
    return convert


def convert_script(paragraphs: Paragraphs, script: str) -> Paragraphs:
    """Traditional text to Simplified, Simplified to Traditional (OpenCC)."""
    convert = _converter("t2s" if script == "trad" else "s2t")
    return tuple(convert(p) for p in paragraphs)


def light_edit(paragraphs: Paragraphs, rng: random.Random) -> tuple[Paragraphs, float]:
    """1-3% of characters substituted, deleted or inserted, punctuation widths swapped,
    one digit changed; returns the paragraphs and the edit rate."""
    text = "\n".join(paragraphs)
    chars = list(text)
    rate = rng.uniform(0.01, 0.03)
    places = [i for i, c in enumerate(chars) if c != "\n"]
    for i in sorted(rng.sample(places, max(1, int(rate * len(places)))), reverse=True):
        op = rng.random()
        if op < 0.5:
            chars[i] = rng.choice(_FILLER)
        elif op < 0.75:
            del chars[i]
        else:
            chars.insert(i, rng.choice(_FILLER))
    swap = rng.random() < 0.7
    out = "".join(_WIDTH.get(c, c) if swap and rng.random() < 0.6 else c for c in chars)
    digits = [i for i, c in enumerate(out) if c.isdigit() and c.isascii()]
    if digits:
        at = rng.choice(digits)
        out = out[:at] + str((int(out[at]) + rng.randint(1, 9)) % 10) + out[at + 1 :]
    return tuple(p for p in out.split("\n") if p), rate


def excerpt(paragraphs: Paragraphs, rng: random.Random) -> Paragraphs:
    """The first 40-60% of the paragraphs (of the characters, for a one-paragraph text)."""
    share = rng.uniform(0.4, 0.6)
    if len(paragraphs) >= 3:
        return paragraphs[: max(1, round(share * len(paragraphs)))]
    text = "".join(paragraphs)
    return (text[: max(20, int(share * len(text)))],)


def abridge(paragraphs: Paragraphs, rng: random.Random) -> Paragraphs:
    """One paragraph dropped (not the first), if there are three or more."""
    if len(paragraphs) < 3:
        return paragraphs
    drop = rng.randrange(1, len(paragraphs))
    return paragraphs[:drop] + paragraphs[drop + 1 :]


def reorder(paragraphs: Paragraphs, rng: random.Random) -> Paragraphs:
    """Paragraphs shuffled (two neighbours swapped for a short text)."""
    items = list(paragraphs)
    if len(items) >= 4:
        rng.shuffle(items)
    elif len(items) >= 2:
        i = rng.randrange(len(items) - 1)
        items[i], items[i + 1] = items[i + 1], items[i]
    return tuple(items)


def boilerplate(paragraphs: Paragraphs, rng: random.Random) -> Paragraphs:
    """Editor, source and see-also lines inside the content."""
    items = list(paragraphs)
    for line in rng.sample(_BOILERPLATE, rng.randint(1, 3)):
        items.insert(rng.choice((0, len(items))), line)
    return tuple(items)


def rewrite_title(title: str, paragraphs: Paragraphs, rng: random.Random) -> tuple[str, Paragraphs]:
    """A 【转载】/独家 prefix or a shortened title, and a source line before the text."""
    if rng.random() < 0.5:
        title = rng.choice(("【转载】", "独家：", "【关注】")) + title
    else:
        title = title[: max(6, len(title) * 2 // 3)]
    return title, (f"来源：{rng.choice(_SOURCES)}", *paragraphs)


def title_of(paragraphs: Paragraphs) -> str:
    """A headline: the first sentence, cut to at most 28 characters."""
    first = paragraphs[0]
    for end in "。！？":
        first = first.split(end)[0]
    return first[:28]


def truncate(paragraphs: Paragraphs, low: int, high: int, rng: random.Random) -> Paragraphs:
    """Leading paragraphs to a total of about ``low``-``high`` characters."""
    want = rng.randint(low, high)
    out: list[str] = []
    total = 0
    for p in paragraphs:
        if total + len(p) > want:
            if total < low:
                out.append(p[: want - total])
            break
        out.append(p)
        total += len(p)
    return tuple(out)
