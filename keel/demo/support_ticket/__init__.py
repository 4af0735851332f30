"""Support ticket: analyze -> retrieve docs -> draft -> manager approval -> email sent once.

`app` reads its database from $KEEL_DATABASE_URL:

    python -m keel worker keel.demo.support_ticket:app

To draft with a real LLM, register the workflow on your own App:
`register(keel.App(), drafter=ChatOpenAI(model="gpt-4o-mini"))`.
"""

import keel
from keel.demo.support_ticket.graph import WORKFLOW, build, register, ticket_job_id

app = register(keel.App())

__all__ = ["WORKFLOW", "app", "build", "register", "ticket_job_id"]
