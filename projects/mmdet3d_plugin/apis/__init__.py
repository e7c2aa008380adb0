"""What the test-time tools share (tools/test.py, tools/eval_robustness.py, tools/visualize_aqr.py).

Not imported by the plugin's ``__init__``: the tools import these modules
themselves, and importing them registers the plugin as any plugin import does.
"""
