"""Simplified and Traditional script for the fixed text patterns of extraction.

Pages arrive in either script (Big5 sites, reprints converted with OpenCC), and every
pattern of ``neardup.extract`` and ``neardup.boilerplate`` matches both. A fixed table
rather than OpenCC at import time, so that a dictionary update cannot silently change
what is extracted; tests check it against OpenCC's s2t/s2hk/s2tw.
"""

from __future__ import annotations

import re
from typing import Final

#: Traditional forms of the characters the patterns use, by Simplified character.
S2T: Final = {
    pair[0]: pair[1:]
    for pair in (
        "专專 严嚴 为為爲 举舉 习習 于於 仅僅 们們 众眾衆 体體 关關 内內 击擊 "
        "划劃 创創 别別 制製 务務 发發 台臺 号號 图圖 声聲 复複覆復 实實 审審 "
        "对對 导導 应應 开開 户戶 扫掃 报報 时時 权權 条條 来來 标標 核覈 "
        "欢歡 注註 点點 热熱 独獨 监監 码碼 签簽籤 系係繫 纠糾 经經 绝絕 维維 "
        "编編 网網 腾騰 荐薦 观觀 视視 览覽 计計 讯訊 许許 论論 设設 评評 "
        "识識 词詞 该該 请請 读讀 调調 谢謝 责責 资資 赞讚贊 转轉 载載 辑輯 "
        "还還 进進 选選 郑鄭 链鏈 错錯 键鍵 长長 门門 闭閉 间間 闻聞 阅閱閲 "
        "页頁 顶頂 须須 顾顧 预預 频頻 题題 马馬 "
        # the characters of neardup.boilerplate's markers
        "简簡 个個 风風 险險 温溫 规規 坛壇 则則 旧舊 讨討 区區 备備 证證 电電 "
        "话話 邮郵 违違 办辦 单單 联聯 术術 谨謹 构構 议議 担擔 参參 浏瀏 气氣 数數 "
        "楼樓 达達 删刪 线線"
    ).split()
}
#: The reverse: each Traditional form to its Simplified character, for ``str.translate``.
T2S: Final = {ord(t): simp for simp, forms in S2T.items() for t in forms}


def rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """Compile ``pattern`` so that each of its Simplified characters also matches its
    Traditional form: "责任编辑" becomes "[责責]任[编編][辑輯]"."""
    out: list[str] = []
    in_class = escaped = False
    for ch in pattern:
        trad = S2T.get(ch)
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        if trad is None:
            out.append(ch)
        else:
            out.append(ch + trad if in_class else f"[{ch}{trad}]")
    return re.compile("".join(out), flags)
