"""Formulaic announcements: the same stock sentences with other dates, places, names and
numbers. Every one is a story of its own; merging two of them is an error.

All wording was written for this benchmark.
"""

from __future__ import annotations

import random

Paragraphs = tuple[str, ...]

_PROVINCES = ("江西", "湖南", "贵州", "甘肃", "吉林", "福建", "山西", "广西", "云南", "河北")
_CITIES = (
    "南丰",
    "临湘",
    "凯里",
    "天水",
    "延吉",
    "龙岩",
    "晋城",
    "百色",
    "大理",
    "邢台",
    "抚州",
    "岳阳",
    "遵义",
    "张掖",
    "通化",
    "三明",
    "长治",
    "河池",
    "曲靖",
    "沧州",
)
_SURNAMES = "王李张刘陈杨赵黄周吴徐孙胡朱高林何郭马罗梁宋郑谢韩唐冯于董萧程曹袁邓许傅沈曾彭吕"
_GIVEN = "建国立新明华志强海军文斌丽娟卫东永红春生小平晓光玉兰国庆振宇德胜雪梅"
_TOPICS = (
    ("安全生产", "隐患排查", "企业主体责任"),
    ("防汛抗旱", "汛期值守", "应急物资储备"),
    ("乡村振兴", "产业帮扶", "农民增收"),
    ("营商环境", "审批提速", "市场主体活力"),
    ("森林防火", "野外用火管控", "扑火队伍建设"),
    ("秋冬季大气污染防治", "散煤治理", "重点行业减排"),
)

# Each family: stock sentences with slots; those marked optional are left out now and then,
# so that two announcements of one family share most but not all of their wording.
_FAMILIES: tuple[tuple[tuple[str, bool], ...], ...] = (
    (
        (
            "{date}，{prov}省{city}市召开{t0}工作推进会，市委副书记、市长{name}出席会议并讲话。",
            False,
        ),
        ("会议传达学习了上级关于{t0}工作的部署要求，通报了前一阶段全市{t0}工作情况。", False),
        ("会议指出，各级各部门要深刻认识做好{t0}工作的重要性和紧迫性，切实增强责任感。", True),
        ("会议强调，要聚焦{t1}，压紧压实各方责任，确保各项措施落到实处。", False),
        ("要突出抓好{t2}，建立健全长效机制，推动{t0}工作取得新成效。", True),
        ("副市长{name2}主持会议，各县区和市直有关部门负责同志共{n}人参加会议。", False),
    ),
    (
        ("{date}，记者从{prov}省{city}县获悉，今年以来该县围绕{t0}累计投入资金{n}万元。", False),
        ("该县把{t1}作为重点，组织{m}个工作组深入乡镇村组开展督导检查。", False),
        ("据县{t0}工作领导小组办公室主任{name}介绍，目前各项工作进展顺利。", False),
        ("下一步，该县将继续在{t2}上下功夫，确保全年目标任务圆满完成。", True),
        ("截至目前，全县共发现并整改问题{m}个，群众满意度明显提升。", True),
    ),
    (
        ("{date}上午，{city}市人民政府新闻办公室举行新闻发布会，介绍全市{t0}有关情况。", False),
        ("市{t0}专班负责人{name}在会上表示，全市上下认真落实{t1}各项要求。", False),
        ("{name2}介绍，今年全市共完成相关项目{m}个，完成投资{n}万元，同比增长{pct}%。", False),
        ("发布会上，相关负责同志还就{t2}等问题回答了记者提问。", True),
        ("市直有关部门负责同志出席发布会，{k}家新闻媒体的记者参加。", False),
    ),
    (
        (
            "根据工作安排，{prov}省第{k}督导组于{date}进驻{city}市，开展为期{m}天的{t0}专项督导。",
            False,
        ),
        ("督导组组长{name}在动员会上指出，开展专项督导是推动{t1}落实的重要举措。", False),
        ("督导期间，督导组将通过听取汇报、查阅资料、实地检查等方式深入了解情况。", False),
        ("督导组设立专门值班电话0{tel}和邮政信箱，受理群众来电来信。", False),
        ("{city}市委书记{name2}作表态发言，表示将全力配合督导组开展工作，聚焦{t2}抓好整改。", True),
    ),
)


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 12)}月{rng.randint(1, 28)}日"


def _name(rng: random.Random) -> str:
    return rng.choice(_SURNAMES) + "".join(rng.sample(_GIVEN, rng.randint(1, 2)))


def announcement(family: int, rng: random.Random) -> Paragraphs:
    """One announcement of ``family`` with its own date, place, names, topic and numbers."""
    # most of a family's items share its topic, as a season's announcements do
    topic = _TOPICS[family % len(_TOPICS)] if rng.random() < 0.7 else rng.choice(_TOPICS)
    slots = {
        "date": _date(rng),
        "prov": rng.choice(_PROVINCES),
        "city": rng.choice(_CITIES),
        "name": _name(rng),
        "name2": _name(rng),
        "t0": topic[0],
        "t1": topic[1],
        "t2": topic[2],
        "n": str(rng.randint(120, 98000)),
        "m": str(rng.randint(3, 160)),
        "k": str(rng.randint(2, 30)),
        "pct": f"{rng.uniform(1, 30):.1f}",
        "tel": f"{rng.randint(310, 999)}-{rng.randint(1000000, 9999999)}",
    }
    sentences = [s for s, optional in _FAMILIES[family] if not optional or rng.random() < 0.6]
    text = "".join(s.format(**slots) for s in sentences)
    half = len(sentences) // 2
    if half and rng.random() < 0.5:
        cut = sum(len(s.format(**slots)) for s in sentences[:half])
        return (text[:cut], text[cut:])
    return (text,)


FAMILIES = len(_FAMILIES)
