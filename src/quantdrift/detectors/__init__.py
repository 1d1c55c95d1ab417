"""Pure scoring: no Kafka, no Redis, no environment reads.

One module per concern: ``tokenize`` (CJK-aware tokens), ``lexical`` (ROUGE,
Jaccard, length, divergence), ``bleu`` (sacrebleu's sentence BLEU), ``entropy`` (entropy, KL, flips,
teacher-forced gap), ``repetition`` (loops, diversity, whitespace),
``json_contract``, ``semantic`` (the embedder protocol, cosine) and ``suite``
(all of it for a batch of pairs, and the per-pair verdict), ``sequential``,
``tolerance`` and ``noise_floor`` (the decision's tests and floors). Models are
loaded in :mod:`quantdrift.embedding`.
"""

from quantdrift.detectors.bleu import sentence_bleu
from quantdrift.detectors.entropy import (
    entropy_from_top_logprobs,
    entropy_shift,
    entropy_stats,
    kl_and_flip_rate,
    teacher_forced_gap,
    token_entropies,
)
from quantdrift.detectors.json_contract import check_json_contract, expects_json, strip_fences
from quantdrift.detectors.lexical import (
    first_divergence,
    jaccard,
    lcs_length,
    length_ratio,
    rouge1_f,
    rougeL_f,
)
from quantdrift.detectors.repetition import (
    distinct_2,
    looping,
    repetition_run,
    token_ids,
    whitespace_run,
)
from quantdrift.detectors.semantic import Embedder, cosine_pairs
from quantdrift.detectors.suite import (
    DEFAULT_THRESHOLDS,
    FailureThresholds,
    score_pairs,
    score_text_pair,
    verdict,
)
from quantdrift.detectors.tokenize import has_cjk, tokenize

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Embedder",
    "FailureThresholds",
    "check_json_contract",
    "cosine_pairs",
    "distinct_2",
    "entropy_from_top_logprobs",
    "entropy_shift",
    "entropy_stats",
    "expects_json",
    "first_divergence",
    "has_cjk",
    "jaccard",
    "kl_and_flip_rate",
    "lcs_length",
    "length_ratio",
    "looping",
    "repetition_run",
    "rouge1_f",
    "rougeL_f",
    "score_pairs",
    "score_text_pair",
    "sentence_bleu",
    "strip_fences",
    "teacher_forced_gap",
    "token_entropies",
    "token_ids",
    "tokenize",
    "verdict",
    "whitespace_run",
]
