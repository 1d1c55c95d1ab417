"""A prompt's script or language and its length in tokens, estimated cheaply. Pure.

The gateway tags every request with them when it plans it (``gateway/chain/slices.py``),
on the request path, without a tokenizer or a language model: a few regular
expressions over at most ``MAX_CHARS`` characters of text.

**Language.** Read from the first and last ``LANGUAGE_SPAN`` characters. Letters are
counted by script, in units that weigh alike: one Han,
kana or hangul character is one unit (a CJK character carries about a word), one
run of Latin, Cyrillic or Arabic letters is one unit. Han with kana (at least
``KANA_SHARE`` of the CJK units) is Japanese, Han alone Chinese, hangul Korean.
A script with under ``DOMINANT`` of the units is ``mixed``. Latin text is told
apart as English or Spanish by a tiny stopword count (Spanish also by ``ñ ¿ ¡``),
``latin`` when neither wins (or French, German, Portuguese or Italian words do).
Fenced code (a Markdown triple-backtick block) is left out when prose remains: a
Chinese question about a Python function is Chinese.

**Length.** About one token per CJK character (multilingual tokenizers: Llama 3,
Qwen), 1.4 per Latin word (subwords), one per punctuation mark, one per three
digits, a few per message for the chat template. The buckets are the corpus's:
``short`` under 128, ``medium`` under 1024, ``long`` from 1024. The estimate is a
tokenizer's order of magnitude, not its count. On the traffic corpus's 3,200 prompts
(``corpus/prompts.jsonl.gz``, lengths measured by SmolLM2's English-centric tokenizer)
it puts 96 % of English and 87 % of Spanish prompts in the tokenizer's bucket, and CJK
prompts lower, where that tokenizer spends about two tokens per character (76 % of
Chinese, 69 % of Japanese agree). A producer that knows the count sets the tag itself.
The language agrees with the corpus's on all 3,200 (the stopword lists were written
against it; ``tests/unit/test_slices.py`` checks other text too).
"""

from __future__ import annotations

import re

# Per text piece: enough to pass the ``long`` threshold.
MAX_CHARS = 32_768
# A language is told from the head and the tail of a long text (an instruction often
# comes after its context): 2 x 2,048 characters.
LANGUAGE_SPAN = 2048
KANA_SHARE = 0.1
DOMINANT = 0.6
SHORT_BELOW = 128
MEDIUM_BELOW = 1024

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_KANA = "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"
_LATIN = "A-Za-z\u00c0-\u024f"
_CYRILLIC = "\u0400-\u04ff\u0500-\u052f"
_ARABIC = "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff"

_UNITS = {
    "han": re.compile(f"[{_HAN}]"),
    "kana": re.compile(f"[{_KANA}]"),
    "hangul": re.compile(f"[{_HANGUL}]"),
    "latin": re.compile(f"[{_LATIN}]+"),
    "cyrillic": re.compile(f"[{_CYRILLIC}]+"),
    "arabic": re.compile(f"[{_ARABIC}]+"),
}
# Letters of any other script (Greek, Hebrew, Devanagari, Thai...): one unit per run.
_OTHER_LETTERS = re.compile(f"[^\\W\\d_{_HAN}{_KANA}{_HANGUL}{_LATIN}{_CYRILLIC}{_ARABIC}]+")
# A Latin word standing alone: "E47171" holds no word "e".
_WORD = re.compile(f"(?<!\\w)[{_LATIN}]+(?!\\w)")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_CJK = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]")
_LETTERS = re.compile(f"[^\\W\\d_{_HAN}{_KANA}{_HANGUL}]+")
_DIGITS = re.compile(r"\d+")
_PUNCT = re.compile(r"[^\w\s]")

# fmt: off
_EN = frozenset({
    "the", "an", "and", "of", "to", "in", "is", "are", "was", "were", "be", "been", "for", "on",
    "with", "that", "this", "these", "it", "its", "you", "your", "we", "our", "they", "their",
    "by", "from", "as", "at", "or", "not", "no", "but", "if", "then", "what", "which", "who",
    "when", "where", "why", "how", "does", "do", "did", "can", "will", "would", "should",
    "please", "only", "all", "each",
})
_ES = frozenset({
    "el", "la", "los", "las", "lo", "un", "una", "unos", "unas", "de", "del", "y", "en", "que",
    "es", "son", "está", "están", "fue", "ser", "por", "para", "con", "sin", "se", "su", "sus",
    "al", "como", "más", "pero", "si", "qué", "cuál", "cuáles", "cómo", "dónde", "cuándo",
    "quién", "favor", "solo", "muy", "este", "esta", "estos", "estas", "ese", "esa", "le", "les",
    "nos",
})
_ES_MARKS = re.compile("[ñ¿¡]")
# Frequent words of other Latin-script languages (French, German, Portuguese, Italian),
# none of them English or Spanish: when they win, the text is ``latin``, neither en nor es.
_OTHER_LATIN = frozenset({
    "le", "les", "des", "est", "une", "et", "je", "il", "vous", "nous", "pas", "qui", "dans",
    "pour", "sur", "avec", "du", "au", "ce", "cette", "sont", "der", "die", "das", "und", "ist",
    "nicht", "ein", "eine", "ich", "sie", "mit", "dem", "zu", "auf", "für", "não", "você", "os",
    "uma", "com", "são", "ao", "pelo", "pela", "em", "gli", "della", "che", "è", "non", "sono",
    "per",
}) - _EN - _ES
# fmt: on
# Fewest stopwords a winner needs (it must also beat the others strictly).
MIN_STOPWORDS = 1

LANGUAGES = ("en", "es", "latin", "zh", "ja", "ko", "cyrillic", "arabic", "mixed", "other")


def language_of(text: str) -> str:
    """The language (or, where words cannot tell it cheaply, the script) of ``text``.

    One of ``LANGUAGES``; ``other`` for text without letters or in another script.

    >>> language_of("Where is my order? It was due on Monday.")
    'en'
    >>> language_of("¿Dónde está mi pedido? Debía llegar el lunes.")
    'es'
    >>> language_of("我的订单在哪里？应该星期一到的。")
    'zh'
    >>> language_of("注文はどこですか？月曜日に届く予定でした。")
    'ja'
    >>> language_of("제 주문은 어디에 있나요?")
    'ko'
    >>> language_of("Где мой заказ?"), language_of("أين طلبي؟")
    ('cyrillic', 'arabic')
    >>> language_of("翻译成英文: The parcel left on Monday")
    'mixed'
    >>> language_of("12 + 30 = ?")
    'other'
    """
    if len(text) > 2 * LANGUAGE_SPAN:
        text = text[:LANGUAGE_SPAN] + "\n" + text[-LANGUAGE_SPAN:]
    prose = _FENCE.sub(" ", text)
    if _LETTERS.search(prose) or _CJK.search(prose):
        text = prose
    units = {name: len(rx.findall(text)) for name, rx in _UNITS.items()}
    units["other"] = len(_OTHER_LETTERS.findall(text))
    total = sum(units.values())
    if total == 0:
        return "other"
    cjk = units["han"] + units["kana"]
    groups = {
        ("ja" if units["kana"] >= KANA_SHARE * cjk else "zh"): cjk,
        "ko": units["hangul"],
        "latin": units["latin"],
        "cyrillic": units["cyrillic"],
        "arabic": units["arabic"],
        "other": units["other"],
    }
    script, n = max(groups.items(), key=lambda kv: kv[1])
    if n < DOMINANT * total:
        return "mixed"
    return _latin_language(text) if script == "latin" else script


def _latin_language(text: str) -> str:
    """English or Spanish by stopwords (and Spanish's own marks); else ``latin``.

    >>> _latin_language("Longtemps, je me suis couché de bonne heure.")
    'latin'
    """
    low = text.lower()
    words = _WORD.findall(low)
    en = sum(w in _EN for w in words)
    es = sum(w in _ES for w in words) + len(_ES_MARKS.findall(low))
    other = sum(w in _OTHER_LATIN for w in words)
    best = max(en, es, other)
    if best < MIN_STOPWORDS or [en, es, other].count(best) > 1 or other == best:
        return "latin"
    return "en" if en == best else "es"


def estimate_tokens(text: str) -> float:
    """About how many tokens ``text`` is (see the module docstring), read up to ``MAX_CHARS``.

    >>> estimate_tokens("我喜欢猫")
    4.0
    >>> round(estimate_tokens("The cat sat."), 1)
    5.2
    >>> estimate_tokens("Order 1234567")
    4.4
    """
    text = text[:MAX_CHARS]
    cjk = len(_CJK.findall(text))
    words = len(_LETTERS.findall(text))
    digits = sum(-(-len(d) // 3) for d in _DIGITS.findall(text))
    return cjk + 1.4 * words + digits + len(_PUNCT.findall(text))


def length_bucket(tokens: float) -> str:
    """``short`` under 128 tokens, ``medium`` under 1024, ``long`` from 1024.

    >>> [length_bucket(t) for t in (0, 127, 128, 1023, 1024)]
    ['short', 'short', 'medium', 'medium', 'long']
    """
    return "short" if tokens < SHORT_BELOW else ("medium" if tokens < MEDIUM_BELOW else "long")
