"""Task families: one seeded world in, one prompt out, with its tags and checkable answer.

Eleven families, each the way a platform's traffic asks for it: customer service over a
shop's catalogue with coupon and order rules (the launch scenario), JSON extraction
against a schema, tool-call arguments, question answering over a passage, summarisation,
translation, word problems with a numeric answer, code explanation and completion,
classification, multi-turn follow-ups, and long-context retrieval.

``size`` asks for an input length (``short`` < 128 tokens, ``medium`` 128–1k, ``long``
1k–4k); the family grows its context (catalogue lines, records, sentences) to reach it.
The tag a prompt carries is the length the model's tokenizer measured (:mod:`.build`),
not the size asked for.

Decoding follows the family, as real traffic mixes it: greedy for JSON, tools,
extraction and checkable answers; sampled (T 0.7, top-p 0.9) for chat.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantdrift.detectors.script import length_bucket
from quantdrift.lab.corpus import worlds as w

TEMPERATURE = 0.7
TOP_P = 0.9
# Items of context per size: (min, max) catalogue lines, records or sentences.
_SPAN = {"short": (1, 3), "medium": (8, 30), "long": (70, 200)}
_CJK_SPAN = {"short": (1, 2), "medium": (6, 22), "long": (50, 150)}


@dataclass(frozen=True, slots=True)
class CorpusPrompt:
    """One request of the corpus: what a client sends, and what only the lab knows."""

    prompt_id: str
    family: str
    language: str
    messages: list[dict[str, str]]
    decoding: str  # greedy | sampled
    max_tokens: int
    output_kind: str  # text | json | code | number | label
    json_schema: dict[str, Any] | None = None
    expected_keys: list[str] | None = None
    answer: str | None = None
    input_tokens: int | None = None  # measured by build.measure
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def temperature(self) -> float:
        return TEMPERATURE if self.decoding == "sampled" else 0.0

    @property
    def top_p(self) -> float:
        return TOP_P if self.decoding == "sampled" else 1.0

    @property
    def length_bucket(self) -> str | None:
        return None if self.input_tokens is None else length_bucket(self.input_tokens)

    def checkable(self) -> tuple[str, str] | None:
        """(expected answer, how to check it) for the outcome test, or None.

        A ``number``, ``json`` or ``label`` task is checked as such; a ``text`` task by
        its answer's text, unless that answer is a number (a customer-service total sits
        among other figures in a free answer, so "the last number" would misread it).

        >>> CorpusPrompt("p", "word_problem", "en", [], "greedy", 32, "number",
        ...              answer="42").checkable()
        ('42', 'number')
        >>> CorpusPrompt("p", "customer_service", "en", [], "sampled", 96, "text",
        ...              answer="42.5").checkable() is None
        True
        """
        if self.answer is None or self.output_kind not in ("number", "json", "label", "text"):
            return None
        if self.output_kind == "text" and re.fullmatch(r"-?\d+(\.\d+)?", self.answer.strip()):
            return None
        return self.answer, self.output_kind

    def tags(self) -> dict[str, str]:
        """The slice tags a gateway would attach, plus the lab's task family."""
        out = {
            "task": self.family,
            "language": self.language,
            "output": self.output_kind,
            "decoding": self.decoding,
        }
        if self.input_tokens is not None:
            out["length"] = length_bucket(self.input_tokens)
        return out

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "extra"}  # type: ignore[attr-defined]
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CorpusPrompt:
        return cls(**d)


def _n(rng: random.Random, lang: str, size: str) -> int:
    lo, hi = (_CJK_SPAN if lang in ("zh", "ja") else _SPAN)[size]
    return rng.randint(lo, hi)


def _catalogue(shop: w.Shop) -> str:
    return "\n".join(
        f"- {p.sku} | {p.name} | {p.category} | {p.price} | {p.stock}" for p in shop.products
    )


def _policy(shop: w.Shop, lang: str) -> str:
    coupons = "; ".join(
        f"{c.code}: -{c.percent}% "
        + (f"({c.category}) " if c.category else "")
        + (f">= {c.min_total}" if c.min_total else "")
        for c in shop.coupons
    )
    t = {
        "en": "You are the assistant of {name}. Shipping costs {fee}, free from {free} after discounts. "
        "Returns within {days} days. Coupons (one per order, on matching items, if the subtotal "
        "reaches the minimum): {coupons}.\nCatalogue (sku | name | category | price | stock):\n",
        "es": "Eres el asistente de {name}. El envío cuesta {fee}, gratis desde {free} tras descuentos. "
        "Devoluciones en {days} días. Cupones (uno por pedido, sobre artículos que coinciden, si el "
        "subtotal llega al mínimo): {coupons}.\nCatálogo (sku | nombre | categoría | precio | stock):\n",
        "zh": "你是{name}的客服助手。运费{fee}元，折后满{free}元包邮。{days}天内可退货。优惠券（每单限用一张，"
        "仅对符合类别的商品，小计达到门槛才可用）：{coupons}。\n商品目录（编号 | 名称 | 类别 | 价格 | 库存）：\n",
        "ja": "あなたは{name}のアシスタントです。送料は{fee}円、割引後{free}円以上で無料。返品は{days}日以内。"
        "クーポン（1注文1枚、対象カテゴリの商品のみ、小計が最低額以上の場合）：{coupons}。\n"
        "カタログ（SKU | 商品名 | カテゴリ | 価格 | 在庫）：\n",
    }[lang]
    return t.format(
        name=shop.name,
        fee=shop.shipping_fee,
        free=shop.free_shipping_over,
        days=shop.return_days,
        coupons=coupons,
    )


def customer_service(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    shop = w.shop(rng, lang, max(3, _n(rng, lang, size)))
    in_stock = [p for p in shop.products if p.stock > 0] or list(shop.products)
    lines = [(p, rng.randrange(1, 4)) for p in rng.sample(in_stock, min(len(in_stock), 2))]
    coupon = rng.choice((None, *shop.coupons))
    total = w.order_total(shop, lines, coupon)
    items = {
        "en": " and ".join(f"{q} x {p.sku}" for p, q in lines),
        "es": " y ".join(f"{q} x {p.sku}" for p, q in lines),
        "zh": "和".join(f"{q}件{p.sku}" for p, q in lines),
        "ja": "と".join(f"{p.sku}を{q}個" for p, q in lines),
    }[lang]
    code = coupon.code if coupon else None
    ask = {
        "en": f"Hi, I want to order {items}"
        + (f" with coupon {code}" if code else "")
        + ". How much will I pay in total, and can I still return it next month?",
        "es": f"Hola, quiero pedir {items}"
        + (f" con el cupón {code}" if code else "")
        + ". ¿Cuánto pagaré en total y podré devolverlo el mes que viene?",
        "zh": f"你好，我想买{items}"
        + (f"，用优惠券{code}" if code else "")
        + "。一共要付多少钱？下个月还能退货吗？",
        "ja": f"こんにちは、{items}注文したいです"
        + (f"。クーポン{code}を使います" if code else "")
        + "。合計はいくらですか？来月でも返品できますか？",
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="customer_service",
        language=lang,
        messages=[
            {"role": "system", "content": _policy(shop, lang) + _catalogue(shop)},
            {"role": "user", "content": ask},
        ],
        decoding="sampled",
        max_tokens=96,
        output_kind="text",
        answer=str(total),
    )


_EXTRACT_KEYS = ("name", "city", "department", "employee_id", "age")


def json_extraction(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    target = w.person(rng, lang)
    others = [w.person(rng, lang) for _ in range(max(0, _n(rng, lang, size) - 1) // 3)]
    note = {
        "en": "{name}, aged {age}, works in {department} in {city}. Employee number {employee_id}.",
        "es": "{name}, de {age} años, trabaja en {department} en {city}. Número de empleado {employee_id}.",
        "zh": "{name}，{age}岁，在{city}的{department}工作，员工编号{employee_id}。",
        "ja": "{name}さん（{age}歳）は{city}の{department}で働いています。社員番号は{employee_id}です。",
    }[lang]
    context = " ".join(w.document(rng, lang, len(others))) if others else ""
    text = (context + " " if context else "") + note.format(**dataclasses.asdict(target))
    keys = list(_EXTRACT_KEYS)
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer" if k == "age" else "string"} for k in keys},
        "required": keys,
        "additionalProperties": False,
    }
    ask = {
        "en": "Extract the employee described at the end of this text as JSON with the keys "
        f"{', '.join(keys)}. Answer with JSON only.\n\n",
        "es": f"Extrae el empleado descrito al final del texto como JSON con las claves {', '.join(keys)}. "
        "Responde solo con JSON.\n\n",
        "zh": f"请把下面文字最后描述的员工信息提取为JSON，键为{', '.join(keys)}。只回答JSON。\n\n",
        "ja": f"次の文章の最後に書かれた社員の情報を、キー{', '.join(keys)}のJSONとして抽出してください。"
        "JSONのみで答えてください。\n\n",
    }[lang]
    expected = {k: getattr(target, k) for k in keys}
    return CorpusPrompt(
        prompt_id="",
        family="json_extraction",
        language=lang,
        messages=[{"role": "user", "content": ask + text}],
        decoding="greedy",
        max_tokens=96,
        output_kind="json",
        json_schema=schema,
        expected_keys=keys,
        answer=json.dumps(expected, ensure_ascii=False, sort_keys=True),
    )


def tool_call(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    shop = w.shop(rng, lang, max(2, _n(rng, lang, size)))
    p = rng.choice(shop.products)
    qty = rng.randrange(1, 6)
    city = rng.choice(w._CITY[lang])
    tool = {
        "name": "create_order",
        "description": "Create an order for one product.",
        "parameters": {
            "type": "object",
            "properties": {
                "sku": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1},
                "ship_to_city": {"type": "string"},
            },
            "required": ["sku", "quantity", "ship_to_city"],
        },
    }
    ask = {
        "en": f"Please send {qty} of the {p.name} to {city}.",
        "es": f"Por favor, envía {qty} unidades de {p.name} a {city}.",
        "zh": f"请把{qty}件{p.name}寄到{city}。",
        "ja": f"{p.name}を{qty}個、{city}に送ってください。",
    }[lang]
    sys_ = {
        "en": "You call tools. Reply with only the JSON arguments of the call to make.\nTool: ",
        "es": "Llamas herramientas. Responde solo con los argumentos JSON de la llamada.\nHerramienta: ",
        "zh": "你负责调用工具。只回复要调用的工具的JSON参数。\n工具：",
        "ja": "あなたはツールを呼び出します。呼び出しのJSON引数だけを返してください。\nツール：",
    }[lang]
    args = {"sku": p.sku, "quantity": qty, "ship_to_city": city}
    return CorpusPrompt(
        prompt_id="",
        family="tool_call",
        language=lang,
        messages=[
            {
                "role": "system",
                "content": sys_ + json.dumps(tool, ensure_ascii=False) + "\n" + _catalogue(shop),
            },
            {"role": "user", "content": ask},
        ],
        decoding="greedy",
        max_tokens=64,
        output_kind="json",
        json_schema=tool["parameters"],  # type: ignore[arg-type]
        expected_keys=["sku", "quantity", "ship_to_city"],
        answer=json.dumps(args, ensure_ascii=False, sort_keys=True),
    )


def passage_qa(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    sentences = w.document(rng, lang, _n(rng, lang, size) + 2)
    who = w.person(rng, lang)
    fact = {
        "en": f"The project lead, {who.name}, moved to {who.city}.",
        "es": f"La persona responsable del proyecto, {who.name}, se mudó a {who.city}.",
        "zh": f"项目负责人{who.name}搬到了{who.city}。",
        "ja": f"プロジェクトリーダーの{who.name}さんは{who.city}に引っ越した。",
    }[lang]
    sentences.insert(rng.randrange(len(sentences) + 1), fact)
    sep = "" if lang in ("zh", "ja") else " "
    q = {
        "en": "Read the passage and answer: to which city did the project lead move?",
        "es": "Lee el texto y responde: ¿a qué ciudad se mudó la persona responsable del proyecto?",
        "zh": "阅读短文并回答：项目负责人搬到了哪个城市？",
        "ja": "文章を読んで答えてください：プロジェクトリーダーはどの市に引っ越しましたか？",
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="passage_qa",
        language=lang,
        messages=[{"role": "user", "content": sep.join(sentences) + "\n\n" + q}],
        decoding="greedy",
        max_tokens=48,
        output_kind="text",
        answer=who.city,
    )


def summarisation(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    k = rng.choice((1, 2, 3))
    sep = "" if lang in ("zh", "ja") else " "
    doc = sep.join(w.document(rng, lang, _n(rng, lang, size) + 2))
    ask = {
        "en": f"Summarise these meeting notes in {k} sentence(s):\n\n",
        "es": f"Resume estas notas de reunión en {k} frase(s):\n\n",
        "zh": f"请用{k}句话总结以下会议记录：\n\n",
        "ja": f"次の会議メモを{k}文で要約してください：\n\n",
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="summarisation",
        language=lang,
        messages=[{"role": "user", "content": ask + doc}],
        decoding="sampled",
        max_tokens=96,
        output_kind="text",
    )


_TARGET = {"en": "Spanish", "es": "English", "zh": "English", "ja": "English"}


def translation(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    """Source text in ``lang`` (the prompt's language tag), translated out of it."""
    sep = "" if lang in ("zh", "ja") else " "
    src = sep.join(w.document(rng, lang, max(1, _n(rng, lang, size) // 2)))
    target = rng.choice(("French", "German")) if rng.random() < 0.3 else _TARGET[lang]
    ask = {
        "en": f"Translate into {target}:\n\n",
        "es": f"Traduce al {dict(English='inglés', French='francés', German='alemán').get(target, target)}:\n\n",
        "zh": f"请翻译成{dict(English='英文', French='法文', German='德文').get(target, target)}：\n\n",
        "ja": f"{dict(English='英語', French='フランス語', German='ドイツ語').get(target, target)}に翻訳してください：\n\n",
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="translation",
        language=lang,
        messages=[{"role": "user", "content": ask + src}],
        decoding="sampled",
        max_tokens=96,
        output_kind="text",
    )


def word_problem(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    a, b, c = rng.randrange(3, 40), rng.randrange(2, 12), rng.randrange(1, 30)
    kind = rng.randrange(3)
    who = w.person_name(rng, lang)
    if kind == 0:
        answer = a * b - c
        t = {
            "en": f"{who} buys {b} boxes with {a} pens each and gives away {c} pens. How many pens are left?",
            "es": f"{who} compra {b} cajas con {a} bolígrafos cada una y regala {c}. ¿Cuántos bolígrafos quedan?",
            "zh": f"{who}买了{b}盒笔，每盒{a}支，送出{c}支。还剩多少支笔？",
            "ja": f"{who}さんはペンが{a}本ずつ入った箱を{b}箱買い、{c}本をあげました。ペンは何本残っていますか？",
        }
    elif kind == 1:
        answer = (a + c) * b
        t = {
            "en": f"A ticket costs {a} and a snack costs {c}. {who} buys both for {b} people. What is the total?",
            "es": f"Una entrada cuesta {a} y un aperitivo {c}. {who} compra ambos para {b} personas. ¿Cuál es el total?",
            "zh": f"一张票{a}元，一份零食{c}元。{who}为{b}个人各买一份。一共多少钱？",
            "ja": f"チケットは{a}円、お菓子は{c}円です。{who}さんは{b}人分ずつ買いました。合計はいくらですか？",
        }
    else:
        answer = a * b + c * b
        t = {
            "en": f"A train travels {a} km per hour for {b} hours, then {c} km per hour for {b} hours. How far does it go?",
            "es": f"Un tren va a {a} km por hora durante {b} horas y luego a {c} km por hora durante {b} horas. ¿Qué distancia recorre?",
            "zh": f"一列火车以每小时{a}公里行驶{b}小时，再以每小时{c}公里行驶{b}小时。一共行驶多少公里？",
            "ja": f"電車が時速{a}kmで{b}時間、その後時速{c}kmで{b}時間走りました。合計で何km走りましたか？",
        }
    tail = {
        "en": " Answer with the number only.",
        "es": " Responde solo con el número.",
        "zh": "只回答数字。",
        "ja": "数字だけで答えてください。",
    }[lang]
    ctx = ""
    if size != "short":
        sep = "" if lang in ("zh", "ja") else " "
        ctx = sep.join(w.document(rng, lang, _n(rng, lang, size))) + "\n\n"
    return CorpusPrompt(
        prompt_id="",
        family="word_problem",
        language=lang,
        messages=[{"role": "user", "content": ctx + t[lang] + tail}],
        decoding="greedy",
        max_tokens=32,
        output_kind="number",
        answer=str(answer),
    )


def code(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    snippets = [w.code_snippet(rng) for _ in range(max(1, _n(rng, lang, size) // 4))]
    main = snippets[-1]
    explain = rng.random() < 0.5
    source = "\n".join(s.source for s in snippets)
    if explain:
        ask = {
            "en": f"Explain briefly what {main.name} does.",
            "es": f"Explica brevemente qué hace {main.name}.",
            "zh": f"请简要解释{main.name}的作用。",
            "ja": f"{main.name}が何をするか簡潔に説明してください。",
        }[lang]
    else:
        ask = {
            "en": f"What does {main.call} return? Answer with the value only.",
            "es": f"¿Qué devuelve {main.call}? Responde solo con el valor.",
            "zh": f"{main.call}返回什么？只回答结果。",
            "ja": f"{main.call}は何を返しますか？値だけを答えてください。",
        }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="code",
        language=lang,
        messages=[{"role": "user", "content": f"```python\n{source}```\n\n{ask}"}],
        decoding="sampled" if explain else "greedy",
        max_tokens=96 if explain else 32,
        output_kind="code" if explain else "number",
        answer=None if explain else main.result,
    )


_LABELS = ("billing", "shipping", "returns", "technical")
_COMPLAINT = {
    "billing": {
        "en": "I was charged twice for order {o}.",
        "es": "Me cobraron dos veces el pedido {o}.",
        "zh": "订单{o}被扣了两次款。",
        "ja": "注文{o}で二重に請求されました。",
    },
    "shipping": {
        "en": "My parcel {o} has not arrived after ten days.",
        "es": "Mi paquete {o} no ha llegado después de diez días.",
        "zh": "我的包裹{o}十天了还没到。",
        "ja": "荷物{o}が10日経っても届きません。",
    },
    "returns": {
        "en": "I want to send back the item from order {o}, it is the wrong size.",
        "es": "Quiero devolver el artículo del pedido {o}, la talla no es correcta.",
        "zh": "订单{o}的商品尺寸不对，我想退货。",
        "ja": "注文{o}の商品はサイズが違うので返品したいです。",
    },
    "technical": {
        "en": "The app crashes when I open order {o}.",
        "es": "La aplicación se cierra cuando abro el pedido {o}.",
        "zh": "我打开订单{o}时应用会崩溃。",
        "ja": "注文{o}を開くとアプリが落ちます。",
    },
}


def classification(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    label = rng.choice(_LABELS)
    o = f"#{rng.randrange(100000, 999999)}"
    msg = _COMPLAINT[label][lang].format(o=o)
    if size != "short":
        sep = "" if lang in ("zh", "ja") else " "
        msg = sep.join(w.document(rng, lang, _n(rng, lang, size) // 2)) + sep + msg
    ask = {
        "en": f"Classify this customer message as one of: {', '.join(_LABELS)}. Answer with the label only.\n\n",
        "es": f"Clasifica este mensaje de cliente como uno de: {', '.join(_LABELS)}. Responde solo con la etiqueta.\n\n",
        "zh": f"请把这条客户消息归类为以下之一：{', '.join(_LABELS)}。只回答标签。\n\n",
        "ja": f"この顧客メッセージを次のどれかに分類してください：{', '.join(_LABELS)}。ラベルだけを答えてください。\n\n",
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="classification",
        language=lang,
        messages=[{"role": "user", "content": ask + msg}],
        decoding="greedy",
        max_tokens=8,
        output_kind="label",
        answer=label,
    )


def multi_turn(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    shop = w.shop(rng, lang, max(3, _n(rng, lang, size)))
    a, b = rng.sample(list(shop.products), 2)
    turns = {
        "en": (
            f"Do you have the {a.name}?",
            f"Yes, {a.name} costs {a.price}.",
            f"And what about {b.sku}? Which of the two would you recommend for a gift?",
        ),
        "es": (
            f"¿Tienen el {a.name}?",
            f"Sí, {a.name} cuesta {a.price}.",
            f"¿Y {b.sku}? ¿Cuál de los dos recomiendas para regalar?",
        ),
        "zh": (
            f"你们有{a.name}吗？",
            f"有的，{a.name}售价{a.price}元。",
            f"那{b.sku}呢？送礼的话你推荐哪个？",
        ),
        "ja": (
            f"{a.name}はありますか？",
            f"はい、{a.name}は{a.price}円です。",
            f"では{b.sku}は？プレゼントならどちらがおすすめですか？",
        ),
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="multi_turn",
        language=lang,
        messages=[
            {"role": "system", "content": _policy(shop, lang) + _catalogue(shop)},
            {"role": "user", "content": turns[0]},
            {"role": "assistant", "content": turns[1]},
            {"role": "user", "content": turns[2]},
        ],
        decoding="sampled",
        max_tokens=96,
        output_kind="text",
    )


def long_retrieval(rng: random.Random, lang: str, size: str) -> CorpusPrompt:
    people = [w.person(rng, lang) for _ in range(max(3, _n(rng, lang, size)))]
    target = rng.choice(people)
    rows = "\n".join(
        f"{p.employee_id} | {p.name} | {p.department} | {p.city} | {p.age}" for p in people
    )
    ask = {
        "en": f"Records (id | name | department | city | age):\n{rows}\n\nIn which city does employee {target.employee_id} work? Answer with the city only.",
        "es": f"Registros (id | nombre | departamento | ciudad | edad):\n{rows}\n\n¿En qué ciudad trabaja el empleado {target.employee_id}? Responde solo con la ciudad.",
        "zh": f"记录（编号 | 姓名 | 部门 | 城市 | 年龄）：\n{rows}\n\n员工{target.employee_id}在哪个城市工作？只回答城市。",
        "ja": f"記録（ID | 氏名 | 部署 | 市 | 年齢）：\n{rows}\n\n社員{target.employee_id}はどの市で働いていますか？市の名前だけを答えてください。",
    }[lang]
    return CorpusPrompt(
        prompt_id="",
        family="long_retrieval",
        language=lang,
        messages=[{"role": "user", "content": ask}],
        decoding="greedy",
        max_tokens=24,
        output_kind="text",
        answer=target.city,
    )


Family = Callable[[random.Random, str, str], CorpusPrompt]

FAMILIES: dict[str, Family] = {
    "customer_service": customer_service,
    "json_extraction": json_extraction,
    "tool_call": tool_call,
    "passage_qa": passage_qa,
    "summarisation": summarisation,
    "translation": translation,
    "word_problem": word_problem,
    "code": code,
    "classification": classification,
    "multi_turn": multi_turn,
    "long_retrieval": long_retrieval,
}
