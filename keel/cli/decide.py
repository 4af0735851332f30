"""`keel approve`, `keel reject` and `keel resolve-effect`: a run's pending decision answered
from the command line, recorded as the CLI's (channel `cli`, the caller's login as principal).
The first decision wins (keel.core.decisions); a repeat changes nothing, a different one fails.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

import typer

from keel.cli.guard import effect_wait, fail, guarded, login, say
from keel.cli.options import (
    ActionOption,
    AppOption,
    ByOption,
    CommentOption,
    DbOption,
    RunArgument,
    WaitOption,
    open_app,
    performed_result,
)
from keel.cli.render import decided_line
from keel.core.decisions import DecisionResult


def _decide(
    run_id: str,
    decision: str,
    by: str | None,
    comment: str | None,
    wait_id: str | None,
    action_id: str | None,
    app: str | None,
    db: str | None,
    *,
    result: Any = None,
) -> None:
    want = "effect" if decision in ("performed", "not_performed") else "approval"
    by = by or login()
    with open_app(app, db) as loaded:
        record: Callable[..., DecisionResult]
        if want == "effect":
            wait_id = effect_wait(loaded.get_run(run_id), wait_id)
            record = functools.partial(
                loaded.resolve_effect, performed=decision == "performed", result=result
            )
        else:
            record = loaded.approve if decision == "approved" else loaded.reject
        outcome = record(
            run_id,
            by=by,
            comment=comment,
            wait_id=wait_id,
            action_id=action_id,
            channel="cli",
            # `--by` is what the caller typed; the login is who ran the command.
            principal=f"login:{login()}",
        )
    wait = outcome.wait
    if outcome.recorded:
        label = decision.replace("_", " ")
        say(
            f"recorded: {label} by {by} on wait {wait['wait_id']} ({wait['name']}) of run "
            f"{run_id}; a worker resumes the run"
        )
    elif wait["decision"] == decision:
        say(decided_line(wait) + "; this call changed nothing")
    else:
        fail(f"not {decision.replace('_', ' ')}: {decided_line(wait)} (the first decision wins)")


def _verdict_command(decision: str, verb: str) -> Callable[..., None]:
    # approve and reject take the same options and differ only in the verdict they record.
    def command(
        run_id: RunArgument,
        by: ByOption = None,
        comment: CommentOption = None,
        wait_id: WaitOption = None,
        action_id: ActionOption = None,
        app: AppOption = None,
        db: DbOption = None,
    ) -> None:
        _decide(run_id, decision, by, comment, wait_id, action_id, app, db)

    command.__name__ = command.__qualname__ = verb.lower()
    command.__doc__ = (
        f"{verb} the run's pending approval. The first decision wins; repeats change nothing."
    )
    return command


approve = guarded(_verdict_command("approved", "Approve"))
reject = guarded(_verdict_command("rejected", "Reject"))


@guarded
def resolve_effect(
    run_id: RunArgument,
    performed: Annotated[
        bool,
        typer.Option(
            "--performed/--not-performed",
            help="Whether the in-doubt effect reached the provider (check there first).",
            show_default=False,
        ),
    ],
    result: Annotated[
        str | None,
        typer.Option(help="With --performed: the effect's result as JSON.", show_default=False),
    ] = None,
    by: ByOption = None,
    comment: CommentOption = None,
    wait_id: WaitOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Settle an in-doubt effect: --performed (never redo it) or --not-performed (do it once)."""
    value = performed_result(result, performed)
    decision = "performed" if performed else "not_performed"
    _decide(run_id, decision, by, comment, wait_id, None, app, db, result=value)
