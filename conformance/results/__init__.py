"""Results: what one result is (outcome, verdict, identity) and how the results file stores them."""
