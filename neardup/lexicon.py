"""Word lists written for this project: stopwords and synonym groups (news register).

The synonym groups fold verbs and adverbs that editors swap when they rewrite a
reprint ("表示" for "称", "日前" for "近日"); each group maps to its first word.
"""

from __future__ import annotations

STOPWORDS = frozenset(
    """
    的 了 在 是 和 与 及 或 也 都 而 就 对 把 被 将 为 以 于 从 向 等 这 那 其 之 中 上 下
    着 过 个 一 不 有 我 你 他 她 它 们 我们 你们 他们 她们 已 已经 并 但 但是 而且 因为 所以
    如果 虽然 还 又 很 更 最 该 此 各 每 以及 对于 关于 由于 通过 这个 那个 这些 那些 这样
    那样 一些 一个 之一 还是 就是 只是 可以 能够 会 要 让 给 得 地 吗 吧 呢 啊 哦 嗯 么 则
    即 且 若 所 因 如 至 到 之后 之前 以后 以来 其中 此外 另外 同时 然而 不过 只有 没有 有关
    自己 什么 怎么 如何 为什么 哪 哪些 谁 这里 那里 当时 目前 已于 并且 以及其 亦 乃 该等
    """.split()
)

_SYNONYM_GROUPS = (
    "称 表示 指出 说 介绍 透露 坦言 强调",
    "近日 日前 最近 近期",
    "目前 当前 现时 现在 如今",
    "开展 进行 展开",
    "举行 举办 召开",
    "发生 出现",
    "增加 增长 上升 上涨 增多",
    "减少 下降 下跌 回落",
    "逾 超过 超 多于",
    "约 大约 大概 约为",
    "称赞 赞扬 肯定",
    "批评 指责 抨击",
    "警方 警察",
    "当局 政府",
    "民众 市民 公众",
    "记者 本报记者",
    "报道 报导",
    "会见 会晤",
    "宣布 公布",
    "要求 促请 敦促",
    "认为 觉得",
    "因此 所以 故此",
    "但 但是 不过 然而",
    "立即 立刻 马上",
    "帮助 协助",
    "调查 调研",
    "今年 本年",
    "去年 上年",
)

SYNONYMS: dict[str, str] = {
    word: group.split()[0] for group in _SYNONYM_GROUPS for word in group.split()[1:]
}
