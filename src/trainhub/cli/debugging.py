"""``trainhub debug TRIAL``: the likely mislabeled, hard and easy samples of a trial's data."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trainhub.cli.fit import print_fitted
from trainhub.cli.ids import ID_HELP, TrialOpt, parse_ref, trial_of
from trainhub.cli.session import EXIT_INVALID_INPUT, connect, fail, out


def debug(
    target: Annotated[
        str,
        typer.Argument(
            metavar="ID",
            help=ID_HELP + " Or a standalone run's trainhub-samples.jsonl file.",
        ),
    ],
    trial: TrialOpt = False,
    top: Annotated[int, typer.Option("--top", "-n", min=0, max=1000, help="Samples listed.")] = 20,
    csv_file: Annotated[
        Path | None, typer.Option("--csv", help="Write every sample's scores to this CSV file.")
    ] = None,
    png_file: Annotated[
        Path | None,
        typer.Option("--png", help="Write an image grid of the top samples to this PNG file."),
    ] = None,
    score: Annotated[
        str, typer.Option(help="Mislabel score: aum, confidence, forgetting or combined.")
    ] = "aum",
    as_json: Annotated[bool, typer.Option("--json", help="The whole report as JSON.")] = False,
) -> None:
    """Likely mislabeled samples of a trial, its samples' regions and per-class accuracy.

    The most suspicious samples first; regions are easy, ambiguous and hard; then per-class
    accuracy and the most confused class pairs.

    Needs the trial's script to call ctx.track_samples (docs/debugging.md). Retrain without
    the flagged samples with `trainhub clone TRIAL --drop-flagged 0.05`.
    """
    from trainhub.core.label_noise import SCORES

    if score not in SCORES:
        raise fail(f"--score {score!r}: use one of {', '.join(SCORES)}", code=EXIT_INVALID_INPUT)
    for path in (csv_file, png_file):
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            raise fail(
                f"cannot write {path}: "
                + ("it is a directory" if path.is_dir() else f"{path.parent} does not exist"),
                "pass a file in an existing directory",
                code=EXIT_INVALID_INPUT,
            )
    if Path(target).suffix in (".jsonl", ".json") or Path(target).is_file():
        report, png = _local_report(Path(target), top, score, png_file is not None, csv_file)
        if png_file is not None and png is not None:
            png_file.write_bytes(png)
        _show(report, as_json, csv_file, png_file if png is not None else None)
        return
    with connect() as client:
        trial_id = trial_of(client, parse_ref(target, trial), "debug")
        report = client.debug_report(trial_id, top=top, score=score)
        if csv_file is not None:
            csv_file.write_text(client.debug_csv(trial_id, score=score))
        if png_file is not None:
            png_file.write_bytes(client.debug_png(trial_id, top=max(1, min(top, 100))))
    _show(report, as_json, csv_file, png_file)


def _show(
    report: dict[str, Any], as_json: bool, csv_file: Path | None, png_file: Path | None
) -> None:
    if as_json:
        print(json.dumps(report))
    else:
        _print_report(report)
    for path, what in ((csv_file, "scores"), (png_file, "image grid")):
        if path is not None:
            out.print(f"{what} written to {path}")


def _local_report(
    path: Path, top: int, score: str, with_png: bool, csv_file: Path | None
) -> tuple[dict[str, Any], bytes | None]:
    """The report of a standalone run's records file, computed here as the server would."""
    from trainhub.api.debug_schemas import CSV_COLUMNS, DebugPublic, sample_of
    from trainhub.core.label_noise import SCORES, class_report, score_samples
    from trainhub.core.sample_dynamics import concat, records_from_columns
    from trainhub.service.debugging import DebugReport, Tile

    if score not in SCORES:
        raise fail(f"unknown score {score!r}", f"one of {', '.join(SCORES)}", EXIT_INVALID_INPUT)
    try:
        batches = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        parts = [records_from_columns(b, int(b["num_classes"])) for b in batches]
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror}", code=EXIT_INVALID_INPUT) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise fail(f"{path}: not a sample records file: {exc}", code=EXIT_INVALID_INPUT) from None
    if not parts:
        raise fail(f"{path} holds no records", code=EXIT_INVALID_INPUT)
    records = concat(parts)
    scores = score_samples(records, method=score)
    num_classes = max(int(b["num_classes"]) for b in batches)
    source = next((b.get("source") for b in reversed(batches) if b.get("source")), None)
    report = DebugReport(
        0, source, num_classes, len(records), len(set(records.epochs.tolist())), score, scores,
        class_report(scores, num_classes),
    )  # fmt: skip
    if csv_file is not None:
        with csv_file.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(CSV_COLUMNS)
            for rank, i in enumerate(scores.ranking(), start=1):
                writer.writerow([rank, *sample_of(report, int(i)).model_dump().values()])
    png = None
    if with_png and source:
        from trainhub.adapters.sample_gallery import DatasetGallery

        tiles = [
            Tile(int(scores.ids[i]), int(scores.labels[i]), int(scores.suggested[i]),
                 float(scores.score[i]))
            for i in scores.ranking()[: max(1, min(top, 100))]
        ]  # fmt: skip
        try:
            png = DatasetGallery().grid_png(source, tiles)
        except LookupError as exc:
            out.print(f"no image grid: {exc}")
    return DebugPublic.of(report, top).model_dump(), png


def _print_report(report: dict[str, Any]) -> None:
    regions = ", ".join(f"{n} {r}" for r, n in report["regions"].items())
    who = f"trial {report['trial_id']}" if report["trial_id"] else "standalone run"
    out.print(
        f"{who}: {report['num_samples']} samples over {report['epochs']} "
        f"epochs ({report['source'] or 'unnamed dataset'}); {report['num_flagged']} flagged as "
        f"likely mislabeled (score {report['score']}); regions: {regions}"
    )
    table = Table(title="Most suspicious samples", title_justify="left")
    for column in (
        "id",
        "given",
        "suggested",
        "score",
        "aum",
        "confidence",
        "forgetting",
        "region",
    ):
        table.add_column(column, justify="left" if column == "region" else "right")
    for s in report["suspicious"]:
        mark = "*" if s["flagged"] else ""
        table.add_row(
            f"{s['id']}{mark}", str(s["given"]), str(s["suggested"]), f"{s['score']:.3f}",
            f"{s['aum']:.3f}", f"{s['confidence']:.3f}", str(s["forgetting"]), s["region"],
        )  # fmt: skip
    if report["suspicious"]:
        print_fitted(table, out, hint="widen the terminal, or --json / --csv FILE")
        out.print("* flagged (AUM < 0)")
    classes = report["classes"]
    accuracy = Table(title="Per class (latest epoch)", title_justify="left")
    for column in ("class", "accuracy", "flagged", "easy", "ambiguous", "hard"):
        accuracy.add_column(column, justify="right")
    for c, acc in enumerate(classes["accuracy"]):
        accuracy.add_row(
            str(c), "-" if acc is None else f"{acc:.3f}", str(classes["flagged"][c]),
            *(str(classes["regions"][r][c]) for r in ("easy", "ambiguous", "hard")),
        )  # fmt: skip
    out.print(accuracy)
    pairs = classes["confused_pairs"][:5]
    if pairs:
        out.print(
            "most confused: "
            + ", ".join(f"{p['given']} as {p['predicted']} ({p['count']})" for p in pairs)
        )


def read_relabel_file(path: Path) -> dict[int, int]:
    """A CSV with columns ``id`` and ``label`` (or ``suggested``, as ``trainhub debug --csv``
    writes it): one relabel per row."""
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            fields = reader.fieldnames or []
            column = (
                "label" if "label" in fields else "suggested" if "suggested" in fields else None
            )
            if "id" not in fields or column is None:
                raise fail(
                    f"{path}: needs columns 'id' and 'label' (or 'suggested')",
                    "e.g. the CSV of `trainhub debug TRIAL --csv FILE`, edited",
                    code=EXIT_INVALID_INPUT,
                )
            return {int(row["id"]): int(row[column]) for row in reader}
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror}", code=EXIT_INVALID_INPUT) from None
    except (ValueError, TypeError):
        raise fail(f"{path}: ids and labels must be integers", code=EXIT_INVALID_INPUT) from None
