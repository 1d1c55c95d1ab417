# ruff: noqa: E501  (the built-in data tables read best one record a line)
"""``perplexity``: teacher-forced domain perplexity, candidate against reference.

Both models score the *same* continuation tokens after the same prompt, so
the difference is the quantization's alone: perplexity = exp(-mean log-prob)
over every continuation token of the set (token-weighted, as usual).

The veto is relative: ``candidate <= reference * (1 + tolerance)``. An absolute
bound is meaningless across models; a healthy INT8 moves perplexity by well
under 1 %, RTN INT4 on a small model by tens of percent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class DomainText:
    prompt: str
    text: str
    domain: str = ""


# A small built-in set in the domains a shop's assistant serves (catalog, coupon
# rules, support Q&A), English and Chinese. Real launches point `texts` at their own.
DEFAULT_TEXTS = (
    DomainText("Describe the product.", "The TrailLite 40 backpack weighs 1.1 kilograms, holds forty litres and has a padded laptop sleeve, two side pockets for water bottles and a rain cover stored in the bottom compartment.", "catalog"),
    DomainText("Describe the product.", "This stainless steel kettle boils 1.7 litres of water in about four minutes. It switches off automatically when the water boils or when the kettle is lifted from its base.", "catalog"),
    DomainText("Explain the coupon rules.", "A coupon can be used once per order. It applies to the item subtotal before shipping and taxes, cannot be combined with other coupons, and expires at midnight on the date printed on it.", "coupon-rules"),
    DomainText("Explain the coupon rules.", "Orders over fifty dollars get ten dollars off with the code SAVE10. Gift cards and items already on sale are excluded, and the discount is refunded proportionally if you return part of the order.", "coupon-rules"),
    DomainText("Customer: My parcel has not arrived after five days. What should I do?", "I am sorry your parcel is late. Please check the tracking link in your confirmation email. If it has not moved for three days, reply with your order number and we will open an investigation with the carrier.", "support-qa"),
    DomainText("Customer: How do I return a pair of shoes that do not fit?", "You can return unworn shoes within thirty days. Start the return from your order page, print the prepaid label, and drop the parcel at any post office. The refund reaches your card within five business days.", "support-qa"),
    DomainText("顾客：优惠券怎么使用？", "每个订单只能使用一张优惠券。优惠券在结算时输入，适用于商品金额，不包括运费，过期后不能使用。", "coupon-rules"),
    DomainText("顾客：我的快递三天还没到。", "非常抱歉给您带来不便。请您提供订单号，我们会马上联系快递公司查询包裹的位置，并尽快给您答复。", "support-qa"),
)  # fmt: skip


def perplexity(logprobs: Sequence[Sequence[float]]) -> float:
    """Token-weighted perplexity over several texts' log-probs.

    >>> round(perplexity([[math.log(0.5)] * 3, [math.log(0.25)]]), 4)
    2.3784
    """
    flat = [lp for seq in logprobs for lp in seq]
    if not flat:
        raise ValueError("no tokens scored")
    return math.exp(-sum(flat) / len(flat))


def judge(cand: float, ref: float, tolerance: float) -> tuple[bool, str]:
    """(ok, why): the candidate may exceed the reference by at most ``tolerance`` (relative).

    >>> judge(10.2, 10.0, 0.05)
    (True, 'candidate perplexity 10.20 vs reference 10.00 (+2.0%)')
    >>> judge(13.0, 10.0, 0.05)[0]
    False
    """
    rise = cand / ref - 1.0 if ref > 0 else math.inf
    text = f"candidate perplexity {cand:.2f} vs reference {ref:.2f} ({rise:+.1%})"
    if not math.isfinite(cand) or rise > tolerance:
        return False, f"{text} > +{tolerance:.0%}"
    return True, text
