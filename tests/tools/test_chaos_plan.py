"""The crash harness's reading of a clean run: which node each fault point occurrence belongs
to, which deliveries came from where, the cells sampling may never skip, and the likely cause a
failing cell is given. Traces and outcomes written by hand: no process, no database."""

from __future__ import annotations

import io
import json
from pathlib import Path
from xml.etree import ElementTree as ET

from keel.chaos import report as report_module
from keel.chaos.checks import Outcome
from keel.chaos.harness import Cell, ChaosConfig, Report
from keel.chaos.matrix import plan
from keel.chaos.report import as_json, output_console, render, write_junit
from keel.chaos.trace import build, sample
from keel.chaos.verdict import extra_deliveries, likely_cause
from keel.chaos.world import HTTP, SMTP, Delivery

CP = "checkpoint.before_write"


def _record(tmp_path: Path, *phases: list[tuple[str, str, str, int]]) -> Path:
    """One worker process per phase, alive from 1 before its first point to 1 after its last."""
    record = tmp_path / "reached"
    for n, entries in enumerate(phases):
        trace = [[point, label, node, "", at] for point, label, node, at in entries]
        span = [entries[0][3] - 1, entries[-1][3] + 1]
        line = {"pid": 1, "reached": {}, "trace": trace, "span": span}
        (tmp_path / f"reached.{n}").write_text(json.dumps(line) + "\n")
    return record


def _direct_post(tmp_path: Path) -> Path:
    """price -> pay (POSTs at t=50, outside any effect) -> receipt, one phase."""
    return _record(
        tmp_path,
        [
            ("run.before_first_checkpoint", "pay-direct", "", 10),
            (CP, "", "", 20),  # the input checkpoint
            (CP, "", "price", 30),
            (CP, "", "", 40),
            (CP, "", "pay", 60),
            (CP, "", "", 70),
            (CP, "", "receipt", 80),
            (CP, "", "", 90),
        ],
    )


def _post(at: int, key: str | None = None, content: str = "c1") -> Delivery:
    return Delivery(HTTP, "POST /charges", key, content, at)


def test_the_cell_after_a_direct_post_is_always_run_and_the_skipped_ones_are_listed(
    tmp_path: Path,
) -> None:
    trace = build(_direct_post(tmp_path), [_post(50)])
    [made] = trace.deliveries
    assert (made.node, made.effect) == ("pay", "")  # outside any effect
    config = ChaosConfig(app="x:app", workflow="w", input={}, max_occurrences=2)
    run, skipped = plan(config, trace)
    names = [c.name for c in run]
    # Sampling alone takes occurrences 1 and 7 of the checkpoint point; the trace adds the one
    # right after the POST: saving the writes of `pay`.
    assert names == [
        f"phase 0 {CP}@1",
        f"phase 0 {CP}@4",
        f"phase 0 {CP}@7",
        "phase 0 run.before_first_checkpoint@1",
    ]
    risky = run[1]
    assert risky.node == "pay" and risky.where == "saving the writes of node `pay`"
    assert risky.after_deliveries == ["POST /charges from node `pay`"]
    assert [c.occurrence for c in skipped] == [2, 3, 5, 6]
    assert all(c.verdict == "skipped" for c in skipped)
    assert run[2].where == "the checkpoint after node `receipt`"
    assert run[0].where == "the input checkpoint"
    assert trace.find(0, CP, 5) is not None
    assert trace.find(0, CP, 5).where == "the checkpoint after node `pay`"  # type: ignore[union-attr]


def test_a_delivery_between_reserve_and_perform_belongs_to_that_effect(tmp_path: Path) -> None:
    record = _record(
        tmp_path,
        [
            ("effect.before_reserve", "charge", "pay", 10),
            ("effect.after_perform", "charge", "pay", 30),
            ("effect.after_record", "charge", "pay", 40),
            (CP, "", "pay", 50),
            (CP, "", "", 60),
        ],
    )
    trace = build(record, [_post(20, key="k1")])
    [made] = trace.deliveries
    assert (made.node, made.effect) == ("pay", "charge")
    # The first occurrence of each point after the delivery.
    assert sorted(trace.risky()) == [
        (0, CP, 1),
        (0, "effect.after_perform", 1),
        (0, "effect.after_record", 1),
    ]
    config = ChaosConfig(app="x:app", workflow="w", input={}, points=("effect.after_perform",))
    run, skipped = plan(config, trace)
    assert [c.name for c in run] == ["phase 0 effect.after_perform@1"] and not skipped
    assert run[0].effect == "charge" and run[0].where == "effect `charge` in node `pay`"


def test_deliveries_in_a_later_phase_mark_cells_of_that_phase(tmp_path: Path) -> None:
    record = _record(
        tmp_path,
        [(CP, "", "ask", 10), ("wait.after_interrupt", "w", "", 20)],
        [(CP, "", "send", 40), (CP, "", "", 50)],
    )
    # Sent by the phase-1 worker before it reached any point: it counts for phase 1.
    trace = build(record, [Delivery(SMTP, "mail to a@x: hi", "<m1>", "c", 39)])
    assert sorted(trace.risky()) == [(1, CP, 1)]
    assert trace.deliveries[0].node == "send"
    # Sent by phase 0 after its last point (announcing the wait): no phase-1 cell follows it.
    trace = build(record, [Delivery(SMTP, "mail to a@x: hi", "<m1>", "c", 21)])
    assert sorted(trace.risky()) == []


def test_sampling_takes_the_first_the_last_and_evenly_between() -> None:
    assert sample(10, None) == list(range(1, 11))
    assert sample(10, 3) == [1, 6, 10]
    assert sample(10, 1) == [1]
    assert sample(2, 5) == [1, 2]


def _outcome(**changes: object) -> Outcome:
    base = Outcome(
        status="completed",
        decision="not_decided",
        termination_reason="completed",
        effects={"charge": 1},
        unsettled=[],
        world={SMTP: 0, HTTP: 1},
        artifacts={},
        stale_writes=[],
        deliveries=[_post(1, "k1")],
        keys={"charge": 1},
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_repeats_are_told_apart_from_the_clean_runs_deliveries_by_content_then_request() -> None:
    clean = [_post(1, "k1", "a")]
    assert extra_deliveries(clean, [_post(5, "k1", "a")]) == []
    # The same request with another body (a timestamp in it): the later copy is the repeat.
    assert extra_deliveries(clean, [_post(5, "k2", "b"), _post(6, "k3", "c")]) == [
        _post(6, "k3", "c")
    ]


def test_the_likely_cause_names_what_to_fix(tmp_path: Path) -> None:
    clean = _outcome()
    trace = build(_direct_post(tmp_path), [_post(50, "u1")])
    twice = _outcome(world={SMTP: 0, HTTP: 2}, deliveries=[_post(1, "u1"), _post(2, "u2")])
    extra = extra_deliveries(clean.deliveries, twice.deliveries)
    assert "node `pay` sent to the provider outside `@keel.effect`" in likely_cause(
        clean, twice, trace.deliveries, extra
    )
    in_effect = build(
        _record(
            tmp_path,
            [
                ("effect.before_reserve", "charge", "pay", 10),
                ("effect.after_perform", "charge", "pay", 30),
            ],
        ),
        [_post(20, "u1")],
    ).deliveries
    assert "the idempotency key is not stable" in likely_cause(clean, twice, in_effect, extra)
    new_keys = _outcome(
        world={SMTP: 0, HTTP: 2},
        deliveries=[_post(1, "k1"), _post(2, "k2")],
        keys={"charge": 2},
    )
    assert "arguments changed between attempts" in likely_cause(clean, new_keys, in_effect, extra)
    lost = _outcome(world={SMTP: 0, HTTP: 0}, deliveries=[])
    assert "a delivery was lost" in likely_cause(clean, lost, in_effect, [])
    stuck = _outcome(unsettled=["effect:charge:ab (in_doubt)"])
    assert "reconciler" in likely_cause(clean, stuck, in_effect, [])


def _report(tmp_path: Path) -> Report:
    failed = Cell(0, CP, 4, verdict="fail", where="saving the writes of node `pay`", node="pay")
    failed.problems = ["http deliveries: 2, clean run 1"]
    failed.extra = ["POST /charges (key u2)"]
    failed.cause = "node `pay` sent to the provider outside `@keel.effect` " + "x" * 120
    failed.after_deliveries = ["POST /charges from node `pay`"]
    passed = Cell(0, CP, 1, verdict="pass", where="the input checkpoint")
    skipped = Cell(0, CP, 2, verdict="skipped")
    config = ChaosConfig(app="x:app", workflow="pay-direct", input={}, max_occurrences=1)
    return Report(config, _outcome(), [{CP: 4}], [passed, failed], skipped=[skipped])


def test_the_report_is_full_width_off_a_terminal_and_json_and_junit_carry_the_same_fields(
    tmp_path: Path,
) -> None:
    report = _report(tmp_path)
    out = io.StringIO()
    render(report, output_console(out))
    text = out.getvalue()
    assert output_console(io.StringIO()).width >= report_module.FULL_WIDTH
    assert report.cells[1].cause in text  # on one line, not cut at 80 columns
    assert "skipped by sampling: phase 0 checkpoint.before_write@2" in text
    assert (
        "2 of 3 cells run (1 skipped by sampling); the 1 after outside deliveries all run" in text
    )
    data = as_json(report)
    [cell] = [c for c in data["cells"] if c["verdict"] == "fail"]
    assert (cell["node"], cell["where"], cell["cause"]) == (
        "pay",
        report.cells[1].where,
        report.cells[1].cause,
    )
    assert cell["extra_deliveries"] == ["POST /charges (key u2)"]
    assert [c["name"] for c in data["skipped"]] == ["phase 0 checkpoint.before_write@2"]
    write_junit(report, tmp_path / "chaos.xml")
    suite = ET.parse(tmp_path / "chaos.xml").getroot()
    assert (
        suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    )
    case = next(c for c in suite.iter("testcase") if c.get("name") == cell["name"])
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["node"] == "pay" and props["cause"] == cell["cause"]
    assert props["where"] == cell["where"]
    failure = case.find("failure")
    assert failure is not None and "likely cause: node `pay`" in (failure.text or "")


def test_a_checkpoint_that_commits_while_the_next_node_sends_is_named_after_that_node(
    tmp_path: Path,
) -> None:
    # As on PostgreSQL: the checkpoint after `price` is fenced only after `pay` has sent.
    record = _record(
        tmp_path,
        [(CP, "", "price", 30), (CP, "", "", 50), (CP, "", "pay", 60), (CP, "", "", 70)],
    )
    trace = build(record, [_post(45)])
    run, _ = plan(ChaosConfig(app="x:app", workflow="w", input={}, max_occurrences=1), trace)
    [risky] = [c for c in run if c.after_deliveries]
    assert risky.occurrence == 2 and risky.node == "pay"
    assert risky.where == "the checkpoint after node `price` (while node `pay` ran)"


def test_a_send_tasks_writes_are_named_by_its_node_when_its_effect_told_it(tmp_path: Path) -> None:
    push = "~__pregel_push, 0000000001, False"
    record = _record(
        tmp_path,
        [
            ("effect.before_reserve", "notify", "fan", 10),
            ("effect.after_perform", "notify", "fan", 30),
            (CP, "", push, 40),
            (CP, "", "~__pregel_push, 0000000002, False", 50),
            (CP, "", "", 60),
        ],
    )
    # The effect entries carry the path the node saw.
    lines = json.loads((tmp_path / "reached.0").read_text())
    for entry in lines["trace"][:2]:
        entry[3] = "__pregel_push/1/False"
    (tmp_path / "reached.0").write_text(json.dumps(lines) + "\n")
    trace = build(record, [_post(20)])
    first, second = (trace.find(0, CP, n) for n in (1, 2))
    assert first is not None and second is not None
    assert (first.node, first.path) == ("fan", "__pregel_push/1/False")
    assert first.where == "saving the writes of node `fan` (`Send` task __pregel_push/1/False)"
    assert second.node == "" and second.where == (
        "saving the writes of a (`Send` task __pregel_push/2/False)"
    )
    assert trace.find(0, "effect.after_perform", 1).where == (  # type: ignore[union-attr]
        "effect `notify` in node `fan` (`Send` task __pregel_push/1/False)"
    )


def test_the_last_lease_check_and_a_heartbeat_do_not_hide_the_effect_a_delivery_is_in(
    tmp_path: Path,
) -> None:
    record = _record(
        tmp_path,
        [
            ("effect.before_reserve", "charge", "pay", 10),
            ("effect.before_call", "charge", "", 20),  # its call site knows only the effect
            ("lease.renew", "", "", 30),
            ("effect.after_perform", "charge", "pay", 50),
        ],
    )
    trace = build(record, [_post(40, key="k1")])
    [made] = trace.deliveries
    assert (made.node, made.effect) == ("pay", "charge")
    call = trace.find(0, "effect.before_call", 1)
    assert call is not None and call.where == "effect `charge` in node `pay`"
