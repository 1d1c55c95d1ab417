"""Seeded worlds for the corpus: a shop, its customers and orders, documents, code, numbers.

Everything is drawn from a ``random.Random`` the caller seeds, from word lists written
for this project, so a seed gives the same world on every machine. Names are composed
from parts (a product is brand + adjective + noun + model number), which gives tens of
thousands of distinct entities from short lists: no two prompts need share a world.

Four languages: English (``en``), Spanish (``es``), Chinese (``zh``), Japanese (``ja``).
Each language has its own words; numbers, codes and prices stay in ASCII digits, as they
do in real shop traffic in all four.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LANGUAGES = ("en", "es", "zh", "ja")

_BRANDS = ("Lumo", "Kestrel", "Norda", "Vexa", "Orbin", "Tallis", "Quill", "Brava", "Senko", "Arvo")
_ADJ = {
    "en": ("compact", "wireless", "steel", "foldable", "waterproof", "quiet", "smart", "classic"),
    "es": ("compacto", "inalámbrico", "de acero", "plegable", "impermeable", "silencioso"),
    "zh": ("便携", "无线", "不锈钢", "可折叠", "防水", "静音", "智能", "经典"),
    "ja": ("コンパクト", "ワイヤレス", "ステンレス", "折りたたみ", "防水", "静音", "スマート"),
}
_NOUN = {
    "en": ("kettle", "headphones", "desk lamp", "backpack", "blender", "keyboard", "tent", "fan"),
    "es": (
        "hervidor",
        "auriculares",
        "lámpara",
        "mochila",
        "batidora",
        "teclado",
        "tienda",
        "ventilador",
    ),
    "zh": ("电水壶", "耳机", "台灯", "背包", "搅拌机", "键盘", "帐篷", "电风扇"),
    "ja": (
        "電気ケトル",
        "ヘッドホン",
        "デスクライト",
        "リュック",
        "ミキサー",
        "キーボード",
        "テント",
        "扇風機",
    ),
}
_CATEGORY = {
    "en": ("kitchen", "audio", "home", "outdoor", "office"),
    "es": ("cocina", "audio", "hogar", "exterior", "oficina"),
    "zh": ("厨房", "音频", "家居", "户外", "办公"),
    "ja": ("キッチン", "オーディオ", "ホーム", "アウトドア", "オフィス"),
}
_GIVEN = {
    "en": ("Alice", "Brian", "Chloe", "Daniel", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack"),
    "es": ("Lucía", "Mateo", "Sofía", "Diego", "Valeria", "Pablo", "Carmen", "Javier", "Elena"),
    "zh": ("伟", "芳", "娜", "敏", "静", "磊", "洋", "艳", "勇", "军"),
    "ja": ("翔太", "陽菜", "蓮", "結衣", "大輝", "美咲", "悠斗", "さくら", "健太", "愛"),
}
_FAMILY = {
    "en": ("Smith", "Jones", "Taylor", "Brown", "Wilson", "Evans", "Walker", "Hughes", "Wright"),
    "es": ("García", "Martínez", "López", "Sánchez", "Pérez", "Gómez", "Ruiz", "Díaz", "Moreno"),
    "zh": ("王", "李", "张", "刘", "陈", "杨", "赵", "黄", "周", "吴"),
    "ja": ("佐藤", "鈴木", "高橋", "田中", "伊藤", "渡辺", "山本", "中村", "小林", "加藤"),
}
_CITY = {
    "en": ("Riverton", "Ashford", "Maple Bay", "Northgate", "Eastwick", "Stonebridge"),
    "es": ("Valdeluz", "Puerto Claro", "Sierra Alta", "Montebello", "Aguaviva", "Los Olmos"),
    "zh": ("青河市", "南岭市", "东湖市", "北川市", "西山市", "临江市"),
    "ja": ("青葉市", "桜台市", "港北市", "緑川市", "東山市", "白浜市"),
}
_DEPT = {
    "en": ("billing", "logistics", "support", "research", "sales", "security"),
    "es": ("facturación", "logística", "soporte", "investigación", "ventas", "seguridad"),
    "zh": ("财务部", "物流部", "客服部", "研发部", "销售部", "安全部"),
    "ja": ("経理部", "物流部", "サポート部", "研究部", "営業部", "セキュリティ部"),
}
# Sentences for documents: a subject, a verb phrase and a detail, per language.
_DOC_SUBJECT = {
    "en": (
        "The facilities team",
        "The finance group",
        "The IT department",
        "The people team",
        "The sustainability committee",
        "The warehouse crew",
        "The design studio",
    ),
    "es": (
        "El equipo de instalaciones",
        "El grupo de finanzas",
        "El departamento de TI",
        "El equipo de personas",
        "El comité de sostenibilidad",
        "El equipo del almacén",
    ),
    "zh": (
        "后勤团队",
        "财务小组",
        "信息技术部",
        "人事团队",
        "可持续发展委员会",
        "仓库团队",
        "设计工作室",
    ),
    "ja": (
        "総務チーム",
        "財務グループ",
        "IT部門",
        "人事チーム",
        "サステナビリティ委員会",
        "倉庫チーム",
    ),
}
_DOC_VERB = {
    "en": (
        "reported that",
        "announced that",
        "reminded everyone that",
        "proposed that",
        "confirmed that",
        "warned that",
    ),
    "es": ("informó que", "anunció que", "recordó a todos que", "propuso que", "confirmó que"),
    "zh": ("报告说", "宣布", "提醒大家", "建议", "确认", "警告说"),
    "ja": ("によると", "の発表では", "の注意では", "の提案では", "の確認では"),
}
_DOC_DETAIL = {
    "en": (
        "the new badge readers work on every floor",
        "expense reports are due within {n} days",
        "the wiki moves to a new platform over {n} weekends",
        "{n} bicycle racks will be added",
        "the cafeteria opens {n} minutes earlier in winter",
        "{n} laptops need an update",
        "the parking rules for visitors change next month",
        "training budgets rise by {n} percent",
    ),
    "es": (
        "los lectores de tarjetas funcionan en todas las plantas",
        "los informes de gastos vencen en {n} días",
        "se añadirán {n} aparcabicis",
        "la cafetería abre {n} minutos antes en invierno",
        "{n} portátiles necesitan actualización",
        "el presupuesto de formación sube un {n} por ciento",
    ),
    "zh": (
        "每层楼的新门禁都已安装",
        "报销单须在{n}天内提交",
        "内部知识库将在{n}个周末内迁移",
        "将新增{n}个自行车停车架",
        "食堂冬季提前{n}分钟开门",
        "有{n}台笔记本需要更新",
        "访客停车规则下个月调整",
        "培训预算增加百分之{n}",
    ),
    "ja": (
        "各階に新しい入館カードリーダーが設置された",
        "経費精算は{n}日以内に提出すること",
        "社内Wikiは{n}回の週末で移行される",
        "駐輪場が{n}台分増設される",
        "食堂は冬の間{n}分早く開く",
        "{n}台のノートPCに更新が必要だ",
        "研修予算が{n}パーセント増える",
    ),
}


@dataclass(frozen=True, slots=True)
class Product:
    sku: str
    name: str
    category: str
    price: int  # in whole currency units: prices and totals stay exact integers
    stock: int


@dataclass(frozen=True, slots=True)
class Coupon:
    code: str
    percent: int
    min_total: int
    category: str | None  # None: any category


@dataclass(frozen=True, slots=True)
class Person:
    name: str
    city: str
    department: str
    employee_id: str
    age: int
    email: str


@dataclass(frozen=True, slots=True)
class Shop:
    name: str
    language: str
    products: tuple[Product, ...]
    coupons: tuple[Coupon, ...]
    shipping_fee: int
    free_shipping_over: int
    return_days: int


def person_name(rng: random.Random, lang: str) -> str:
    given, family = rng.choice(_GIVEN[lang]), rng.choice(_FAMILY[lang])
    return f"{family}{given}" if lang in ("zh", "ja") else f"{given} {family}"


def person(rng: random.Random, lang: str) -> Person:
    name = person_name(rng, lang)
    ident = f"E{rng.randrange(10000, 99999)}"
    return Person(
        name=name,
        city=rng.choice(_CITY[lang]),
        department=rng.choice(_DEPT[lang]),
        employee_id=ident,
        age=rng.randrange(21, 66),
        email=f"{ident.lower()}@example.com",
    )


def product(rng: random.Random, lang: str) -> Product:
    brand, adj, noun = rng.choice(_BRANDS), rng.choice(_ADJ[lang]), rng.choice(_NOUN[lang])
    model = f"{rng.choice('ABCDKMRSTX')}{rng.randrange(100, 999)}"
    sep = "" if lang in ("zh", "ja") else " "
    return Product(
        sku=f"SKU-{rng.randrange(10000, 99999)}",
        name=f"{brand} {adj}{sep}{noun} {model}",
        category=rng.choice(_CATEGORY[lang]),
        price=rng.randrange(8, 400),
        stock=rng.choice((0, 0, rng.randrange(1, 50), rng.randrange(1, 500))),
    )


def shop(rng: random.Random, lang: str, n_products: int) -> Shop:
    products = tuple(product(rng, lang) for _ in range(n_products))
    cats = sorted({p.category for p in products})
    coupons = tuple(
        Coupon(
            code=f"{rng.choice(('SAVE', 'WELCOME', 'VIP', 'FLASH'))}{rng.randrange(5, 40)}",
            percent=rng.choice((5, 10, 15, 20, 25)),
            min_total=rng.choice((0, 50, 100, 200)),
            category=rng.choice((None, *cats)),
        )
        for _ in range(rng.randrange(2, 5))
    )
    return Shop(
        name=f"{rng.choice(_BRANDS)} {rng.choice(('Market', 'Store', 'Outlet', 'Depot'))}",
        language=lang,
        products=products,
        coupons=coupons,
        shipping_fee=rng.choice((5, 8, 10, 12)),
        free_shipping_over=rng.choice((60, 100, 150)),
        return_days=rng.choice((14, 30, 45)),
    )


def order_total(shop_: Shop, lines: list[tuple[Product, int]], coupon: Coupon | None) -> int:
    """The shop's rule, exactly: the coupon takes its percent off the matching lines'
    subtotal (rounded down) when the order's subtotal reaches its minimum; shipping is
    added unless the subtotal after the discount reaches the free-shipping bar."""
    subtotal = sum(p.price * q for p, q in lines)
    discount = 0
    if coupon is not None and subtotal >= coupon.min_total:
        eligible = sum(p.price * q for p, q in lines if coupon.category in (None, p.category))
        discount = eligible * coupon.percent // 100
    after = subtotal - discount
    return after + (0 if after >= shop_.free_shipping_over else shop_.shipping_fee)


def document(rng: random.Random, lang: str, sentences: int) -> list[str]:
    """Plausible office notes, one sentence per item, each with its own number."""
    out = []
    for _ in range(sentences):
        s, v = rng.choice(_DOC_SUBJECT[lang]), rng.choice(_DOC_VERB[lang])
        d = rng.choice(_DOC_DETAIL[lang]).format(n=rng.randrange(2, 60))
        if lang == "zh":
            out.append(f"{s}{v}{d}。")
        elif lang == "ja":
            out.append(f"{s}{v}、{d}。")
        else:
            out.append(f"{s} {v} {d}.")
    return out


_FUNC_NAMES = (
    "total_price",
    "moving_average",
    "count_words",
    "clamp",
    "merge_counts",
    "parse_duration",
    "chunk",
    "dedupe",
    "is_palindrome",
    "median",
    "flatten",
    "normalize_email",
    "retry_delay",
    "percent_change",
    "bucket_of",
)


@dataclass(frozen=True, slots=True)
class CodeSnippet:
    name: str
    source: str
    call: str
    result: str  # what ``call`` returns, computed here: a checkable answer


def code_snippet(rng: random.Random) -> CodeSnippet:
    """A small Python function with a known result on a known call."""
    kind = rng.randrange(5)
    name = rng.choice(_FUNC_NAMES) + f"_{rng.randrange(10, 99)}"
    a, b, c = rng.randrange(2, 9), rng.randrange(1, 20), rng.randrange(2, 6)
    xs = [rng.randrange(1, 30) for _ in range(rng.randrange(4, 8))]
    if kind == 0:
        src = f"def {name}(xs):\n    total = 0\n    for x in xs:\n        if x % {c} == 0:\n            total += x * {a}\n    return total\n"
        res = sum(x * a for x in xs if x % c == 0)
    elif kind == 1:
        src = f"def {name}(xs):\n    return [x + {b} for x in xs if x > {a}]\n"
        res = [x + b for x in xs if x > a]  # type: ignore[assignment]
    elif kind == 2:
        src = f"def {name}(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x * {a} % {c + 5} > best % {c + 5}:\n            best = x\n    return best\n"
        best = xs[0]
        for x in xs[1:]:
            if x * a % (c + 5) > best % (c + 5):
                best = x
        res = best
    elif kind == 3:
        src = f"def {name}(xs):\n    return max(xs) - min(xs) + {b}\n"
        res = max(xs) - min(xs) + b
    else:
        src = f"def {name}(xs):\n    n = 0\n    for i, x in enumerate(xs):\n        n += i * x\n    return n - {b}\n"
        res = sum(i * x for i, x in enumerate(xs)) - b
    return CodeSnippet(name, src, f"{name}({xs})", str(res))
