"""The drawing: Grafana's grid, panels, legends and thresholds, with matplotlib."""

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

try:  # the docs extra
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator
    from PIL import Image
except ImportError:
    sys.exit("hack/dashboard_preview needs matplotlib: pip install -e '.[docs]'")
from hack.dashboard_preview.query import JSON, Results, drawn_panels
from hack.dashboard_preview.simulate import GIB, NOTE, ROWS, START, STEP, STEPS, Labels

# --- Drawing ------------------------------------------------------------------------

WIDTH: Final = 1600  # pixels; Grafana's grid is 24 columns wide
UNIT: Final = 30  # pixels per grid row
GAP: Final = 6
HEADER: Final = 78
FOOTER: Final = 30
BACKGROUND, PANEL, HEADING, BORDER = "#111217", "#181b1f", "#22252b", "#2c3235"
TEXT, MUTED = "#ccccdc", "#8e8e99"
NAMED: Final = {"green": "#73BF69", "red": "#F2495C", "orange": "#FF9830", "blue": "#5794F2"}
PALETTE: Final = (
    "#73BF69", "#F2CC0C", "#5794F2", "#FF780A", "#F2495C", "#B877D9", "#4FC3C7",
    "#FF7EB6", "#C0D8FF", "#CDDC39", "#C8A27A", "#E6E6E6", "#37872D", "#8F3BB8",
)  # fmt: skip
MINUTES: Final = [step * STEP / 60 for step in range(STEPS)]


@dataclass(frozen=True, slots=True)
class Box:
    """A rectangle in pixels from the figure's top left, as Grafana lays panels out."""

    left: float
    top: float
    width: float
    height: float


class Canvas:
    """A figure addressed in pixels from the top left."""

    def __init__(self, height: float) -> None:
        self.height = height
        self.figure = Figure(figsize=(WIDTH / 100, height / 100), dpi=100, facecolor=BACKGROUND)

    def x(self, px: float) -> float:
        return px / WIDTH

    def y(self, py: float) -> float:
        return 1 - py / self.height

    def text(self, x: float, y: float, text: str, **style: Any) -> None:
        self.figure.text(
            self.x(x), self.y(y), text, **{"color": TEXT, "fontsize": 9, "va": "top", **style}
        )

    def rect(self, box: Box, color: str = PANEL, edge: str = BORDER) -> None:
        corner = (self.x(box.left), self.y(box.top + box.height))
        size = (box.width / WIDTH, box.height / self.height)
        transform = self.figure.transFigure
        self.figure.add_artist(
            Rectangle(
                corner, *size, transform=transform, facecolor=color, edgecolor=edge, zorder=-1
            )
        )

    def line(self, left: float, right: float, y: float) -> None:
        xs, ys = [self.x(left), self.x(right)], [self.y(y), self.y(y)]
        self.figure.add_artist(
            Line2D(xs, ys, transform=self.figure.transFigure, color=BORDER, linewidth=0.6)
        )

    def axes(self, box: Box) -> Axes:
        ax = self.figure.add_axes(
            (
                self.x(box.left),
                self.y(box.top + box.height),
                box.width / WIDTH,
                box.height / self.height,
            )
        )
        ax.set_facecolor(PANEL)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.tick_params(colors=MUTED, labelsize=7.5, length=0, pad=3)
        return ax


def fmt(value: float, unit: str, decimals: int | None = None) -> str:
    """A value as Grafana writes it in `unit`."""
    if unit == "percentunit":
        value *= 100
        auto = 0 if value == 0 or abs(value) >= 10 else 1
        return f"{value:.{auto if decimals is None else decimals}f}%"
    if unit == "bytes":
        size, suffix = next(
            (s for s in ((GIB, "GiB"), (1 << 20, "MiB")) if abs(value) >= s[0]), (1, "B")
        )
        auto = 0 if abs(value) / size >= 10 or size == 1 else 1
        return f"{value / size:.{auto if decimals is None else decimals}f} {suffix}"
    suffix = {"s": " s", "cps": " c/s", "ops": " ops/s"}.get(unit, "")
    if decimals is not None:
        return f"{value:.{decimals}f}{suffix}"
    return f"{value:.0f}{suffix}" if float(value).is_integer() else f"{value:.3g}{suffix}"


def override(panel: JSON, matcher: str, name: str) -> dict[str, Any]:
    """The properties of a panel's overrides for `matcher` (byFrameRefID, byName) `name`."""
    found: dict[str, Any] = {}
    for entry in panel["fieldConfig"].get("overrides", ()):
        if entry["matcher"] == {"id": matcher, "options": name}:
            found.update({p["id"]: p["value"] for p in entry["properties"]})
    return found


def value_axis(ax: Axes, unit: str, low: float | None, high: float | None) -> None:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, unit)))
    bottom, top = ax.get_ylim()
    if unit == "bytes":  # whole GiB steps
        step = next(s for s in (1, 2, 5, 10, 20, 40, 80) if top / (s * GIB) <= 5)
        ax.yaxis.set_major_locator(MultipleLocator(step * GIB))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(5, integer=unit == "short"))
    ax.set_ylim(bottom if low is None else low, top * 1.08 if high is None else high)


def time_axis(ax: Axes) -> None:
    ticks = list(range(0, int(MINUTES[-1]) + 1, 5))
    ax.set_xticks(ticks, [f"{START + timedelta(minutes=m):%H:%M}" for m in ticks])
    ax.set_xlim(MINUTES[0], MINUTES[-1])
    ax.grid(visible=True, color=BORDER, linewidth=0.6)


def common_words(texts: list[str]) -> str:
    """What one series' legends share: "ml/trainer-0" of "ml/trainer-0 used", "... allocated"."""
    shared = []
    for words in zip(*(t.split() for t in texts), strict=False):
        if len(set(words)) > 1:
            break
        shared.append(words[0])
    return " ".join(shared)


def draw_timeseries(canvas: Canvas, panel: JSON, box: Box, results: Results) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    templates = {t["refId"]: t["legendFormat"] for t in panel["targets"]}
    colors: dict[Labels | str, str] = {}  # by labels: a pod's used and allocated share one
    names: dict[Labels | str, list[str]] = {}
    for ref, lines in results.items():
        for labels in sorted(lines):
            colors.setdefault(labels or ref, PALETTE[len(colors) % len(PALETTE)])
            text = templates[ref]
            for label, value in labels:
                text = text.replace("{{" + label + "}}", value)
            names.setdefault(labels or ref, []).append(text)
    paired = any(len(texts) > 1 for texts in names.values())
    handles = [Line2D([], [], color=colors[k], linewidth=2) for k in names]
    texts = [common_words(t) if paired else t[0] for t in names.values()]
    if paired:  # then a key to the line styles: "— used", "- - allocated"
        example = next(t for t in names.values() if len(t) > 1)
        for ref, text in zip(results, example, strict=False):
            dashed = "custom.lineStyle" in override(panel, "byFrameRefID", ref)
            handles.append(Line2D([], [], color=MUTED, linestyle="--" if dashed else "-"))
            texts.append(text.removeprefix(common_words(example)).strip())
    per_row = max(1, min(len(texts), int((box.width - 12) // (6.2 * max(map(len, texts)) + 40))))
    legend_height = 8 + 14 * math.ceil(len(texts) / per_row)
    ax = canvas.axes(
        Box(box.left + 52, box.top + 30, box.width - 64, box.height - 52 - legend_height)
    )
    for ref, lines in results.items():
        dashed = "custom.lineStyle" in override(panel, "byFrameRefID", ref)
        for labels, values in lines.items():
            ys = [math.nan if v is None else v for v in values]
            style = "--" if dashed else "-"
            ax.plot(MINUTES, ys, color=colors[labels or ref], linewidth=1.6, linestyle=style)
    time_axis(ax)
    value_axis(ax, defaults["unit"], defaults.get("min"), defaults.get("max"))
    canvas.figure.legend(
        handles,
        texts,
        loc="upper left",
        bbox_to_anchor=(canvas.x(box.left + 6), canvas.y(box.top + box.height - legend_height)),
        bbox_transform=canvas.figure.transFigure,
        ncol=per_row,
        frameon=False,
        fontsize=7.5,
        labelcolor=TEXT,
        handlelength=1.8,
        columnspacing=1.4,
        borderaxespad=0,
        borderpad=0,
        labelspacing=0.35,
    )


def threshold_color(defaults: JSON, value: float) -> str:
    color = NAMED["blue"]
    for step in defaults.get("thresholds", {}).get("steps", ()):
        if step["value"] is None or value >= step["value"]:
            color = NAMED.get(step["color"], step["color"])
    return color


def draw_stat(canvas: Canvas, panel: JSON, box: Box, results: Results) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    (values,) = results["A"].values()
    ys = [math.nan if v is None else v for v in values]
    present = [v for v in values if v is not None]
    last = present[-1]
    color = threshold_color(defaults, last)
    spark = canvas.axes(
        Box(box.left + 1, box.top + box.height * 0.62, box.width - 2, box.height * 0.38 - 1)
    )
    spark.fill_between(MINUTES, ys, color=color, alpha=0.18, linewidth=0)
    spark.plot(MINUTES, ys, color=color, linewidth=1.2, alpha=0.8)
    spark.set_xlim(MINUTES[0], MINUTES[-1])
    spark.set_ylim(min(0.0, *present), max(present) * 1.15 or 1)
    spark.set_axis_off()
    text = fmt(last, defaults["unit"], defaults.get("decimals"))
    middle = box.left + box.width / 2
    canvas.text(
        middle,
        box.top + box.height * 0.45,
        text,
        fontsize=25,
        weight="bold",
        color=color,
        ha="center",
        va="center",
    )


def cell(panel: JSON, column: str, value: float | None) -> tuple[str, str]:
    """A table cell's text and colour: value mappings first, then the column's unit."""
    if value is None:
        return "", TEXT
    defaults, props = panel["fieldConfig"]["defaults"], override(panel, "byName", column)
    for mapping in props.get("mappings", ()):
        if (option := mapping["options"].get(f"{value:g}")) is not None:
            return option["text"], NAMED.get(option["color"], option["color"])
    text = fmt(value, props.get("unit", defaults["unit"]), props.get("decimals"))
    fixed = defaults.get("color", {}).get("fixedColor")  # with cellOptions "color-text"
    return text, NAMED.get(fixed, fixed) if fixed else TEXT


def draw_table(canvas: Canvas, panel: JSON, box: Box, results: Results) -> None:
    rename: dict[str, str] = {}
    for transformation in panel.get("transformations", ()):
        if transformation["id"] == "organize":
            rename = transformation["options"].get("renameByName", {})
    merged: dict[Labels, dict[str, float]] = {}  # the "merge" transformation, at the last step
    for ref, lines in results.items():
        for labels, values in lines.items():
            if values[-1] is not None:
                merged.setdefault(labels, {})[rename.get(f"Value #{ref}", ref)] = values[-1]
    label_columns = sorted({name for labels in merged for name, _ in labels})
    value_columns = [rename.get(f"Value #{t['refId']}", t["refId"]) for t in panel["targets"]]
    rows = sorted(merged.items())
    for sort in panel["options"].get("sortBy", ()):
        rows.sort(key=lambda row: row[1].get(sort["displayName"], -math.inf), reverse=sort["desc"])
    table = [
        [(dict(labels)[name], TEXT) for name in label_columns]
        + [cell(panel, name, values.get(name)) for name in value_columns]
        for labels, values in rows
    ]
    headers = label_columns + value_columns
    widths = [max([len(h)] + [len(row[n][0]) for row in table]) + 3 for n, h in enumerate(headers)]
    x, top = box.left + 12, box.top + 34
    canvas.rect(Box(box.left + 1, top - 6, box.width - 2, 24), color=HEADING, edge="none")
    for n, header in enumerate(headers):
        canvas.text(x, top, header, fontsize=8.5, color=NAMED["blue"], weight="bold")
        for r, row in enumerate(table):
            canvas.text(x, top + 26 + 21 * r, row[n][0], fontsize=8.5, color=row[n][1])
        x += widths[n] * (box.width - 24) / sum(widths)
    for r in range(len(table)):
        canvas.line(box.left + 1, box.left + box.width - 1, top + 21 + 21 * r)
    if not table:
        canvas.text(
            box.left + box.width / 2, box.top + box.height / 2, "No data", color=MUTED, ha="center"
        )


def clip(title: str, width: float) -> str:
    """A title too long for its panel is cut, as Grafana does."""
    fits = int(width // 7.2)  # characters at 9.5 points, bold
    return title if len(title) <= fits else title[: fits - 1].rstrip() + "\u2026"


def draw_header(canvas: Canvas, dashboard: JSON) -> None:
    canvas.text(GAP + 4, 12, f"\u2630  {dashboard['title']}", fontsize=14, weight="bold")
    end = START + timedelta(seconds=STEP * (STEPS - 1))
    when = f"\u25f7 {START:%H:%M} to {end:%H:%M}   \u27f3 {dashboard['refresh']}"
    canvas.text(WIDTH - GAP - 4, 14, when, color=MUTED, ha="right")
    x = GAP + 6.0
    for variable in dashboard["templating"]["list"]:
        label = variable.get("label", variable["name"])
        value = "Prometheus" if variable["type"] == "datasource" else "All"
        for text, width, color in (
            (label, 7.5 * len(label) + 14, HEADING),
            (f"{value}  \u25be", 7 * len(value) + 30, BACKGROUND),
        ):
            canvas.rect(Box(x, 42, width, 24), color=color)
            canvas.text(
                x + 7,
                54,
                text,
                fontsize=8.5,
                va="center",
                color=NAMED["blue"] if color == HEADING else TEXT,
            )
            x += width
        x += 12
    shown = f"Rows shown: {', '.join(ROWS)}; the Scheduler and Webhook rows follow"
    canvas.text(WIDTH - GAP - 4, 54, shown, fontsize=8, color=MUTED, ha="right", va="center")


DRAW: Final = {"timeseries": draw_timeseries, "stat": draw_stat, "table": draw_table}


def draw(dashboard: JSON, results: Callable[[JSON], Results], out: Path) -> None:
    """Draw the ROWS of `dashboard` into `out`; `results(panel)` answers its queries."""
    panels = drawn_panels(dashboard)
    first = min(p["gridPos"]["y"] for p in panels)
    last = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    canvas = Canvas(HEADER + (last - first) * UNIT + GAP + FOOTER)
    draw_header(canvas, dashboard)
    column = (WIDTH - GAP) / 24
    for panel in panels:
        pos = panel["gridPos"]
        box = Box(
            pos["x"] * column + GAP,
            HEADER + (pos["y"] - first) * UNIT + GAP,
            pos["w"] * column - GAP,
            pos["h"] * UNIT - GAP,
        )
        if panel["type"] == "row":
            canvas.text(
                box.left + 2, box.top + 4, f"\u25be {panel['title']}", fontsize=11, weight="bold"
            )
            continue
        canvas.rect(box)
        canvas.text(
            box.left + 10,
            box.top + 8,
            clip(panel["title"], box.width - 20),
            fontsize=9.5,
            weight="bold",
        )
        DRAW[panel["type"]](canvas, panel, box, results(panel))
    canvas.text(
        WIDTH / 2,
        canvas.height - FOOTER / 2,
        NOTE,
        fontsize=8,
        color=MUTED,
        ha="center",
        va="center",
    )
    canvas.figure.savefig(out, dpi=100, facecolor=BACKGROUND)
    with Image.open(out) as image:  # a palette PNG: the same look at a fraction of the size
        small = image.convert("RGB").quantize(
            96, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    small.save(out, optimize=True)
