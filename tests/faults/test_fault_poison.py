"""Poison: 10,000 hostile messages among valid pairs: bad ones dead-lettered, good ones judged.

A hypothesis strategy draws *specs* (which field to break, and how); a plain
function turns each into bytes, so the bytes stay bounded (Tansu's memory
storage keeps every record, and the DLQ keeps a second copy). Seeded with
``derandomize=True``: the same 10,000 messages every run.

Whether a message is bad is decided by the worker's own parse step
(``parse_batch``) run here as the oracle; what is tested is the pipeline
around it: nothing lost, nothing crashes, every verdict reaches its topic.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from quantdrift.demo import synthetic
from quantdrift.schemas import DeadLetter, unverified_score
from quantdrift.schemas.pair import MAX_TEXT_CHARS
from quantdrift.streams.handlers import RawRecord, parse_batch
from support.guard import on_route, send_pairs, shadow_only, until_seen
from support.kafka import consume_n

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]

ROUTE = "poison/fuzz"
N_HOSTILE = 10_000
VALID_EVERY = 20  # one valid pair after every 20 hostile ones: 500 valid pairs
HUGE_TEXT_BUDGET = 12  # 200 kB texts; beyond this a huge string goes into a short field

FIELDS = [
    "pair_id", "ts", "route", "kind", "candidate", "reference", "request", "sample_rate",
    "candidate.text", "candidate.entropy", "candidate.latency_ms", "reference.text",
    "request.temperature", "request.top_p", "request.max_tokens", "request.expects_json",
    "request.expected_keys", "request.json_schema", "schema_version",
]  # fmt: skip
WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=16),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xed\xa0\x80", b"\xc3\x28", b"\x80", b"\xf8\x88\x80\x80\x80"]
NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"nan", b"1e999", b"-1e999", b"inf"]

SPECS = st.one_of(
    st.tuples(st.just("truncated"), st.floats(0.0, 0.999)),
    st.tuples(st.just("wrong_type"), st.sampled_from(FIELDS), WRONG_VALUES),
    st.tuples(
        st.just("huge"),
        st.sampled_from(["pair_id", "route", "candidate.text", "label", "request.task"]),
        st.integers(1, 4000),
    ),
    st.tuples(
        st.just("deep"), st.sampled_from(["root", "json_schema", "entropy"]), st.integers(2, 1500)
    ),
    st.tuples(
        st.just("utf8"),
        st.sampled_from(BAD_UTF8),
        st.sampled_from(["text", "route", "pair_id"]),
        st.integers(0, 12),
    ),
    st.tuples(
        st.just("non_finite"),
        st.sampled_from(NON_FINITE),
        st.sampled_from(["ts", "sample_rate", "latency_ms", "temperature", "entropy"]),
        st.integers(0, 30),
    ),
    st.tuples(
        st.just("wrong_keys"),
        st.sampled_from(["pair_id", "route", "candidate", "reference", "ts", "text"]),
        st.one_of(st.none(), st.text(min_size=1, max_size=8)),
    ),
    st.tuples(
        st.just("root"),
        st.one_of(
            st.sampled_from([b"", b"[]", b"{}", b"null", b"true", b"42", b'"pair"', b"\x00"]),
            st.binary(max_size=256),
        ),
    ),
    st.tuples(st.just("record_key"), st.binary(max_size=24)),
    st.tuples(st.just("tombstone"), st.one_of(st.none(), st.binary(max_size=8))),
    st.tuples(st.just("version"), st.integers().filter(lambda v: v != 1)),
)


def draw_specs(n: int) -> list[tuple[Any, ...]]:
    """n specs from hypothesis, deterministically (cycled if it stops early)."""
    specs: list[tuple[Any, ...]] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(SPECS)
    def collect(spec: tuple[Any, ...]) -> None:
        specs.append(spec)

    collect()
    assert specs
    return [specs[i % len(specs)] for i in range(n)]


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for name in parents:
        doc = doc.setdefault(name, {})
    doc[leaf] = value


class Builder:
    """Turns a spec into (record key, record value); bounded in bytes."""

    def __init__(self, template: dict[str, Any]) -> None:
        self.template = template
        self.huge_texts = 0

    def doc(self, i: int) -> dict[str, Any]:
        doc = json.loads(json.dumps(self.template))
        doc["pair_id"] = f"fz-{i}"
        return doc

    def build(self, i: int, spec: tuple[Any, ...]) -> tuple[bytes | None, bytes | None]:
        key = ROUTE.encode()
        kind = spec[0]
        doc = self.doc(i)
        raw = json.dumps(doc).encode()
        if kind == "truncated":
            return key, raw[: int(len(raw) * spec[1])]
        if kind == "wrong_type":
            _set(doc, spec[1], spec[2])
            return key, json.dumps(doc).encode()
        if kind == "huge":
            field, extra = spec[1], spec[2]
            if field == "candidate.text" and self.huge_texts < HUGE_TEXT_BUDGET:
                self.huge_texts += 1
                _set(doc, field, "x" * (MAX_TEXT_CHARS + extra))
            else:
                field = "pair_id" if field == "candidate.text" else field
                _set(doc, field, "y" * (250 + extra))
            return key, json.dumps(doc).encode()
        if kind == "deep":
            where, depth = spec[1], spec[2]
            if where == "root":
                return key, b"[" * depth + b"]" * depth
            nested = (
                '{"a":' * depth + "1" + "}" * depth
                if where == "json_schema"
                else "[" * depth + "1.0" + "]" * depth
            )
            target = "request.json_schema" if where == "json_schema" else "candidate.entropy"
            _set(doc, target, "__NEST__")
            if where == "json_schema":
                doc["request"]["expects_json"] = True
            return key, json.dumps(doc).replace('"__NEST__"', nested).encode()
        if kind == "utf8":
            bad, where, at = spec[1], spec[2], spec[3]
            anchor = {"text": b'"text": "', "route": b'"route": "', "pair_id": b'"pair_id": "'}
            start = raw.index(anchor[where]) + len(anchor[where])
            at = min(at, raw.index(b'"', start) - start)  # inside the string value
            return key, raw[: start + at] + bad + raw[start + at :]
        if kind == "non_finite":
            literal, where, n = spec[1], spec[2], spec[3]
            if where == "entropy":  # n finite values, then the bad literal
                _set(doc, "candidate.entropy", [0.5] * n + ["__NUM__"])
            else:
                path = {"latency_ms": "candidate.latency_ms", "temperature": "request.temperature"}
                _set(doc, path.get(where, where), "__NUM__")
            return key, json.dumps(doc).encode().replace(b'"__NUM__"', literal)
        if kind == "wrong_keys":
            name, new = spec[1], spec[2]
            holder = doc["candidate"] if name == "text" else doc
            value = holder.pop(name)
            if new is not None:
                holder[new] = value
            return key, json.dumps(doc).encode()
        if kind == "root":
            return key, spec[1]
        if kind == "record_key":
            return spec[1], raw
        if kind == "tombstone":
            return (key if spec[1] is None else spec[1]), None
        if kind == "version":
            doc["schema_version"] = spec[1]
            return key, json.dumps(doc).encode()
        raise AssertionError(kind)


async def test_ten_thousand_hostile_messages(fault_worker) -> None:  # type: ignore[no-untyped-def]
    cfg, worker = fault_worker
    kafka = cfg.kafka
    t0 = time.monotonic()
    specs = draw_specs(N_HOSTILE)
    valid = on_route(
        shadow_only(synthetic.healthy(ROUTE, seed=61), N_HOSTILE // VALID_EVERY), ROUTE, "ok"
    )
    template = valid[0].model_dump(mode="json", exclude_none=True)
    for side in ("candidate", "reference"):
        template[side].pop("entropy", None)  # smaller records
    builder = Builder(template)
    records: list[tuple[bytes | None, bytes | None]] = []
    for i, spec in enumerate(specs):
        records.append(builder.build(i, spec))
        if i % VALID_EVERY == VALID_EVERY - 1:
            pair = valid[i // VALID_EVERY]
            records.append((ROUTE.encode(), pair.dumps()))
    # The oracle: the worker's own parse step, record by record.
    good_ids: set[str] = set()
    bad: list[bytes] = []
    lax: collections.Counter[str] = collections.Counter()
    kind_of = {f"fz-{i}": spec[0] for i, spec in enumerate(specs)}
    for key, value in records:
        ok, _ = parse_batch([RawRecord(value, key, kafka.topics.pairs, 0, 0)], 0.0)
        if ok:
            assert ok[0].kind == "shadow" and ok[0].route == ROUTE
            good_ids.add(ok[0].pair_id)
            lax[kind_of.get(ok[0].pair_id, "valid")] += 1
        else:
            bad.append(value or b"")
    assert {p.pair_id for p in valid} <= good_ids
    hostile_ok = len(good_ids) - len(valid)
    # Lax but legitimate: an int for a float, a deep json_schema under orjson's 1024 limit,
    # a renamed optional key. They must be judged like any valid pair.
    assert hostile_ok < N_HOSTILE * 0.1, f"{hostile_ok} 'hostile' messages were valid: {lax}"
    assert len(good_ids) + len(bad) == len(records)
    size = sum(len(v or b"") for _, v in records)
    kinds = collections.Counter(s[0] for s in specs)
    print(f"\n{len(records)} records, {size / 1e6:.1f} MB, built in {time.monotonic() - t0:.1f}s")
    print(f"kinds: {dict(kinds)}; hostile but valid: {dict(lax)}")

    t1 = time.monotonic()
    await send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, records)
    await until_seen(cfg, ROUTE, len(good_ids), worker, timeout=150)
    letters = [
        DeadLetter.parse(r.value)
        for r in await consume_n(
            kafka.bootstrap_servers, kafka.topics.dlq, len(bad), timeout=60, strict=False
        )
    ]
    print(
        f"judged {len(good_ids)} and dead-lettered {len(letters)} in {time.monotonic() - t1:.1f}s"
    )
    letters = [x for x in letters if x.topic == kafka.topics.pairs]
    assert len(letters) == len(bad), f"{len(letters)} dead letters for {len(bad)} bad records"
    assert collections.Counter(x.original() for x in letters) == collections.Counter(bad)
    assert all(x.error and x.offset is not None for x in letters)
    scores = await consume_n(
        kafka.bootstrap_servers,
        kafka.topics.scores,
        len(good_ids),
        timeout=30,
        predicate=lambda r: r.key == ROUTE.encode(),
    )
    assert {unverified_score(r.value).pair_id for r in scores} == good_ids
    assert worker.alive(), worker.log_tail()
