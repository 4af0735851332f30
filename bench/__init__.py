"""Side-by-side benchmarks: Keel against raw LangGraph and DBOS, measured in one run.

`make bench` (`python -m bench`) writes docs/benchmarks.md and its plots; `python -m bench
--quick` is a fast smoke run. Each case lives in its own module (bench/case_*.py).
"""
