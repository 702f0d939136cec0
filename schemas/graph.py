"""The topology as a graph: which stage writes each topic and which stages read it.

Drawn from the declarations alone (:mod:`schemas.stages`), so ``crawlfleet top --graph``
and README's picture are the registry, never a hand-kept copy: a stage a user registers
shows up in both, with its inputs, outputs and stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.stages import all_specs, declared_topics


@dataclass(frozen=True)
class Flow:
    """One topic: the stages that write it, those that read it as a group input, and, for
    a store's changelog, the store (``owner``: its stage writes and restores it)."""

    topic: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    store: str = ""
    holds_work: bool = False


def flows() -> list[Flow]:
    """Every topic a stage reads or writes, in the order they are first named."""
    specs = all_specs()
    fed = {d.name: d.fed_by for d in declared_topics() if d.fed_by}
    order: dict[str, None] = {}
    for spec in specs:
        order.update(dict.fromkeys((*spec.inputs, *spec.outputs)))
    out = [Flow(t, (*((fed[t],) if t in fed else ()),
                    *(s.name for s in specs if t in s.outputs)),
                tuple(s.name for s in specs if t in s.inputs)) for t in order]
    for spec in specs:
        for st in spec.state:
            work = st.holds_work
            out.append(Flow(st.changelog, (spec.name,), (), f"{spec.name}.{st.name}", work))
    return out


def unfed() -> list[str]:
    """Topics some stage reads that nothing writes (no stage, no declared ``fed_by``)."""
    return [f.topic for f in flows() if f.readers and not f.writers]


def draw() -> list[str]:
    """The graph as text lines, ``writers ─▶ topic ─▶ readers`` (``·``: no stage reads it
    as a group input), then each store's changelog with its stage."""
    rows = []
    for f in flows():
        if f.store:
            kind = "holds work" if f.holds_work else "state"
            rows.append((f.writers[0], f.topic, f"[{f.store} store: {kind}]"))
        else:
            rows.append((", ".join(f.writers), f.topic, ", ".join(f.readers) or "·"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"{a:>{w0}} ─▶ {b:<{w1}} ─▶ {c}".rstrip() for a, b, c in rows]
