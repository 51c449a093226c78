"""The conformance harness: `pytest --platform=NAME` checks a platform plugin against the reference op layer.

Pieces: `pytest_plugin` (all run policy), `inventory` (what the platform brings, the catalog of
units), `checks/` (one module per check family), `worker` (crash- and hang-proof execution),
`results` (outcomes, results file), `waivers`, `report` (scorecard, markdown), `cli`.
"""

__version__ = "0.1.0"
