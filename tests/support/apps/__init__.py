"""Keel apps that subprocesses (workers, the CLI, the HTTP server) load by module path, e.g.
`python -m keel worker tests.support.apps.mailer:app`, with the repository as working folder."""
