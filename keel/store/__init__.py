"""Storage: one Store over a connector per dialect (SQLite embedded, PostgreSQL to scale out)."""
