"""The LangGraph adapter: fenced official savers, the executor, node-side helpers."""
