"""The store: the only code that speaks SQL (named queries per dialect, migrations)."""
