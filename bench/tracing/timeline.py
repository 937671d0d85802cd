"""One relayed Recommend's timeline, drawn from its spans: the relay race as a picture (`picture`).

`pick_relayed` chooses a trace whose ranker `prefix` span consumed a pre-inference (`hit` or `joined`,
linked to the ranker's PreInfer span of the same trace) and that holds every span the picture needs
(`REQUIRED`); preferably one whose PreInfer computed the whole prefix (not a reload or an extension of a
prefix kept in DRAM), and of those the one whose Recommend took closest to the median of every Recommend.
`draw` gives each service a lane (each ranker instance its own), packs each lane's spans into rows (a span
below its parent, side by side where they do not overlap), shades the pre-processing window and draws an
arrow from the end of the prefix's computation to the Rank's `prefix` span; time is in ms from the
Recommend's start. `relay_facts` states the same in figures.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from bench.tracing.otlp import SpanRecord

STUB, TRIGGER = "relaygr-retrieval-stub", "relaygr-trigger"
ROUTER, RANKER = "relaygr-router", "relaygr-ranker"
LANE_TITLES = {STUB: "retrieval stub", TRIGGER: "trigger", ROUTER: "router", RANKER: "ranker"}
RECOMMEND = "/relaygr.v1.RecommendService/Recommend"
PRE_INFER, RANK = "/relaygr.v1.RankerService/PreInfer", "/relaygr.v1.RankerService/Rank"
RELAYED = ("hit", "joined")  # a `prefix` span's relaygr.production when the Rank consumed a pre-inference
# What a drawable relayed trace must hold, as (service, span name).
REQUIRED = {
    (STUB, RECOMMEND), (STUB, "preprocess"), (RANKER, PRE_INFER), (RANKER, "production"), (RANKER, "compute"),
    (RANKER, RANK), (RANKER, "prefix"), (RANKER, "model"),
}  # fmt: skip
# Bar colours: the pre-inference's path in oranges, the Rank's in blues, waits in grey.
COLOURS = {
    "Recommend": "#ced4da", "preprocess": "#8ce99a", "Admit": "#ffc078", "PreInfer": "#ff922b",
    "production": "#ffe066", "compute": "#e8590c", "reload": "#e8590c", "Rank": "#74c0fc",
    "prefix": "#a5d8ff", "model": "#1864ab", "queue": "#adb5bd",
}  # fmt: skip
OTHER_COLOUR = "#dee2e6"
ROW_HEIGHT = 0.8


def group_traces(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Spans by trace id."""
    traces: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        traces[span.trace_id].append(span)
    return dict(traces)


def root(trace: Sequence[SpanRecord]) -> SpanRecord | None:
    """The trace's Recommend span at the retrieval stub (its root), if received."""
    return next((s for s in trace if s.service == STUB and s.name == RECOMMEND and not s.parent_id), None)


def find(trace: Sequence[SpanRecord], service: str, name: str) -> SpanRecord:
    return next(s for s in trace if (s.service, s.name) == (service, name))


def consumed_prefix(trace: Sequence[SpanRecord]) -> SpanRecord | None:
    """The ranker's `prefix` span that consumed a pre-inference of the same trace (a link to that trace's
    ranker PreInfer span, and `hit` or `joined`), if there is one."""
    pre_infers = {s.span_id for s in trace if (s.service, s.name, s.kind) == (RANKER, PRE_INFER, "server")}
    for span in trace:
        if (span.service, span.name) != (RANKER, "prefix") or span.attributes.get(
            "relaygr.production"
        ) not in RELAYED:
            continue
        if any(trace_id == span.trace_id and span_id in pre_infers for trace_id, span_id in span.links):
            return span
    return None


def drawable(trace: Sequence[SpanRecord]) -> bool:
    """A relayed trace holding every span the picture needs."""
    has = {(s.service, s.name) for s in trace} >= REQUIRED
    return root(trace) is not None and has and consumed_prefix(trace) is not None


def relayed_production(trace: Sequence[SpanRecord]) -> SpanRecord | None:
    """The `production` span of the PreInfer whose prefix the Rank consumed (None when not relayed)."""
    prefix = consumed_prefix(trace)
    linked = {span_id for _, span_id in prefix.links} if prefix is not None else set()
    return next((s for s in trace if s.name == "production" and s.parent_id in linked), None)


def pick_relayed(spans: Iterable[SpanRecord]) -> str | None:
    """The id of the drawable relayed trace to draw (None when no trace is drawable): see the module's
    docstring."""
    traces = group_traces(spans)
    roots = [r for r in map(root, traces.values()) if r is not None]
    candidates = [r for r in roots if drawable(traces[r.trace_id])]
    if not candidates:
        return None
    median_ms = statistics.median(r.duration_ms for r in roots)

    def preference(r: SpanRecord) -> tuple[bool, float, str]:
        production = relayed_production(traces[r.trace_id])
        computed = production is not None and production.attributes.get("relaygr.kind") == "compute"
        return not computed, abs(r.duration_ms - median_ms), r.trace_id

    return min(candidates, key=preference).trace_id


def label(span: SpanRecord) -> str:
    """A bar's name: the gRPC method (an arrow for a client's call), or the span's own name."""
    if span.name.startswith("/"):
        method = span.name.rsplit("/", 1)[-1]
        return f"{method} →" if span.kind == "client" else method
    return span.name


def text(span: SpanRecord) -> str:
    """A bar's text: its name and duration in ms, and how a Rank's prefix was served."""
    how = span.attributes.get("relaygr.production") if span.name == "prefix" else None
    return f"{label(span)} {span.duration_ms:.1f}" + (f" ({how})" if how else "")


def colour(span: SpanRecord) -> str:
    return COLOURS.get(label(span).removesuffix(" →"), OTHER_COLOUR)


def lane_of(span: SpanRecord) -> tuple[int, str]:
    """(order, title) of a span's lane: one per service, one per ranker instance."""
    order = list(LANE_TITLES).index(span.service) if span.service in LANE_TITLES else len(LANE_TITLES)
    title = LANE_TITLES.get(span.service, span.service.removeprefix("relaygr-"))
    if span.service == RANKER and span.instance:
        # The ranker names its instance `ranker[<instance name>]`: the lane takes the instance name.
        title = span.instance.partition("[")[2].removesuffix("]") or span.instance
    return order, title


@dataclasses.dataclass(frozen=True)
class Bar:
    span: SpanRecord
    lane: tuple[int, str]
    row: int  # within its lane, 0 at the top
    text_inside: bool  # its text fits inside the bar (else it is written right of it)


def layout(trace: Sequence[SpanRecord], char_ns: float = 0.0) -> list[Bar]:
    """Each span's lane and row: below its parent when the parent is in the same lane, in the first row
    where neither it nor its text (`char_ns` of time a character) overlaps another bar or text."""
    by_id = {span.span_id: span for span in trace}
    rows: dict[tuple[int, str], list[list[tuple[float, float]]]] = defaultdict(list)
    placed: dict[str, int] = {}
    bars = []
    for span in sorted(trace, key=lambda s: (s.start_ns, -s.end_ns, s.span_id)):
        lane = lane_of(span)
        parent = by_id.get(span.parent_id)
        row = placed[parent.span_id] + 1 if parent is not None and lane_of(parent) == lane else 0
        width = len(text(span)) * char_ns
        inside = span.end_ns - span.start_ns > width + 2 * char_ns
        start, end = span.start_ns, span.end_ns + (0 if inside else width + 2 * char_ns)
        lane_rows = rows[lane]
        while row < len(lane_rows) and any(start < e and s < end for s, e in lane_rows[row]):
            row += 1
        while len(lane_rows) <= row:
            lane_rows.append([])
        lane_rows[row].append((start, end))
        placed[span.span_id] = row
        bars.append(Bar(span, lane, row, inside))
    return bars


def draw(trace: Sequence[SpanRecord], path: Path, title: str = "") -> None:
    """Draws a relayed trace's timeline (see the module's docstring) to `path` as a PNG."""
    start = root(trace)
    if start is None:
        raise ValueError("the trace has no Recommend root span")
    t0, last_ns = start.start_ns, max(span.end_ns for span in trace)

    def ms(ns: float) -> float:
        return (ns - t0) / 1e6

    # About 1/140 of the drawn time per character at fontsize 7 in an 11-inch figure.
    char_ns = (last_ns - t0) * 1.15 / 140
    char_ms = ms(t0 + char_ns)
    bars = layout(trace, char_ns)
    lanes = sorted({bar.lane for bar in bars})
    depth = {lane: 1 + max(bar.row for bar in bars if bar.lane == lane) for lane in lanes}
    top: dict[tuple[int, str], float] = {}
    height = 0.0
    for lane in lanes:
        top[lane] = height
        height += depth[lane] + 0.6  # a gap between lanes

    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.4 * height))
    centre: dict[str, float] = {}
    for bar in bars:
        span, client = bar.span, bar.span.kind == "client"
        left, width = ms(span.start_ns), max(ms(span.end_ns) - ms(span.start_ns), char_ms / 4)
        middle = centre[span.span_id] = top[bar.lane] + bar.row + 0.5
        ax.barh(
            middle, width, left=left, height=ROW_HEIGHT, color=colour(span), alpha=0.55 if client else 1.0,
            edgecolor="#343a40", linewidth=0.6, hatch="//" if client else None,
        )  # fmt: skip
        if bar.text_inside:
            dark = colour(span) in ("#e8590c", "#1864ab")
            ax.text(left + width / 2, middle, text(span), ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
        else:
            ax.text(left + width + char_ms / 2, middle, text(span), ha="left", va="center", fontsize=7)

    window = find(trace, STUB, "preprocess")
    ax.axvspan(ms(window.start_ns), ms(window.end_ns), color="#2b8a3e", alpha=0.08, zorder=0)
    ax.text(ms(window.start_ns) + char_ms, -0.2, "relay window (pre-processing)", fontsize=8,
            color="#2b8a3e", va="bottom")  # fmt: skip
    # The relay: from the end of the prefix's computation to the Rank's `prefix` span that consumed it.
    prefix = consumed_prefix(trace)
    compute = [s for s in trace if s.name == "compute" and s.service == RANKER]
    if prefix is not None and compute:
        made = max(compute, key=lambda s: s.end_ns)
        ax.annotate(
            "", xy=(ms(min(prefix.end_ns, max(prefix.start_ns, made.end_ns))), centre[prefix.span_id]),
            xytext=(ms(made.end_ns), centre[made.span_id]),
            arrowprops=dict(arrowstyle="->", color="#c92a2a", lw=1.5, shrinkA=0, shrinkB=2),
        )  # fmt: skip

    ax.set_yticks([top[lane] + depth[lane] / 2 for lane in lanes], [lane[1] for lane in lanes])
    for lane in lanes[1:]:
        ax.axhline(top[lane] - 0.3, color="#868e96", lw=0.5)
    ax.set_ylim(height - 0.4, -0.7)
    ax.set_xlim(min(0.0, min(ms(b.span.start_ns) for b in bars)) - char_ms, ms(last_ns) * 1.15)
    ax.set_xlabel("ms from the Recommend's start")
    ax.grid(axis="x", alpha=0.3)
    shown = ("preprocess", "Admit", "PreInfer", "production", "compute", "Rank", "prefix", "model", "queue")
    legend: list[Artist] = [Patch(facecolor=COLOURS[k], edgecolor="#343a40", label=k) for k in shown]
    legend.append(Patch(facecolor="white", edgecolor="#343a40", hatch="//", label="client call (→)"))
    legend.append(Line2D([], [], color="#c92a2a", lw=1.5, label="prefix handed to the Rank"))
    fig.legend(handles=legend, loc="lower center", ncol=6, fontsize=7, frameon=False)
    ax.set_title(title or f"One relayed Recommend, trace {start.trace_id}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07 + 0.3 / height, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


@dataclasses.dataclass(frozen=True)
class RelayFacts:
    """What the picture shows, in ms from the Recommend's start."""

    trace_id: str
    recommend_ms: float
    window_ms: tuple[float, float]  # the pre-processing window
    compute_ms: tuple[float, float]  # the prefix's computation on the ranker's device
    compute_in_window: float  # share of the computation inside the window
    rank_ms: tuple[float, float]  # the ranker's Rank span
    prefix_wait_ms: float  # the Rank's wait for its prefix
    production: str  # hit or joined
    production_kind: str  # what the PreInfer's production did: compute, reload (from DRAM) or extend
    long_term_length: int | None
    instance: str


def relay_facts(trace: Sequence[SpanRecord]) -> RelayFacts:
    """The figures of a drawable relayed trace that the report states beside its picture."""
    start, prefix = root(trace), consumed_prefix(trace)
    if start is None or prefix is None:
        raise ValueError("not a relayed trace")

    def ms(*ns: int) -> tuple[float, ...]:
        return tuple(round((n - start.start_ns) / 1e6, 2) for n in ns)

    window = find(trace, STUB, "preprocess")
    compute = max((s for s in trace if s.service == RANKER and s.name == "compute"), key=lambda s: s.end_ns)
    rank = next(s for s in trace if (s.service, s.name, s.kind) == (RANKER, RANK, "server"))
    inside = max(0, min(compute.end_ns, window.end_ns) - max(compute.start_ns, window.start_ns))
    length = rank.attributes.get("relaygr.long_term_length")
    made = relayed_production(trace)
    return RelayFacts(
        trace_id=start.trace_id, recommend_ms=round(start.duration_ms, 2),
        window_ms=ms(window.start_ns, window.end_ns), compute_ms=ms(compute.start_ns, compute.end_ns),
        compute_in_window=round(inside / max(compute.end_ns - compute.start_ns, 1), 3),
        rank_ms=ms(rank.start_ns, rank.end_ns), prefix_wait_ms=round(prefix.duration_ms, 2),
        production=str(prefix.attributes.get("relaygr.production")),
        production_kind=str(made.attributes.get("relaygr.kind", "")) if made is not None else "",
        long_term_length=int(length) if isinstance(length, int) else None,
        instance=str(rank.attributes.get("relaygr.instance", rank.instance)),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The relayed trace the picture draws, with its spans (so it can be drawn again)."""

    picture: str  # file name in the results folder
    facts: RelayFacts
    spans: list[SpanRecord]


def picture(spans: Sequence[SpanRecord], out_dir: Path, name: str = "timeline.png") -> Timeline | None:
    """The picked relayed trace (`pick_relayed`) drawn to `out_dir`/`name` (None when no trace qualifies)."""
    trace_id = pick_relayed(spans)
    if trace_id is None:
        return None
    trace = sorted(group_traces(spans)[trace_id], key=lambda s: (s.start_ns, s.span_id))
    facts = relay_facts(trace)
    draw(trace, out_dir / name, f"One relayed Recommend: {facts.long_term_length} long-term events, the "
         f"PreInfer's production {facts.production_kind}, the Rank's prefix {facts.production} (trace "
         f"{trace_id[:12]}…)")  # fmt: skip
    return Timeline(name, facts, trace)
