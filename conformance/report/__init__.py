"""Report: results for people: the terminal scorecard, markdown and HTML reports, the matrix across platforms."""
