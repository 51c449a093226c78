"""The conformance harness: `pytest --platform=NAME` checks a platform plugin against the reference op layer.

The pipeline, one subpackage per stage: `collect` (what the platform brings, the units to run) ->
`run` (each unit in an isolated kernel worker) -> `checks` (the check bodies, one module per family)
-> `judge` (outputs against native semantics) -> `results` (outcomes, the results file) -> `gate`
(waivers, baseline, compare, merge) -> `report` (scorecard, markdown, HTML). The front doors:
`pytest_plugin` (all run policy, in pytest hooks) and `cli` (`python -m conformance ...`), which
share `exit_codes`.
"""

__version__ = "0.1.0"
