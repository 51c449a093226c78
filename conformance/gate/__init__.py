"""Gate: hold a run's results against waivers, a baseline or an earlier file, and merge a sharded run's files."""
