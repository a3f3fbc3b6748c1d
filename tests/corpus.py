"""Articles written for this project's tests (MIT, like the project), and page builders.

Each article is a list of paragraphs. ``HARD_A`` and ``HARD_B`` are different events in
the same formulaic wording: they must never be merged.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

ARTICLES: dict[str, list[str]] = {
    "rail": [
        "本市第三条地铁线路今天上午正式开通运营，全长二十八公里，共设站点二十一座。",
        "新线路连接城东科技园区与西部老城区，沿途经过三所大学和两家大型医院，预计日均客流量将达到三十五万人次。",
        "市交通局负责人介绍，新线路采用全自动驾驶系统，高峰时段发车间隔缩短至两分三十秒，比既有线路提高了约百分之二十的运输能力。",
        "为方便乘客换乘，新线路与第一号线在中心广场站实现同台换乘，与城际铁路在西站实现安检互认。",
        "开通首日，不少市民专程前来体验。一位在科技园区工作的工程师说，过去上班需要换乘两次公交车，现在坐地铁只要二十五分钟。",
        "据悉，第四条线路的建设工作也已全面展开，计划于三年后建成通车，届时全市轨道交通总里程将突破一百公里。",
    ],
    "library": [
        "经过两年的改造，市立图书馆老馆于本周末重新向公众开放，馆内新增了儿童阅读区、古籍修复展示室和二十四小时自助借还区。",
        "改造工程保留了建于上世纪五十年代的主楼外立面，内部则重新划分了功能空间，阅览座位由原来的四百个增加到九百个。",
        "图书馆馆长表示，古籍修复展示室是此次改造的一大亮点，读者可以隔着玻璃观看修复师如何一页一页地修补破损的线装书。",
        "儿童阅读区按照年龄段划分为绘本区、故事区和科普区，每逢周六下午还将举办亲子共读活动，由志愿者为孩子们讲故事。",
        "开放当天，前来参观的读者排起了长队。一位退休教师感慨地说，自己年轻时常来这里看书，如今旧貌换新颜，心里格外高兴。",
    ],
    "harvest": [
        "今年夏粮收购工作日前全面启动，全省各地粮食收购网点已陆续开秤，截至目前累计收购小麦超过一百二十万吨。",
        "受春季气温偏高和降水充足影响，今年小麦长势良好，平均亩产比去年提高了约五个百分点，优质麦比例也明显上升。",
        "为保障农民顺利售粮，粮食部门延长了收购网点的营业时间，并推广手机预约售粮服务，农民可以提前选择时间和地点，减少排队等候。",
        "一位种粮大户告诉记者，他家今年种了三百亩小麦，收割后直接拉到附近的收购点，当天就拿到了粮款，比往年方便了许多。",
        "省粮食局有关负责人表示，将加强收购市场监管，严厉打击压级压价、拖欠粮款等行为，切实保护种粮农民的利益。",
        "同时，各地还加快了粮食烘干和仓储设施建设，新增烘干能力每日两万吨，有效缓解了雨季收粮难的问题。",
    ],
    "museum": [
        "一座以航海历史为主题的博物馆近日在沿海城市落成，馆内陈列了从古代木帆船模型到现代集装箱货轮的各类展品一千二百余件。",
        "博物馆共分为五个展厅，分别展示古代海上贸易、近代港口变迁、造船技术发展、海洋生态保护以及未来航运科技。",
        "其中最受关注的是一艘按原比例复原的明代福船，船长三十余米，观众可以登船参观船舱结构，了解古人如何远洋航行。",
        "博物馆还运用了虚拟现实技术，观众戴上头盔便可以“置身”于数百年前的港口，感受商船往来、货物装卸的繁忙景象。",
        "馆方表示，开馆首月实行免费预约参观，每天限流三千人，并为中小学生团体提供专场讲解服务。",
    ],
    "startup": [
        "一家专注于农业无人机的初创企业宣布完成新一轮融资，融资金额达两亿元，将主要用于研发新一代植保无人机和扩大生产规模。",
        "该公司成立于五年前，创始团队来自多所高校的航空工程专业，目前产品已覆盖全国十八个省份，累计作业面积超过五千万亩。",
        "公司首席执行官介绍，新一代无人机的载重能力提升了一倍，单次作业可覆盖六十亩农田，同时配备了多光谱相机，能够实时识别病虫害。",
        "业内人士分析，随着农村劳动力减少和土地集中经营的推进，农业无人机市场需求持续增长，未来几年有望保持较快发展。",
        "不过也有专家提醒，农业无人机行业竞争日趋激烈，企业需要在飞行安全、精准施药和售后服务等方面持续投入，才能赢得用户信任。",
    ],
    "heatwave": [
        "气象台今天下午发布高温橙色预警，预计未来三天本市最高气温将达到三十九度以上，局部地区可能超过四十度。",
        "气象专家分析，此轮高温天气是由于副热带高压持续控制所致，空气湿度较大，体感温度将明显高于实际气温。",
        "市卫生部门提醒，高温期间应尽量避免在中午前后进行户外活动，注意补充水分，老人、儿童和慢性病患者更要做好防暑降温措施。",
        "电力部门表示，用电负荷已连续多日创下新高，目前电网运行总体平稳，已启动有序用电预案，优先保障居民生活用电。",
        "与此同时，全市已开放一百多处避暑纳凉点，包括社区服务中心、图书馆和地铁站，为户外工作者和有需要的市民提供休息场所。",
    ],
}

# Two different events in the same formulaic wording (a regular briefing).
HARD_A = [
    "市政府今天上午召开常务会议，研究部署城市防汛工作。会议听取了水务部门关于今年汛期形势的汇报。",
    "会议指出，要坚持人民至上、生命至上，压实各级防汛责任，加强隐患排查和应急值守，确保城市安全度汛。",
    "会议强调，各部门要密切配合，提前转移危险区域群众，做好物资储备，全力保障人民群众生命财产安全。",
]
HARD_B = [
    "市政府今天上午召开常务会议，研究部署冬季供暖工作。会议听取了住建部门关于今年供暖准备情况的汇报。",
    "会议指出，要坚持人民至上、民生为本，压实各级供暖责任，加强管网检修和应急值守，确保群众温暖过冬。",
    "会议强调，各部门要密切配合，提前储备煤炭天然气，做好困难群众帮扶，全力保障人民群众基本生活需要。",
]

TEMPLATES = {
    "portal": (
        '<html><head><meta charset="{charset}"><title>{title}_城市新闻网</title></head><body>'
        '<div class="nav"><a href="/">首页</a> <a href="/news">新闻</a> <a href="/sport">体育</a>'
        ' <a href="/money">财经</a></div><div class="main"><h1>{title}</h1>'
        '<div class="info">2026-03-01 08:00 来源：城市新闻网</div><div class="content">{body}</div>'
        '<p>责任编辑：王小明</p><div class="share">分享到：微信 微博 QQ空间</div></div>'
        '<div class="side"><h3>相关阅读</h3><ul><li><a href="/a">本市举行春季招聘会</a></li>'
        '<li><a href="/b">公园新增健身步道</a></li></ul></div>'
        '<div class="foot">Copyright © 2026 城市新闻网 版权所有 未经授权禁止转载</div></body></html>'
    ),
    "blog": (
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Type" content="text/html; '
        'charset={charset}"><title>{title} - 每日资讯</title></head><body><header><nav>'
        '<a href="/">资讯</a> | <a href="/tech">科技</a> | <a href="/life">生活</a></nav></header>'
        "<article><h2>{title}</h2><section>{body}</section></article>"
        '<aside><p>扫码关注我们，获取更多资讯</p><p>推荐阅读：<a href="/c">秋季养生指南</a></p></aside>'
        "<footer>本站部分内容来自网络 ©每日资讯</footer></body></html>"
    ),
}


def page_html(
    paragraphs: Sequence[str], title: str, template: str = "portal", charset: str = "utf-8"
) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return TEMPLATES[template].format(title=title, body=body, charset=charset)


def raw_page(
    url: str,
    paragraphs: Sequence[str],
    title: str,
    *,
    template: str = "portal",
    charset: str = "utf-8",
    fetched_at: str = "2026-03-01T00:00:00Z",
    page_id: str | None = None,
) -> dict[str, str]:
    """A raw-page message: ``html`` for UTF-8, ``body_b64`` bytes for other charsets."""
    html = page_html(paragraphs, title, template, charset)
    msg = {"url": url, "fetched_at": fetched_at, "content_type": f"text/html; charset={charset}"}
    if charset == "utf-8":
        msg["html"] = html
    else:
        msg["body_b64"] = base64.b64encode(html.encode(charset, "xmlcharrefreplace")).decode()
    if page_id is not None:
        msg["page_id"] = page_id
    return msg


def line(msg: dict[str, str]) -> str:
    return json.dumps(msg, ensure_ascii=False)


def analysed_page(story: str, minute: int, cfg: Any) -> Any:
    """The bundled article ``story`` as ``neardup.analysis.analyse`` makes it (an
    ``Analysed``), fetched ``minute`` minutes into a day, from a URL named after it."""
    from neardup.analysis import Analysed, analyse
    from neardup.contract import parse_raw
    from neardup.records import Rejected

    url = f"https://news.example.cn/{story}.html"
    msg = raw_page(url, ARTICLES[story], story, fetched_at=f"2026-03-01T00:{minute:02d}:00Z")
    page = parse_raw(line(msg), cfg.max_bytes)
    assert not isinstance(page, Rejected)
    a = analyse(page, cfg)
    assert isinstance(a, Analysed)
    return a


def in_a_process(code: str, *, hash_seed: int) -> str:
    """What ``code`` prints, run by a new interpreter in the repository with
    ``PYTHONHASHSEED=hash_seed``."""
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
