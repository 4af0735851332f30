"""Worked examples of Keel workflows (support_ticket, newsletter)."""
