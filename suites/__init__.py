"""The conformance suites a vendor runs with `pytest --platform=NAME`: one module per check family.

Bodies are generic; the pytest plugin (conformance.pytest_plugin) parametrises each over the
catalog of what the platform brings, selected by the `conformance(family, check)` marker.
"""
