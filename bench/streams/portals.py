"""Portal-like site templates: table-layout portals, a finance site, a county news centre,
a mobile news page, a school's news pages. Each carries its own stale blocks."""

from __future__ import annotations

from bench.streams.sites import PageSpec, Site, block, esc, head, links, nav, paras

# --- an old table-layout portal, GB-encoded ---------------------------------------------

_HANSHUI_FOOTER = (
    "汉水在线 版权所有 未经书面授权不得复制或建立镜像",
    "违法和不良信息举报电话：0710-3326110 举报邮箱：jubao@hanshui-online.cn",
    "鄂ICP备09012345号-1 鄂公网安备42060202000123号 互联网新闻信息服务许可证编号：42120170007",
    "本站法律顾问：汉江律师事务所 张明远律师 | 联系电话：0710-3326000 | 广告服务 | 关于我们",
)
_HANSHUI_HOT = "【热点关注】汉水两岸夜景亮化工程全面完工 市民可免费登船夜游"


def hanshui(spec: PageSpec) -> str:
    menu = nav(["首页", "本地", "国内", "国际", "财经", "房产", "汽车", "论坛"], spec, " | ")
    return (
        head(spec, "汉水在线")
        + '<body bgcolor="#FFFFFF"><table width="960" align="center" border="0"><tr>'
        + f'<td colspan="2" class="nav">{menu}</td></tr><tr><td width="680" valign="top">'
        + f'<table width="100%"><tr><td class="hot">{esc(_HANSHUI_HOT)}</td></tr>'
        + f'<tr><td align="center"><font size="4"><b>{esc(spec.title)}</b></font></td></tr>'
        + f'<tr><td align="center" class="info">{spec.published} 来源：汉水在线 '
        + f"点击数：{spec.views}</td></tr>"
        + f'<tr><td class="content">{paras(spec)}</td></tr></table></td>'
        + f'<td width="260" valign="top"><b>相关新闻</b><ul>{links(spec.related[:5])}</ul></td>'
        + f'</tr><tr><td colspan="2" class="footer">{block(_HANSHUI_FOOTER, "div")}</td></tr>'
        + "</table></body></html>"
    )


# --- a finance site with a stock-quote disclaimer ---------------------------------------

_JINQIAO_DISCLAIMER = (
    "免责声明：本页面所载行情数据及资讯内容仅供参考，不构成任何投资建议；"
    "行情数据由第三方提供，可能存在延迟或误差，本网不对其准确性、完整性作任何保证；"
    "投资者据此操作，风险自担；股市有风险，入市需谨慎；"
    "如本页转载内容涉及版权问题，请权利人与本网联系，我们将在核实后及时处理；"
    "未经本网书面许可，任何单位和个人不得转载、摘编或以其他方式使用本网内容"
)
_JINQIAO_QUOTES = "上证指数 3052.37 +0.42% | 深证成指 9412.88 -0.15% | 创业板指 1834.02 +0.61%"


def jinqiao(spec: PageSpec) -> str:
    menu = nav(["首页", "股票", "基金", "债券", "期货", "外汇", "理财", "研报"], spec)
    return (
        head(spec, "金桥财经网")
        + f'<body><div class="top"><div class="menu">{menu}</div>'
        + f'<div class="ticker">{esc(_JINQIAO_QUOTES)}</div></div>'
        + f'<div class="main"><div class="left"><h1>{esc(spec.title)}</h1>'
        + f'<div class="meta"><span>{spec.published}</span><span>来源：金桥财经网</span>'
        + f"<span>作者：{esc(spec.author)}</span></div>"
        + f'<div class="article-body">{paras(spec)}</div>'
        + f'<div class="disclaimer"><p>{esc(_JINQIAO_DISCLAIMER)}</p></div></div>'
        + f'<div class="right"><h3>24小时热榜</h3><ol>{links(spec.related[:8])}</ol></div>'
        + '</div><div class="foot">客服热线：400-820-5566 沪ICP证130987号</div>'
        + "</body></html>"
    )


# --- a county news centre: table layout, licences and hotlines in the footer -----------

_QINGHE_FOOTER = (
    "主办：清河县融媒体中心 承办：清河县新闻网站管理办公室",
    "地址：清河县人民路88号 邮编：054800 新闻热线：0319-8166123",
    "违法和不良信息举报电话：0319-8166000 未成年人保护专线：0319-8166012",
    "冀ICP备12034567号 冀公网安备13053402000045号 网络文化经营许可证：冀网文〔2019〕1234-567号",
    "本网所刊登的各种新闻﹑信息和各种专题专栏资料，均为清河县融媒体中心版权所有，"
    "未经协议授权，禁止下载使用",
)
_QINGHE_RELATED = "相关阅读：清河县召开全县经济工作会议 部署明年重点任务"


def qinghe(spec: PageSpec) -> str:
    menu = nav(["网站首页", "清河要闻", "乡镇动态", "部门信息", "视频新闻", "图片新闻"], spec)
    return (
        head(spec, "清河新闻网")
        + '<body><table class="wrap" cellspacing="0"><tr><td class="banner">清河新闻网</td>'
        + f"</tr><tr><td>{menu}</td></tr><tr><td><table><tr>"
        + '<td class="crumb">您现在的位置：首页 &gt; 清河要闻 &gt; 正文</td></tr>'
        + f'<tr><td class="title">{esc(spec.title)}</td></tr>'
        + f'<tr><td class="date">发布时间：{spec.published} 浏览次数：{spec.views}</td></tr>'
        + f"<tr><td>{paras(spec)}</td></tr>"
        + f'<tr><td class="related">{esc(_QINGHE_RELATED)}</td></tr>'
        + '<tr><td>【<a href="#">打印本页</a>】【<a href="#">关闭窗口</a>】</td></tr>'
        + f"</table></td></tr><tr><td>{block(_QINGHE_FOOTER)}</td></tr></table></body></html>"
    )


# --- a mobile news page: app banner, one related line, counters --------------------------

_ZHANGSHANG_BANNER = (
    "下载掌上资讯客户端，看更多独家报道|每日早晚两次推送|离线阅读不耗流量|"
    "点击右上角分享给好友|欢迎提供新闻线索，一经采用即付稿酬|客服电话 400-600-1788"
)


def zhangshang(spec: PageSpec) -> str:
    related = spec.related[0] if spec.related else ""
    return (
        head(spec, "掌上资讯", '<meta name="viewport" content="width=device-width">')
        + f'<body><header class="bar">{nav(["推荐", "热点", "本地", "视频"], spec)}</header>'
        + f'<article><h1 class="t">{esc(spec.title)}</h1>'
        + f'<div class="src">{spec.published} · {esc(spec.author)} · 阅读 {spec.views}</div>'
        + f'<section class="txt">{paras(spec)}</section></article>'
        + f'<div class="rel">相关阅读：<a href="/r/1.html">{esc(related)}</a></div>'
        + f'<div class="cmt">评论（{spec.comments}）</div>'
        + f'<div class="app">{esc(_ZHANGSHANG_BANNER)}</div></body></html>'
    )


# --- a school's news pages: few pages, a stale school introduction ----------------------

_SCHOOL_INTRO = (
    "学校简介：滨湖实验中学创办于1956年，是省级示范性普通高中，占地面积180亩，"
    "现有教学班48个，在校学生2300余人，教职工210人。学校秉承“厚德、博学、求实、创新”的校训，"
    "坚持以人为本、全面发展的办学理念，先后获得省文明单位、省绿色学校、市教育教学质量先进单位等"
    "荣誉称号。学校设施齐全，建有标准化实验室、图书馆、体育馆和学生公寓。近年来，学校高考成绩"
    "稳步提升，学科竞赛屡获佳绩，社会声誉不断提高，已成为当地群众满意的优质学校"
)


def school(spec: PageSpec) -> str:
    return (
        head(spec, "滨湖实验中学")
        + f'<body><div id="hd">滨湖实验中学 {nav(["首页", "学校概况", "校园新闻"], spec)}</div>'
        + f'<div id="bd"><div id="side"><h4>学校简介</h4><p>{esc(_SCHOOL_INTRO)}</p></div>'
        + f'<div id="main"><h2>{esc(spec.title)}</h2><p class="d">{spec.published}</p>'
        + f"{paras(spec)}</div></div>"
        + '<div id="ft">地址：滨湖市湖滨路1号 电话：0551-6612345 皖ICP备05001234号</div>'
        + "</body></html>"
    )


PORTALS = (
    Site(
        "hanshui",
        "www.hanshui-online.cn",
        "portal",
        hanshui,
        (("gb2312", "gb18030", 6), ("utf-8", "utf-8", 1)),
        paths=("news/local", "news/china"),
    ),
    Site("jinqiao", "www.jinqiao-finance.com", "portal", jinqiao, paths=("stock", "fund")),
    Site(
        "qinghe",
        "www.qinghe-news.gov.cn",
        "portal",
        qinghe,
        (("gbk", "gb18030", 3), ("utf-8", "utf-8", 2)),
        paths=("qhyw",),
    ),
    Site("zhangshang", "m.zhangshang-news.com", "portal", zhangshang, paths=("a",)),
    Site("school", "www.binhu-school.edu.cn", "small", school, small=True, paths=("xw",)),
)
