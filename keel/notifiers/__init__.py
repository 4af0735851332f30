"""Outbound notifiers (email, Slack) that the outbox hands wait notifications to."""
