"""Forum and blog site templates: a forum with a stale pinned post and rules, a Big5 Hong
Kong forum, a personal blog with a self-introduction, a blog platform, a small club's board.
Each carries its own stale blocks."""

from __future__ import annotations

from bench.streams.sites import PageSpec, Site, block, esc, head, links, nav, paras

# --- a Discuz-style forum: a stale pinned post, rules, a post line with counters ----------

_SONGTAO_PINNED = (
    "【置顶】关于本版近期整顿的说明~~~各位坛友好，最近有不少朋友反映版面广告帖增多~~~"
    "经版主组讨论决定，自即日起对新注册会员发帖进行审核，审核时间一般不超过24小时~~~"
    "给大家带来的不便敬请谅解~~~另外，本版每月评选优秀原创帖，获奖者可得论坛积分500分"
    "和纪念徽章一枚~~~欢迎大家踊跃参与，多发原创，少灌水~~~有问题请站内信联系版主老树"
)
_SONGTAO_RULES = (
    "本版版规：",
    "1. 禁止发布违反国家法律法规的内容；",
    "2. 禁止人身攻击、地域攻击及恶意灌水；",
    "3. 转载文章请注明出处，原创文章请加【原创】标签；",
    "4. 禁止发布商业广告，违者删帖并禁言七天；",
    "5. 标题应简明扼要，不得使用“震惊”“速看”等字样；",
    "6. 版主有权对违规帖子进行编辑、移动或删除；",
)


def songtao(spec: PageSpec) -> str:
    menu = nav(["论坛首页", "松涛茶馆", "本地生活", "摄影天地", "二手市场", "帮助"], spec)
    return (
        head(spec, "松涛社区")
        + f'<body><div id="hd">{menu}</div><div id="wp">'
        + f'<div class="notice"><p>{esc(_SONGTAO_PINNED)}</p></div>'
        + f'<table class="plhin"><tr><td class="pls">{esc(spec.author)}<br>'
        + '帖子 1024 积分 3380</td><td class="plc">'
        + f"<h1>{esc(spec.title)}</h1>"
        + f'<div class="pti">发表于 {spec.published} | 查看: {spec.views} | '
        + f"回复: {spec.comments}</div>"
        + f'<div class="t_fsz"><div class="t_f">{paras(spec)}</div></div>'
        + '<div class="sign">签名：山高水长，松涛依旧</div></td></tr></table>'
        + f'<div class="rules">{block(_SONGTAO_RULES, "li")}</div></div>'
        + '<div id="ft">Powered by Discuz! X3.4 湘ICP备15004321号</div></body></html>'
    )


# --- a Hong Kong forum in Big5: table layout, a stale post with Latin periods -------------

_GANGWAN_OLD_POST = (
    "舊帖重溫：各位巴打絲打好. 本區開咗十幾年, 多謝大家一直支持. "
    "最近有人問點樣上載相片, 其實好簡單, 撳「附件」再揀檔案就得. "
    "檔案唔好大過2MB, 否則會上載失敗. 如有任何問題, 歡迎喺「意見反映」區留言. "
    "版主會盡快回覆. 祝大家生活愉快, 身體健康"
)
_GANGWAN_RULES = (
    "討論區守則 | 請勿張貼任何色情、暴力或違法內容 | 請勿人身攻擊 | "
    "轉載文章請註明出處 | 違者會被停權 | 管理員保留最終決定權"
)


def gangwan(spec: PageSpec) -> str:
    menu = nav(["主頁", "時事台", "吹水台", "財經台", "飲食台", "旅遊台"], spec, " - ")
    return (
        head(spec, "港灣討論區")
        + '<body><table width="100%" cellpadding="4"><tr><td bgcolor="#336699">'
        + f"{menu}</td></tr><tr><td>"
        + f'<table class="oldpost"><tr><td>{esc(_GANGWAN_OLD_POST)}</td></tr></table>'
        + f'<table class="thread"><tr><th>{esc(spec.title)}</th></tr>'
        + f"<tr><td>發表時間：{spec.published} 瀏覽：{spec.views} 回覆：{spec.comments}</td></tr>"
        + f'<tr><td class="msg">{paras(spec, "div")}</td></tr></table>'
        + f"<p>{esc(_GANGWAN_RULES)}</p></td></tr></table></body></html>"
    )


# --- a personal blog: a self-introduction in the sidebar, post counters -------------------

_QINGSHI_ABOUT = (
    "关于我：一个在南方小城教书的中年人. 白天上课, 晚上写字~~~喜欢读历史, 也喜欢走路. "
    "这个博客开了快十年了, 写过旅行, 写过读书笔记, 也写过一些家长里短. "
    "文字粗浅, 只为记录. 欢迎来访的朋友留言交流~~~转载请注明出处, 谢谢. "
    "最近在读《长江史话》和一本关于明代漕运的小书, 读完会写点感想. "
    "联系邮箱写在页面底部, 来信必复"
)


def qingshi(spec: PageSpec) -> str:
    return (
        head(spec, "青石的博客")
        + f'<body><div class="blog-header">青石的博客 {nav(["首页", "归档", "关于"], spec)}</div>'
        + '<div class="container"><div class="post">'
        + f'<h2 class="post-title">{esc(spec.title)}</h2>'
        + f'<div class="post-meta">发布于 {spec.published} | 阅读({spec.views}) | '
        + f"评论({spec.comments})</div>"
        + f'<div class="post-content">{paras(spec)}</div>'
        + '<div class="tags">标签：随笔 见闻 转载</div></div>'
        + f'<div class="sidebar"><div class="about">{esc(_QINGSHI_ABOUT)}</div>'
        + f"<h4>最新文章</h4><ul>{links(spec.related[:6])}</ul></div></div>"
        + '<div class="footer">© 青石 联系：qingshi_blog@example.com</div></body></html>'
    )


# --- a blog platform: the blogger's profile with | separators, a hotline footer -----------

_MOHEN_PROFILE = (
    "博主简介 | 林间散人 | 自由撰稿人 | 关注城市变迁与民间记忆 | 著有散文集《旧街》 | "
    "博客访问量 1,203,456 | 文章 862 篇 | 粉丝 3,211 人 | 加入墨痕博客网已满八年 | "
    "欢迎交换友情链接 | 商务合作请私信 | 本博客所有文字均为原创或已获授权转载"
)


def mohen(spec: PageSpec) -> str:
    return (
        head(spec, "墨痕博客网")
        + f'<body><div id="top">{nav(["墨痕首页", "热门博客", "排行榜", "登录", "注册"], spec)}'
        + f'</div><div id="profile">{esc(_MOHEN_PROFILE)}</div><div id="article">'
        + f'<div class="articleTitle">{esc(spec.title)}</div>'
        + f'<div class="articleTime">({spec.published}) 转载▼ 阅读 {spec.views} '
        + f"评论 {spec.comments}</div>"
        + f'<div class="articleContent">{paras(spec, "div")}</div></div>'
        + f'<div id="more"><b>博主推荐</b>{links(spec.related[:4], "div")}</div>'
        + '<div id="foot">墨痕博客网 违法和不良信息举报电话：010-58965432 '
        + "京ICP证060123号 京公网安备11010802012345号</div></body></html>"
    )


# --- a small club's board: few pages, a stale notice ending in semicolons ------------------

_SHUHUA_NOTICE = (
    "社团公告：本社每周二、周四上午在老年大学三楼活动室开展书画交流；"
    "新学员报名请携带身份证复印件及一寸照片两张；"
    "学费每学期280元，纸墨笔砚自备；"
    "年度作品展定于每年十月举办，欢迎社员踊跃投稿；"
    "联系人：周老师，电话：13805550123；"
)


def shuhua(spec: PageSpec) -> str:
    return (
        head(spec, "夕阳红书画社")
        + f'<body><div class="hd">夕阳红书画社 {nav(["首页", "社团动态", "作品欣赏"], spec)}</div>'
        + f'<div class="gg">{esc(_SHUHUA_NOTICE)}</div>'
        + f'<div class="bd"><h3>{esc(spec.title)}</h3>'
        + f'<div class="sj">{spec.published} 阅读：{spec.views}</div>{paras(spec)}</div>'
        + "</body></html>"
    )


COMMUNITY = (
    Site("songtao", "bbs.songtao-club.net", "forum", songtao, paths=("thread",)),
    Site(
        "gangwan",
        "forum.gangwan-hk.com",
        "forum",
        gangwan,
        (("big5", "big5hkscs", 5), ("utf-8", "utf-8", 1)),
        paths=("viewthread",),
    ),
    Site("qingshi", "qingshi.blog-host.cn", "blog", qingshi, paths=("post",)),
    Site(
        "mohen",
        "blog.mohen-blog.com",
        "blog",
        mohen,
        (("utf-8", "utf-8", 3), ("gb18030", "gb18030", 1)),
        paths=("s/blog",),
    ),
    Site("shuhua", "www.xiyanghong-shuhua.org", "small", shuhua, small=True, paths=("news",)),
)
