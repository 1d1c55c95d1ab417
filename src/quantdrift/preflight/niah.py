# ruff: noqa: E501  (the built-in data tables read best one record a line)
"""``niah``: needle in a haystack, candidate against reference.

The product side's veto: a 4-bit model can keep its short-prompt quality and
still lose facts in a long context (recall 99.8 % -> 82 %). Each case hides one
fact at a depth of a filler text of a nominal length, asks for it, and counts a
hit when the answer string is in the reply (``detectors.lexical.needle_hit``, the lab's rule too).
Haystacks are built from shuffled filler sentences with a fixed seed, so
reference and candidate see byte-identical prompts and reruns are comparable.

Languages: English, Chinese and Japanese by default, each with its own filler,
needles and question, because a quantized model can keep its English recall and
lose a script whose tokens it sees less often. Recall is reported and judged
**per cell** (language x length): one cell under the floor, or behind the
reference by more than the tolerance, vetoes the launch, even when the average
over all cells would pass.

Lengths are tokens: about 0.75 words per token for English prose. Chinese and
Japanese cost very different numbers of tokens per character from one tokenizer
to the next (about one on Qwen's, two and more on an English-centred byte BPE),
so the check first asks each server to count a probe haystack
(``chars_per_token``) and sizes the haystacks by the tighter of the two counts:
a haystack then fills the length it is meant to, up to the model's context,
and never overflows it. ``CJK_CHARS_PER_TOKEN`` is the fallback for a server
that reports no usage. Each case records the prompt tokens the server reported.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantdrift.detectors.lexical import needle_hit

FILLER = (
    "The quarterly operations review covered many routine topics.",
    "The facilities team reported that new badge readers were installed on every floor.",
    "The cafeteria will extend its opening hours during the winter months.",
    "Expense reports must be filed within thirty days of the purchase.",
    "Receipts older than ninety days cannot be reimbursed.",
    "The internal wiki moves to a new platform over several weekends.",
    "Teams were asked to archive pages they no longer use.",
    "Most staff said they were satisfied with flexible working.",
    "Many asked for clearer career paths and a larger training budget.",
    "The sustainability committee proposed replacing paper cups with reusable mugs.",
    "More bicycle racks will be installed near the main entrance.",
    "Security reminded staff to lock their screens when they leave their desks.",
    "Suspicious emails should be reported to the help desk at once.",
    "Visitors must park in the marked spaces behind the building.",
    "The next review will take place in the large conference room.",
    "The printer on the second floor has been replaced with a faster model.",
    "New starters receive their laptops on the first morning.",
    "The library of shared templates was cleaned up and reorganised.",
    "Meeting rooms can now be booked from the calendar app.",
    "The summer party will have live music and a barbecue.",
)


FILLER_ZH = (
    "季度运营回顾涉及了许多日常话题。",
    "设施团队报告说每层楼都安装了新的门禁读卡器。",
    "冬季期间食堂将延长营业时间。",
    "报销单必须在购买后三十天内提交。",
    "超过九十天的收据不能报销。",
    "内部知识库将在几个周末内迁移到新平台。",
    "大多数员工表示对灵活办公感到满意。",
    "可持续发展委员会建议用可重复使用的杯子代替纸杯。",
    "安全部门提醒员工离开座位时锁定屏幕。",
    "访客必须把车停在大楼后面的指定车位。",
    "二楼的打印机已经换成了速度更快的型号。",
    "新员工在入职第一天上午领取笔记本电脑。",
)
FILLER_JA = (
    "四半期の業務レビューでは多くの日常的な話題が取り上げられました。",
    "施設チームによると、各階に新しいカードリーダーが設置されました。",
    "冬の間、社員食堂の営業時間が延長されます。",
    "経費精算は購入から三十日以内に提出しなければなりません。",
    "九十日を過ぎた領収書は精算できません。",
    "社内ウィキは数回の週末をかけて新しい基盤に移行します。",
    "多くの社員が柔軟な働き方に満足していると答えました。",
    "持続可能性委員会は紙コップを再利用できるマグカップに替えることを提案しました。",
    "セキュリティ担当は席を離れるときに画面をロックするよう呼びかけました。",
    "来客は建物の裏にある指定の場所に駐車してください。",
    "二階のプリンターはより速い機種に交換されました。",
    "新入社員は初日の朝にノートパソコンを受け取ります。",
)
FILLERS = {"en": FILLER, "zh": FILLER_ZH, "ja": FILLER_JA}
# (intro, question line) per language; {q} is the needle's question.
PROMPTS = {
    "en": ("Read the following notes carefully.", "Question: {q} Answer in one short sentence."),
    "zh": ("请仔细阅读以下笔记。", "问题：{q} 请用一句简短的话回答。"),
    "ja": ("次のメモをよく読んでください。", "質問：{q} 短い一文で答えてください。"),
}
LANGUAGES = tuple(PROMPTS)


@dataclass(frozen=True, slots=True)
class Needle:
    fact: str
    question: str
    answer: str
    language: str = "en"


DEFAULT_NEEDLES = (
    Needle("The secret code for the storage room is 7319.", "What is the secret code for the storage room?", "7319"),
    Needle("The company picnic will be held in Lisbon this year.", "In which city will the company picnic be held?", "Lisbon"),
    Needle("The backup server is painted bright orange.", "What color is the backup server?", "orange"),
    Needle("The new project manager for the Atlas project is named Priya.", "Who is the new project manager for the Atlas project?", "Priya"),
    Needle("The guest speaker next month is a marine biologist named Tomas.", "What is the name of the guest speaker next month?", "Tomas"),
    Needle("The office plants are watered every Thursday.", "On which day are the office plants watered?", "Thursday"),
)  # fmt: skip
NEEDLES_ZH = tuple(
    Needle(f, q, a, "zh")
    for f, q, a in (
        ("储藏室的密码是7319。", "储藏室的密码是多少？", "7319"),
        ("今年的公司野餐将在里斯本举行。", "今年的公司野餐在哪个城市举行？", "里斯本"),
        ("备份服务器被漆成了橙色。", "备份服务器是什么颜色？", "橙色"),
        ("阿特拉斯项目的新项目经理名叫普丽娅。", "阿特拉斯项目的新项目经理叫什么名字？", "普丽娅"),
        (
            "下个月的演讲嘉宾是一位名叫托马斯的海洋生物学家。",
            "下个月的演讲嘉宾叫什么名字？",
            "托马斯",
        ),
        ("新的会议室编号是4826。", "新的会议室编号是多少？", "4826"),
    )
)
NEEDLES_JA = tuple(
    Needle(f, q, a, "ja")
    for f, q, a in (
        ("倉庫の暗証番号は7319です。", "倉庫の暗証番号は何ですか？", "7319"),
        (
            "今年の社内ピクニックはリスボンで開かれます。",
            "今年の社内ピクニックはどの都市で開かれますか？",
            "リスボン",
        ),
        (
            "バックアップサーバーは明るいオレンジ色に塗られています。",
            "バックアップサーバーは何色ですか？",
            "オレンジ",
        ),
        (
            "アトラス計画の新しいプロジェクトマネージャーはプリヤという名前です。",
            "アトラス計画の新しいプロジェクトマネージャーの名前は何ですか？",
            "プリヤ",
        ),
        (
            "来月のゲスト講演者はトマスという海洋生物学者です。",
            "来月のゲスト講演者の名前は何ですか？",
            "トマス",
        ),
        ("新しい会議室の番号は4826です。", "新しい会議室の番号は何番ですか？", "4826"),
    )
)
NEEDLES = {"en": DEFAULT_NEEDLES, "zh": NEEDLES_ZH, "ja": NEEDLES_JA}
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)
UNKNOWN_CONTEXT_LENGTHS = (256, 1024)
WORDS_PER_TOKEN = 0.75
CJK_CHARS_PER_TOKEN = 0.4
PROBE_TOKENS = 512  # the haystack each server counts to size Chinese and Japanese ones


def default_lengths(context_length: int | None) -> tuple[int, ...]:
    """Nominal haystack lengths that suit an endpoint's context.

    Unknown context: short lengths any model allows. Known: a quarter, a half,
    and the full window less room for the question and the answer.

    >>> default_lengths(None), default_lengths(8192), default_lengths(32768)
    ((256, 1024), (2048, 4096, 7680), (8192, 16384, 32256))
    """
    if not context_length:
        return UNKNOWN_CONTEXT_LENGTHS
    top = max(256, context_length - 512)
    return tuple(sorted({context_length // 4, context_length // 2, top}))


def haystack(
    length_tokens: int,
    needle: Needle,
    depth: float,
    seed: int = 0,
    chars_per_token: float | None = None,
) -> str:
    """The prompt in the needle's language: filler of about ``length_tokens`` with the
    fact at ``depth`` (0..1), then the question. ``chars_per_token`` sizes Chinese and
    Japanese (``CJK_CHARS_PER_TOKEN`` when None); English counts words."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if needle.language not in PROMPTS:
        raise ValueError(f"no filler for language {needle.language!r}; have {', '.join(LANGUAGES)}")
    filler = FILLERS[needle.language]
    cjk = needle.language != "en"
    rng = random.Random(seed)
    # English counts words, Chinese and Japanese characters (they have no spaces).
    per_token = (chars_per_token or CJK_CHARS_PER_TOKEN) if cjk else WORDS_PER_TOKEN
    target = int(length_tokens * per_token)
    sentences: list[str] = []
    size = 0
    while size < target:
        s = filler[rng.randrange(len(filler))]
        sentences.append(s)
        size += len(s) if cjk else len(s.split())
    sentences.insert(round(depth * len(sentences)), needle.fact)
    intro, question = PROMPTS[needle.language]
    body = ("" if cjk else " ").join(sentences)
    return f"{intro}\n\n{body}\n\n{question.format(q=needle.question)}"


def chars_per_token(prompt: str, prompt_tokens: int) -> float:
    """Characters a token in a counted prompt; the chat template's own tokens are in the
    count, so this errs low, and a haystack sized by it errs short, never over the window.

    >>> chars_per_token("储藏室" * 100, 600)
    0.5
    """
    return len(prompt) / max(1, prompt_tokens)


@dataclass(frozen=True, slots=True)
class Case:
    length: int
    depth: float
    needle: Needle

    @property
    def seed(self) -> int:
        return self.length * 1000 + round(self.depth * 100)


def cases(
    lengths: Sequence[int], depths: Sequence[float], needles: Sequence[Needle], per_cell: int = 2
) -> list[Case]:
    """``per_cell`` needles at each (length, depth), rotating through ``needles`` so every
    needle meets every length; the same list for both sides.

    >>> [(c.length, c.depth, c.needle.answer) for c in cases([256], [0.5], DEFAULT_NEEDLES, 2)]
    [(256, 0.5, '7319'), (256, 0.5, 'Lisbon')]
    """
    if not needles or per_cell < 1:
        raise ValueError("at least one needle and per_cell >= 1")
    out, k = [], 0
    for n in lengths:
        for d in depths:
            for _ in range(per_cell):
                out.append(Case(n, d, needles[k % len(needles)]))
                k += 1
    return out


def cases_by_language(
    lengths: Sequence[int],
    depths: Sequence[float],
    needles: Sequence[Needle],
    per_cell: int = 2,
    languages: Sequence[str] = LANGUAGES,
) -> list[Case]:
    """``cases`` for each language, with that language's needles.

    >>> cs = cases_by_language([256], [0.5], [*DEFAULT_NEEDLES, *NEEDLES_ZH], 1, ["en", "zh"])
    >>> [(c.needle.language, c.needle.answer) for c in cs]
    [('en', '7319'), ('zh', '7319')]
    >>> cases_by_language([256], [0.5], DEFAULT_NEEDLES, 1, ["ja"])
    Traceback (most recent call last):
    ...
    ValueError: no needles in ja
    """
    out = []
    for lang in languages:
        mine = [n for n in needles if n.language == lang]
        if not mine:
            raise ValueError(f"no needles in {lang}")
        out += cases(lengths, depths, mine, per_cell)
    return out


def recall(rows: Sequence[dict[str, Any]], side: str) -> float:
    hits = [bool(r[side]) for r in rows]
    return sum(hits) / len(hits) if hits else 0.0


def by_length(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recall per nominal length, for the plot."""
    out = []
    for n in sorted({r["length"] for r in rows}):
        sub = [r for r in rows if r["length"] == n]
        out.append({"length": n, "candidate": recall(sub, "candidate_hit"),
                    "reference": recall(sub, "reference_hit"), "cases": len(sub)})  # fmt: skip
    return out


def by_cell(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recall per (language, nominal length), with the prompt tokens the server counted."""
    out = []
    for lang, n in sorted({(r.get("language", "en"), r["length"]) for r in rows}):
        sub = [r for r in rows if r.get("language", "en") == lang and r["length"] == n]
        tokens = sorted(r["prompt_tokens"] for r in sub if r.get("prompt_tokens"))
        out.append({"language": lang, "length": n, "cases": len(sub),
                    "candidate": recall(sub, "candidate_hit"),
                    "reference": recall(sub, "reference_hit"),
                    "prompt_tokens": tokens[len(tokens) // 2] if tokens else None})  # fmt: skip
    return out


def judge_cells(cells: Sequence[dict[str, Any]], floor: float, tolerance: float) -> list[str]:
    """The cells that veto: under the floor, or behind the reference by more than tolerance.

    >>> judge_cells([{"language": "zh", "length": 8192, "candidate": 0.5, "reference": 1.0},
    ...              {"language": "en", "length": 8192, "candidate": 1.0, "reference": 1.0}],
    ...             0.75, 0.05)
    ['zh at 8,192 tokens: 50% vs reference 100%']
    >>> judge_cells([{"language": "ja", "length": 256, "candidate": 0.0, "reference": 0.0}],
    ...             0.5, 0.25)
    ['ja at 256 tokens: 0% vs reference 0%, under the floor 50%']
    """
    out = []
    for c in cells:
        if judge(c["candidate"], c["reference"], floor, tolerance)[0]:
            continue
        behind = c["candidate"] < c["reference"] - tolerance - 1e-12
        out.append(
            f"{c['language']} at {c['length']:,} tokens: {c['candidate']:.0%} vs reference "
            f"{c['reference']:.0%}" + ("" if behind else f", under the floor {floor:.0%}")
        )
    return out


def judge(cand: float, ref: float, floor: float, tolerance: float) -> tuple[bool, str]:
    """Veto when the candidate is under the floor, or under the reference minus tolerance.

    >>> judge(0.82, 0.998, 0.9, 0.05)
    (False, 'candidate recall 82.0% < floor 90.0%; candidate recall 82.0% < reference 99.8% - 5.0%')
    >>> judge(1.0, 1.0, 0.9, 0.05)[0]
    True
    """
    problems = []
    if cand < floor:
        problems.append(f"candidate recall {cand:.1%} < floor {floor:.1%}")
    if cand < ref - tolerance - 1e-12:
        problems.append(f"candidate recall {cand:.1%} < reference {ref:.1%} - {tolerance:.1%}")
    if problems:
        return False, "; ".join(problems)
    return True, f"candidate recall {cand:.1%} vs reference {ref:.1%}"


def hit(text: str, answer: str) -> bool:
    return needle_hit(text, answer)
