"""Collect: activate the platform, take stock of what it brings, and list the units each check runs over."""
