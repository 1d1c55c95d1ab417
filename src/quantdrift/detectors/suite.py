"""Every metric of a pair in one call, and the per-pair verdict.

The score agent hands :func:`score_pairs` a batch from the stream; all texts of
the batch go to the embedder in ONE call (the transformer dominates the cost,
and batching is where CPU throughput comes from), each distinct text of the
batch is tokenized and counted once and its tokens and counts reused by every
lexical and repetition metric of every pair it is in.
:func:`verdict` is the seeds' per-pair failure rule, pure, so the judge, the
replay and the CLI all decide the same way.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from quantdrift.detectors import bleu
from quantdrift.detectors import entropy as ent
from quantdrift.detectors import lexical as lex
from quantdrift.detectors import repetition as rep
from quantdrift.detectors.answer import answer_text, contract
from quantdrift.detectors.correctness import answer_ok
from quantdrift.detectors.divergence import divergent_token
from quantdrift.detectors.semantic import Embedder, cosine_pairs
from quantdrift.detectors.tokenize import tokenize
from quantdrift.schemas.pair import ModelOutput, PairEvent, RequestInfo
from quantdrift.schemas.score import PROMPT_EXCERPT_CHARS, Metrics, ScoreEvent, Verdict


def _finite(x: float | None) -> float | None:
    # Metrics refuses NaN/inf; absurd-but-valid inputs (log-probs of -1e308) can
    # overflow a mean, and "unknown" is the honest answer then.
    return x if x is None or math.isfinite(x) else None


@dataclass(slots=True)
class _Text:
    """What the metrics need of one text, computed once however many pairs of a
    batch share it (the reference of a prompt asked again, the same text on
    both sides): its tokens and their counts (ROUGE-1 and Jaccard both read
    them), integer ids and the repetition signals. Kept for one batch only, so
    no memory outlives a call. BLEU is sacrebleu's on the raw text, with
    sacrebleu's tokenizer, so its n-grams are counted apart, once per tokenizer
    the text's pairs ask for (``zh`` when a partner has CJK)."""

    text: str
    tokens: list[str]
    counts: Counter[str]
    ids: rep.IntArray
    repetition_run: int
    looping: bool
    whitespace_run: int
    bleu_ngrams: dict[str, bleu.BleuNgrams]

    @classmethod
    def of(cls, text: str) -> _Text:
        tokens = tokenize(text)
        ids = rep.token_ids(tokens)
        return cls(
            text,
            tokens,
            Counter(tokens),
            ids,
            rep.repetition_run(ids),
            rep.looping(ids),
            rep.whitespace_run(text),
            {},
        )

    def bleu_counts(self, tokenizer: str) -> bleu.BleuNgrams:
        """This text's BLEU n-grams under ``tokenizer``, counted on first use."""
        found = self.bleu_ngrams.get(tokenizer)
        if found is None:
            found = self.bleu_ngrams[tokenizer] = bleu.ngrams(self.text, tokenizer)
        return found

    @classmethod
    def shared(cls, texts: dict[str, _Text], text: str) -> _Text:
        """The batch's view of ``text``, made on first use."""
        found = texts.get(text)
        if found is None:
            found = texts[text] = cls.of(text)
        return found


def _metrics(
    candidate: ModelOutput,
    reference: ModelOutput,
    request: RequestInfo,
    reference_on_candidate: Sequence[float] | None,
    cosine: float | None,
    tier: str | None,
    texts: dict[str, _Text],
) -> Metrics:
    """One pair's metrics; ``texts`` holds (and receives) the per-text work of the batch."""
    cand, ref = _Text.shared(texts, candidate.text), _Text.shared(texts, reference.text)
    cand_tokens, ref_tokens = cand.tokens, ref.tokens

    cand_h = ent.token_entropies(candidate)
    ref_h = ent.token_entropies(reference)
    h_mean, h_min = ent.entropy_stats(cand_h)
    ref_mean, _ = ent.entropy_stats(ref_h)
    kl, flips = ent.kl_and_flip_rate(reference.top_logprobs, candidate.top_logprobs)
    json_ok, json_error = contract(candidate, request)
    bleu_tok = bleu.pair_tokenizer(candidate.text, reference.text)

    return Metrics(
        cosine=cosine,
        cosine_tier=tier if cosine is not None else None,
        bleu=bleu.from_ngrams(cand.bleu_counts(bleu_tok), ref.bleu_counts(bleu_tok)),
        rouge1=lex.rouge1_from_counts(cand.counts, ref.counts),
        rougeL=lex.rougeL_f(cand_tokens, ref_tokens),
        jaccard=lex.jaccard_from_counts(cand.counts, ref.counts),
        length_ratio=lex.length_ratio(cand_tokens, ref_tokens),
        first_divergence=lex.first_divergence(cand_tokens, ref_tokens),
        entropy_mean=_finite(h_mean),
        entropy_min=_finite(h_min),
        entropy_shift=_finite(ent.entropy_shift(h_mean, ref_mean)),
        kl=_finite(kl),
        flip_rate=flips,
        tf_gap=_finite(ent.teacher_forced_gap(reference.token_logprobs, reference_on_candidate)),
        tf_kl=_finite(ent.teacher_forced_kl(candidate.token_logprobs, reference_on_candidate)),
        repetition_run=cand.repetition_run,
        looping=cand.looping,
        distinct_2=rep.distinct_2(cand.ids),
        whitespace_run=cand.whitespace_run,
        json_ok=json_ok,
        json_error=json_error,
        reference_json_ok=contract(reference, request)[0],
        candidate_tokens=len(cand_tokens),
        reference_tokens=len(ref_tokens),
        reference_repetition_run=ref.repetition_run,
        reference_looping=ref.looping,
        reference_whitespace_run=ref.whitespace_run,
        finished=_finished(candidate.finish_reason),
        reference_finished=_finished(reference.finish_reason),
        answer_ok=answer_ok(answer_text(candidate), request.expected_answer, request.answer_kind),
        reference_answer_ok=answer_ok(
            answer_text(reference), request.expected_answer, request.answer_kind
        ),
    )


def _finished(finish_reason: str | None) -> bool | None:
    # Only "length" means cut off; "stop", "tool_calls", "content_filter" ended a turn.
    return None if not finish_reason else finish_reason != "length"


def score_pairs(
    pairs: Sequence[PairEvent],
    embedder: Embedder | None,
    *,
    cosines: Sequence[tuple[float | None, str | None]] | None = None,
) -> list[Metrics]:
    """Metrics for each pair, in order; one ``embed`` call for the whole batch.

    ``embedder=None`` leaves ``cosine`` None (the verdict then falls back to ROUGE-L).
    ``cosines``: precomputed (cosine, tier) per pair (the tiered scorer); the
    embedder is then not called.
    """
    tier = getattr(embedder, "tier", None) if embedder is not None else None
    found: list[tuple[float | None, str | None]] = [(None, None)] * len(pairs)
    if cosines is not None:
        if len(cosines) != len(pairs):
            raise ValueError(f"{len(pairs)} pairs but {len(cosines)} cosines")
        found = [(None if c is None else _finite(float(c)), t) for c, t in cosines]
    elif embedder is not None and pairs:
        values = cosine_pairs(
            embedder, [p.candidate.text for p in pairs], [p.reference.text for p in pairs]
        )
        found = [(_finite(float(c)), tier) for c in values]
    texts: dict[str, _Text] = {}
    return [
        _metrics(
            p.candidate, p.reference, p.request, p.reference_logprobs_on_candidate, cos, t, texts
        )
        for p, (cos, t) in zip(pairs, found, strict=True)
    ]


def score_text_pair(candidate: str, reference: str, embedder: Embedder | None) -> Metrics:
    """Metrics of two bare texts (``quantdrift score``): no token data, no JSON contract.

    Examples
    --------
    >>> m = score_text_pair("The cat sat on the mat.", "The cat sat on a mat.", None)
    >>> m.rouge1, m.first_divergence, m.cosine is None
    (0.8333333333333334, 4, True)
    """
    # Bare texts come from files and argv, where undecodable bytes arrive as lone
    # surrogates; a message model refuses those, so they are scored as U+FFFD, as a
    # decoder reading the same bytes would show them.
    candidate, reference = _decodable(candidate), _decodable(reference)
    cos: float | None = None
    tier = getattr(embedder, "tier", None) if embedder is not None else None
    if embedder is not None:
        cos = _finite(float(cosine_pairs(embedder, [candidate], [reference])[0]))
    return _metrics(
        ModelOutput(text=candidate), ModelOutput(text=reference), RequestInfo(), None, cos, tier, {}
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _decodable(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD.

    >>> _decodable("a\\ud800b") == "a\\ufffdb", _decodable("猫") == "猫"
    (True, True)
    """
    return _SURROGATE.sub("\ufffd", text)


@dataclass(frozen=True, slots=True)
class FailureThresholds:
    """When one pair fails (the seeds' rule; the judge counts consecutive failures).

    ``lexical_similarity`` is the drift threshold used only when there is no
    cosine: ROUGE-L is on another scale (a healthy quantized model sits near
    0.46 against BF16), so 0.88 would call every pair a drift.
    """

    similarity: float = 0.88
    lexical_similarity: float = 0.35
    entropy_floor: float = 0.05
    entropy_min_tokens: int = 8
    repetition_run: int = 4
    whitespace_run: int = 128
    # Teacher-forced divergence (nats) above which a pair fails; when it is known it
    # replaces the similarity bar (see ``_drift``).
    tf_kl: float | None = 0.1

    def __post_init__(self) -> None:
        if not -1.0 <= self.similarity <= 1.0 or not 0.0 <= self.lexical_similarity <= 1.0:
            raise ValueError("similarity thresholds must be in [-1, 1] / [0, 1]")
        if self.entropy_floor < 0 or self.repetition_run < 2 or self.whitespace_run < 1:
            raise ValueError("entropy_floor >= 0, repetition_run >= 2, whitespace_run >= 1")


DEFAULT_THRESHOLDS = FailureThresholds()


def hard_failures(m: Metrics, t: FailureThresholds = DEFAULT_THRESHOLDS) -> list[str]:
    """Hard failures the reference does not show: a repetition loop, collapsed entropy,
    runaway whitespace. These are what a broken quantization looks like (int2 / int3
    loop on almost every answer), and the tolerance rule may trip on them fast.

    Each is excused when the reference shows it too: then the prompt asked for it
    ("repeat this ten times"), quantization did not cause it.
    """
    reasons: list[str] = []
    ref_run = m.reference_repetition_run or 0
    if m.repetition_run >= t.repetition_run and m.repetition_run > 2 * ref_run:
        reasons.append(f"repetition loop ({m.repetition_run}x)")
    if (
        m.entropy_mean is not None
        and m.entropy_mean < t.entropy_floor
        and (m.candidate_tokens is None or m.candidate_tokens >= t.entropy_min_tokens)
    ):
        ref_mean = None if m.entropy_shift is None else m.entropy_mean - m.entropy_shift
        if ref_mean is None or ref_mean >= t.entropy_floor:
            reasons.append(f"entropy {m.entropy_mean:.3f} < {t.entropy_floor:g} nats")
    ref_ws = m.reference_whitespace_run or 0
    if m.whitespace_run >= t.whitespace_run and ref_ws < t.whitespace_run:
        reasons.append(f"whitespace run {m.whitespace_run}")
    return reasons


def _anomalies(m: Metrics, t: FailureThresholds) -> list[str]:
    reasons: list[str] = []
    if m.looping and not m.reference_looping:
        reasons.append("looping tail")
    if m.json_ok is False and m.reference_json_ok is not False:
        reasons.append(m.json_error or "json: broken contract")
    return reasons + hard_failures(m, t)


def _drift(m: Metrics, t: FailureThresholds) -> str | None:
    # With teacher-forced log-probs the question "would the reference have written
    # this?" is answered directly, on the same tokens: a low cosine with a tiny
    # divergence is a near-tie that greedy decoding amplified (a healthy int8 model
    # fails the 0.88 bar on ~30 % of greedy lab pairs), not a degraded model.
    if m.tf_kl is not None and t.tf_kl is not None:
        if m.tf_kl > t.tf_kl:
            return f"teacher-forced KL {m.tf_kl:.3f} > {t.tf_kl:g} nats"
        return None
    if m.cosine is not None:
        if m.cosine < t.similarity:
            return f"cosine {m.cosine:.2f} < {t.similarity:g}"
        return None
    if m.rougeL is None:
        return None
    # Identical token sequences (first_divergence None, tokens counted) are a perfect
    # match even when both are empty, where ROUGE-L is 0 by rouge-score's convention.
    identical = m.first_divergence is None and m.candidate_tokens is not None
    if not identical and m.rougeL < t.lexical_similarity:
        return f"rougeL {m.rougeL:.2f} < {t.lexical_similarity:g} (no cosine)"
    return None


def verdict(
    metrics: Metrics, thresholds: FailureThresholds = DEFAULT_THRESHOLDS
) -> tuple[Verdict, list[str]]:
    """``anomaly`` (degenerate output), ``drift`` (too dissimilar) or ``ok``, with reasons.

    Anomaly: a looping tail, a repetition loop, a broken JSON contract, collapsed
    entropy (mean < floor, only when entropy is known and the text has at least
    ``entropy_min_tokens`` tokens) or runaway whitespace — each unless the
    reference shows the same (a JSON contract the reference breaks too is the
    prompt's fault). Drift: the teacher-forced divergence above ``tf_kl`` when the
    pair carries the reference's log-probs on the candidate's tokens; else cosine
    below ``similarity``, or without a cosine, ROUGE-L below
    ``lexical_similarity``. Reasons list every cause found.

    Examples
    --------
    >>> verdict(Metrics(cosine=0.71))
    ('drift', ['cosine 0.71 < 0.88'])
    >>> verdict(Metrics(cosine=0.95, json_ok=False, json_error="json: missing key 'name'"))
    ('anomaly', ["json: missing key 'name'"])
    >>> verdict(Metrics(cosine=0.95))
    ('ok', [])
    """
    reasons = _anomalies(metrics, thresholds)
    drift = _drift(metrics, thresholds)
    if drift is not None:
        reasons.append(drift)
    if len(reasons) > (drift is not None):
        return "anomaly", reasons
    return ("drift" if drift is not None else "ok"), reasons


def score_event(
    pair: PairEvent,
    metrics: Metrics,
    thresholds: FailureThresholds = DEFAULT_THRESHOLDS,
    route: str | None = None,
) -> ScoreEvent:
    """The ScoreEvent of a scored pair, with its verdict: what the score agent publishes,
    and what replay and eval rebuild (optionally on another ``route``)."""
    v, reasons = verdict(metrics, thresholds)
    return ScoreEvent(
        pair_id=pair.pair_id,
        route=route or pair.route,
        kind=pair.kind,
        ts=pair.ts,
        decoding=pair.request.decoding,
        candidate_precision=pair.candidate.precision,
        candidate_engine=pair.candidate.engine.identity() if pair.candidate.engine else None,
        metrics=metrics,
        verdict=v,
        reasons=reasons,
        label=pair.label,
        tags=dict(pair.tags),
        prompt_hash=pair.request.prompt_hash,
        prompt_excerpt=_excerpt(pair.request.prompt),
        divergence=divergent_token(pair),
    )


def _excerpt(prompt: str | None) -> str | None:
    """The prompt's last user turn's first characters, or None (a hashed prompt).

    >>> _excerpt("system: be brief\\nuser: What is the capital of France?")
    'user: What is the capital of France?'
    """
    if prompt is None:
        return None
    last = prompt.rsplit("\nuser: ", 1)
    text = f"user: {last[1]}" if len(last) == 2 else prompt
    return text[:PROMPT_EXCERPT_CHARS]
