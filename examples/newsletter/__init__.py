"""Newsletter: draft -> supervisor review loop (max revisions) -> editor approval (Slack or
email) -> finalize newsletter.md, report.json, report.md atomically -> announce once.

`app` reads its database from $KEEL_DATABASE_URL and its notifiers from the environment (see
examples/newsletter/delivery.py):

    python -m keel worker examples.newsletter:app

Offline by default: a deterministic drafter and reviewer, no network, no API key. To draft with
a real LLM, register the workflow on your own App:
`register(keel.App(), drafter=ChatOpenAI(model="gpt-4o-mini"))`.
"""

import keel
from examples.newsletter.delivery import notifiers_from_env
from examples.newsletter.graph import FILES, WORKFLOW, build, newsletter_job_id, register

app = register(keel.App())
for _notifier in notifiers_from_env():
    app.add_notifier(_notifier)

__all__ = ["FILES", "WORKFLOW", "app", "build", "newsletter_job_id", "register"]
