"""The demo and the robustness study: drivers that run the repository's tools in order and report.

The rule: a module belongs here when it sequences whole runs (make data,
train, evaluate, draw, write a report) by starting ``tools/*.py`` scripts;
it starts them only through :mod:`.tool_runner`, so the demo and the study
run a tool with the same command, environment and output.

* ``demo_pipeline``: ``make demo`` (tools/demo.py);
* ``robustness_study``, ``study_arms``, ``study_report``: ``make study``
  (tools/robustness_study.py);
* ``tool_runner``: how a tool is started (one process, or data-parallel
  training processes).

Imports ``datasets`` and ``utils`` (and, through the tools it starts, uses
``apis``); it never imports ``tools/``.
"""
